"""The `trainstack-train` command line of a launch: one typed settings object, one builder.

Both launches build it here: the stack's declared job (infra.components.training, a Pulumi
dynamic provider, from its props) and `trainstack submit` (infra.jobs.commands, from the
stack's `jobDefaults` output and the command line's overrides). Each reads its dict once, in
its constructor (`LaunchSettings.declared`, `LaunchSettings.submitted`); `train_command` turns
the typed settings into the flags. Where the two launches pass a flag differently, the
settings say so: a `None` leaves the flag out, and `trainstack-train`'s own default applies
(training/trainstack_training/config.py, TrainConfig).

What wraps the command stays with its caller: the declared job runs it under `flock` on the
queue lock, a submitted job under the job runner (`python -m trainstack_training.runner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.jobs.envs import Env
from infra.jobs.remote import JOBS_DIR, NODE_VENV

TRAIN = f"{NODE_VENV}/bin/trainstack-train"


@dataclass(frozen=True)
class LaunchSettings:
    """What a launch of `trainstack-train` trains and how (not where: the run directory)."""

    master_url: str
    workers: int
    epochs: int
    batch_size: int
    data: str
    rows: int
    spark_conf: str
    # The job's code at JOBS_DIR/<job_sha> and its parameters (a JSON object); "" passes
    # neither --job-dir nor --job-params (the state of declared runs from before jobs).
    job_sha: str = ""
    job_params: str = "{}"
    # None leaves the flag out (trainstack-train's default applies):
    job_env: str | None = None  # the site directory of the job's packages ("" = none)
    strategy: str | None = None  # with --cores-per-worker
    cores_per_worker: int = 1
    runner_keep_alive: int | None = None  # seconds, 0 = off
    runner_yield: bool = True  # False: --no-runner-yield
    gpus_per_worker: int = 0  # GPUs each worker's task asks Spark for; 0 leaves the flag out
    data_stream: str = "auto"  # on/off/auto (docs/training.md, Streaming); auto leaves it out

    @classmethod
    def declared(cls, settings: Mapping[str, Any], master_url: str) -> LaunchSettings:
        """The stack's declared job, from its props' `settings` (infra.program's
        `training_settings`, in the resource's state). A key absent in the state of a run
        launched before it existed, or an empty value, leaves its flag out."""
        keep_alive = settings.get("runner_keep_alive")
        env_sha = settings.get("env_sha")
        return cls(
            master_url=master_url,
            workers=int(settings["workers"]),
            epochs=int(settings["epochs"]),
            batch_size=int(settings["batch_size"]),
            data=settings["data"],
            rows=int(settings["rows"]),
            spark_conf=settings["spark_conf"],
            job_sha=settings.get("job_sha") or "",
            job_params=settings.get("job_params") or "{}",
            job_env=Env(env_sha, (), Path()).site if env_sha else None,
            strategy=settings.get("strategy") or None,
            cores_per_worker=int(settings.get("cores_per_worker") or 1),
            runner_keep_alive=int(keep_alive) if keep_alive else None,
            runner_yield=settings.get("runner_yield") is not False,  # absent: True
            gpus_per_worker=int(settings.get("gpus_per_worker") or 0),
        )

    @classmethod
    def submitted(
        cls, settings: Mapping[str, Any], *, job_sha: str, job_params: str, job_env: str
    ) -> LaunchSettings:
        """A job of `trainstack submit`: `settings` are the stack's `jobDefaults` with the
        command line's overrides; the job's code, parameters and packages' site directory
        ("" without packages) are its own. Every flag is passed, defaults included."""
        return cls(
            master_url=str(settings["master_url"]),
            workers=int(settings["workers"]),
            epochs=int(settings["epochs"]),
            batch_size=int(settings["batch_size"]),
            data=str(settings["data"]),
            rows=int(settings["rows"]),
            spark_conf=str(settings["spark_conf"]),
            job_sha=job_sha,
            job_params=job_params,
            job_env=job_env,
            strategy=str(settings["strategy"]),
            cores_per_worker=int(settings["cores_per_worker"]),
            runner_keep_alive=int(settings.get("runner_keep_alive") or 0),
            runner_yield=bool(settings.get("runner_yield", True)),
            gpus_per_worker=int(settings.get("gpus_per_worker") or 0),
            data_stream=str(settings.get("data_stream") or "auto"),
        )


def train_command(
    settings: LaunchSettings, run_dir: str, *, app_name: str = "", hold_file: str = ""
) -> list[str]:
    """The `trainstack-train` command line of a launch into `run_dir`. `app_name`: the Spark
    application's name ("" = trainstack-train's own); `hold_file`: TEST ONLY, every worker
    waits at an epoch end while it exists (docs/training.md, "Test-only hooks"; "" = off)."""
    s = settings
    command = [
        TRAIN,
        "--master", s.master_url,
        "--workers", str(s.workers),
        "--epochs", str(s.epochs),
        "--batch-size", str(s.batch_size),
        "--data", s.data,
        "--rows", str(s.rows),
        "--spark-conf", s.spark_conf,
    ]  # fmt: skip
    if s.job_sha:
        command += ["--job-dir", f"{JOBS_DIR}/{s.job_sha}", "--job-params", s.job_params]
    if s.job_env is not None:
        command += ["--job-env", s.job_env]
    if s.strategy is not None:
        command += ["--train-strategy", s.strategy, "--cores-per-worker", str(s.cores_per_worker)]
    if s.gpus_per_worker > 0:  # else CPU only, trainstack-train's default
        command += ["--gpus-per-worker", str(s.gpus_per_worker)]
    if s.data_stream != "auto":  # else trainstack-train's default
        command += ["--data-stream", s.data_stream]
    if app_name:
        command += ["--app-name", app_name]
    if s.runner_keep_alive is not None:
        command += ["--runner-keep-alive", str(s.runner_keep_alive)]
    if not s.runner_yield:
        command += ["--no-runner-yield"]
    # The infra's stop of an earlier launch (infra.components.training) matches
    # `--output <run dir>` followed by a space or the end: the hold file comes after it.
    command += ["--output", run_dir]
    if hold_file:
        command += ["--hold-file", hold_file]
    return command
