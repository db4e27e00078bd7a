"""The small-set paths' end ("arrow" and "driver"): the checks, statistics and shard files of a
set prepared in the driver with numpy and pyarrow, from the Arrow table either path reads (the
features as double, the label, each row's split and shard).

The results are the distributed path's, bit for bit once a rank scales them: the same split
and shards, and the same ranges (min/max over the training rows).

Runs in the training driver process (`trainstack-train`), called by `prepare` (stage.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from trainstack_training.config import CLASSIFICATION, TrainConfig
from trainstack_training.data.checks import _check_stats
from trainstack_training.data.scaling import feature_scale
from trainstack_training.data.stream import row_group_rows


def _prepare_in_driver(
    table: Any,
    cfg: TrainConfig,
    features: list[str],
    label_integral: bool,
    task: str,
    train_dir: Path,
    val_dir: Path,
) -> tuple[list[int], int, list[list[float]]]:
    """The distributed path's checks, statistics and shard files, on an Arrow table of
    `_f<i>` (features as double), `_label`, `_val` and `_shard` (computed by Spark).

    Same results as the Spark path: the split and shards come from the same Spark
    expressions, and the ranges are the min/max over the training rows, by which a rank
    scales the features (data/scaling.py). Returns (rows per shard, validation rows, each
    feature's [low, span]).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    n = table.num_rows
    is_val = np.asarray(table.column("_val").to_numpy(zero_copy_only=False), dtype=bool)
    train = ~is_val
    train_mask = pa.array(train)
    label = table.column("_label")
    label_mm = pc.min_max(label)
    stats: dict[str, Any] = {
        "rows": n,
        "train_rows": int(train.sum()),
        "null_labels": label.null_count,
        "min_label": label_mm["min"].as_py(),
        "max_label": label_mm["max"].as_py(),
    }
    if not label_integral:
        stats.update(float_label_stats(label))
    for i in range(len(features)):
        col = table.column(f"_f{i}")
        mm = pc.min_max(col.filter(train_mask))
        stats[f"n{i}"] = col.null_count
        stats[f"lo{i}"], stats[f"hi{i}"] = mm["min"].as_py(), mm["max"].as_py()
    _check_stats(stats, cfg, features, task)

    # The features as read (float64, Spark's cast of them): the ranks scale them by the
    # ranges (data/scaling.py), as they do the distributed path's.
    x = np.column_stack(
        [
            np.asarray(table.column(f"_f{i}").to_numpy(zero_copy_only=False), np.float64)
            for i in range(len(features))
        ]
    )
    y = np.asarray(label.to_numpy(zero_copy_only=False)).astype(label_dtype(task))
    shard = np.asarray(table.column("_shard").to_numpy(zero_copy_only=False))

    def write(directory: Path, rows: np.ndarray) -> int:
        count = int(rows.sum())
        if count:  # like Spark's partitioned write: no directory for an empty shard
            directory.mkdir(parents=True, exist_ok=True)
            flat = pa.array(x[rows].reshape(-1), type=pa.float64())
            offsets = pa.array(np.arange(count + 1, dtype=np.int32) * len(features))
            out = pa.table(
                {
                    "features": pa.ListArray.from_arrays(offsets, flat),
                    "label": pa.array(y[rows]),
                }
            )
            pq.write_table(
                out, directory / "part-00000.parquet", row_group_size=row_group_rows(len(features))
            )
        return count

    for directory in (train_dir, val_dir):
        shutil.rmtree(directory, ignore_errors=True)
    shard_rows = [write(train_dir / f"shard={k}", train & (shard == k)) for k in range(cfg.workers)]
    return shard_rows, write(val_dir, is_val), feature_scale(stats, len(features))


def float_label_stats(label: Any) -> dict[str, Any]:
    """The statistics of a float label column (an Arrow array) that the Spark path's
    aggregation computes too: its non-finite values and, of the finite ones, those with a
    fraction (that a classification refuses), each with an example."""
    values = np.asarray(label.to_numpy(zero_copy_only=False), dtype=np.float64)
    valid = np.asarray(label.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    nonfinite = valid & ~np.isfinite(values)
    frac = valid & np.isfinite(values) & (values != np.floor(values))
    return {
        "nonfinite_labels": int(nonfinite.sum()),
        "nonfinite_example": float(values[nonfinite][0]) if nonfinite.any() else None,
        "frac_labels": int(frac.sum()),
        "frac_example": float(values[frac][0]) if frac.any() else None,
    }


def label_dtype(task: str) -> type[np.generic]:
    """The labels' type in the shards: int32 class indices, or float32 regression targets."""
    return np.int32 if task == CLASSIFICATION else np.float32
