"""`tracehouse serve`: the Ingest and Query services, health and reflection, in one gRPC server."""

from __future__ import annotations

import gc
import logging
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ingest.admission import DEFAULT_MAX_PENDING_BYTES, DEFAULT_TARGET_MS, Admission, Overloaded
from ingest.capture_rules import Rule, RuleEngine
from ingest.capture_service import CaptureBoard, CaptureService
from ingest.captures import Asked, CaptureRefused
from ingest.commitpolicy import CommitPolicy
from ingest.grants import OutOfBounds
from ingest.groupcommit import GroupCommit
from ingest.pace import Pace
from ingest.service import IngestService
from ingest.validate import BatchError
from query.keeper import Keeper
from query.service import QueryService
from store.location import parse_store_url
from store.store import Store
from store.storeerrors import (
    BatchConflict,
    BatchRefused,
    QueryTooLarge,
    SqlRejected,
    StoreBusy,
    StoreError,
    StoreNotWritable,
    StoreUnavailable,
)
from tracehouse.cli.stopping import wait_for_stop
from tracehouse.model import Limits
from tracehouse.pushback import PUSHBACK_KEY, TRANSPORT_MAX_BYTES
from tracehouse.requesterrors import QueryError, RunNotFound
from tracehouse.security import ServerSecurity, TokenInterceptor, check_exposure, is_loopback
from tracehouse.v1 import capture_pb2, ingest_pb2, query_pb2

log = logging.getLogger("tracehouse.serve")

# Threads for calls: a write holds one until the group holding its batch is stored (ingest/groupcommit.py),
# so a fleet needs hundreds; threads are made as calls come. More than this many, all wanting the GIL,
# answered a thousand writers later, not sooner (docs/benchmarks/history.md, A fleet).
DEFAULT_WORKERS = 256
INGEST = ingest_pb2.DESCRIPTOR.services_by_name["Ingest"]
QUERY = query_pb2.DESCRIPTOR.services_by_name["Query"]
CAPTURE = capture_pb2.DESCRIPTOR.services_by_name["Capture"]
# gRPC refuses messages over TRANSPORT_MAX_BYTES itself (RESOURCE_EXHAUSTED) before our code
# sees them; below it, a request over its limit gets INVALID_ARGUMENT from us, naming the limit.
SQL_REJECTION_CODES = {
    "readonly": grpc.StatusCode.PERMISSION_DENIED,
    "too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,  # past a limit on time, memory or size
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
}


# What the store's messages may carry that clients must not see: the engine's version, its
# stack, the store's URL (http(s) with the password starred, or chdb:// and the folder), and
# file paths (temp files of an insert, the store's folder).
_VERSION = re.compile(r"\s*\(version [^)]*\)")
_INSERT_FILE = re.compile(r"\s*\(in file/uri [^)]*\)")
_LOCATION = re.compile(r"\s*\b(?:chdb|file|https?)://\S*?(?=:?(?:\s|$))")
_PATH = re.compile(r"(?<![\w.~-])/[^\s'\"()\[\],;:]*")


def public_message(text: str) -> str:
    """A store's message as a client may see it: one line, without paths, URLs or versions."""
    line = text.strip().split("\n", 1)[0]
    for pattern, replacement in ((_VERSION, ""), (_INSERT_FILE, ""), (_LOCATION, ""), (_PATH, "…")):
        line = pattern.sub(replacement, line)
    return line


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """Map the packages' errors to a gRPC status and a message a person can act on. A store's
    message reaches the client only through public_message; the server log keeps it whole."""
    if isinstance(error, BatchError | QueryError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, RunNotFound):
        return grpc.StatusCode.NOT_FOUND, str(error)
    if isinstance(error, CaptureRefused):
        return grpc.StatusCode.FAILED_PRECONDITION, str(error)
    if isinstance(error, OutOfBounds):
        return grpc.StatusCode.PERMISSION_DENIED, str(error)
    if isinstance(error, BatchConflict):
        return grpc.StatusCode.ALREADY_EXISTS, str(error)
    if isinstance(error, Overloaded):  # the retry hint rides in a trailer the service set
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
    if isinstance(error, StoreBusy | QueryTooLarge):  # a busy store's retry hint: a trailer the handler sets
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
    if isinstance(error, SqlRejected):
        return SQL_REJECTION_CODES[error.reason], public_message(str(error))
    if isinstance(error, BatchRefused):
        return grpc.StatusCode.INVALID_ARGUMENT, public_message(str(error))
    if isinstance(error, StoreUnavailable):
        log.debug("answering UNAVAILABLE: %s", error)
        return grpc.StatusCode.UNAVAILABLE, public_message(str(error))
    if isinstance(error, StoreError):
        log.error("store error: %s", error)
        return grpc.StatusCode.INTERNAL, public_message(str(error))
    log.exception("unexpected error", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}); the server log has details"


