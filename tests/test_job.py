"""The job view: membership from the launchers' variables, bad input, step parts, the straggler rule's
false-positive rate, and a synthetic job with a known truth through the real server and chDB store."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from agent.daemon import Agent, AgentConfig
from agent.telemetry.simulated import SimulatedBackend
from query.client import Client, QueryFailed
from query.jobassemble import choose_ranks
from query.jobcollectives import Alignment, Collective, align, collective_rows, matched
from query.jobparts import Intervals, covered, step_parts
from query.jobstragglers import false_positive_rate
from store.store import Store
from tests.conftest import small_limits
from tests.helpers import request, wait_until
from tests.job_trace import ALLREDUCE_BYTES, MS, T0, JobSpec, build
from tracehouse.batch import BatchBuilder
from tracehouse.cli.main import main
from tracehouse.jobs import import_membership, job_from_environment
from tracehouse.v1 import ingest_pb2_grpc


def test_membership_from_the_launchers_variables() -> None:
    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert job_from_environment(torchrun).attrs() == {"job": "abc", "rank": "3", "world_size": "8", "local_rank": "1"}
    slurm = {
        "SLURM_JOB_ID": "991",
        "SLURM_STEP_ID": "2",
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
    }
    assert job_from_environment(slurm).attrs() == {"job": "991.2", "rank": "5", "world_size": "16", "local_rank": "1"}
    mpi = {"PMIX_NAMESPACE": "prterun-x@1", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}
    assert job_from_environment(mpi).attrs() == {"job": "prterun-x@1", "rank": "2", "world_size": "4"}
    # torchrun's default id is no id; a job given wins; a rank that is no number is left out
    assert job_from_environment({"TORCHELASTIC_RUN_ID": "none", "RANK": "1"}) is None
    assert job_from_environment({"RANK": "x", "TORCHELASTIC_RUN_ID": "a"}, job="mine").attrs() == {"job": "mine"}
    assert import_membership("j", 2, 4, {"distributed_rank": "7", "distributed_world_size": "8"}).rank == 7
    assert import_membership("j", 2, 4, {}).attrs() == {"job": "j", "rank": "2", "world_size": "4"}


def _run(run_id: str, rank: str | None, world: str = "4") -> dict[str, object]:
    attrs = {"job": "j", "world_size": world} | ({"rank": rank} if rank is not None else {})
    return {"run_id": run_id, "host": "h", "attrs": attrs}


def test_bad_membership_is_answered_with_what_was_done() -> None:
    runs = [_run("a", "0"), _run("b", "1", "8"), _run("c", "1"), _run("launcher", None)]
    ranks, notes = choose_ranks(runs, {"a": 10, "b": 3, "c": 10})
    assert [(r.rank, r.run_id) for r in ranks] == [(0, "a"), (1, "c")]
    text = "\n".join(notes)
    assert "rank 1 is claimed by 2 runs: kept c (10 steps), left out b" in text
    assert "launcher names the job but no rank" in text
    assert "disagree on the world size" in text
    assert "6 rank(s) of 8 have no run: 2, 3, 4, 5, 6, 7" in text  # took the largest


def test_step_parts_add_up_with_compute_first() -> None:
    steps = (np.array([0, 100]), np.array([100, 200]))
    compute = Intervals(np.array([10, 20, 110]), np.array([30, 40, 150]))  # overlapping kernels: 30 covered
    comm = Intervals(np.array([35, 150]), np.array([60, 190]))  # 5 of it under compute
    data = Intervals(np.array([0, 100]), np.array([15, 105]))
    parts = step_parts(*steps, compute, comm, data)
    assert parts["compute_ns"].tolist() == [30, 40]
    assert parts["comm_ns"].tolist() == [20, 40]
    assert parts["data_ns"].tolist() == [10, 5]
    assert parts["idle_ns"].tolist() == [40, 15]
    assert covered(Intervals.empty(), *steps).tolist() == [0, 0]


def test_the_straggler_rule_flags_no_rank_step_of_jobs_without_one() -> None:
    # 1,024 ranks x 2,000 steps, own times with 3 % log-normal noise: the figures of query/jobstragglers.py
    rate, found = false_positive_rate(1024, 2000, 0.03, seed=1)
    assert rate < 2e-4 and found == 0  # 193 rank-steps of 2,048,000 flagged, none two in a row
    rate, found = false_positive_rate(64, 1000, 0.10, seed=2)  # 10 % noise
    assert rate < 2e-3 and found == 0


def _store(address: str, spec: JobSpec) -> object:
    builders, truth = build(spec)
    with grpc.insecure_channel(address) as channel:
        ingest = ingest_pb2_grpc.IngestStub(channel)
        for builder in builders:
            ingest.Write(request(builder), timeout=60)
    return truth


def test_a_straggler_is_named_with_its_loss_cause_and_throttled_gpu(address: str, client: Client) -> None:
    spec = JobSpec(no_trace=(7,), missing_steps={6: (30, 39)})
    truth = _store(address, spec)
    view = client.job("job-1")
    assert len(view.stragglers) == 1
    s = view.stragglers.iloc[0]
    assert (s["rank"], s["first_step"], s["last_step"], s["cause"]) == (5, 10, 19, "compute")
    assert abs(s["lost_ns"] - truth.lost_ns) <= 0.1 * truth.lost_ns  # type: ignore[attr-defined]
    assert abs(s["compute_growth_ns"] - 20 * MS) < 1 * MS
    telemetry = view.telemetry.set_index("metric")
    assert telemetry.loc["gpu.sm_clock_mhz", "rank_mean"] == pytest.approx(1100, abs=100)
    assert telemetry.loc["gpu.sm_clock_mhz", "peers_mean"] == pytest.approx(1980)
    assert "hardware thermal" in telemetry.loc["gpu.throttle_reasons", "detail"].split(" (peers")[0]
    ranks = view.ranks.set_index("rank")
    # node-1's clock runs 50 ms ahead: aligned on the all-reduces' ends, to within their spread
    assert ranks.loc[4, "alignment"] == "collective ends"
    assert abs(ranks.loc[4, "offset_ns"] + 50 * MS) <= max(ranks.loc[4, "uncertainty_ns"], 1000)
    assert ranks.loc[1, "alignment"] == "same host" and ranks.loc[0, "alignment"] == "reference"
    collectives = view.collectives.iloc[0]
    # rank 1, 3 ms slower all along, arrives last but in rank 5's 10 slow steps
    assert (collectives["kind"], collectives["bytes"], collectives["last_rank"]) == ("all_reduce", ALLREDUCE_BYTES, 1)
    assert collectives["last_rank_count"] == 30
    assert collectives["count"] == 40
    assert collectives["arrival_skew_ns"] < 5 * MS  # rank 1's 3 ms and noise; 50 ms more without the alignment
    assert collectives["busbw_bytes_per_s"] == pytest.approx(
        collectives["algbw_bytes_per_s"] * 2 * 6 / 7, rel=0.05
    )  # 7 ranks with collectives
    notes = "\n".join(view.notes)
    assert "rank 7" in notes and "no steps" in notes
    assert "rank 6 lacks 10 of 40 steps (30, 31" in notes
    assert view.steps is None
    # the same answer again comes from what was stored (the same generation)
    assert client.job("job-1").generation == view.generation


def test_a_data_loading_straggler_is_blamed_on_data_and_steps_narrow(address: str, client: Client) -> None:
    _store(address, JobSpec(job="job-d", slow_part="data", slow_rank=2, host_offsets_ns={}))
    view = client.job("job-d", steps=r"^1\d$", step_rows=True)
    s = view.stragglers.iloc[0]
    assert (s["rank"], s["cause"]) == (2, "data")
    assert sorted(view.steps["step"].unique()) == list(range(10, 20))
    assert (view.steps[["compute_ns", "comm_ns", "data_ns", "idle_ns"]].sum(axis=1) == view.steps["dur_ns"]).all()


def test_a_job_of_one_rank_and_bad_requests(address: str, client: Client) -> None:
    _store(address, JobSpec(job="solo", ranks=1, slow_rank=None, host_offsets_ns={}))
    view = client.job("solo")
    assert view.stragglers.empty
    assert any("a job of 1 rank(s)" in note for note in view.notes)
    with pytest.raises(QueryFailed) as failed:
        client.job("nobody")
    assert failed.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(QueryFailed) as failed:
        client.job("bad id!")
    assert failed.value.code == grpc.StatusCode.INVALID_ARGUMENT and "job" in failed.value.message
    with pytest.raises(QueryFailed) as failed:
        client.job("solo", steps="(")
    assert "step_pattern" in failed.value.message


def test_the_command_prints_the_job(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    _store(address, JobSpec(job="cli-job"))
    assert main(["job", "cli-job", "--server", address, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["stragglers"][0]["rank"] == 5 and isinstance(document["stragglers"][0]["lost_ns"], int)
    assert main(["job", "cli-job", "--server", address]) == 0
    out = capsys.readouterr().out
    assert "rank 5, steps 10-19 (10 slow): the job lost" in out and "cause: compute" in out
    assert "throttle reasons: hardware thermal (peers: none)" in out
    assert main(["job", "cli-job", "--server", address, "--format", "markdown"]) == 0
    assert "### stragglers" in capsys.readouterr().out


def test_bench_job_finds_its_straggler_and_times_the_view_beside_the_scan() -> None:
    from tracehouse.bench.job import bench_job, slowed

    result = bench_job(ranks=64, steps=200, repeats=1)
    rank, first, count = slowed(64, 200)
    assert result["step_rows"] == 64 * 200 and result["straggler"]["stragglers"] == 1
    found = result["straggler"]["found"]
    assert (found["rank"], found["first_step"], found["last_step"]) == (rank, first, first + count - 1)
    assert result["job_view_s"] > 0 and result["engine_scan_s"] > 0 and result["ratio"] > 0


def _collectives(ends: list[int], shift: int) -> list[Collective]:
    return [Collective("all_reduce", 1 << 20, end - 5 * MS + shift, end + shift) for end in ends]


def test_alignment_takes_the_tighter_of_collective_ends_and_agent_offsets_and_says_what_it_cannot() -> None:
    ends = [1_000 * MS * (i + 1) for i in range(10)]
    hosts = {0: "a", 1: "a", 2: "b", 3: "c", 4: "d"}
    per_rank = {0: _collectives(ends, 0), 1: _collectives(ends, 0), 2: _collectives(ends, 50 * MS),
                3: _collectives(ends[:2], 7 * MS), 4: []}  # fmt: skip
    # the agents: host c's clock 7 ms behind the server's... and a's and c's measured, b's and d's not
    offsets = {"a": np.full(20, 1 * MS, np.float64), "c": np.full(20, 8 * MS, np.float64) + np.arange(20) * 1000}
    aligned = align(hosts, matched(per_rank), offsets)
    assert (aligned[0].method, aligned[1].method) == ("reference", "same host")
    assert aligned[2] == Alignment(-50 * MS, 1000, "collective ends")  # tighter than no agent at all
    # two collectives in common are too few: host c's agents' offsets (8 ms - 1 ms), within their floor
    assert aligned[3].method == "agent offsets" and aligned[3].offset_ns == 7 * MS + 9500
    assert aligned[3].uncertainty_ns == 500_000
    # the agents' own bounds (half their round trips) count where larger than their readings' spread
    bounds = {"a": np.full(20, 0.4 * MS), "c": np.full(20, 0.6 * MS)}
    assert align(hosts, matched(per_rank), offsets, bounds)[3].uncertainty_ns == 1 * MS
    assert (
        aligned[4].method == "none"
        and aligned[4].uncertainty_ns == -1
        and "host d cannot be aligned" in aligned[4].note
    )
    rows = collective_rows(matched(per_rank), aligned)
    assert rows[0]["count"] == 10 and rows[0]["arrival_skew_ns"] == 0  # host b's 50 ms taken out


def _agents_on_shifted_clocks(address: str, folder: Path, ahead_ns: dict[str, int], done: Callable[[], bool]) -> None:
    """Real agents on `address`, one a host, each host's wall clock `ahead_ns` ahead of the server's and all of
    them set back to a minute before the synthetic job (whose samples of the offset its view reads), until
    `done`."""
    back = T0 - 60 * 10**9 - time.time_ns()
    agents = [
        Agent(
            AgentConfig(address, folder / host, interval=0.1, slow_interval=0.1, flush_interval=0.2, host=host,
                        host_metrics=False),
            SimulatedBackend(1),
            lambda ahead=ahead: time.time_ns() + back + ahead,
        )
        for host, ahead in ahead_ns.items()
    ]  # fmt: skip
    for agent in agents:
        agent.start()
    try:
        wait_until(done, 60, "the agents measured their offsets", every=0.2)
    finally:
        for agent in agents:
            assert agent.stop()["dropped"] == 0


def test_hosts_without_collectives_in_common_are_aligned_by_their_agents_clock_offsets(
    address: str, client: Client, store: Store, tmp_path: Path
) -> None:
    # node-1's clock runs 50 ms ahead (of the server's, and of node-0's); rank 0, the reference, has no trace:
    # no collective to align node-1's ranks on, only the offsets the hosts' agents measured
    def measured() -> pa.Table:
        return store.query(
            "SELECT host, max(value) AS u, count() AS n FROM {db}.samples "
            "WHERE metric = 'agent.clock_offset_uncertainty_ns' GROUP BY host"
        )

    def done() -> bool:
        found = measured()
        return found.num_rows == 2 and pc.min(found.column("n")).as_py() >= 5

    _agents_on_shifted_clocks(address, tmp_path, {"node-0": 0, "node-1": 50 * MS}, done)
    _store(address, JobSpec(job="job-agents", no_trace=(0,), slow_rank=None))
    view = client.job("job-agents")
    ranks = view.ranks.set_index("rank")
    assert ranks.loc[4, "alignment"] == "agent offsets", ranks.loc[4, "note"]
    # each host's offset is within its agent's measured uncertainty; their difference within the two together
    error = abs(ranks.loc[4, "offset_ns"] + 50 * MS)
    assert error <= max(ranks.loc[4, "uncertainty_ns"], sum(measured().column("u").to_pylist()))
    assert error < 10 * MS and ranks.loc[4, "uncertainty_ns"] < 10 * MS  # a round trip on loopback, not 50 ms
    assert (ranks.loc[5:7, "offset_ns"] == ranks.loc[4, "offset_ns"]).all()
    assert ranks.loc[1, "alignment"] == "same host"
    collectives = view.collectives.iloc[0]
    assert collectives["count"] == 40
    assert collectives["arrival_skew_ns"] < 15 * MS  # rank 1's 3 ms, noise and the offset's error; 50 ms unaligned


@pytest.mark.parametrize("limits", [small_limits(max_answer_bytes=24_000)])
def test_step_rows_past_the_answer_bound_are_refused_with_the_way_to_fewer(address: str, client: Client) -> None:
    _store(address, JobSpec(job="big"))
    assert len(client.job("big").ranks) == 8  # the view alone fits
    with pytest.raises(QueryFailed) as failed:
        client.job("big", step_rows=True)
    assert failed.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "step_rows" in failed.value.message and "--steps REGEX" in failed.value.message
    assert len(client.job("big", steps="^3[0-9]$", step_rows=True).steps) == 8 * 10


def test_the_job_page_draws_ranks_by_steps_and_names_the_straggler(
    address: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_ui import figure_of, open_app, texts

    _store(address, JobSpec(job="ui-job"))
    app = open_app(address, monkeypatch, "job", job="ui-job")
    assert "rank 5, steps 10\\-19" in texts(app.markdown)
    heat = figure_of(app)["data"][0]
    assert np.asarray(heat["z"]).shape == (8, 40)
    assert list(heat["y"]) == list(range(8))
    z = np.asarray(heat["z"])
    assert np.ptp(z[:, 10:20], axis=0).max() < 1  # step time: every rank waits for the slowest
    app.radio[0].set_value("compute").run()
    z = np.asarray(figure_of(app)["data"][0]["z"])
    assert z[5, 10:20].min() > z[4, 10:20].max() + 15  # rank 5 computes 20 ms longer there


def test_a_job_that_changed_is_assembled_again_and_its_old_rows_forgotten(
    address: str, client: Client, store: Store
) -> None:
    _store(address, JobSpec(job="grows", ranks=4, steps=12, slow_rank=None, host_offsets_ns={}))
    first = client.job("grows")
    more = BatchBuilder("grows-rank0/more", run_id="grows-rank0", host="node-0")
    more.add_events("step", [T0 + 10**12], [T0 + 10**12 + MS], "step", extras=[{"step": "99"}], tid=1)
    with grpc.insecure_channel(address) as channel:
        ingest_pb2_grpc.IngestStub(channel).Write(request(more), timeout=60)
    second = client.job("grows")
    assert second.generation != first.generation
    assert any("rank 1 lacks 1 of 13 steps (99)" in note for note in second.notes)
    for table in ("jobs", "job_steps", "job_collectives"):
        left = store.query(f"SELECT DISTINCT generation FROM {{db}}.{table} WHERE job = 'grows'").column(0)
        assert left.to_pylist() == [second.generation], table


def test_a_job_of_a_launcher_alone_says_so(address: str, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    launcher = BatchBuilder("launcher/run", run_id="launcher", host="node-0")
    launcher.add_run("launcher", name="torchrun", host="node-0", start=T0, end=T0 + 10**9, attrs={"job": "lonely"})
    with grpc.insecure_channel(address) as channel:
        ingest_pb2_grpc.IngestStub(channel).Write(request(launcher), timeout=60)
    view = client.job("lonely")
    assert view.ranks.empty and view.stragglers.empty
    assert "run launcher names the job but no rank (a launcher?): left out" in view.notes
    assert main(["job", "lonely", "--server", address]) == 0
    assert "job: 0 ranks on 0 host(s); 0 straggler(s)" in capsys.readouterr().out
