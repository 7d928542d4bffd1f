"""A window as Perfetto's native trace (pure): TracePacket protobuf, one packet sequence.

A group track per GPU (its streams and its counters under it), per process (a track per thread
and family: CUDA API, NVTX, OS runtime, ...) and per host (host counters). Events are slice
begin/end pairs at their exact ns, instants when they last 0 ns; counters are TYPE_COUNTER
values; each CUDA call has a flow to the first GPU work it launched. Event names and kinds are
interned. A clock snapshot says the times are ns since the Unix epoch, so the UI can show
wall-clock time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from query.export.window import Layout, WindowData, flows, layout

SEQUENCE = 1  # trusted_packet_sequence_id of every packet
CLOCK_REALTIME, CLOCK_BOOTTIME = 1, 6
NEEDS_STATE = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
# records, in this order at one instant on one track: ends, then instants and counters, then begins
END, POINT, BEGIN = 0, 1, 2
BYTE_UNITS = {"B": pb.CounterDescriptor.UNIT_SIZE_BYTES, "ns": pb.CounterDescriptor.UNIT_TIME_NS}


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _framed(packet: pb.TracePacket) -> bytes:
    """The packet as one `packet` field (1, length-delimited) of a Trace message."""
    body = packet.SerializeToString()
    return b"\x0a" + _varint(len(body)) + body


def perfetto_trace(data: WindowData) -> bytes:
    """The window as a Perfetto trace (bytes of a `Trace` message)."""
    if data.empty:
        return b""
    plan = layout(data)
    uuids = _uuids(plan)
    chunks = [_framed(_clock(data)), *(_framed(p) for p in _descriptors(plan, uuids))]
    chunks.extend(_framed(p) for p in _events(data, plan, uuids))
    return b"".join(chunks)


def _uuids(plan: Layout) -> dict[tuple[object, ...], int]:
    keys = [g.key for g in plan.groups] + [t.key for t in plan.tracks]
    return {key: i for i, key in enumerate(keys, start=1)}


def _clock(data: WindowData) -> pb.TracePacket:
    times = [int(data.events["start"].min())] if len(data.events) else []
    times += [int(data.counters["ts"].min())] if len(data.counters) else []
    first = min(times)
    packet = pb.TracePacket(
        trusted_packet_sequence_id=SEQUENCE, sequence_flags=pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    )
    packet.clock_snapshot.primary_trace_clock = CLOCK_BOOTTIME
    packet.clock_snapshot.clocks.add(clock_id=CLOCK_BOOTTIME, timestamp=first)
    packet.clock_snapshot.clocks.add(clock_id=CLOCK_REALTIME, timestamp=first)
    return packet


def _descriptors(plan: Layout, uuids: Mapping[tuple[object, ...], int]) -> Iterator[pb.TracePacket]:
    explicit = pb.TrackDescriptor.EXPLICIT
    separate = pb.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_NONE
    for rank, group in enumerate(plan.groups):
        packet = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE)
        track = packet.track_descriptor
        track.uuid, track.child_ordering, track.sibling_order_rank = uuids[group.key], explicit, rank
        if group.pid is not None:
            track.process.pid, track.process.process_name = group.pid, group.name
        else:
            track.name = group.name
        yield packet
    for rank, each in enumerate(plan.tracks):
        packet = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE)
        track = packet.track_descriptor
        track.uuid, track.parent_uuid, track.name = uuids[each.key], uuids[each.group], each.name
        track.sibling_order_rank, track.sibling_merge_behavior = rank, separate
        if each.unit is not None:
            if each.unit in BYTE_UNITS:
                track.counter.unit = BYTE_UNITS[each.unit]
            elif each.unit:
                track.counter.unit_name = each.unit
        yield packet


def _records(data: WindowData, plan: Layout) -> np.ndarray:
    """(ts, order, tiebreak, what, row) per record, sorted: on one track, an enclosing slice
    begins before and ends after what it encloses, and a slice ends before the next begins."""
    starts, ends = data.events["start"].to_numpy(), data.events["end"].to_numpy()
    rows = np.arange(len(starts))
    slices = ends > starts
    counters = np.arange(len(data.counters))
    ts = np.concatenate([starts[slices], ends[slices], starts[~slices], data.counters["ts"].to_numpy()])
    what = np.concatenate(
        [np.full(slices.sum(), BEGIN), np.full(slices.sum(), END), np.full((~slices).sum(), POINT),
         np.full(len(counters), -1)]
    )  # fmt: skip
    row = np.concatenate([rows[slices], rows[slices], rows[~slices], counters])
    tiebreak = np.concatenate([-ends[slices], -starts[slices], np.zeros((~slices).sum() + len(counters), np.int64)])
    order = np.where(what == -1, POINT, what)
    sort = np.lexsort((row, tiebreak, order, ts))
    return np.stack([ts[sort], what[sort], row[sort]], axis=1)


def _events(data: WindowData, plan: Layout, uuids: Mapping[tuple[object, ...], int]) -> Iterator[pb.TracePacket]:
    events = data.events
    track_uuid = np.array([uuids[t.key] for t in plan.tracks], dtype=np.int64)
    event_uuid = track_uuid[plan.event_track].tolist() if len(events) else []
    counter_uuid = track_uuid[plan.counter_track].tolist() if len(data.counters) else []
    names, kinds = events["name"].tolist(), events["kind"].tolist()
    correlations, sizes, extras = (events[c].tolist() for c in ("correlation_id", "bytes", "extras"))
    values = data.counters["value"].tolist()
    flow_out, flow_in = (f.tolist() for f in flows(events))
    interned: dict[str, int] = {}
    categories: dict[str, int] = {}
    for ts, what, row in _records(data, plan).tolist():
        packet = pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=SEQUENCE, sequence_flags=NEEDS_STATE)
        event = packet.track_event
        if what == -1:
            event.type, event.track_uuid, event.double_counter_value = (
                pb.TrackEvent.TYPE_COUNTER,
                counter_uuid[row],
                values[row],
            )
        elif what == END:
            event.type, event.track_uuid = pb.TrackEvent.TYPE_SLICE_END, event_uuid[row]
        else:
            event.type = pb.TrackEvent.TYPE_SLICE_BEGIN if what == BEGIN else pb.TrackEvent.TYPE_INSTANT
            event.track_uuid = event_uuid[row]
            event.name_iid = _intern(interned, names[row], packet.interned_data.event_names)
            event.category_iids.append(_intern(categories, kinds[row], packet.interned_data.event_categories))
            _annotate(event, correlations[row], sizes[row], extras[row])
            if flow_out[row]:
                event.flow_ids.append(flow_out[row])
            if flow_in[row]:
                event.terminating_flow_ids.append(flow_in[row])
        yield packet


def _intern(table: dict[str, int], text: str, entries: object) -> int:
    iid = table.get(text)
    if iid is None:
        iid = table[text] = len(table) + 1
        entries.add(iid=iid, name=text)  # type: ignore[attr-defined]
    return iid


def _annotate(event: pb.TrackEvent, correlation: int, size: int, extras: Mapping[str, str] | None) -> None:
    if correlation:
        event.debug_annotations.add(name="correlation_id", uint_value=correlation)
    if size:
        event.debug_annotations.add(name="bytes", uint_value=size)
    for key, value in (extras or {}).items():
        event.debug_annotations.add(name=str(key), string_value=str(value))
