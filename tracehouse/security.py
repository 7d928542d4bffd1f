"""Who may call `tracehouse serve`: bearer tokens with scopes, checked on every call, and the TLS
material the server presents (with, for mTLS, the CA that its clients' certificates must chain to).

Tokens file (`--tokens FILE`): one `SCOPE TOKEN [hosts=GLOB,...] [runs=PREFIX,...]` a line; SCOPE
is `read` (Query: the UI, the CLI), `write` (Ingest: agents, imports) or `admin` (both). Blank lines
and lines starting with `#` are ignored. `hosts=` and `runs=` bound what a write or admin token may
write (ingest/grants.py): every host a batch names must match one of the globs (`fnmatchcase`), every
run id start with one of the prefixes; a token with `runs=` and no `hosts=` sends no samples (they
are their host's telemetry, read for every run on it). `tracehouse token --scope write --hosts 'gpu-*'` prints a
fresh line to append.

A token never appears in a message or a log line: errors name the file and the line number.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from tracehouse.regularfile import FileRefused, read_regular
from tracehouse.scopes import CALLER, Grant

log = logging.getLogger("tracehouse.security")

READ = "read"
WRITE = "write"
SCOPES: dict[str, frozenset[str]] = {
    READ: frozenset({READ}),
    WRITE: frozenset({WRITE}),
    "admin": frozenset({READ, WRITE}),
}
MIN_TOKEN_CHARS = 16
BOUND_KEYS = ("hosts", "runs")
RUN_PREFIX = re.compile(r"[A-Za-z0-9._:/-]+")  # what a run id is made of (ingest/validate.py)
TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 43 characters
MAX_TOKENS_FILE_BYTES = 4 << 20  # tens of thousands of tokens; a larger file (or /dev/zero) is refused unread
MAX_PEM_BYTES = 1 << 20  # a certificate chain or a CA bundle

# What each service needs; a method of any other service needs both read and write.
HEALTH_PREFIX = "/grpc.health.v1.Health/"  # open: load balancers and probes carry no token
NEEDED_BY_PREFIX = (
    (HEALTH_PREFIX, frozenset[str]()),
    ("/tracehouse.v1.Ingest/", frozenset({WRITE})),
    ("/tracehouse.v1.Query/", frozenset({READ})),
    ("/tracehouse.v1.Capture/List", frozenset({READ})),
    ("/tracehouse.v1.Capture/", frozenset({WRITE})),  # asking for a profile writes into the run
    ("/grpc.reflection.", frozenset({READ})),
)


class SecurityError(ValueError):
    """Security settings that cannot be used, or that would leave the server open; the message
    names the option and what to do."""


def bound_words(hosts: Iterable[str] = (), runs: Iterable[str] = ()) -> list[str]:
    """`hosts=...` and `runs=...` words for a tokens file line; none for what is not bounded."""
    words = []
    for key, values in (("hosts", list(hosts)), ("runs", list(runs))):
        if values:
            words.append(f"{key}={','.join(values)}")
    return words


def new_token_line(scope: str, hosts: Iterable[str] = (), runs: Iterable[str] = ()) -> str:
    """A fresh `SCOPE TOKEN [hosts=...] [runs=...]` line for a tokens file."""
    if scope not in SCOPES:
        raise SecurityError(f"unknown scope {scope!r}: read, write or admin")
    words = bound_words(hosts, runs)
    parse_grant(scope, words, "token")
    return " ".join([scope, secrets.token_urlsafe(TOKEN_BYTES), *words])


def glob_escape(name: str) -> str:
    """A glob that matches `name` alone (a host name, for a token bound to that host)."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def parse_grant(scope: str, words: Iterable[str], where: str) -> Grant:
    """The grant of a scope and the bound words after the token. Messages name the word's key
    and position, never its value (a token written in the wrong place must not be echoed)."""
    bounds: dict[str, tuple[str, ...]] = {}
    for position, word in enumerate(words, 3):
        key, equals, value = word.partition("=")
        if not equals or key not in BOUND_KEYS:
            raise SecurityError(
                f"{where}: expected 'SCOPE TOKEN' and then only hosts=GLOB,... or runs=PREFIX,... "
                f"(word {position} is neither)"
            )
        if key in bounds:
            raise SecurityError(f"{where}: {key}= is given twice; list them all in one, separated by commas")
        items = tuple(value.split(","))
        if not all(items):
            raise SecurityError(f"{where}: {key}= needs a list separated by commas, with no empty items")
        if key == "hosts" and not all(item.isprintable() and item.split() == [item] for item in items):
            raise SecurityError(f"{where}: hosts= takes globs of printable characters, no spaces, e.g. hosts=gpu-*")
        if key == "runs" and not all(RUN_PREFIX.fullmatch(item) for item in items):
            raise SecurityError(f"{where}: runs= takes run-id prefixes made of [A-Za-z0-9._:/-], e.g. runs=ci-")
        bounds[key] = items
    if bounds and WRITE not in SCOPES[scope]:
        raise SecurityError(
            f"{where}: hosts= and runs= bound what a token writes; a read token reads everything, unbound"
        )
    return Grant(SCOPES[scope], bounds.get("hosts"), bounds.get("runs"))


