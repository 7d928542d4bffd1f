"""Tokens with scopes and TLS, against the real server on loopback with a real store: what is
refused is refused with a clear status, and nothing of it is written."""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import json
import logging
import os
import re
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agent.daemon import Agent
from agent.shipping.writer import BatchWriter, WriteFailed
from agent.telemetry.simulated import SimulatedBackend
from query.client import Client, QueryFailed
from store.store import Store
from tests.helpers import T0, counts, request, telemetry
from tests.test_agent import config as agent_config
from tests.test_agent import sample_count
from tracehouse import config
from tracehouse.channel import ClientSecurity, client_security, open_channel, read_token
from tracehouse.cli.main import main
from tracehouse.cli.serve import Server, create_server
from tracehouse.cli.up import Up, ui_environment
from tracehouse.model import Limits
from tracehouse.security import (
    SecurityError,
    ServerSecurity,
    check_exposure,
    is_loopback,
    load_server_tls,
    load_tokens,
    parse_tokens,
)
from tracehouse.v1 import ingest_pb2_grpc

READ_TOKEN = "read-token-0123456789abcdef"
WRITE_TOKEN = "write-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
TOKENS = f"# who may call\nread {READ_TOKEN}\n\nwrite {WRITE_TOKEN}\nadmin {ADMIN_TOKEN}\n"
WRITE_METHOD = "/tracehouse.v1.Ingest/Write"


# --- certificates -------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    valid_days: tuple[int, int] = (-1, 30),
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer[0].subject if issuer else _name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + dt.timedelta(days=valid_days[0]))
        .not_valid_after(now + dt.timedelta(days=valid_days[1]))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


@dataclasses.dataclass(frozen=True)
class Pki:
    folder: Path

    def __getattr__(self, name: str) -> Path:
        path = self.folder / f"{name.replace('_', '-')}.pem"
        assert path.exists(), path
        return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA; server certificates for 127.0.0.1 and localhost (valid, expired, not yet valid); a
    client certificate; and a second CA that signed none of them. `pki.NAME` is NAME.pem."""
    folder = tmp_path_factory.mktemp("pki")
    files: dict[str, bytes] = {}

    def keep(name: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        files[f"{name}.pem"] = certificate.public_bytes(serialization.Encoding.PEM)
        files[f"{name}-key.pem"] = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("tracehouse test CA", ca_key)
    keep("ca", ca, ca_key)
    for name, days, server in (
        ("server", (-1, 30), True),
        ("expired", (-30, -1), True),
        ("future", (2, 30), True),
        ("client", (-1, 30), False),
        ("expired-client", (-30, -1), False),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        keep(name, _certificate(name, key, (ca, ca_key), days, server), key)
    other_key = ec.generate_private_key(ec.SECP256R1())
    keep("other-ca", _certificate("another CA", other_key), other_key)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return Pki(folder)


# --- servers and clients ------------------------------------------------------------------


@pytest.fixture
def token_files(tmp_path: Path) -> dict[str, Path]:
    files = {"tokens": tmp_path / "tokens"}
    files["tokens"].write_text(TOKENS)
    for scope, token in (("read", READ_TOKEN), ("write", WRITE_TOKEN), ("admin", ADMIN_TOKEN), ("wrong", "x" * 30)):
        files[scope] = tmp_path / f"{scope}.token"
        files[scope].write_text(token + "\n")
    return files


@pytest.fixture
def start(store: Store, limits: Limits) -> Iterator[Callable[..., str]]:
    """start(tokens=True, tls=False, mtls=False) -> address of a server on the test's store."""
    servers: list[Server] = []

    def started(tokens: bool = True, tls: Pki | None = None, mtls: bool = False) -> str:
        security = ServerSecurity(
            parse_tokens(TOKENS) if tokens else None,
            load_server_tls(tls.server, tls.server_key, tls.ca if mtls else None) if tls else None,
        )
        servers.append(create_server(store, "127.0.0.1:0", limits, security=security))
        return f"127.0.0.1:{servers[-1].port}"

    yield started
    for server in servers:
        server.stop(grace=1)


