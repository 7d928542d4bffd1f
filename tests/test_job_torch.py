"""A real torch.distributed job on the CPU (gloo, 4 processes), profiled on every rank with the PyTorch
profiler, one rank slowed by a known amount over a known step range: the job view names that rank and
range, blames the part slowed (compute, then data loading) and estimates the loss within 10 %.
Skipped where torch is not installed (CI)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from query.client import Client
from tracehouse.cli.main import main

torch = pytest.importorskip("torch")

WORLD = 4
STEPS = 24
SLOW_RANK, SLOW_FIRST, SLOW_LAST = 2, 8, 13
SLOW_S = 0.100
BASE_S = 0.005  # each step's own compute: four ranks share the cores, a step of each fits in one slow step


def _busy(seconds: float) -> None:
    """Compute on the CPU for `seconds`: matrix products, not a sleep."""
    a = torch.rand(128, 128)
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        a = torch.mm(a, a).clamp_(-1, 1)


def _rank(rank: int, folder: str, port: int, slow_part: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)  # four ranks on a few cores: threads of their own would make every step noise
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    model = torch.nn.Linear(256, 256)
    slow = rank == SLOW_RANK
    # a schedule, as training code profiles: without one, torch 2.14 marks no ProfilerStep#N in the trace
    every_step = torch.profiler.schedule(wait=0, warmup=0, active=STEPS + 1)
    with profile(activities=[ProfilerActivity.CPU], schedule=every_step) as prof:
        for step in range(STEPS):
            late = slow and SLOW_FIRST <= step <= SLOW_LAST
            with record_function("data"):
                batch = torch.rand(64, 256)
                if late and slow_part == "data":
                    time.sleep(SLOW_S)  # waiting for a slow loader
            loss = model(batch).pow(2).mean()
            loss.backward()
            _busy(BASE_S + (SLOW_S if late and slow_part == "compute" else 0.0))
            with record_function("allreduce"):
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
            prof.step()
    prof.export_chrome_trace(str(Path(folder) / f"rank{rank}.json"))
    dist.destroy_process_group()


@pytest.mark.parametrize("slow_part", ["compute", "data"])
def test_a_slowed_rank_of_a_gloo_job_is_found_blamed_and_costed(
    address: str, client: Client, tmp_path: Path, slow_part: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_rank, args=(str(tmp_path), port, slow_part), nprocs=WORLD, join=True)
    files = [str(tmp_path / f"rank{r}.json") for r in range(WORLD)]
    job = f"gloo-{slow_part}"
    assert main(["import", "--job", job, "--host", "cpu-node", *files, "--server", address]) == 0
    capsys.readouterr()
    view = client.job(job)
    assert len(view.stragglers) >= 1, view.notes
    s = view.stragglers.iloc[0]
    assert s["rank"] == SLOW_RANK
    assert s["first_step"] >= SLOW_FIRST - 1 and s["last_step"] <= SLOW_LAST + 1
    assert s["cause"] == slow_part
    expected = SLOW_S * 1e9 * (SLOW_LAST - SLOW_FIRST + 1)
    assert abs(s["lost_ns"] - expected) <= 0.1 * expected
