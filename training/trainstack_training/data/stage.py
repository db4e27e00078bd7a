"""The data stage: read, validate, normalise, split and shard a data set.

Large sets go through a distributed Spark stage. Small Parquet sets, local or on an object
store (s3a://, with the S3A settings of Spark's conf), are read with pyarrow and split in numpy
with Spark's own hash, reproduced bit for bit (`spark_xxhash64`), so the job does not start
Spark SQL for them; small sets of other kinds are read by one Spark
job and prepared in the driver. Every path gives the same shards.

The labels are int32 class indices for a classification and float32 values for a regression
(the task: declared by the job, else inferred from the label column; see task.py).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainstack_training.config import CLASSIFICATION, DIGITS, TrainConfig
from trainstack_training.data.info import DataError, DataInfo
from trainstack_training.data.sources import (
    S3A_CONF,
    _is_local,
    _java_cause,
    _local_path,
    _spark_uri,
    _store_failure,
    check_files,
    check_store,
    is_s3,
    parquet_schema,
    read_source,
    resolve_source,
    s3_filesystem_options,
    s3_path,
    storage_error,
)
from trainstack_training.data.stream import ROW_GROUP_BYTES, row_group_rows, unit_arrays
from trainstack_training.data.task import check_labels, infer_task, non_numeric_label
from trainstack_training.data.xxhash import _HASHED_TYPES, spark_xxhash64

if TYPE_CHECKING:
    import pyarrow as pa
    from pyarrow import fs as pafs
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Store:
    """Where pyarrow reads a data set: its file system, the set's path on it, and (for an
    object store) the endpoint, for messages."""

    fs: pafs.FileSystem
    path: str
    endpoint: str = ""


def arrow_store(uri: str, spark_conf: Mapping[str, str]) -> Store | None:
    """The pyarrow file system of a local or s3a:// data set; None for other URLs, and for
    s3a:// when Spark's conf names no S3A endpoint (Spark alone then reads it)."""
    from pyarrow import fs as pafs

    if _is_local(uri):
        return Store(pafs.LocalFileSystem(), str(_local_path(uri)))
    options = s3_filesystem_options(spark_conf) if is_s3(uri) else {}
    if not options:
        return None
    return Store(pafs.S3FileSystem(**options), s3_path(uri), spark_conf[S3A_CONF + "endpoint"])


def active_spark_conf() -> dict[str, str]:
    """The running SparkContext's conf (spark-defaults.conf's settings with the job's), read
    without starting Spark SQL; {} when no context runs."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    return dict(sc.getConf().getAll()) if sc is not None else {}


def _arrow_readable(
    fs: pafs.FileSystem, files: list[str], cfg: TrainConfig
) -> tuple[list[str], bool] | None:
    """(feature columns, label_is_integral) when the Parquet `files` can be prepared without
    Spark: one schema in every file, the columns present and of a type `spark_xxhash64`
    covers. None otherwise: the Spark paths then read the set and report any problem."""
    schemas = [parquet_schema(fs, f) for f in files]
    if not schemas or any(not s.equals(schemas[0]) for s in schemas[1:]):
        return None
    types = {f.name: str(f.type) for f in schemas[0]}
    if len(types) != len(schemas[0]):  # duplicate column names
        return None
    wanted = cfg.feature_list() or [c for c in schemas[0].names if c != cfg.label_col]
    if not wanted or any(types.get(c) not in _HASHED_TYPES for c in [*wanted, cfg.label_col]):
        return None
    return wanted, types[cfg.label_col] not in ("float", "double")


def _arrow_table(
    store: Store, files: list[str], cfg: TrainConfig, features: list[str], uri: str
) -> pa.Table:
    """The driver path's table (`_f<i>` as double, `_label`, `_val`, `_shard`), read with
    pyarrow and split with Spark's hash: the same table the driver path's Spark job makes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = [*features, cfg.label_col]
    try:
        table = pa.concat_tables(
            [pq.read_table(f, columns=cols, filesystem=store.fs) for f in files]
        )
    except Exception as exc:  # unreadable after the footer check, or vanished
        raise _store_failure(uri, exc, store.endpoint) from None
    n = table.num_rows
    hashed = [table.column(c) for c in cols]
    is_val = np.mod(spark_xxhash64(cfg.seed, hashed, n), 1_000_000) < int(
        cfg.val_fraction * 1_000_000
    )
    shard = np.mod(spark_xxhash64(cfg.seed + 1, hashed, n), cfg.workers).astype(np.int32)
    out = {f"_f{i}": table.column(c).cast(pa.float64()) for i, c in enumerate(features)}
    return pa.table(
        {
            **out,
            "_label": table.column(cfg.label_col),
            "_val": pa.array(is_val),
            "_shard": pa.array(shard),
        }
    )


