"""The chunk of rows being built from a Kineto trace's events (agent/traces/kineto_events.py) and
its Arrow batch. Rows come as tuples (one event at a time) or as columns (a run of events mapped
at once, agent/traces/kineto_columns.py); either way in file order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

ROW_COLUMNS = ("kind", "start", "end", "name", "gpu", "stream", "pid", "tid", "correlation_id", "bytes", "depth")
STRING_COLUMNS = {"kind": pa.string(), "name": pa.string()}


@dataclass
class Chunk:
    """Rows in the order of ROW_COLUMNS, as segments: a list of row tuples, or a dict of columns
    (lists of strings, int64 arrays); the CUDA call each row of GPU work was launched by, once
    found; extras by row."""

    segments: list[Any] = field(default_factory=list)
    count: int = 0
    links: dict[int, tuple[int, int, int, str]] = field(default_factory=dict)
    extras: defaultdict[str, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    waiting: list[int] = field(default_factory=list)  # correlation ids of its rows awaiting their call

    def __len__(self) -> int:
        return self.count

    def append(self, row: tuple[Any, ...]) -> None:
        if not self.segments or type(self.segments[-1]) is not list:
            self.segments.append([])
        self.segments[-1].append(row)
        self.count += 1

    def extend(self, columns: dict[str, Any], count: int) -> None:
        """`count` rows as columns, one per ROW_COLUMNS."""
        if count:
            self.segments.append(columns)
            self.count += count

    def _column(self, index: int, column: str) -> Any:
        pieces = []
        for segment in self.segments:
            if type(segment) is list:
                values = map(itemgetter(index), segment)
                pieces.append(list(values) if column in STRING_COLUMNS else np.fromiter(values, np.int64, len(segment)))
            else:
                pieces.append(segment[column])
        if column in STRING_COLUMNS:
            return [value for piece in pieces for value in piece] if len(pieces) != 1 else list(pieces[0])
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)

    def batch(self) -> pa.RecordBatch:
        """The rows as Arrow columns, built in numpy; each extra as codes into its distinct strings
        (null where a row has none, or an empty one)."""
        count = self.count
        columns = {column: self._column(index, column) for index, column in enumerate(ROW_COLUMNS)}
        launch_start = np.full(count, -1, np.int64)
        if self.links:
            linked = np.fromiter(self.links, np.intp, len(self.links))
            calls = list(self.links.values())
            for column, field_of_call in (("pid", 0), ("tid", 1)):
                columns[column][linked] = np.fromiter(map(itemgetter(field_of_call), calls), np.int64, len(calls))
            launch_start[linked] = np.fromiter(map(itemgetter(2), calls), np.int64, len(calls))
            kind, name = columns["kind"], columns["name"]
            for row, call in self.links.items():
                if kind[row] == "sync":  # named by its call, as nsys names it
                    name[row] = call[3]
        arrays = {column: pa.array(value, STRING_COLUMNS.get(column, pa.int64())) for column, value in columns.items()}
        arrays["launch_start"] = pa.array(launch_start)
        for key, found in sorted(self.extras.items()):
            arrays[f"x:{key}"] = _sparse_strings(found, count)
        return pa.RecordBatch.from_pydict(arrays)


def _sparse_strings(found: Mapping[int, str], count: int) -> pa.DictionaryArray:
    """`count` rows of which those `found` names hold a string, as a dictionary array: null elsewhere,
    and where the string is empty."""
    distinct: dict[str, int] = {}
    codes = np.full(count, -1, np.int32)
    codes[np.fromiter(found, np.intp, len(found))] = np.fromiter(
        (distinct.setdefault(value, len(distinct)) for value in found.values()), np.int32, len(found)
    )
    if "" in distinct:
        codes[codes == distinct[""]] = -1
    return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(list(distinct), pa.string()))
