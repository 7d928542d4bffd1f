"""A run's GPUs: one definition for every answer and page. Pure.

How many GPUs a run has (`gpus`) is what the run recorded: the indices a `tracehouse run` user
listed (`--gpus 0,1`), else the count an importer or agent stored in the run's attrs (a trace's: the
GPUs its work or telemetry touched, not every GPU it describes; the GPUs sampled), else the devices
registered under the run. Which ones (`gpu_indices`) is the first of `candidates` with that many GPUs:
for a trace, the GPUs its own GPU work ran on, then the devices it describes; for another run, the
listed indices, the devices registered under it, the GPUs its own GPU work ran on; then the GPUs its
telemetry shows (those its processes have samples on, else its host's GPUs with samples during it).
A run that recorded nothing gets the first of those lists that is not empty. (A trace imported before
`gpus` counted the GPUs it touched, with no `gpus_described` attr, counted every GPU it describes:
importing it again counts anew.)
(The devices table keeps one row per host, GPU and UUID, naming the run that described it last: an
earlier run's registration can be lost, its count not. A trace that names no host is filed under a
host of its own, its run id: agent/traces/importer.filed_under.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd

from tracehouse.model import DEFAULT_LIMITS

MAX_INDEX = DEFAULT_LIMITS.max_gpu_index
TRACED = ("nsys", "kineto")
# in a trace's attrs since tracehouse counted the GPUs its work or telemetry touched as `gpus`
# (agent/traces/importer.py): how many the trace describes
DESCRIBED = "gpus_described"
MAX_COMPARED = 100  # runs that recorded no GPUs: compare finds theirs, for this many at most


def recorded_counts(runs: pd.DataFrame, devices: pd.DataFrame) -> dict[str, int | None]:
    """Each run's recorded GPU count (`runs` and `devices` as the Query client answers them); None
    where it recorded none, for compare to find (its `gpus` column), as every page does."""
    registered = devices[devices["run_id"] != ""].groupby("run_id")["gpu"].agg(list).to_dict() if len(devices) else {}
    return {
        str(run): recorded_count(source, attrs, registered.get(run, []))
        for run, source, attrs in zip(runs["run_id"], runs["source"], runs["attrs"], strict=True)
    }


def gpu_counts(
    runs: pd.DataFrame, devices: pd.DataFrame, compare: Callable[[tuple[str, ...]], pd.DataFrame]
) -> dict[str, int | None]:
    """Each run's GPU count as every page gives it: what it recorded, else (for MAX_COMPARED runs at
    most) what `compare` (the Query client's) finds."""
    counts = recorded_counts(runs, devices)
    unknown = tuple(run for run, count in counts.items() if count is None)[:MAX_COMPARED]
    if unknown:
        compared = compare(unknown)
        counts |= dict(zip(compared["run_id"], compared["gpus"], strict=True))
    return counts


def listed_gpus(source: str, attrs: Mapping[str, str]) -> tuple[int, ...]:
    """The GPU indices in the `gpus` attribute ("0,1") of a run of source `user`; none when
    absent, not a list of indices, or naming one past max_gpu_index."""
    if source != "user":
        return ()
    parts = [part.strip() for part in attrs.get("gpus", "").split(",") if part.strip()]
    if not all(_small_number(part) and int(part) <= MAX_INDEX for part in parts):
        return ()
    return tuple(sorted({int(part) for part in parts}))


def recorded_count(source: str, attrs: Mapping[str, str], registered: Sequence[int]) -> int | None:
    """How many GPUs the run recorded; None when it recorded nothing."""
    listed = listed_gpus(source, attrs)
    if listed:
        return len(listed)
    stored = attrs.get("gpus", "").strip()
    if source != "user" and _small_number(stored) and 0 < int(stored) <= MAX_INDEX + 1:
        return int(stored)
    if source in TRACED and stored == "0" and DESCRIBED in attrs:  # a trace whose work touched no GPU
        return 0
    return len(set(registered)) or None


def candidates(
    source: str, attrs: Mapping[str, str], registered: Sequence[int], worked: Sequence[int]
) -> tuple[Sequence[int], ...]:
    """The lists run_gpus picks a run's GPUs from, in order: a trace's are the GPUs its work ran on
    before the devices it describes (Kineto's deviceProperties lists all of its host's); another run's
    the indices listed, the devices registered under it, then its GPU work."""
    if source in TRACED:
        return (worked, registered)
    return (listed_gpus(source, attrs), registered, worked)


def run_gpus(count: int | None, candidates: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """The first candidate list with `count` GPUs (any non-empty one when count is None); () when none has."""
    for candidate in candidates:
        gpus = tuple(sorted({int(gpu) for gpu in candidate}))
        if gpus and (count is None or len(gpus) == count):
            return gpus
    return ()


def indices_text(gpus: Sequence[int]) -> str:
    """ "0,1": the form programs read (CSV, JSON, the `gpus` attribute)."""
    return ",".join(str(gpu) for gpu in gpus)


def _small_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5
