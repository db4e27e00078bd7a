"""The job's task, declared or inferred: integer labels are a classification, floats a
regression; the manifest's `task`, `label` and `metric`; a label the task cannot use is one
sentence naming the column, a sample value and what was expected; a regression's labels stay
float32 through the data stage (the pyarrow path, no Spark) and its result says the task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainstack_training import report
from trainstack_training.config import ConfigError, TrainConfig
from trainstack_training.data import DataError, DataInfo, load_arrays, prepare
from trainstack_training.data.task import check_labels, infer_task, non_numeric_label
from trainstack_training.jobsettings import apply_manifest
from trainstack_training.manifest import JobError, load_spec
from trainstack_training.rundir import ATTEMPTS_LOG, EPOCH_LOG

from infra.jobs.show import print_status

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _no_spark() -> Any:
    raise AssertionError("the pyarrow path asked for a Spark session")


def _table(tmp_path: Path, labels: np.ndarray, name: str = "y") -> str:
    """A small Parquet set: three float features and the label column `name`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    columns = {f: pa.array(rng.random(len(labels))) for f in ("a", "b", "c")}
    path = tmp_path / "set.parquet"
    pq.write_table(pa.table({**columns, name: pa.array(labels)}), path)
    return str(path)


def _prepare(tmp_path: Path, labels: np.ndarray, **kw: Any) -> DataInfo:
    cfg = TrainConfig(output=str(tmp_path), data=_table(tmp_path, labels), label_col="y", **kw)
    return prepare(_no_spark, cfg.validate(), tmp_path / "data")


# --- the inference --------------------------------------------------------------------------


def test_integer_labels_are_a_classification_and_floats_a_regression():
    assert infer_task("auto", integral=True) == "classification"
    assert infer_task("auto", integral=False) == "regression"


def test_a_declared_task_overrides_the_label_columns_type():
    assert infer_task("regression", integral=True) == "regression"
    assert infer_task("classification", integral=False) == "classification"


# --- the refusal sentences ------------------------------------------------------------------

LABEL_STATS = {"rows": 10, "null_labels": 0, "min_label": 0, "max_label": 3}


@pytest.mark.parametrize(
    ("stats", "task", "expected"),
    [
        (
            {"nonfinite_labels": 2, "nonfinite_example": float("nan")},
            "regression",
            "label column 'y' has 2 values that are not finite numbers (e.g. nan); every label "
            "must be a finite number",
        ),
        (
            {"nonfinite_labels": 1, "nonfinite_example": float("inf")},
            "classification",
            "label column 'y' has 1 values that are not finite numbers (e.g. inf); every label "
            "must be a finite number",
        ),
        (
            {"frac_labels": 4, "frac_example": 2.5, "max_label": 3.5},
            "classification",
            "label column 'y' has 4 non-integer values (e.g. 2.5); labels must be integers in "
            '[0, 10) for a classification (task = "regression" trains on them)',
        ),
        (
            {"max_label": 70000},
            "classification",
            "label column 'y' holds 70000, more classes than a classification takes: labels "
            'must be integers in [0, 65536) (declare task = "regression" for a numeric target)',
        ),
        (
            {"max_label": 12},
            "classification",
            "label 12 in column 'y' is out of range; labels must be integers in [0, 10) "
            "(set --n-classes)",
        ),
    ],
    ids=["nan-regression", "inf-classification", "fractional", "more-than-2^16", "out-of-range"],
)
def test_a_label_the_task_cannot_use_is_one_sentence(stats, task, expected):
    with pytest.raises(DataError) as refused:
        check_labels({**LABEL_STATS, **stats}, task, "y", 10)
    said = str(refused.value)  # the product's sentence, not the literal above
    assert said == expected
    assert "\n" not in said and "'y'" in said, said


def test_a_regression_takes_fractional_negative_and_large_values():
    stats = {**LABEL_STATS, "min_label": -3.5, "max_label": 1e9, "frac_labels": 5}
    check_labels({**stats, "frac_example": 0.5}, "regression", "y", 10)  # no refusal


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ("regression", "label column 'y' has type string; a regression needs numbers, not "
         "values such as 'cat'"),
        ("classification", "label column 'y' has type string; it must hold integers in [0, 10) "
         "for a classification, not values such as 'cat'"),
        ("auto", "label column 'y' has type string; it must hold integers in [0, 10) for a "
         "classification or numbers for a regression, not values such as 'cat'"),
    ],
)  # fmt: skip
def test_string_labels_name_the_column_a_value_and_what_the_task_needs(declared, expected):
    assert str(non_numeric_label("y", "string", "cat", declared, 10)) == expected


