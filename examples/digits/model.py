"""Handwritten digits with a small MLP: trainstack's simple mode (docs/jobs.md).

trainstack runs `fit` on this model with the backup/resume, the per-epoch metrics, the
chief-only save and the curves. The stack's data set (`trainstack:trainData`, the digits by
default) arrives as `ctx.x` (this worker's shard) and `ctx.x_val`.
"""

from __future__ import annotations

from typing import Any


def build_model(ctx: Any) -> Any:
    """Dense(hidden_units, relu) -> Dropout -> Dense(n_classes) logits; Adam; sparse CE."""
    tf = ctx.tf
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(ctx.n_features,)),
            tf.keras.layers.Dense(int(ctx.params["hidden_units"]), activation="relu"),
            tf.keras.layers.Dropout(float(ctx.params["dropout"])),
            tf.keras.layers.Dense(ctx.n_classes),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate=ctx.learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=ctx.steps_per_execution,
    )
    return model
