"""A rank's reader of a shard (or of the validation set) that the data stage wrote: record
batches of bounded size, read ahead in a background thread, never the whole shard at once.

A shard is a directory of Parquet files with a ``features`` list column (the features as
read; the reader scales them by the data stage's ranges, data/scaling.py) and a ``label``
column (data/stage.py). Its unit of reading is the row group: the data stage writes row
groups of about ``ROW_GROUP_BYTES`` (``row_group_rows``), so a rank holds at most
``read_ahead + 1`` row groups and one batch at a time, whatever the shard's size.

An epoch (`ShardReader.epoch`) gives exactly ``steps`` batches of ``batch`` rows, the same
number on every rank (the collectives need it). Its order is seeded by the seed, the epoch
and the rank: the row groups of the shard in a shuffled order, and the rows of each row group
(with the few rows the previous one left over) in a shuffled order. An epoch is a function of
its number, so a resumed attempt trains its first epoch in the order that epoch would have
had. Validation (`ShardReader.batches`) reads every row once, in file order: exact metrics.

pyarrow decodes with the GIL released, so the read-ahead overlaps the training steps. The
reader counts the seconds its consumer waited for a read that had not finished
(`wait_seconds`): the input wait of the run's time split.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from trainstack_training.data.info import DataError
from trainstack_training.data.scaling import apply_scale

ROW_GROUP_BYTES = 8 * 1024**2  # a shard's row group, as the data stage writes it
READ_AHEAD = 2  # row groups read ahead of the one being consumed


def row_group_rows(n_features: int) -> int:
    """Rows per row group for `n_features` float32 features and a 4-byte label: about
    ROW_GROUP_BYTES in memory, at least 1024 rows."""
    return max(1024, ROW_GROUP_BYTES // (4 * (n_features + 1)))


@dataclass(frozen=True)
class Unit:
    """One row group of one file of a shard."""

    file: str
    index: int
    rows: int


@dataclass
class Pass:
    """One pass over a shard's row groups in one order: an epoch (its `rng` drew the order
    and then shuffles each row group's rows) or a validation pass. `submitted` of its `units`
    are being read or were, `taken` of them were consumed. `follow` makes the pass after it
    (an epoch's next), read ahead once all of this one's reads are under way."""

    key: tuple[Any, ...]
    units: list[Unit]
    rng: np.random.Generator | None = None
    follow: Callable[[], Pass] | None = None
    submitted: int = 0
    taken: int = 0


class ShardReader:
    """Batches of one shard directory (`path`), read a row group at a time.

    The reads run in one background thread, `read_ahead` row groups ahead of the one being
    consumed. An epoch asked for with `ahead` has the next epoch's first row groups read while
    its own last ones are consumed and while the rank validates and checkpoints, as a tf.data
    pipeline reads across epochs; `prefetch` starts an epoch's reads before its first step
    (in the rank's start-up). Either way at most ``read_ahead + 1`` row groups are held."""

    def __init__(
        self,
        path: str,
        *,
        read_ahead: int = READ_AHEAD,
        scale: Sequence[Sequence[float]] | None = None,
    ) -> None:
        import pyarrow.parquet as pq

        files = sorted(Path(path).glob("*.parquet"))
        self.path, self.read_ahead, self.scale = path, max(0, read_ahead), scale
        self.units: list[Unit] = []
        for f in files:
            meta = pq.ParquetFile(f).metadata
            self.units += [
                Unit(str(f), i, meta.row_group(i).num_rows)
                for i in range(meta.num_row_groups)
                if meta.row_group(i).num_rows
            ]
        self.rows = sum(u.rows for u in self.units)
        if not self.units:
            raise DataError(f"shard {path!r} has no rows")
        self.wait_seconds = 0.0
        self._pool: ThreadPoolExecutor | None = None
        self._queue: deque[tuple[Pass, Future[tuple[np.ndarray, np.ndarray]]]] = deque()
        self._passes: list[Pass] = []  # the pass being read and, once planned, its follower

    def _read(self, unit: Unit) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.ParquetFile(unit.file).read_row_group(unit.index, columns=["features", "label"])
        return unit_arrays(table, pa, self.scale)

    def _epoch_pass(self, epoch: int, seed: int, ahead: bool) -> Pass:
        """Epoch `epoch`'s pass: the row groups in the order seeded by `seed` and the epoch;
        with `ahead`, the next epoch follows it."""
        rng = np.random.default_rng([seed, epoch])
        order = [self.units[i] for i in rng.permutation(len(self.units))]
        follow = (lambda: self._epoch_pass(epoch + 1, seed, ahead)) if ahead else None
        return Pass(("epoch", epoch, seed), order, rng, follow)

    def prefetch(self, epoch: int, seed: int) -> None:
        """Start reading epoch `epoch`'s first row groups now; asking for another epoch or
        seed first drops them."""
        self._begin(self._epoch_pass(epoch, seed, ahead=False))

    def _begin(self, wanted: Pass) -> Pass:
        """The pass read from here on: the one planned ahead with `wanted`'s key and nothing
        consumed yet (its reads under way), else `wanted`; other passes' reads are dropped."""
        current = next((p for p in self._passes if p.key == wanted.key and not p.taken), wanted)
        current.follow = current.follow or wanted.follow
        while self._queue and self._queue[0][0] is not current:
            self._queue.popleft()[1].cancel()
        self._passes = [current]
        self._fill()
        return current

    def _fill(self) -> None:
        """Submit reads until `read_ahead` + 1 are pending: the current pass's next row groups,
        then its follower's first ones."""
        while self._passes and len(self._queue) <= self.read_ahead:
            last = self._passes[-1]
            if last.submitted < len(last.units):
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="trainstack-read")
                unit = last.units[last.submitted]
                self._queue.append((last, self._pool.submit(self._read, unit)))
                last.submitted += 1
            elif len(self._passes) == 1 and last.follow is not None:
                self._passes.append(last.follow())
            else:
                return

    def _end(self, done: Pass, advance: bool) -> None:
        """Pass `done` ended. Whole (`advance`) and followed: its follower becomes the current
        pass, its reads going on. Else (its consumer stopped early or failed, or nothing
        follows) every pending read is dropped and the thread ends."""
        if not self._passes or self._passes[0] is not done:
            return  # another pass began meanwhile, or this one was already ended
        if advance and done.follow is not None:
            self._begin(self._passes[1] if len(self._passes) > 1 else done.follow())
            return
        while self._queue:
            self._queue.popleft()[1].cancel()
        self._passes = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)  # a read under way finishes
            self._pool = None

    def _arrays(self, current: Pass) -> Generator[tuple[np.ndarray, np.ndarray], None, None]:
        """The arrays of `current` (the pass `_begin` made current), its reads under way."""
        try:
            for unit in current.units:
                current.taken += 1
                if self._queue and self._queue[0][0] is current:
                    future = self._queue.popleft()[1]
                    start = time.perf_counter()
                    arrays = future.result()  # a read that had not finished: the input wait
                    self.wait_seconds += time.perf_counter() - start
                    self._fill()
                else:  # another pass began on this reader meanwhile: read it here
                    arrays = self._read(unit)
                yield arrays
            self._end(current, advance=True)
        finally:  # a consumer that stopped early or failed: nothing read ahead
            self._end(current, advance=False)

    def epoch(
        self, epoch: int, steps: int, batch: int, seed: int, ahead: bool = False
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Exactly `steps` batches of `batch` rows: epoch `epoch`'s order (seeded by `seed`, the
        rank's seed, and the epoch). Needs steps x batch <= the shard's rows. `ahead`: the
        next epoch's reads start before this one ends."""
        for x, y in self.epoch_chunks(epoch, steps, batch, seed, ahead):
            for k in range(len(y) // batch):
                yield x[k * batch : (k + 1) * batch], y[k * batch : (k + 1) * batch]

    def epoch_chunks(
        self, epoch: int, steps: int, batch: int, seed: int, ahead: bool = False
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """`epoch`'s rows in the order `epoch` gives them, a row group's worth at a time, each
        chunk a multiple of `batch` rows, `steps` x `batch` rows in all (for tf.data, which
        batches a chunk in C++ rather than taking each batch from Python)."""
        if steps * batch > self.rows:
            raise DataError(
                f"shard {self.path!r} has {self.rows} rows, fewer than {steps} steps of {batch}"
            )
        plan = self._epoch_pass(epoch, seed, ahead)
        # In the state a pass planned ahead with this key has: its order drawn.
        rng = cast(np.random.Generator, plan.rng)
        left_x: np.ndarray | None = None
        left_y: np.ndarray | None = None
        wanted = steps * batch
        current = self._begin(plan)
        rows = self._arrays(current)
        try:
            for x, y in rows:
                if left_x is not None and left_y is not None and len(left_x):
                    x, y = np.concatenate([left_x, x]), np.concatenate([left_y, y])
                perm = rng.permutation(len(x))
                full = min(len(x) // batch * batch, wanted)
                if full:
                    take = perm[:full]
                    yield x[take], y[take]
                    wanted -= full
                if not wanted:  # the epoch's steps: its follower's reads go on
                    self._end(current, advance=True)
                    return
                rest = perm[full:]
                left_x, left_y = x[rest], y[rest]
        finally:
            rows.close()  # now, not when the generator is collected

    def batches(self, batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every row once, in file order, in batches of `batch` (the last one smaller)."""
        left_x: np.ndarray | None = None
        left_y: np.ndarray | None = None
        for x, y in self._arrays(self._begin(Pass(("all",), list(self.units)))):
            if left_x is not None and len(left_x):
                x, y = np.concatenate([left_x, x]), np.concatenate([left_y, y])
            full = len(x) // batch
            for k in range(full):
                yield x[k * batch : (k + 1) * batch], y[k * batch : (k + 1) * batch]
            left_x, left_y = x[full * batch :], y[full * batch :]
        if left_x is not None and left_y is not None and len(left_x):
            yield left_x, left_y


# Arrow's primitive types as NumPy's: read from the Arrow buffer itself (pyarrow's to_numpy
# imports pandas, a second of a rank's start-up).
NUMPY_TYPES = {
    "float": np.float32, "double": np.float64, "int8": np.int8, "int16": np.int16,
    "int32": np.int32, "int64": np.int64,
}  # fmt: skip


def column_values(array: Any) -> np.ndarray:
    """The values of a primitive Arrow array without nulls as a read-only NumPy view of its
    buffer; any other array through pyarrow's conversion."""
    kind = NUMPY_TYPES.get(str(array.type))
    if kind is None or array.null_count:
        return np.asarray(array.to_numpy(zero_copy_only=False))
    size = np.dtype(kind).itemsize
    return np.frombuffer(array.buffers()[1], kind, len(array), array.offset * size)


def unit_arrays(
    table: Any, pa: Any, scale: Sequence[Sequence[float]] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A table of the shard's columns as (features float32 [n, d], labels [n]): int32 class
    indices, or float32 regression targets. The features scaled by `scale` (the data stage's
    ranges, DataInfo.scale; data/scaling.py), else as stored. Read-only where they are views
    of Arrow's buffers."""
    feats = table.column("features").combine_chunks()
    if len(feats) == 0:
        return np.empty((0, 0), np.float32), np.empty(0, np.int32)
    width = len(feats[0])
    x = apply_scale(column_values(feats.flatten()).reshape(-1, width), scale)
    floats = pa.types.is_floating(table.schema.field("label").type)
    labels = column_values(table.column("label").combine_chunks())
    y = labels.astype(np.float32 if floats else np.int32, copy=False)
    return x, y


def read_labels(path: str) -> np.ndarray:
    """The label column of a shard directory alone, in row order (int32 classes or float32
    targets)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(path).glob("*.parquet"))
    if not files:
        raise DataError(f"shard {path!r} has no rows")
    column = pq.read_table(files, columns=["label"]).column("label")
    floats = pa.types.is_floating(column.type)
    return column_values(column.combine_chunks()).astype(np.float32 if floats else np.int32)
