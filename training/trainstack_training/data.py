"""Data stage: read, validate, normalise, split and shard a data set.

Large sets go through a distributed Spark stage. Small local Parquet sets are read with
pyarrow and split in numpy with Spark's own hash, reproduced bit for bit (`spark_xxhash64`),
so the job does not start Spark SQL for them; small sets of other kinds are read by one Spark
job and prepared in the driver. Every path gives the same shards.

Also the offline default data set (scikit-learn's digits) and a deterministic generator that
scales it to any row count with augmented copies (for benchmarks).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainstack_training.config import DIGITS, TrainConfig

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

DIGITS_ROWS = 1797  # rows in sklearn's digits set
_GEN_BLOCK = 200_000  # rows per generated Parquet file: bounds driver memory for big sets


class DataError(ValueError):
    """The data set cannot be used; the message names the cause and what is allowed."""


@dataclass
class DataInfo:
    """What the data stage produced; passed to every training task (JSON-serialisable)."""

    train_dir: str  # contains shard=<k>/ Parquet directories, one per worker
    val_dir: str
    n_features: int
    n_classes: int
    feature_cols: list[str]
    shard_rows: list[int]
    val_rows: int
    total_rows: int
    seconds: float
    # "arrow": read with pyarrow and split in the driver, no Spark (small local Parquet
    # sets); "driver": one Spark read job, then prepared in the driver (other small inputs);
    # "spark": the distributed Spark stage (an aggregation job and the partitioned writes).
    path: str = "spark"
    phases: dict[str, float] = field(default_factory=dict)  # seconds per data-stage phase

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


# ---------------------------------------------------------------------------------------------
# Offline data set and generator


def _augment(images: np.ndarray, copy: int, seed: int) -> np.ndarray:
    """Copy 0 is the originals; copy k>0 is shifted by up to one pixel plus seeded noise."""
    if copy == 0:
        return images.reshape(len(images), 64)
    rng = np.random.default_rng([seed, copy])
    dy, dx = (int(v) for v in rng.integers(-1, 2, size=2))
    shifted = np.roll(images, (dy, dx), axis=(1, 2))
    # np.roll wraps around; blank the wrapped row/column so a shift is a real translation.
    if dy == 1:
        shifted[:, 0, :] = 0
    elif dy == -1:
        shifted[:, -1, :] = 0
    if dx == 1:
        shifted[:, :, 0] = 0
    elif dx == -1:
        shifted[:, :, -1] = 0
    noisy = shifted + rng.normal(0.0, 1.0, size=shifted.shape)
    return np.clip(noisy, 0.0, 16.0).reshape(len(images), 64)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: images (1797, 8, 8) float64 with values 0..16, labels int32.

    Read as `load_digits()` reads them, from the data file scikit-learn ships, but without
    importing scikit-learn: that import alone takes 2.3 s of a 0.55-CPU worker, at the time
    the job's executors start there. Falls back to `load_digits()` if the file moved."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for location in (spec.submodule_search_locations or []) if spec else []:
        data_file = Path(location) / "datasets" / "data" / "digits.csv.gz"
        if data_file.is_file():
            data = np.loadtxt(data_file, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int32)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images.astype(np.float64), digits.target.astype(np.int32)


def generate_digits(path: str | Path, rows: int = 0, seed: int = 0) -> int:
    """Write the digits set (or `rows` rows of it, with augmented copies) as Parquet files.

    Deterministic: the same (rows, seed) always gives the same rows. Returns the row count.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    images, labels = digits_arrays()
    total = rows if rows > 0 else len(labels)
    out = Path(path)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    names = [f"px{i}" for i in range(64)]
    written, part = 0, 0
    feats: list[np.ndarray] = []
    labs: list[np.ndarray] = []
    buffered = 0
    copy = 0
    while written + buffered < total:
        take = min(len(labels), total - written - buffered)
        feats.append(_augment(images[:take], copy, seed).astype(np.float32))
        labs.append(labels[:take])
        buffered += take
        copy += 1
        if buffered >= _GEN_BLOCK or written + buffered >= total:
            x = np.concatenate(feats)
            cols = {n: x[:, i] for i, n in enumerate(names)}
            cols["label"] = np.concatenate(labs)
            pq.write_table(pa.table(cols), out / f"part-{part:05d}.parquet")
            written += buffered
            part += 1
            feats, labs, buffered = [], [], 0
    return written


