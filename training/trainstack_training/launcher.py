"""Launch the job on Spark: context, data stage, barrier stage with one task per TF worker.

The barrier stage is the mechanism of spark-tensorflow-distributor, written for current Spark
and TensorFlow: each task picks a free port, the tasks exchange host:port with
BarrierTaskContext.allGather, and each builds TF_CONFIG from the gathered list before importing
TensorFlow. If a task dies Spark fails and retries the whole barrier stage, and the workers
resume from the BackupAndRestore checkpoint on shared storage.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.attempts import ATTEMPTS_LOG, count_attempts, record_attempt
from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo, prepare
from trainstack_training.job import ERROR_FILE, apply_manifest, recorded_error
from trainstack_training.ranklog import RankLog
from trainstack_training.sparkmaster import WAITING_FILE, Application, alive_master
from trainstack_training.train import EPOCH_LOG, job_spec

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

_LOCAL = re.compile(r"^local\[(\d+|\*)\]$")


class ClusterError(RuntimeError):
    """The cluster cannot run the job (e.g. too few free slots); the message says why."""


class TrainingError(RuntimeError):
    """The barrier stage failed more often than max_attempts allows."""


class JobCodeError(TrainingError):
    """The job's own code raised; the message is the user's error and their frames."""


class JobCancelledError(RuntimeError):
    """SIGINT (`trainstack cancel`): the job's Spark jobs were cancelled and it stopped."""


class CancelOnInterrupt:
    """SIGINT cancels the context's Spark jobs, the way PySpark's own handler does, but
    without raising inside a Py4J call (which leaves a traceback in the log and turns the
    cancel into a "network" error): a thread cancels every job Spark runs until the driver
    has stopped, and the driver then raises JobCancelledError where the job was waiting."""

    def __init__(self, sc: SparkContext, group: str = "") -> None:
        self.sc = sc
        self.group = group  # in a warm runner: only this job's Spark jobs
        self.requested = threading.Event()
        self.stopped = threading.Event()

    def __enter__(self) -> CancelOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self.on_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if hasattr(self, "previous"):
            signal.signal(signal.SIGINT, self.previous)

    def on_interrupt(self, signum: int, frame: Any) -> None:
        del signum, frame
        if not self.requested.is_set():
            self.requested.set()
            threading.Thread(target=self.cancel_jobs, daemon=True).start()

    def cancel_jobs(self) -> None:
        while not self.stopped.is_set():
            with contextlib.suppress(Exception):  # the context may be stopping meanwhile
                if self.group:
                    self.sc.cancelJobGroup(self.group)
                else:
                    self.sc.cancelAllJobs()
            self.stopped.wait(1.0)

    def check(self) -> None:
        """Raise JobCancelledError once a cancel was asked for."""
        if self.requested.is_set():
            raise JobCancelledError("cancelled: the job's Spark jobs were cancelled")


def effective_master(cfg: TrainConfig) -> str:
    """local[N] never retries a failed task; local[N,F] does, like a real cluster."""
    m = _LOCAL.match(cfg.master)
    return f"local[{m.group(1)},{cfg.max_attempts}]" if m else cfg.master


def context_settings(cfg: TrainConfig) -> dict[str, str]:
    """The job's Spark settings (without the application name): what its context is built
    with, and what a warm runner's context must have been built with for the job to run in it
    (trainstack_training.warm)."""
    master = effective_master(cfg)
    settings = {
        "spark.master": master,
        # TF sets up its collectives once per process: a reused Python worker would hang in a
        # second barrier job. Fresh workers also make TF_CONFIG-before-import hold.
        "spark.python.worker.reuse": "false",
        "spark.task.cpus": str(cfg.cores_per_worker),
        # Fail fast (not after the default 10 minutes) when the barrier stage cannot get one
        # slot per worker: check every second, give up after slot_wait_seconds checks.
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": str(cfg.slot_wait_seconds),
        "spark.stage.maxConsecutiveAttempts": str(cfg.max_attempts),
        "spark.task.maxFailures": str(cfg.max_attempts),
        "spark.ui.showConsoleProgress": "false",
    }
    if master.startswith("local"):
        # One machine: the executors are this process's children, so use this interpreter.
        settings["spark.pyspark.python"] = sys.executable
        settings["spark.pyspark.driver.python"] = sys.executable
        settings["spark.ui.enabled"] = "false"
    if cfg.runner_keep_alive > 0:
        # In the warm runner, a task's worker is forked from a daemon that has imported
        # TensorFlow once (its runtime not started): it starts with the import paid
        # (trainstack_training.daemon).
        settings["spark.python.daemon.module"] = "trainstack_training.daemon"
    return {**settings, **cfg.spark_settings()}


def build_context(cfg: TrainConfig, app_name: str = "") -> SparkContext:
    """The job's SparkContext: all the barrier stage needs. Spark SQL (`build_session`) starts
    only when the data stage needs it."""
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAppName(app_name or cfg.app_name)
    for key, value in context_settings(cfg).items():
        conf.set(key, value)
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    return sc


