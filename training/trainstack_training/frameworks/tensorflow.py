"""TensorFlow's backend: MultiWorkerMirroredStrategy (or the default strategy) in each rank.

Legacy Keras (tf-keras, TF_USE_LEGACY_KERAS=1) is used on purpose: Keras 3's model.fit fails
under MultiWorkerMirroredStrategy (keras-team/keras#20585), and legacy Keras keeps model.fit and
BackupAndRestore exactly as TensorFlow's multi-worker guide writes them. TF_CONFIG comes from
the barrier's allGather (the mechanism of spark-tensorflow-distributor) and is set before
TensorFlow's runtime starts.

Runs in each rank: a barrier task's Python process on an executor (trainstack_training.train
picks this backend). trainstack's Keras callbacks are in frameworks/tensorflow_callbacks.py.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

from trainstack_training import rundir
from trainstack_training.config import TrainConfig
from trainstack_training.context import JobContext, UserCodeError, call_user
from trainstack_training.data.rank import VAL_BATCH
from trainstack_training.frameworks.base import (
    Backend,
    EpochReporter,
    RankRun,
    WorkerResult,
    call_train,
    check_datasets,
    datasets_in_memory,
    peak_rss_mb,
)
from trainstack_training.frameworks.tensorflow_callbacks import callback_classes, keras_callbacks
from trainstack_training.model import local_step_logs
from trainstack_training.rundir import BACKUP_DIR, EPOCH_LOG


class TensorFlowBackend(Backend):
    name = "tensorflow"
    model_file = rundir.model_file(name)

    def configure(self, run: RankRun) -> None:
        tf_config = None
        if run.cfg.workers > 1:
            tf_config = {
                "cluster": {"worker": list(run.peers)},
                "task": {"type": "worker", "index": run.rank},
            }
        configure_environment(tf_config, run.cores)

    def load(self, run: RankRun) -> Any:
        tf = import_tensorflow(run.cores)
        run.marks["tf_imported"] = time.time()
        return tf

    def run(self, run: RankRun, module: Any, framework: Any) -> WorkerResult:
        tf = framework
        tf.keras.utils.set_random_seed(run.cfg.seed)  # same initial weights on every worker
        strategy = make_strategy(tf, run.cfg)
        run.marks["strategy_ready"] = time.time()
        ctx, timer, reporter = self._context(run, tf, strategy)
        run.marks["data_loaded"] = time.time()
        if run.spec.mode == "full":
            returned, fit_seconds = call_train(run, module, ctx)
            epochs_run = timer.epochs or reporter.epochs
            return self._result(
                run, ctx, epochs_run, timer, fit_seconds, {k: [v] for k, v in returned.items()},
                returned=returned, train_seconds=timer.total or fit_seconds,
            )  # fmt: skip
        return self._simple(run, module, ctx, tf, strategy, timer)

    def _context(self, run: RankRun, tf: Any, strategy: Any) -> tuple[JobContext, Any, Any]:
        """The job's ctx, with trainstack's Keras callbacks and its epoch reporter."""
        cfg, info, out = run.cfg, run.info, run.out
        data = run.rank_data()
        data.open()  # now: the time split's load_shards
        # Every worker runs the same number of steps (the data repeats).
        steps_per_epoch = run.steps_per_epoch
        samples = steps_per_epoch * cfg.batch_size * cfg.workers
        classes = callback_classes(tf)
        timer = classes[0](steps_per_epoch)
        reporter = EpochReporter(
            out / EPOCH_LOG, run.is_chief, run.attempt, info.shard_rows[run.rank] * cfg.workers
        )

        def report(metrics: dict[str, Any]) -> None:
            run.touch()
            reporter.report(metrics)

        ctx = JobContext(
            params=dict(run.spec.params), rank=run.rank, world_size=cfg.workers,
            is_chief=run.is_chief, strategy=strategy, tf=tf, data=data,
            n_features=info.n_features, n_classes=info.n_classes,
            batch_size=cfg.batch_size, epochs=cfg.epochs, learning_rate=cfg.learning_rate,
            seed=cfg.seed, steps_per_execution=cfg.steps_per_execution,
            steps_per_epoch=steps_per_epoch, run_dir=str(out),
            checkpoint_dir=str(out / BACKUP_DIR), model_path=str(out / self.model_file),
            attempt=run.attempt, task=info.task, framework=self.name,
            _callbacks=lambda: keras_callbacks(run, tf, classes, timer, samples, data),
            _report=report,
        )  # fmt: skip
        return ctx, timer, reporter

    def _simple(
        self, run: RankRun, module: Any, ctx: JobContext, tf: Any, strategy: Any, timer: Any
    ) -> WorkerResult:
        """trainstack's `fit` of the model `build_model(ctx)` returns."""
        cfg, spec = run.cfg, run.spec
        # Every worker evaluates the full validation set, in large batches (the metrics are the
        # same for any batch size; fewer steps cost less Python).
        val_batch = max(cfg.batch_size, VAL_BATCH)
        val_rows = run.info.val_rows
        datasets_in_memory(ctx, spec)
        if ctx.streams:
            train_fn, val_fn = streamed_inputs(tf, ctx, cfg.workers, val_batch)
        else:
            x_train, y_train, x_val, y_val = ctx.x, ctx.y, ctx.x_val, ctx.y_val
            if spec.has_datasets:
                arrays = call_user(spec, module.datasets, ctx)
                (x_train, y_train), (x_val, y_val) = check_datasets(arrays, spec, len(x_train))
                val_rows = len(x_val)
            train_fn, val_fn = in_memory_inputs(
                tf, (x_train, y_train, x_val, y_val), cfg, run.rank, val_batch
            )
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
        run.marks["fit_start"] = time.time()
        fit_start = time.perf_counter()
        # trainstack's own fit (not wrapped as the user's code: a lost peer must reach Spark's
        # retry as it is).
        history = model.fit(
            train_ds,
            epochs=cfg.epochs,
            steps_per_epoch=ctx.steps_per_epoch,
            validation_data=val_ds,
            validation_steps=math.ceil(val_rows / val_batch),
            callbacks=ctx.callbacks(),
            verbose=0,
        )
        fit_seconds = time.perf_counter() - fit_start
        run.marks["fit_end"] = time.time()
        ctx.save_model(model)
        run.marks["saved"] = time.time()
        curves = {k: [float(v) for v in vs] for k, vs in history.history.items()}
        return self._result(run, ctx, timer.epochs, timer, fit_seconds, curves)

    def _result(
        self,
        run: RankRun,
        ctx: JobContext,
        epochs_run: int,
        timer: Any,
        fit_seconds: float,
        history: dict[str, list[float]],
        returned: dict[str, float] | None = None,
        train_seconds: float | None = None,
    ) -> WorkerResult:
        return WorkerResult(
            task_index=run.rank,
            attempt=run.attempt,
            host=run.host,
            epochs_run=epochs_run,
            train_seconds=timer.total if train_seconds is None else train_seconds,
            fit_seconds=fit_seconds,
            samples=epochs_run * ctx.steps_per_epoch * run.cfg.batch_size,
            peak_rss_mb=peak_rss_mb(),
            model_path=ctx.model_path if run.is_chief else "",
            history=history,
            returned=returned or {},
            timings=timing_breakdown(run.marks, timer, fit_seconds)
            | {"input_wait": ctx.data.wait_seconds()},
            data_input=ctx.data.choice.to_dict(),
        )


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


