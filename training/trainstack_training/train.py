"""The training loop of one TensorFlow worker (runs inside a Spark barrier task).

Legacy Keras (tf-keras, TF_USE_LEGACY_KERAS=1) is used on purpose: Keras 3's model.fit fails
under MultiWorkerMirroredStrategy (keras-team/keras#20585), and legacy Keras keeps model.fit and
BackupAndRestore exactly as TensorFlow's multi-worker guide writes them.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainstack_training import metrics as push_metrics
from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo, load_arrays
from trainstack_training.job import (
    JobContext,
    JobError,
    JobSpec,
    UserCodeError,
    call_user,
    import_entry,
    listed_requirements,
    load_spec,
    record_error,
    recorded_error,
)
from trainstack_training.model import local_step_logs
from trainstack_training.watchdog import Watchdog, exit_rank

EPOCH_LOG = "epochs.jsonl"
MODEL_FILE = "model.keras"  # the chief saves the model here, in the run directory
FAULT_MARKER = ".fault-injected"
VAL_BATCH = 1024  # minimum validation batch
# TEST ONLY hold hook (--hold-file): how often a held worker looks at the file again, and how
# long it holds at most before it goes on (and holds no more in this process).
HOLD_POLL_SECONDS = 0.2
HOLD_LIMIT_SECONDS = 900.0


@dataclass
class WorkerResult:
    task_index: int
    attempt: int
    host: str
    epochs_run: int  # epochs this attempt ran (fewer than cfg.epochs after a resume)
    train_seconds: float  # time spent in training steps (validation excluded)
    fit_seconds: float
    samples: int  # samples this worker processed this attempt (global = x workers)
    peak_rss_mb: float
    model_path: str = ""
    history: dict[str, list[float]] = field(default_factory=dict)
    # What a full-mode job's train(ctx) returned: the result's final metrics, verbatim.
    returned: dict[str, float] = field(default_factory=dict)
    # Where this worker's time went, in seconds (see timing_breakdown()).
    timings: dict[str, float] = field(default_factory=dict)


def returned_metrics(final: dict[Any, Any], entry_file: str) -> dict[str, float]:
    """A full-mode job's returned dict as the result's metrics: string keys, numbers as floats
    (NumPy and TensorFlow scalars too); anything else is the user's error, named by its key."""
    metrics: dict[str, float] = {}
    for key, value in final.items():
        if not isinstance(key, str) or not key:
            raise UserCodeError(
                f"your code failed: train(ctx) in {entry_file} returned a dict with the key "
                f"{key!r}; its keys must be metric names (non-empty strings)"
            )
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if number is None or isinstance(value, bool | str | bytes):
            raise UserCodeError(
                f"your code failed: train(ctx) in {entry_file} returned {key}={value!r}; "
                "each value of the returned dict must be a number (a metric's final value)"
            )
        metrics[key] = number
    return metrics


def configure_environment(tf_config: dict[str, Any] | None, cores: int) -> None:
    """Set what TensorFlow reads once, when its runtime starts: before any op runs. TensorFlow
    may be imported already (trainstack_training.daemon imports it before forking), but its
    runtime must not have started."""
    if tensorflow_runtime_started():
        # TF reads TF_CONFIG and builds its collective runtime once per process; a reused
        # process would silently keep the old cluster (hence spark.python.worker.reuse=false).
        raise RuntimeError(
            "TensorFlow's runtime already runs in this process; TF_CONFIG would "
            "be ignored (is spark.python.worker.reuse on?)"
        )
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ[var] = str(cores)
    if tf_config:
        os.environ["TF_CONFIG"] = json.dumps(tf_config)
    else:
        os.environ.pop("TF_CONFIG", None)


def tensorflow_runtime_started() -> bool:
    """Whether TensorFlow's eager context has been initialized in this process (an import
    alone does not initialize it)."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    ctx = context.context_safe()
    return ctx is not None and ctx._context_handle is not None


def import_tensorflow(cores: int) -> Any:
    """Import TensorFlow (after configure_environment) with its thread pools sized to the
    cores Spark gave this task."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(cores)
    tf.config.threading.set_inter_op_parallelism_threads(cores)
    return tf