def build_session(cfg: TrainConfig) -> SparkSession:
    """A Spark SQL session on the job's context (`build_context`)."""
    from pyspark.sql import SparkSession

    build_context(cfg)
    return SparkSession.builder.getOrCreate()


# How long the job waits for its first executor, as Spark's barrier scheduling waits by
# default (15 s x 40 checks). A standby master that has just taken over schedules nothing
# until its recovery ends (`spark.worker.timeout`, 60 s by default).
FIRST_EXECUTOR_WAIT_SECONDS = 600


def wait_for_slots(
    sc: SparkContext, cfg: TrainConfig, since: float = 0.0, cancel: CancelOnInterrupt | None = None
) -> float:
    """Wait until the executors give one slot per worker. The executors start while the
    data stage runs; waiting here keeps their registration out of the training stage's time
    (their first task's start-up is still in it).

    While another application holds cores (the ALIVE master says which), the job is queued
    behind it, as any Spark application is: it says so once per holder, on stderr and in
    ``<output>/waiting.json`` (`trainstack status` shows it), and waits without a limit,
    since the cores come back when that application ends. Otherwise, once some executors are
    there, wait as Spark itself waits for resources before it schedules
    (`spark.scheduler.maxRegisteredResourcesWaitingTime`, from the context's start, or from
    `since` when the job joined a context that was already up (a warm runner); while there
    are none, up to FIRST_EXECUTOR_WAIT_SECONDS. A cluster that never has the slots is left
    to the barrier stage's own check, which fails with a ClusterError.

    Returns the seconds the job was queued behind other applications."""
    if effective_master(cfg).startswith("local"):
        return 0.0
    jsc = sc._jsc.sc()  # no Python API for the slot count
    queue = CoreQueue(cfg, sc.applicationId)
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        started = max(jsc.startTime() / 1000, since)
        registered_wait = (
            jsc.conf().getTimeAsMs("spark.scheduler.maxRegisteredResourcesWaitingTime", "30s")
            / 1000
        )
        told = 0
        while (slots := jsc.maxNumConcurrentTasks(profile)) < cfg.workers:
            if cancel is not None and cancel.requested.is_set():
                break  # the caller's cancel.check() raises
            if queue.held_elsewhere():
                started = time.time()  # the wait for executors starts when the cores are free
                told = 0
                time.sleep(0.2)
                continue
            waited = time.time() - started
            if waited >= (registered_wait if slots else FIRST_EXECUTOR_WAIT_SECONDS):
                break
            if waited >= told + 15:  # as Spark's "Initial job has not accepted any resources"
                told = int(waited)
                print(
                    f"waiting for executors: {slots} of {cfg.workers} task slots after "
                    f"{told} s (check the Spark master's UI for workers and free cores)",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(0.2)
    except Exception:  # an internal API changed: the barrier check still holds
        pass
    finally:
        queue.done()
    return queue.queued_seconds


class CoreQueue:
    """What a job whose application lacks executors waits for: the cores that other
    applications hold, from the ALIVE master's JSON page (asked every CHECK_SECONDS)."""

    CHECK_SECONDS = 2.0

    def __init__(self, cfg: TrainConfig, app_id: str) -> None:
        self.cfg, self.app_id = cfg, app_id
        self.file = Path(cfg.output) / WAITING_FILE
        self.checked = 0.0
        self.holders: list[Application] = []
        self.said = ""
        self.since = 0.0  # when the job was last seen queued
        self.queued_seconds = 0.0

    def held_elsewhere(self) -> bool:
        """Whether other applications hold cores while this one has too few (told once per
        change of holders)."""
        if time.monotonic() - self.checked >= self.CHECK_SECONDS:
            self.checked = time.monotonic()
            view = alive_master(self.cfg.master, self.cfg.master_ui_port)
            # No free core for this application: the cores it waits for are the others'.
            self.holders = view.holders(self.app_id) if view and view.free_cores == 0 else []
            reason = (
                "queued: waiting for cores held by " + ", ".join(map(str, self.holders))
                if self.holders
                else ""
            )
            if reason and not self.said:
                self.since = time.monotonic()
            if reason and reason != self.said:
                self.said = reason
                print(f"[trainstack] {reason}", file=sys.stderr, flush=True)
                with contextlib.suppress(OSError):
                    self.file.write_text(json.dumps({"reason": reason, "since": time.time()}))
            elif not reason:
                self.done()
        return bool(self.holders)

    def done(self) -> None:
        """The job is no longer queued (if it was): say so and remove waiting.json."""
        if not self.said:
            return
        self.queued_seconds += time.monotonic() - self.since
        print("[trainstack] the cores are free: the job goes on", file=sys.stderr, flush=True)
        self.said = ""
        self.file.unlink(missing_ok=True)


def check_slots(sc: SparkContext, cfg: TrainConfig) -> None:
    """A no-op barrier job with one task per worker: fails within slot_wait_seconds when the
    cluster lacks free slots, before any data is read."""

    def noop(it: Iterable[int]) -> Iterator[int]:
        yield sum(1 for _ in it)

    rdd = sc.parallelize(range(cfg.workers), cfg.workers)
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
            record_attempt(Path(cfg.output).resolve(), host)
        # allGather returns the messages ordered by partition id = TF task index.
        peers = ctx.allGather(f"{host}:{_free_port()}")
        attempt = count_attempts(Path(cfg.output).resolve())
        tf_config = None
        if cfg.workers > 1:
            tf_config = {"cluster": {"worker": peers}, "task": {"type": "worker", "index": index}}
        with RankLog(Path(cfg.output).resolve(), index, attempt, host):
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


def run_barrier(
    sc: SparkContext, cfg: TrainConfig, info: DataInfo, cancel: CancelOnInterrupt | None = None
) -> list[dict[str, Any]]:
    cfg_json = json.dumps(cfg.to_dict())
    rdd = sc.parallelize(range(cfg.workers), cfg.workers)
    # Spark retries a failed barrier stage only if it is a shuffle map stage ("Could not
    # recover from a failed barrier ResultStage" otherwise): a shuffle after it makes it one.
    stage = rdd.barrier().mapPartitions(barrier_task(cfg_json, info.to_json()))
    try:
        rows = stage.repartition(1).collect()
    except Exception as exc:
        if cancel is not None:
            cancel.check()
        slot_error = _slot_error(exc, cfg)
        if slot_error:  # the training stage checks slots too (see run(): small inputs)
            raise slot_error from exc
        user_error = recorded_error(Path(cfg.output))
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


def run(cfg: TrainConfig) -> dict[str, Any]:
    """The whole job: returns the metrics dict (also written to <output>/metrics.json)."""
    from trainstack_training.report import (
        after_training,
        build_metrics,
        time_split,
        write_outputs,
    )

    cfg.validate()
    # The job's code: checked here, before Spark starts (a bad manifest, a missing entry
    # function or a syntax error is one sentence, and nothing runs).
    if cfg.job_dir:  # the tasks need the absolute shared path
        cfg.job_dir = str(Path(cfg.job_dir).resolve())
    spec = job_spec(cfg)
    apply_manifest(cfg, spec)  # its label and task, for the data stage
    out = Path(cfg.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg.output = str(out)  # the tasks need the absolute shared path
    # A backup/ left by an interrupted run is kept on purpose: the new run resumes from it,
    # and then the epoch log of the earlier epochs is kept too.
    stale = [ATTEMPTS_LOG, ".fault-injected", ERROR_FILE, WAITING_FILE]
    if not _has_backup(out):
        stale.append(EPOCH_LOG)
    for name in stale:
        (out / name).unlink(missing_ok=True)
    if cfg.master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
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
        info = prepare(session, cfg, out / "data", before_distributed=slot_check)
        mark = time.perf_counter()
        queued = wait_for_slots(sc, cfg, attached.since if attached else 0.0, cancel)
        phases["queued_for_cores"] = phases.get("queued_for_cores", 0.0) + queued
        phases["spark_executors"] = time.perf_counter() - mark
        train_start = time.perf_counter()
        before_barrier = train_start - start
        barrier_started = time.time()
        cancel.check()
        results = run_barrier(sc, cfg, info, cancel)
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
    if not _has_backup(out):
        # BackupAndRestore deletes its checkpoints on success but leaves the empty directories.
        shutil.rmtree(out / "backup", ignore_errors=True)
    # The user's code succeeded: a failure of trainstack's own report from here on names the
    # saved model instead of losing it behind a traceback.
    with after_training(out):
        mark = time.perf_counter()
        metrics = build_metrics(
            cfg, info, results, out, train_seconds, time.perf_counter() - start, spec.metric
        )
        write_outputs(metrics, out, plot=cfg.plot)
        phases["report"] = time.perf_counter() - mark
        metrics["total_seconds"] = time.perf_counter() - start
        metrics["started_at"] = started_at  # wall clock, as first_step_at
        # Where the job's Spark application came from: its own, or the warm runner's.
        metrics["spark_application"] = attached.mode if attached else "own"
        metrics["job_phases"] = {**phases, **info.phases}
        # The data stage's own work: its time less the Spark start-up done inside it.
        data_work = (
            info.seconds - phases.get("spark_sql_session", 0.0) - phases.get("slot_check", 0.0)
        )
        metrics["time_split"] = time_split(
            metrics["total_seconds"],
            before_barrier,
            data_work,
            train_seconds,
            metrics["worker_timings"],
        )
        metrics["training_share"] = round(
            metrics["time_split"]["training"] / metrics["total_seconds"], 3
        )
        write_outputs(metrics, out, plot=False)  # with the report's own time
    return metrics


def _has_backup(out: Path) -> bool:
    backup = out / "backup"
    return backup.is_dir() and any(p.is_file() for p in backup.rglob("*"))