def in_memory_inputs(
    tf: Any, arrays: tuple[Any, Any, Any, Any], cfg: TrainConfig, rank: int, val_batch: int
) -> tuple[Any, Any]:
    """The input functions of a rank that holds its arrays: the shard shuffled by tf.data
    (a buffer of the whole shard), repeated; the validation set in order, repeated."""
    x_train, y_train, x_val, y_val = arrays
    options = input_options(tf)
    global_batch = cfg.batch_size * cfg.workers

    def train_fn(input_ctx: Any) -> Any:
        per_replica = input_ctx.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds = ds.shuffle(len(x_train), seed=cfg.seed + rank, reshuffle_each_iteration=True)
        ds = ds.batch(per_replica, drop_remainder=True).repeat().prefetch(2)
        return ds.with_options(options)

    def val_fn(input_ctx: Any) -> Any:
        ds = tf.data.Dataset.from_tensor_slices((x_val, y_val))
        return ds.batch(val_batch).repeat().prefetch(2).with_options(options)

    return train_fn, val_fn


def streamed_inputs(tf: Any, ctx: JobContext, workers: int, val_batch: int) -> tuple[Any, Any]:
    """The input functions of a rank that streams (data/stream.py): each epoch's batches from
    the one fit starts at (`RankData.start_epoch`, set by trainstack's callbacks on a resume)
    on, read a row group at a time in tf.data's prefetch thread; the validation set read
    again for each evaluation."""
    options = input_options(tf)
    data = ctx.data
    label = tf.int32 if not data.label_is_float() else tf.float32

    def train_fn(input_ctx: Any) -> Any:
        per_replica = input_ctx.get_per_replica_batch_size(ctx.batch_size * workers)

        def epochs() -> Any:
            epoch = data.start_epoch  # read when fit starts iterating: after the restore
            while True:
                yield from data.chunks(epoch, per_replica)
                epoch += 1

        spec = (
            tf.TensorSpec((None, ctx.n_features), tf.float32),
            tf.TensorSpec((None,), label),
        )
        # Python hands over a row group's worth of shuffled rows; tf.data batches it.
        ds = tf.data.Dataset.from_generator(epochs, output_signature=spec).flat_map(
            lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)).batch(
                per_replica, drop_remainder=True
            )
        )
        return ds.prefetch(2).with_options(options)

    def val_fn(input_ctx: Any) -> Any:
        spec = (
            tf.TensorSpec((None, ctx.n_features), tf.float32),
            tf.TensorSpec((None,), label),
        )
        ds = tf.data.Dataset.from_generator(
            lambda: data.val_batches(val_batch), output_signature=spec
        )
        return ds.repeat().prefetch(2).with_options(options)

    return train_fn, val_fn


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
