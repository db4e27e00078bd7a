"""Handwritten digits with a small MLP in PyTorch: trainstack's simple mode (docs/jobs.md).

trainstack wraps the model in DistributedDataParallel and runs the loop: cross-entropy and
Adam by default (a job may give `loss_fn(ctx)` and `optimizer(ctx, model)`), per-epoch
`loss`/`accuracy` and `val_loss`/`val_accuracy`, a checkpoint each epoch, the chief's save.
"""

from __future__ import annotations

from typing import Any


def build_model(ctx: Any) -> Any:
    """Linear(n_features, hidden_units) -> ReLU -> Dropout -> Linear(n_classes) logits, with
    Keras' default initialisation (Glorot-uniform weights, zero biases), as the TensorFlow
    example's Dense layers have."""
    nn = ctx.torch.nn
    hidden = int(ctx.params["hidden_units"])
    model = nn.Sequential(
        nn.Linear(ctx.n_features, hidden),
        nn.ReLU(),
        nn.Dropout(float(ctx.params["dropout"])),
        nn.Linear(hidden, ctx.n_classes),
    )
    for layer in (model[0], model[3]):
        nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(layer.bias)
    return model