# ---------------------------------------------------------------------------------------------
# Validation, normalisation, split, shards


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


def prepare(
    session: Callable[[], SparkSession],
    cfg: TrainConfig,
    data_root: Path,
    before_distributed: Callable[[], None] | None = None,
    *,
    spark_conf: Mapping[str, str] | None = None,
) -> DataInfo:
    """Run the data stage; write train shards (one per worker) and the validation set.

    `session` gives the Spark session, called only when the data stage needs Spark SQL (not
    for a small Parquet set). `before_distributed` runs before the distributed path's first
    job (not for small inputs). `spark_conf`: the S3A settings an s3a:// set is read with
    (default: the running SparkContext's conf).
    """
    start = time.perf_counter()
    uri, fmt = resolve_source(cfg, data_root)
    if cfg.data != DIGITS and _is_local(uri):
        check_files(_local_path(uri), fmt)
    store = _source_store(uri, fmt, spark_conf)
    phases = {"data_source": time.perf_counter() - start}
    train_dir, val_dir = data_root / "train", data_root / "val"
    try:
        files = _small_parquet_files(store, fmt, cfg) if store else None
        readable = _arrow_readable(store.fs, files, cfg) if store and files else None
    except OSError as exc:  # the store failed between the check and the read
        raise _store_failure(uri, exc, store.endpoint if store else "") from None
    if store and files and readable:
        # A small Parquet set: pyarrow reads it and numpy splits it with Spark's own hash, so
        # the job never starts Spark SQL for it (seconds of Catalyst start-up and a first job
        # of cold executors, for a few thousand rows).
        features, label_integral = readable
        task = infer_task(cfg.task, label_integral)
        mark = time.perf_counter()
        table = _arrow_table(store, files, cfg, features, uri)
        phases["data_arrow_read"] = time.perf_counter() - mark
        return _prepare_small(
            table, cfg, features, label_integral, task, train_dir, val_dir, start, "arrow", phases
        )

    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    mark = time.perf_counter()
    df = read_source(session(), uri, fmt)
    features, label_integral = _check_schema(df, cfg)
    task = infer_task(cfg.task, label_integral)
    size = _estimated_bytes(df)
    phases["data_read_schema"] = time.perf_counter() - mark
    label = F.col(cfg.label_col)
    all_cols = [F.col(c) for c in [*features, cfg.label_col]]
    # Content hash => the split and shard of a row do not depend on file layout or partitions.
    # (`spark_xxhash64` reproduces both expressions for the "arrow" path.)
    is_val = F.pmod(F.xxhash64(F.lit(cfg.seed), *all_cols), F.lit(1_000_000)) < F.lit(
        int(cfg.val_fraction * 1_000_000)
    )
    shard = F.pmod(F.xxhash64(F.lit(cfg.seed + 1), *all_cols), F.lit(cfg.workers))
    if cfg.local_prep_mb and size is not None and size <= cfg.local_prep_mb * 1024**2:
        # Another small set (CSV, a partitioned directory, types the arrow path leaves to
        # Spark): Spark reads it and computes the split and shard of every row (the same
        # expressions as below), in one job; the rest is numpy in the driver. This skips the
        # aggregation job and the two partitioned writes.
        mark = time.perf_counter()
        table = _collect(
            df.select(
                *[F.col(c).cast("double").alias(f"_f{i}") for i, c in enumerate(features)],
                label.alias("_label"),
                is_val.alias("_val"),
                shard.cast("int").alias("_shard"),
            ),
            uri,
        )
        phases["data_spark_read"] = time.perf_counter() - mark
        return _prepare_small(
            table, cfg, features, label_integral, task, train_dir, val_dir, start, "driver", phases
        )

    if before_distributed:
        before_distributed()
    df = df.withColumn("_val", is_val)
    train = ~F.col("_val")
    # One pass computes the checks and the normalisation statistics (from training rows only).
    aggs = _stats_columns(F, label, train, features, label_integral)
    mark = time.perf_counter()
    try:
        stats = df.agg(*aggs).collect()[0].asDict()
    except Exception as exc:  # e.g. a path that vanished or unreadable files
        raise _read_failure(uri, exc) from None
    phases["data_spark_stats"] = time.perf_counter() - mark
    _check_stats(stats, cfg, features, task)

    mark = time.perf_counter()
    shard_rows, val_rows = _write_normalised(
        F, df, cfg, features, stats, (label, shard, task), (train_dir, val_dir)
    )
    phases["data_spark_write"] = time.perf_counter() - mark
    return _finish(
        cfg, features, train_dir, val_dir, shard_rows, val_rows, int(stats["rows"]), start,
        "spark", phases, task,
    )  # fmt: skip