# ---------------------------------------------------------------------------------------------
# Reading


def _is_local(uri: str) -> bool:
    scheme = urllib.parse.urlparse(uri).scheme
    return scheme in ("", "file")


def _local_path(uri: str) -> Path:
    return Path(urllib.parse.urlparse(uri).path if uri.startswith("file:") else uri)


def _spark_uri(path: str | Path) -> str:
    return Path(path).resolve().as_uri()


def resolve_source(cfg: TrainConfig, data_root: Path) -> tuple[str, str]:
    """Return (uri Spark can read, format); generates/downloads into data_root when needed."""
    if cfg.data == DIGITS:
        src = data_root / "source"
        generate_digits(src, cfg.rows, cfg.seed)
        return _spark_uri(src), "parquet"
    if cfg.rows:
        raise DataError(
            f"rows={cfg.rows} only applies to --data digits (the generator); got data={cfg.data!r}"
        )
    uri = cfg.data
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        # Spark has no http filesystem: fetch once to shared storage, then read from there.
        name = Path(urllib.parse.urlparse(uri).path).name or "download"
        dest = data_root / "download" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            urllib.request.urlretrieve(uri, dest)
        except OSError as exc:
            raise DataError(f"data URL {uri!r} is unreachable: {exc}") from exc
        uri = _spark_uri(dest)
    elif _is_local(uri):
        local = _local_path(uri)
        if not local.exists():
            raise DataError(
                f"data path {uri!r} does not exist (give a Parquet/CSV file or "
                "directory on storage every node can read, or 'digits')"
            )
        uri = _spark_uri(local)
    fmt = cfg.data_format
    if fmt == "auto":
        fmt = "csv" if uri.lower().rstrip("/").endswith(".csv") else "parquet"
    return uri, fmt


def _data_files(path: Path, fmt: str) -> list[Path]:
    """The data files Spark would read at `path` (a file, or a directory's visible files)."""
    if path.is_file():
        return [path]
    suffix = ".csv" if fmt == "csv" else ".parquet"
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
        and (p.suffix == suffix or (fmt == "parquet" and not p.suffix))
    )


def check_files(path: Path, fmt: str) -> None:
    """Check every file of a local data set before Spark reads it; raise DataError naming the
    file and the problem: a Parquet file whose footer is missing or damaged (truncated,
    overwritten), a CSV row with another number of fields than the header (Spark's permissive
    CSV reader would silently pad it with nulls or drop the extra fields)."""
    import csv

    import pyarrow.parquet as pq

    files = _data_files(path, fmt)
    if not files:
        raise DataError(f"data path {str(path)!r} has no {fmt} files")
    for file in files:
        if fmt == "parquet":
            try:
                pq.ParquetFile(file)
            except Exception as exc:
                raise DataError(
                    f"data file {str(file)!r} is not a readable Parquet file ({exc}); "
                    "it is truncated or damaged: restore or rewrite it"
                ) from None
            continue
        with file.open(newline="", errors="replace") as fh:
            rows = csv.reader(fh)
            header = next(rows, None)
            if not header:
                raise DataError(f"data file {str(file)!r} is empty (no CSV header row)")
            for number, row in enumerate(rows, start=2):
                if row and len(row) != len(header):
                    raise DataError(
                        f"data file {str(file)!r} line {number} has {len(row)} fields, the "
                        f"header has {len(header)}: the file is truncated or has rows with the "
                        "wrong number of features"
                    )


