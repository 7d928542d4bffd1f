"""Where the store is: the store URL, parsed (`chdb://PATH` or
`http(s)://user:password@host:port/database`), and shown without its password."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client

_DATABASE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class StoreLocation:
    engine: str  # "chdb" or "http"
    dsn: str  # what clickhouse-connect is given
    database: str
    display: str  # the URL without its password, for logs and messages

    def client(self, settings: Mapping[str, Any] | None = None) -> Client:
        """A new clickhouse-connect client. It takes no scheme from a DSN (https:// would go
        out as plain HTTP, password and all, on any port but 443 and 8443): passed apart."""
        interface = urlsplit(self.dsn).scheme if self.engine == "http" else None
        return clickhouse_connect.get_client(dsn=self.dsn, interface=interface, settings=dict(settings or {}))


def parse_store_url(url: str, database: str = "tracehouse") -> StoreLocation:
    """`chdb://PATH` or `http(s)://user:password@host:port/database`; raises ValueError."""
    if url.startswith("chdb://"):
        path = url[len("chdb://") :]
        if not path:
            raise ValueError("store URL chdb:// needs a folder, e.g. chdb:///var/lib/tracehouse/store")
        folder = Path(path).expanduser().resolve()
        return StoreLocation("chdb", f"chdb://{folder}", database, f"chdb://{folder}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"store URL {_redact(url)!r}: use chdb://PATH or http(s)://user:password@host:port/database")
    name = unquote(parts.path.strip("/")) or database
    if not _DATABASE.fullmatch(name):
        raise ValueError(f"store URL {_redact(url)!r}: {name!r} is not a database name")
    # the store creates its database: a DSN's database goes with every request, and a
    # server refuses one that does not exist yet
    return StoreLocation("http", parts._replace(path="").geturl(), name, _redact(url))


def with_password(url: str, password: str) -> str:
    """The store URL with a password given apart from it (a file, the environment)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"store URL {_redact(url)!r}: a password goes with an http(s):// store")
    if parts.password is not None:
        raise ValueError(f"store URL {_redact(url)!r} has a password already: give it once")
    if not password:
        raise ValueError("the store password is empty")
    user_info, _, host = parts.netloc.rpartition("@")
    user = user_info or "default"  # as written: already %-escaped
    return parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}").geturl()


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = quote(parts.username or "")
    return parts._replace(netloc=f"{user}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")).geturl()
