"""What each chunk of an Nsight Systems source gets before it leaves (agent/traces/nsys.py Export.chunks):
defaults for empty cells, one launch string per kernel launch configuration, the depth of NVTX ranges."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent.traces.nsys_sources import LAUNCH_COLUMNS
from tracehouse.batch import EVENT_OPTIONAL_COLUMNS


def fill_defaults(batch: pa.RecordBatch) -> pa.RecordBatch:
    """NULL in an optional column (a file may leave any cell empty) is the column's default: 0 in launch
    columns."""
    for index, field_ in enumerate(batch.schema):
        default = EVENT_OPTIONAL_COLUMNS.get(field_.name, 0 if field_.name.startswith("l:") else None)
        if default is not None and batch.column(index).null_count:
            filled = pc.fill_null(batch.column(index).cast(pa.int64()), default)
            batch = batch.set_column(index, field_.name, filled)
    return batch


def launch_column(batch: pa.RecordBatch) -> pa.RecordBatch:
    """One display string per distinct launch configuration (kernels of a program have few),
    shared by every kernel launched so."""
    values = np.stack([batch.column(f"l:{c}").to_numpy(zero_copy_only=False) for c in LAUNCH_COLUMNS]).astype(np.uint64)
    key = np.zeros(batch.num_rows, np.uint64)
    for column in values:  # a 64-bit mix of the configuration; equal keys are the same launch
        key = (key ^ column) * np.uint64(0x100000001B3)
    _, first, which = np.unique(key, return_index=True, return_inverse=True)
    labels = []
    for row in first:
        gx, gy, gz, bx, by, bz, registers, static, dynamic = (int(v) for v in values[:, row])
        labels.append(f"grid {gx}x{gy}x{gz}, block {bx}x{by}x{bz}, {registers} registers, {static + dynamic} B shared")
    keep = [i for i, name in enumerate(batch.schema.names) if not name.startswith("l:")]
    launch = pa.DictionaryArray.from_arrays(pa.array(which.astype(np.int32)), labels)
    return pa.RecordBatch.from_arrays(
        [*(batch.column(i) for i in keep), launch], names=[*(batch.schema.names[i] for i in keep), "x:launch"]
    )


class NvtxDepth:
    """The row of each NVTX range in its thread's lanes, over rows ordered by (thread, start,
    end descending): a push/pop range's nesting depth; for start/end ranges, which may overlap
    in any way, the first lane free at its start. Ranges in one lane of one thread never overlap,
    which the GPU projection relies on. Open ranges carry over from chunk to chunk."""

    def __init__(self) -> None:
        self._stacks: dict[tuple[int, int], list[int]] = {}
        self._lanes: dict[tuple[int, int], list[int]] = {}

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        starts = batch.column("start").to_pylist()
        ends = batch.column("end").to_pylist()
        pids = batch.column("pid").to_pylist()
        tids = batch.column("tid").to_pylist()
        styles = batch.column("x:style").to_pylist()
        depths = []
        for start, end, pid, tid, style in zip(starts, ends, pids, tids, styles, strict=True):
            if style == "PushPop":
                stack = self._stacks.setdefault((pid, tid), [])
                while stack and stack[-1] <= start:
                    stack.pop()
                depths.append(len(stack))
                stack.append(end)
            elif style == "StartEnd":
                lanes = self._lanes.setdefault((pid, tid), [])
                lane = next((i for i, busy_until in enumerate(lanes) if busy_until <= start), len(lanes))
                if lane == len(lanes):
                    lanes.append(end)
                else:
                    lanes[lane] = end
                depths.append(lane)
            else:
                depths.append(0)
        return batch.append_column("depth", pa.array(depths, pa.int64()))
