"""Where tracehouse keeps its files and what it talks to by default.

Precedence everywhere: command-line option, then environment variable, then default.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "TRACEHOUSE_HOME"  # folder for the embedded store and the agent's spool
ENV_RUNTIME_DIR = "TRACEHOUSE_RUNTIME_DIR"  # where the host's agent says it runs (default /run/tracehouse)
ENV_SERVER = "TRACEHOUSE_SERVER"  # address of `tracehouse serve` for clients
ENV_COMMAND = "TRACEHOUSE_COMMAND"  # how the user runs `tracehouse`, for the UI's hints (`up` and `ui` set it)
ENV_STORE = "TRACEHOUSE_STORE"  # store URL for `tracehouse serve`
ENV_STORE_PASSWORD = "TRACEHOUSE_STORE_PASSWORD"  # the ClickHouse password, kept out of the URL
# clients' credentials (tracehouse.channel.client_security): files, like their options
ENV_TOKEN_FILE = "TRACEHOUSE_TOKEN_FILE"  # a bearer token (--token-file)
ENV_TLS_CA = "TRACEHOUSE_TLS_CA"  # PEM CA that the server's certificate chains to; turns TLS on (--tls-ca)
ENV_TLS_CERT = "TRACEHOUSE_TLS_CERT"  # PEM client certificate for mTLS (--tls-cert)
ENV_TLS_KEY = "TRACEHOUSE_TLS_KEY"  # its PEM private key (--tls-key)

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_HOME = Path("~/.local/share/tracehouse")


def home() -> Path:
    return Path(os.environ.get(ENV_HOME) or DEFAULT_HOME).expanduser()


def default_store_url() -> str:
    return os.environ.get(ENV_STORE) or f"chdb://{home() / 'store'}"


def default_spool() -> Path:
    return home() / "spool"


def default_server() -> str:
    return os.environ.get(ENV_SERVER) or DEFAULT_SERVER