def _stats_columns(
    F: Any,  # noqa: N803 (pyspark.sql.functions, as the PySpark idiom names it)
    label: Any,
    train: Any,
    features: list[str],
    label_integral: bool,
) -> list[Any]:
    """The aggregations of the data stage's one pass over the data: the row counts, the
    label's checks, and each feature's nulls and its range over the training rows."""
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
    for i, c in enumerate(features):
        col = F.col(c).cast("double")
        aggs += [
            F.sum(col.isNull().cast("long")).alias(f"n{i}"),
            F.min(F.when(train, col)).alias(f"lo{i}"),
            F.max(F.when(train, col)).alias(f"hi{i}"),
        ]
    return aggs


def _write_normalised(
    F: Any,  # noqa: N803 (pyspark.sql.functions)
    df: Any,
    cfg: TrainConfig,
    features: list[str],
    stats: dict[str, Any],
    columns: tuple[Any, Any, str],
    dirs: tuple[Path, Path],
) -> tuple[list[int], int]:
    """Write the features scaled to [0, 1] by the training rows' ranges, the label and the
    shard: the training rows partitioned by shard, the validation rows apart; the rows of
    each shard and of the validation set."""
    (label, shard, task), (train_dir, val_dir) = columns, dirs
    norm = []
    for i, c in enumerate(features):
        lo, hi = float(stats[f"lo{i}"] or 0.0), float(stats[f"hi{i}"] or 0.0)
        span = hi - lo if hi > lo else 1.0  # constant feature -> 0, not a division by zero
        norm.append(((F.col(c).cast("double") - lo) / span).cast("float"))
    out = df.select(
        F.array(*norm).alias("features"),
        label.cast("int" if task == CLASSIFICATION else "float").alias("label"),
        shard.cast("int").alias("shard"),
        F.col("_val"),
    )
    # Row groups of about ROW_GROUP_BYTES (Parquet's block size, compressed: a bound), the
    # unit a streaming rank reads (data/stream.py).
    block = str(ROW_GROUP_BYTES)
    (
        out.filter(~F.col("_val"))
        .drop("_val")
        .write.mode("overwrite")
        .option("parquet.block.size", block)
        .partitionBy("shard")
        .parquet(_spark_uri(train_dir))
    )
    out.filter(F.col("_val")).drop("_val", "shard").write.mode("overwrite").option(
        "parquet.block.size", block
    ).parquet(_spark_uri(val_dir))
    shard_rows = [_parquet_rows(train_dir / f"shard={k}") for k in range(cfg.workers)]
    return shard_rows, _parquet_rows(val_dir)


def _source_store(uri: str, fmt: str, spark_conf: Mapping[str, str] | None) -> Store | None:
    """The data set's pyarrow store (`arrow_store`); an s3a:// set's files are checked there
    first (check_store), so a missing bucket or prefix, refused keys or an unreachable store
    fail in one sentence before Spark reads anything."""
    if not is_s3(uri):
        return arrow_store(uri, {}) if _is_local(uri) else None
    store = arrow_store(uri, active_spark_conf() if spark_conf is None else spark_conf)
    if store:
        check_store(store.fs, uri, fmt, store.endpoint)
    return store


