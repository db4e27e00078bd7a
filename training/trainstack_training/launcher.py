"""Launch the job on Spark: session, data stage, barrier stage with one task per TF worker.

The barrier stage is the mechanism of spark-tensorflow-distributor, written for current Spark
and TensorFlow: each task picks a free port, the tasks exchange host:port with
BarrierTaskContext.allGather, and each builds TF_CONFIG from the gathered list before importing
TensorFlow. If a task dies Spark fails and retries the whole barrier stage, and the workers
resume from the BackupAndRestore checkpoint on shared storage.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo, prepare
from trainstack_training.train import EPOCH_LOG

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ATTEMPTS_LOG = "attempts.log"
_LOCAL = re.compile(r"^local\[(\d+|\*)\]$")


class ClusterError(RuntimeError):
    """The cluster cannot run the job (e.g. too few free slots); the message says why."""


class TrainingError(RuntimeError):
    """The barrier stage failed more often than max_attempts allows."""


def effective_master(cfg: TrainConfig) -> str:
    """local[N] never retries a failed task; local[N,F] does, like a real cluster."""
    m = _LOCAL.match(cfg.master)
    return f"local[{m.group(1)},{cfg.max_attempts}]" if m else cfg.master


def build_session(cfg: TrainConfig) -> SparkSession:
    from pyspark.sql import SparkSession

    master = effective_master(cfg)
    builder = (
        SparkSession.builder.master(master)
        .appName(cfg.app_name)
        # TF sets up its collectives once per process: a reused Python worker would hang in a
        # second barrier job. Fresh workers also make TF_CONFIG-before-import hold.
        .config("spark.python.worker.reuse", "false")
        .config("spark.task.cpus", str(cfg.cores_per_worker))
        # Fail fast (not after the default 10 minutes) when the barrier stage cannot get one
        # slot per worker: check every second, give up after slot_wait_seconds checks.
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        .config(
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures",
            str(cfg.slot_wait_seconds),
        )
        .config("spark.stage.maxConsecutiveAttempts", str(cfg.max_attempts))
        .config("spark.task.maxFailures", str(cfg.max_attempts))
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master.startswith("local"):
        # One machine: the executors are this process's children, so use this interpreter.
        builder = builder.config("spark.pyspark.python", sys.executable)
        builder = builder.config("spark.pyspark.driver.python", sys.executable)
        builder = builder.config("spark.ui.enabled", "false")
    for key, value in cfg.spark_settings().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def check_slots(spark: SparkSession, cfg: TrainConfig) -> None:
    """A no-op barrier job with one task per worker: fails within slot_wait_seconds when the
    cluster lacks free slots, before any data is read."""

    def noop(it: Iterable[int]) -> Iterator[int]:
        yield sum(1 for _ in it)

    rdd = spark.sparkContext.parallelize(range(cfg.workers), cfg.workers)
    try:
        rdd.barrier().mapPartitions(noop).collect()
    except Exception as exc:
        slot_error = _slot_error(exc, cfg)
        if slot_error:
            raise slot_error from exc
        raise


def _slot_error(exc: BaseException, cfg: TrainConfig) -> ClusterError | None:
    """The ClusterError for Spark's "not enough slots for a barrier stage", else None."""
    text = str(exc)
    if "BARRIER" in text.upper() and (
        "slots" in text or "maxConcurrentTasks" in text or "SPARK-24819" in text
    ):
        return ClusterError(
            f"the cluster at {cfg.master!r} has fewer free task slots than workers="
            f"{cfg.workers} (each worker needs one slot of cores_per_worker="
            f"{cfg.cores_per_worker} cores, all at once, for the barrier stage); "
            "use fewer workers or add executors/cores"
        )
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def barrier_task(cfg_json: str, info_json: str) -> Any:
    """Build the function each barrier task runs (closure over plain JSON strings)."""

    def run(_: Iterator[int]) -> Iterator[str]:
        started = time.time()
        from pyspark import BarrierTaskContext

        from trainstack_training.config import TrainConfig
        from trainstack_training.data import DataInfo
        from trainstack_training.train import run_worker

        ctx = BarrierTaskContext.get()
        cfg = TrainConfig.from_dict(json.loads(cfg_json))
        info = DataInfo.from_json(info_json)
        index = ctx.partitionId()
        host = ctx.getTaskInfos()[index].address.rsplit(":", 1)[0]
        if index == 0:
            # One line per barrier-stage attempt: the metrics report how many it took.
            with (Path(cfg.output).resolve() / ATTEMPTS_LOG).open("a") as fh:
                fh.write(f"{time.time():.3f} {host}\n")
        # allGather returns the messages ordered by partition id = TF task index.
        peers = ctx.allGather(f"{host}:{_free_port()}")
        attempt = count_attempts(Path(cfg.output).resolve())
        tf_config = None
        if cfg.workers > 1:
            tf_config = {"cluster": {"worker": peers}, "task": {"type": "worker", "index": index}}
        result = run_worker(
            cfg,
            info,
            index,
            tf_config,
            cores=ctx.cpus(),
            attempt=attempt,
            host=host,
            started=started,
        )
        yield json.dumps(asdict(result))

    return run


