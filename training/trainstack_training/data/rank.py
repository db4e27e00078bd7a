"""A rank's data: its shard and the validation set, in memory or streamed, and the rule that
picks one (docs/training.md, "Streaming").

In memory, a rank holds its whole shard and the whole validation set as arrays (`ctx.x`,
`ctx.y`, ...), read once: the fastest input for data that fits. Streamed, it reads them a row
group at a time (data/stream.py): memory bounded by the row groups in flight, not by the
shard. With ``data_stream = "auto"`` a rank streams when its in-memory arrays would take more
than ``MEMORY_SHARE`` of the memory its container may use (its cgroup's limit, else the
machine's memory): the framework's copy of the arrays, its own memory and its peers on the node
need the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainstack_training.data.info import DataInfo
from trainstack_training.data.shards import load_arrays
from trainstack_training.data.stream import ShardReader, read_labels
from trainstack_training.memwatch import cgroup_of

STREAM_MODES = ("auto", "on", "off")  # TrainConfig.data_stream
MEMORY_SHARE = 0.25  # of the container's memory limit, for a rank's in-memory arrays
# What the in-memory path holds per byte of the arrays: the arrays, the Arrow table they came
# from while they are read, and the framework's copy (tf.data's tensors, torch's tensors).
MEMORY_COPIES = 3
VAL_BATCH = 1024  # the smallest validation batch (the metrics do not depend on it)


class ShardTooLargeError(Exception):
    """A job asked for the in-memory arrays of a rank that streams (the sentence says why).
    Raised in the user's code, it reaches them as their error (job.call_user)."""


def in_memory_bytes(rows: int, n_features: int, feature_bytes: int = 4) -> int:
    """What a rank's arrays of `rows` rows take in memory on the in-memory path, copies
    included (MEMORY_COPIES): the float32 arrays and the framework's copy, and the Arrow
    table they are read from, whose features are `feature_bytes` each as stored."""
    table = rows * (n_features * feature_bytes + 4)
    return rows * (n_features + 1) * 4 * (MEMORY_COPIES - 1) + table


@dataclass(frozen=True)
class InputChoice:
    """Which input a rank uses, and why (shown in metrics.json per worker)."""

    mode: str  # "memory" or "stream"
    reason: str
    needed_bytes: int  # the in-memory path's estimate for this rank
    limit_bytes: int  # the container's memory limit (0: unknown)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.mode,
            "input_reason": self.reason,
            "in_memory_mb": round(self.needed_bytes / 1024**2, 1),
            "memory_limit_mb": round(self.limit_bytes / 1024**2, 1),
        }


def choose_input(
    setting: str, rows: int, n_features: int, limit: int, feature_bytes: int = 4
) -> InputChoice:
    """The rule: `setting` "on" streams, "off" holds the arrays; "auto" streams when the
    in-memory estimate is above MEMORY_SHARE of `limit` (0: unknown, then in memory)."""
    needed = in_memory_bytes(rows, n_features, feature_bytes)
    budget = int(limit * MEMORY_SHARE)
    if setting == "on":
        return InputChoice("stream", "data_stream=on", needed, limit)
    if setting == "off":
        return InputChoice("memory", "data_stream=off", needed, limit)
    if limit and needed > budget:
        why = f"{_mib(needed)} in memory > {MEMORY_SHARE:.0%} of the {_mib(limit)} limit"
        return InputChoice("stream", why, needed, limit)
    why = (
        f"{_mib(needed)} in memory <= {MEMORY_SHARE:.0%} of the {_mib(limit)} limit"
        if limit
        else "no memory limit known"
    )
    return InputChoice("memory", why, needed, limit)


def _mib(n: int) -> str:
    return f"{n / 1024**2:,.0f} MiB" if n < 10 * 1024**3 else f"{n / 1024**3:,.1f} GiB"