@dataclass(frozen=True)
class Tokens:
    """Known tokens and what each grants. Lookups compare with `hmac.compare_digest`, against
    every token, so that the time taken does not tell how much of a guess matched."""

    entries: tuple[tuple[bytes, Grant], ...] = field(repr=False)

    def __len__(self) -> int:
        return len(self.entries)

    def grant_of(self, token: str) -> Grant | None:
        presented = token.encode()
        found = None
        for known, grant in self.entries:
            if hmac.compare_digest(known, presented):
                found = grant
        return found

    def scopes_of(self, token: str) -> frozenset[str] | None:
        grant = self.grant_of(token)
        return None if grant is None else grant.scopes

    def adding(self, token: str, scope: str, hosts: Iterable[str] = (), runs: Iterable[str] = ()) -> Tokens:
        grant = parse_grant(scope, bound_words(hosts, runs), "a token added")
        return Tokens((*self.entries, (token.encode(), replace(grant, holder=holder_of(token.encode())))))


def holder_of(token: bytes) -> str:
    """Who holds a token, as the server tells callers apart (a pace per caller): a digest, never the token."""
    return hashlib.sha256(token).hexdigest()[:16]


def parse_tokens(text: str, source: str = "--tokens") -> Tokens:
    """Read a tokens file's text; a malformed line is an error naming its number, never its token."""
    entries: list[tuple[bytes, Grant]] = []
    seen: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split()
        where = f"{source} line {number}"
        if len(parts) < 2:
            raise SecurityError(
                f"{where}: expected 'SCOPE TOKEN' (SCOPE read, write or admin), then hosts= or runs= if bounded"
            )
        scope, token, *bounds = parts
        if scope not in SCOPES:
            raise SecurityError(f"{where}: the first word must be the scope: read, write or admin")
        if token.startswith(tuple(f"{key}=" for key in BOUND_KEYS)):
            raise SecurityError(f"{where}: the second word must be the token; hosts= and runs= come after it")
        if len(token) < MIN_TOKEN_CHARS:
            raise SecurityError(
                f"{where}: the token is shorter than {MIN_TOKEN_CHARS} characters; make one with `tracehouse token`"
            )
        if not token.isascii() or not token.isprintable():
            raise SecurityError(f"{where}: the token must be printable ASCII, as `tracehouse token` makes")
        encoded = token.encode()
        if encoded in seen:
            raise SecurityError(f"{where}: the same token is on line {seen[encoded]}; give each client its own")
        seen[encoded] = number
        entries.append((encoded, replace(parse_grant(scope, bounds, where), holder=holder_of(encoded))))
    if not entries:
        raise SecurityError(f"{source}: no tokens in it; add lines made with `tracehouse token --scope SCOPE`")
    return Tokens(tuple(entries))


