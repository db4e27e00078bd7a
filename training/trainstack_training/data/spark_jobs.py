"""The data stage's Spark jobs: the schema check of a set Spark reads and its size estimate,
the "driver" path's one job (the set's columns, split and shard as an Arrow table), and the
distributed path's one: the write of the features as read, partitioned by shard (the
validation rows a partition of their own), whose pass also computes the statistics (the row
counts, the label's checks, each feature's nulls and range over the training rows) as
observed metrics. A job's failure to read the set is one sentence here.

Runs in the training driver process (`trainstack-train`), called by `prepare` (stage.py): it
builds the jobs, and Spark's executors run them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.config import CLASSIFICATION, TrainConfig
from trainstack_training.data.info import DataError
from trainstack_training.data.sources import _java_cause, _spark_uri, storage_error
from trainstack_training.data.stream import ROW_GROUP_BYTES
from trainstack_training.data.task import non_numeric_label

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The partition of the data stage's one write that holds the validation rows (the shards are
# 0 .. workers-1).
VAL_PARTITION = -1


def _check_schema(df: DataFrame, cfg: TrainConfig) -> tuple[list[str], bool]:
    """Return (feature columns, label_is_integral); raise DataError on a bad schema."""
    from pyspark.sql.types import FractionalType, IntegralType, NumericType

    types = {f.name: f.dataType for f in df.schema.fields}
    if cfg.label_col not in types:
        raise DataError(
            f"label column {cfg.label_col!r} is missing; columns are "
            f"{sorted(types)} (set --label-col)"
        )
    wanted = cfg.feature_list() or [c for c in df.columns if c != cfg.label_col]
    missing = [c for c in wanted if c not in types]
    if missing:
        raise DataError(f"feature columns {missing} are missing; columns are {sorted(types)}")
    if not wanted:
        raise DataError("no feature columns: the data set has only the label column")
    bad = [
        f"{c} ({types[c].simpleString()})" for c in wanted if not isinstance(types[c], NumericType)
    ]
    if bad:
        raise DataError(f"feature columns must be numeric; not numeric: {bad}")
    label_type = types[cfg.label_col]
    if not isinstance(label_type, IntegralType | FractionalType):
        sample = df.select(cfg.label_col).dropna().first()  # one small job, on failure only
        raise non_numeric_label(
            cfg.label_col,
            label_type.simpleString(),
            sample[0] if sample else None,
            cfg.task,
            cfg.n_classes,
        )
    return wanted, isinstance(label_type, IntegralType)


def _estimated_bytes(df: DataFrame) -> int | None:
    """Spark's size estimate of the read (the files' size; no job runs), None if unknown."""
    try:
        stats = df._jdf.queryExecution().optimizedPlan().stats()
        return int(str(stats.sizeInBytes()))
    except Exception:  # an API change must not break the job: take the distributed path
        return None


def _collect(df: DataFrame, uri: str) -> Any:
    """The one Spark job of the driver path: the selected columns as an Arrow table."""
    try:
        return df.toArrow()
    except Exception as exc:  # e.g. a path that vanished or unreadable files
        raise _read_failure(uri, exc) from None


def _read_failure(uri: str, exc: Exception) -> DataError:
    """A Spark job's failure to read the data set, as one sentence: its Java exception's
    first line, named (storage_error) where it says what went wrong."""
    cause = _java_cause(exc)
    return storage_error(uri, cause) or DataError(f"cannot read data at {uri!r}: {cause}")


def _stats_columns(
    F: Any,  # noqa: N803 (pyspark.sql.functions, as the PySpark idiom names it)
    label: Any,
    train: Any,
    features: list[str],
    label_integral: bool,
) -> list[Any]:
    """The aggregations of the data stage's one pass over the data, observed as it writes
    (`_write_shards`): the row counts, the label's checks, and each feature's nulls and its
    range over the training rows (the null features' count only: `null_feature_counts`)."""
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(train.cast("long")).alias("train_rows"),
        F.sum(label.isNull().cast("long")).alias("null_labels"),
        F.min(label).alias("min_label"),
        F.max(label).alias("max_label"),
    ]
    if not label_integral:
        nonfinite = F.isnan(label) | (F.abs(label) == F.lit(float("inf")))
        aggs.append(F.sum(nonfinite.cast("long")).alias("nonfinite_labels"))
        aggs.append(F.first(F.when(nonfinite, label), ignorenulls=True).alias("nonfinite_example"))
        fractional = ~nonfinite & (label != F.floor(label))
        aggs.append(F.sum(fractional.cast("long")).alias("frac_labels"))
        aggs.append(F.first(F.when(fractional, label), ignorenulls=True).alias("frac_example"))
    # One count of the rows with a null feature, not one per feature: a set that has any pays
    # for the per-feature counts that name them (`null_feature_counts`), a clean one does not.
    any_null = F.lit(False)
    for c in features:
        any_null = any_null | F.col(c).isNull()
    aggs.append(F.sum(any_null.cast("long")).alias("null_feature_rows"))
    for i, c in enumerate(features):
        col = F.col(c).cast("double")
        aggs += [
            F.min(F.when(train, col)).alias(f"lo{i}"),
            F.max(F.when(train, col)).alias(f"hi{i}"),
        ]
    return aggs


