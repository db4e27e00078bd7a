"""A rank's streamed input (data/stream.py) and the rule that picks it (data/rank.py), on real
Parquet shards written as the data stage writes them; no Spark, no framework."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trainstack_training.config import TrainConfig
from trainstack_training.context import JobContext, UserCodeError, call_user
from trainstack_training.data import DataError, DataInfo, prepare
from trainstack_training.data import stream as stream_module
from trainstack_training.data.rank import (
    MEMORY_SHARE,
    RankData,
    ShardTooLargeError,
    choose_input,
    in_memory_bytes,
)
from trainstack_training.data.stream import ShardReader
from trainstack_training.manifest import JobSpec

pytestmark = pytest.mark.unit

FEATURES = 3


def write_shard(directory: Path, rows: int, row_group: int, files: int = 2) -> np.ndarray:
    """A shard of `rows` rows whose label is the row's number and whose features are
    3 * label + (0, 1, 2): any batch shows whether its rows stayed whole."""
    directory.mkdir(parents=True, exist_ok=True)
    labels = np.arange(rows, dtype=np.int32)
    x = (labels[:, None] * FEATURES + np.arange(FEATURES)).astype(np.float32)
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * FEATURES)
    table = pa.table(
        {
            "features": pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1))),
            "label": pa.array(labels),
        }
    )
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for k in range(files):
        part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
        pq.write_table(part, directory / f"part-{k:05d}.parquet", row_group_size=row_group)
    return labels


def whole_rows(x: np.ndarray, y: np.ndarray) -> bool:
    return bool((x == (y[:, None] * FEATURES + np.arange(FEATURES))).all())


def test_an_epoch_is_exactly_its_steps_each_row_at_most_once(tmp_path: Path) -> None:
    write_shard(tmp_path, 5000, 700)
    reader = ShardReader(str(tmp_path))
    assert reader.rows == 5000 and len(reader.units) == 8  # 2 files x 4 row groups
    batches = list(reader.epoch(0, 5000 // 64, 64, seed=7))
    assert len(batches) == 5000 // 64 and all(len(y) == 64 for _, y in batches)
    assert all(whole_rows(x, y) for x, y in batches)
    labels = np.concatenate([y for _, y in batches])
    assert len(set(labels.tolist())) == len(labels)  # no row twice in an epoch


def test_the_order_is_seeded_by_seed_and_epoch_and_changes_each_epoch(tmp_path: Path) -> None:
    write_shard(tmp_path, 3000, 500)
    reader = ShardReader(str(tmp_path))

    def labels(epoch: int, seed: int) -> list[int]:
        return np.concatenate([y for _, y in reader.epoch(epoch, 40, 50, seed)]).tolist()

    assert labels(0, 1) == labels(0, 1)  # a resumed attempt trains the epoch's own order
    assert labels(0, 1) != labels(1, 1)  # reshuffled each epoch
    assert labels(0, 1) != labels(0, 2)  # each rank its own (the seed is the rank's)
    assert labels(0, 1) != sorted(labels(0, 1))  # shuffled, rows and row groups


def test_validation_reads_every_row_once_in_order(tmp_path: Path) -> None:
    expected = write_shard(tmp_path, 2500, 600)
    batches = list(ShardReader(str(tmp_path)).batches(1024))
    assert [len(y) for _, y in batches] == [1024, 1024, 452]
    assert (np.concatenate([y for _, y in batches]) == expected).all()
    assert all(whole_rows(x, y) for x, y in batches)


def test_the_reader_holds_only_the_read_ahead(tmp_path: Path) -> None:
    write_shard(tmp_path, 8000, 500, files=1)  # 16 row groups

    class Counting(ShardReader):
        reads = 0

        def _read(self, unit: stream_module.Unit) -> tuple[np.ndarray, np.ndarray]:
            Counting.reads += 1
            return super()._read(unit)

    reader = Counting(str(tmp_path), read_ahead=2)
    it = reader.epoch(0, 100, 32, seed=0)
    next(it)
    assert Counting.reads <= 3, Counting.reads  # the row group in use and two ahead
    it.close()  # an epoch's end: pending reads are dropped, the thread ends
    assert Counting.reads <= 4, Counting.reads


def epoch_labels(reader: ShardReader, epoch: int, ahead: bool = False) -> list[int]:
    return np.concatenate([y for _, y in reader.epoch(epoch, 60, 32, 3, ahead)]).tolist()


def test_reading_ahead_across_epochs_keeps_each_epochs_order(tmp_path: Path) -> None:
    write_shard(tmp_path, 2000, 300)
    plain = ShardReader(str(tmp_path))
    expected = [epoch_labels(plain, e) for e in range(3)]
    ahead = ShardReader(str(tmp_path))
    ahead.prefetch(0, 3)
    assert [epoch_labels(ahead, e, ahead=True) for e in range(3)] == expected
    ahead.prefetch(5, 3)  # a resume elsewhere: the prefetched epoch is not the one asked for
    assert epoch_labels(ahead, 1) == expected[1]


def test_an_epoch_read_ahead_reads_the_next_before_its_end(tmp_path: Path) -> None:
    write_shard(tmp_path, 8000, 500, files=1)  # 16 row groups

    class Logged(ShardReader):
        def _read(self, unit: stream_module.Unit) -> tuple[np.ndarray, np.ndarray]:
            log.append(unit.index)
            return super()._read(unit)

    log: list[int] = []
    reader = Logged(str(tmp_path), read_ahead=2)
    epoch0 = [u.index for u in reader._epoch_pass(0, 3, False).units]
    epoch1 = [u.index for u in reader._epoch_pass(1, 3, False).units]
    for _ in reader.epoch(0, 8000 // 32, 32, 3, ahead=True):
        pass
    reader._pool.shutdown(wait=True)  # type: ignore[union-attr]  # the pending reads done
    # Epoch 0's row groups once each, then epoch 1's first ones: at most read_ahead + 1.
    assert log[:16] == epoch0 and 1 <= len(log) - 16 <= 3 and log[16:] == epoch1[: len(log) - 16]


def test_the_last_epoch_reads_nothing_ahead(tmp_path: Path) -> None:
    write_shard(tmp_path, 2000, 300)
    data = rank_data(tmp_path / "d", "on")
    data.epochs = 2
    assert data._ahead(0) and not data._ahead(1)
    for _ in data.batches(1):
        pass
    reader = data.reader("train")
    assert not reader._queue and not reader._passes and reader._pool is None  # thread ended


def test_an_epoch_stopped_early_reads_nothing_ahead(tmp_path: Path) -> None:
    write_shard(tmp_path, 2000, 300)
    reader = ShardReader(str(tmp_path))
    it = reader.epoch(0, 60, 32, 3, ahead=True)
    next(it)
    it.close()  # a failed step, or a full-mode loop that stopped: no next epoch is read
    assert not reader._queue and not reader._passes and reader._pool is None


def test_more_steps_than_rows_is_refused(tmp_path: Path) -> None:
    write_shard(tmp_path, 100, 50)
    with pytest.raises(DataError, match="100 rows, fewer than 5 steps of 32"):
        next(ShardReader(str(tmp_path)).epoch(0, 5, 32, seed=0))


def test_auto_streams_above_a_quarter_of_the_limit() -> None:
    limit = 2 * 1024**3
    rows = int(limit * MEMORY_SHARE) // in_memory_bytes(1, 32)
    # float64 features as stored: the Arrow table they are read from is twice as large.
    assert in_memory_bytes(1, 32, 8) - in_memory_bytes(1, 32) == 32 * 4
    assert choose_input("auto", rows, 32, limit).mode == "memory"
    big = choose_input("auto", rows + 1000, 32, limit)
    assert big.mode == "stream" and "of the 2,048 MiB limit" in big.reason, big
    assert choose_input("on", 10, 32, limit).mode == "stream"
    assert choose_input("off", 10**9, 32, limit).mode == "memory"
    assert choose_input("auto", 10**9, 32, 0).reason == "no memory limit known"
    assert big.to_dict()["memory_limit_mb"] == 2048.0


def rank_data(tmp_path: Path, setting: str) -> RankData:
    write_shard(tmp_path / "train" / "shard=0", 2000, 300)
    write_shard(tmp_path / "val", 700, 300, files=1)
    info = DataInfo(
        train_dir=str(tmp_path / "train"), val_dir=str(tmp_path / "val"), n_features=FEATURES,
        n_classes=10, feature_cols=["a", "b", "c"], shard_rows=[2000], val_rows=700,
        total_rows=2700, seconds=0.0,
    )  # fmt: skip
    return RankData.create(info, 0, 42, 32, 2000 // 32, setting, limit=2 * 1024**3)


@pytest.mark.parametrize("setting", ["on", "off"])
def test_both_inputs_give_the_same_steps_and_the_whole_validation_set(
    tmp_path: Path, setting: str
) -> None:
    data = rank_data(tmp_path, setting)
    assert data.streams == (setting == "on")
    for epoch in (0, 1):
        batches = list(data.batches(epoch))
        assert len(batches) == 2000 // 32 and all(whole_rows(x, y) for x, y in batches)
    val = np.concatenate([y for _, y in data.val_batches()])
    assert (val == np.arange(700)).all()


def context(data: RankData) -> JobContext:
    return JobContext(
        params={}, rank=0, world_size=1, is_chief=True, strategy=None, tf=None, data=data,
        n_features=FEATURES, n_classes=10, batch_size=32, epochs=1, learning_rate=0.1, seed=42,
        steps_per_execution=1, steps_per_epoch=data.steps_per_epoch, run_dir="",
        checkpoint_dir="", model_path="",
    )  # fmt: skip


def test_ctx_x_of_a_streaming_rank_is_one_sentence_not_an_oom(tmp_path: Path) -> None:
    # Raised in the user's code, where call_user makes it their error (with their line).
    ctx = context(rank_data(tmp_path, "on"))
    with pytest.raises(ShardTooLargeError) as raised:
        _ = ctx.x
    message = str(raised.value)
    assert message.startswith(
        "ctx.x would hold this worker's whole shard in memory (2,000 rows x 3 features), but "
        "this rank streams its data (data_stream=on)"
    ), message
    assert "ctx.batches(epoch)" in message and "\n" not in message
    # The labels alone are a fraction of it (4 bytes a row): there, read from their column.
    assert (ctx.y == np.arange(2000)).all() and (ctx.y_val == np.arange(700)).all()
    spec = JobSpec(str(tmp_path), "m", "m.py", "full", has_datasets=False)

    def user_code(ctx: JobContext) -> object:
        return ctx.x_val

    with pytest.raises(UserCodeError, match=r"^your code failed: ShardTooLargeError: ctx.x_val "):
        call_user(spec, user_code, ctx)
    assert sum(len(y) for _, y in ctx.batches(0)) == (2000 // 32) * 32


def test_ctx_x_of_a_rank_in_memory_is_its_shard(tmp_path: Path) -> None:
    ctx = context(rank_data(tmp_path, "off"))
    assert ctx.x.shape == (2000, FEATURES) and whole_rows(ctx.x, ctx.y)
    assert len(ctx.y_val) == 700 and not ctx.streams


def test_the_data_stage_writes_row_groups_sized_for_streaming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The arrow path (a small local Parquet set, no Spark): each shard in row groups of
    # row_group_rows(features) rows, here made small.
    monkeypatch.setattr(stream_module, "ROW_GROUP_BYTES", 1)  # the floor: 1024 rows
    rng = np.random.default_rng(0)
    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"a": rng.random(6000), "b": rng.random(6000), "label": rng.integers(0, 3, 6000)}),
        source,
    )
    cfg = TrainConfig(data=str(source), workers=2, n_classes=3)

    def no_spark() -> None:
        raise AssertionError("the arrow path starts no Spark")

    info = prepare(no_spark, cfg, tmp_path / "run")  # type: ignore[arg-type]
    assert info.path == "arrow"
    for k in range(2):
        meta = pq.ParquetFile(next(Path(info.shard_dir(k)).glob("*.parquet"))).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert meta.num_row_groups >= 2 and max(sizes) == 1024, sizes


def test_tf_chunks_are_the_epochs_batches_whole_batches_at_a_time(tmp_path: Path) -> None:
    # TensorFlow's input takes an epoch a row group's worth at a time and batches it itself:
    # the same rows, in the same order, as the batches torch's loop takes.
    write_shard(tmp_path, 3000, 700)
    reader = ShardReader(str(tmp_path))
    chunks = list(reader.epoch_chunks(3, 45, 64, seed=5))
    assert all(len(y) % 64 == 0 for _, y in chunks) and sum(len(y) for _, y in chunks) == 45 * 64
    batches = np.concatenate([y for _, y in reader.epoch(3, 45, 64, seed=5)])
    assert (np.concatenate([y for _, y in chunks]) == batches).all()


def test_a_datasets_hook_on_a_streaming_rank_is_refused_in_one_sentence(tmp_path: Path) -> None:
    from trainstack_training.frameworks.base import datasets_in_memory

    ctx = context(rank_data(tmp_path, "on"))
    spec = JobSpec(str(tmp_path), "m", "m.py", "simple", has_datasets=True)
    with pytest.raises(UserCodeError) as raised:
        datasets_in_memory(ctx, spec)
    assert str(raised.value) == (
        "your code failed: datasets(ctx) in m.py transforms the whole shard in memory, but this "
        "rank streams its data (data_stream=on); transform the batches of ctx.batches(epoch) "
        "in a full-mode train(ctx), use more workers, or set data_stream=off to hold the "
        "shard anyway"
    )
    datasets_in_memory(context(rank_data(tmp_path / "m", "off")), spec)  # in memory: fine


def test_a_rank_scales_as_spark_does_in_chunks_of_any_size(monkeypatch) -> None:
    from trainstack_training.data import scaling

    rng = np.random.default_rng(5)
    x = rng.normal(3.0, 40.0, (1001, 4))
    scale = scaling.feature_scale(
        {"lo0": -7.5, "hi0": 9.25, "lo1": 2.0, "hi1": 2.0, "lo2": None, "hi2": None,
         "lo3": 0.1, "hi3": 0.3},
        4,
    )  # fmt: skip
    assert scale[1] == [2.0, 1.0] and scale[2] == [0.0, 1.0]  # constant, then all null
    # Spark's ((cast(x as double) - lo) / span).cast("float"), column by column.
    spark = np.column_stack(
        [((x[:, i] - lo) / span).astype(np.float32) for i, (lo, span) in enumerate(scale)]
    )
    monkeypatch.setattr(scaling, "SCALE_ROWS", 7)
    chunked = scaling.apply_scale(x, scale)
    assert chunked.dtype == np.float32 and np.array_equal(chunked, spark)
    as_float32 = x.astype(np.float32)
    assert np.array_equal(
        scaling.apply_scale(as_float32, scale),
        scaling.apply_scale(as_float32.astype(np.float64), scale),
    )
    with pytest.raises(ValueError, match="4 feature columns, but a scale for 3"):
        scaling.apply_scale(x, scale[:3])


def test_the_stream_and_the_arrays_scale_a_shard_alike(tmp_path: Path) -> None:
    from trainstack_training.data import load_arrays

    labels = write_shard(tmp_path, 3000, 500)
    scale = [[0.0, 3.0 * 3000], [1.0, 2.0], [-4.0, 0.5]]
    x, y = load_arrays(str(tmp_path), scale)
    raw = (labels[:, None] * FEATURES + np.arange(FEATURES)).astype(np.float64)
    lo, span = np.array(scale).T
    assert np.array_equal(y, labels) and np.array_equal(x, ((raw - lo) / span).astype(np.float32))
    streamed = np.concatenate([b for b, _ in ShardReader(str(tmp_path), scale=scale).batches(256)])
    assert np.array_equal(streamed, x)
