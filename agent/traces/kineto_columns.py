"""Kineto events mapped to rows a window at a time, column-wise; agent/traces/kineto_events.py maps
them one at a time, with the same rows, and remains the reference for what an event becomes.

A window is the events of a block that surely fit in the current chunk (no more than it has room
for). What needs no state is worked out for the whole window by kineto_plan.Plan: each member
taken out of the events once, as a list; kinds by a dict lookup of phase and category; times to
ns exactly as to_ns makes them (in numpy where that is provably exact, by to_ns where not: a float
near a half, a Decimal); ids, names and args checked as the per-event code checks them. An event
that a check does not prove plain (a string where a number is expected, a time out of range, a
name to cut, a metadata event, an unknown category, an item that is not an object...) goes to
the per-event code in its place in the file; the plain events
between two such (a run) become rows at once, as columns of the chunk. Only what is sequential
loops, and only over the rows that need it: the lanes of ranges and ops (depth, a thread or GPU
stream at a time), and CUDA calls with the GPU work they launch (links, in file order). Flows
are counted per run: a run holds no other reason to skip, so reasons are still counted in the
order they appear (MAX_REASONS)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from agent.traces.kineto_blocks import Event
from agent.traces.kineto_events import CATEGORIES, CHUNK_ROWS, LINK_WINDOW, EventRows
from agent.traces.kineto_plan import FLOW, LANE_FAMILIES, Plan

MIN_WINDOW = 32  # fewer events than this (or less room) are mapped one at a time


class _Kinds(dict[Any, str | None]):
    """A kind by key, None for any other key: looked up by subscript, a third faster than `get`."""

    def __missing__(self, key: Any) -> None:
        return None


_X_KINDS = _Kinds(CATEGORIES)
_PHASE_KINDS = _Kinds({"i": "mark", "I": "mark", "s": FLOW, "t": FLOW, "f": FLOW})
_EVENT = frozenset({Event})


class ColumnRows(EventRows):
    """EventRows that maps windows of events column-wise (the module's docstring)."""

    def add_all(self, events: list[Any], at: int) -> int:
        count = len(events)
        while at < count:
            room = CHUNK_ROWS - self.current.count
            if room < MIN_WINDOW or count - at < MIN_WINDOW:
                return self.add_each(events, at)
            stop = min(count, at + room)
            self._window(events[at:stop])
            at = stop
        return at

    def _window(self, window: list[Any]) -> None:
        if set(map(type, window)) != _EVENT:
            self.add_each(window, 0)
            return
        try:
            x_kinds, phase_kinds = _X_KINDS, _PHASE_KINDS
            kinds = [
                x_kinds[e.cat] if e.ph == "X" else phase_kinds[e.ph] for e in window
            ]  # TypeError: a phase or category that is not hashable
        except TypeError:
            self.add_each(window, 0)
            return
        plan = Plan(self, window, kinds)
        done = 0
        for at in np.flatnonzero(plan.uneven).tolist():
            self._run(plan, done, at)
            self.add_each([window[at]], 0)
            done = at + 1
        self._run(plan, done, len(window))

    def _run(self, plan: Plan, first: int, stop: int) -> None:
        """The plain events first..stop-1 of the window as rows; flows counted."""
        if stop <= first:
            return
        flows = int(np.count_nonzero(plan.flows[first:stop]))
        if flows:
            self._skip("flow", flows)
        lo, hi = np.searchsorted(plan.taken, (first, stop))
        taken = plan.taken[lo:hi]
        if not len(taken):
            return
        chunk = self.current
        base = chunk.count
        depth = np.zeros(len(taken), np.int64)
        lo, hi = np.searchsorted(plan.laned, (first, stop))
        if hi > lo:
            depth[np.searchsorted(taken, plan.laned[lo:hi])] = self._depths(
                plan.lane_families[lo:hi],
                plan.lane_ids[0][lo:hi],
                plan.lane_ids[1][lo:hi],
                plan.lane_starts[lo:hi],
                plan.lane_ends[lo:hi],
            )
        lo, hi = np.searchsorted(plan.linked, (first, stop))
        if hi > lo:
            self._link(
                plan.link_correlations[lo:hi], plan.link_calls[lo:hi], base + np.searchsorted(taken, plan.linked[lo:hi])
            )
        for key, (at, values) in plan.extras.items():
            lo, hi = np.searchsorted(at, (first, stop))
            if hi > lo:
                chunk.extra_columns[key].append((base + np.searchsorted(taken, at[lo:hi]), values[lo:hi]))
        names = plan.names
        listed = taken.tolist()
        columns = {
            "kind": plan.kind_codes[taken],
            "name": [names[at] for at in listed],
            "depth": depth,
        }
        for column, values in plan.numbers.items():
            columns[column] = values[taken]
        chunk.extend(columns, len(taken))

    def _depths(
        self, families: np.ndarray, first: np.ndarray, second: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> np.ndarray:
        """Each row's lane (_lane, with the common case here), a key (family, thread or GPU stream)
        at a time: rows of one key in their order, as keys are independent."""
        order = np.lexsort((second, first, families))
        families, first, second = families[order], first[order], second[order]
        changes = (families[1:] != families[:-1]) | (first[1:] != first[:-1]) | (second[1:] != second[:-1])
        bounds = [0, *(np.flatnonzero(changes) + 1).tolist(), len(order)]
        starts_sorted, ends_sorted = starts[order].tolist(), ends[order].tolist()
        depths: list[int] = []
        lanes_of, lane = self._lanes, self._lane
        for lo, hi in itertools.pairwise(bounds):
            key = (LANE_FAMILIES[int(families[lo])], int(first[lo]), int(second[lo]))
            lanes = lanes_of.get(key)
            for start, end in zip(starts_sorted[lo:hi], ends_sorted[lo:hi], strict=True):
                if lanes is None:
                    depths.append(lane(key, start, end))
                    lanes = lanes_of[key]
                    continue
                for depth, busy_until in enumerate(lanes):
                    if busy_until <= start:
                        lanes[depth] = end
                        break
                else:
                    depth = lane(key, start, end)  # a lane more, or the last
                depths.append(depth)
        found = np.empty(len(order), np.int64)
        found[order] = depths
        return found

    def _link(self, correlations: list[int], calls: list[Any], rows: np.ndarray) -> None:
        """CUDA calls remembered (_call), and GPU work linked to its call or waiting for it, in file
        order. GPU work of the run waits in `pending` (rows by correlation id), and only what is
        still waiting at the run's end in EventRows' _waiting."""
        known, waiting, chunk = self._calls, self._waiting, self.current
        links = chunk.links
        pending: dict[int, Any] = {}  # an int, or a list of them
        for correlation, call, row in zip(correlations, calls, rows.tolist(), strict=True):
            if call is not None:
                known[correlation] = call
                if len(known) > LINK_WINDOW:
                    known.popitem(last=False)
                if waiting:
                    for waiting_chunk, waiting_row in waiting.pop(correlation, ()):
                        waiting_chunk.links[waiting_row] = call
                if pending:
                    found = pending.pop(correlation, None)
                    if type(found) is int:
                        links[found] = call
                    elif found is not None:
                        links.update(dict.fromkeys(found, call))
            else:
                found = known.get(correlation)
                if found is not None:
                    links[row] = found
                elif (already := pending.get(correlation)) is None:
                    pending[correlation] = row
                elif type(already) is int:
                    pending[correlation] = [already, row]
                else:
                    already.append(row)
        for correlation, found in pending.items():
            entries = waiting.setdefault(correlation, [])
            for row in [found] if type(found) is int else found:
                entries.append((chunk, row))
                chunk.waiting.append(correlation)
