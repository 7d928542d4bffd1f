"""One contract for every GPU backend, and NVML's fault handling through the real pynvml
bindings driven against a fake NVML library."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pynvml
import pytest

from agent.shipping.batcher import Batcher
from agent.shipping.spool import EncodedBatch
from agent.shipping.stats import Stats
from agent.telemetry.gpu import BackendUnavailable, GpuBackend, GpuLost
from agent.telemetry.nvml import NvmlBackend
from agent.telemetry.sampler import Sampler
from agent.telemetry.simulated import SimulatedBackend
from tests.agent_helpers import decode, metrics_by_gpu, sample_rows
from tests.fake_nvml import FakeNvml
from tests.helpers import Clock
from tracehouse import metrics as m


def _real_gpu_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture(params=["simulated", "nvml-fake-library", "nvml-real"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[GpuBackend]:
    if request.param == "simulated":
        opened: GpuBackend = SimulatedBackend(3)
    elif request.param == "nvml-fake-library":
        FakeNvml(3).install(monkeypatch)
        opened = NvmlBackend()
    else:
        if not _real_gpu_present():
            pytest.skip("no NVIDIA driver on this machine")
        opened = NvmlBackend()
    yield opened
    opened.close()


class TestBackendContract:
    def test_devices_are_identified_by_uuid_and_bus_id(self, backend: GpuBackend) -> None:
        devices = backend.devices()
        assert [d.index for d in devices] == backend.indices()
        assert len({d.uuid for d in devices}) == len(devices)
        assert len({d.pci_bus_id for d in devices}) == len(devices)
        assert all(d.uuid.startswith("GPU-") and d.memory_total > 0 and d.name for d in devices)

    def test_readings_are_known_metrics_with_valid_values(self, backend: GpuBackend) -> None:
        for gpu in backend.indices():
            fast = backend.read_fast(gpu)
            assert {m.GPU_UTIL, m.GPU_MEM_USED, m.GPU_MEM_TOTAL, m.GPU_POWER, m.GPU_TEMP} <= set(fast)
            slow = backend.read_slow(gpu)
            for metric, value in {**fast, **slow}.items():
                assert metric in m.METRICS, metric
                assert m.valid(metric, float(value)), (metric, value)

    def test_processes_and_reopen(self, backend: GpuBackend) -> None:
        for gpu in backend.indices():
            for process in backend.processes(gpu):
                assert process.pid > 0
            assert backend.reopen(gpu).uuid == backend.devices()[gpu].uuid

    def test_a_gpu_that_does_not_exist_is_lost(self, backend: GpuBackend) -> None:
        with pytest.raises(GpuLost):
            backend.read_fast(len(backend.indices()) + 5)


def test_without_a_driver_the_message_gives_the_reason_and_leaves_the_hint_to_each_command() -> None:
    if _real_gpu_present():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(BackendUnavailable, match="NVML is not available") as refused:
        NvmlBackend()
    assert "--simulate" not in str(refused.value), "`up` has no --simulate: the agent command adds that hint"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    library = FakeNvml(3)
    library.install(monkeypatch)
    return library


def _sampler(backend: GpuBackend, clock: Clock) -> tuple[Sampler, list[EncodedBatch], Stats]:
    sent: list[EncodedBatch] = []
    stats = Stats()
    batcher = Batcher("run-x", "host-x", sent.append, max_age=3600, monotonic=clock)
    return Sampler(backend, batcher, stats, host=None, monotonic=clock), sent, stats


def test_unsupported_field_is_asked_once(fake: FakeNvml) -> None:
    fake.unsupported_fields.add((1, pynvml.NVML_FI_DEV_MEMORY_TEMP))
    fake.unsupported_calls.add(("nvmlDeviceGetPcieThroughput", 2))
    sampler, sent, _ = _sampler(NvmlBackend(), Clock())
    for _ in range(4):
        sampler.fast_tick()
        sampler.slow_tick()
    sampler.batcher.flush()
    asked = [ids for gpu, ids in fake.field_requests if gpu == 1]
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP in asked[0]
    assert all(pynvml.NVML_FI_DEV_MEMORY_TEMP not in ids for ids in asked[1:])
    assert fake.calls[("nvmlDeviceGetPcieThroughput", 2)] == 2, "once per counter (tx, rx), then never"
    found = metrics_by_gpu(sent)
    assert m.GPU_MEM_TEMP in found[0] and m.GPU_MEM_TEMP not in found[1]
    assert m.GPU_POWER in found[1], "the other fields of the call still arrive"
    assert m.GPU_PCIE_RX in found[1] and m.GPU_PCIE_RX not in found[2]


def test_a_transient_error_skips_one_reading_only(fake: FakeNvml) -> None:
    fake.failing_once.add(("nvmlDeviceGetUtilizationRates", 0))
    sampler, sent, _ = _sampler(NvmlBackend(), Clock())
    sampler.fast_tick()
    sampler.fast_tick()
    sampler.batcher.flush()
    utilisation = [r for r in sample_rows(sent) if r[0] == 0 and r[2] == m.GPU_UTIL]
    assert len(utilisation) == 1
    assert fake.calls[("nvmlDeviceGetUtilizationRates", 0)] == 2


def test_lost_gpu_is_isolated_and_reopened_with_backoff(fake: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    sampler, sent, _ = _sampler(NvmlBackend(), clock)
    sampler.fast_tick()
    fake.lost.add(1)
    with caplog.at_level(logging.WARNING, "tracehouse.agent"):
        sampler.fast_tick()  # GPU 1 found lost here
        for _ in range(3):
            sampler.fast_tick()
        assert sampler.active() == [0, 2]
        calls_while_lost = fake.calls[("nvmlDeviceGetUtilizationRates", 1)]
        sampler.fast_tick()
        assert fake.calls[("nvmlDeviceGetUtilizationRates", 1)] == calls_while_lost, "isolated: not asked"
        clock.now += 1.5
        sampler.slow_tick()  # first retry: still lost, next one in 2 s
        assert 1 in sampler.isolated and sampler.isolated[1].delay == 2.0
        fake.lost.discard(1)
        clock.now += 1.0
        sampler.slow_tick()  # too early for the second retry
        assert 1 in sampler.isolated
        clock.now += 1.5
        sampler.slow_tick()
        assert 1 not in sampler.isolated
        sampler.fast_tick()
    sampler.batcher.flush()
    per_gpu = [sum(1 for r in sample_rows(sent) if r[0] == gpu and r[2] == m.GPU_UTIL) for gpu in range(3)]
    assert per_gpu == [7, 2, 7], "GPUs 0 and 2 never missed a tick"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("GPU 1 lost" in text for text in messages) == 1, "one line per event"
    assert any("GPU 1 is back" in text for text in messages)


def test_garbage_readings_are_dropped_and_counted(fake: FakeNvml) -> None:
    fake.gpus[0].temperature = 0xFFFFFFFF  # NVML's "not available"
    fake.nan_memory_temp.add(2)
    fake.gpus[1].util = 250
    sampler, sent, stats = _sampler(NvmlBackend(), Clock())
    sampler.fast_tick()
    sampler.batcher.flush()
    rows = sample_rows(sent)
    assert stats.invalid == 3
    assert stats.sampled == len(rows)
    assert (0, 0, m.GPU_TEMP) not in {r[:3] for r in rows}
    assert (2, 0, m.GPU_MEM_TEMP) not in {r[:3] for r in rows}
    assert (1, 0, m.GPU_UTIL) not in {r[:3] for r in rows}
    assert all(m.valid(metric, value) for _, _, metric, value in rows)


def test_gpm_metrics_where_the_gpu_has_them(fake: FakeNvml) -> None:
    backend = NvmlBackend()
    assert backend.read_slow(2).keys().isdisjoint({m.GPU_SM_OCCUPANCY}), "GPM needs two samples"
    second = backend.read_slow(2)
    assert second[m.GPU_SM_OCCUPANCY] == 40.0 + pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
    assert second[m.GPU_TENSOR_ACTIVE] == 40.0 + pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    assert m.GPU_SM_OCCUPANCY not in backend.read_slow(0), "no GPM before Hopper"
    backend.read_slow(0)
    assert fake.calls[("nvmlGpmQueryDeviceSupport", 0)] == 1, "found once"
    assert len(fake._gpm_samples) == 1, "each window's older sample is freed"


def test_processes_are_sampled_with_pid_and_named_once(fake: FakeNvml) -> None:
    sampler, sent, _ = _sampler(NvmlBackend(), Clock())
    sampler.slow_tick()
    sampler.slow_tick()
    fake.gpus[0].processes = []
    sampler.slow_tick()
    sampler.batcher.flush()
    rows = [r for r in sample_rows(sent) if r[2] == m.PROC_GPU_MEM]
    assert {(gpu, pid) for gpu, pid, _, _ in rows} == {(0, 4242), (1, 4242), (2, 4242)}
    from tests.agent_helpers import decode

    events = decode(sent[0]).batch
    names = [events.dictionary[i] for i in events.events.name]
    states = [events.dictionary[v] for v in events.events.extra_value]
    assert names == ["python train.py [4242]"] * 4
    assert states == ["start", "start", "start", "end"]


def _stamps(sent: list[EncodedBatch], gpu: int, metric: str) -> list[int]:
    stamps = []
    for encoded in sent:
        batch = decode(encoded).batch
        columns = batch.samples
        for ts, g, name in zip(columns.ts, columns.gpu, columns.metric, strict=True):
            if g == gpu and batch.dictionary[name] == metric:
                stamps.append(ts)
    return stamps


def test_readings_are_stamped_to_the_ms_one_per_instant_and_follow_a_clock_that_was_set() -> None:
    wall = [1_790_000_000_123_456_789]
    sampler, sent, _ = _sampler(SimulatedBackend(2), Clock())
    sampler.wall_ns = lambda: wall[0]
    sampler.fast_tick()
    wall[0] += 300_000  # a late tick catching up within the same millisecond
    sampler.fast_tick()
    wall[0] += 99_000_000
    sampler.fast_tick()
    wall[0] -= 3600 * 10**9  # the clock was set back an hour
    sampler.fast_tick()
    sampler.batcher.flush()
    first = 1_790_000_000_123_000_000
    assert _stamps(sent, 0, m.GPU_UTIL) == [
        first,
        first + 1_000_000,
        first + 99_000_000,
        first + 99_000_000 - 3600 * 10**9,
    ]
