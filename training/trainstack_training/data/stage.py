"""The data stage: read, validate, normalise, split and shard a data set (`prepare`).

Large sets go through a distributed Spark stage. Small Parquet sets, local or on an object
store (s3a://, with the S3A settings of Spark's conf), are read with pyarrow and split in numpy
with Spark's own hash, reproduced bit for bit (`spark_xxhash64`), so the job does not start
Spark SQL for them; small sets of other kinds are read by one Spark
job and prepared in the driver. Every path gives the same shards.

The labels are int32 class indices for a classification and float32 values for a regression
(the task: declared by the job, else inferred from the label column; see task.py).

This module picks the path and runs it; the paths' parts are modules of their own: arrow.py
(the "arrow" path's read and split, without Spark SQL), spark_jobs.py (the Spark jobs: the
"driver" path's read, the distributed path's one partitioned write, which computes the
statistics as it goes), local_prep.py (the small sets' statistics and shard files in the
driver), scaling.py (the features' ranges, by which a rank scales them as it reads) and
checks.py (the checks of every path). A rank reads its shard back with shards.py or stream.py.

Runs in the training driver process (`trainstack-train`), before the job's ranks start.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.config import CLASSIFICATION, DIGITS, TrainConfig
from trainstack_training.data.arrow import (
    Store,
    _arrow_readable,
    _arrow_table,
    _small_parquet_files,
    active_spark_conf,
    arrow_store,
    spark_schema,
)
from trainstack_training.data.checks import _check_shards, _check_stats
from trainstack_training.data.info import DataError, DataInfo
from trainstack_training.data.local_prep import _prepare_in_driver
from trainstack_training.data.scaling import feature_scale
from trainstack_training.data.sources import (
    _is_local,
    _local_path,
    _store_failure,
    check_files,
    check_store,
    is_s3,
    read_source,
    resolve_source,
)
from trainstack_training.data.spark_jobs import (
    _check_schema,
    _collect,
    _estimated_bytes,
    _feature_type,
    _stats_columns,
    _write_shards,
    null_feature_counts,
)
from trainstack_training.data.task import infer_task

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
    try:
        schema = spark_schema(store, fmt) if store else None
    except OSError as exc:  # the store failed between the check and the read
        raise _store_failure(uri, exc, store.endpoint if store else "") from None
    df = read_source(session(), uri, fmt, schema)
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
        # aggregation job and the partitioned write.
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
    # One pass: the write of the shards computes the checks and the ranges (from training
    # rows only) as it goes; the checks fail after it, and then no shard is left.
    aggs = _stats_columns(F, label, train, features, label_integral)
    mark = time.perf_counter()
    element = _feature_type(df, features)
    stats, shard_rows, val_rows = _write_shards(
        F, df, cfg, features, aggs, (label, shard, task), (train_dir, val_dir), uri, element
    )
    phases["data_spark_write"] = time.perf_counter() - mark
    if stats["null_feature_rows"]:  # a set the checks refuse: name its null features
        stats.update(null_feature_counts(F, df, features, uri))
    else:
        stats.update({f"n{i}": 0 for i in range(len(features))})
    try:
        _check_stats(stats, cfg, features, task)
    except DataError:
        for written in (train_dir, val_dir):
            shutil.rmtree(written, ignore_errors=True)
        raise
    return _finish(
        cfg, features, train_dir, val_dir, shard_rows, val_rows, int(stats["rows"]), start,
        "spark", phases, task, feature_scale(stats, len(features)), 4 if element == "float" else 8,
    )  # fmt: skip


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
    shard_rows, val_rows, scale = _prepare_in_driver(
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
        scale,
        8,  # the short paths write the features as float64
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
    scale: list[list[float]],
    feature_bytes: int,
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
        scale=scale,
        feature_bytes=feature_bytes,
    )
    _check_shards(info, cfg)
    return info
