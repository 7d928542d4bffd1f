"""What the commands share: exit statuses, argument types, the --server and client-security options, and
how hints name this command so that they work when pasted."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracehouse import config
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.timefmt import parse_time

if TYPE_CHECKING:
    from tracehouse.channel import ClientSecurity

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2
_LATER = ("UNAVAILABLE", "DEADLINE_EXCEEDED")  # the server away or slow: the same call may work later


def failed_call_exit(code_name: str) -> int:
    """The exit status of a command whose call the server refused or never answered, by its gRPC code."""
    return EXIT_UNAVAILABLE if code_name in _LATER else EXIT_USAGE


TIME_OPTIONS = ("--from", "--to")
_RELATIVE_TIME = re.compile(r"-\d")  # -5m: a time before now, not an option


def command_name(argv0: str | None = None, cwd: str | None = None) -> str:
    """This command as the user can run it, for hints: `tracehouse` where that name on PATH is this
    very program; else the path they ran (relative to `cwd` when inside it), or `python -m tracehouse.cli`."""
    used = argv0 if argv0 is not None else sys.argv[0]
    here = cwd or os.getcwd()
    on_path = shutil.which("tracehouse")
    if Path(used).name != "tracehouse":  # python -m tracehouse.cli, or a test runner: this interpreter's install
        if on_path and Path(on_path).absolute().parent == Path(sys.executable).absolute().parent:
            return "tracehouse"
        return f"{shlex.quote(sys.executable)} -m tracehouse.cli"
    if on_path and _same_file(on_path, os.path.join(here, used)):
        return "tracehouse"
    shown = os.path.normpath(used)
    if os.path.isabs(shown) and Path(shown).is_relative_to(here):
        shown = os.path.relpath(shown, here)
    return shlex.quote(shown if "/" in shown else f"./{shown}")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def with_time_values(argv: Sequence[str]) -> list[str]:
    """`--from -5m` as `--from=-5m`, so that argparse takes a time before now for the option's value and
    not for an option; nothing after `--` or in `tracehouse run` (whose arguments are the user's command)."""
    out = list(argv)
    if next((arg for arg in out if not arg.startswith("-")), "") == "run":
        return out
    end = out.index("--") if "--" in out else len(out)
    for i in range(end - 2, -1, -1):
        if out[i] in TIME_OPTIONS and _RELATIVE_TIME.match(out[i + 1]):
            out[i : i + 2] = [f"{out[i]}={out[i + 1]}"]
    return out


def _time(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def _tick(text: str) -> float:
    value = _seconds(text)
    if value < 0.001:
        raise argparse.ArgumentTypeError(
            f"{text} s: readings are stamped to the millisecond; sample at most every 0.001 s"
        )
    return value


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    number = text[:-1] if unit else text
    if unit not in _SIZE_UNITS or not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or a number with K, M, G or T)")
    return int(number) * _SIZE_UNITS[unit]


def _size_text(size: int) -> str:
    """`size` as `_size` reads it, in the largest unit that divides it: 268435456 is 256M."""
    unit = next((unit for unit in ("T", "G", "M", "K") if size % _SIZE_UNITS[unit] == 0), "")
    return f"{size // _SIZE_UNITS[unit]}{unit}"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


def _milliseconds(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of milliseconds") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} ms is not within {low}..{high}")
        return value

    return parse


_commit_interval_ms = _milliseconds(0, 60_000)
_ack_target_ms = _milliseconds(10, 600_000)
_ack_within_ms = _milliseconds(0, 600_000)


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1..65535)")
    return value


def _gpu(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU index") from None
    if not -1 <= value <= DEFAULT_LIMITS.max_gpu_index:
        raise argparse.ArgumentTypeError(f"{value} is not a GPU index (-1 or 0..{DEFAULT_LIMITS.max_gpu_index})")
    return value


def _tag(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _duration(text: str) -> int:
    from tracehouse.timefmt import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_run_and_times(group: Any) -> None:
    """A window's --run, --from and --to."""
    group.add_argument(
        "--run", default="", help="a run id, or a run's name where one run has it: its events and its host's "
        "telemetry during it"
    )  # fmt: skip
    group.add_argument("--from", dest="start", type=_time, help="ISO-8601, ns since the epoch, now-15m or -15m")
    group.add_argument("--to", dest="end", type=_time, help="exclusive; same forms as --from")


def _add_server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        help=f"address of tracehouse serve (default ${config.ENV_SERVER} or {config.DEFAULT_SERVER})",
    )


def _add_paths(group: Any, options: tuple[tuple[str, str, str], ...]) -> None:
    for flag, metavar, text in options:
        group.add_argument(flag, type=Path, default=None, metavar=metavar, help=text)


def _add_client_security(parser: argparse.ArgumentParser) -> None:
    _add_paths(
        parser.add_argument_group("security (TLS is on with --tls-ca)"),
        (
            ("--token-file", "FILE", f"file holding a bearer token for the server (default ${config.ENV_TOKEN_FILE})"),
            ("--tls-ca", "PEM", f"use TLS, trusting server certificates this CA signed (default ${config.ENV_TLS_CA})"),
            (
                "--tls-cert",
                "PEM",
                f"this client's certificate, for a server that wants one (default ${config.ENV_TLS_CERT})",
            ),
            ("--tls-key", "PEM", f"the private key of --tls-cert (default ${config.ENV_TLS_KEY})"),
        ),
    )


def _client_security(args: argparse.Namespace) -> ClientSecurity:
    """--token-file, --tls-ca, --tls-cert, --tls-key, else their TRACEHOUSE_* variables;
    a file that cannot be used ends the command (status 2) naming the option."""
    from tracehouse.channel import client_security
    from tracehouse.security import SecurityError

    try:
        return client_security(args.token_file, args.tls_ca, args.tls_cert, args.tls_key)
    except SecurityError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
