"""One rank of a job, whatever its framework (runs inside a Spark barrier task): the job's
code imported, the framework's backend that the driver chose from the manifest
(trainstack_training.frameworks), the no-progress watchdog around it, and the user's error
recorded on shared storage so a retried stage fails at once.

Where it runs: in a rank, the barrier task of one worker (launcher.barrier_task). The job's
checked spec comes from the driver, ``trainstack-train``, which read the manifest once
(jobsettings.job_spec); a rank does not read it again.
"""

from __future__ import annotations

import time
from pathlib import Path

from trainstack_training.config import TrainConfig
from trainstack_training.context import UserCodeError, import_entry, record_error, recorded_error
from trainstack_training.data import DataInfo
from trainstack_training.frameworks import backend_for
from trainstack_training.frameworks.base import RankRun, WorkerResult, pin_to_cores
from trainstack_training.manifest import JobSpec
from trainstack_training.watchdog import Watchdog, exit_rank


def run_worker(
    cfg: TrainConfig,
    info: DataInfo,
    spec: JobSpec,
    task_index: int,
    peers: list[str],
    cores: int,
    attempt: int,
    host: str = "localhost",
    started: float = 0.0,
    gpus: list[str] | None = None,
) -> WorkerResult:
    """Run the job's code on this rank's shard with its framework's backend; the chief saves.
    `spec`: the job as the driver checked it, its framework the run's (`cfg.framework`). An
    error in the job's code is recorded on shared storage (a retried stage fails again at
    once) and raised as a UserCodeError with the user's frames only."""
    out = Path(cfg.output).resolve()
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
