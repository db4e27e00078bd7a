"""The digits as 8x8 images through a small convolutional network: trainstack's full mode.

`train(ctx)` builds the input pipelines and the model and runs `fit` itself. It passes
`ctx.callbacks()` to `fit`, so a worker lost mid-run resumes from the last finished epoch and
every epoch reaches the epoch log, the curves and the pushed progress; it saves the model with
`ctx.save_model` and returns its final metrics. Run it with the digits data set (the default):
each row's 64 features are the 8x8 pixels in row order.
"""

from __future__ import annotations

from typing import Any

SIDE = 8  # the digits are 8x8 pixels


def _images(x: Any) -> Any:
    if x.shape[1] != SIDE * SIDE:
        raise ValueError(
            f"this job needs the digits' {SIDE * SIDE} pixel features, got {x.shape[1]} "
            "(set trainstack:trainData to digits)"
        )
    return x.reshape(-1, SIDE, SIDE, 1)


def _datasets(ctx: Any) -> tuple[Any, Any]:
    tf = ctx.tf
    options = tf.data.Options()
    # The data is already split per worker: each worker keeps its whole shard.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    train = (
        tf.data.Dataset.from_tensor_slices((_images(ctx.x), ctx.y))
        .shuffle(len(ctx.x), seed=ctx.seed + ctx.rank)
        # Keras splits a dataset's batches across the replicas: batch by the global size, so
        # each worker trains on ctx.batch_size rows of its shard per step.
        .batch(ctx.global_batch_size, drop_remainder=True)
        .repeat()
        .with_options(options)
    )
    val = (
        tf.data.Dataset.from_tensor_slices((_images(ctx.x_val), ctx.y_val))
        .batch(1024)
        .repeat()
        .with_options(options)
    )
    return train, val


def _model(ctx: Any) -> Any:
    tf = ctx.tf
    layers = tf.keras.layers
    filters = int(ctx.params["filters"])
    model = tf.keras.Sequential(
        [
            layers.Input(shape=(SIDE, SIDE, 1)),
            layers.Conv2D(filters, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(filters * 2, 3, padding="same", activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(ctx.n_classes),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(
            learning_rate=float(ctx.params.get("learning_rate", ctx.learning_rate))
        ),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train(ctx: Any) -> dict[str, float]:
    train_ds, val_ds = _datasets(ctx)
    with ctx.strategy.scope():
        model = _model(ctx)
    history = model.fit(
        train_ds,
        epochs=ctx.epochs,
        # The same on every worker (the smallest shard's): the all-reduces must pair up.
        steps_per_epoch=ctx.steps_per_epoch,
        validation_data=val_ds,
        validation_steps=-(-len(ctx.x_val) // 1024),
        callbacks=ctx.callbacks(),
        verbose=0,
    )
    ctx.save_model(model)
    return {key: float(values[-1]) for key, values in history.history.items()}
