"""The records `trainstack.Client` returns, typed: a job's, a sweep's, a trial's. Each is the
JSON object the CLI prints with `--json` (a dict at run time, so it prints and serialises as
it is), typed so that an editor and mypy know its fields. Not every field is there in every
state (`ended_at` once it ended, `result` once it succeeded): `total=False`.

Who writes them: a job's record is its run directory's job.json (the queue process,
trainstack_training.queue); a sweep's is its sweep.json with its trials' table (the sweep's
driver, trainstack_training.sweep). The files: trainstack_training.rundir.
"""

from __future__ import annotations

from typing import Any, TypedDict


class JobRecord(TypedDict, total=False):
    id: str
    origin: str  # "submit", "stack" (the declared job) or "sweep" (a trial)
    state: str  # installing, queued, running, succeeded, failed, cancelled, pruned
    priority: int
    submitted_at: float
    started_at: float
    ended_at: float
    heartbeat: float
    job: str  # the job directory it was submitted from
    code_sha: str
    env_sha: str
    params: dict[str, Any]
    mode: str
    framework: str
    node: str
    host: str
    pid: int
    epochs: int
    workers: int
    slots: int
    data: str
    batch_size: int
    strategy: str
    experiment: str
    stack: str
    waiting_for: str
    error: str
    exit_code: int
    result: dict[str, Any]  # the summary: final metrics, time split, model, ...
    tracking: dict[str, Any]  # its MLflow run (run_id, url, ...)
    sweep: str  # a trial's sweep id
    trial: int  # a trial's number in its sweep


class Trial(TypedDict, total=False):
    number: int
    job_id: str
    params: dict[str, Any]  # the swept parameters' values
    state: str  # a job's state, or "lost" (run again)
    value: float | None  # the metric at its last epoch
    epochs: int
    model: str


class BestTrial(TypedDict, total=False):
    number: int
    job_id: str
    value: float
    params: dict[str, Any]
    model: str  # the best trial's model on the shared storage


class SweepRecord(TypedDict, total=False):
    id: str
    state: str  # starting, running, succeeded, failed, cancelled; stopped (driver gone)
    submitted_at: float
    started_at: float
    ended_at: float
    heartbeat: float
    node: str
    host: str
    pid: int
    job: str
    experiment: str
    stack: str
    framework: str
    workers: int
    epochs: int
    priority: int
    params: dict[str, Any]  # the job's [params] with the overrides
    definition: dict[str, Any]  # the [sweep] table, checked (SweepSpec.to_dict)
    describe: dict[str, str]
    trials: list[Trial]
    trials_done: int  # in `sweeps()`, which leaves `trials` out
    best: BestTrial | None
    tracking: dict[str, Any]  # its MLflow parent run
    error: str
