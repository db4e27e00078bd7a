"""The data stage: generator, validation, split, shards, and every bad-input case."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from trainstack_training.config import ConfigError, TrainConfig, parse_args
from trainstack_training.data import (
    DataError,
    digits_arrays,
    generate_digits,
    load_arrays,
    prepare,
    spark_xxhash64,
    stage,
)
from trainstack_training.spark import ClusterError, check_slots

pytestmark = pytest.mark.training


def _cfg(tmp: Path, **kw: Any) -> TrainConfig:
    return TrainConfig(output=str(tmp), **kw).validate()


def test_generator_is_deterministic_and_scales(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    assert generate_digits(tmp_path / "a", rows=5000, seed=3) == 5000
    assert generate_digits(tmp_path / "b", rows=5000, seed=3) == 5000
    a = pq.read_table(tmp_path / "a").to_pandas()
    b = pq.read_table(tmp_path / "b").to_pandas()
    assert len(a) == 5000 and a.equals(b)
    assert a["label"].between(0, 9).all()
    # the copies are augmented, not duplicates of the 1797 originals
    assert not np.allclose(a.iloc[:1797, :64].to_numpy(), a.iloc[1797:3594, :64].to_numpy())


def test_digits_are_scikit_learns_digits() -> None:
    from sklearn.datasets import load_digits

    images, labels = digits_arrays()
    expected = load_digits()
    assert images.dtype == np.float64 and images.shape == (1797, 8, 8)
    assert np.array_equal(images, expected.images) and np.array_equal(labels, expected.target)


def test_prepare_digits_shards_split_normalise(spark: Any, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, workers=2)
    info = prepare(lambda: spark, cfg, tmp_path / "data")
    assert info.total_rows == 1797 and info.n_features == 64 and len(info.shard_rows) == 2
    assert info.train_rows + info.val_rows == 1797
    assert 0.15 < info.val_rows / 1797 < 0.25
    x, y = load_arrays(info.shard_dir(0), info.scale)
    assert x.shape == (info.shard_rows[0], 64) and x.min() >= 0.0 and x.max() <= 1.0
    assert set(np.unique(y)) <= set(range(10))
    again = prepare(lambda: spark, cfg, tmp_path / "data2")  # seeded: same split, same shards
    assert again.shard_rows == info.shard_rows and again.val_rows == info.val_rows
    xv1, _ = load_arrays(info.val_dir, info.scale)
    xv2, _ = load_arrays(again.val_dir, again.scale)
    assert np.array_equal(np.sort(xv1, axis=0), np.sort(xv2, axis=0))


def _sorted_rows(path: str, scale: Any) -> tuple[np.ndarray, np.ndarray]:
    x, y = load_arrays(path, scale)
    order = np.lexsort(np.column_stack([x, y]).T)
    return x[order], y[order]


def _on_path(path: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make prepare() take `path`; returns the local_prep_mb to use."""
    if path == "driver":  # a small set the arrow path does not take
        monkeypatch.setattr(stage, "_small_parquet_files", lambda *_: None)
    return 0 if path == "spark" else 32