def _method_handler(
    request_type: type[Message], behavior: Callable[..., Any], max_request_bytes: int, pass_encoded: bool,
    before: Callable[[], None],
) -> grpc.RpcMethodHandler:  # fmt: skip
    """Parse requests ourselves, so that a malformed or oversized one is INVALID_ARGUMENT
    with a reason rather than an opaque deserialization failure; `before` runs before each call."""
    name = request_type.DESCRIPTOR.full_name

    def unary(data: bytes, context: grpc.ServicerContext) -> Any:
        if len(data) > max_request_bytes:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request: {len(data)} bytes; the limit is {max_request_bytes}: send smaller batches",
            )
        try:
            request = request_type.FromString(data)
        except DecodeError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {name}: {error}")
        try:
            before()
            return behavior(request, context, data) if pass_encoded else behavior(request, context)
        except Exception as error:
            code, message = status_for(error)
            if isinstance(error, StoreBusy):
                context.set_trailing_metadata(((PUSHBACK_KEY, str(error.retry_ms)),))
            context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=None, response_serializer=lambda response: response.SerializeToString()
    )


def add_service(
    server: grpc.Server, service: ServiceDescriptor, servicer: Any, max_request_bytes: int,
    before: Callable[[], None] = lambda: None,
) -> None:  # fmt: skip
    encoded = getattr(servicer, "wants_encoded_request", ())
    handlers = {
        method.name: _method_handler(
            message_factory.GetMessageClass(method.input_type),
            getattr(servicer, method.name),
            max_request_bytes,
            method.name in encoded,
            before,
        )
        for method in service.methods
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


@dataclass
class Server:
    grpc_server: grpc.Server
    port: int
    health: health.HealthServicer
    local_address: str | None = None  # `unix:PATH`, plain text, when ServerSecurity.local_socket
    local_folder: Path | None = None  # the socket's private folder, removed at stop
    commit: GroupCommit | None = None
    captures: CaptureBoard | None = None
    rules: RuleEngine | None = None
    keeper: Keeper | None = None

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", INGEST.full_name, QUERY.full_name, CAPTURE.full_name):
            self.health.set(service, status)

    def stop(self, grace: float) -> None:
        """Refuse new calls, let calls in flight finish (up to `grace` seconds)."""
        self.health.enter_graceful_shutdown()
        self.grpc_server.stop(grace).wait()
        if self.commit is not None:
            self.commit.close()
        if self.rules is not None:
            self.rules.close()
        if self.captures is not None:
            self.captures.close()
        if self.keeper is not None:
            self.keeper.close()
        if self.local_folder is not None:
            shutil.rmtree(self.local_folder, ignore_errors=True)


def create_server(
    store: Store,
    listen: str,
    limits: Limits,
    workers: int = DEFAULT_WORKERS,
    *,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ack_target_ms: int = DEFAULT_TARGET_MS,
    security: ServerSecurity | None = None,
    commit: CommitPolicy | None = None,
    capture_rules: Sequence[Rule] = (),
) -> Server:
    """Build and start the server on `listen` (host:port; port 0 picks one). Writes may hold
    three in four of the `workers` threads; the others answer queries and refuse, at once,
    the writes beyond (ingest/admission.py)."""
    security = security or ServerSecurity()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
        interceptors=[TokenInterceptor(security.tokens)] if security.tokens is not None else None,
        options=[
            ("grpc.max_receive_message_length", TRANSPORT_MAX_BYTES),
            ("grpc.max_send_message_length", TRANSPORT_MAX_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    admission = Admission(max_pending_bytes, max(1, workers * 3 // 4), ack_target_ms)
    group_commit = GroupCommit(store, commit, answer_at_claim=admission.turning_away)
    captures = CaptureBoard(store)
    capture_service = CaptureService(store, captures, Pace(limits.capture_burst, limits.capture_per_minute))
    rules = None
    if capture_rules:

        def ask(run_id: str, steps: int, reason: str, requested_by: str) -> None:
            capture_service.ask(run_id, Asked(steps, 0.0, (), reason), requested_by)

        rules = RuleEngine(store, capture_rules, ask, capture_service.add_comparison)
        capture_service.on_imported = rules.imported
    keeper = Keeper(store)
    ingest_service = IngestService(store, group_commit, admission, captures, rules, keeper.described)
    add_service(server, INGEST, ingest_service, limits.max_batch_bytes)
    # a read sees every write this server answered, those answered once claimed included
    add_service(server, QUERY, QueryService(store), limits.max_string_bytes * 4, group_commit.settle_answered)
    add_service(server, CAPTURE, capture_service, limits.max_string_bytes * 4)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (INGEST.full_name, QUERY.full_name, CAPTURE.full_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    try:
        if security.tls is not None:
            port = server.add_secure_port(listen, security.tls.credentials())
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as error:
        group_commit.close()
        raise OSError(f"cannot listen on {listen}: {error}") from error
    local_folder = local_address = None
    if security.local_socket:
        local_folder = Path(tempfile.mkdtemp(prefix="tracehouse-"))  # mode 700: this user only
        local_address = f"unix:{local_folder / 'grpc.sock'}"
        try:
            server.add_insecure_port(local_address)
        except RuntimeError as error:
            shutil.rmtree(local_folder, ignore_errors=True)
            group_commit.close()
            raise OSError(f"cannot listen on {local_address}: {error}") from error
    server.start()
    captures.start()
    if rules is not None:
        rules.start()
    keeper.start()
    running = Server(server, port, health_servicer, local_address, local_folder, group_commit, captures, rules, keeper)
    running.set_serving(True)
    store.on_health(running.set_serving)
    return running


def listening_address(listen: str, port: int) -> str:
    """Where a server bound as `listen` answers: the host with the port it got (`listen` may
    ask for port 0), or the socket's path as given (gRPC says port 1 for any unix socket)."""
    if listen.startswith("unix"):
        return listen
    return f"{listen.rsplit(':', 1)[0]}:{port}"


def describe(security: ServerSecurity) -> str:
    tls = security.tls
    transport = "plain text" if tls is None else "TLS with client certificates" if tls.client_ca else "TLS"
    tokens = f"{len(security.tokens)} tokens" if security.tokens is not None else "no tokens"
    return f"{transport}, {tokens}"


def _watch_store(store: Store, stop: threading.Event) -> None:
    """Try a store that is not ready (unreachable) or has failed (its folder refuses writes) until
    it answers; the health check follows the store (Store.on_health), so no call has to come first."""
    delay = 1.0
    while not stop.wait(delay):
        if store.healthy:
            delay = 1.0
            continue
        try:
            store.ensure_ready()
        except StoreUnavailable as error:
            log.warning("%s; retrying in %.0f s", error, delay)
            delay = min(delay * 2, 30.0)
            continue
        log.info("store %s answers (schema v%d): serving", store.location.display, store.schema_version())


def _spare_the_collector() -> None:
    """What exists once the server is built lives as long as it: out of the collector's sight
    (gc.freeze). And collect less often: a write makes tens of thousands of short-lived objects,
    and with hundreds of threads each full pass over the heap cost a quarter of the server's CPU
    under `bench load --writers 600` (py-spy)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def serve(
    store_url: str,
    listen: str,
    limits: Limits,
    grace: float = 30.0,
    on_ready: Callable[[str], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    *,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ack_target_ms: int = DEFAULT_TARGET_MS,
    security: ServerSecurity | None = None,
    layout: Mapping[str, Any] | None = None,
    commit: CommitPolicy | None = None,
    capture_rules: Sequence[Rule] = (),
) -> int:
    """Run until SIGINT, SIGTERM or SIGHUP; then finish the calls in flight and close the store.

    An embedded store that cannot be opened is fatal; one whose folder refuses writes returns 2
    after one line that names the folder. A ClickHouse server that cannot be reached is not
    fatal, nor a folder that refuses writes later: the health check says NOT_SERVING and calls
    get UNAVAILABLE until the store answers.
    Listening beyond loopback without tokens is refused (SecurityError).
    """
    security = security or ServerSecurity()
    check_exposure(listen, security, is_loopback(listen))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # on_stop stops what on_ready started
        signal.signal(sig, lambda *_: stop.set())
    store = Store(parse_store_url(store_url), limits, **(layout or {}))
    try:
        ready = True
        try:
            store.ensure_ready()
        except StoreNotWritable as error:
            print(f"tracehouse: {error.for_operator()}", file=sys.stderr)
            return 2  # as for a usage error: the operator must fix something first
        except StoreUnavailable as error:
            if store.location.engine == "chdb":
                raise
            log.warning("%s: answering UNAVAILABLE until it is reachable", error)
            ready = False
        server = create_server(
            store, listen, limits, max_pending_bytes=max_pending_bytes, ack_target_ms=ack_target_ms,
            security=security, commit=commit, capture_rules=capture_rules,
        )  # fmt: skip
        server.set_serving(ready)
        _spare_the_collector()
        threading.Thread(target=_watch_store, args=(store, stop), daemon=True).start()
        where = listening_address(listen, server.port)
        log.info("tracehouse serve: listening on %s (%s), store %s", where, describe(security), store.location.display)
        if on_ready is not None:
            try:
                on_ready(server.local_address or where)
            except BaseException:
                if on_stop is not None:
                    on_stop()
                server.stop(0)
                raise
        wait_for_stop(stop)
        if on_stop is not None:
            on_stop()
        log.info("stopping: finishing calls in flight (up to %g s)", grace)
        server.stop(grace)
    finally:
        store.close()
    log.info("stopped")
    return 0
