"""Where a data set comes from: the offline digits and their generator, and the checks and
reads of a named data set (local files, URLs, an object store's s3a://, what Spark reads)."""

from __future__ import annotations

import shutil
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainstack_training.config import DIGITS, TrainConfig
from trainstack_training.data.info import DataError

if TYPE_CHECKING:
    from pyarrow import fs as pafs
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


# ---------------------------------------------------------------------------------------------
# Object stores: s3a:// (s3:// is read as s3a://), with the nodes' S3A settings

S3A_CONF = "spark.hadoop.fs.s3a."  # the S3A settings in Spark's conf (spark-defaults.conf)
# What goes wrong reading a data set from storage (`s3_problem`).
NO_S3A, NO_BUCKET, NOT_FOUND, DENIED, UNKNOWN_HOST, UNREACHABLE = (
    "no-s3a", "no-bucket", "not-found", "denied", "unknown-host", "unreachable",
)  # fmt: skip
# The marks of each problem in pyarrow's OSError texts and in Hadoop's (s3a, hdfs) and the
# AWS SDK's Java exceptions' first lines; the first problem with a mark in the text wins.
_PROBLEM_MARKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (NO_S3A, ("S3AFileSystem not found",)),
    (UNKNOWN_HOST, ("UnknownHostException", "Could not resolve host", "Name or service not known")),
    (
        UNREACHABLE,
        (
            "ConnectException", "Connection refused", "Could not connect to server",
            "NETWORK_CONNECTION", "Unable to execute HTTP request", "ConnectTimeoutException",
            "connect timed out",
        ),
    ),
    (
        NO_BUCKET,
        (
            "UnknownStoreException", "NoSuchBucket", "NO_SUCH_BUCKET", "bucket does not exist",
            "To create buckets, enable",  # pyarrow: "Bucket 'b' not found. To create buckets..."
        ),
    ),
    (
        DENIED,
        (
            "AccessDeniedException", "ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId",
            "INVALID_ACCESS_KEY_ID", "SignatureDoesNotMatch", "SIGNATURE_DOES_NOT_MATCH",
            "AWSBadRequestException", "Status Code: 403", "403 Forbidden", "Permission denied",
            "AccessControlException",
        ),
    ),
    (
        NOT_FOUND,
        (
            "FileNotFoundException", "PATH_NOT_FOUND", "Path does not exist", "NoSuchKey",
            "NO_SUCH_KEY", "No such file or directory",
        ),
    ),
)  # fmt: skip


def s3_problem(text: str) -> str | None:
    """What a storage failure's text (pyarrow's OSError, or a Java exception's first line)
    says went wrong: one of NO_S3A, NO_BUCKET, NOT_FOUND, DENIED, UNKNOWN_HOST, UNREACHABLE,
    or None for anything else."""
    for problem, marks in _PROBLEM_MARKS:
        if any(mark in text for mark in marks):
            return problem
    return None


def is_s3(uri: str) -> bool:
    return urllib.parse.urlparse(uri).scheme in ("s3", "s3a")


def s3a_uri(uri: str) -> str:
    """`s3://bucket/key` as Spark reads it: `s3a://bucket/key`."""
    return "s3a://" + uri.split("://", 1)[1]


def s3_path(uri: str) -> str:
    """An s3(a):// URL as pyarrow's S3FileSystem names it: `bucket/key`, no trailing slash."""
    return uri.split("://", 1)[1].strip("/")


def s3_filesystem_options(conf: Mapping[str, str]) -> dict[str, Any]:
    """pyarrow.fs.S3FileSystem's keyword arguments for the S3A settings in a Spark conf
    (`spark.hadoop.fs.s3a.*`: endpoint, path.style.access, access.key, secret.key,
    session.token, endpoint.region, connection.ssl.enabled); {} without an endpoint."""

    def get(name: str) -> str:
        return str(conf.get(S3A_CONF + name) or "").strip()

    endpoint = get("endpoint")
    if not endpoint:
        return {}
    scheme, sep, host = endpoint.partition("://")
    if not sep:  # S3A's rule: a bare host:port is https unless SSL is off
        scheme, host = ("http" if get("connection.ssl.enabled") == "false" else "https"), endpoint
    options: dict[str, Any] = {
        "endpoint_override": host.rstrip("/"),
        "scheme": scheme,
        "force_virtual_addressing": get("path.style.access") != "true",
    }
    if get("endpoint.region"):
        options["region"] = get("endpoint.region")
    if get("access.key") and get("secret.key"):
        options["access_key"], options["secret_key"] = get("access.key"), get("secret.key")
        if get("session.token"):
            options["session_token"] = get("session.token")
    return options