def pin_to_cores(task_index: int, cores: int) -> list[int]:
    """Restrict this process to `cores` CPUs of its own. Call before TensorFlow starts its
    threads: they inherit the affinity of the thread that creates them."""
    allowed = sorted(os.sched_getaffinity(0))
    start = task_index * cores
    mine = {allowed[(start + i) % len(allowed)] for i in range(cores)}
    os.sched_setaffinity(0, mine)
    return sorted(mine)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (VmHWM), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_worker(
    cfg: TrainConfig,
    info: DataInfo,
    task_index: int,
    tf_config: dict[str, Any] | None,
    cores: int,
    attempt: int,
    host: str = "localhost",
    started: float = 0.0,
) -> WorkerResult:
    """Run the job's code on this worker's shard with MultiWorkerMirroredStrategy (or, with
    train_strategy=single, TensorFlow's default strategy); the chief saves. An error in the
    job's code is recorded on shared storage (a retried stage fails again at once) and raised
    as a UserCodeError with the user's frames only."""
    marks = {"task_start": started or time.time()}
    out = Path(cfg.output).resolve()
    spec = job_spec(cfg)
    earlier = recorded_error(out)
    if earlier:  # a retry of a stage whose code failed: the same code fails the same way
        raise UserCodeError(earlier)
    configure_environment(tf_config, cores)
    if cfg.pin_cores:
        pin_to_cores(task_index, cores)
    tf = import_tensorflow(cores)

    def stuck(message: str) -> None:
        record_error(out, message, task_index)  # the retries fail at once: no second hang
        exit_rank(message)

    with Watchdog(spec.progress_timeout, out, task_index, stuck) as watchdog:
        try:
            module = import_entry(spec, cfg.job_env)
            return _run_job(cfg, info, spec, module, tf, task_index, attempt, host, marks, watchdog)
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


