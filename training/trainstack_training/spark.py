"""The job's Spark side, whatever its framework: the context and its settings, the wait for
executors (queued behind other applications), the barrier slot check, and the cancel on
SIGINT. The launcher (the barrier stage) and the warm runner (a context kept up between
jobs) both build on it; it imports neither.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.config import TrainConfig
from trainstack_training.daemon import PRELOAD_ENV, PRELOAD_SITE_ENV
from trainstack_training.rundir import WAITING_FILE, write_json
from trainstack_training.sparkmaster import Application, alive_master

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

_LOCAL = re.compile(r"^local\[(\d+|\*)\]$")


class ClusterError(RuntimeError):
    """The cluster cannot run the job (e.g. too few free slots); the message says why."""


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
    if cfg.gpus_per_worker > 0:
        # Spark's GPU scheduling (standalone: the workers discover their GPUs with
        # spark.worker.resource.gpu.discoveryScript); each barrier task gets its addresses.
        settings["spark.task.resource.gpu.amount"] = str(cfg.gpus_per_worker)
        settings["spark.executor.resource.gpu.amount"] = str(cfg.gpus_per_worker)
    if cfg.runner_keep_alive > 0:
        # In the warm runner, a task's worker is forked from a daemon that has imported the
        # job's framework once (TensorFlow's runtime not started): it starts with the import
        # paid (trainstack_training.daemon). Never both in one process: torch's triton and
        # TensorFlow each carry LLVM, and loading the second aborts the process.
        settings["spark.python.daemon.module"] = "trainstack_training.daemon"
        # Several jobs in flight in one runner share its slots, each in a pool of its own
        # (warm.client.attach), instead of the first one's stages going before all others'.
        settings["spark.scheduler.mode"] = "FAIR"
        settings[f"spark.executorEnv.{PRELOAD_ENV}"] = cfg.framework
        if cfg.framework == "torch":
            settings[f"spark.executorEnv.{PRELOAD_SITE_ENV}"] = cfg.job_env
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
    are none, or while the master has granted the cores of every worker and their executors
    are still starting, up to FIRST_EXECUTOR_WAIT_SECONDS. A cluster that never has the
    slots is left to the barrier stage's own check, which fails with a ClusterError.

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
            # The master has granted this application the cores of every worker: the
            # executors are starting (a JVM each, slow on a loaded machine); or the workers
            # registered with the master have fewer cores than the job needs: a worker is
            # still registering (a master that started late, a takeover). Either way they are
            # waited for as the first executor is, not for Spark's 30 s.
            need = cfg.workers * cfg.cores_per_worker
            launching = queue.granted >= need or 0 <= queue.registered < need
            if waited >= (
                registered_wait if slots and not launching else FIRST_EXECUTOR_WAIT_SECONDS
            ):
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
        self.granted = 0  # the cores the master has granted this application (executors)
        self.registered = -1  # the cores of the workers registered with the master (-1: unknown)

    def held_elsewhere(self) -> bool:
        """Whether other applications hold cores while this one has too few (told once per
        change of holders)."""
        if time.monotonic() - self.checked >= self.CHECK_SECONDS:
            self.checked = time.monotonic()
            view = alive_master(self.cfg.master, self.cfg.master_ui_port)
            own = [a for a in view.apps if a.id == self.app_id] if view else []
            self.granted = own[0].cores if own else 0
            self.registered = view.total_cores if view else -1
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
                    write_json(self.file, {"reason": reason, "since": time.time()})
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
        refused = slot_error(exc, cfg)
        if refused:
            raise refused from exc
        raise


def slot_error(exc: BaseException, cfg: TrainConfig) -> ClusterError | None:
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