@dataclass
class RankData:
    """One rank's shard and the validation set, as its input choice says: arrays read on
    first use (memory), or readers (stream). Both give `batches`/`val_batches`."""

    info: DataInfo
    rank: int
    seed: int
    batch_size: int
    steps_per_epoch: int
    choice: InputChoice
    start_epoch: int = 0  # the first epoch of this attempt's fit (a resume starts later)
    epochs: int = 0  # the run's epochs: a streamed epoch before the last reads the next ahead
    _arrays: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _labels: dict[str, np.ndarray] = field(default_factory=dict)  # streamed: labels alone
    _readers: dict[str, ShardReader] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        info: DataInfo,
        rank: int,
        seed: int,
        batch_size: int,
        steps_per_epoch: int,
        setting: str,
        limit: int | None = None,
        epochs: int = 0,
    ) -> RankData:
        rows = info.shard_rows[rank] + info.val_rows
        limit = cgroup_of(os.getpid()).limit_bytes if limit is None else limit
        choice = choose_input(setting, rows, info.n_features, limit, info.feature_bytes)
        return cls(info, rank, seed, batch_size, steps_per_epoch, choice, epochs=epochs)

    def open(self) -> None:
        """Read the arrays now (memory), or open the readers (stream: the files' metadata, and
        pyarrow's Parquet reader imported) and start reading the first epoch's row groups, so
        that the rank's start-up pays for it, not its first step."""
        for part in ("train", "val"):
            if self.streams:
                self.reader(part)
            else:
                self.arrays(part)
        if self.streams:
            self.reader("train").prefetch(self.start_epoch, self.seed + self.rank)

    @property
    def streams(self) -> bool:
        return self.choice.mode == "stream"

    def _where(self, part: str) -> str:
        return self.info.shard_dir(self.rank) if part == "train" else self.info.val_dir

    def arrays(self, part: str, name: str = "") -> tuple[np.ndarray, np.ndarray]:
        """The whole shard ("train") or validation set ("val") as arrays, read once; a rank
        that streams refuses (ShardTooLargeError, one sentence naming `name`, what asked)."""
        if self.streams:
            rows = self.info.shard_rows[self.rank] if part == "train" else self.info.val_rows
            what = "this worker's whole shard" if part == "train" else "the validation set"
            raise ShardTooLargeError(
                f"{name or 'the arrays'} would hold {what} in memory ({rows:,} rows x "
                f"{self.info.n_features} features), but this rank streams its data "
                f"({self.choice.reason}): read it with ctx.batches(epoch) and "
                "ctx.val_batches() (docs/jobs.md), use more workers, or set data_stream=off "
                "to hold it anyway"
            )
        if part not in self._arrays:
            self._arrays[part] = load_arrays(self._where(part), self.info.scale)
        return self._arrays[part]

    def labels(self, part: str) -> np.ndarray:
        """The labels of the shard ("train") or the validation set ("val"), in row order: a
        fraction of the arrays (4 bytes a row), so a rank that streams reads them too (the
        label column alone), e.g. for a label's mean or its classes' weights."""
        if not self.streams:
            return self.arrays(part)[1]
        if part not in self._labels:
            self._labels[part] = read_labels(self._where(part))
        return self._labels[part]

    def reader(self, part: str) -> ShardReader:
        if part not in self._readers:
            self._readers[part] = ShardReader(self._where(part), scale=self.info.scale)
        return self._readers[part]

    def batches(self, epoch: int, batch: int | None = None) -> Iterator[tuple[Any, Any]]:
        """Epoch `epoch`'s batches of this rank: steps_per_epoch of them, `batch` rows each
        (default: batch_size), in an order seeded by the seed, the rank and the epoch."""
        batch = batch or self.batch_size
        steps = self.steps_per_epoch * self.batch_size // batch
        seed = self.seed + self.rank
        if self.streams:
            yield from self.reader("train").epoch(epoch, steps, batch, seed, self._ahead(epoch))
            return
        x, y = self.arrays("train")
        order = np.random.default_rng([seed, epoch]).permutation(len(x))
        for k in range(steps):
            take = order[k * batch : (k + 1) * batch]
            yield x[take], y[take]

    def chunks(self, epoch: int, batch: int) -> Iterator[tuple[Any, Any]]:
        """Epoch `epoch`'s rows of a streaming rank, as `batches` gives them, in chunks of
        whole batches (a row group's worth each)."""
        steps = self.steps_per_epoch * self.batch_size // batch
        seed = self.seed + self.rank
        yield from self.reader("train").epoch_chunks(epoch, steps, batch, seed, self._ahead(epoch))

    def _ahead(self, epoch: int) -> bool:
        """Whether a streamed epoch reads the next one's first row groups before it ends: not
        the run's last (`epochs`; 0: unknown, always)."""
        return not self.epochs or epoch + 1 < self.epochs

    def val_batches(self, batch: int = 0) -> Iterator[tuple[Any, Any]]:
        """Every validation row once, in batches of `batch` (default: the larger of batch_size
        and VAL_BATCH; the last one smaller)."""
        batch = batch or max(self.batch_size, VAL_BATCH)
        if self.streams:
            yield from self.reader("val").batches(batch)
            return
        x, y = self.arrays("val")
        for first in range(0, len(x), batch):
            yield x[first : first + batch], y[first : first + batch]

    def label_is_float(self) -> bool:
        return self.info.task != "classification"

    def wait_seconds(self) -> float:
        """Seconds this rank waited for reads that had not finished (streaming)."""
        return sum(r.wait_seconds for r in self._readers.values())


@dataclass
class NoRankData:
    """ctx's data of a job that reads its own data (`data = "none"`): no data stage ran. The
    job's ctx.x, ctx.y, ctx.x_val, ctx.y_val, ctx.batches() and ctx.val_batches() refuse
    (JobContext: NoDataError); trainstack's own uses of it see an empty shard."""

    own_data: bool = True
    streams: bool = False
    start_epoch: int = 0
    choice: InputChoice = field(
        default_factory=lambda: InputChoice("none", "the job reads its own data", 0, 0)
    )

    def open(self) -> None:
        """Nothing to read."""

    def arrays(self, part: str, name: str = "") -> tuple[Any, Any]:
        return np.zeros((0, 0), np.float32), np.zeros((0,), np.float32)

    def labels(self, part: str) -> Any:
        return self.arrays(part)[1]

    def batches(self, epoch: int, batch: int | None = None) -> Iterator[tuple[Any, Any]]:
        return iter(())

    def val_batches(self, batch: int = 0) -> Iterator[tuple[Any, Any]]:
        return iter(())

    def label_is_float(self) -> bool:
        return False

    def wait_seconds(self) -> float:
        return 0.0
