"""One rank of a job, whatever its framework (runs inside a Spark barrier task): the job's
code checked and imported, the framework's backend chosen by the manifest
(trainstack_training.frameworks), the no-progress watchdog around it, and the user's error
recorded on shared storage so a retried stage fails at once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo
from trainstack_training.frameworks import backend_for
from trainstack_training.frameworks.base import RankRun, WorkerResult, pin_to_cores
from trainstack_training.job import (
    JobError,
    JobSpec,
    UserCodeError,
    import_entry,
    listed_requirements,
    load_spec,
    record_error,
    recorded_error,
)
from trainstack_training.watchdog import Watchdog, exit_rank


def run_worker(
    cfg: TrainConfig,
    info: DataInfo,
    task_index: int,
    peers: list[str],
    cores: int,
    attempt: int,
    host: str = "localhost",
    started: float = 0.0,
    gpus: list[str] | None = None,
) -> WorkerResult:
    """Run the job's code on this rank's shard with its framework's backend; the chief saves.
    An error in the job's code is recorded on shared storage (a retried stage fails again at
    once) and raised as a UserCodeError with the user's frames only."""
    out = Path(cfg.output).resolve()
    spec = job_spec(cfg)
    earlier = recorded_error(out)
    if earlier:  # a retry of a stage whose code failed: the same code fails the same way
        raise UserCodeError(earlier)
    marks = {"task_start": started or time.time()}
    run = RankRun(cfg, info, spec, task_index, peers, cores, attempt, host, marks, gpus=gpus or [])
    backend = backend_for(spec.framework)
    backend.configure(run)  # before the framework starts its threads and runtime
    if cfg.pin_cores:
        pin_to_cores(task_index, cores)
    framework = backend.load(run)

    def stuck(message: str) -> None:
        record_error(out, message, task_index)  # the retries fail at once: no second hang
        exit_rank(message)

    with Watchdog(spec.progress_timeout, out, task_index, stuck) as watchdog:
        run.watchdog = watchdog
        try:
            module = import_entry(spec, cfg.job_env)
            return backend.run(run, module, framework)
        except UserCodeError as exc:
            record_error(out, str(exc), task_index)
            raise


def job_spec(cfg: TrainConfig) -> JobSpec:
    """The run's checked job directory, with the run's parameters over the manifest's."""
    if not cfg.job_dir:
        raise JobError(
            "job_dir is empty: give a job directory (trainstack.toml and your code; "
            "docs/jobs.md), e.g. examples/digits"
        )
    try:
        params = json.loads(cfg.job_params or "{}")
    except ValueError as exc:
        raise JobError(f"job_params is not a JSON object: {exc}") from None
    spec = load_spec(cfg.job_dir, params)
    if listed_requirements(spec) and not cfg.job_env:
        raise JobError(
            f"the job lists packages in {spec.requirements} but job_env is empty: run it with "
            "`trainstack submit` or `pulumi up`, which install them (docs/jobs.md, Packages)"
        )
    return spec
