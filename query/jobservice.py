"""The Query service's Job call: the request checked, the job view (query/jobview.py) as tables."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from query.jobview import job_view
from store.store import Store
from store.usersql import ipc_bytes
from tracehouse.jobs import JobError, check_job_id
from tracehouse.requesterrors import QueryError
from tracehouse.v1 import query_pb2


def job_response(store: Store, request: query_pb2.JobRequest, within: Callable[[int], None]) -> query_pb2.JobResponse:
    """The answer to `request`; `within` refuses an answer over max_answer_bytes."""
    try:
        check_job_id(request.job)
    except JobError as error:
        raise QueryError("job", str(error).removeprefix("job: ")) from None
    forget = store.execute if store.sole_writer else None
    answer = job_view(store.query, store.append, request.job, request.step_pattern, request.step_rows, forget)
    tables: dict[str, pa.Table | None] = {
        "ranks": answer.ranks, "stragglers": answer.stragglers, "telemetry": answer.telemetry,
        "collectives": answer.collectives, "steps": answer.steps,
    }  # fmt: skip
    encoded = {name: ipc_bytes(table) for name, table in tables.items() if table is not None}
    try:
        within(sum(len(data) for data in encoded.values()))
    except QueryError as error:
        if not request.step_rows:
            raise
        raise QueryError("step_rows", f"{error}; or fewer steps: a step_pattern (--steps REGEX)") from None
    return query_pb2.JobResponse(
        notes=answer.notes, generation=answer.generation,
        **{name: query_pb2.Table(arrow_ipc=data, rows=tables[name].num_rows)  # type: ignore[union-attr]
           for name, data in encoded.items()},
    )  # fmt: skip
