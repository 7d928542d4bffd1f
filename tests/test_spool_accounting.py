"""What the spool's files say is checked before it is counted: a changed header is found, a
batch the server already had is not recovered twice, and a loss whose size cannot be known
is reported as unknown, never as 0 or as the header's claim."""

from __future__ import annotations

import dataclasses
import logging
import struct
import zlib
from pathlib import Path

import grpc
import pytest

from agent.daemon import Agent, AgentConfig
from agent.shipping.spool import EncodedBatch, Spool
from agent.telemetry.simulated import SimulatedBackend
from tests.agent_helpers import Fates
from tests.helpers import telemetry
from tracehouse.batch import encode_request
from tracehouse.v1 import ingest_pb2

VALUES_OFFSET = 8 + 4 + 4  # magic, header checksum, payload checksum: then the value count
CLAIM = 1_000_000_000_000_000_000


def earlier(n: int) -> EncodedBatch:
    """A batch of an earlier agent session: 400 sample values."""
    return EncodedBatch(f"earlier.host/{n:08d}", encode_request(telemetry(f"earlier.host/{n:08d}").build()), 400)


def claim_more(path: Path, values: int = CLAIM) -> None:
    data = bytearray(path.read_bytes())
    data[VALUES_OFFSET : VALUES_OFFSET + 8] = struct.pack("<Q", values)
    path.write_bytes(bytes(data))


def old_format(batch: EncodedBatch, values: int) -> bytes:
    """A THSPOOL1 file, as the previous release wrote it, whose unchecked header claims `values`."""
    ident = batch.batch_id.encode()
    fields = struct.pack("<IQQH", zlib.crc32(batch.payload), values, len(batch.payload), len(ident))
    return b"THSPOOL1" + fields + ident + batch.payload


def test_a_changed_value_count_is_found_when_the_spool_opens(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, 1 << 20, lambda *_: None)
    for n in range(3):
        assert spool.put(earlier(n))
    changed = sorted(tmp_path.glob("*.batch"))[1]
    claim_more(changed)
    fates = Fates()
    with caplog.at_level(logging.ERROR, "tracehouse.agent.spool"):
        reopened = Spool(tmp_path, 1 << 20, fates.drop, fates.unknown.append)
    assert reopened.batches == 2 and reopened.values_of() == 800, "the claim is not believed"
    assert fates.unknown == [changed.name] and fates.dropped == []
    assert changed.with_suffix(".corrupt").exists() and not changed.exists()
    assert "header checksum mismatch" in caplog.text and "values lost: unknown" in caplog.text
    assert [reopened.oldest(), reopened.remove("earlier.host/00000000"), reopened.oldest()] == [
        earlier(0), None, earlier(2)
    ]  # fmt: skip


def test_a_changed_batch_id_is_found_too(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 1 << 20, lambda *_: None)
    spool.put(earlier(0))
    path = next(tmp_path.glob("*.batch"))
    path.write_bytes(path.read_bytes().replace(b"earlier.host/", b"another.host/", 1))
    fates = Fates()
    assert Spool(tmp_path, 1 << 20, fates.drop, fates.unknown.append).batches == 0
    assert fates.unknown == [path.name]


def test_a_payload_damaged_after_opening_is_counted_with_the_checked_count(tmp_path: Path) -> None:
    fates = Fates()
    spool = Spool(tmp_path, 1 << 20, fates.drop, fates.unknown.append)
    spool.put(earlier(0))
    path = next(tmp_path.glob("*.batch"))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert spool.oldest() is None
    assert fates.dropped == [("earlier.host/00000000", 400)] and fates.unknown == []


def test_files_of_the_previous_format_are_replayed_counted_from_their_payload(tmp_path: Path) -> None:
    """THSPOOL1 headers had no checksum: their count is read from the payload, not believed."""
    (tmp_path / "00000000000000000001.batch").write_bytes(old_format(earlier(1), values=CLAIM))
    damaged = bytearray(old_format(earlier(2), values=400))
    damaged[-1] ^= 0xFF
    (tmp_path / "00000000000000000002.batch").write_bytes(bytes(damaged))
    fates = Fates()
    spool = Spool(tmp_path, 1 << 20, fates.drop, fates.unknown.append)
    assert spool.batches == 1 and spool.values_of() == 400
    assert spool.oldest() == earlier(1)
    assert fates.unknown == ["00000000000000000002.batch"], "its count is unknown: not 0, not the header's"
    spool.put(earlier(3))
    assert (tmp_path / "00000000000000000003.batch").read_bytes()[:8] == b"THSPOOL2", "new files: the new format"


def _agent(address: str, spool: Path) -> Agent:
    settings = AgentConfig(server=address, spool=spool, interval=0.05, slow_interval=0.5, flush_interval=0.2,
                           shutdown_timeout=15.0, max_backoff=0.5, host="test-host")  # fmt: skip
    return Agent(dataclasses.replace(settings, host_metrics=False), SimulatedBackend(1))


def test_the_agent_recovers_only_what_the_server_did_not_have(
    address: str, channel: grpc.Channel, tmp_path: Path
) -> None:
    """An earlier session left three batches: one reached the server before that session died,
    one's header was changed on disk, one is new to the server."""
    spool = Spool(tmp_path / "spool", 1 << 30, lambda *_: None)
    for n in range(3):
        spool.put(earlier(n))
    second = sorted((tmp_path / "spool").glob("*.batch"))[1]
    answer = ingest_pb2.WriteResponse.FromString
    write = channel.unary_unary("/tracehouse.v1.Ingest/Write", request_serializer=None, response_deserializer=answer)
    assert not write(earlier(0).payload, timeout=30).duplicate  # the server had the first one already
    claim_more(second, 1_000_000_000_000_000_000)
    agent = _agent(address, tmp_path / "spool")
    agent.start()
    report = agent.stop(shutdown_timeout=15.0)
    assert report["recovered"] == 400, "only the third batch was recovered"
    assert report["already_stored"] == 400, "the first was replayed, but the server had it"
    assert report["earlier_dropped"] == "unknown", "the second one's count cannot be known"
    assert report["stored"] == report["sampled"] and report["spooled"] == 0
    assert not list((tmp_path / "spool").glob("*.batch"))
    assert [p.name for p in (tmp_path / "spool").glob("*.corrupt")] == [second.with_suffix(".corrupt").name]
