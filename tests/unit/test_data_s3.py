"""The data stage on an object store (s3a://, data/sources.py, stage.py, arrow.py) without a
server or Spark: the one classifier of storage failures over the texts pyarrow and Hadoop's
S3A really print, the S3A settings turned into pyarrow's S3FileSystem arguments, the
sentences, and the short ("arrow") path over a local stand-in for the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs
from trainstack_training.config import TrainConfig
from trainstack_training.data import DataError, prepare, resolve_source, stage
from trainstack_training.data.arrow import Store, active_spark_conf
from trainstack_training.data.sources import (
    DENIED,
    NO_BUCKET,
    NO_S3A,
    NOT_FOUND,
    UNKNOWN_HOST,
    UNREACHABLE,
    check_store,
    s3_filesystem_options,
    s3_problem,
    storage_error,
)

pytestmark = pytest.mark.unit

# What pyarrow 25's S3FileSystem raised against a local SeaweedFS (request ids shortened).
PYARROW_TEXTS = [
    (
        "When listing objects under key 'prefix/' in bucket 'nosuchbucket-xyz': AWS Error "
        "NO_SUCH_BUCKET during ListObjectsV2 operation: The specified bucket does not exist "
        "(Request ID: 18EE83849DDB154971655524)",
        NO_BUCKET,
    ),
    (
        "Bucket 'trainstack' not found. To create buckets, enable the allow_bucket_creation "
        "option.",
        NO_BUCKET,
    ),
    (
        "Path does not exist 'trainstack/nosuch/a.parquet'. Detail: [errno 2] No such file or "
        "directory",
        NOT_FOUND,
    ),
    (
        "When getting information for key 'try' in bucket 'trainstack': AWS Error ACCESS_DENIED "
        "during HeadObject operation: No response body.",
        DENIED,
    ),
    (
        "When listing objects under key 'try/' in bucket 'trainstack': AWS Error "
        "SIGNATURE_DOES_NOT_MATCH during ListObjectsV2 operation: The request signature we "
        "calculated does not match the signature you provided. Check your key and signing "
        "method. (Request ID: 18EE83849E74554023A43895)",
        DENIED,
    ),
    (
        "When listing objects under key 'try/' in bucket 'trainstack': AWS Error "
        "INVALID_ACCESS_KEY_ID during ListObjectsV2 operation: The access key ID you provided "
        "does not exist in our records. (Request ID: 18EE83887EF20EE22C47753E)",
        DENIED,
    ),
    (
        "When getting information for key 'try' in bucket 'trainstack': AWS Error "
        "NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to "
        "server; Details: Failed to connect to 127.0.0.1 port 18399 after 0 ms: Could not "
        "connect to server",
        UNREACHABLE,
    ),
    (
        "When getting information for key 'try' in bucket 'trainstack': AWS Error "
        "NETWORK_CONNECTION during HeadObject operation: curlCode: 6, Could not resolve "
        "hostname; Details: Could not resolve host: nosuchhost.invalid",
        UNKNOWN_HOST,
    ),
]
# The Java exceptions' first lines Spark 4.0 gave with hadoop-aws 3.4.1 and the AWS SDK
# bundle 2.24.6 against the same store (and without those jars), shortened where long.
JAVA_TEXTS = [
    (
        "java.lang.RuntimeException: java.lang.ClassNotFoundException: Class "
        "org.apache.hadoop.fs.s3a.S3AFileSystem not found",
        NO_S3A,
    ),
    (
        "org.apache.hadoop.fs.s3a.UnknownStoreException: `s3a://nosuchbucket-xyz/try': "
        "getFileStatus on s3a://nosuchbucket-xyz/try: software.amazon.awssdk.services.s3.model."
        "NoSuchBucketException: The specified bucket does not exist (Service: S3, Status Code: "
        "404, Request ID: 18EE8397514C99E92D9D2BE4):NoSuchBucket: The specified bucket does not "
        "exist (Service: S3, Status Code: 404, Request ID: 18EE8397514C99E92D9D2BE4)",
        NO_BUCKET,
    ),
    (
        "[PATH_NOT_FOUND] Path does not exist: s3a://trainstack/nosuchprefix. SQLSTATE: 42K03",
        NOT_FOUND,
    ),
    (
        "java.nio.file.AccessDeniedException: s3a://trainstack/try: getFileStatus on "
        "s3a://trainstack/try: software.amazon.awssdk.services.s3.model.S3Exception: null "
        "(Service: S3, Status Code: 403, Request ID: 18EE839771ED3DB28A82A268):null",
        DENIED,
    ),
    (
        "org.apache.hadoop.fs.s3a.AWSBadRequestException: getFileStatus on s3a://b/k: "
        "software.amazon.awssdk.services.s3.model.S3Exception: null (Service: S3, Status Code: "
        "400, Request ID: X):null",
        DENIED,
    ),
    (
        "java.net.ConnectException: getFileStatus on s3a://trainstack/try: software.amazon."
        "awssdk.core.exception.SdkClientException: Unable to execute HTTP request: Connect to "
        "127.0.0.1:18399 [/127.0.0.1] failed: Connection refused",
        UNREACHABLE,
    ),
    (
        "org.apache.hadoop.fs.s3a.AWSClientIOException: getFileStatus on s3a://b/k: software."
        "amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request: "
        "Read timed out",
        UNREACHABLE,
    ),
    (
        "java.net.UnknownHostException: getFileStatus on s3a://trainstack/try: software.amazon."
        "awssdk.core.exception.SdkClientException: Received an UnknownHostException when "
        "attempting to interact with a service.: nosuchhost.invalid",
        UNKNOWN_HOST,
    ),
    ("java.net.UnknownHostException: nosuchhost.invalid", UNKNOWN_HOST),  # hdfs://, Spark 4.0
    (
        "java.net.ConnectException: Call From vm/127.0.0.1 to localhost:8029 failed on "
        "connection exception: java.net.ConnectException: Connection refused; For more details "
        "see:  http://wiki.apache.org/hadoop/ConnectionRefused",
        UNREACHABLE,
    ),
    ("java.io.FileNotFoundException: File hdfs://nn:8020/data/x does not exist", NOT_FOUND),
    (
        "org.apache.hadoop.security.AccessControlException: Permission denied: user=spark, "
        "access=READ, inode=/data/x",
        DENIED,
    ),
    ("java.io.FileNotFoundException: /srv/data/x.parquet (Permission denied)", DENIED),
]


@pytest.mark.parametrize(("text", "problem"), PYARROW_TEXTS + JAVA_TEXTS)
def test_one_classifier_names_each_storage_failure(text: str, problem: str) -> None:
    assert s3_problem(text) == problem


@pytest.mark.parametrize(
    "text",
    [
        "org.apache.spark.SparkException: Job aborted due to stage failure: OutOfMemoryError",
        "Parquet magic bytes not found in footer. Either the file is corrupted or this is not "
        "a parquet file.",
        "",
    ],
)
def test_other_failures_are_not_storage_problems(text: str) -> None:
    assert s3_problem(text) is None


CONF = {
    "spark.hadoop.fs.s3a.endpoint": "http://10.0.0.5:19110",
    "spark.hadoop.fs.s3a.path.style.access": "true",
    "spark.hadoop.fs.s3a.access.key": "AK",
    "spark.hadoop.fs.s3a.secret.key": "SK",
    "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
    "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
    "spark.master": "spark://control-1:7077",
}


def test_spark_s3a_settings_become_s3filesystem_arguments() -> None:
    assert s3_filesystem_options(CONF) == {
        "endpoint_override": "10.0.0.5:19110",
        "scheme": "http",
        "force_virtual_addressing": False,
        "region": "us-east-1",
        "access_key": "AK",
        "secret_key": "SK",
    }
    pafs.S3FileSystem(**s3_filesystem_options(CONF))  # pyarrow takes them (no request made)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # A bare host:port is https unless SSL is off, as S3A reads it.
        ({"endpoint": "store:9000", "connection.ssl.enabled": None}, {"scheme": "https"}),
        ({"endpoint": "store:9000"}, {"scheme": "http", "endpoint_override": "store:9000"}),
        (
            {"endpoint": "https://store:9000/"},
            {"scheme": "https", "endpoint_override": "store:9000"},
        ),
        ({"path.style.access": "false"}, {"force_virtual_addressing": True}),
        ({"path.style.access": None}, {"force_virtual_addressing": True}),
        ({"secret.key": None}, {"access_key": None, "secret_key": None}),  # the default chain
        ({"session.token": "T"}, {"session_token": "T"}),
        ({"endpoint.region": None}, {"region": None}),
    ],
)
def test_each_setting_maps_as_s3a_reads_it(
    changes: dict[str, str | None], expected: dict[str, Any]
) -> None:
    conf = dict(CONF)
    for key, value in changes.items():
        conf.pop(f"spark.hadoop.fs.s3a.{key}", None)
        if value is not None:
            conf[f"spark.hadoop.fs.s3a.{key}"] = value
    options = s3_filesystem_options(conf)
    for key, value in expected.items():
        assert options.get(key) == value, (key, options)


def test_no_endpoint_means_no_short_path() -> None:
    assert s3_filesystem_options({"spark.master": "local[2]"}) == {}
    assert stage.arrow_store("s3a://b/k", {}) is None


@pytest.mark.parametrize(
    ("uri", "problem", "says"),
    [
        ("s3a://b/k", NO_S3A, "spark_s3a_enabled"),
        ("s3a://b/k", NO_BUCKET, "has no bucket 'b'"),
        ("s3a://b/k", NOT_FOUND, "`trainstack data ls s3://b/`"),
        ("s3a://b/k", DENIED, "objectStoreSecretKey"),
        ("s3a://b/k", UNREACHABLE, "is unreachable (connection refused)"),
        ("s3a://b/k", UNKNOWN_HOST, "is unreachable (its host does not resolve)"),
        ("hdfs://nn.invalid:8020/x", UNKNOWN_HOST, "host 'nn.invalid' does not resolve"),
        ("hdfs://nn:8020/x", UNREACHABLE, "nn:8020 refuses connections"),
        ("hdfs://nn:8020/x", NOT_FOUND, "data path 'hdfs://nn:8020/x' does not exist"),
        ("hdfs://nn:8020/x", DENIED, "permission denied"),
    ],
)
def test_each_problem_is_one_sentence_naming_the_url(uri: str, problem: str, says: str) -> None:
    text = next(t for t, p in PYARROW_TEXTS + JAVA_TEXTS if p == problem)
    error = storage_error(uri, text, "http://10.0.0.5:19110")
    assert error is not None
    message = str(error)
    assert uri in message and says in message, message
    assert "\n" not in message and "Traceback" not in message and "java." not in message


def test_s3_scheme_is_read_as_s3a(tmp_path: Path) -> None:
    cfg = TrainConfig(output=str(tmp_path), data="s3://trainstack/sets/a/").validate()
    assert resolve_source(cfg, tmp_path) == ("s3a://trainstack/sets/a/", "parquet")
    cfg = TrainConfig(output=str(tmp_path), data="s3://trainstack/a.csv").validate()
    assert resolve_source(cfg, tmp_path) == ("s3a://trainstack/a.csv", "csv")


def test_no_spark_context_means_no_conf() -> None:
    assert active_spark_conf() == {}


# ---------------------------------------------------------------------------------------------
# The short path over a local stand-in for the store (a folder per bucket)


def _table(rows: int = 1000) -> pa.Table:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    label = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    return pa.table({**{f"f{i}": x[:, i] for i in range(4)}, "label": label})


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """s3a://trainstack/try/: two Parquet files in a folder standing in for the store."""
    root = tmp_path / "store"
    (root / "trainstack" / "try").mkdir(parents=True)
    table = _table()
    pq.write_table(table.slice(0, 500), root / "trainstack" / "try" / "part-0.parquet")
    pq.write_table(table.slice(500), root / "trainstack" / "try" / "part-1.parquet")
    fs = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    real = stage.arrow_store

    def arrow_store(uri: str, conf: Any) -> Store | None:
        found = real(uri, conf)
        if found and isinstance(found.fs, pafs.S3FileSystem):
            return Store(fs, found.path, found.endpoint)
        return found

    monkeypatch.setattr(stage, "arrow_store", arrow_store)
    return root


