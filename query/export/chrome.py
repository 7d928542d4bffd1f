"""A window as Chrome trace-event JSON (pure), as the PyTorch profiler (Kineto) writes it, so that
chrome://tracing, ui.perfetto.dev and tracehouse's own Kineto reader all open it.

Times: `baseTimeNanoseconds` is the window's first instant, and `ts`/`dur` are µs after it written
with three decimals from integer ns (1234.567), so no ns is lost, neither in the text nor in a
reader's float64 (exact up to 104 days from the base). GPU work is on pid = GPU index, tid =
stream, with args device, stream and correlation (Kineto's layout); host events on their own
pid/tid, their kind as the category Kineto uses (cuda_runtime, user_annotation, ...). Counters are
`C` events; process and thread names `M` events; each CUDA call has a flow (`s`/`f`) to the first
GPU work it launched. Several hosts share one pid space here: use the Perfetto format for those.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from query.export.window import COUNTER_COLUMNS, WindowData, counter_name, flows, gpu_name, on_gpu

CATEGORIES: Mapping[str, str] = {
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "sync": "cuda_sync",
    "cuda_api": "cuda_runtime",
    "nvtx": "user_annotation",
    "step": "user_annotation",
    "cpu_op": "cpu_op",
    "python": "python_function",
    "gpu_annotation": "gpu_user_annotation",
}
HOST_PID = (1 << 31) - 1  # the pseudo-process of host-wide counters (one host: the first)


def us(ns: int) -> str:
    """Non-negative ns as µs with three decimals, exactly: 1234567 -> 1234.567."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def _text(value: str, cache: dict[str, str]) -> str:
    found = cache.get(value)
    if found is None:
        found = cache[value] = json.dumps(value, ensure_ascii=False)
    return found


def chrome_trace(data: WindowData) -> bytes:
    """The window as Chrome trace-event JSON, UTF-8."""
    events, counters = data.events, data.counters
    starts = ([int(events["start"].min())] if len(events) else []) + (
        [int(counters["ts"].min())] if len(counters) else []
    )
    base = min(starts, default=0)
    hosts = sorted(set(events["host"]) | set(counters["host"]))
    items: list[str] = []
    cache: dict[str, str] = {}
    named: set[tuple[int, int | None]] = set()

    def name(pid: int, tid: int | None, label: str) -> None:
        if (pid, tid) in named:
            return
        named.add((pid, tid))
        what = "process_name" if tid is None else "thread_name"
        where = f'"pid":{pid}' + ("" if tid is None else f',"tid":{tid}')
        items.append(f'{{"ph":"M","name":"{what}",{where},"args":{{"name":{_text(label, cache)}}}}}')

    gpu_rows = on_gpu(events).tolist()
    flow_out, flow_in = (f.tolist() for f in flows(events))
    columns = (
        "host",
        "kind",
        "start",
        "end",
        "gpu",
        "stream",
        "pid",
        "tid",
        "name",
        "correlation_id",
        "bytes",
        "extras",
    )
    rows = zip(*(events[c].tolist() for c in columns), strict=True)
    for row, (host, kind, start, end, gpu, stream, pid, tid, label, correlation, size, extras) in enumerate(rows):
        args: dict[str, Any] = dict(extras or {})
        if gpu_rows[row]:
            pid, tid = gpu, stream
            name(pid, None, gpu_name(host, gpu, len(hosts)))
            name(pid, tid, f"stream {stream}")
            args.update(device=gpu, stream=stream)
        else:
            name(pid, None, data.processes.get((host, pid), f"process {pid}"))
            name(pid, tid, data.threads.get((host, pid, tid), f"thread {tid}"))
        if correlation:
            args["correlation"] = correlation
        if size:
            args["bytes"] = size
        category = CATEGORIES.get(kind, kind)
        if kind == "cuda_api" and (extras or {}).get("api") == "driver":
            category = "cuda_driver"
        if kind == "step" and (extras or {}).get("step"):
            label = f"ProfilerStep#{extras['step']}"
        head = f'"name":{_text(label, cache)},"cat":"{category}","pid":{pid},"tid":{tid},"ts":{us(start - base)}'
        if end == start and not gpu_rows[row]:
            items.append(f'{{"ph":"i","s":"t",{head},"args":{json.dumps(args, ensure_ascii=False)}}}')
        else:
            items.append(f'{{"ph":"X",{head},"dur":{us(end - start)},"args":{json.dumps(args, ensure_ascii=False)}}}')
        where = f'"pid":{pid},"tid":{tid},"ts":{us(start - base)}'
        if flow_out[row]:
            items.append(f'{{"ph":"s","id":{flow_out[row]},"cat":"ac2g","name":"ac2g",{where}}}')
        if flow_in[row]:
            items.append(f'{{"ph":"f","bp":"e","id":{flow_in[row]},"cat":"ac2g","name":"ac2g",{where}}}')
    for host, gpu, pid, metric, ts, value in zip(*(counters[c].tolist() for c in COUNTER_COLUMNS), strict=True):
        owner = gpu if gpu >= 0 else pid if pid > 0 else HOST_PID - hosts.index(host)
        if gpu >= 0:
            name(owner, None, gpu_name(host, gpu, len(hosts)))
        elif owner != pid:
            name(owner, None, host or "host")
        label = counter_name(host, gpu, pid, metric, len(hosts))
        items.append(
            f'{{"ph":"C","name":{_text(label, cache)},"pid":{owner},"ts":{us(ts - base)},"args":{{"value":{value!r}}}}}'
        )
    body = ",\n".join(items)
    tail = json.dumps({"displayTimeUnit": "ns", "baseTimeNanoseconds": base, "traceName": "tracehouse window"})
    return ('{"traceEvents":[\n' + body + "\n],\n" + tail[1:]).encode()