def _small_parquet_files(store: Store, fmt: str, cfg: TrainConfig) -> list[str] | None:
    """The files of a Parquet set small enough for the "arrow" path (a file, or a directory
    of `.parquet` files with no subdirectories, whose partition columns only Spark would add),
    up to local_prep_mb in all; None for any other set."""
    from pyarrow import fs as pafs

    if not cfg.local_prep_mb or fmt != "parquet":
        return None
    top = store.fs.get_file_info(store.path)
    if top.type == pafs.FileType.File:
        entries = [top]
    else:
        listed = store.fs.get_file_info(pafs.FileSelector(store.path))
        entries = [e for e in listed if not e.base_name.startswith(("_", "."))]
        if not entries or any(
            e.type != pafs.FileType.File or e.extension != "parquet" for e in entries
        ):
            return None
    if sum(e.size or 0 for e in entries) > cfg.local_prep_mb * 1024**2:
        return None
    return sorted(e.path for e in entries)


def _prepare_small(
    table: Any,
    cfg: TrainConfig,
    features: list[str],
    label_integral: bool,
    task: str,
    train_dir: Path,
    val_dir: Path,
    start: float,
    path: str,
    phases: dict[str, float],
) -> DataInfo:
    """The small-set paths' end: checks, scaling and shard files in the driver."""
    mark = time.perf_counter()
    shard_rows, val_rows = _prepare_in_driver(
        table, cfg, features, label_integral, task, train_dir, val_dir
    )
    phases["data_driver_prepare"] = time.perf_counter() - mark
    return _finish(
        cfg,
        features,
        train_dir,
        val_dir,
        shard_rows,
        val_rows,
        table.num_rows,
        start,
        path,
        phases,
        task,
    )


def _finish(
    cfg: TrainConfig,
    features: list[str],
    train_dir: Path,
    val_dir: Path,
    shard_rows: list[int],
    val_rows: int,
    total_rows: int,
    start: float,
    path: str,
    phases: dict[str, float],
    task: str,
) -> DataInfo:
    """The data stage's result, either path, once its shards are checked."""
    info = DataInfo(
        train_dir=str(train_dir.resolve()),
        val_dir=str(val_dir.resolve()),
        n_features=len(features),
        n_classes=cfg.n_classes if task == CLASSIFICATION else 0,
        feature_cols=features,
        shard_rows=shard_rows,
        val_rows=val_rows,
        total_rows=total_rows,
        seconds=time.perf_counter() - start,
        path=path,
        phases=phases,
        task=task,
    )
    _check_shards(info, cfg)
    return info


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


def _prepare_in_driver(
    table: Any,
    cfg: TrainConfig,
    features: list[str],
    label_integral: bool,
    task: str,
    train_dir: Path,
    val_dir: Path,
) -> tuple[list[int], int]:
    """The distributed path's checks, statistics, scaling and shard files, on an Arrow table
    of `_f<i>` (features as double), `_label`, `_val` and `_shard` (computed by Spark).

    Same results as the Spark path: the split and shards come from the same Spark
    expressions, min/max over the training rows, and the scaling is the same float64
    arithmetic cast to float32. Returns (rows per shard, validation rows).
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

    x = np.empty((n, len(features)), dtype=np.float32)
    for i in range(len(features)):
        lo, hi = float(stats[f"lo{i}"] or 0.0), float(stats[f"hi{i}"] or 0.0)
        span = hi - lo if hi > lo else 1.0
        col = np.asarray(table.column(f"_f{i}").to_numpy(zero_copy_only=False), np.float64)
        x[:, i] = ((col - lo) / span).astype(np.float32)
    y = np.asarray(label.to_numpy(zero_copy_only=False)).astype(label_dtype(task))
    shard = np.asarray(table.column("_shard").to_numpy(zero_copy_only=False))

    def write(directory: Path, rows: np.ndarray) -> int:
        count = int(rows.sum())
        if count:  # like Spark's partitioned write: no directory for an empty shard
            directory.mkdir(parents=True, exist_ok=True)
            flat = pa.array(x[rows].reshape(-1), type=pa.float32())
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
    return shard_rows, write(val_dir, is_val)


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


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    if not path.exists():
        return 0
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(path.glob("*.parquet")))


def load_arrays(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read a shard written by prepare() into (features float32 [n, d], labels [n]): int32
    class indices for a classification, float32 targets for a regression. The whole shard in
    memory: a rank whose shard does not fit streams it (data/stream.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(path).glob("*.parquet"))
    table = pq.read_table(files, columns=["features", "label"]) if files else None
    if table is None or table.num_rows == 0:
        raise DataError(f"shard {path!r} has no rows")
    return unit_arrays(table, pa)
