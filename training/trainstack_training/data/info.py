"""What the data stage gives every training task (`DataInfo`), and its one error."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainstack_training.config import CLASSIFICATION


class DataError(ValueError):
    """The data set cannot be used; the message names the cause and what is allowed."""


@dataclass
class DataInfo:
    """What the data stage produced; passed to every training task (JSON-serialisable)."""

    train_dir: str  # contains shard=<k>/ Parquet directories, one per worker
    val_dir: str
    n_features: int
    n_classes: int  # a classification's classes; 0 for a regression
    feature_cols: list[str]
    shard_rows: list[int]
    val_rows: int
    total_rows: int
    seconds: float
    # "arrow": read with pyarrow and split in the driver, no Spark (small Parquet
    # sets); "driver": one Spark read job, then prepared in the driver (other small inputs);
    # "spark": the distributed Spark stage (an aggregation job and one partitioned write).
    path: str = "spark"
    phases: dict[str, float] = field(default_factory=dict)  # seconds per data-stage phase
    # "classification" (int32 labels in [0, n_classes)) or "regression" (float32 labels):
    # the manifest's task, else inferred from the label column (data/task.py).
    task: str = CLASSIFICATION
    # Each feature's [low, span] over the training rows: the shards hold the features as
    # read, and a rank scales them, float32((float64(x) - low) / span) (data/scaling.py).
    # None: the shards hold them scaled.
    scale: list[list[float]] | None = None
    # The bytes of one stored feature value: 4 (float32) or 8 (float64), for the in-memory
    # estimate of a rank (data/rank.py).
    feature_bytes: int = 4

    @property
    def train_rows(self) -> int:
        return sum(self.shard_rows)

    def shard_dir(self, index: int) -> str:
        return str(Path(self.train_dir) / f"shard={index}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DataInfo:
        return cls(**json.loads(text))