def _run_job(
    cfg: TrainConfig,
    info: DataInfo,
    spec: JobSpec,
    module: Any,
    tf: Any,
    task_index: int,
    attempt: int,
    host: str,
    marks: dict[str, float],
    watchdog: Watchdog,
) -> WorkerResult:
    marks["tf_imported"] = time.time()
    tf.keras.utils.set_random_seed(cfg.seed)  # same initial weights on every worker

    out = Path(cfg.output).resolve()
    workers = cfg.workers
    is_chief = task_index == 0
    strategy = make_strategy(tf, cfg)
    marks["strategy_ready"] = time.time()

    x_train, y_train = load_arrays(info.shard_dir(task_index))
    x_val, y_val = load_arrays(info.val_dir)
    # Every worker must run the same number of steps, or the collectives deadlock: size the
    # epoch by the smallest shard and repeat the data.
    steps_per_epoch = min(info.shard_rows) // cfg.batch_size
    global_batch = cfg.batch_size * workers
    epoch_timer, epoch_log, fault_injector, hold_point = _callback_classes(tf)
    timer = epoch_timer(steps_per_epoch)

    class Progress(tf.keras.callbacks.Callback):
        """Each finished batch is progress for the no-progress timeout."""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            watchdog.touch()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            watchdog.touch()

    def callbacks() -> list[Any]:
        cbs: list[Any] = [
            Progress(),
            timer,
            epoch_log(out / EPOCH_LOG, is_chief, attempt, timer, steps_per_epoch * global_batch),
            # On shared storage, so a retried barrier stage resumes from the last finished epoch.
            # After the epoch's row: a worker killed between the two then trains that epoch
            # again on resume (its row twice: the report keeps the last), whereas a backup
            # before the row would resume past an epoch whose row was never written.
            tf.keras.callbacks.BackupAndRestore(backup_dir=str(out / "backup")),
        ]
        if cfg.fault_kill_epoch >= 1 and task_index == cfg.fault_kill_worker:
            cbs.append(fault_injector(cfg.fault_kill_epoch, steps_per_epoch, out))
        # The chief pushes each epoch to Prometheus's Pushgateway when one is configured.
        cbs += push_metrics.keras_callbacks(
            tf,
            str(out),
            cfg.epochs,
            workers,
            is_chief,
            attempt,
            timer,
            steps_per_epoch * global_batch,
        )
        if cfg.hold_file:
            # Last, so the epoch's backup, its epochs.jsonl row and its push are done before the
            # hold. Every worker holds: none waits inside a collective meanwhile.
            cbs.append(hold_point(EpochHold(cfg.hold_file, cfg.epochs, task_index, attempt)))
        return cbs

    def report(metrics: dict[str, Any]) -> None:
        watchdog.touch()
        reporter.report(metrics)

    reporter = EpochReporter(out / EPOCH_LOG, is_chief, attempt, len(x_train) * workers)
    ctx = JobContext(
        params=dict(spec.params),
        rank=task_index,
        world_size=workers,
        is_chief=is_chief,
        strategy=strategy,
        tf=tf,
        x=x_train,
        y=y_train,
        x_val=x_val,
        y_val=y_val,
        n_features=info.n_features,
        n_classes=info.n_classes,
        batch_size=cfg.batch_size,
        epochs=cfg.epochs,
        learning_rate=cfg.learning_rate,
        seed=cfg.seed,
        steps_per_execution=cfg.steps_per_execution,
        steps_per_epoch=steps_per_epoch,
        run_dir=str(out),
        checkpoint_dir=str(out / "backup"),
        model_path=str(out / MODEL_FILE),
        attempt=attempt,
        task=info.task,
        _callbacks=callbacks,
        _report=report,
    )
    marks["data_loaded"] = time.time()
    if spec.mode == "full":
        marks["fit_start"] = time.time()
        fit_start = time.perf_counter()
        final = call_user(spec, module.train, ctx)
        fit_seconds = time.perf_counter() - fit_start
        marks["fit_end"] = time.time()
        if not isinstance(final, dict):
            raise UserCodeError(
                f"your code failed: train(ctx) in {spec.entry_file} returned "
                f"{type(final).__name__}; it must return a dict of final metrics"
            )
        returned = returned_metrics(final, spec.entry_file)
        if not ctx.saved:
            raise UserCodeError(
                f"your code failed: train(ctx) in {spec.entry_file} returned without "
                "ctx.save_model(model): the run has no model"
            )
        marks["saved"] = time.time()
        epochs_run = timer.epochs or reporter.epochs
        return WorkerResult(
            task_index=task_index,
            attempt=attempt,
            host=host,
            epochs_run=epochs_run,
            train_seconds=timer.total or fit_seconds,
            fit_seconds=fit_seconds,
            samples=epochs_run * steps_per_epoch * cfg.batch_size,
            peak_rss_mb=peak_rss_mb(),
            model_path=ctx.model_path if is_chief else "",
            history={k: [v] for k, v in returned.items()},
            returned=returned,
            timings=timing_breakdown(marks, timer, fit_seconds),
        )

    if spec.has_datasets:
        arrays = call_user(spec, module.datasets, ctx)
        (x_train, y_train), (x_val, y_val) = _check_datasets(arrays, spec, len(x_train))
    # Every worker evaluates the full validation set, in large batches (the metrics are the same
    # for any batch size; fewer steps cost less Python).
    val_batch = max(cfg.batch_size, VAL_BATCH)
    val_steps = math.ceil(len(x_val) / val_batch)
    options = input_options(tf)

    def train_fn(input_ctx: Any) -> Any:
        per_replica = input_ctx.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds = ds.shuffle(len(x_train), seed=cfg.seed + task_index, reshuffle_each_iteration=True)
        ds = ds.batch(per_replica, drop_remainder=True).repeat().prefetch(2)
        return ds.with_options(options)

    def val_fn(input_ctx: Any) -> Any:
        ds = tf.data.Dataset.from_tensor_slices((x_val, y_val))
        return ds.batch(val_batch).repeat().prefetch(2).with_options(options)

    train_ds = strategy.distribute_datasets_from_function(train_fn)
    val_ds = strategy.distribute_datasets_from_function(val_fn)
    with strategy.scope():
        model = call_user(spec, module.build_model, ctx)
        if not hasattr(model, "fit") or getattr(model, "optimizer", None) is None:
            raise UserCodeError(
                f"your code failed: build_model(ctx) in {spec.entry_file} returned "
                f"{type(model).__name__}; it must return a compiled Keras model "
                "(call model.compile(...) before returning it)"
            )
    local_step_logs(model, tf)

    marks["fit_start"] = time.time()
    fit_start = time.perf_counter()
    # trainstack's own fit (not wrapped as the user's code: a lost peer must reach Spark's
    # retry as it is).
    history = model.fit(
        train_ds,
        epochs=cfg.epochs,
        steps_per_epoch=steps_per_epoch,
        validation_data=val_ds,
        validation_steps=val_steps,
        callbacks=callbacks(),
        verbose=0,
    )
    fit_seconds = time.perf_counter() - fit_start
    marks["fit_end"] = time.time()

    ctx.save_model(model)
    marks["saved"] = time.time()
    return WorkerResult(
        task_index=task_index,
        attempt=attempt,
        host=host,
        epochs_run=timer.epochs,
        train_seconds=timer.total,
        fit_seconds=fit_seconds,
        samples=timer.epochs * steps_per_epoch * cfg.batch_size,
        peak_rss_mb=peak_rss_mb(),
        model_path=ctx.model_path if is_chief else "",
        history={k: [float(v) for v in vs] for k, vs in history.history.items()},
        timings=timing_breakdown(marks, timer, fit_seconds),
    )


