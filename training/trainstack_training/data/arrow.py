"""The data stage's "arrow" path: a small Parquet set read with pyarrow and split in numpy.

A Parquet set, local or on an object store (s3a://, with the S3A settings of Spark's conf), of
at most `local_prep_mb` in all, with one schema in every file and columns of the types
`spark_xxhash64` covers, is read by pyarrow; each row's split and shard come from Spark's own
hash, reproduced bit for bit, so the job does not start Spark SQL for it. The table it reads is
the one the "driver" path's Spark job gives (spark_jobs.py); local_prep.py prepares either.

Runs in the training driver process (`trainstack-train`), called by `prepare` (stage.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trainstack_training.config import TrainConfig
from trainstack_training.data.sources import (
    S3A_CONF,
    _is_local,
    _local_path,
    _store_failure,
    is_s3,
    parquet_schema,
    s3_filesystem_options,
    s3_path,
)
from trainstack_training.data.xxhash import _HASHED_TYPES, spark_xxhash64

if TYPE_CHECKING:
    import pyarrow as pa
    from pyarrow import fs as pafs


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


def _small_parquet_files(store: Store, fmt: str, cfg: TrainConfig) -> list[str] | None:
    """The files of a Parquet set small enough for the "arrow" path (a flat set,
    `_flat_parquet_files`), up to local_prep_mb in all; None for any other set."""
    if not cfg.local_prep_mb or fmt != "parquet":
        return None
    entries = _flat_parquet_files(store)
    if entries is None or sum(e.size or 0 for e in entries) > cfg.local_prep_mb * 1024**2:
        return None
    return sorted(e.path for e in entries)


def _flat_parquet_files(store: Store) -> list[pafs.FileInfo] | None:
    """The files of a flat Parquet set: a file, or a directory of `.parquet` files with no
    subdirectories (whose partition columns only Spark would add); None for any other set."""
    from pyarrow import fs as pafs

    top = store.fs.get_file_info(store.path)
    if top.type == pafs.FileType.File:
        return [top]
    if top.type != pafs.FileType.Directory:  # gone: Spark's read names it
        return None
    listed = store.fs.get_file_info(pafs.FileSelector(store.path))
    entries = [e for e in listed if not e.base_name.startswith(("_", "."))]
    if not entries or any(
        e.type != pafs.FileType.File or e.extension != "parquet" for e in entries
    ):
        return None
    return entries


# Arrow's types whose Spark type is the one Spark's own Parquet schema inference gives them.
SPARK_TYPES = {
    "bool": "BooleanType", "int8": "ByteType", "int16": "ShortType", "int32": "IntegerType",
    "int64": "LongType", "float": "FloatType", "double": "DoubleType", "string": "StringType",
}  # fmt: skip


def spark_schema(store: Store, fmt: str) -> Any:
    """The Spark schema of a flat Parquet set (`_flat_parquet_files`), from its first file's
    footer, read by pyarrow, as Spark's own inference reads one footer: given it, Spark reads
    the set without a schema job of its own (a job on the executors, seconds on the default
    stack). None where Spark must infer it: another format or layout, a column of a type
    outside SPARK_TYPES, duplicate names. Every field is nullable, as Spark makes those of
    a file source."""
    from pyspark.sql import types as spark_types

    if fmt != "parquet":
        return None
    entries = _flat_parquet_files(store)
    if not entries:
        return None
    schema = parquet_schema(store.fs, sorted(e.path for e in entries)[0])
    names = [f.name for f in schema]
    if len(set(names)) != len(names) or any(str(f.type) not in SPARK_TYPES for f in schema):
        return None
    return spark_types.StructType(
        [
            spark_types.StructField(f.name, getattr(spark_types, SPARK_TYPES[str(f.type)])(), True)
            for f in schema
        ]
    )


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
