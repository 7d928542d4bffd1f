"""The commands `tracehouse run` starts, as a shell starts a job.

The commands of a slot share a process group of their own, which gets the terminal while they
run: Ctrl-C, Ctrl-\\ and Ctrl-Z reach them and not tracehouse. Signals sent to tracehouse
itself (kill, a scheduler, a hangup) are blocked in every thread, taken one at a time in the
main thread and passed on to the group: each reaches the commands once. (A signal sent to
every process of a cgroup, as systemd and Slurm do, reaches them directly too.) When the
commands stop (Ctrl-Z), tracehouse takes the terminal back and stops as well, so that the
shell's `fg` continues both.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping, Sequence

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
BLOCKED = (*FORWARDED, signal.SIGTTOU)  # SIGTTOU: taking the terminal back from the background


class Signals:
    """Block the forwarded signals in every thread (threads started later inherit the mask)
    while in the `with`; `take(timeout)` is the next one, or None."""

    def __enter__(self) -> Signals:
        self._before = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
        return self

    def take(self, timeout: float = 0.0) -> int | None:
        info = signal.sigtimedwait(FORWARDED, timeout)
        return None if info is None else int(info.si_signo)

    def __exit__(self, *exc: object) -> None:
        while self.take() is not None:
            pass  # taken now, with no one left to pass them to, so that none is delivered once unblocked
        signal.pthread_sigmask(signal.SIG_SETMASK, self._before)


class Terminal:
    """The terminal on stdin, when this process's group has it (the foreground job)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        with contextlib.suppress(OSError):
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                self.fd = 0

    def give(self, group: int) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, group)

    def take_back(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, os.getpgrp())


def spawn(argv: Sequence[str], env: Mapping[str, str], group: int = 0, stdout_to_stderr: bool = False) -> int:
    """Start argv in process group `group` (0: a new one, led by it) with every signal
    unblocked and SIGPIPE back to its default, as a shell would. Raises OSError
    (FileNotFoundError: no such command)."""
    actions = [(os.POSIX_SPAWN_DUP2, 2, 1)] if stdout_to_stderr else []
    return os.posix_spawnp(
        argv[0], list(argv), dict(env), file_actions=actions, setpgroup=group, setsigmask=(),
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
    )  # fmt: skip


def signal_group(group: int, number: int) -> bool:
    """Send a signal to a process group; False when none of it is left."""
    try:
        os.killpg(group, number)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(pid: int, terminal: Terminal, group: int) -> int | None:
    """The exit code (os.waitstatus_to_exitcode's) of a child that ended, else None. A child
    stopped from the terminal (Ctrl-Z) stops this process too, until the shell continues it;
    one stopped for touching the terminal before it was its own gets it now."""
    done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
    if not done:
        return None
    if os.WIFSTOPPED(status):
        if os.WSTOPSIG(status) == signal.SIGTSTP and terminal.fd is not None:
            terminal.take_back()
            os.kill(os.getpid(), signal.SIGSTOP)  # the shell's `fg` continues us here
        terminal.give(group)
        signal_group(group, signal.SIGCONT)
        return None
    return os.waitstatus_to_exitcode(status)


def status_of(code: int) -> tuple[str, int]:
    """(status, exit status) from os.waitstatus_to_exitcode's answer: 128+N for signal N."""
    if code == 0:
        return "ok", 0
    if code > 0:
        return f"failed: exit {code}", code
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed: {name}", 128 - code


def signal_each(pids: Sequence[int], number: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, number)