def input_options(tf: Any) -> Any:
    """The tf.data options of both input pipelines."""
    options = tf.data.Options()
    # Spark already split the data: each worker must keep its whole shard.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # No autotuning: the pipelines (arrays in memory, shuffle, batch, prefetch(2)) have no knob
    # set to AUTOTUNE, yet tf.data's autotuning thread still ran on the worker's CPU, and
    # deleting the iterator as `fit` ended waited for it: a 3-5 s stall (the other worker
    # waiting in `model.save`) in 10 of 19 digits runs on the default stack, 1 of 12 without.
    options.autotune.enabled = False
    return options


def make_strategy(tf: Any, cfg: TrainConfig) -> Any:
    """MultiWorkerMirroredStrategy with the configured all-reduce, or the default strategy."""
    if cfg.train_strategy == "single":
        return tf.distribute.get_strategy()
    impl = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=cfg.bytes_per_pack,
        implementation=impl.RING if cfg.collective == "ring" else impl.AUTO,
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def timing_breakdown(marks: dict[str, float], timer: Any, fit_seconds: float) -> dict[str, float]:
    """Seconds per phase of one worker: start-up (TensorFlow import, strategy and collective
    set-up, shard load), the first step (tracing + the collective group's first all-reduce),
    the later training steps, validation, and the rest of fit (per-epoch Python, callbacks,
    checkpoints)."""
    steps = max(0.0, timer.total - timer.first_step)
    return {
        "import_tf": marks["tf_imported"] - marks["task_start"],
        "strategy_setup": marks["strategy_ready"] - marks["tf_imported"],
        "load_shards": marks["data_loaded"] - marks["strategy_ready"],
        "build_model": marks["fit_start"] - marks["data_loaded"],
        "fit": fit_seconds,
        "first_step": timer.first_step,
        "train_steps": steps,
        "validation": timer.validation,
        "fit_other": max(0.0, fit_seconds - timer.total - timer.validation),
        "save_model": marks["saved"] - marks["fit_end"],
        "worker_total": marks["saved"] - marks["task_start"],
        "task_start_at": marks["task_start"],  # wall clock; the launcher makes it relative
        "fit_start_at": marks["fit_start"],  # wall clock: the first training step's start
    }


