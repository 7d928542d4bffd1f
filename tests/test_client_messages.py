"""Messages that say what happened: a TLS certificate made for another name says so (not "does
it want a client certificate"), and `serve --listen unix:PATH` says the path it listens on
(and, as every command that may have children, stops cleanly on a hangup)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from query.client import Client, QueryFailed
from store.store import Store
from tracehouse.channel import ClientSecurity
from tracehouse.cli.serve import create_server
from tracehouse.model import Limits
from tracehouse.security import ServerSecurity, load_server_tls


def _pem(tmp_path: Path, name: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
    (tmp_path / f"{name}-key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (tmp_path / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return tmp_path / f"{name}.pem"


def _certificate(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0] if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer:  # a server's: valid, trusted, but for another name than the one the client dials
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


@pytest.fixture
def elsewhere(tmp_path: Path, store: Store, limits: Limits) -> Iterator[tuple[str, Path]]:
    """A TLS server on loopback whose certificate names only db.example.com: its address and the CA."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key)
    ca_file = _pem(tmp_path, "ca", ca, ca_key)
    server_file = _pem(tmp_path, "server", _certificate("db.example.com", server_key, (ca.subject, ca_key)), server_key)
    tls = load_server_tls(server_file, tmp_path / "server-key.pem", None)
    server = create_server(store, "127.0.0.1:0", limits, security=ServerSecurity(None, tls))
    yield f"127.0.0.1:{server.port}", ca_file
    server.stop(grace=1)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_certificate_for_another_name_says_so(host: str, elsewhere: tuple[str, Path]) -> None:
    address, ca = elsewhere
    dialled = address.replace("127.0.0.1", host)
    with Client(dialled, timeout=10, security=ClientSecurity(ca=ca)) as client, pytest.raises(QueryFailed) as caught:
        client.runs()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert f"the server's TLS certificate does not name {host}" in caught.value.message
    assert "client certificate" not in caught.value.message


def test_serve_on_a_unix_socket_says_its_path_and_a_hangup_stops_it_cleanly(tmp_path: Path) -> None:
    socket_path = tmp_path / "tracehouse.sock"
    env = {**os.environ, "TRACEHOUSE_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli.main", "serve", "--listen", f"unix:{socket_path}"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        lines = []
        for line in server.stderr:
            lines.append(line)
            if "listening on" in line:
                break
        assert f"listening on unix:{socket_path} (" in lines[-1], "".join(lines)
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.send_signal(signal.SIGHUP)
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()
    assert server.returncode == 0, "a hangup stops it as SIGTERM does, finishing calls and closing the store"
