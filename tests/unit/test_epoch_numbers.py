"""The epochs a full-mode job reports with `ctx.report(epoch=...)`: the run's rows count from 1
(as Keras' do), so a loop over `range(epochs)` is shown `epoch 1/N` .. `epoch N/N`, not as
stopping one short; the run's first report decides (epoch 0 can only count from 0), a resumed
attempt keeps that decision, only the chief writes, and a bad number is one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainstack_training import metrics as push_metrics
from trainstack_training import report
from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo
from trainstack_training.epochs import is_metric, metric_names
from trainstack_training.frameworks.base import EpochReporter, epoch_offset
from trainstack_training.queue.process import epoch_line
from trainstack_training.rundir import ATTEMPTS_LOG, EPOCH_LOG

pytestmark = pytest.mark.unit

EPOCHS = 6


@pytest.fixture(autouse=True)
def _no_pushgateway(monkeypatch):
    monkeypatch.delenv(push_metrics.PUSHGATEWAY_ENV, raising=False)


def _reporter(out: Path, attempt: int = 1, chief: bool = True) -> EpochReporter:
    return EpochReporter(out / EPOCH_LOG, chief, attempt, samples=64)


def _report(reporter: EpochReporter, epochs: range) -> None:
    for epoch in epochs:
        reporter.report({"epoch": float(epoch), "loss": 1.0 / (epoch + 1), "val_loss": 0.5})


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / EPOCH_LOG).read_text().splitlines()]


def test_a_loop_over_range_epochs_is_shown_from_1_to_n(tmp_path):
    _report(_reporter(tmp_path), range(EPOCHS))  # for epoch in range(epochs): ctx.report(...)
    rows = _rows(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["reported_epoch"] for r in rows] == [0, 1, 2, 3, 4, 5]  # the job's own numbers
    lines = [epoch_line(r, EPOCHS) for r in rows]
    assert lines[0].startswith("[trainstack] epoch 1/6 loss 1.0000 val_loss 0.5000 (")
    assert lines[-1].startswith("[trainstack] epoch 6/6 ")
    (tmp_path / ATTEMPTS_LOG).write_text("1\n")
    info = DataInfo("", "", 0, 0, [], [0, 0], 0, 0, 0.0, path="none", task="")
    chief = {"host": "w1", "peak_rss_mb": 1.0, "model_path": "/m"}
    metrics = report.build_metrics(TrainConfig(), info, [chief], tmp_path, 3.0, 5.0)
    assert metrics["epochs"] == EPOCHS and len(metrics["history"]["loss"]) == EPOCHS
    assert "reported_epoch" not in metrics["history"]  # bookkeeping, not a metric


def test_a_loop_counting_from_1_is_taken_as_it_is(tmp_path):
    _report(_reporter(tmp_path), range(1, EPOCHS + 1))
    rows = _rows(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert not any("reported_epoch" in r for r in rows)
    assert epoch_line(rows[-1], EPOCHS).startswith("[trainstack] epoch 6/6 ")


def test_reports_without_an_epoch_are_counted_from_1(tmp_path):
    reporter = _reporter(tmp_path)
    for _ in range(3):
        reporter.report({"loss": 0.5})
    assert [r["epoch"] for r in _rows(tmp_path)] == [1, 2, 3]


@pytest.mark.parametrize(
    ("first", "then", "shown"),
    [
        (range(0, 3), range(3, 6), [1, 2, 3, 4, 5, 6]),  # counts from 0: the resumed one too
        (range(1, 4), range(4, 7), [1, 2, 3, 4, 5, 6]),  # counts from 1
        (range(0), range(0, 3), [1, 2, 3]),  # the first attempt reported nothing
    ],
    ids=["from-0", "from-1", "nothing-before"],
)
def test_a_resumed_attempt_keeps_the_runs_numbering(tmp_path, first, then, shown):
    _report(_reporter(tmp_path, attempt=1), first)
    # The second attempt resumes from the job's checkpoint: its loop starts at a later epoch.
    _report(_reporter(tmp_path, attempt=2), then)
    rows = _rows(tmp_path)
    assert [r["epoch"] for r in rows] == shown
    assert [r["attempt"] for r in rows] == [1] * len(first) + [2] * len(then)


def test_the_offset_comes_from_the_runs_rows(tmp_path):
    assert epoch_offset(tmp_path / EPOCH_LOG) is None  # no report yet
    (tmp_path / EPOCH_LOG).write_text('{"epoch": 1}\nnot json\n')
    assert epoch_offset(tmp_path / EPOCH_LOG) == 0
    (tmp_path / EPOCH_LOG).write_text('{"epoch": 1, "reported_epoch": 0}\n')
    assert epoch_offset(tmp_path / EPOCH_LOG) == 1


def test_only_the_chief_writes_but_every_rank_checks_the_number(tmp_path):
    worker = _reporter(tmp_path, chief=False)
    _report(worker, range(EPOCHS))
    assert not (tmp_path / EPOCH_LOG).exists() and worker.epochs == EPOCHS
    with pytest.raises(ValueError, match=r"ctx.report\(epoch=-1.0\): the epoch must be a whole"):
        worker.report({"epoch": -1.0})


@pytest.mark.parametrize("bad", [-1.0, 1.5])
def test_a_bad_epoch_is_one_sentence(tmp_path, bad):
    with pytest.raises(ValueError) as raised:
        _reporter(tmp_path).report({"epoch": bad, "loss": 0.1})
    assert str(raised.value) == (
        f"ctx.report(epoch={bad!r}): the epoch must be a whole number >= 0, the epoch that just "
        "ended (counted from 0 as range(epochs) does, or from 1)"
    )
    assert not (tmp_path / EPOCH_LOG).exists()


def test_reported_epoch_is_bookkeeping_not_a_metric():
    assert not is_metric("reported_epoch", 0)
    assert metric_names([{"epoch": 1, "reported_epoch": 0, "loss": 0.3}]) == ["loss"]
