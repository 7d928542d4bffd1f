"""When the Ingest service stores the batches waiting as one group (ingest/groupcommit.py). Apart
from it, so that the CLI reads the defaults without loading the store (whose libraries start
threads at import, which `tracehouse run` must not have before it blocks the signals it forwards)."""

from __future__ import annotations

from dataclasses import dataclass

from tracehouse.model import INSERT_BLOCK_ROWS

DEFAULT_INTERVAL_S = 0.2
DEFAULT_MAX_ROWS = INSERT_BLOCK_ROWS  # a full group is one insert, one part
BULK_ROWS = 32_768  # a bulk writer's batch (a spool replayed, an upload): answered once claimed


@dataclass(frozen=True)
class CommitPolicy:
    """When a group is stored: `interval_s` after the one before, or once `max_rows` rows wait; and
    when a writer is answered at the latest, once its group is claimed: `answer_within_s` after (None:
    once stored), and at the claim for a batch of `bulk_rows` rows or more (None: none). A bulk writer
    answered at the claim sends its next batch while the groups before store, so groups grow with the
    load: `bench ingest` stored a value for 0.97-1.32 µs of CPU so, 1.45-1.74 µs answered once stored
    (groups of one batch each, their fixed costs unshared). A small batch stores quickly, and answered
    once stored, what one writer sent another reads at once through any server of the store."""

    interval_s: float = DEFAULT_INTERVAL_S
    max_rows: int = DEFAULT_MAX_ROWS
    answer_within_s: float | None = None
    bulk_rows: int | None = BULK_ROWS

    def __post_init__(self) -> None:
        if not 0 <= self.interval_s <= 60:
            raise ValueError(f"commit interval: {self.interval_s * 1000:g} ms is not within 0..60000 ms")
        if self.answer_within_s is not None and not 0 <= self.answer_within_s <= 600:
            raise ValueError(f"ack within: {self.answer_within_s * 1000:g} ms is not within 0..600000 ms")
        if self.bulk_rows is not None and self.bulk_rows <= 0:
            raise ValueError(f"bulk rows: {self.bulk_rows} is not above 0")
        if self.max_rows <= 0:
            raise ValueError(f"commit rows: {self.max_rows} is not above 0")