def null_feature_counts(
    F: Any,  # noqa: N803 (pyspark.sql.functions)
    df: Any,
    features: list[str],
    uri: str,
) -> dict[str, int]:
    """Each feature's null count (`n<i>`, as the checks take them): one more pass over the
    set, run only when the data stage's pass counted rows with a null feature."""
    try:
        row = df.agg(
            *[F.sum(F.col(c).isNull().cast("long")).alias(f"n{i}") for i, c in enumerate(features)]
        ).collect()[0]
    except Exception as exc:  # the set changed or vanished since the write read it
        raise _read_failure(uri, exc) from None
    return {key: int(value or 0) for key, value in row.asDict().items()}


def _feature_type(df: DataFrame, features: list[str]) -> str:
    """The element type the shards hold the features in, as read: "float" where every
    feature column is one that float32 holds exactly (float, byte, short), else "double".
    Either way a rank's float64 of a value is Spark's `cast("double")` of it."""
    from pyspark.sql.types import ByteType, FloatType, ShortType

    types = {f.name: f.dataType for f in df.schema.fields}
    exact = all(isinstance(types[c], FloatType | ByteType | ShortType) for c in features)
    return "float" if exact else "double"


def _write_shards(
    F: Any,  # noqa: N803 (pyspark.sql.functions)
    df: Any,
    cfg: TrainConfig,
    features: list[str],
    aggs: list[Any],
    columns: tuple[Any, Any, str],
    dirs: tuple[Path, Path],
    uri: str,
    element: str,
) -> tuple[dict[str, Any], list[int], int]:
    """The distributed path's one pass over the set: write the features as read (as
    `element`, `_feature_type`) and the label, the training rows partitioned by shard under
    `train_dir` and the validation rows in `val_dir`, while the same pass computes `aggs` (the
    statistics: counts, the label's checks, each feature's nulls and range;
    `_stats_columns`) as observed metrics. Return (statistics, rows of each shard, validation
    rows). The ranks scale the features by the ranges (data/scaling.py) as they read them.

    A read or write failure is one sentence (`_read_failure`), and leaves no shards."""
    from pyspark.sql import Observation

    (label, shard, task), (train_dir, val_dir) = columns, dirs
    observed = Observation("trainstack_data_stats")
    out = df.observe(observed, *aggs).select(
        F.array(*[F.col(c).cast(element) for c in features]).alias("features"),
        label.cast("int" if task == CLASSIFICATION else "float").alias("label"),
        # The validation rows' partition, else the row's shard (computed for training rows
        # only: Spark evaluates `otherwise` only where `when` is false).
        F.when(F.col("_val"), F.lit(VAL_PARTITION)).otherwise(shard.cast("int")).alias("shard"),
    )
    # One write, the one pass over the set: the validation rows are a partition of their
    # own beside the shards, and the directories are then moved where the ranks read them.
    # Row groups of about ROW_GROUP_BYTES (Parquet's block size, compressed: a bound), the
    # unit a streaming rank reads (data/stream.py).
    parts = train_dir.parent / "_parts"
    try:
        (
            out.write.mode("overwrite")
            .option("parquet.block.size", str(ROW_GROUP_BYTES))
            .partitionBy("shard")
            .parquet(_spark_uri(parts))
        )
        stats = dict(observed.get)
    except Exception as exc:  # e.g. a path that vanished, unreadable files, a full disk
        shutil.rmtree(parts, ignore_errors=True)
        raise _read_failure(uri, exc) from None
    _move_partitions(parts, cfg.workers, train_dir, val_dir)
    shard_rows = [_parquet_rows(train_dir / f"shard={k}") for k in range(cfg.workers)]
    return stats, shard_rows, _parquet_rows(val_dir)


def _move_partitions(parts: Path, workers: int, train_dir: Path, val_dir: Path) -> None:
    """Move the write's partitions where the ranks read them: `shard=<k>` into `train_dir`,
    the validation partition to `val_dir` (a rename each, on the same file system). A shard
    without rows gets no directory, as on the other paths (the shard checks name it); an
    empty validation set an empty `val_dir`."""
    for old in (train_dir, val_dir):
        if old.exists():
            shutil.rmtree(old)
    train_dir.mkdir(parents=True)
    for k in range(workers):
        src = parts / f"shard={k}"
        if src.exists():
            src.rename(train_dir / f"shard={k}")
    val = parts / f"shard={VAL_PARTITION}"
    if val.exists():
        val.rename(val_dir)
    else:
        val_dir.mkdir(parents=True)
    shutil.rmtree(parts)


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    if not path.exists():
        return 0
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(path.glob("*.parquet")))
