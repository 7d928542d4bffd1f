"""Child processes: those of every command (stopped with it), and the commands `tracehouse
run` starts, as a shell starts a job.

Every command that starts children stops them when it is told to stop (SIGTERM, SIGINT,
SIGHUP: `stop_on_signals`) and its children stop when it dies without a word (kill -9):
`with_parent` starts each through a few lines of Python that ask Linux for a signal when the
parent dies (PR_SET_PDEATHSIG, which the program it then executes keeps). "The parent" is
the thread that started the child: start children from a thread that lives as long as they
should (the main thread).

`tracehouse run` is the exception, as a shell is: the commands it runs are the user's work,
not its helpers. Told to stop, it passes the signal on to them (below); killed by -9 (or the
OOM killer), it leaves them running, as a killed shell script leaves its jobs, rather than
ending a training because its observer died. A scheduler that ends the job signals the whole
group or cgroup, and Ctrl-C reaches the commands' group from the terminal directly.

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
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
BLOCKED = (*FORWARDED, signal.SIGTTOU)  # SIGTTOU: taking the terminal back from the background
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what stops a command that has children

# Run in the child (python -I -S -c): argv is [-c, PARENT_PID, SIGNAL, PROGRAM, ARGS...].
_FOLLOW_PARENT = """
import ctypes, os, sys
parent, number, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, number, 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(128 + number)
try:
    os.execvp(argv[0], argv)
except OSError as error:
    print(f"tracehouse: cannot run {argv[0]}: {error.strerror}", file=sys.stderr)
    sys.exit(127 if isinstance(error, FileNotFoundError) else 126)
"""


def with_parent(argv: Sequence[str], number: int = signal.SIGTERM) -> list[str]:
    """`argv` so that, started by this process, it gets signal `number` when this process (the
    thread that starts it) dies, even by kill -9; as it is where Linux has no PR_SET_PDEATHSIG."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _FOLLOW_PARENT, str(os.getpid()), str(int(number)), *argv]


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by the first SIGTERM, SIGINT or SIGHUP under `stop_on_signals`:
    a KeyboardInterrupt, so that what Ctrl-C cleans up is cleaned up for each of them."""

    def __init__(self, number: int) -> None:
        super().__init__(signal.Signals(number).name)
        self.signal = number


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While in the `with` (from the main thread), SIGTERM, SIGINT and SIGHUP raise Stopped once;
    later ones are ignored, so that stopping the children is not cut short."""
    before = {number: signal.getsignal(number) for number in STOPS}

    def ignore(number: int, frame: FrameType | None) -> None:
        pass

    def stop(number: int, frame: FrameType | None) -> None:
        for each in STOPS:
            signal.signal(each, ignore)
        raise Stopped(number)

    for number in STOPS:
        signal.signal(number, stop)
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def stop_process(process: subprocess.Popen[bytes] | subprocess.Popen[str], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within `grace` seconds; reaped either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


class Signals:
    """Block the forwarded signals in every thread (threads started later inherit the mask)
    while in the `with`; `take(timeout)` is the next one, or None."""

    late: int | None = None  # one that came when there was no one left to pass it to

    def __enter__(self) -> Signals:
        self._before = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
        return self

    def take(self, timeout: float = 0.0) -> int | None:
        info = signal.sigtimedwait(FORWARDED, timeout)
        return None if info is None else int(info.si_signo)

    def __exit__(self, *exc: object) -> None:
        while (number := self.take()) is not None:  # none is delivered once unblocked
            self.late = number
        signal.pthread_sigmask(signal.SIG_SETMASK, self._before)


class Terminal:
    """The controlling terminal (/dev/tty, whatever stdin is), handed to a command's group only
    while this process's group is the terminal's foreground job, and taken back only from it."""

    def __init__(self) -> None:
        self.fd: int | None = None
        with contextlib.suppress(OSError):
            self.fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)

    def _owner(self) -> int | None:
        if self.fd is None:
            return None
        try:
            return os.tcgetpgrp(self.fd)
        except OSError:
            return None

    def ours(self) -> bool:
        """Whether this process is the terminal's foreground job (or has no terminal)."""
        return self.fd is None or self._owner() == os.getpgrp()

    def give(self, group: int) -> None:
        if self.fd is not None and self._owner() == os.getpgrp():
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, group)

    def take_back(self, group: int) -> None:
        if self.fd is not None and group and self._owner() == group:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, os.getpgrp())  # SIGTTOU is blocked: this succeeds from the background

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
    """The exit code (os.waitstatus_to_exitcode's) of a child that ended, else None.
    Job control, as a shell does it: a command stopped from the terminal (Ctrl-Z), or for
    using it while it is not the foreground job, stops this process too, so that the shell
    gets the terminal back; when the shell continues this process (`fg`, `bg`), the command
    is continued, with the terminal if this process has it. A command stopped by anything
    else (kill -STOP) stays stopped."""
    done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
    if not done:
        return None
    if not os.WIFSTOPPED(status):
        return os.waitstatus_to_exitcode(status)
    if os.WSTOPSIG(status) in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU) and terminal.fd is not None:
        if os.WSTOPSIG(status) == signal.SIGTSTP or not terminal.ours():
            terminal.take_back(group)
            os.kill(os.getpid(), signal.SIGSTOP)  # continued here by the shell's fg or bg
        terminal.give(group)
        signal_group(group, signal.SIGCONT)
    return None


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


def become_subreaper() -> bool:
    """Adopt the orphans of this process's descendants (Linux), so that a process whose parent
    exited, or that left with setsid, stays in reach: its exit is reaped here."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def adopted(started: set[int]) -> list[int]:
    """This process's children it did not start (orphans it adopted), the ended ones reaped."""
    import psutil

    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid in started:
                continue
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(child.pid, os.WNOHANG)[0]:
                    continue  # it had ended: reaped now
            found.append(child.pid)
    return found