def write(
    address: str, token: str | None, security: ClientSecurity | None = None, batch: str = "b1", host: str = "host-a"
) -> None:
    """One batch of telemetry of `host` and a run named after it."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    builder = telemetry(batch, run_id=batch, host=host).add_run(batch, name=batch, host=host, source="user", start=T0)
    with open_channel(address, security) as channel:
        ingest_pb2_grpc.IngestStub(channel).Write(request(builder), timeout=10, metadata=metadata)


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def query_failure(address: str, security: ClientSecurity) -> QueryFailed:
    with Client(address, timeout=10, security=security) as client, pytest.raises(QueryFailed) as caught:
        client.runs()
    return caught.value


def nothing_written(store: Store) -> bool:
    return not any(counts(store).values())


# --- the tokens file ----------------------------------------------------------------------


def test_tokens_file_lines_and_scopes() -> None:
    tokens = parse_tokens(TOKENS)
    assert len(tokens) == 3
    assert tokens.scopes_of(READ_TOKEN) == {"read"}
    assert tokens.scopes_of(WRITE_TOKEN) == {"write"}
    assert tokens.scopes_of(ADMIN_TOKEN) == {"read", "write"}
    assert tokens.scopes_of(READ_TOKEN[:-1]) is None and tokens.scopes_of("") is None
    assert READ_TOKEN not in repr(tokens)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"# ok\nread {READ_TOKEN}\nreader {WRITE_TOKEN}\n", "line 3: the first word must be the scope"),
        (f"{WRITE_TOKEN} write\n", "line 1: the first word must be the scope"),
        (f"\n\nwrite {WRITE_TOKEN} extra\n", "line 3: expected 'SCOPE TOKEN'"),
        (f"{WRITE_TOKEN}\n", "line 1: expected 'SCOPE TOKEN'"),
        ("write short-token\n", "line 1: the token is shorter than 16 characters"),
        (f"read {READ_TOKEN}\nadmin {READ_TOKEN}\n", "line 2: the same token is on line 1"),
        ("# nothing but comments\n\n", "no tokens in it"),
    ],
)
def test_tokens_file_errors_name_the_line_never_the_token(text: str, message: str) -> None:
    with pytest.raises(SecurityError) as caught:
        parse_tokens(text, "--tokens t.txt")
    assert message in str(caught.value) and str(caught.value).startswith("--tokens t.txt")
    for token in (READ_TOKEN, WRITE_TOKEN, "short-token"):
        assert token not in str(caught.value)


def test_unreadable_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match=r"--tokens .*missing: cannot read it"):
        load_tokens(tmp_path / "missing")


def test_token_command_prints_a_line_for_the_tokens_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--scope", "write"]) == 0
    line = capsys.readouterr().out.strip()
    scope, token = line.split()
    assert scope == "write" and len(token) >= 40
    assert parse_tokens(line).scopes_of(token) == {"write"}
    assert main(["token"]) == 0 and capsys.readouterr().out.startswith("read ")


# --- tokens on a plain-text loopback server -----------------------------------------------


def test_right_tokens_write_and_read(start: Callable[..., str], store: Store, token_files: dict[str, Path]) -> None:
    address = start()
    write(address, WRITE_TOKEN, batch="by-writer")
    write(address, ADMIN_TOKEN, batch="by-admin")
    assert counts(store)["ingest_batches"] == 2
    for scope in ("read", "admin"):
        with Client(address, timeout=10, security=client_security(token_files[scope])) as client:
            assert set(client.sql("SELECT batch_id FROM ingest_batches")["batch_id"]) == {"by-writer", "by-admin"}


@pytest.mark.parametrize(("token", "message"), [(None, "missing bearer token"), ("x" * 30, "unknown token")])
def test_no_token_or_a_wrong_one_is_unauthenticated_and_nothing_is_written(
    start: Callable[..., str], store: Store, token: str | None, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    address = start()
    with caplog.at_level(logging.DEBUG):
        error = refused(lambda: write(address, token))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED and message in (error.details() or "")
        with Client(address, timeout=10, security=ClientSecurity(token)) as client, pytest.raises(QueryFailed) as q:
            client.runs()
    assert q.value.code == grpc.StatusCode.UNAUTHENTICATED and message in q.value.message
    assert nothing_written(store)
    assert "refused /tracehouse.v1.Ingest/Write" in caplog.text
    assert "x" * 30 not in caplog.text, "a token is never logged"


def test_scopes_read_cannot_write_and_write_cannot_read(start: Callable[..., str], store: Store) -> None:
    address = start()
    error = refused(lambda: write(address, READ_TOKEN))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"{WRITE_METHOD} needs a token with the write scope" in (error.details() or "")
    assert nothing_written(store)
    failure = query_failure(address, ClientSecurity(WRITE_TOKEN))
    assert failure.code == grpc.StatusCode.PERMISSION_DENIED and "the read scope" in failure.message


def test_health_stays_open_and_reflection_needs_read(start: Callable[..., str]) -> None:
    address = start()
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = [reflection_pb2.ServerReflectionRequest(list_services="")]
        with pytest.raises(grpc.RpcError) as caught:
            list(reflection.ServerReflectionInfo(iter(ask), timeout=10))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            list(reflection.ServerReflectionInfo(iter(ask), timeout=10, metadata=(("authorization", WRITE_TOKEN),)))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, "not a bearer token"
        answers = list(
            reflection.ServerReflectionInfo(
                iter(ask), timeout=10, metadata=(("authorization", f"Bearer {READ_TOKEN}"),)
            )
        )
        services = {s.name for s in answers[0].list_services_response.service}
        assert {"tracehouse.v1.Ingest", "tracehouse.v1.Query"} <= services


def test_writer_gives_up_at_once_when_refused(start: Callable[..., str], store: Store) -> None:
    writer = BatchWriter(start(), ClientSecurity("x" * 30), patience=60)
    started = time.monotonic()
    try:
        writer.write(telemetry("refused").build())
        with pytest.raises(WriteFailed) as caught:
            writer.flush()
    finally:
        writer.close()
    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED and time.monotonic() - started < 10
    assert nothing_written(store)


# --- TLS ----------------------------------------------------------------------------------


def test_tls_server_and_client_with_token(
    start: Callable[..., str], store: Store, pki: Pki, token_files: dict[str, Path]
) -> None:
    address = start(tls=pki)
    write(address, WRITE_TOKEN, client_security(ca=pki.ca))
    with Client(address, timeout=10, security=client_security(token_files["read"], pki.ca)) as client:
        assert client.sql("SELECT count() AS n FROM ingest_batches")["n"][0] == 1
    assert "missing bearer token" in query_failure(address, client_security(ca=pki.ca)).message


def test_plain_text_client_to_tls_server_is_refused_and_nothing_written(
    start: Callable[..., str], store: Store, pki: Pki, token_files: dict[str, Path]
) -> None:
    address = start(tls=pki)
    error = refused(lambda: write(address, WRITE_TOKEN))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert nothing_written(store)
    failure = query_failure(address, client_security(token_files["read"]))
    assert failure.code == grpc.StatusCode.UNAVAILABLE and "pass --tls-ca" in failure.message


def test_tls_client_to_plain_server_and_untrusted_server_say_the_handshake_failed(
    start: Callable[..., str], store: Store, pki: Pki
) -> None:
    for address, ca in ((start(), pki.ca), (start(tls=pki), pki.other_ca)):
        failure = query_failure(address, client_security(ca=ca))
        assert failure.code == grpc.StatusCode.UNAVAILABLE and "TLS handshake" in failure.message
        with pytest.raises(grpc.RpcError) as refusal:
            write(address, WRITE_TOKEN, client_security(ca=ca))
        assert refusal.value.code() == grpc.StatusCode.UNAVAILABLE
    assert nothing_written(store)


def test_mtls_refuses_a_client_without_a_certificate(start: Callable[..., str], store: Store, pki: Pki) -> None:
    address = start(tls=pki, mtls=True)
    error = refused(lambda: write(address, WRITE_TOKEN, client_security(ca=pki.ca)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    expired = ClientSecurity(ca=pki.ca, cert=pki.expired_client, key=pki.expired_client_key)
    assert refused(lambda: write(address, WRITE_TOKEN, expired)).code() == grpc.StatusCode.UNAVAILABLE
    assert nothing_written(store)
    assert "client certificate" in query_failure(address, client_security(ca=pki.ca)).message
    write(address, WRITE_TOKEN, client_security(ca=pki.ca, cert=pki.client, key=pki.client_key))
    assert counts(store)["ingest_batches"] == 1


def test_client_checks_its_tls_material_naming_the_option(pki: Pki, tmp_path: Path) -> None:
    for kwargs, message in (
        ({"ca": pki.ca, "cert": pki.expired_client, "key": pki.expired_client_key}, "--tls-cert .* expired on 20"),
        ({"ca": pki.ca, "cert": pki.client, "key": pki.server_key}, "--tls-key .* is not the key of"),
        ({"ca": pki.ca, "cert": pki.client}, "--tls-cert and --tls-key go together"),
        ({"cert": pki.client, "key": pki.client_key}, "--tls-cert needs --tls-ca"),
        ({"ca": tmp_path / "nowhere.pem"}, "--tls-ca .*nowhere.pem: cannot read it"),
        ({"ca": pki.ca_key}, "--tls-ca .*: no PEM certificate"),
    ):
        with pytest.raises(SecurityError, match=message):
            client_security(**kwargs)


def test_agent_with_a_write_token_over_tls_gets_its_samples_stored(
    start: Callable[..., str], store: Store, pki: Pki, token_files: dict[str, Path], tmp_path: Path
) -> None:
    address = start(tls=pki)
    security = client_security(token_files["write"], pki.ca)
    agent = Agent(agent_config(address, tmp_path / "spool", security=security), SimulatedBackend(1))
    agent.start()
    time.sleep(1.0)
    report = agent.stop()
    assert report["sampled"] and report["stored"] == report["sampled"] and report["spooled"] == 0
    assert sample_count(store) == (report["sampled"], report["sampled"])


def test_agent_with_a_read_token_stores_nothing_and_keeps_its_samples(
    start: Callable[..., str], store: Store, pki: Pki, token_files: dict[str, Path], tmp_path: Path
) -> None:
    address = start(tls=pki)
    security = client_security(token_files["read"], pki.ca)
    agent = Agent(
        agent_config(address, tmp_path / "spool", security=security, shutdown_timeout=1.0), SimulatedBackend(1)
    )
    agent.start()
    time.sleep(0.6)
    report = agent.stop()
    assert report["sampled"] and report["stored"] == 0 and report["dropped"] == 0
    assert report["spooled"] > 0, "refused batches wait in the spool for a token that may write"
    assert nothing_written(store)


# --- `tracehouse serve` at startup --------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(config.ENV_HOME, str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("expired", "expired_key", None), r"--tls-cert \S+expired.pem: the certificate CN=expired expired on 20\d\d-"),
        (("future", "future_key", None), r"--tls-cert \S+future.pem: the certificate CN=future is not valid before 20"),
        (
            ("server", "client_key", None),
            r"--tls-key \S+client-key.pem is not the key of the certificate in --tls-cert",
        ),
        (("server", "server", None), r"--tls-key \S+server.pem: no PEM private key"),
        (("server", "server_key", "ca_key"), r"--tls-client-ca \S+ca-key.pem: no PEM certificate"),
    ],
)
def test_serve_refuses_bad_tls_material_at_startup(
    capsys: pytest.CaptureFixture[str], home: Path, pki: Pki, names: tuple[str, str, str | None], message: str
) -> None:
    cert, key, client_ca = names
    argv = ["serve", "--listen", "127.0.0.1:0", "--tls-cert", str(getattr(pki, cert))]
    argv += ["--tls-key", str(getattr(pki, key))]
    argv += ["--tls-client-ca", str(getattr(pki, client_ca))] if client_ca else []
    assert main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (home / "store").exists(), "refused before the store is opened"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tls-cert", "{server}"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "{ca}"], "--tls-client-ca needs --tls-cert and --tls-key"),
        (["--tokens", "{missing}"], "cannot read it"),
    ],
)
def test_serve_refuses_incomplete_settings(
    capsys: pytest.CaptureFixture[str], home: Path, pki: Pki, tmp_path: Path, extra: list[str], message: str
) -> None:
    paths = {"server": pki.server, "ca": pki.ca, "missing": tmp_path / "missing"}
    assert main(["serve", "--listen", "127.0.0.1:0", *(a.format(**paths) for a in extra)]) == 2
    assert message in capsys.readouterr().err


def test_serve_refuses_to_listen_beyond_loopback_without_tokens(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    assert main(["serve", "--listen", "0.0.0.0:0"]) == 2
    err = capsys.readouterr().err
    assert "--tokens" in err and "bind 127.0.0.1" in err
    assert not (home / "store").exists()


def test_tokens_without_tls_beyond_loopback_start_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    tokens = parse_tokens(TOKENS)
    with caplog.at_level(logging.INFO, "tracehouse.security"):
        check_exposure("0.0.0.0:50051", ServerSecurity(tokens), loopback=False)
    assert "clear text" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, "tracehouse.security"):
        check_exposure("127.0.0.1:50051", ServerSecurity(), loopback=True)
    assert "clear text" not in caplog.text


# --- the CLI and the UI's environment -----------------------------------------------------


def test_query_cli_with_token_file_and_tls_ca(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    start: Callable[..., str],
    pki: Pki,
    token_files: dict[str, Path],
) -> None:
    address = start(tls=pki)
    write(address, WRITE_TOKEN, client_security(ca=pki.ca))
    argv = ["query", "runs", "--server", address, "--format", "json"]
    assert main([*argv, "--token-file", str(token_files["read"]), "--tls-ca", str(pki.ca)]) == 0
    assert [run["run_id"] for run in json.loads(capsys.readouterr().out)] == ["b1"]
    assert main([*argv, "--token-file", str(token_files["read"])]) == 1
    assert "pass --tls-ca" in capsys.readouterr().err
    assert main([*argv, "--tls-ca", str(pki.ca)]) == 2
    assert "missing bearer token" in capsys.readouterr().err
    assert main([*argv, "--token-file", str(token_files["write"]), "--tls-ca", str(pki.ca)]) == 2
    assert "needs a token with the read scope" in capsys.readouterr().err
    # the environment, when no option says otherwise; an option wins over it
    monkeypatch.setenv(config.ENV_TOKEN_FILE, str(token_files["wrong"]))
    monkeypatch.setenv(config.ENV_TLS_CA, str(pki.ca))
    assert main(argv) == 2 and "unknown token" in capsys.readouterr().err
    assert main([*argv, "--token-file", str(token_files["read"])]) == 0
    monkeypatch.setenv(config.ENV_TLS_CA, str(pki.expired))
    with pytest.raises(SystemExit) as caught:
        main([*argv, "--token-file", str(token_files["read"])])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "--tls-ca" in err and "expired on" in err


def test_client_security_round_trips_through_the_environment(
    monkeypatch: pytest.MonkeyPatch, pki: Pki, token_files: dict[str, Path]
) -> None:
    chosen = client_security(token_files["read"], pki.ca, pki.client, pki.client_key)
    assert READ_TOKEN not in repr(chosen)
    for name, value in chosen.environment().items():
        monkeypatch.setenv(name, value)
    again = client_security()
    assert (again.token, again.ca, again.cert, again.key) == (READ_TOKEN, pki.ca, pki.client, pki.client_key)


def test_ui_gets_its_credentials_from_the_environment_and_no_others(
    monkeypatch: pytest.MonkeyPatch, pki: Pki, token_files: dict[str, Path]
) -> None:
    monkeypatch.setenv(config.ENV_TLS_CA, str(pki.ca))  # this shell's, not the UI's
    monkeypatch.setenv(config.ENV_STORE, "clickhouse://default@db:8123/tracehouse")  # the server's
    monkeypatch.setenv(config.ENV_STORE_PASSWORD, "store-password-0123456789")
    environment = ui_environment("127.0.0.1:1", ClientSecurity(READ_TOKEN, token_file=token_files["read"]))
    assert environment[config.ENV_SERVER] == "127.0.0.1:1"
    assert environment[config.ENV_TOKEN_FILE] == str(token_files["read"])
    assert config.ENV_TLS_CA not in environment and READ_TOKEN not in environment.values()
    assert config.ENV_STORE not in environment and config.ENV_STORE_PASSWORD not in environment
    assert "store-password-0123456789" not in environment.values()
    bare = ui_environment("127.0.0.1:1", None)
    assert not {config.ENV_TLS_CA, config.ENV_STORE, config.ENV_STORE_PASSWORD} & set(bare)


def test_ui_token_file_follows_a_kubernetes_secret_link_when_it_is_updated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Secret's file is `token -> ..data/token`, `..data -> ..TIMESTAMP`; an update writes a new
    timestamped folder, swings `..data` and deletes the old folder. The UI reads the file later."""
    secret = tmp_path / "secret"
    (secret / "..2025_01_01").mkdir(parents=True)
    (secret / "..2025_01_01" / "token").write_text(READ_TOKEN)
    (secret / "..data").symlink_to("..2025_01_01")
    (secret / "token").symlink_to("..data/token")
    monkeypatch.chdir(tmp_path)
    handed = Path(ClientSecurity(READ_TOKEN, token_file=Path("secret/token")).environment()[config.ENV_TOKEN_FILE])
    assert handed == secret / "token", "absolute, but not through the links"
    (secret / "..2025_02_01").mkdir()
    (secret / "..2025_02_01" / "token").write_text(WRITE_TOKEN)
    (secret / "..data_tmp").symlink_to("..2025_02_01")
    os.replace(secret / "..data_tmp", secret / "..data")
    (secret / "..2025_01_01" / "token").unlink()
    (secret / "..2025_01_01").rmdir()
    assert read_token(handed) == WRITE_TOKEN


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.1.2.3:1", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("unix:/tmp/tracehouse-x/grpc.sock", True),
        ("unix-abstract:tracehouse", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        ("10.0.0.5:50051", False),
        ("127.example.com:50051", False),
        ("tracehouse.example.com:443", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_a_token_sent_in_clear_text_beyond_this_machine_is_warned_about_once(
    caplog: pytest.LogCaptureFixture, pki: Pki
) -> None:
    remote = "192.0.2.17:50051"  # TEST-NET-1: never dialled, channels connect lazily
    with caplog.at_level(logging.WARNING, "tracehouse.channel"):
        for _ in range(2):
            open_channel(remote, ClientSecurity(READ_TOKEN)).close()
    warnings = [r for r in caplog.records if r.name == "tracehouse.channel"]
    assert len(warnings) == 1 and remote in warnings[0].getMessage()
    assert "clear text" in warnings[0].getMessage() and READ_TOKEN not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "tracehouse.channel"):
        open_channel("192.0.2.18:50051", ClientSecurity()).close()  # no token
        open_channel("192.0.2.19:50051", ClientSecurity(READ_TOKEN, ca=pki.ca)).close()  # TLS
        for local in ("127.0.0.1:50051", "localhost:1", "0.0.0.0:1", "unix:/tmp/tracehouse-x/grpc.sock"):
            open_channel(local, ClientSecurity(READ_TOKEN)).close()
    assert not [r for r in caplog.records if r.name == "tracehouse.channel"]


def test_up_gives_its_agent_and_ui_tokens_of_their_own_and_a_local_socket(
    store: Store, limits: Limits, pki: Pki
) -> None:
    up = Up(ui_port=None, demo=False)
    security = up.secure(ServerSecurity(parse_tokens(TOKENS), load_server_tls(pki.server, pki.server_key, None)))
    assert security.local_socket and security.tokens is not None and len(security.tokens) == 5
    assert up.agent_token and up.ui_token
    assert security.tokens.scopes_of(up.agent_token) == {"write"}
    assert security.tokens.scopes_of(up.ui_token) == {"read"}
    server = create_server(store, "127.0.0.1:0", limits, security=security)
    try:
        assert server.local_address and server.local_address.startswith("unix:")
        local = server.local_address
        write(local, up.agent_token, host=socket.gethostname())  # the agent's token is bound to this host
        assert refused(lambda: write(local, None, batch="b2")).code() == grpc.StatusCode.UNAUTHENTICATED
        with Client(local, timeout=10, security=ClientSecurity(up.ui_token)) as client:
            assert client.sql("SELECT count() AS n FROM ingest_batches")["n"][0] == 1
    finally:
        server.stop(grace=1)


def test_up_with_client_certificates_and_no_tokens_opens_no_port_to_other_users(
    store: Store, limits: Limits, pki: Pki, tmp_path: Path
) -> None:
    """mTLS without --tokens: the agent's and the UI's way in is a unix socket in a folder only
    this user may enter, not a TCP port that anyone on the machine could call without a certificate."""
    up = Up(ui_port=None, demo=False)
    security = up.secure(ServerSecurity(None, load_server_tls(pki.server, pki.server_key, pki.ca)))
    assert security.local_socket and security.tokens is None and up.agent_token is None
    server = create_server(store, "127.0.0.1:0", limits, security=security)
    assert server.local_address is not None and server.local_folder is not None
    folder = server.local_folder
    try:
        socket_path = Path(server.local_address.removeprefix("unix:"))
        assert socket_path.parent == folder and stat.S_ISSOCK(socket_path.stat().st_mode)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
        address = f"127.0.0.1:{server.port}"
        assert refused(lambda: write(address, None, client_security(ca=pki.ca))).code() == grpc.StatusCode.UNAVAILABLE
        agent = Agent(agent_config(server.local_address, tmp_path / "spool"), SimulatedBackend(1))
        agent.start()
        time.sleep(0.5)
        report = agent.stop()
        assert report["sampled"] and report["stored"] == report["sampled"]
        with Client(server.local_address, timeout=10) as client:
            assert client.sql("SELECT count() AS n FROM ingest_batches")["n"][0] >= 1
    finally:
        server.stop(grace=1)
    assert not folder.exists(), "the socket's folder goes with the server"
