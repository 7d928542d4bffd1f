"""The store on a ClickHouse server (`http(s)://`): the real engine behind tests/fake_clickhouse.py."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pytest

from ingest.validate import ValidatedBatch, validate_batch
from query.client import Client
from store.migrations import LATEST_VERSION
from store.store import Store
from store.storeerrors import BatchConflict, SqlRejected, StoreUnavailable
from tests.fake_clickhouse import USER, running
from tests.helpers import MS, T0, counts, request, telemetry, trace
from tracehouse.batch import BatchBuilder
from tracehouse.model import DEFAULT_LIMITS, Limits
from tracehouse.v1 import ingest_pb2_grpc

PASSWORD = "p@ss word/1"  # characters a URL must escape
URL_PASSWORD = "p%40ss%20word%2F1"


@pytest.fixture
def clickhouse(tmp_path: Path) -> Iterator[str]:
    """A fresh ClickHouse server on a free port; yields host:port."""
    with running(tmp_path / "clickhouse", PASSWORD) as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture
def store(clickhouse: str, limits: Limits) -> Iterator[Store]:
    """Replaces conftest's store, so that its gRPC `server`, `ingest` and `client` run on this one."""
    opened = Store.open(f"http://{USER}:{URL_PASSWORD}@{clickhouse}/tracehouse", limits)
    yield opened
    opened.close()


def validated(builder: BatchBuilder) -> ValidatedBatch:
    return validate_batch(builder.build(), DEFAULT_LIMITS, T0)


def test_open_on_a_fresh_server_creates_the_database(clickhouse: str) -> None:
    opened = Store.open(f"http://{USER}:{URL_PASSWORD}@{clickhouse}/tracehouse", DEFAULT_LIMITS)
    try:
        assert opened.schema_version() == LATEST_VERSION
    finally:
        opened.close()


def test_migrates_writes_once_and_reads_back(store: Store, clickhouse: str) -> None:
    assert store.schema_version() == LATEST_VERSION
    tables = store.query("SELECT name FROM system.tables WHERE database = 'tracehouse'").column("name").to_pylist()
    assert {"runs", "devices", "samples", "events", "ingest_batches", "schema_migrations"} <= set(tables)
    batch = validated(telemetry("b-1").add_run("run-a", host="host-a", source="agent", start=T0))
    events = validated(trace("b-2"))
    first = store.write(batch, T0)
    assert not first.duplicate and (first.rows["samples"], first.rows["runs"]) == (400, 1)
    assert not store.write(events, T0).duplicate
    assert store.write(batch, T0 + 1).duplicate
    assert counts(store) == {"samples": 400, "events": 15, "runs": 1, "devices": 0, "ingest_batches": 2}
    values = store.query(
        "SELECT gpu, toUnixTimestamp64Nano(ts) AS ts, value FROM {db}.samples "
        "WHERE metric = {metric:String} ORDER BY gpu, ts",
        {"metric": "gpu.util"},
    )
    assert values.column("ts").to_pylist()[:2] == [T0, T0 + 100 * MS]
    assert values.column("value").to_pylist()[:3] == [0.0, 1.0, 2.0]
    assert values.column("gpu").to_pylist()[100] == 1
    with pytest.raises(BatchConflict, match="b-1"):
        store.write(validated(telemetry("b-1", n=10)), T0)
    again = Store.open(f"http://{USER}:{URL_PASSWORD}@{clickhouse}/tracehouse", DEFAULT_LIMITS)
    try:
        assert again.migrate() == LATEST_VERSION  # nothing to do on a migrated server
    finally:
        again.close()


def test_user_sql_only_reads_and_writes_keep_working(store: Store) -> None:
    store.write(validated(telemetry("b-1")), T0)
    _, rows, truncated = store.user_sql("SELECT metric, count() AS n FROM samples GROUP BY metric ORDER BY 1", 10)
    assert (rows, truncated) == (2, False)
    _, rows, truncated = store.user_sql("SELECT number FROM numbers(100)", 10)
    assert (rows, truncated) == (10, True)
    with pytest.raises(SqlRejected) as refused:
        store.user_sql("INSERT INTO samples SELECT * FROM samples", 10)
    assert refused.value.reason == "readonly"
    with pytest.raises(SqlRejected) as refused:
        store.user_sql("SELECT * FROM file('/etc/passwd', 'LineAsString')", 10)
    assert refused.value.reason == "readonly"
    with pytest.raises(SqlRejected) as refused:
        store.user_sql("SELECT nope FROM samples", 10)
    assert refused.value.reason == "invalid"
    store.write(validated(telemetry("b-2", t0=T0 + 60 * 10**9)), T0)  # readonly did not leak to writers
    assert counts(store)["samples"] == 800


def test_a_wrong_password_is_a_clear_error_without_the_password(clickhouse: str) -> None:
    with pytest.raises(StoreUnavailable) as caught:
        Store.open(f"http://{USER}:wrong-horse@{clickhouse}/tracehouse", DEFAULT_LIMITS)
    message = str(caught.value)
    assert "Authentication failed" in message and f"{USER}:***@{clickhouse}" in message
    assert "wrong-horse" not in message


def test_serve_on_a_server_store(ingest: ingest_pb2_grpc.IngestStub, client: Client) -> None:
    answer = ingest.Write(request(telemetry("b-1")), timeout=30)
    assert (answer.duplicate, answer.samples) == (False, 400)
    assert ingest.Write(request(telemetry("b-1")), timeout=30).duplicate
    frame = client.sql("SELECT gpu, count() AS n FROM samples GROUP BY gpu ORDER BY gpu")
    assert frame.to_dict("list") == {"gpu": [0, 1], "n": [200, 200]}
    assert len(client.series("gpu.util", max_points=10)) > 0


def test_https_with_a_ca_file(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    with running(tmp_path / "clickhouse", PASSWORD, cert, key) as port:
        base = f"https://{USER}:{URL_PASSWORD}@127.0.0.1:{port}"
        raw = clickhouse_connect.get_client(dsn=base, interface="https", ca_cert=str(cert))
        raw.command("CREATE DATABASE tracehouse")
        raw.close()
        with pytest.raises(StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED"):  # no system CA knows it
            Store.open(f"{base}/tracehouse", DEFAULT_LIMITS)
        opened = Store.open(f"{base}/tracehouse?ca_cert={cert}", DEFAULT_LIMITS)
        try:
            assert not opened.write(validated(telemetry("b-1")), T0).duplicate
            assert counts(opened)["samples"] == 400
        finally:
            opened.close()


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "fake clickhouse")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path