def load_tokens(path: Path) -> Tokens:
    try:
        text = read_regular(path, MAX_TOKENS_FILE_BYTES).decode()
    except FileRefused as refused:
        raise SecurityError(f"--tokens {path}: cannot read it: {error_reason(refused, path)}") from None
    except UnicodeDecodeError as error:
        raise SecurityError(f"--tokens {path}: cannot read it: {error_reason(error)}") from None
    tokens = parse_tokens(text, f"--tokens {path}")
    if path.stat().st_mode & 0o007:  # a group may need it: Kubernetes mounts secrets 0440
        log.warning("--tokens %s can be read by every user of this machine: chmod o-rwx it", path)
    return tokens


def error_reason(error: Exception, path: Path | None = None) -> str:
    """Why a file could not be read, without the path (the message names it with its option)."""
    text = (error.strerror if isinstance(error, OSError) else None) or str(error)
    return text.removeprefix(f"{path}: ") if path is not None else text


def read_pem(path: Path, flag: str) -> bytes:
    try:
        return read_regular(path, MAX_PEM_BYTES)
    except FileRefused as refused:
        raise SecurityError(f"{flag} {path}: cannot read it: {error_reason(refused, path)}") from None


def _date(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def check_certificates(pem: bytes, flag: str, path: Path, now: dt.datetime | None = None) -> list[Any]:
    """The certificates in a PEM file, each inside its validity period at `now`."""
    from cryptography import x509

    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise SecurityError(f"{flag} {path}: no PEM certificate in it") from None
    now = now or dt.datetime.now(dt.UTC)
    for certificate in certificates:
        subject = certificate.subject.rfc4514_string() or "(no subject)"
        if certificate.not_valid_after_utc <= now:
            raise SecurityError(
                f"{flag} {path}: the certificate {subject} expired on {_date(certificate.not_valid_after_utc)}"
            )
        if certificate.not_valid_before_utc > now:
            raise SecurityError(
                f"{flag} {path}: the certificate {subject} is not valid before "
                f"{_date(certificate.not_valid_before_utc)}"
            )
    return certificates


def check_key_pair(cert_pem: bytes, cert_path: Path, key_pem: bytes, key_path: Path, cert_flag: str,
                   key_flag: str) -> None:  # fmt: skip
    """The certificate chain is valid now, and the private key belongs to its first certificate."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    leaf = check_certificates(cert_pem, cert_flag, cert_path)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise SecurityError(f"{key_flag} {key_path}: the key is encrypted; give an unencrypted PEM key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise SecurityError(f"{key_flag} {key_path}: no PEM private key in it") from None
    form = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*form) != leaf.public_key().public_bytes(*form):
        raise SecurityError(f"{key_flag} {key_path} is not the key of the certificate in {cert_flag} {cert_path}")


@dataclass(frozen=True)
class ServerTls:
    cert: bytes  # PEM: the server's certificate, then any intermediates
    key: bytes = field(repr=False)
    client_ca: bytes | None = None  # PEM: set, clients must present a certificate it signed

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def load_server_tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> ServerTls | None:
    """The server's TLS material, checked: readable, within its dates, key matching certificate."""
    if cert is None and key is None:
        if client_ca is not None:
            raise SecurityError("--tls-client-ca needs --tls-cert and --tls-key: client certificates need TLS")
        return None
    if cert is None or key is None:
        raise SecurityError("--tls-cert and --tls-key go together: the server's certificate and its private key")
    cert_pem, key_pem = read_pem(cert, "--tls-cert"), read_pem(key, "--tls-key")
    check_key_pair(cert_pem, cert, key_pem, key, "--tls-cert", "--tls-key")
    ca_pem = None
    if client_ca is not None:
        ca_pem = read_pem(client_ca, "--tls-client-ca")
        check_certificates(ca_pem, "--tls-client-ca", client_ca)
    return ServerTls(cert_pem, key_pem, ca_pem)


@dataclass(frozen=True)
class ServerSecurity:
    """What `create_server` enforces. No tokens: every call is let in (loopback only, see
    `check_exposure`). No TLS: plain text."""

    tokens: Tokens | None = None
    tls: ServerTls | None = None
    # also take plain-text calls on a unix socket in a folder of its own (mode 700, so only this
    # user may connect): `tracehouse up`'s agent and UI, which hold neither the CA nor a client
    # certificate; tokens, when set, still apply there
    local_socket: bool = False


def load_server_security(
    tokens: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    tls_client_ca: Path | None = None,
) -> ServerSecurity:
    return ServerSecurity(
        load_tokens(tokens) if tokens is not None else None, load_server_tls(tls_cert, tls_key, tls_client_ca)
    )


def is_loopback(address: str) -> bool:
    """Whether `address` (host:port, [v6]:port, or a gRPC unix: target) stays on this machine."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address.removeprefix("dns:///").rsplit(":", 1)[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(listen: str, security: ServerSecurity, loopback: bool) -> None:
    """Refuse to serve beyond this machine without tokens; warn when tokens would travel in clear text."""
    host = listen if listen.startswith(("unix:", "unix-abstract:")) else listen.rsplit(":", 1)[0]
    if loopback:
        if security.tokens is None:
            log.info("no --tokens: every call on %s is let in (this machine only)", host)
        return
    if security.tokens is None:
        raise SecurityError(
            f"--listen {listen} reaches beyond this machine and there is no --tokens: anyone could read and "
            "write. Pass --tokens FILE (lines made with `tracehouse token`), or bind 127.0.0.1"
        )
    if security.tls is None:
        log.warning(
            "listening on %s without TLS: tokens and data travel in clear text; pass --tls-cert and --tls-key", host
        )


def needed_scopes(method: str) -> frozenset[str]:
    for prefix, needed in NEEDED_BY_PREFIX:
        if method.startswith(prefix):
            return needed
    return frozenset({READ, WRITE})


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else ""
    return None


class TokenInterceptor(grpc.ServerInterceptor):
    """Every call but health checks carries `authorization: Bearer TOKEN` with the scope its
    service needs: UNAUTHENTICATED without a known token, PERMISSION_DENIED without the scope."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        needed = needed_scopes(method)
        handler = continuation(handler_call_details)
        if not needed or handler is None:
            return handler
        grant = self._grant(handler_call_details.invocation_metadata, needed, method)
        return _granting(handler, grant) if isinstance(grant, Grant) else _refusing(handler, method, *grant)

    def _grant(
        self, metadata: Iterable[tuple[str, Any]] | None, needed: frozenset[str], method: str
    ) -> Grant | tuple[grpc.StatusCode, str]:
        """What the caller's token grants, or why the call is refused."""
        token = bearer_token(metadata)
        if not token:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token (metadata `authorization: Bearer TOKEN`)"
        grant = self.tokens.grant_of(token)
        if grant is None:
            return grpc.StatusCode.UNAUTHENTICATED, "unknown token"
        missing = needed - grant.scopes
        if missing:
            scope = "admin" if len(needed) > 1 else next(iter(needed))
            return grpc.StatusCode.PERMISSION_DENIED, (
                f"{method} needs a token with the {scope} scope"
                + ("" if scope == "admin" else " (or admin)")
                + f"; this one has {' and '.join(sorted(grant.scopes))} only"
            )
        return grant


def _granting(handler: grpc.RpcMethodHandler, grant: Grant) -> grpc.RpcMethodHandler:
    """`handler` with the caller's grant in `ingest.grants.CALLER` while a unary call runs (the
    Ingest and Query methods); a streaming response outlives the call, so those get none."""
    if handler.response_streaming or handler.unary_unary is None:
        return handler
    behavior = handler.unary_unary

    def granted(request: Any, context: grpc.ServicerContext) -> Any:
        reset = CALLER.set(grant)
        try:
            return behavior(request, context)
        finally:
            CALLER.reset(reset)

    return grpc.unary_unary_rpc_method_handler(
        granted, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def _refusing(
    handler: grpc.RpcMethodHandler, method: str, code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that refuses the call."""

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        log.info("refused %s from %s: %s", method, context.peer(), message.split(":")[0])
        context.abort(code, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
