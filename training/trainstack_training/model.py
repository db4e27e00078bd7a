"""The model from the guide, with the input width taken from the data."""

from __future__ import annotations

from typing import Any


def build_model(n_features: int, n_classes: int, learning_rate: float) -> Any:
    """Dense(128, relu) -> Dropout(0.2) -> Dense(n_classes) logits; Adam; sparse CE; accuracy.

    Import TensorFlow lazily: TF_CONFIG and TF_USE_LEGACY_KERAS must be set before the first
    import (see train.configure_environment), and the driver never needs TensorFlow.
    """
    import tensorflow as tf

    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(n_features,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.2),
            tf.keras.layers.Dense(n_classes),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate=learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model
