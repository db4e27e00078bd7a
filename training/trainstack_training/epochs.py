"""An epoch row of a run's epochs.jsonl: trainstack's bookkeeping fields and the model's own
metrics, whatever the job logs (Keras' `History` keys, or a full-mode job's `ctx.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainstack_training.rundir import EPOCH_LOG, read_rows

# A row's `epoch` counts from 1. A job whose ctx.report numbers count from 0 (its run's first
# report said epoch=0) has each row's number moved up by one; the row keeps the job's own
# number in this field (frameworks.base.EpochReporter).
REPORTED_EPOCH = "reported_epoch"
# The fields of an epoch row that are not the model's metrics.
ROW_FIELDS = frozenset({"epoch", REPORTED_EPOCH, "attempt", "train_seconds", "samples", "ended_at"})
# Keys of Keras' epoch logs that are settings, not the model's metrics.
NOT_METRICS = frozenset({"lr", "learning_rate"})


def read_epochs(run_dir: Path) -> list[dict[str, Any]]:
    """The chief's epoch rows in epoch order. After a resume an epoch may be there twice: the
    last attempt's row wins. A line still being written is left for the next read."""
    rows: dict[int, dict[str, Any]] = {}
    for row in read_rows(run_dir / EPOCH_LOG):
        try:
            rows[int(row["epoch"])] = row
        except (KeyError, ValueError, TypeError):
            continue
    return [rows[k] for k in sorted(rows)]


def is_metric(key: str, value: Any) -> bool:
    """`key` of an epoch row is one of the model's metrics (a number, not bookkeeping)."""
    return (
        key not in ROW_FIELDS
        and key not in NOT_METRICS
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    )


def metric_names(rows: list[dict[str, Any]]) -> list[str]:
    """The metrics the job logged, in the order it first logged them (Keras: loss, the
    compiled metrics, then their val_ pairs)."""
    names: list[str] = []
    for row in rows:
        names.extend(k for k, v in row.items() if is_metric(k, v) and k not in names)
    return names


def headline(names: Any, preferred: str = "") -> str | None:
    """The metric a one-line summary shows first: the job's own choice (its manifest's
    `metric`) when it has that metric, else val_loss, else the first validation metric, else
    the first metric."""
    names = list(names)
    if preferred and preferred in names:
        return preferred
    if "val_loss" in names:
        return "val_loss"
    return next((n for n in names if n.startswith("val_")), names[0] if names else None)
