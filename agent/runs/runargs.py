"""`tracehouse run`'s arguments: its Settings, and what is checked before anything starts (--env names,
tags, text, GPU lists, `nsys` on PATH), with LaunchError for what is refused; the RunSpec of a single
command; and the hiding of secrets in the command lines recorded with the runs.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.runs.matrix_model import RunSpec
from tracehouse.model import DEFAULT_LIMITS

if TYPE_CHECKING:
    from tracehouse.channel import ClientSecurity

MAX_TAGS = 200  # of a run's tags (the store takes 256 map entries; the matrix adds its own)
MAX_ENV = 64  # --env names
# words that make a name (an option, a variable) one of a secret: `--hf-token`, `WANDB_API_KEY`
SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "pass", "pw", "pwd", "passphrase", "credential", "credentials",
     "key", "apikey", "auth", "bearer", "cookie", "session"}
)  # fmt: skip
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL_CREDENTIALS = re.compile(r"(://[^/:@\s]+:)[^@/\s]+@")
_AUTHORIZATION = re.compile(r"((?:proxy-)?authorization\s*:\s*)\S.*", re.IGNORECASE)
HIDDEN = "***"


class LaunchError(Exception):
    """Nothing was started: the message says why; `status` is the exit status to give."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Settings:
    server: str
    host: str
    spool_root: Path
    nsys_dir: Path
    security: ClientSecurity | None = None
    server_given: bool = False  # --server: the command's own tracehouse.run() is sent there too
    agent: str = "auto"  # auto: the host's agent if one runs, else one of our own; start; none
    simulate: int | None = None
    interval: float = 0.1
    record_env: tuple[str, ...] = ()
    poll_interval: float = 0.5  # how often the process trees are walked
    end_timeout: float = 5.0  # time to ship what is pending at the end while the server answers
    kill_after: float = 10.0  # after a SIGTERM (a timeout, processes left at the end), SIGKILL


def check_env_names(names: Sequence[str]) -> tuple[str, ...]:
    """Names for --env: valid, few, and none that looks like it holds a secret."""
    if len(names) > MAX_ENV:
        raise LaunchError(f"--env: at most {MAX_ENV} names")
    for name in names:
        if not _ENV_NAME.fullmatch(name) or len(name) > 200:
            raise LaunchError(f"--env {name[:64]!r}: not an environment variable name (letters, digits, _; ≤ 200)")
        if _secret_name(name):
            raise LaunchError(f"--env {name}: looks like it holds a secret; tracehouse does not record those")
    return tuple(names)


def check_tags(tags: Mapping[str, str], where: str) -> dict[str, str]:
    """Tags within what the store takes: keys of 1..256 bytes, values up to 64 KiB, at most MAX_TAGS."""
    limits = DEFAULT_LIMITS
    if len(tags) > MAX_TAGS:
        raise LaunchError(f"{where}: {len(tags)} tags; at most {MAX_TAGS}")
    for key, value in tags.items():
        check_text(key, where)
        check_text(value, where)
        if not 0 < len(key.encode()) <= limits.max_name_bytes:
            raise LaunchError(f"{where} {key[:64]!r}: a tag's key is 1..{limits.max_name_bytes} bytes")
        if len(value.encode()) > limits.max_string_bytes:
            raise LaunchError(f"{where} {key[:64]!r}: a tag's value is at most {limits.max_string_bytes} bytes")
    return dict(tags)


def nsys_path() -> str:
    found = shutil.which("nsys")
    if found is None:
        raise LaunchError(
            "--nsys: no `nsys` on PATH; install Nsight Systems (https://developer.nvidia.com/nsight-systems) "
            "or add the folder holding `nsys` to PATH"
        )
    return found


def gpu_list(text: str) -> tuple[int, ...]:
    """`0,1` → (0, 1); refuses anything else, naming the option."""
    gpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) > DEFAULT_LIMITS.max_gpu_index:
            raise LaunchError(f"--gpus {text!r}: {part!r} is not a GPU index (0..4095), e.g. --gpus 0,1")
        if int(part) not in gpus:
            gpus.append(int(part))
    return tuple(gpus)


def _shown(text: str) -> str:
    """Text from the command line as UTF-8 can show it: bytes that are not, replaced."""
    return os.fsencode(text).decode("utf-8", "replace")


def _secret_name(name: str) -> bool:
    return any(word in SECRET_WORDS for word in re.split(r"[^a-z0-9]+", name.lower()))


def redacted(argv: Sequence[str]) -> list[str]:
    """A command line to record: the values of options and variables named like secrets
    (`--hf-token X`, `--api-key=X`, `WANDB_API_KEY=X`), passwords in URLs and Authorization
    headers hidden; arguments that are not UTF-8 shown with replacement characters."""
    shown: list[str] = []
    hide_next = False
    for raw in argv:
        arg = _shown(raw)
        name, equals, _ = arg.partition("=")
        if hide_next and not arg.startswith("-"):
            shown.append(HIDDEN)
        elif (name.startswith("-") or _ENV_NAME.fullmatch(name)) and _secret_name(name):
            shown.append(f"{name}={HIDDEN}" if equals else arg)
        else:
            shown.append(_AUTHORIZATION.sub(rf"\g<1>{HIDDEN}", _URL_CREDENTIALS.sub(rf"\g<1>{HIDDEN}@", arg)))
        hide_next = arg.startswith("-") and not equals and _secret_name(name)
    return shown


def check_text(text: str, where: str) -> str:
    """Text from the command line that the store takes: UTF-8 (an argument that is not, is
    refused here rather than after the command started)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise LaunchError(f"{where} {os.fsencode(text)[:64]!r}: not UTF-8") from None
    return text


def single_spec(command: Sequence[str], name: str, tags: Mapping[str, str], gpus: tuple[int, ...] | None,
                nsys: bool, nsys_args: Sequence[str]) -> RunSpec:  # fmt: skip
    """The RunSpec of `tracehouse run -- COMMAND`."""
    return RunSpec(
        name=name or _shown(os.path.basename(command[0])) or "run",
        command=tuple(command), experiment="", params={},
        repetition=1, tags=dict(tags), env={}, gpus=gpus, nsys=nsys, nsys_args=tuple(nsys_args), timeout=None, line=0,
    )  # fmt: skip
