"""A rank of a job beside its peers on one time axis. Pure: the job's ranks table (query/jobview.py: run,
host, offset_ns to the reference rank's clock, its uncertainty and the alignment used) in, which peers to
show, each peer's window on its own clock and the shift that puts its times on the rank's clock, out.

A rank's instant t reads t + offset_ns on the reference clock; a peer's instant u reads, on the rank's
clock, u + (peer offset - rank offset): its shift. The rank's window [a, b) is [a - shift, b - shift) on
the peer's clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tracehouse import units
from ui.view import ViewError

ALL_UP_TO = 8  # a job of this many ranks or fewer shows them all
NEAREST = 2  # otherwise the ranks nearest in step time, and the median rank
MAX_PEERS = 16  # drawn at once: a row of lanes each, and a query each
NO_PEERS = "none"


@dataclass(frozen=True)
class Member:
    """One rank of the job as the timeline draws it."""

    rank: int
    run: str
    host: str
    shift_ns: int  # added to its times to put them on the chosen rank's clock
    uncertainty_ns: int  # of that shift: the larger of the two ranks' alignments
    alignment: str

    def window(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """The chosen rank's window on this rank's own clock."""
        return start_ns - self.shift_ns, end_ns - self.shift_ns

    def clock(self) -> str:
        """How its clock was put on the chosen rank's, in words."""
        if self.shift_ns == 0 and self.uncertainty_ns == 0:
            return f"{self.alignment}: same clock"
        return (
            f"{self.alignment}: shifted {'+' if self.shift_ns >= 0 else ''}{units.duration(self.shift_ns)} "
            f"± {units.duration(self.uncertainty_ns)}"
        )


def members(ranks: pd.DataFrame, rank: int) -> tuple[dict[int, Member], list[int]]:
    """({rank: Member} of every rank that can be put on `rank`'s clock, `rank` itself among them; the ranks
    whose clock could not be aligned (uncertainty < 0), left out rather than guessed)."""
    rows = {int(row["rank"]): row for row in ranks.to_dict(orient="records")}
    own = rows[rank]
    placed: dict[int, Member] = {}
    unaligned = []
    for number, row in sorted(rows.items()):
        if int(row["uncertainty_ns"]) < 0 or not row["run_id"]:
            unaligned.append(number)
            continue
        same = row["host"] == own["host"]  # one clock: shifted by nothing, exactly
        placed[number] = Member(
            rank=number,
            run=str(row["run_id"]),
            host=str(row["host"]),
            shift_ns=0 if same else int(row["offset_ns"]) - int(own["offset_ns"]),
            uncertainty_ns=0 if same else max(int(row["uncertainty_ns"]), int(own["uncertainty_ns"])),
            alignment="this rank" if number == rank else f"same host as rank {rank}" if same else _method(row, own),
        )
    return placed, unaligned


def _method(peer: Mapping[Any, Any], own: Mapping[Any, Any]) -> str:
    """What put two ranks of different hosts on one clock: the alignment of the one not on the reference's."""
    return str(peer["alignment"] if peer["alignment"] not in ("reference", "same host") else own["alignment"])


def default_peers(rank: int, candidates: Sequence[int], step_ns: Mapping[int, int]) -> list[int]:
    """Every candidate when few; else the NEAREST ranks in step time at the step shown (by rank number
    where it has none) and the median rank, in rank order."""
    others = sorted(r for r in candidates if r != rank)
    if len(others) <= ALL_UP_TO - 1:
        return others
    mine = step_ns.get(rank)
    timed = [r for r in others if r in step_ns]
    if mine is None or not timed:
        return sorted(sorted(others, key=lambda r: (abs(r - rank), r))[:NEAREST])
    nearest = sorted(timed, key=lambda r: (abs(step_ns[r] - mine), abs(r - rank), r))[:NEAREST]
    everyone = sorted([*timed, rank], key=lambda r: (step_ns[r], r))
    median = everyone[(len(everyone) - 1) // 2]
    return sorted({*nearest, *([median] if median != rank else [])})


def step_ns(steps: pd.DataFrame, step: int) -> dict[int, int]:
    """Each rank's step time at `step`, from the job's step rows (rank, step, dur_ns)."""
    at = steps[steps["step"] == step]
    return dict(zip(at["rank"].astype(int), at["dur_ns"].astype(int), strict=True))


def parse_peers(text: str, candidates: Sequence[int]) -> list[int] | None:
    """The peers a URL names ("3,4,0"; "none"), None where it names none (the default then)."""
    if not text:
        return None
    if text == NO_PEERS:
        return []
    try:
        chosen = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ViewError(f"peers: {text[:80]!r} is not a list of ranks (e.g. 0,3,7, or {NO_PEERS})") from None
    unknown = sorted(set(chosen) - set(candidates))
    if unknown:
        raise ViewError(f"peers: rank(s) {', '.join(map(str, unknown[:10]))} are not ranks of this job with an "
                        "aligned clock")  # fmt: skip
    if len(set(chosen)) > MAX_PEERS:
        raise ViewError(f"peers: {len(set(chosen))} ranks, more than the {MAX_PEERS} drawn at once")
    return sorted(set(chosen))


def peers_text(peers: Sequence[int]) -> str:
    return ",".join(str(r) for r in sorted(set(peers))) or NO_PEERS


def shifted(frame: pd.DataFrame, member: Member, columns: Sequence[str]) -> pd.DataFrame:
    """A rank's lanes or events on the chosen rank's clock, with its rank."""
    moved = frame.assign(rank=member.rank)
    for column in columns:
        if pd.api.types.is_datetime64_any_dtype(moved[column].dtype):
            moved[column] = moved[column] + pd.Timedelta(member.shift_ns, unit="ns")
        else:
            moved[column] = moved[column].astype("int64") + member.shift_ns
    return moved
