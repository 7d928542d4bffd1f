"""The store's errors, and how the engine's error text is read: its code, and its message
without the engine's framing."""

from __future__ import annotations

import re

_CODE = re.compile(r"Code: (\d+)")


class StoreError(Exception):
    """Base of the store's errors."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or failed; retrying later is safe."""


class StoreBusy(StoreUnavailable):
    """Every place for tracehouse's own reads is taken (writes have places of their own): a read
    retried in about `retry_ms` finds one."""

    def __init__(self, message: str, retry_ms: int) -> None:
        super().__init__(message)
        self.retry_ms = retry_ms


class QueryTooLarge(StoreError):
    """One of tracehouse's own reads ran past its bound on time or memory; the store is fine."""


class StoreNotWritable(StoreUnavailable):
    """The embedded store's folder refuses writes. The message says so without the path (it
    goes to clients); `folder` and `cause` are for the operator."""

    def __init__(self, folder: str, cause: str) -> None:
        super().__init__(f"the store cannot write to its folder ({cause}); the server's log names it")
        self.folder = folder
        self.cause = cause

    def for_operator(self) -> str:
        return f"the store folder {self.folder} is not writable ({self.cause})"


class BatchConflict(StoreError):
    """The batch_id was stored before with other content."""


class BatchRefused(StoreError):
    """The engine refused a batch's rows for what they hold: sending it again cannot help."""


class SqlRejected(StoreError):
    """User SQL refused by the engine; `reason` is readonly, too_large or invalid."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def error_code(error: BaseException) -> int | None:
    match = _CODE.search(str(error))
    return int(match.group(1)) if match else None


def clean_error(error: BaseException) -> str:
    text = str(error).strip()
    start = text.find("DB::Exception:")
    if start >= 0:
        text = text[start + len("DB::Exception:") :].strip()
    text = re.sub(r"^[\w.-]+: (?=Cannot execute)", "", text)  # engine user name prefix
    return text.split("\n", 1)[0][:2000]
