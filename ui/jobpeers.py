"""The Timeline page opened on a rank of a job (the Job page's heat map does so): the peers to draw below
it, chosen in the page and kept in the URL, and every shown rank's lanes or events on the rank's clock
(ui/peers.py), one query per rank and window."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import streamlit as st

from ui.controls import Scope, show, stamp
from ui.data import ask, attempt, plain
from ui.peers import MAX_PEERS, Member, default_peers, members, parse_peers, peers_text, shifted, step_ns
from ui.view import ViewError


@dataclass(frozen=True)
class Ranks:
    """The rank shown, then its peers, each with its window on its own clock."""

    job: str
    shown: list[Member]  # the rank first

    @property
    def order(self) -> list[int]:
        return [member.rank for member in self.shown]

    def windows(self, scope: Scope) -> list[tuple[Member, dict[str, Any]]]:
        """Window keywords for the Query client, per rank."""
        out = []
        for member in self.shown:
            start, end = member.window(scope.start_ns, scope.end_ns)
            out.append((member, {"run": member.run, "host": scope.view.host or None, "start": start, "end": end}))
        return out


def step_times(job: str, step: str) -> dict[int, int]:
    """Each rank's step time at `step` ({} where the step is not a number or cannot be asked)."""
    if not step.isdigit():
        return {}
    answer, why = attempt("job", job, steps=f"^{step}$", step_rows=True)
    if why or answer.steps is None:
        return {}
    return step_ns(answer.steps, int(step))


def job_ranks(scope: Scope) -> Ranks | None:
    """The view's rank and the peers chosen (a multiselect that writes them into the URL); None where the
    view names no job, or its run is no rank of it (said)."""
    view = scope.view
    if not view.job:
        return None
    answer, why = attempt("job", view.job)
    if why:
        st.warning(f"Job {plain(view.job)}: {why}")
        return None
    table = answer.ranks
    found = table[table["run_id"] == view.run]
    if found.empty:
        st.warning(f"Run {plain(view.run)} is no rank of job {plain(view.job)}: its peers are not drawn.")
        return None
    rank = int(found["rank"].iloc[0])
    placed, unaligned = members(table, rank)
    if rank not in placed:
        st.warning(f"Rank {rank}'s clock could not be aligned with the job's: its peers are not drawn beside it.")
        return None
    candidates = [r for r in placed if r != rank]
    try:
        chosen = parse_peers(view.peers, candidates)
    except ViewError as error:
        st.error(f"The peers in the URL do not parse: {plain(str(error))}")
        chosen = None
    if chosen is None:
        chosen = default_peers(rank, candidates, step_times(view.job, view.step))
    picked = st.multiselect(
        f"Peers of rank {rank} (job {plain(view.job)})",
        candidates,
        default=chosen,
        max_selections=MAX_PEERS,
        format_func=lambda r: f"rank {r} · {placed[r].host}",
        key=f"peers-{stamp(view)}",
        help="Other ranks of the job, drawn below this one on its clock (the job's alignment)",
    )
    if sorted(picked) != chosen:
        show(replace(view, peers=peers_text(picked)))
    if unaligned:
        st.caption(f"Left out, their clocks not aligned with the job's: rank(s) {', '.join(map(str, unaligned))}.")
    return Ranks(view.job, [placed[rank], *(placed[r] for r in chosen)])


def clocks(ranks: Ranks, events: pd.Series) -> pd.DataFrame:
    """A row per shown rank: its host, run, how its clock was put on the rank's, and its events in the
    window."""
    return pd.DataFrame(
        {
            "rank": [m.rank for m in ranks.shown],
            "host": [m.host for m in ranks.shown],
            "run": [m.run for m in ranks.shown],
            "clock": [m.clock() for m in ranks.shown],
            "events in window": [int(events.get(m.rank, 0)) for m in ranks.shown],
        }
    )


def lanes_of(ranks: Ranks, scope: Scope, kinds: list[str], buckets: int) -> pd.DataFrame:
    """Every shown rank's lanes of its own window, on the rank's clock; attrs: the rank's grid, and the
    events of all of them (per rank in attrs["per_rank"])."""
    frames = []
    per_rank = {}
    attrs: dict[str, Any] = {}
    for member, window in ranks.windows(scope):
        lanes = ask("lanes", kinds=kinds, buckets=buckets, **window)
        per_rank[member.rank] = int(lanes.attrs["events"])
        if not attrs:
            attrs = dict(lanes.attrs)
        frames.append(shifted_frame(lanes, member, ["bucket_start_ns"]))
    combined = _stacked(frames)
    combined.attrs.update(attrs, events=sum(per_rank.values()), per_rank=per_rank)
    return combined


def events_of(ranks: Ranks, scope: Scope, kinds: list[str], limit: int) -> pd.DataFrame:
    """Every shown rank's events of its own window, on the rank's clock."""
    frames = [
        shifted_frame(ask("events", kinds=kinds, limit=limit, **window), member, ["start", "end"])
        for member, window in ranks.windows(scope)
    ]
    return _stacked(frames)


def _stacked(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The ranks' frames one under another; the first, empty, where every one is."""
    return pd.concat([f for f in frames if not f.empty] or frames[:1], ignore_index=True)


def shifted_frame(frame: pd.DataFrame, member: Member, columns: list[str]) -> pd.DataFrame:
    return shifted(frame, member, columns) if not frame.empty else frame.assign(rank=pd.Series(dtype="int64"))


def caption(ranks: Ranks, step: str) -> None:
    at = f" at step {plain(step)}" if step else ""
    peers = ", ".join(str(r) for r in ranks.order[1:]) or "none chosen"
    st.caption(
        f"Rank {ranks.order[0]}{at} on top, its peers below (ranks {peers}), on rank {ranks.order[0]}'s clock: "
        "each peer's window is shifted by the job's clock alignment, so that a slow rank's compute reads "
        "above its peers' waiting in the collective that follows."
    )