# --- the data stage's pyarrow path (no Spark) ------------------------------------------------


def test_float_labels_stay_float32_and_make_a_regression(tmp_path):
    labels = np.random.default_rng(0).normal(100.0, 30.0, size=300)
    info = _prepare(tmp_path, labels)
    assert (info.path, info.task, info.n_classes) == ("arrow", "regression", 0)
    assert DataInfo.from_json(info.to_json()) == info  # still JSON for the barrier tasks
    ys = [load_arrays(info.shard_dir(k))[1] for k in range(len(info.shard_rows))]
    ys.append(load_arrays(info.val_dir)[1])
    assert all(y.dtype == np.float32 for y in ys)
    # every label kept as the float32 of its value (none cast to an integer)
    assert np.array_equal(np.sort(np.concatenate(ys)), np.sort(labels.astype(np.float32)))


def test_integer_labels_stay_an_int32_classification(tmp_path):
    labels = np.random.default_rng(0).integers(0, 10, size=300)
    info = _prepare(tmp_path, labels)
    assert (info.task, info.n_classes) == ("classification", 10)
    assert load_arrays(info.shard_dir(0))[1].dtype == np.int32


def test_integer_labels_declared_a_regression_become_float32(tmp_path):
    info = _prepare(tmp_path, np.arange(300) % 7, task="regression")
    assert info.task == "regression" and load_arrays(info.val_dir)[1].dtype == np.float32


def test_fractional_labels_declared_a_classification_are_refused_before_training(tmp_path):
    labels = np.full(300, 0.25)
    with pytest.raises(
        DataError,
        match=r"^label column 'y' has 300 non-integer values \(e\.g\. "
        r"0\.25\); labels must be integers in \[0, 10\) for a classification",
    ):
        _prepare(tmp_path, labels, task="classification")  # fmt: skip
    assert not (tmp_path / "data" / "train").exists()  # refused before any shard


def test_nan_labels_are_refused_naming_the_column(tmp_path):
    labels = np.linspace(0.0, 1.0, 300)
    labels[7] = np.nan  # a NaN value, not a null
    with pytest.raises(DataError, match=r"^label column 'y' has 1 values that are not finite "):
        _prepare(tmp_path, labels)


def test_more_than_65536_classes_are_refused(tmp_path):
    labels = np.arange(300)
    labels[3] = 70_000
    with pytest.raises(DataError, match=r"holds 70000, more classes than a classification"):
        _prepare(tmp_path, labels)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"task": "clasification"}, "task='clasification': allowed are auto, classification, "
         "regression"),
        ({"n_classes": 2**16 + 1}, "n_classes=65537: must be in [2, 65536]"),
    ],
)  # fmt: skip
def test_the_config_refuses_a_bad_task_or_too_many_classes(values, message):
    with pytest.raises(ConfigError) as refused:
        TrainConfig(**values).validate()
    assert str(refused.value) == message


# --- the manifest ---------------------------------------------------------------------------


def _job(tmp_path: Path, lines: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "trainstack.toml").write_text(f'[job]\nentry = "m"\n{lines}')
    (tmp_path / "m.py").write_text("def build_model(ctx): ...\n")
    return tmp_path


def test_the_regression_example_declares_its_task_label_and_metric():
    spec = load_spec(EXAMPLES / "regression")
    assert (spec.mode, spec.task, spec.label, spec.metric) == (
        "simple",
        "regression",
        "progression",
        "val_mae",
    )
    assert spec.data == "data/diabetes.parquet"


