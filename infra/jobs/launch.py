"""The `trainstack-train` command line of a launch: one typed settings object, one builder.

Both launches build it here: the stack's declared job (infra.components.training, a Pulumi
dynamic provider, from its props) and `trainstack submit` (infra.jobs.commands, from the
stack's `jobDefaults` output and the command line's overrides). Each reads its dict once, in
its constructor (`LaunchSettings.declared`, `LaunchSettings.submitted`); `train_command` turns
the typed settings into the flags. Where the two launches pass a flag differently, the
settings say so: a `None` leaves the flag out, and `trainstack-train`'s own default applies
(training/trainstack_training/config.py, TrainConfig).

Both run it under the job runner (`python -m trainstack_training.queue`, `runner_command`):
the queue lock, the job's state, its output; `job_record` is the record both start with
(`<run dir>/job.json`, trainstack_training.rundir), which `trainstack status` and `list` and
the tracking sync read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainstack_training.rundir import INSTALL_SCRIPT

from infra.jobs.envs import Env
from infra.jobs.remote import JOBS_DIR, NODE_VENV, QUEUE_LOCK

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


def runner_command(
    settings: LaunchSettings,
    run_dir: str,
    train: list[str],
    *,
    install: bool,
    tee: bool,
    slots: int = 0,
) -> list[str]:
    """The job runner around a launch's `train` command (trainstack_training.queue): the
    job's record, the queue (admitted when its ranks fit the cluster's `slots`; 0 = unknown:
    one job at a time), the packages' install when `install`; `tee`: the job's output on the
    runner's stdout too (the stack's declared job, run in the foreground)."""
    return [
        f"{NODE_VENV}/bin/python", "-m", "trainstack_training.queue", run_dir,
        "--lock", QUEUE_LOCK, "--epochs", str(settings.epochs),
        *(["--slots", str(slots)] if slots else []),
        *(["--install", f"{run_dir}/{INSTALL_SCRIPT}"] if install else []),
        *(["--tee"] if tee else []),
        "--", *train,
    ]  # fmt: skip


@dataclass(frozen=True)
class JobFacts:
    """What a job is, beside how it trains: where its code came from and what its manifest
    says. `trainstack submit` knows them from the job directory it packs; the stack's declared
    job from its program's read of the same (infra.program), carried in its props."""

    job: str  # the job directory on the machine it was launched from
    code_sha: str
    env_sha: str
    params: Mapping[str, Any]
    mode: str
    framework: str
    experiment: str  # the manifest's MLflow experiment ("" = the stack's)
    stack: str

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> JobFacts:
        return cls(
            job=str(value.get("job") or ""),
            code_sha=str(value.get("code_sha") or ""),
            env_sha=str(value.get("env_sha") or ""),
            params=dict(value.get("params") or {}),
            mode=str(value.get("mode") or ""),
            framework=str(value.get("framework") or ""),
            experiment=str(value.get("experiment") or ""),
            stack=str(value.get("stack") or ""),
        )


def job_record(
    job_id: str,
    settings: LaunchSettings,
    facts: JobFacts,
    *,
    node: str,
    state: str,
    origin: str,
    priority: int = 0,
) -> dict[str, Any]:
    """A job's first record (job.json): a submitted job's (`origin` "submit") and the stack's
    declared job's ("stack") alike; the runner adds its state, times and result to it.
    `priority`: the queue's order (trainstack_training.admission), higher first."""
    return {
        "id": job_id,
        "origin": origin,
        "priority": priority,
        "state": state,
        "submitted_at": time.time(),
        "job": facts.job,
        "code_sha": facts.code_sha,
        "env_sha": facts.env_sha,
        "params": dict(facts.params),
        "mode": facts.mode,
        "framework": facts.framework,
        "node": node,
        "epochs": settings.epochs,
        "workers": settings.workers,
        "data": settings.data,
        "batch_size": settings.batch_size,
        "strategy": settings.strategy or "",
        # The MLflow experiment of its run (tracking): the manifest's, else the stack's.
        "experiment": facts.experiment,
        "stack": facts.stack,
    }
