"""The errors of a request that cannot be answered as asked, shared by the services that answer
requests (query's and ingest's Capture service): mapped at the edge (tracehouse/cli/serve.py) to
INVALID_ARGUMENT and NOT_FOUND."""

from __future__ import annotations


class QueryError(ValueError):
    """A request that cannot be answered as asked; `field` names the culprit."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class RunNotFound(LookupError):
    pass