def test_without_them_the_task_label_and_metric_are_left_to_the_run(tmp_path):
    spec = load_spec(_job(tmp_path, ""))
    assert (spec.task, spec.label, spec.metric) == ("", "", "")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('task = "regresion"', "[job] task = 'regresion': allowed are 'classification', "
         "'regression' (or leave it out: the data stage infers it from the label column)"),
        ("task = 1", "[job] task = 1: allowed are 'classification', 'regression'"),
        ("label = 3", '[job] label = 3: give a label\'s name as a non-empty string, e.g. '
         'label = "target"'),
        ('label = " "', "[job] label = ' ': give a label's name as a non-empty string"),
        ('metric = ""', "[job] metric = '': give a metric's name as a non-empty string, e.g. "
         'metric = "val_mae"'),
    ],
)  # fmt: skip
def test_a_bad_task_label_or_metric_is_one_sentence(tmp_path, line, message):
    with pytest.raises(JobError) as refused:
        load_spec(_job(tmp_path, line + "\n"))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_manifests_label_and_task_reach_the_data_stage(tmp_path):
    spec = load_spec(_job(tmp_path, 'task = "regression"\nlabel = "price"\n'))
    cfg = TrainConfig()
    apply_manifest(cfg, spec)
    assert (cfg.label_col, cfg.task) == ("price", "regression")
    untouched = TrainConfig(label_col="y", task="classification")
    apply_manifest(untouched, load_spec(_job(tmp_path / "plain", "")))
    assert (untouched.label_col, untouched.task) == ("y", "classification")


def test_a_run_task_that_contradicts_the_manifest_is_refused(tmp_path):
    spec = load_spec(_job(tmp_path, 'task = "regression"\n'))
    with pytest.raises(JobError, match=r"the run's task='classification' contradicts the job's"):
        apply_manifest(TrainConfig(task="classification"), spec)


# --- the result -----------------------------------------------------------------------------


def _metrics(tmp_path: Path, info: DataInfo, metric: str = "") -> dict[str, Any]:
    rows = [{"loss": 0.9, "mae": 0.8, "val_loss": 0.7, "val_mae": 0.6}]
    row = {"epoch": 1, "attempt": 1, "train_seconds": 1.0, "samples": 100, **rows[0]}
    (tmp_path / EPOCH_LOG).write_text(json.dumps(row) + "\n")
    (tmp_path / ATTEMPTS_LOG).write_text("1\n")
    chief = {"host": "w1", "peak_rss_mb": 1.0, "model_path": "/m"}
    return report.build_metrics(TrainConfig(), info, [chief], tmp_path, 1.0, 2.0, metric)


REGRESSION_INFO = DataInfo("t", "v", 3, 0, ["a", "b", "c"], [50, 50], 20, 120, 0.5)
REGRESSION_INFO.task = "regression"


def test_the_result_says_the_task_and_shows_the_manifests_metric_first(tmp_path, capsys):
    metrics = _metrics(tmp_path, REGRESSION_INFO, metric="val_mae")
    assert metrics["task"] == "regression"
    assert (metrics["metric"], metrics["metric_value"]) == ("val_mae", 0.6)
    assert report.plot_panels(list(metrics["history"]), metrics["metric"]) == ["mae", "loss"]
    summary = report.summary(metrics)
    assert summary["task"] == "regression" and "accuracy" not in summary
    assert report.summary_line(summary).startswith("val_mae 0.6000 after 1 epochs")
    print_status({"id": "job-1", "state": "succeeded", "result": summary})
    shown = capsys.readouterr().out
    assert (
        "  regression: val_mae 0.6000, val_loss 0.7000, loss 0.9000, mae 0.8000 after 1 " in shown
    )


def test_a_metric_the_job_does_not_have_falls_back_to_val_loss(tmp_path):
    metrics = _metrics(tmp_path, REGRESSION_INFO, metric="val_r2")
    assert metrics["metric"] == "val_loss"


def test_a_result_without_a_task_still_shows(capsys):
    print_status({"id": "job-1", "state": "succeeded", "result": {"final": {"val_loss": 0.5}}})
    assert "  val_loss 0.5000 after " in capsys.readouterr().out


def test_status_names_a_torch_jobs_framework(capsys):
    base = {"id": "job-1", "state": "running", "code_sha": "a" * 64, "job": "j", "params": {}}
    print_status({**base, "framework": "torch", "mode": "simple"})
    print_status({**base, "mode": "full"})  # a TensorFlow job, or a record from before
    shown = capsys.readouterr().out
    assert "(torch, simple mode)" in shown and "(full mode)" in shown, shown
