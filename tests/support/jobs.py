"""A job's processes on a worker node, as the jobs tests and bench/bench_jobs.py count them;
and a full-mode regression job that the shared stack's tests submit."""

from __future__ import annotations

import shutil
from pathlib import Path

# A shell script that prints one line per process of a job on the node: its runner
# (trainstack_training.runner), its driver (trainstack-train), and its TensorFlow ranks, the
# Python workers that an executor's pyspark.daemon forks for the barrier tasks. The warm
# runner (trainstack_training.warm), its executor JVM and that pyspark.daemon outlive a job by
# design (docs/jobs.md, "The warm runner"). The patterns begin with a bracket, so they do not
# match the shell that runs them.
JOB_PROCESSES = (
    "{ pgrep -af '[t]rainstack_training[.]runner |bin/[t]rainstack-train '; "
    "for d in $(pgrep -f '[p]yspark[.]daemon'); do pgrep -a -P $d; done; } || true"
)


# A full-mode job (docs/jobs.md) for examples/regression's table: its own loop on the data
# stage's float32 targets (ctx.y), and a returned dict that becomes the result's metrics
# verbatim. WAIT_HOLD: after training, every TensorFlow worker waits (up to 300 s) while that
# file exists, still inside the barrier stage, holding its cores ("" = no wait).
REGRESSION_FULL_MODE = """\
import os
import time

WAIT_HOLD = {hold!r}


def train(ctx):
    tf = ctx.tf
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    train = (
        tf.data.Dataset.from_tensor_slices((ctx.x, ctx.y))
        .batch(ctx.global_batch_size, drop_remainder=True).repeat().with_options(options)
    )
    val = tf.data.Dataset.from_tensor_slices((ctx.x_val, ctx.y_val)).batch(512).repeat()
    with ctx.strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.Input((ctx.n_features,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(1, bias_initializer=tf.keras.initializers.Constant(150.0)),
        ])
        model.compile(tf.keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    history = model.fit(
        train, epochs=ctx.epochs, steps_per_epoch=ctx.steps_per_epoch,
        validation_data=val.with_options(options), validation_steps=1,
        callbacks=ctx.callbacks(), verbose=0,
    )
    deadline = time.time() + 300
    while WAIT_HOLD and os.path.exists(WAIT_HOLD) and time.time() < deadline:
        time.sleep(0.5)
    ctx.save_model(model)
    return {{"val_mae": history.history["val_mae"][-1], "val_mse": history.history["val_loss"][-1]}}
"""


def regression_full_mode(examples: Path, directory: Path, hold: str = "") -> Path:
    """examples/regression as a full-mode job in `directory` (see REGRESSION_FULL_MODE)."""
    shutil.copytree(examples / "regression", directory)
    (directory / "model.py").write_text(REGRESSION_FULL_MODE.format(hold=hold))
    return directory
