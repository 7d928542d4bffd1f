"""Every client's channel to `tracehouse serve`: plain or TLS (optionally with a client
certificate), and the bearer token its calls carry.

Options, then the environment (TRACEHOUSE_TOKEN_FILE, TRACEHOUSE_TLS_CA, TRACEHOUSE_TLS_CERT,
TRACEHOUSE_TLS_KEY), then nothing: a CA turns TLS on; no token means calls carry none. A token
sent without TLS to a server beyond this machine is logged as a warning, once for each server.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tracehouse import config
from tracehouse.regularfile import FileRefused, read_regular
from tracehouse.security import (
    SecurityError,
    check_certificates,
    check_key_pair,
    error_reason,
    is_loopback,
    read_pem,
)
from tracehouse.v1 import ingest_pb2

log = logging.getLogger("tracehouse.channel")

# The server refused the caller, not the request: retrying with the same credentials cannot help.
ACCESS_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
SECURITY_VARIABLES = (config.ENV_TOKEN_FILE, config.ENV_TLS_CA, config.ENV_TLS_CERT, config.ENV_TLS_KEY)
# how gRPC says that the server's certificate is valid but made for another name
HOSTNAME_MISMATCH = ("hostname verification", "no match found for server name", "peer name")
# gRPC waits out a backoff after a failed connection (1 s, growing to 120 s by default), failing calls at
# once meanwhile: a server back after a few minutes away would wait up to two for its agents.
RECONNECT_MAX_MS = 2000
MAX_TOKEN_FILE_BYTES = 64 << 10  # a token, or a line of the tokens file


@dataclass(frozen=True)
class ClientSecurity:
    """A client's credentials. `token_file` is where `token` came from, handed on to a child
    process (the UI) through the environment."""

    token: str | None = field(default=None, repr=False)
    ca: Path | None = None  # PEM: the CA (or self-signed certificate) the server's certificate chains to
    cert: Path | None = None  # PEM: this client's certificate, for a server that wants one (mTLS)
    key: Path | None = None  # PEM: its private key
    token_file: Path | None = None

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def environment(self) -> dict[str, str]:
        """These settings as the variables that `client_security()` reads. Paths are made
        absolute but not resolved: a Kubernetes Secret's file is a link through `..data`, which
        kubelet points at a new folder (deleting the old) when the Secret changes."""
        paths = {
            config.ENV_TOKEN_FILE: self.token_file,
            config.ENV_TLS_CA: self.ca,
            config.ENV_TLS_CERT: self.cert,
            config.ENV_TLS_KEY: self.key,
        }
        return {name: str(path.absolute()) for name, path in paths.items() if path is not None}

    def credentials(self) -> grpc.ChannelCredentials:
        assert self.ca is not None
        key = read_pem(self.key, "--tls-key") if self.key is not None else None
        cert = read_pem(self.cert, "--tls-cert") if self.cert is not None else None
        return grpc.ssl_channel_credentials(read_pem(self.ca, "--tls-ca"), key, cert)


def read_token(path: Path) -> str:
    try:
        token = read_regular(path, MAX_TOKEN_FILE_BYTES).decode().strip()
    except FileRefused as refused:
        raise SecurityError(f"--token-file {path}: cannot read it: {error_reason(refused, path)}") from None
    except UnicodeDecodeError as error:
        raise SecurityError(f"--token-file {path}: cannot read it: {error_reason(error)}") from None
    if not token:
        raise SecurityError(f"--token-file {path} is empty")
    words = token.split()
    bounds = all(word.startswith(("hosts=", "runs=")) for word in words[2:])
    if len(words) >= 2 and words[0] in ("read", "write", "admin") and bounds:
        token = words[1]  # a line copied whole from the tokens file, bounds and all
    if len(token.split()) != 1:
        raise SecurityError(f"--token-file {path}: expected one token")
    return token


def _path(option: Path | str | None, variable: str) -> Path | None:
    chosen = option if option is not None else os.environ.get(variable) or None
    return Path(chosen).expanduser() if chosen is not None else None


def client_security(
    token_file: Path | str | None = None,
    ca: Path | str | None = None,
    cert: Path | str | None = None,
    key: Path | str | None = None,
) -> ClientSecurity:
    """Options, else TRACEHOUSE_* variables; files read and checked now, so that a problem is
    reported at start, naming the option, rather than as a failed connection."""
    token_path = _path(token_file, config.ENV_TOKEN_FILE)
    ca_path = _path(ca, config.ENV_TLS_CA)
    cert_path = _path(cert, config.ENV_TLS_CERT)
    key_path = _path(key, config.ENV_TLS_KEY)
    if (cert_path is None) != (key_path is None):
        raise SecurityError("--tls-cert and --tls-key go together: this client's certificate and its private key")
    if cert_path is not None and key_path is not None:
        if ca_path is None:
            raise SecurityError("--tls-cert needs --tls-ca: the CA that the server's certificate chains to")
        check_key_pair(
            read_pem(cert_path, "--tls-cert"), cert_path, read_pem(key_path, "--tls-key"), key_path,
            "--tls-cert", "--tls-key",
        )  # fmt: skip
    if ca_path is not None:
        check_certificates(read_pem(ca_path, "--tls-ca"), "--tls-ca", ca_path)
    token = read_token(token_path) if token_path is not None else None
    return ClientSecurity(token, ca_path, cert_path, key_path, token_path)


def encoded_write(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    """Ingest.Write on `channel`, taking a WriteRequest already encoded: a batch is encoded
    once, then sent, spooled or sent again as the same bytes."""

    return channel.unary_unary(
        "/tracehouse.v1.Ingest/Write",
        request_serializer=None,
        response_deserializer=ingest_pb2.WriteResponse.FromString,
    )


def open_channel(
    server: str, security: ClientSecurity | None = None, options: Sequence[tuple[str, Any]] = (), fresh: bool = False
) -> grpc.Channel:
    """A channel to `server` (host:port, or unix:PATH): TLS when `security` names a CA. A failed
    connection is tried again within RECONNECT_MAX_MS. gRPC shares a connection among a process's
    channels to one address, and one that failed waits out its backoff before it tries again, failing
    calls at once meanwhile; `fresh`: a connection of this channel's own, tried now."""
    settings = [
        ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
        *options,
        *([("grpc.use_local_subchannel_pool", 1)] if fresh else []),
    ]
    if security is not None and security.tls:
        return grpc.secure_channel(server, security.credentials(), options=settings)
    if security is not None and security.token:
        warn_clear_text_token(server)
    return grpc.insecure_channel(server, options=settings)