def storage_error(uri: str, text: str, endpoint: str = "") -> DataError | None:
    """One sentence for a data set that cannot be read from its storage (`text`: the
    failure's pyarrow or Java text), naming the URL and the fix; None when the text names no
    problem `s3_problem` knows. `endpoint`: the object store's, when known."""
    problem = s3_problem(text)
    parsed = urllib.parse.urlparse(uri)
    where = f" at {endpoint}" if endpoint else ""
    if problem == NO_S3A:
        return DataError(
            f"cannot read {uri!r}: this node's Spark has no S3A filesystem (the hadoop-aws and "
            "AWS SDK jars); re-provision the nodes with the spark role's spark_s3a_enabled on "
            "(the stack's object store turns it on)"
        )
    if not is_s3(uri):
        return _filesystem_error(uri, problem)
    if problem == NO_BUCKET:
        return DataError(
            f"cannot read {uri!r}: the object store{where} has no bucket {parsed.netloc!r}; "
            "fix the URL or upload the data there (`trainstack data put DIR s3://BUCKET/...`)"
        )
    if problem == NOT_FOUND:
        return DataError(
            f"cannot read {uri!r}: nothing is stored under that key or prefix; fix the URL "
            f"(`trainstack data ls s3://{parsed.netloc}/` lists the bucket) or upload the data "
            "(`trainstack data put`)"
        )
    if problem == DENIED:
        return DataError(
            f"cannot read {uri!r}: the object store{where} refused the keys (access denied); "
            "the nodes' spark.hadoop.fs.s3a.access.key and secret.key (spark-defaults.conf) "
            "must be the stack's objectStoreAccessKey and objectStoreSecretKey: re-provision"
        )
    if problem in (UNKNOWN_HOST, UNREACHABLE):
        cause = "its host does not resolve" if problem == UNKNOWN_HOST else "connection refused"
        return DataError(
            f"cannot read {uri!r}: the object store{where} is unreachable ({cause}); check "
            "that it runs (`pulumi up` brings it up) and the nodes' spark.hadoop.fs.s3a.endpoint"
        )
    return None


def _filesystem_error(uri: str, problem: str | None) -> DataError | None:
    """storage_error's sentence for a URL other than s3(a):// (hdfs://, file://)."""
    host = urllib.parse.urlparse(uri).netloc
    if problem == UNKNOWN_HOST:
        return DataError(
            f"cannot read {uri!r}: host {host.split(':')[0]!r} does not resolve; fix the host "
            "name in the URL (a name every node resolves)"
        )
    if problem == UNREACHABLE:
        return DataError(
            f"cannot read {uri!r}: {host or 'its server'} refuses connections; check that the "
            "file system's server runs there and the port in the URL"
        )
    if problem == NOT_FOUND:
        return DataError(f"data path {uri!r} does not exist; fix the path or copy the data there")
    if problem == DENIED:
        return DataError(f"cannot read {uri!r}: permission denied; let the job's user read it")
    return None


def check_store(fs: pafs.FileSystem, uri: str, fmt: str, endpoint: str = "") -> list[str]:
    """The data files of an s3a:// data set (`data_files`), read with pyarrow from the object
    store; DataError, one sentence, for a missing bucket or prefix, no data files, refused
    keys or an unreachable store."""
    from pyarrow import fs as pafs

    path = s3_path(uri)
    try:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            bucket = path.split("/", 1)[0]
            missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
            text = "NoSuchBucket" if missing else "NoSuchKey"
            raise storage_error(uri, text, endpoint) or DataError(f"{uri!r} does not exist")
        files = data_files(fs, path, fmt)
    except OSError as exc:
        raise _store_failure(uri, exc, endpoint) from None
    if not files:
        raise DataError(
            f"data path {uri!r} has no {fmt} files (`trainstack data ls {uri}` lists what is "
            "there); give the prefix of the data set's files"
        )
    return files


