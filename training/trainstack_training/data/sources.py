"""Where a data set comes from: the offline digits and their generator, and the checks and
reads of a named data set (local files, URLs, what Spark reads)."""

from __future__ import annotations

import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainstack_training.config import DIGITS, TrainConfig
from trainstack_training.data.info import DataError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DIGITS_ROWS = 1797  # rows in sklearn's digits set
_GEN_BLOCK = 200_000  # rows per generated Parquet file: bounds driver memory for big sets


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
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException

    try:
        if fmt == "csv":
            return spark.read.option("header", True).option("inferSchema", True).csv(uri)
        return spark.read.parquet(uri)
    except AnalysisException as exc:
        raise DataError(f"cannot read {fmt} data at {uri!r}: {exc}") from exc
    except Py4JJavaError as exc:  # Hadoop's own failure: its Java exception's first line
        cause = _java_cause(exc)
        if "S3AFileSystem not found" in cause:
            raise DataError(
                f"cannot read {uri!r}: this cluster cannot read s3a:// yet (its nodes have no "
                "hadoop-aws and AWS SDK jars); put the data on the cluster's shared storage "
                "(an absolute path) or give an http(s):// URL"
            ) from None
        raise DataError(f"cannot read {fmt} data at {uri!r}: {cause}") from None


def _java_cause(exc: Exception) -> str:
    """A Py4J error's Java exception as one line (its class and message), without the trace."""
    try:
        text = str(exc.java_exception.toString())  # type: ignore[attr-defined]
    except Exception:  # not a live Java exception
        text = str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