def test_every_path_gives_the_same_shards(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small set is read by pyarrow and split with Spark's hash in numpy ("arrow"), or read
    # by one Spark job and prepared in the driver ("driver"); the distributed stage
    # (local_prep_mb=0) must give bit-identical shards, split and scaling.
    arrow = prepare(lambda: spark, _cfg(tmp_path, workers=3), tmp_path / "arrow")
    big = prepare(lambda: spark, _cfg(tmp_path, workers=3, local_prep_mb=0), tmp_path / "spark")
    _on_path("driver", monkeypatch)
    small = prepare(lambda: spark, _cfg(tmp_path, workers=3), tmp_path / "driver")
    assert (arrow.path, small.path, big.path) == ("arrow", "driver", "spark")
    for other in (arrow, small):
        assert other.shard_rows == big.shard_rows and other.val_rows == big.val_rows
        assert other.total_rows == big.total_rows == 1797
        for k in range(3):
            xs, ys = _sorted_rows(other.shard_dir(k), other.scale)
            xb, yb = _sorted_rows(big.shard_dir(k), big.scale)
            assert xs.dtype == xb.dtype == np.float32 and np.array_equal(xs, xb)
            assert np.array_equal(ys, yb)
        assert all(
            np.array_equal(a, b)
            for a, b in zip(
                _sorted_rows(other.val_dir, other.scale),
                _sorted_rows(big.val_dir, big.scale),
                strict=True,
            )
        )
    assert set(arrow.phases) >= {"data_source", "data_arrow_read", "data_driver_prepare"}
    assert set(small.phases) >= {"data_source", "data_spark_read", "data_driver_prepare"}
    # One pass over the set: the write computes the statistics, so no stats job of its own.
    assert "data_spark_write" in big.phases and "data_spark_stats" not in big.phases
    assert other.scale == big.scale and len(big.scale or []) == 64
    assert arrow.feature_bytes == small.feature_bytes == 8  # the short paths: float64
    # The distributed stage's one write leaves the shards and the validation set where the
    # ranks read them, and nothing of the write beside them.
    assert not (tmp_path / "spark" / "_parts").exists()
    assert sorted(p.name for p in Path(big.train_dir).iterdir()) == [f"shard={k}" for k in range(3)]


def test_a_flat_parquet_sets_schema_is_spark_s_own_without_its_job(
    spark: Any, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from trainstack_training.data.arrow import arrow_store, spark_schema

    table = pa.table(
        {
            "i8": pa.array([1, 2], pa.int8()), "i16": pa.array([1, 2], pa.int16()),
            "i32": pa.array([1, None], pa.int32()), "i64": pa.array([1, 2], pa.int64()),
            "f": pa.array([0.5, 1.5], pa.float32()), "d": pa.array([0.5, None], pa.float64()),
            "b": pa.array([True, False]), "s": pa.array(["a", "b"]),
        }
    )  # fmt: skip
    flat = tmp_path / "flat"
    flat.mkdir()
    for k in range(2):
        pq.write_table(table, flat / f"part-{k}.parquet")
    for where in (flat, flat / "part-0.parquet"):
        store = arrow_store(str(where), {})
        assert store is not None
        assert spark_schema(store, "parquet") == spark.read.parquet(str(where)).schema
    # Where Spark must infer it: a type outside the map, partition directories, a CSV.
    odd = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"u": pa.array([1], pa.uint32())}), odd)
    nested = tmp_path / "nested" / "k=1"
    nested.mkdir(parents=True)
    pq.write_table(table, nested / "part-0.parquet")
    for where in (odd, nested.parent):
        assert spark_schema(arrow_store(str(where), {}), "parquet") is None  # type: ignore[arg-type]
    assert spark_schema(arrow_store(str(flat), {}), "csv") is None  # type: ignore[arg-type]


def test_the_arrow_path_never_starts_spark_sql(tmp_path: Path) -> None:
    def no_session() -> Any:
        raise AssertionError("the arrow path asked for a Spark session")

    info = prepare(no_session, _cfg(tmp_path, workers=2), tmp_path / "data")
    assert info.path == "arrow" and info.total_rows == 1797


@pytest.mark.parametrize("seed", [42, 0, -7, 2**31 - 1, 2**31, -(2**40)])
def test_spark_xxhash64_matches_spark_bit_for_bit(spark: Any, tmp_path: Path, seed: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F  # noqa: N812

    rng = np.random.default_rng(5)
    n = 2000
    edge_f = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1.5, 3.4e38]
    cols: dict[str, pa.Array] = {}
    for name, dtype in [("i8", np.int8), ("i16", np.int16), ("i32", np.int32), ("i64", np.int64)]:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
        values[:4] = [info.min, info.max, 0, -1]
        cols[name] = pa.array(values, mask=rng.random(n) < 0.05)
    for name, dtype in [("f32", np.float32), ("f64", np.float64)]:
        values = rng.normal(size=n).astype(dtype)
        values[: len(edge_f)] = edge_f
        cols[name] = pa.array(values, mask=rng.random(n) < 0.05)
    cols["id"] = pa.array(np.arange(n))
    path = tmp_path / "types.parquet"
    pq.write_table(pa.table(cols), path)
    hashed = ["f32", "i8", "f64", "i16", "i64", "i32"]
    rows = (
        spark.read.parquet(str(path))
        .select("id", F.xxhash64(F.lit(seed), *[F.col(c) for c in hashed]).alias("h"))
        .orderBy("id")
        .collect()
    )
    expected = np.array([r["h"] for r in rows], dtype=np.int64)
    table = pq.read_table(path)
    got = spark_xxhash64(seed, [table.column(c) for c in hashed], n)
    assert got.dtype == np.int64 and np.array_equal(got, expected)