def _store_failure(uri: str, exc: Exception, endpoint: str = "") -> DataError:
    """A pyarrow failure to read `uri` from its store, as one sentence."""
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return storage_error(uri, text, endpoint) or DataError(f"cannot read {uri!r}: {first}")


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
    elif is_s3(uri):
        uri = s3a_uri(uri)  # Spark's S3A filesystem; s3:// has none
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


def data_files(fs: pafs.FileSystem, path: str, fmt: str) -> list[str]:
    """The data files Spark would read at `path` on `fs` (a file, or a directory's visible
    files: none under a name starting with "_" or ".")."""
    from pyarrow import fs as pafs

    if fs.get_file_info(path).type == pafs.FileType.File:
        return [path]
    suffix = ".csv" if fmt == "csv" else ".parquet"
    base = path.rstrip("/") + "/"
    found = []
    for info in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        parts = info.path.removeprefix(base).split("/")
        if info.type != pafs.FileType.File or any(p.startswith(("_", ".")) for p in parts):
            continue
        if info.extension == suffix[1:] or (fmt == "parquet" and not info.extension):
            found.append(info.path)
    return sorted(found)


def parquet_schema(fs: pafs.FileSystem, file: str) -> Any:
    """The Parquet file's schema, from its footer; DataError naming the file when the footer
    is missing or damaged (truncated, overwritten)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(file, filesystem=fs)
    except Exception as exc:
        if isinstance(exc, OSError) and s3_problem(str(exc)):
            raise  # the store's failure, not the file's: the caller names it
        raise DataError(
            f"data file {file!r} is not a readable Parquet file ({exc}); "
            "it is truncated or damaged: restore or rewrite it"
        ) from None


def check_files(path: Path, fmt: str) -> None:
    """Check every file of a local data set before Spark reads it; raise DataError naming the
    file and the problem: a Parquet file whose footer is missing or damaged (truncated,
    overwritten), a CSV row with another number of fields than the header (Spark's permissive
    CSV reader would silently pad it with nulls or drop the extra fields)."""
    import csv

    from pyarrow import fs as pafs

    local = pafs.LocalFileSystem()
    files = data_files(local, str(path), fmt)
    if not files:
        raise DataError(f"data path {str(path)!r} has no {fmt} files")
    for file in files:
        if fmt == "parquet":
            parquet_schema(local, file)
            continue
        with open(file, newline="", errors="replace") as fh:
            rows = csv.reader(fh)
            header = next(rows, None)
            if not header:
                raise DataError(f"data file {file!r} is empty (no CSV header row)")
            for number, row in enumerate(rows, start=2):
                if row and len(row) != len(header):
                    raise DataError(
                        f"data file {file!r} line {number} has {len(row)} fields, the "
                        f"header has {len(header)}: the file is truncated or has rows with the "
                        "wrong number of features"
                    )


def read_source(spark: SparkSession, uri: str, fmt: str, schema: Any = None) -> DataFrame:
    """The data set as Spark reads it; with `schema` (a Parquet set's, read by pyarrow:
    arrow.spark_schema) without Spark's own schema job."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException, IllegalArgumentException

    try:
        if fmt == "csv":
            return spark.read.option("header", True).option("inferSchema", True).csv(uri)
        return (spark.read if schema is None else spark.read.schema(schema)).parquet(uri)
    except (AnalysisException, IllegalArgumentException) as exc:  # e.g. PATH_NOT_FOUND
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        error = storage_error(uri, text, _endpoint(spark))
        raise (error or DataError(f"cannot read {fmt} data at {uri!r}: {text}")) from None
    except Py4JJavaError as exc:  # Hadoop's own failure: its Java exception's first line
        cause = _java_cause(exc)
        error = storage_error(uri, cause, _endpoint(spark))
        raise (error or DataError(f"cannot read {fmt} data at {uri!r}: {cause}")) from None


def _endpoint(spark: SparkSession) -> str:
    """The object store's endpoint in the session's conf, "" when none is set."""
    try:
        return str(spark.sparkContext.getConf().get(S3A_CONF + "endpoint", "") or "")
    except Exception:  # only for a message: never fail the failure's report
        return ""


def _java_cause(exc: Exception) -> str:
    """A Py4J error's Java exception as one line (its class and message), without the trace."""
    try:
        text = str(exc.java_exception.toString())  # type: ignore[attr-defined]
    except Exception:  # not a live Java exception
        text = str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