def read_source(spark: SparkSession, uri: str, fmt: str) -> DataFrame:
    from pyspark.errors import AnalysisException

    try:
        if fmt == "csv":
            return spark.read.option("header", True).option("inferSchema", True).csv(uri)
        return spark.read.parquet(uri)
    except AnalysisException as exc:
        raise DataError(f"cannot read {fmt} data at {uri!r}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Spark's xxhash64 in numpy (the split of small sets without Spark)

_U64 = np.uint64
_P1 = _U64(0x9E3779B185EBCA87)
_P2 = _U64(0xC2B2AE3D27D4EB4F)
_P3 = _U64(0x165667B19E3779F9)
_P4 = _U64(0x85EBCA77C2B2AE63)
_P5 = _U64(0x27D4EB2F165667C5)
_SPARK_HASH_SEED = 42  # the seed of Spark SQL's xxhash64()
# Arrow types whose Spark type (as Spark reads Parquet) and hash are reproduced here: Spark's
# ByteType, ShortType and IntegerType hash as 4-byte ints, LongType as 8-byte longs, FloatType
# and DoubleType as their IEEE bits (-0.0 as 0.0, NaN canonical).
_INT32_TYPES = ("int8", "int16", "int32")
_HASHED_TYPES = (*_INT32_TYPES, "int64", "float", "double")


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U64(r)) | (x >> _U64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U64(33))
    h = h * _P2
    h = h ^ (h >> _U64(29))
    h = h * _P3
    return h ^ (h >> _U64(32))


