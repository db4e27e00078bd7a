"""The data stage's checks of the data, the same on every path: of the statistics of its one
pass (rows, enough training rows for the workers, the labels for the task, no null features)
and of the shards it wrote (a batch for every worker, a validation split). Each failure is a
DataError of one sentence.

Runs in the training driver process (`trainstack-train`), in `prepare` (stage.py).
"""

from __future__ import annotations

from typing import Any

from trainstack_training.config import TrainConfig
from trainstack_training.data.info import DataError, DataInfo
from trainstack_training.data.task import check_labels


def _check_stats(stats: dict[str, Any], cfg: TrainConfig, features: list[str], task: str) -> None:
    rows = int(stats["rows"] or 0)
    if rows == 0:
        raise DataError(f"the data set {cfg.data!r} is empty (0 rows)")
    train_rows = int(stats["train_rows"] or 0)
    if train_rows < cfg.workers:
        raise DataError(
            f"the data set has {rows} rows ({train_rows} for training), fewer than "
            f"workers={cfg.workers}: every worker needs at least one batch of rows"
        )
    check_labels(stats, task, cfg.label_col, cfg.n_classes)
    nulls = {c: stats[f"n{i}"] for i, c in enumerate(features) if stats[f"n{i}"]}
    if nulls:
        raise DataError(f"feature columns have null values {nulls}; clean or drop them first")


def _check_shards(info: DataInfo, cfg: TrainConfig) -> None:
    smallest = min(info.shard_rows)
    if smallest < cfg.batch_size:
        k = info.shard_rows.index(smallest)
        raise DataError(
            f"worker shard {k} has {smallest} training rows, fewer than "
            f"batch_size={cfg.batch_size}; use fewer workers, a smaller batch "
            f"or more rows (shard rows: {info.shard_rows})"
        )
    if info.val_rows == 0:
        raise DataError(
            f"the validation split is empty ({info.total_rows} rows, "
            f"val_fraction={cfg.val_fraction}); use more rows"
        )