def _no_spark() -> Any:
    raise AssertionError("Spark SQL was asked for")


def _cfg(tmp_path: Path, data: str, **kw: Any) -> TrainConfig:
    return TrainConfig(output=str(tmp_path), data=data, workers=2, batch_size=32, **kw).validate()


def test_a_small_set_on_the_store_needs_no_spark(store: Path, tmp_path: Path) -> None:
    info = prepare(
        _no_spark, _cfg(tmp_path, "s3a://trainstack/try/"), tmp_path / "s3", spark_conf=CONF
    )
    local = prepare(_no_spark, _cfg(tmp_path, str(store / "trainstack" / "try")), tmp_path / "l")
    assert info.path == local.path == "arrow"
    assert info.total_rows == 1000 and info.feature_cols == ["f0", "f1", "f2", "f3"]
    assert (info.shard_rows, info.val_rows) == (local.shard_rows, local.val_rows)
    for k in range(2):
        assert (Path(info.shard_dir(k)) / "part-00000.parquet").read_bytes() == (
            Path(local.shard_dir(k)) / "part-00000.parquet"
        ).read_bytes()


class SparkAskedError(Exception):
    """Spark SQL's session was asked for: the data stage left the read to Spark."""


def _spark_asked() -> Any:
    raise SparkAskedError


