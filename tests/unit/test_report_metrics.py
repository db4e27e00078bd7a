"""A run's result carries whatever metrics the model logs (Keras' `History` keys, a full-mode
job's returned dict): a regression model's report does not trip over a missing accuracy, and a
classifier's output keeps every key it had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainstack_training import report
from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo
from trainstack_training.epochs import headline, metric_names
from trainstack_training.frameworks.base import returned_metrics
from trainstack_training.metrics import gauge_name
from trainstack_training.queue.process import epoch_line
from trainstack_training.rundir import ATTEMPTS_LOG, EPOCH_LOG

from infra.jobs.show import result_metrics

pytestmark = pytest.mark.unit

INFO = DataInfo("t", "v", 4, 1, ["a", "b", "c", "d"], [50, 50], 20, 120, 0.5)


def _run(tmp_path: Path, rows: list[dict], returned: dict | None = None) -> dict:
    with (tmp_path / EPOCH_LOG).open("w") as fh:
        for i, metrics in enumerate(rows, 1):
            row = {"epoch": i, "attempt": 1, "train_seconds": 1.0, "samples": 100, **metrics}
            fh.write(json.dumps(row) + "\n")
    (tmp_path / ATTEMPTS_LOG).write_text("1\n")
    chief = {"host": "w1", "peak_rss_mb": 100.0, "model_path": "/m", "returned": returned or {}}
    return report.build_metrics(TrainConfig(workers=2), INFO, [chief], tmp_path, 3.0, 5.0)


REGRESSION = [
    {"loss": 0.9, "mae": 0.8, "val_loss": 0.7, "val_mae": 0.6},
    {"loss": 0.5, "mae": 0.4, "val_loss": 0.3, "val_mae": 0.2},
]


def test_a_regression_report_has_its_own_metrics_and_no_accuracy(tmp_path):
    metrics = _run(tmp_path, REGRESSION)
    assert metrics["history"] == {
        "loss": [0.9, 0.5],
        "mae": [0.8, 0.4],
        "val_loss": [0.7, 0.3],
        "val_mae": [0.6, 0.2],
    }
    assert metrics["final"] == {"loss": 0.5, "mae": 0.4, "val_loss": 0.3, "val_mae": 0.2}
    assert (metrics["metric"], metrics["metric_value"]) == ("val_loss", 0.3)
    assert metrics["final_val_loss"] == 0.3
    assert "accuracy" not in metrics and "final_val_accuracy" not in metrics
    summary = report.summary(metrics)
    assert "accuracy" not in summary and summary["final"]["val_mae"] == 0.2
    line = report.summary_line({**summary, "samples_per_second": 10.0})
    assert line.startswith("val_loss 0.3000 after 2 epochs on 2 worker(s)"), line


def test_a_classifier_keeps_every_key_it_had(tmp_path):
    metrics = _run(
        tmp_path,
        [{"loss": 0.4, "accuracy": 0.8, "val_loss": 0.5, "val_accuracy": 0.75, "lr": 0.01}],
    )
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert metrics[key] == metrics["history"][key]
    assert "lr" not in metrics["history"]  # a setting, not a metric
    assert metrics["final_val_accuracy"] == 0.75 and metrics["final_val_loss"] == 0.5
    summary = report.summary(metrics)
    assert summary["accuracy"] == summary["final_val_accuracy"] == 0.75
    assert report.summary_line(summary).startswith("validation accuracy 0.7500 after 1 epochs")


def test_a_full_mode_jobs_returned_dict_is_the_result_verbatim(tmp_path):
    metrics = _run(tmp_path, REGRESSION, returned={"val_mae": 0.25, "r2": 0.9})
    assert metrics["final"] == {"val_mae": 0.25, "r2": 0.9}
    assert (metrics["metric"], metrics["metric_value"]) == ("val_mae", 0.25)
    assert metrics["history"]["val_mae"] == [0.6, 0.2]  # the curves stay the epoch log's


def test_custom_metric_names_in_log_order_and_the_headline(tmp_path):
    rows = [{"loss": 1.0, "top_5": 0.3}, {"loss": 0.8, "top_5": 0.4, "val_top_5": 0.2}]
    assert metric_names(rows) == ["loss", "top_5", "val_top_5"]
    assert headline(["loss", "top_5", "val_top_5"]) == "val_top_5"
    assert headline(["loss", "mae"]) == "loss"
    assert headline([]) is None
    assert report.plot_panels(["loss", "mae", "val_loss", "val_mae"]) == ["loss", "mae"]
    assert report.plot_panels(["mae", "val_mae", "loss"]) == ["mae", "loss"]


def test_the_curves_draw_a_regressions_metrics(tmp_path):
    metrics = _run(tmp_path, REGRESSION)
    report.write_plot(metrics, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_the_epoch_line_shows_every_metric(tmp_path):
    line = epoch_line(
        {"epoch": 2, "attempt": 1, "train_seconds": 1.5, "samples": 9, **REGRESSION[1]}, 3
    )
    assert line == (
        "[trainstack] epoch 2/3 loss 0.5000 mae 0.4000 val_loss 0.3000 val_mae 0.2000 "
        "(1.5 s, attempt 1)\n"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [("high", "'high'"), (None, "None"), ([0.1], "[0.1]"), (True, "True")],
)
def test_a_returned_value_that_is_not_a_number_is_named(value, shown):
    from trainstack_training.context import UserCodeError

    with pytest.raises(UserCodeError) as raised:
        returned_metrics({"val_mae": 0.2, "quality": value}, "m.py")
    assert type(raised.value) is UserCodeError
    assert str(raised.value) == (
        f"your code failed: train(ctx) in m.py returned quality={shown}; each value of the "
        "returned dict must be a number (a metric's final value)"
    )


def test_returned_numbers_of_any_kind_are_floats():
    import numpy as np

    assert returned_metrics({"a": np.float32(0.5), "b": 2}, "m.py") == {"a": 0.5, "b": 2.0}


def test_gauge_names_are_prometheus_names():
    assert gauge_name("val_mae") == "val_mae"
    assert gauge_name("top-5 acc") == "top_5_acc"
    assert gauge_name("epoch") == "metric_epoch"  # the run's own gauge keeps its name


def test_status_shows_a_regressions_metrics_and_a_classifiers_accuracy():
    regression = {"metric": "val_loss", "final": {"loss": 0.5, "val_mae": 0.2, "val_loss": 0.3}}
    assert result_metrics(regression) == "val_loss 0.3000, val_mae 0.2000, loss 0.5000"
    classifier = {"metric": "val_loss", "final_val_accuracy": 0.9, "final": {"val_loss": 0.3}}
    assert result_metrics(classifier) == "validation accuracy 0.9000 (val_loss 0.3000)"
    assert result_metrics({"final_val_accuracy": 0.9}) == "validation accuracy 0.9"


def test_a_failure_after_the_users_code_names_the_saved_model(tmp_path):
    (tmp_path / "model.keras").write_bytes(b"a model")
    with (
        pytest.raises(report.ReportError) as raised,
        report.after_training(tmp_path, "model.keras"),
    ):
        {}["val_accuracy"]  # a platform bug in the report
    said = str(raised.value)
    assert said == (
        "training finished, but trainstack's report of the run failed (KeyError: "
        f"'val_accuracy'); the model is saved at {tmp_path / 'model.keras'}, and each epoch's "
        f"metrics are in {tmp_path / 'epochs.jsonl'}"
    ), said
    assert (tmp_path / "model.keras").read_bytes() == b"a model"  # nothing lost


def test_the_report_step_passes_through_when_it_works(tmp_path):
    """The report's own steps inside after_training, as the launcher runs them: what they
    write is there, and nothing is raised or replaced."""
    (tmp_path / "model.keras").write_bytes(b"a model")
    with report.after_training(tmp_path, "model.keras"):
        report.write_outputs(_run(tmp_path, REGRESSION), tmp_path)
    written = json.loads((tmp_path / report.METRICS_FILE).read_text())
    assert written["final"] == {"loss": 0.5, "mae": 0.4, "val_loss": 0.3, "val_mae": 0.2}
    assert written["history"]["val_mae"] == [0.6, 0.2], written["history"]
    assert (tmp_path / report.PLOT_FILE).read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "model.keras").read_bytes() == b"a model"
