"""The chunk of rows being built from a Kineto trace's events (agent/traces/kineto_events.py) and
its Arrow batch. Rows come as tuples (one event at a time) or as columns (a run of events mapped
at once, agent/traces/kineto_columns.py); either way in file order."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

ROW_COLUMNS = ("kind", "start", "end", "name", "gpu", "stream", "pid", "tid", "correlation_id", "bytes", "depth")
STRING_COLUMNS = {"kind": pa.string(), "name": pa.string()}
# a row's kind in a segment of columns, by code (kineto_plan.CODES; 0 and 1 are no row's)
KINDS = (
    "",
    "",
    "mark",
    "cpu_op",
    "python",
    "nvtx",
    "cuda_api",
    "kernel",
    "memcpy",
    "memset",
    "sync",
    "gpu_annotation",
    "step",
)
KIND_CODES = {kind: code for code, kind in enumerate(KINDS) if kind}
_KIND_NAMES = pa.array(KINDS, pa.string())


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
    extra_columns: defaultdict[str, list[tuple[np.ndarray, list[str]]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # extras of rows added as columns: their rows and values

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
        pieces: list[Any] = []
        for segment in self.segments:
            if type(segment) is list:
                values = map(itemgetter(index), segment)
                if column == "name":
                    pieces.append(list(values))
                elif column == "kind":
                    pieces.append(np.fromiter(map(KIND_CODES.__getitem__, values), np.int8, len(segment)))
                else:
                    pieces.append(np.fromiter(values, np.int64, len(segment)))
            else:
                pieces.append(segment[column])
        if column == "name":
            return list(itertools.chain.from_iterable(pieces))
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int8 if column == "kind" else np.int64)

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
            name, links = columns["name"], self.links
            for row in linked[columns["kind"][linked] == KIND_CODES["sync"]].tolist():
                name[row] = links[row][3]  # a sync is named by its call, as nsys names it
        arrays = {
            column: _KIND_NAMES.take(value)
            if column == "kind"
            else pa.array(value, STRING_COLUMNS.get(column, pa.int64()))
            for column, value in columns.items()
        }
        arrays["launch_start"] = pa.array(launch_start)
        for key in sorted({*self.extras, *self.extra_columns}):
            found = self.extras.get(key, {})
            pieces = [(np.fromiter(found, np.intp, len(found)), list(found.values())), *self.extra_columns.get(key, ())]
            arrays[f"x:{key}"] = _sparse_strings(pieces, count)
        return pa.RecordBatch.from_pydict(arrays)


def _sparse_strings(pieces: list[tuple[np.ndarray, list[str]]], count: int) -> pa.DictionaryArray:
    """`count` rows of which those the pieces name hold a string, as a dictionary array: null
    elsewhere, and where the string is empty."""
    rows = np.concatenate([piece[0] for piece in pieces])
    encoded = pa.array([value for piece in pieces for value in piece[1]], pa.string()).dictionary_encode()
    codes = np.full(count, -1, np.int32)
    codes[rows] = encoded.indices.to_numpy(zero_copy_only=False)
    distinct = encoded.dictionary
    empty = distinct.index("").as_py()
    if empty >= 0:
        codes[codes == empty] = -1
    return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), distinct)
