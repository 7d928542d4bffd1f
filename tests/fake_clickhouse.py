"""A ClickHouse server for tests: the real engine (chDB) behind a small HTTP front door.

No ClickHouse server can be installed on the machines this project runs on, so the
`http(s)://` store is tested against this. Only the door is fake: every statement,
setting, query parameter and error comes from a real ClickHouse engine (chDB, in a
process of its own, since a process hosts one engine). The door speaks as much of the
HTTP interface as clickhouse-connect's HttpClient uses:

- the query in the `query` URL parameter, the POST body, or both (query, newline, body);
  `INSERT ... FORMAT X` with its data after it, in the body; GET and POST;
- `database`, `default_format`, `param_NAME` (bound {name:Type} parameters) and any other
  URL parameter as a setting of that one query (`readonly` applied last);
- request bodies sent chunked or with a length, plain or lz4/zstd/gzip/deflate encoded;
- one user: Basic auth, X-ClickHouse-User/Key headers or user/password parameters,
  else 516 AUTHENTICATION_FAILED with HTTP 403;
- errors as ClickHouse sends them: "Code: N. DB::Exception: ..." with the
  X-ClickHouse-Exception-Code header; `/ping`; optional TLS.

Not served: response compression (a server may always answer uncompressed), sessions
(each request runs in a fresh engine session, so `session_id` keeps no state between
requests), progress headers, multipart form queries, external tables, the native TCP port.

Run: `python -m tests.fake_clickhouse FOLDER [--cert PEM --key PEM]`, with the password
in FAKE_CLICKHOUSE_PASSWORD; it prints `listening on PORT`. Tests use `running()`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

USER = "tracehouse"
_LISTENING = re.compile(r"listening on (\d+)")
_CODE = re.compile(r"Code: (\d+)\.")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `INSERT INTO t [(cols)] FORMAT F` followed by its data: no quote before FORMAT, so that
# the word inside a string of an `INSERT ... VALUES` is never taken for the clause
_INSERT_FORMAT = re.compile(rb"\s*(INSERT\s+INTO\s(?:(?!VALUES\b)[^'\"])*?)\bFORMAT\s+(\w+)[ \t]*(?:\r?\n)?", re.I)
_TRANSPORT = {
    "query", "database", "default_format", "session_id", "session_timeout", "session_check", "query_id",
    "compress", "decompress", "buffer_size", "wait_end_of_query", "client_protocol_version", "quota_key",
    "user", "password", "role",
}  # fmt: skip
_HTTP_STATUS = {516: 403, 62: 400, 60: 404, 81: 404}  # as ClickHouse answers these codes


class QueryError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"Code: {code}. DB::Exception: {message}")
        self.code = code


def _decoders() -> dict[str, Callable[[bytes], bytes]]:
    decoders: dict[str, Callable[[bytes], bytes]] = {
        "gzip": lambda data: zlib.decompress(data, 16 + zlib.MAX_WBITS),
        "deflate": zlib.decompress,
    }
    with contextlib.suppress(ImportError):
        import lz4.frame

        decoders["lz4"] = lz4.frame.decompress
    with contextlib.suppress(ImportError):
        from backports import zstd

        decoders["zstd"] = zstd.decompress
    return decoders


class Engine:
    """Runs one HTTP request's SQL in a fresh session of the one chDB engine."""

    def __init__(self, folder: Path) -> None:
        from chdb.state.sqlitelike import connect

        self._connect = connect
        self._url = f"file:{folder}"
        self._keep = connect(self._url)  # the engine lives while a connection is open
        self.version = self._keep.query("SELECT version()", "TSV").bytes().decode().strip()

    def run(self, sql: bytes, params: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        binds = {name[6:]: value for name, value in params.items() if name.startswith("param_")}
        settings = {k: v for k, v in params.items() if k not in _TRANSPORT and not k.startswith("param_")}
        session = self._connect(self._url)
        try:
            if params.get("database"):
                session.query(f"USE `{_name(params['database'])}`", "TSV")
            for name in sorted(settings, key=lambda name: name == "readonly"):  # readonly last
                session.query(f"SET {_name(name)} = {_quote(settings[name])}", "TSV")
            insert = _INSERT_FORMAT.match(sql)
            if insert:
                with session.send_insert(insert.group(1).decode(), insert.group(2).decode()) as stream:
                    if len(sql) > insert.end():
                        stream.append(sql[insert.end() :])
                    written = stream.finish()
                return b"", {"written_rows": str(written.rows_written), "written_bytes": str(written.bytes_written)}
            result = session.query(sql.decode(), params.get("default_format", "TabSeparated"), params=binds)
            summary = {"read_rows": str(result.rows_read()), "read_bytes": str(result.bytes_read())}
            return result.bytes(), {**summary, "written_rows": str(result.rows_written())}
        except RuntimeError as error:  # chDB's errors and its inserts' errors
            text = str(error)
            text = text[text.find("Code: ") :] if "Code: " in text else f"Code: 1000. DB::Exception: {text}"
            code = _CODE.search(text)
            raise QueryError(int(code.group(1)) if code else 1000, text.split("DB::Exception: ", 1)[-1]) from error
        finally:
            session.close()

    def close(self) -> None:
        self._keep.close()


def _name(text: str) -> str:
    if not _NAME.fullmatch(text):
        raise QueryError(115, f"Unknown setting or bad name '{text}'. (UNKNOWN_SETTING)")
    return text


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clickhouse-connect's pool expects
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _body(self) -> bytes:
        if self.command != "POST":
            return b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            body = b"".join(chunks)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = (self.headers.get("Content-Encoding") or "identity").lower()
        if encoding != "identity":
            if encoding not in self.server.decoders:
                raise QueryError(1000, f"Unknown HTTP Content-Encoding '{encoding}'. (UNKNOWN_COMPRESSION_METHOD)")
            body = self.server.decoders[encoding](body)
        return body

    def _serve(self) -> None:
        url = urlsplit(self.path)
        if url.path.rstrip("/") == "/ping":
            self._answer(200, b"Ok.\n", {})
            return
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        if self.command == "GET":
            params.setdefault("readonly", "2")  # as a server runs GET requests
        try:
            body = self._body()
            self._authenticate(params)
            query = params.get("query", "").encode()
            data, summary = self.server.engine.run(query + b"\n" + body if query else body, params)
        except QueryError as error:
            text = f"{error} (version {self.server.engine.version})\n".encode()
            headers = {"X-ClickHouse-Exception-Code": str(error.code)}
            self._answer(_HTTP_STATUS.get(error.code, 500), text, headers)
            return
        headers = {"X-ClickHouse-Summary": json.dumps(summary), "X-ClickHouse-Query-Id": params.get("query_id", "")}
        if data:
            headers["X-ClickHouse-Format"] = params.get("default_format", "TabSeparated")
        self._answer(200, data, headers)

    def _authenticate(self, params: dict[str, str]) -> None:
        user = self.headers.get("X-ClickHouse-User") or params.get("user") or "default"
        password = self.headers.get("X-ClickHouse-Key") or params.get("password") or ""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        if (user, password) != (USER, self.server.password):
            raise QueryError(
                516,
                f"{user}: Authentication failed: password is incorrect, or there is no user with such name. "
                "(AUTHENTICATION_FAILED)",
            )

    def _answer(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: Engine, password: str, context: ssl.SSLContext | None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.engine = engine
        self.password = password
        self.decoders = _decoders()
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)


@contextlib.contextmanager
def running(folder: Path, password: str, cert: Path | None = None, key: Path | None = None) -> Iterator[int]:
    """Start the fake in a subprocess on a free loopback port; yield the port."""
    tls = ["--cert", str(cert), "--key", str(key)] if cert and key else []
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_clickhouse", str(folder), *tls],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_CLICKHOUSE_PASSWORD": password, "PYTHONUNBUFFERED": "1"},
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        started = _LISTENING.search(line)
        assert started, f"fake ClickHouse did not start: {line!r} (exit {process.poll()})"
        yield int(started.group(1))
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--cert", type=Path)
    parser.add_argument("--key", type=Path)
    args = parser.parse_args()
    context = None
    if args.cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.cert, args.key)
    args.folder.mkdir(parents=True, exist_ok=True)
    engine = Engine(args.folder.resolve())
    server = Server(engine, os.environ.get("FAKE_CLICKHOUSE_PASSWORD", ""), context)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        engine.close()


if __name__ == "__main__":
    main()
