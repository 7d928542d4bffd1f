"""A distributed job's ranks, as the runs of its processes name them: which job, which rank, of how many.

A run belongs to a job through four of its attrs: `job`, `rank`, `world_size` and `local_rank` (its host is
the run's). Each is read, in this order, from what the caller gives (`tracehouse.run(..., job=ID)`,
`tracehouse run --job ID`, `tracehouse import --job ID`), then from the launcher's environment:

- job: TRACEHOUSE_JOB, TORCHELASTIC_RUN_ID (torchrun; its default `none` is no id), SLURM_JOB_ID (with
  SLURM_STEP_ID), PMIX_NAMESPACE / OMPI_MCA_ess_base_jobid (Open MPI), PMI_JOBID (MPICH);
- rank: RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK;
- world size: WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE;
- local rank: LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID.

A run that names a job but no rank (`tracehouse run --job ID -- torchrun ...`, the launcher) is of the job
and of no rank; the ranks are its children's runs. A value that is no number is left out, and said.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

JOB_ATTR, RANK_ATTR, WORLD_ATTR, LOCAL_ATTR = "job", "rank", "world_size", "local_rank"
JOB_ENV = "TRACEHOUSE_JOB"
MAX_RANK = 1 << 20  # ranks and world sizes past a million are taken as no number
JOB_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

JOB_VARIABLES = ("TRACEHOUSE_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                 "PMI_JOBID")  # fmt: skip
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
WORLD_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOCAL_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


class JobError(ValueError):
    """A job id or rank that cannot be taken, naming the field and why."""


@dataclass(frozen=True)
class Membership:
    """What a run says of its job; rank, world size and local rank are None where unknown."""

    job: str
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None

    def attrs(self) -> dict[str, str]:
        values = {JOB_ATTR: self.job, RANK_ATTR: self.rank, WORLD_ATTR: self.world_size, LOCAL_ATTR: self.local_rank}
        return {key: str(value) for key, value in values.items() if value is not None}


def check_job_id(job: str, field: str = "job") -> str:
    if not JOB_ID.fullmatch(job):
        raise JobError(f"{field}: {job[:64]!r} is not a job id (1..128 of letters, digits and ._:@/+=-)")
    return job


def _number(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    value = int(text.strip())
    return value if value < MAX_RANK else None


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((environ[name] for name in names if environ.get(name, "").strip()), None)


def job_from_environment(environ: Mapping[str, str], job: str | None = None) -> Membership | None:
    """The run's job, `job` first, then the launcher's variables; None when neither names one."""
    found = job or next((environ[name] for name in JOB_VARIABLES
                         if environ.get(name, "").strip() not in ("", "none" if name == "TORCHELASTIC_RUN_ID" else "")),
                        None)  # fmt: skip
    if not found:
        return None
    if not job and found == environ.get("SLURM_JOB_ID") and environ.get("SLURM_STEP_ID", "").strip():
        found = f"{found}.{environ['SLURM_STEP_ID'].strip()}"
    found = found.strip()[:128]
    if not JOB_ID.fullmatch(found):
        found = re.sub(r"[^A-Za-z0-9._:@/+=-]", "_", found)
    return Membership(
        job=found,
        rank=_number(_first(environ, RANK_VARIABLES)),
        world_size=_number(_first(environ, WORLD_VARIABLES)),
        local_rank=_number(_first(environ, LOCAL_VARIABLES)),
    )


def import_membership(job: str, file_index: int, files: int, trace_attrs: Mapping[str, str]) -> Membership:
    """A rank of `tracehouse import --job`: the rank and world size the trace's distributedInfo gives
    (a Kineto trace's attrs distributed_rank, distributed_world_size), else the file's place and count."""
    rank = _number(trace_attrs.get("distributed_rank"))
    world = _number(trace_attrs.get("distributed_world_size"))
    if rank is None:
        rank, world = file_index, files
    return Membership(job=job, rank=rank, world_size=world if world else files)


def membership_of(attrs: Mapping[str, str]) -> Membership | None:
    """What a stored run's attrs say of its job (None: of none)."""
    job = attrs.get(JOB_ATTR, "")
    if not job:
        return None
    return Membership(job, _number(attrs.get(RANK_ATTR)), _number(attrs.get(WORLD_ATTR)),
                      _number(attrs.get(LOCAL_ATTR)))  # fmt: skip