def test_csv_input(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {"a": rng.normal(size=400), "b": rng.normal(size=400), "y": rng.integers(0, 3, size=400)}
    )
    df.to_csv(tmp_path / "in.csv", index=False)
    cfg = _cfg(tmp_path, data=str(tmp_path / "in.csv"), label_col="y", n_classes=3, workers=2)
    info = prepare(lambda: spark, cfg, tmp_path / "data")
    assert info.n_features == 2 and info.feature_cols == ["a", "b"] and info.total_rows == 400


def test_a_regressions_float_labels_are_the_same_float32_on_every_path(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(2)
    df = pd.DataFrame(rng.random((300, 3)), columns=["a", "b", "c"])
    df["y"] = rng.normal(100.0, 30.0, size=300)
    data_set = _parquet(tmp_path, df)
    infos = {}
    for path in ("arrow", "spark", "driver"):  # "driver" last: it patches the arrow path off
        prep_mb = _on_path(path, monkeypatch)
        cfg = _cfg(tmp_path, data=data_set, label_col="y", workers=2, local_prep_mb=prep_mb)
        infos[path] = prepare(lambda: spark, cfg, tmp_path / path)
        info = infos[path]
        assert (info.path, info.task, info.n_classes) == (path, "regression", 0)
    for k in range(2):
        shards = [_sorted_rows(info.shard_dir(k), info.scale) for info in infos.values()]
        assert all(y.dtype == np.float32 for _, y in shards)
        assert all(np.array_equal(shards[0][1], y) for _, y in shards[1:])
    import pyarrow as pa
    import pyarrow.parquet as pq

    labels = df["y"].to_numpy().copy()
    labels[9] = np.nan
    nan_set = tmp_path / "nan.parquet"  # a NaN value, not a null (pandas would write a null)
    pq.write_table(pa.table({**{c: pa.array(df[c]) for c in "abc"}, "y": labels}), nan_set)
    for prep_mb in (32, 0):  # the driver path (arrow is patched off), then the Spark path
        cfg = _cfg(tmp_path, data=str(nan_set), label_col="y", local_prep_mb=prep_mb)
        with pytest.raises(DataError, match=r"^label column 'y' has 1 values that are not finite"):
            prepare(lambda: spark, cfg, tmp_path / f"nan{prep_mb}")


def _parquet(tmp: Path, df: pd.DataFrame) -> str:
    path = tmp / "bad.parquet"
    df.to_parquet(path)
    return str(path)


def _digits_df(n: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    df = pd.DataFrame(rng.random((n, 4)), columns=["f0", "f1", "f2", "f3"])
    df["label"] = rng.integers(0, 10, size=n)
    return df


@pytest.mark.parametrize("path", ["arrow", "driver", "spark"])
@pytest.mark.parametrize(
    ("mutate", "kwargs", "pattern"),
    [
        (lambda d: d.drop(columns=["label"]), {}, r"label column 'label' is missing"),
        (lambda d: d, {"feature_cols": "f0,nope"}, r"feature columns \['nope'\] are missing"),
        (
            lambda d: d.assign(label=d["label"] + 0.5),
            {"task": "classification"},
            r"non-integer values \(e\.g\. ",
        ),
        (
            lambda d: d.assign(label=d["label"].astype(str)),
            {},
            r"has type string; it must hold integers in \[0, 10\)",
        ),
        (
            lambda d: d.assign(label=d["label"].where(d.index != 7, 12)),
            {},
            r"label 12 .* out of range; labels must be integers in \[0, 10\)",
        ),
        (
            lambda d: d.assign(label=d["label"].where(d.index != 7, -1)),
            {},
            r"label -1 .* out of range",
        ),
        (lambda d: d.iloc[:0], {}, r"is empty \(0 rows\)"),
        (lambda d: d.iloc[:3], {"workers": 8}, r"fewer than workers=8"),
        (lambda d: d.assign(f1="x"), {}, r"must be numeric; not numeric: \['f1 \(string\)'\]"),
        (
            lambda d: d.assign(f2=d["f2"].where(d.index % 50 != 3)),  # 6 nulls in f2
            {},
            r"^feature columns have null values \{'f2': 6\}; clean or drop them first$",
        ),
    ],
    ids=[
        "missing-label",
        "missing-feature",
        "fractional-label",
        "string-label",
        "label-too-big",
        "label-negative",
        "empty",
        "fewer-rows-than-workers",
        "text-feature",
        "null-feature",
    ],
)
def test_bad_data_fails_with_cause(
    spark: Any,
    tmp_path: Path,
    mutate: Any,
    kwargs: dict[str, Any],
    pattern: str,
    path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local_prep_mb = _on_path(path, monkeypatch)
    cfg = _cfg(
        tmp_path,
        data=_parquet(tmp_path, mutate(_digits_df())),
        local_prep_mb=local_prep_mb,
        **kwargs,
    )
    with pytest.raises(DataError, match=pattern):
        prepare(lambda: spark, cfg, tmp_path / "data")
    # The distributed path checks after its one write: a refused set leaves no shards.
    assert not [p.name for p in (tmp_path / "data").glob("*")]


def test_corrupted_files_fail_naming_file_and_problem(spark: Any, tmp_path: Path) -> None:
    # A truncated Parquet file (its footer is gone) inside a data set directory.
    good = tmp_path / "set" / "part-0.parquet"
    good.parent.mkdir()
    _digits_df().to_parquet(good)
    cut = good.parent / "part-1.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(DataError, match=rf"data file '{cut}' is not a readable Parquet file"):
        prepare(lambda: spark, _cfg(tmp_path, data=str(good.parent)), tmp_path / "d")
    # A CSV row with fewer fields than the header (Spark's permissive reader would pad it).
    csv = tmp_path / "rows.csv"
    csv.write_text("f0,f1,label\n0.1,0.2,1\n0.3,2\n")
    with pytest.raises(DataError, match=rf"'{csv}' line 3 has 2 fields, the header has 3"):
        prepare(lambda: spark, _cfg(tmp_path, data=str(csv)), tmp_path / "d")


def test_unreachable_path_and_url(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data path '/nonexistent/x.parquet' does not exist"):
        prepare(lambda: spark, _cfg(tmp_path, data="/nonexistent/x.parquet"), tmp_path / "d")
    with pytest.raises(DataError, match=r"data URL 'http://127.0.0.1:9/x.csv' is unreachable"):
        prepare(lambda: spark, _cfg(tmp_path, data="http://127.0.0.1:9/x.csv"), tmp_path / "d")
    # s3a:// on a node without Hadoop's S3A jars (spark_s3a_enabled off): one sentence, not
    # Spark's "An error occurred while calling o554.parquet" and a Java trace.
    with pytest.raises(DataError) as raised:
        prepare(lambda: spark, _cfg(tmp_path, data="s3a://bucket/x.parquet"), tmp_path / "d")
    assert str(raised.value).startswith(
        "cannot read 's3a://bucket/x.parquet': this node's Spark has no S3A filesystem"
    ), raised.value
    assert "spark_s3a_enabled" in str(raised.value) and "\n" not in str(raised.value)


def test_shard_smaller_than_batch(spark: Any, tmp_path: Path) -> None:
    path = _parquet(tmp_path, _digits_df(60))
    with pytest.raises(DataError, match=r"fewer than batch_size=64"):
        prepare(lambda: spark, _cfg(tmp_path, data=path, batch_size=64), tmp_path / "d")


def test_not_enough_slots_fails_fast(spark: Any, tmp_path: Path) -> None:
    # the session is local[2]: a 3-task barrier stage can never be scheduled
    start = time.perf_counter()
    with pytest.raises(ClusterError, match=r"fewer free task slots than workers=3"):
        check_slots(spark.sparkContext, _cfg(tmp_path, workers=3, slot_wait_seconds=3))
    assert time.perf_counter() - start < 60


def test_config_flags_file_and_bad_values(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('workers = 3\nepochs = 7\ndata = "digits"\n')
    cfg = parse_args(["--config", str(f), "--epochs", "2", "--no-plot"])
    assert (cfg.workers, cfg.epochs, cfg.plot) == (3, 2, False)
    with pytest.raises(ConfigError, match=r"workers=0: must be >= 1"):
        parse_args(["--workers", "0"])
    with pytest.raises(ConfigError, match=r"unknown config keys \['bogus'\]"):
        TrainConfig.from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match=r"train_strategy='ps': allowed are multi-worker, single"):
        parse_args(["--train-strategy", "ps"])
    single = parse_args(["--train-strategy", "single", "--workers", "4", "--cores-per-worker", "2"])
    assert (single.workers, single.cores_per_worker) == (1, 2)


def test_session_settings_for_barrier_training(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    # TF's collectives are set up once per process: Python workers must not be reused.
    assert conf.get("spark.python.worker.reuse") == "false"
    assert conf.get("spark.scheduler.barrier.maxConcurrentTasksCheck.interval") == "1s"
    assert conf.get("spark.master") == "local[2,4]"  # plain local[N] would never retry


# Both checks below need TensorFlow in a process of its own, started as a task's worker is;
# one process runs both (a TensorFlow import is about 10 CPU-seconds): the worker's
# environment first, while the runtime has not started, then the input pipelines' options.
TF_PROCESS = (
    "import json, os\n"
    # As in a task's worker: forked from the daemon that imported TensorFlow already.
    "from trainstack_training.daemon import preload\n"
    "preload()\n"
    "from trainstack_training.frameworks.base import pin_to_cores\n"
    "from trainstack_training.frameworks.tensorflow import configure_environment\n"
    "tf_config = {'cluster': {'worker': ['h:1', 'h:2']}, 'task': {'type': 'worker', "
    "'index': 1}}\n"
    "configure_environment(tf_config, cores=1)\n"
    "print('pinned', pin_to_cores(1, 1))\n"
    "from trainstack_training.frameworks.tensorflow import import_tensorflow\n"
    "tf = import_tensorflow(1)\n"
    "r = tf.distribute.cluster_resolver.TFConfigClusterResolver()\n"
    "print('environment', json.dumps([r.task_id, os.environ['TF_USE_LEGACY_KERAS'], "
    "tf.config.threading.get_intra_op_parallelism_threads(), "
    "len(os.sched_getaffinity(0)), tf.keras.__name__]))\n"
    "tf.constant(1) + 1  # the runtime starts\n"
    "try:\n"
    "    configure_environment(None, 1)\n"
    "except RuntimeError as exc:\n"
    "    print('refused:', exc)\n"
    "from trainstack_training.frameworks.tensorflow import input_options\n"
    "o = input_options(tf)\n"
    "print('options', json.dumps([o.autotune.enabled, o.experimental_distribute.auto_shard_policy "
    "== tf.data.experimental.AutoShardPolicy.OFF]))\n"
    "ds = tf.data.Dataset.range(4).with_options(o)\n"
    "print('dataset', json.dumps([ds.options().autotune.enabled, [int(x) for x in ds]]))\n"
)


@pytest.fixture(scope="module")
def tf_process() -> dict[str, str]:
    """What TF_PROCESS printed: its lines by their first word ("refused:" included)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", TF_PROCESS], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    said = dict(ln.split(" ", 1) for ln in lines if " " in ln)
    assert set(said) >= {"pinned", "environment", "options", "dataset"}, lines
    return said


def test_worker_environment_is_set_before_tensorflow(tf_process: dict[str, str]) -> None:
    task_id, legacy, intra, ncpu, keras_name = json.loads(tf_process["environment"])
    assert (task_id, legacy, intra, ncpu) == (1, "1", 1, 1)
    assert keras_name.startswith("tf_keras"), keras_name
    assert "refused:" in tf_process, tf_process
    assert tf_process["refused:"].startswith("TensorFlow's runtime already runs"), tf_process


def test_input_pipelines_keep_their_shard_and_skip_autotuning(tf_process: dict[str, str]) -> None:
    assert json.loads(tf_process["options"]) == [False, True]
    assert json.loads(tf_process["dataset"]) == [False, [0, 1, 2, 3]]
