"""Launch the job on Spark: context, data stage, barrier stage with one task per rank.

The barrier stage is the mechanism of spark-tensorflow-distributor and of Spark's
TorchDistributor, for any framework: each task picks a free port, the tasks exchange
host:port with BarrierTaskContext.allGather, and each rank's backend builds its framework's
cluster settings from the gathered list (TF_CONFIG; torch's MASTER_ADDR, RANK, WORLD_SIZE)
before the framework starts. If a task dies Spark fails and retries the whole barrier stage,
and the ranks resume from their checkpoint on shared storage.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.attempts import count_attempts, record_attempt, record_launch
from trainstack_training.config import OWN_DATA, TrainConfig
from trainstack_training.context import recorded_error
from trainstack_training.data import DataInfo, prepare
from trainstack_training.frameworks import model_file
from trainstack_training.jobsettings import apply_manifest, job_spec
from trainstack_training.manifest import TORCH, JobSpec
from trainstack_training.memwatch import MemoryWatch, memory_failure, wait_for_records
from trainstack_training.ranklog import RankLog
from trainstack_training.rundir import (
    BACKUP_DIR,
    DATA_DIR,
    EPOCH_LOG,
    LAUNCH_LEFTOVERS,
    MEMORY_GLOB,
    METRICS_FILE,
)
from trainstack_training.spark import (
    CancelOnInterrupt,
    ClusterError,
    build_context,
    build_session,
    check_slots,
    context_settings,
    slot_error,
    wait_for_slots,
)

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession


class TrainingError(RuntimeError):
    """The barrier stage failed more often than max_attempts allows."""


class JobCodeError(TrainingError):
    """The job's own code raised; the message is the user's error and their frames."""


class RankMemoryError(TrainingError):
    """The kernel's OOM killer ended a rank; the message names it, its peak and the limit."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def barrier_task(cfg_json: str, info_json: str, spec_json: str) -> Any:
    """Build the function each barrier task runs (closure over plain JSON strings): the run's
    settings, the data stage's result, and the job's spec as the driver checked it (a rank
    does not read the manifest again)."""

    def run(_: Iterator[int]) -> Iterator[str]:
        started = time.time()
        from pyspark import BarrierTaskContext

        from trainstack_training.config import TrainConfig
        from trainstack_training.data import DataInfo
        from trainstack_training.manifest import JobSpec
        from trainstack_training.train import run_worker

        ctx = BarrierTaskContext.get()
        cfg = TrainConfig.from_dict(json.loads(cfg_json))
        info = DataInfo.from_json(info_json)
        spec = JobSpec.from_json(spec_json)
        index = ctx.partitionId()
        host = ctx.getTaskInfos()[index].address.rsplit(":", 1)[0]
        if index == 0:
            # One line per barrier-stage attempt: the metrics report how many it took.
            record_attempt(Path(cfg.output).resolve(), host)
        # allGather returns the messages ordered by partition id = TF task index.
        peers = ctx.allGather(f"{host}:{_free_port()}")
        attempt = count_attempts(Path(cfg.output).resolve())
        # The watcher first: it inherits the executor's stderr, not the rank log's pipe.
        with (
            MemoryWatch(Path(cfg.output).resolve(), index, attempt, host),
            RankLog(Path(cfg.output).resolve(), index, attempt, host),
        ):
            result = run_worker(
                cfg,
                info,
                spec,
                index,
                list(peers),
                cores=ctx.cpus(),
                attempt=attempt,
                host=host,
                started=started,
                gpus=list(ctx.resources()["gpu"].addresses) if cfg.gpus_per_worker else [],
            )
        yield json.dumps(asdict(result))

    return run


def run_barrier(
    sc: SparkContext,
    cfg: TrainConfig,
    info: DataInfo,
    spec: JobSpec,
    cancel: CancelOnInterrupt | None = None,
) -> list[dict[str, Any]]:
    cfg_json = json.dumps(cfg.to_dict())
    rdd = sc.parallelize(range(cfg.workers), cfg.workers)
    # Spark retries a failed barrier stage only if it is a shuffle map stage ("Could not
    # recover from a failed barrier ResultStage" otherwise): a shuffle after it makes it one.
    stage = rdd.barrier().mapPartitions(barrier_task(cfg_json, info.to_json(), spec.to_json()))
    try:
        rows = stage.repartition(1).collect()
    except Exception as exc:
        if cancel is not None:
            cancel.check()
        refused = slot_error(exc, cfg)
        if refused:  # the training stage checks slots too (see run(): small inputs)
            raise refused from exc
        out = Path(cfg.output)
        # A rank killed for memory in the last attempt is the news, whatever its peers raised
        # when it vanished; in an earlier one, unless the job's code raised since.
        user_error = recorded_error(out)
        wait_for_records(out, count_attempts(out), cfg.workers)
        oom = memory_failure(out, in_attempt=count_attempts(out))
        oom = oom or (None if user_error else memory_failure(out))
        if oom:
            print(f"trainstack: the barrier stage failed; Spark: {exc}", file=sys.stderr)
            raise RankMemoryError(oom) from None
        if user_error:  # the job's code raised: its error, not Spark's retries, is the news
            raise JobCodeError(user_error) from None
        text = str(exc)
        reason = next((ln.strip() for ln in text.splitlines() if "Exception" in ln), "")
        raise TrainingError(
            f"training failed after {count_attempts(Path(cfg.output))} barrier-stage attempt(s) "
            f"(max_attempts={cfg.max_attempts}); the checkpoint in {cfg.output}/backup is "
            f"kept, so rerunning the same command resumes from it. Spark: {reason[:500]}"
        ) from exc
    return sorted((json.loads(r) for r in rows), key=lambda r: r["task_index"])


