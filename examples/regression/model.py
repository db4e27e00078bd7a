"""Diabetes progression with a small MLP: a regression in trainstack's simple mode.

trainstack prepares the manifest's table (features scaled to [0, 1], float32 labels), then
runs `fit` on this model with the backup/resume, the per-epoch metrics, the chief-only save
and the curves. The metrics are the model's own: mean squared error as the loss and mean
absolute error (`mae`, `val_mae`) as its metric.
"""

from __future__ import annotations

from typing import Any


def build_model(ctx: Any) -> Any:
    """Dense(hidden_units, relu) x 2 -> Dense(1); Adam; MSE loss, MAE metric."""
    tf = ctx.tf
    hidden = int(ctx.params["hidden_units"])
    # Start the output at the targets' mean (the validation set's: the same on every worker),
    # so the first epochs learn the spread, not the offset.
    start = tf.keras.initializers.Constant(float(ctx.y_val.mean()))
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(ctx.n_features,)),
            tf.keras.layers.Dense(hidden, activation="relu"),
            tf.keras.layers.Dense(hidden, activation="relu"),
            tf.keras.layers.Dense(1, bias_initializer=start),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(
            learning_rate=float(ctx.params.get("learning_rate", ctx.learning_rate))
        ),
        loss="mse",
        metrics=["mae"],
        steps_per_execution=ctx.steps_per_execution,
    )
    return model