_warned_servers: set[str] = set()


def warn_clear_text_token(server: str) -> None:
    """Warn, once for each server, that a token is about to leave this machine without TLS."""
    unspecified = server.rsplit(":", 1)[0].strip("[]") in ("0.0.0.0", "::")  # dialled, it is this machine
    if is_loopback(server) or unspecified or server in _warned_servers:
        return
    _warned_servers.add(server)
    log.warning(
        "sending a token to %s without TLS: it and the data travel in clear text; pass --tls-ca (%s)",
        server, config.ENV_TLS_CA,
    )  # fmt: skip


def explain(code: grpc.StatusCode, details: str, server: str, security: ClientSecurity | None) -> str:
    """A failed call's message, with what to try where the status alone is vague."""
    tls = security is not None and security.tls
    lowered = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE:
        if tls and any(sign in lowered for sign in HOSTNAME_MISMATCH):
            host = server.rsplit(":", 1)[0].strip("[]") if ":" in server else server
            return (
                f"{details}; the server's TLS certificate does not name {host}: connect by a name or address "
                "that its certificate lists (subjectAltName), or give the server a certificate for this one"
            )
        if "connection refused" in lowered or "name resolution" in lowered or "dns" in lowered:
            return f"no tracehouse server at {server} ({details}); start one with `tracehouse serve`"
        if "ssl" in lowered or "handshake" in lowered or "certificate" in lowered or "tls" in lowered:
            return (
                f"{details}; the TLS handshake with {server} failed: does --tls-ca trust the server's certificate, "
                "is that certificate valid for this address and not expired, and does the server want a client "
                "certificate (--tls-cert and --tls-key)?"
            )
        if "socket closed" in lowered or "connection reset" in lowered or "connect" in lowered:
            if tls:
                return (
                    f"{details}; the server at {server} closed the connection during TLS: does it want a client "
                    "certificate (--tls-cert and --tls-key) signed by its --tls-client-ca, and is yours valid?"
                )
            return f"{details}; is the server at {server} using TLS? then pass --tls-ca (${config.ENV_TLS_CA})"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if security is not None and security.token:
            where = f" in {security.token_file}" if security.token_file else ""
            return f"{details}: the token{where} is not in the server's tokens file"
        return f"{details}; pass --token-file FILE (${config.ENV_TOKEN_FILE})"
    return details