def run_barrier(spark: SparkSession, cfg: TrainConfig, info: DataInfo) -> list[dict[str, Any]]:
    cfg_json = json.dumps(cfg.to_dict())
    rdd = spark.sparkContext.parallelize(range(cfg.workers), cfg.workers)
    # Spark retries a failed barrier stage only if it is a shuffle map stage ("Could not
    # recover from a failed barrier ResultStage" otherwise): a shuffle after it makes it one.
    stage = rdd.barrier().mapPartitions(barrier_task(cfg_json, info.to_json()))
    try:
        rows = stage.repartition(1).collect()
    except Exception as exc:
        slot_error = _slot_error(exc, cfg)
        if slot_error:  # the training stage checks slots too (see run(): small inputs)
            raise slot_error from exc
        text = str(exc)
        reason = next((ln.strip() for ln in text.splitlines() if "Exception" in ln), "")
        raise TrainingError(
            f"training failed after {count_attempts(Path(cfg.output))} barrier-stage attempt(s) "
            f"(max_attempts={cfg.max_attempts}); the checkpoint in {cfg.output}/backup is "
            f"kept, so rerunning the same command resumes from it. Spark: {reason[:500]}"
        ) from exc
    return sorted((json.loads(r) for r in rows), key=lambda r: r["task_index"])


def run(cfg: TrainConfig) -> dict[str, Any]:
    """The whole job: returns the metrics dict (also written to <output>/metrics.json)."""
    from trainstack_training.report import build_metrics, write_outputs

    cfg.validate()
    out = Path(cfg.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg.output = str(out)  # the tasks need the absolute shared path
    # A backup/ left by an interrupted run is kept on purpose: the new run resumes from it,
    # and then the epoch log of the earlier epochs is kept too.
    stale = [ATTEMPTS_LOG, ".fault-injected"]
    if not _has_backup(out):
        stale.append(EPOCH_LOG)
    for name in stale:
        (out / name).unlink(missing_ok=True)
    if cfg.master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    start = time.perf_counter()
    phases: dict[str, float] = {}
    spark = build_session(cfg)
    phases["spark_session"] = time.perf_counter() - start
    try:

        def slot_check() -> None:
            mark = time.perf_counter()
            check_slots(spark, cfg)
            phases["slot_check"] = time.perf_counter() - mark

        # Before a distributed data stage, a separate barrier job fails fast when slots are
        # missing, before any data is read. A small input (prepared in the driver after one
        # read job) skips it: the training stage's own slot check fails just as fast.
        info = prepare(spark, cfg, out / "data", before_distributed=slot_check)
        train_start = time.perf_counter()
        barrier_started = time.time()
        results = run_barrier(spark, cfg, info)
        train_seconds = time.perf_counter() - train_start
        for r in results:  # when each task's Python started, from the barrier stage's start
            r["timings"]["task_launch"] = r["timings"].pop("task_start_at") - barrier_started
    finally:
        mark = time.perf_counter()
        spark.stop()
        phases["spark_stop"] = time.perf_counter() - mark
    if not _has_backup(out):
        # BackupAndRestore deletes its checkpoints on success but leaves the empty directories.
        shutil.rmtree(out / "backup", ignore_errors=True)
    mark = time.perf_counter()
    metrics = build_metrics(cfg, info, results, out, train_seconds, time.perf_counter() - start)
    write_outputs(metrics, out, plot=cfg.plot)
    phases["report"] = time.perf_counter() - mark
    metrics["total_seconds"] = time.perf_counter() - start
    metrics["job_phases"] = {**phases, **info.phases}
    write_outputs(metrics, out, plot=False)  # with the report's own time
    return metrics


def _has_backup(out: Path) -> bool:
    backup = out / "backup"
    return backup.is_dir() and any(p.is_file() for p in backup.rglob("*"))


def count_attempts(out: Path) -> int:
    log = out / ATTEMPTS_LOG
    return len(log.read_text().splitlines()) if log.exists() else 0