class EpochHold:
    """TEST ONLY: hold this worker at an epoch boundary while a file exists (--hold-file).

    A failure drill creates the file, waits for the run to reach an epoch end (its row in
    epochs.jsonl), does its damage while every worker sits here, then removes the file. Plain
    Python (no TensorFlow), so it can be tested alone; `hold_point` calls it from Keras.
    Never holds after the last epoch (no training is left to strike there, and a forgotten
    file must not delay the result); holds at most `limit` seconds, then warns, goes on and
    holds no more in this process. With no file it costs one stat per epoch.
    """

    def __init__(
        self,
        path: str,
        epochs: int,
        task_index: int = 0,
        attempt: int = 0,
        *,
        poll: float = HOLD_POLL_SECONDS,
        limit: float = HOLD_LIMIT_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.path, self.epochs, self.task_index, self.attempt = path, epochs, task_index, attempt
        self.poll, self.limit, self.sleep, self.clock = poll, limit, sleep, clock
        self.say = say or (lambda line: print(line, flush=True))
        self.active = bool(path)

    def _exists(self) -> bool:
        return os.path.exists(self.path)  # False on any OSError: never fails the run

    def after_epoch(self, epoch: int) -> float:
        """Called when epoch `epoch` (1-based, counted across resumes) has ended; returns the
        seconds held (0.0 when not held)."""
        if not self.active or epoch >= self.epochs or not self._exists():
            return 0.0
        self.say(
            f"holding after epoch {epoch} while {self.path} exists "
            f"(TEST ONLY hold; worker {self.task_index}, attempt {self.attempt}, "
            f"pid {os.getpid()}; remove the file to go on)"
        )
        start = self.clock()
        while self._exists():
            held = self.clock() - start
            if held >= self.limit:
                self.active = False
                self.say(
                    f"WARNING: {self.path} still exists after {held:.0f} s of hold after epoch "
                    f"{epoch} (worker {self.task_index}): going on, and holding no more in "
                    "this attempt"
                )
                return held
            self.sleep(self.poll)
        held = self.clock() - start
        self.say(f"hold released after epoch {epoch} after {held:.1f} s (worker {self.task_index})")
        return held


def _callback_classes(tf: Any) -> tuple[Any, Any, Any, Any]:
    """Define the Keras callbacks inside a function: TensorFlow may only be imported after
    TF_CONFIG is set, so nothing at module level may subclass its classes."""
    base = tf.keras.callbacks.Callback

    class EpochTimer(base):  # type: ignore[misc,valid-type]
        """Times the training steps of each epoch, excluding validation."""

        def __init__(self, steps: int) -> None:
            super().__init__()
            self.steps, self.epochs, self.total, self.last = steps, 0, 0.0, 0.0
            self._start = 0.0
            # first_step: the first call of this process (tracing, first all-reduce).
            self.first_step, self.step_count, self.validation = 0.0, 0, 0.0
            self._val_start = 0.0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self.step_count == 0:
                self.first_step = time.perf_counter() - self._start
            self.step_count += 1
            # With steps_per_execution N this is called once per N steps, the last with
            # batch == steps - 1.
            if batch >= self.steps - 1:
                self.last = time.perf_counter() - self._start
                self.total += self.last
                self.epochs += 1

        def on_test_begin(self, logs: Any = None) -> None:
            self._val_start = time.perf_counter()

        def on_test_end(self, logs: Any = None) -> None:
            self.validation += time.perf_counter() - self._val_start

    class EpochLog(base):  # type: ignore[misc,valid-type]
        """The chief appends each epoch's metrics to a JSON-lines file on shared storage, so
        the curves survive a restart (a resumed fit's History only has the later epochs)."""

        def __init__(
            self, path: Path, enabled: bool, attempt: int, timer: Any, samples: int
        ) -> None:
            super().__init__()
            self.path, self.enabled, self.attempt = path, enabled, attempt
            self.timer, self.samples = timer, samples

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if not self.enabled:
                return
            row = {
                "epoch": epoch + 1,
                "attempt": self.attempt,
                "train_seconds": self.timer.last,
                "samples": self.samples,
                "ended_at": time.time(),
            }
            row.update({k: float(v) for k, v in (logs or {}).items()})
            with self.path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    class FaultInjector(base):  # type: ignore[misc,valid-type]
        """TEST ONLY: SIGKILL this worker's own Python process halfway through an epoch, once.

        A real crash (no exception, no cleanup), so Spark sees a lost Python worker.
        """

        def __init__(self, epoch: int, steps: int, out: Path) -> None:
            super().__init__()
            self.epoch, self.batch = epoch, max(0, steps // 2)
            self.marker = out / FAULT_MARKER
            self.current = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.current = epoch + 1

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self.current == self.epoch and batch == self.batch and not self.marker.exists():
                self.marker.write_text(f"killed pid {os.getpid()} in epoch {self.epoch}\n")
                os.kill(os.getpid(), signal.SIGKILL)

    class HoldPoint(base):  # type: ignore[misc,valid-type]
        """TEST ONLY: runs an EpochHold at each epoch end (see EpochHold)."""

        def __init__(self, hold: EpochHold) -> None:
            super().__init__()
            self.hold = hold

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.hold.after_epoch(epoch + 1)

    return EpochTimer, EpochLog, FaultInjector, HoldPoint


def _check_datasets(arrays: Any, spec: JobSpec, rows: int) -> tuple[Any, Any]:
    """The arrays `datasets(ctx)` returned, checked: ((x, y), (x_val, y_val)), each pair of
    equal length, the shard's rows kept (every worker must run the same number of steps)."""
    where = f"datasets(ctx) in {spec.entry_file}"
    try:
        (x, y), (x_val, y_val) = arrays
        lengths = [len(x), len(y), len(x_val), len(y_val)]
    except (TypeError, ValueError):
        raise UserCodeError(
            f"your code failed: {where} must return ((x, y), (x_val, y_val)) arrays, "
            f"not {type(arrays).__name__}"
        ) from None
    if lengths[0] != lengths[1] or lengths[2] != lengths[3]:
        raise UserCodeError(
            f"your code failed: {where} returned x/y of {lengths[0]}/{lengths[1]} rows and "
            f"x_val/y_val of {lengths[2]}/{lengths[3]}: each pair must have the same length"
        )
    if lengths[0] != rows:
        raise UserCodeError(
            f"your code failed: {where} returned {lengths[0]} training rows for a shard of "
            f"{rows}: transform the rows, do not add or drop any (the workers' step counts "
            "must match)"
        )
    return (x, y), (x_val, y_val)


class EpochReporter:
    """`ctx.report(...)` of a full-mode job: the chief's rows in epochs.jsonl (as the Keras
    epoch log writes them) and its push to the Pushgateway when one is configured."""

    def __init__(self, path: Path, enabled: bool, attempt: int, samples: int) -> None:
        self.path, self.enabled, self.attempt, self.samples = path, enabled, attempt, samples
        self.epochs = 0
        self.last = time.perf_counter()
        gateway = push_metrics.pushgateway_url()
        self.pusher: Any = None
        if enabled and gateway:
            self.pusher = push_metrics.EpochPusher(gateway, path.parent.name, 0, 0)

    def report(self, metrics: dict[str, float]) -> None:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        self.epochs += 1
        if not self.enabled:
            return
        row = {
            "epoch": int(metrics.pop("epoch", self.epochs)),
            "attempt": self.attempt,
            "train_seconds": seconds,
            "samples": int(metrics.pop("samples", self.samples)),
            "ended_at": time.time(),
            **metrics,
        }
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.pusher is not None:
            self.pusher.push(row["epoch"], self.attempt, metrics, row["samples"] / seconds)