def _hash_int(bits: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark's XXH64.hashInt: `bits` are the int's 32 bits, zero-extended to uint64."""
    h = seed + _P5 + _U64(4)
    h = h ^ (bits * _P1)
    return _fmix(_rotl(h, 23) * _P2 + _P3)


def _hash_long(bits: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark's XXH64.hashLong: `bits` are the long's 64 bits."""
    h = seed + _P5 + _U64(8)
    h = h ^ (_rotl(bits * _P2, 31) * _P1)
    return _fmix(_rotl(h, 27) * _P1 + _P4)


def spark_xxhash64(seed: int, columns: list[pa.ChunkedArray | pa.Array], rows: int) -> np.ndarray:
    """Spark SQL's `xxhash64(lit(seed), *columns)` for every row, bit for bit (int64).

    Columns are Arrow integer or float columns (`_HASHED_TYPES`); a null leaves the hash as
    it is, as in Spark. `lit(seed)` is an int literal when the seed fits 32 bits, as PySpark
    makes it. The test suite checks this against Spark itself.
    """
    with np.errstate(over="ignore"):
        h = np.full(rows, _SPARK_HASH_SEED, dtype=_U64)
        if -(2**31) <= seed < 2**31:
            h = _hash_int(np.full(rows, seed & 0xFFFFFFFF, dtype=_U64), h)
        else:
            h = _hash_long(np.full(rows, seed & 0xFFFFFFFFFFFFFFFF, dtype=_U64), h)
        for column in columns:
            kind = str(column.type)
            if kind not in _HASHED_TYPES:
                raise TypeError(f"no Spark hash for Arrow type {kind}")
            valid = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            if kind in ("float", "double"):
                wide = kind == "double"
                values = np.asarray(
                    column.to_numpy(zero_copy_only=False), np.float64 if wide else np.float32
                )
                values = np.where(values == 0, values.dtype.type(0), values)  # -0.0 -> 0.0
                values = np.where(np.isnan(values), values.dtype.type(np.nan), values)
                bits = values.view(np.uint64 if wide else np.uint32).astype(_U64)
                new = _hash_long(bits, h) if wide else _hash_int(bits, h)
            else:
                values = np.asarray(column.fill_null(0).to_numpy(zero_copy_only=False))
                if kind in _INT32_TYPES:
                    new = _hash_int(values.astype(np.int32).view(np.uint32).astype(_U64), h)
                else:
                    new = _hash_long(values.astype(np.int64).view(_U64), h)
            h = np.where(valid, new, h)
    return h.view(np.int64)


def _arrow_readable(files: list[Path], cfg: TrainConfig) -> tuple[list[str], bool] | None:
    """(feature columns, label_is_integral) when the Parquet `files` can be prepared without
    Spark: one schema in every file, the columns present and of a type `spark_xxhash64`
    covers. None otherwise: the Spark paths then read the set and report any problem."""
    import pyarrow.parquet as pq

    schemas = [pq.read_schema(f) for f in files]
    if not schemas or any(not s.equals(schemas[0]) for s in schemas[1:]):
        return None
    types = {f.name: str(f.type) for f in schemas[0]}
    if len(types) != len(schemas[0]):  # duplicate column names
        return None
    wanted = cfg.feature_list() or [c for c in schemas[0].names if c != cfg.label_col]
    if not wanted or any(types.get(c) not in _HASHED_TYPES for c in [*wanted, cfg.label_col]):
        return None
    return wanted, types[cfg.label_col] not in ("float", "double")


def _arrow_table(files: list[Path], cfg: TrainConfig, features: list[str], uri: str) -> pa.Table:
    """The driver path's table (`_f<i>` as double, `_label`, `_val`, `_shard`), read with
    pyarrow and split with Spark's hash: the same table the driver path's Spark job makes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = [*features, cfg.label_col]
    try:
        table = pa.concat_tables([pq.read_table(f, columns=cols) for f in files])
    except Exception as exc:  # unreadable after the footer check, or vanished
        raise DataError(f"cannot read data at {uri!r}: {str(exc).splitlines()[0]}") from exc
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
        raise DataError(
            f"label column {cfg.label_col!r} has type {label_type.simpleString()}; "
            f"it must hold integers in [0, {cfg.n_classes})"
        )
    return wanted, isinstance(label_type, IntegralType)


def prepare(
    session: Callable[[], SparkSession],
    cfg: TrainConfig,
    data_root: Path,
    before_distributed: Callable[[], None] | None = None,
) -> DataInfo:
    """Run the data stage; write train shards (one per worker) and the validation set.

    `session` gives the Spark session, called only when the data stage needs Spark SQL (not
    for a small local Parquet set). `before_distributed` runs before the distributed path's
    first job (not for small inputs).
    """
    start = time.perf_counter()
    uri, fmt = resolve_source(cfg, data_root)
    if cfg.data != DIGITS and _is_local(uri):
        check_files(_local_path(uri), fmt)
    phases = {"data_source": time.perf_counter() - start}
    train_dir, val_dir = data_root / "train", data_root / "val"
    files = _small_parquet_files(uri, fmt, cfg)
    readable = _arrow_readable(files, cfg) if files else None
    if files and readable:
        # A small local Parquet set: pyarrow reads it and numpy splits it with Spark's own
        # hash, so the job never starts Spark SQL for it (seconds of Catalyst start-up and a
        # first job of cold executors, for a few thousand rows).
        features, label_integral = readable
        mark = time.perf_counter()
        table = _arrow_table(files, cfg, features, uri)
        phases["data_arrow_read"] = time.perf_counter() - mark
        return _prepare_small(
            table, cfg, features, label_integral, train_dir, val_dir, start, "arrow", phases
        )

    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    mark = time.perf_counter()
    df = read_source(session(), uri, fmt)
    features, label_integral = _check_schema(df, cfg)
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
            table, cfg, features, label_integral, train_dir, val_dir, start, "driver", phases
        )

    if before_distributed:
        before_distributed()
    df = df.withColumn("_val", is_val)
    train = ~F.col("_val")
    # One pass computes the checks and the normalisation statistics (from training rows only).
    aggs = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(train.cast("long")).alias("train_rows"),
        F.sum(label.isNull().cast("long")).alias("null_labels"),
        F.min(label).alias("min_label"),
        F.max(label).alias("max_label"),
    ]
    if not label_integral:
        aggs.append(F.sum((label != F.floor(label)).cast("long")).alias("frac_labels"))
        aggs.append(
            F.first(F.when(label != F.floor(label), label), ignorenulls=True).alias("frac_example")
        )
    for i, c in enumerate(features):
        col = F.col(c).cast("double")
        aggs += [
            F.sum(col.isNull().cast("long")).alias(f"n{i}"),
            F.min(F.when(train, col)).alias(f"lo{i}"),
            F.max(F.when(train, col)).alias(f"hi{i}"),
        ]
    mark = time.perf_counter()
    try:
        stats = df.agg(*aggs).collect()[0].asDict()
    except Exception as exc:  # e.g. a path that vanished or unreadable files
        raise DataError(f"cannot read data at {uri!r}: {str(exc).splitlines()[0]}") from exc
    phases["data_spark_stats"] = time.perf_counter() - mark
    _check_stats(stats, cfg, features)

    norm = []
    for i, c in enumerate(features):
        lo, hi = float(stats[f"lo{i}"] or 0.0), float(stats[f"hi{i}"] or 0.0)
        span = hi - lo if hi > lo else 1.0  # constant feature -> 0, not a division by zero
        norm.append(((F.col(c).cast("double") - lo) / span).cast("float"))
    out = df.select(
        F.array(*norm).alias("features"),
        label.cast("int").alias("label"),
        shard.cast("int").alias("shard"),
        F.col("_val"),
    )
    mark = time.perf_counter()
    (
        out.filter(~F.col("_val"))
        .drop("_val")
        .write.mode("overwrite")
        .partitionBy("shard")
        .parquet(_spark_uri(train_dir))
    )
    out.filter(F.col("_val")).drop("_val", "shard").write.mode("overwrite").parquet(
        _spark_uri(val_dir)
    )

    shard_rows = [_parquet_rows(train_dir / f"shard={k}") for k in range(cfg.workers)]
    val_rows = _parquet_rows(val_dir)
    phases["data_spark_write"] = time.perf_counter() - mark
    return _finish(
        cfg,
        features,
        train_dir,
        val_dir,
        shard_rows,
        val_rows,
        int(stats["rows"]),
        start,
        "spark",
        phases,
    )


def _small_parquet_files(uri: str, fmt: str, cfg: TrainConfig) -> list[Path] | None:
    """The files of a local Parquet set small enough for the "arrow" path (a file, or a
    directory of `.parquet` files with no subdirectories, whose partition columns only Spark
    would add), up to local_prep_mb in all; None for any other set."""
    if not cfg.local_prep_mb or fmt != "parquet" or not _is_local(uri):
        return None
    path = _local_path(uri)
    if path.is_file():
        files = [path]
    else:
        visible = [p for p in path.iterdir() if not p.name.startswith(("_", "."))]
        if not visible or any(not p.is_file() or p.suffix != ".parquet" for p in visible):
            return None
        files = sorted(visible)
    if sum(f.stat().st_size for f in files) > cfg.local_prep_mb * 1024**2:
        return None
    return files


def _prepare_small(
    table: Any,
    cfg: TrainConfig,
    features: list[str],
    label_integral: bool,
    train_dir: Path,
    val_dir: Path,
    start: float,
    path: str,
    phases: dict[str, float],
) -> DataInfo:
    """The small-set paths' end: checks, scaling and shard files in the driver."""
    mark = time.perf_counter()
    shard_rows, val_rows = _prepare_in_driver(
        table, cfg, features, label_integral, train_dir, val_dir
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
) -> DataInfo:
    """The data stage's result, either path, once its shards are checked."""
    info = DataInfo(
        train_dir=str(train_dir.resolve()),
        val_dir=str(val_dir.resolve()),
        n_features=len(features),
        n_classes=cfg.n_classes,
        feature_cols=features,
        shard_rows=shard_rows,
        val_rows=val_rows,
        total_rows=total_rows,
        seconds=time.perf_counter() - start,
        path=path,
        phases=phases,
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
        raise DataError(f"cannot read data at {uri!r}: {str(exc).splitlines()[0]}") from exc


def _prepare_in_driver(
    table: Any,
    cfg: TrainConfig,
    features: list[str],
    label_integral: bool,
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
        values = np.asarray(label.to_numpy(zero_copy_only=False), dtype=np.float64)
        frac = ~np.isnan(values) & (values != np.floor(values))
        stats["frac_labels"] = int(frac.sum())
        stats["frac_example"] = float(values[frac][0]) if frac.any() else None
    for i in range(len(features)):
        col = table.column(f"_f{i}")
        mm = pc.min_max(col.filter(train_mask))
        stats[f"n{i}"] = col.null_count
        stats[f"lo{i}"], stats[f"hi{i}"] = mm["min"].as_py(), mm["max"].as_py()
    _check_stats(stats, cfg, features)

    x = np.empty((n, len(features)), dtype=np.float32)
    for i in range(len(features)):
        lo, hi = float(stats[f"lo{i}"] or 0.0), float(stats[f"hi{i}"] or 0.0)
        span = hi - lo if hi > lo else 1.0
        col = np.asarray(table.column(f"_f{i}").to_numpy(zero_copy_only=False), np.float64)
        x[:, i] = ((col - lo) / span).astype(np.float32)
    y = np.asarray(label.to_numpy(zero_copy_only=False)).astype(np.int32)
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
                    "label": pa.array(y[rows], type=pa.int32()),
                }
            )
            pq.write_table(out, directory / "part-00000.parquet")
        return count

    for directory in (train_dir, val_dir):
        shutil.rmtree(directory, ignore_errors=True)
    shard_rows = [write(train_dir / f"shard={k}", train & (shard == k)) for k in range(cfg.workers)]
    return shard_rows, write(val_dir, is_val)


def _check_stats(stats: dict[str, Any], cfg: TrainConfig, features: list[str]) -> None:
    rows = int(stats["rows"] or 0)
    if rows == 0:
        raise DataError(f"the data set {cfg.data!r} is empty (0 rows)")
    train_rows = int(stats["train_rows"] or 0)
    if train_rows < cfg.workers:
        raise DataError(
            f"the data set has {rows} rows ({train_rows} for training), fewer than "
            f"workers={cfg.workers}: every worker needs at least one batch of rows"
        )
    if stats["null_labels"]:
        raise DataError(
            f"label column {cfg.label_col!r} has {stats['null_labels']} null "
            "values; every row needs a label"
        )
    if stats.get("frac_labels"):
        raise DataError(
            f"label column {cfg.label_col!r} has {stats['frac_labels']} non-integer "
            f"values (e.g. {stats['frac_example']}); labels must be integers in "
            f"[0, {cfg.n_classes})"
        )
    lo, hi = stats["min_label"], stats["max_label"]
    if lo < 0 or hi >= cfg.n_classes:
        bad = lo if lo < 0 else hi
        raise DataError(
            f"label {bad} in column {cfg.label_col!r} is out of range; labels must "
            f"be integers in [0, {cfg.n_classes}) (set --n-classes)"
        )
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
    """Read a shard written by prepare() into (features float32 [n, d], labels int32 [n])."""
    import pyarrow.parquet as pq

    files = sorted(Path(path).glob("*.parquet"))
    table = pq.read_table(files, columns=["features", "label"]) if files else None
    if table is None or table.num_rows == 0:
        raise DataError(f"shard {path!r} has no rows")
    feats = table.column("features").combine_chunks()
    width = len(feats[0])
    x = np.asarray(feats.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    y = np.asarray(table.column("label").to_numpy(), dtype=np.int32)
    return x.reshape(-1, width), y