def test_a_partitioned_or_large_set_is_left_to_spark(store: Path, tmp_path: Path) -> None:
    (store / "trainstack" / "part" / "day=1").mkdir(parents=True)
    pq.write_table(_table(10), store / "trainstack" / "part" / "day=1" / "a.parquet")
    for cfg in (
        _cfg(tmp_path, "s3a://trainstack/part/"),
        _cfg(tmp_path, "s3a://trainstack/try/", local_prep_mb=0),
    ):
        with pytest.raises(SparkAskedError):
            prepare(_spark_asked, cfg, tmp_path / "d", spark_conf=CONF)


def test_no_endpoint_in_the_conf_leaves_the_read_to_spark(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "s3a://trainstack/try/")
    with pytest.raises(SparkAskedError):
        prepare(_spark_asked, cfg, tmp_path / "d", spark_conf={})


@pytest.mark.parametrize(
    ("data", "fmt", "says"),
    [
        ("s3a://nosuchbucket/try/", "auto", "has no bucket 'nosuchbucket'"),
        ("s3a://trainstack/nosuchprefix/", "auto", "nothing is stored under that key or prefix"),
        ("s3a://trainstack/try/", "csv", "has no csv files"),
    ],
)
def test_what_is_not_there_fails_before_spark(
    store: Path, tmp_path: Path, data: str, fmt: str, says: str
) -> None:
    with pytest.raises(DataError) as raised:
        prepare(_no_spark, _cfg(tmp_path, data, data_format=fmt), tmp_path / "d", spark_conf=CONF)
    assert says in str(raised.value) and data in str(raised.value), raised.value


def test_a_damaged_file_on_the_store_is_named(store: Path, tmp_path: Path) -> None:
    part = store / "trainstack" / "try" / "part-1.parquet"
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(DataError, match=r"'trainstack/try/part-1.parquet' is not a readable"):
        prepare(_no_spark, _cfg(tmp_path, "s3a://trainstack/try/"), tmp_path / "d", spark_conf=CONF)


class FailingStore:
    """A store whose every request fails with `text`, as pyarrow's S3FileSystem raises."""

    def __init__(self, text: str) -> None:
        self.text = text

    def get_file_info(self, path: Any) -> Any:
        raise OSError(self.text)


@pytest.mark.parametrize(("text", "problem"), PYARROW_TEXTS)
def test_a_failing_store_is_one_sentence(text: str, problem: str) -> None:
    failing: Any = FailingStore(text)
    with pytest.raises(DataError) as raised:
        check_store(failing, "s3a://trainstack/try/", "parquet", "http://h:1")
    message = str(raised.value)
    expected = storage_error("s3a://trainstack/try/", text, "http://h:1")
    assert expected is not None and message == str(expected)
    assert "AWS Error" not in message and "\n" not in message
