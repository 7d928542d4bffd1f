"""The UI's answers from the Query service, cached briefly, and how a failure shows: what
went wrong and what to do, never a traceback."""

from __future__ import annotations

import os
import re
from typing import Any

import grpc
import streamlit as st

from query.client import Client, QueryFailed
from query.export import window_trace
from query.stepwindow import StepWindow, profiler_step_window
from tracehouse.channel import client_security
from tracehouse.config import ENV_COMMAND, default_server
from tracehouse.security import SecurityError

ANSWER_TTL_S = 10
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
REFUSED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.RESOURCE_EXHAUSTED)  # fmt: skip


MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$])")


def plain(text: str, limit: int = 500) -> str:
    """Text from outside (names, messages) shown as itself in Streamlit's markdown."""
    return MARKDOWN_SPECIALS.sub(r"\\\1", text[:limit])


def command() -> str:
    """The tracehouse command as the user can run it here, for hints to paste."""
    return os.environ.get(ENV_COMMAND, "").strip() or "tracehouse"


@st.cache_resource(show_spinner=False)
def _client(address: str) -> Client:
    # token and TLS from the TRACEHOUSE_* variables that `tracehouse ui` and `up` set
    return Client(address, timeout=120, security=client_security())


@st.cache_data(ttl=ANSWER_TTL_S, show_spinner=False, max_entries=256)
def _answer(address: str, method: str, args: tuple[Any, ...], options: tuple[tuple[str, Any], ...]) -> Any:
    return getattr(_client(address), method)(*args, **dict(options))


def ask(method: str, *args: Any, **options: Any) -> Any:
    """A Client method's answer; on failure the page shows why and stops."""
    answer, why = attempt(method, *args, **options)
    if why:
        st.error(why)
        st.stop()
    return answer


def act(method: str, *args: Any, **options: Any) -> tuple[Any, str]:
    """attempt() for a call that changes something (a capture request): never cached."""
    try:
        return getattr(_client(default_server()), method)(*args, **options), ""
    except (SecurityError, QueryFailed) as error:
        return None, _why(error)


def attempt(method: str, *args: Any, **options: Any) -> tuple[Any, str]:
    """A Client method's answer and "", or None and why not (in markdown), for a part of a page
    that the rest can do without. The Client's methods by name ("runs", "compare", "diff",
    "verdict", ...); the answers cached for ANSWER_TTL_S."""
    try:
        return _answer(default_server(), method, args, tuple(sorted(options.items()))), ""
    except (SecurityError, QueryFailed) as error:
        return None, _why(error)


def _why(error: Exception) -> str:
    address = default_server()
    if isinstance(error, SecurityError):
        return f"The UI's credentials cannot be used: {plain(str(error), 2000)}"
    assert isinstance(error, QueryFailed)
    if error.code in UNREACHABLE:
        run = command()
        return (
            f"Cannot reach the tracehouse server at {plain(address)}: {plain(error.message, 2000)}\n\n"
            f"Start everything with `{run} up`, or the server alone with `{run} serve`; "
            f"to use another server, run `{run} ui --server HOST:PORT`."
        )
    if error.code in REFUSED:
        return f"Refused: {plain(error.message, 2000)}"
    return f"The server could not answer: {plain(error.message, 2000)}"


def stop_if_empty() -> None:
    """A store with nothing in it: say how to get data in."""
    if ask("runs", limit=1).empty and ask("devices").empty:
        run = command()
        st.info(
            "The store is empty. To get data in:\n"
            f"- `{run} agent` samples this host's GPUs (`{run} agent --simulate 2` without a GPU);\n"
            f"- `{run} import report.sqlite` imports an Nsight Systems export "
            "(`nsys export --type sqlite report.nsys-rep`);\n"
            f"- `{run} up --demo` runs everything with a generated demo run."
        )
        st.stop()


def trace_file(window: dict[str, Any], fmt: str) -> bytes:
    """The window as a trace file (Perfetto's protobuf, or Chrome JSON), fetched when asked."""
    return window_trace(_client(default_server()), fmt=fmt, **window)


@st.cache_data(ttl=ANSWER_TTL_S, show_spinner=False, max_entries=64)
def _steps(address: str, run: str) -> StepWindow | None:
    return profiler_step_window(_client(address), run)


def step_window(run: str) -> StepWindow | None:
    """The run's profiler-step window (the GPU side of its ProfilerStep#N), None where it has none or
    it cannot be asked (the page then offers only the run's window)."""
    try:
        return _steps(default_server(), run)
    except (SecurityError, QueryFailed):
        return None
