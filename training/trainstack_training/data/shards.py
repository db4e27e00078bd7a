"""A shard the data stage wrote, read back whole into arrays (`load_arrays`): the in-memory
input of a rank (data/rank.py; a rank that streams reads it with data/stream.py instead).

Runs in a rank's process (one task of the job's Spark barrier stage, train.py), not in the
driver: the data stage only writes the shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trainstack_training.data.info import DataError
from trainstack_training.data.stream import unit_arrays


def load_arrays(
    path: str, scale: Sequence[Sequence[float]] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read a shard written by prepare() into (features float32 [n, d], labels [n]): int32
    class indices for a classification, float32 targets for a regression. The features
    scaled by `scale` (DataInfo.scale), else as stored. The whole shard in memory: a rank
    whose shard does not fit streams it (data/stream.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(path).glob("*.parquet"))
    table = pq.read_table(files, columns=["features", "label"]) if files else None
    if table is None or table.num_rows == 0:
        raise DataError(f"shard {path!r} has no rows")
    return unit_arrays(table, pa, scale)