def _prepare_run(cfg: TrainConfig) -> tuple[JobSpec, Path]:
    """The run directory made ready for this launch, the job's code checked before Spark
    starts (a bad manifest, a missing entry function or a syntax error is one sentence, and
    nothing runs) and its manifest applied; the spec and the run directory."""
    cfg.validate()
    if cfg.job_dir:  # the tasks need the absolute shared path
        cfg.job_dir = str(Path(cfg.job_dir).resolve())
    out = Path(cfg.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg.output = str(out)  # the tasks need the absolute shared path
    # A launch of the run starts here, also one that fails on its code below (its
    # failed.json then names the error). A backup/ left by an interrupted run is kept on
    # purpose: the new run resumes from it, and then the epoch log of the earlier epochs is
    # kept too (and its launch stamp: the same MLflow run goes on). A run started afresh in
    # the directory of an earlier one (the stack's declared job launched again) drops that
    # run's epochs and result, and is a launch, and an MLflow run, of its own.
    stale = list(LAUNCH_LEFTOVERS)
    fresh = not _has_backup(out)
    if fresh:
        stale += [EPOCH_LOG, METRICS_FILE]
    for name in stale:
        (out / name).unlink(missing_ok=True)
    for path in out.glob(MEMORY_GLOB):  # attempts count from 1 again
        path.unlink(missing_ok=True)
    record_launch(out, fresh=fresh)
    # The launch's one read of the manifest: the run's framework, label and task are decided
    # here and carried (cfg, and the spec's JSON to each barrier task); no rank reads it again.
    spec = job_spec(cfg)
    apply_manifest(cfg, spec)
    if cfg.gpus_per_worker and spec.framework != TORCH:
        raise ClusterError(
            f"gpus_per_worker={cfg.gpus_per_worker}: GPUs train torch jobs only; the nodes run "
            "TensorFlow's CPU build (set gpus_per_worker=0 for this job)"
        )
    if cfg.master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return spec, out


@dataclass(frozen=True)
class Clock:
    """When the job started (perf_counter and wall clock), and its seconds before the barrier
    stage and in it."""

    start: float
    started_at: float
    before_barrier: float
    train_seconds: float


def _report(
    cfg: TrainConfig,
    spec: JobSpec,
    info: DataInfo,
    results: list[dict[str, Any]],
    out: Path,
    phases: dict[str, float],
    clock: Clock,
    application: tuple[str, str],
) -> dict[str, Any]:
    """metrics.json, curves.png and the summary's numbers of a job whose code succeeded: a
    failure here names the saved model instead of losing it behind a traceback."""
    from trainstack_training.report import after_training, build_metrics, time_split, write_outputs

    with after_training(out, model_file(spec.framework)):
        mark = time.perf_counter()
        metrics = build_metrics(
            cfg,
            info,
            results,
            out,
            clock.train_seconds,
            time.perf_counter() - clock.start,
            spec.metric,
        )
        write_outputs(metrics, out, plot=cfg.plot)
        phases["report"] = time.perf_counter() - mark
        metrics["total_seconds"] = time.perf_counter() - clock.start
        metrics["started_at"] = clock.started_at  # wall clock, as first_step_at
        # Where the job's Spark application came from: its own, or the warm runner's; and
        # its id (the MLflow run's tag, tracking/runfiles.py).
        metrics["spark_application"], metrics["spark_application_id"] = application
        metrics["experiment"] = spec.experiment  # the manifest's MLflow experiment, or ""
        metrics["params"] = spec.params  # [params] with the overrides (the MLflow run's params)
        metrics["framework"] = spec.framework
        metrics["mode"] = spec.mode  # simple or full (the MLflow run's tag)
        metrics["job_phases"] = {**phases, **info.phases}
        # The data stage's own work: its time less the Spark start-up done inside it.
        data_work = (
            info.seconds - phases.get("spark_sql_session", 0.0) - phases.get("slot_check", 0.0)
        )
        metrics["time_split"] = time_split(
            metrics["total_seconds"],
            clock.before_barrier,
            data_work,
            clock.train_seconds,
            metrics["worker_timings"],
        )
        metrics["training_share"] = round(
            metrics["time_split"]["training"] / metrics["total_seconds"], 3
        )
        write_outputs(metrics, out, plot=False)  # with the report's own time
    return metrics


def run(cfg: TrainConfig) -> dict[str, Any]:
    """The whole job: returns the metrics dict (also written to <output>/metrics.json)."""
    spec, out = _prepare_run(cfg)
    start = time.perf_counter()
    started_at = time.time()
    phases: dict[str, float] = {}
    attached = None
    if cfg.runner_keep_alive > 0:
        from trainstack_training.warm import WarmRunnerError, attach

        try:
            attached = attach(cfg, context_settings(cfg))
        except WarmRunnerError as exc:
            raise ClusterError(str(exc)) from None
        sc = attached.sc
    else:
        sc = build_context(cfg)
    phases["spark_context"] = time.perf_counter() - start
    app_id = str(sc.applicationId)
    cancel = CancelOnInterrupt(sc, attached.group if attached else "").__enter__()
    try:

        def session() -> SparkSession:
            mark = time.perf_counter()
            spark = build_session(cfg)
            phases["spark_sql_session"] = time.perf_counter() - mark
            return spark

        def slot_check() -> None:
            mark = time.perf_counter()
            queued = wait_for_slots(sc, cfg, attached.since if attached else 0.0, cancel)
            phases["queued_for_cores"] = queued  # behind other applications
            cancel.check()
            check_slots(sc, cfg)
            phases["slot_check"] = time.perf_counter() - mark

        # Before a distributed data stage, a separate barrier job fails fast when slots are
        # missing, before any data is read. A small input skips it: the training stage's own
        # slot check fails just as fast.
        if spec.reads_own_data:  # data = "none": nothing to read, no Spark SQL
            info = no_data_stage(cfg, spec)
        else:
            info = prepare(session, cfg, out / DATA_DIR, before_distributed=slot_check)
        mark = time.perf_counter()
        queued = wait_for_slots(sc, cfg, attached.since if attached else 0.0, cancel)
        phases["queued_for_cores"] = phases.get("queued_for_cores", 0.0) + queued
        phases["spark_executors"] = time.perf_counter() - mark
        train_start = time.perf_counter()
        before_barrier = train_start - start
        barrier_started = time.time()
        cancel.check()
        results = run_barrier(sc, cfg, info, spec, cancel)
        cancel.check()
        train_seconds = time.perf_counter() - train_start
        for r in results:  # when each task's Python started, from the barrier stage's start
            r["timings"]["task_launch"] = r["timings"].pop("task_start_at") - barrier_started
    finally:
        mark = time.perf_counter()
        cancel.__exit__()
        if attached:  # the warm runner's context stays up for the next job
            attached.detach()
        else:
            sc.stop()
        phases["spark_stop"] = time.perf_counter() - mark
    # The job succeeded: nothing is left to resume (BackupAndRestore deleted its checkpoints
    # already, leaving the empty directories; torch's checkpoint and a full-mode job's own
    # files stay until here).
    shutil.rmtree(out / BACKUP_DIR, ignore_errors=True)
    return _report(
        cfg, spec, info, results, out, phases,
        Clock(start, started_at, before_barrier, train_seconds),
        (attached.mode if attached else "own", app_id),
    )  # fmt: skip


def no_data_stage(cfg: TrainConfig, spec: JobSpec) -> DataInfo:
    """What a job that reads its own data (its manifest's `data = "none"`) gets instead of the
    data stage, which does not run: no rows (an empty shard per rank, so steps_per_epoch is
    0), no features or classes, and the manifest's task ("" when it names none: the result
    then has no task)."""
    print(
        '[trainstack] no data stage: the job reads its own data (data = "none" in its manifest)',
        file=sys.stderr,
        flush=True,
    )
    return DataInfo(
        train_dir="", val_dir="", n_features=0, n_classes=0, feature_cols=[],
        shard_rows=[0] * cfg.workers, val_rows=0, total_rows=0, seconds=0.0, path=OWN_DATA,
        task=spec.task,
    )  # fmt: skip


def _has_backup(out: Path) -> bool:
    backup = out / BACKUP_DIR
    return backup.is_dir() and any(p.is_file() for p in backup.rglob("*"))
