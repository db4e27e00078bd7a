"""End-to-end runs of `trainstack-train` in local[2]: accuracy, 1 vs 2 workers, kill/resume."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from trainstack_training import spark
from trainstack_training.config import TrainConfig
from trainstack_training.memwatch import killed_for_memory, read_records
from trainstack_training.report import SPLIT_PARTS, time_split
from trainstack_training.rundir import WAITING_FILE
from trainstack_training.spark import wait_for_slots
from trainstack_training.sparkmaster import Application, MasterView

from .conftest import EXAMPLES, IN_WARM_RUNNER, in_warm_runner, run_cli

pytestmark = pytest.mark.training

EPOCHS = 8  # enough for >= 0.90 on the digits with both 1 and 2 workers, a few seconds each


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("two")
    rc, summary, err = run_cli(
        ["--master", "local[2]", "--workers", "2", "--epochs", str(EPOCHS), "--output", str(out)]
    )
    assert rc == 0, err[-3000:]
    return summary


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("one")
    rc, summary, err = run_cli(
        ["--master", "local[2]", "--workers", "1", "--epochs", str(EPOCHS), "--output", str(out)]
    )
    assert rc == 0, err[-3000:]
    return summary


def test_two_workers_reach_090_and_write_results(two_workers: dict[str, Any]) -> None:
    s = two_workers
    assert s["ok"] and s["workers"] == 2 and s["epochs"] == EPOCHS and s["attempts"] == 1
    assert s["final_val_accuracy"] >= 0.90, s
    assert Path(s["model_path"]).is_file() and s["model_path"].endswith(".keras")
    assert Path(s["plot_path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads(Path(s["metrics_path"]).read_text())
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert len(metrics[key]) == EPOCHS
    assert metrics["samples_per_second"] > 0 and metrics["data_seconds"] > 0
    assert len(metrics["peak_rss_mb_per_worker"]) == 2
    # Each rank's memory watcher recorded its end (memwatch.py), and left no process.
    records = read_records(Path(s["metrics_path"]).parent)
    assert sorted((r["rank"], r["ended"]) for r in records) == [(0, "exited"), (1, "exited")]
    assert all(r["peak_mb"] > 100 and r["limit_mb"] > 100 for r in records), records
    # where the time went: job phases and, per worker, start-up, steps, validation
    assert {"spark_context", "data_arrow_read", "spark_executors"} <= set(metrics["job_phases"])
    assert "spark_sql_session" not in metrics["job_phases"]  # the digits never start Spark SQL
    for t in metrics["worker_timings"]:
        assert t["import_tf"] > 0 and t["train_steps"] > 0 and t["fit"] >= t["train_steps"]
    # the job's wall time, split into parts that add up to it; the summary carries it
    split = metrics["time_split"]
    assert list(split) == list(SPLIT_PARTS) and min(split.values()) >= 0, split
    assert sum(split.values()) == pytest.approx(metrics["total_seconds"], abs=0.01), split
    assert split["training"] == pytest.approx(
        max(t["fit"] for t in metrics["worker_timings"]), rel=0.5
    )
    assert split["tensorflow_startup"] >= min(t["import_tf"] for t in metrics["worker_timings"])
    assert s["time_split"] == split and s["training_share"] == metrics["training_share"]
    assert metrics["training_share"] == round(split["training"] / metrics["total_seconds"], 3)
    # only the chief's model is kept; the other worker's temporary copy is gone
    assert [p.name for p in Path(s["model_path"]).parent.glob("*.keras")] == ["model.keras"]


def test_saved_model_loads_and_predicts(two_workers: dict[str, Any]) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import os; os.environ['TF_USE_LEGACY_KERAS']='1'; import tensorflow as tf, numpy;"
        f"m=tf.keras.models.load_model({two_workers['model_path']!r});"
        "print(m.predict(numpy.zeros((2,64),'float32'),verbose=0).shape)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert out.stdout.strip().endswith("(2, 10)"), out.stderr[-2000:]


def test_one_worker_baseline_is_comparable(
    one_worker: dict[str, Any], two_workers: dict[str, Any]
) -> None:
    assert one_worker["workers"] == 1 and one_worker["final_val_accuracy"] >= 0.90, one_worker
    diff = abs(one_worker["final_val_accuracy"] - two_workers["final_val_accuracy"])
    assert diff <= 0.05, (one_worker, two_workers)


@pytest.mark.parametrize(
    ("victim", "epoch", "expected", "job", "stream"),
    [
        (1, 2, [1, 2, 2, 2], "digits", "off"),
        (0, 3, [1, 1, 2, 2], "digits", "on"),
        (1, 2, [1, 2, 2, 2], "digits-cnn", "auto"),
    ],
    ids=["worker-killed", "chief-killed-streamed", "full-mode-worker-killed"],
)
@pytest.mark.usefixtures("warm_runner")
def test_killed_worker_resumes_from_backup(
    tmp_path: Path, victim: int, epoch: int, expected: list[int], job: str, stream: str
) -> None:
    # A worker SIGKILLs its own Python process halfway through an epoch (a real crash, no
    # cleanup); Spark retries the barrier stage and both workers resume from the last backup.
    # A full-mode job resumes too when it passes ctx.callbacks() to its fit. In one warm
    # runner, as on the stack: the rank killed is a worker forked from its executor's daemon.
    # The chief's case streams its data (docs/training.md, Streaming): the resumed attempt
    # reads its shard again from the row groups.
    rc, s, err = run_cli(
        ["--job-dir", str(EXAMPLES / job), "--master", "local[2]", "--workers", "2",
         "--epochs", "4", "--output", str(tmp_path), *IN_WARM_RUNNER, "--data-stream", stream,
         "--fault-kill-epoch", str(epoch), "--fault-kill-worker", str(victim)]
    )  # fmt: skip
    assert rc == 0, err[-3000:]
    inputs = {w["input"] for w in json.loads(Path(s["metrics_path"]).read_text())["worker_input"]}
    assert inputs == {"stream" if stream == "on" else "memory"}, inputs
    assert (tmp_path / ".fault-injected").exists(), "the fault was never injected"
    assert s["attempts"] == 2 and s["epochs"] == 4, s
    assert in_warm_runner(err), err[-3000:]
    metrics = json.loads(Path(s["metrics_path"]).read_text())
    # the epochs before the crash come from attempt 1, the crashed one and later from the retry
    assert metrics["epoch_attempt"] == expected
    assert s["final_val_accuracy"] >= 0.80
    assert Path(s["model_path"]).is_file()
    assert not (tmp_path / "backup").exists()  # checkpoints are removed after success


def test_single_strategy_trains_one_process_on_all_cores(tmp_path: Path) -> None:
    rc, s, err = run_cli(
        ["--master", "local[2]", "--train-strategy", "single", "--cores-per-worker", "2",
         "--epochs", str(EPOCHS), "--output", str(tmp_path), "--no-plot"]
    )  # fmt: skip
    assert rc == 0, err[-3000:]
    assert s["workers"] == 1 and s["final_val_accuracy"] >= 0.90, s
    metrics = json.loads(Path(s["metrics_path"]).read_text())
    assert metrics["config"]["train_strategy"] == "single"
    (timings,) = metrics["worker_timings"]  # one TensorFlow process
    assert timings["train_steps"] > 0 and timings["import_tf"] > 0


def test_cli_error_is_clear_and_last_line_json(tmp_path: Path) -> None:
    rc, s, _ = run_cli(["--data", str(tmp_path / "missing.csv"), "--output", str(tmp_path)])
    assert rc == 2 and s["ok"] is False and s["kind"] == "DataError"
    assert "does not exist" in s["error"] and "missing.csv" in s["error"]


def test_missing_slots_fail_fast_on_the_small_input_path(tmp_path: Path) -> None:
    # The digits take the driver path, which has no separate slot-check job: the training
    # stage's own barrier check must fail with the same clear ClusterError, exit code 2.
    rc, s, _ = run_cli(
        ["--master", "local[2]", "--workers", "3", "--slot-wait-seconds", "3",
         "--output", str(tmp_path), "--no-plot"]
    )  # fmt: skip
    assert rc == 2 and s["ok"] is False and s["kind"] == "ClusterError", s
    assert "fewer free task slots than workers=3" in s["error"]


def test_retries_exhausted_is_a_clear_failure(tmp_path: Path) -> None:
    # One attempt allowed and a worker killed: the job fails, says why, keeps the checkpoint.
    rc, s, _ = run_cli(
        ["--master", "local[2]", "--workers", "2", "--epochs", "3", "--output", str(tmp_path),
         "--fault-kill-epoch", "2", "--max-attempts", "1", "--no-plot"]
    )  # fmt: skip
    assert rc == 1 and s["ok"] is False and s["kind"] == "TrainingError", s
    assert "after 1 barrier-stage attempt(s) (max_attempts=1)" in s["error"]
    assert any(p.is_file() for p in (tmp_path / "backup").rglob("*"))
    # The killed rank's watcher recorded its end: killed, but not for memory.
    records = {r["rank"]: r for r in read_records(tmp_path)}
    assert records[1]["ended"] == "killed" and records[1]["peak_mb"] > 100, records
    assert not any(map(killed_for_memory, records.values())), records
    # Rerunning the same command (a restarted job) resumes from that checkpoint.
    rc, s, err = run_cli(
        ["--master", "local[2]", "--workers", "2", "--epochs", "3", "--output", str(tmp_path),
         "--no-plot"]
    )  # fmt: skip
    assert rc == 0 and s["epochs"] == 3, err[-3000:]
    assert sorted((r["rank"], r["attempt"], r["ended"]) for r in read_records(tmp_path)) == [
        (0, 1, "exited"),
        (1, 1, "exited"),
    ]  # the failed launch's records went with its attempts
    started = [e["epoch"] for e in _epoch_rows(tmp_path)]
    assert started == [1, 2, 3]  # epoch 1 from the failed job, 2-3 from the rerun


def _epoch_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (out / "epochs.jsonl").read_text().splitlines() if ln]


class _Cluster:
    """What wait_for_slots reads of a SparkContext (`sc._jsc.sc()`): the slot count per poll."""

    applicationId = "app-20261204000000-0001"  # noqa: N815 (PySpark's name)

    def __init__(self, slots: list[int], registered_wait_ms: int = 1000) -> None:
        self.slots, self.polls, self.wait_ms = slots, 0, registered_wait_ms
        self.started_ms = int(time.time() * 1000)
        self._jsc = SimpleNamespace(sc=lambda: self)

    def resourceProfileManager(self) -> _Cluster:  # noqa: N802 (Spark's names)
        return self

    def defaultResourceProfile(self) -> str:  # noqa: N802
        return "default"

    def startTime(self) -> int:  # noqa: N802
        return self.started_ms

    def conf(self) -> _Cluster:
        return self

    def getTimeAsMs(self, key: str, default: str) -> int:  # noqa: N802
        assert key == "spark.scheduler.maxRegisteredResourcesWaitingTime"
        return self.wait_ms

    def maxNumConcurrentTasks(self, profile: str) -> int:  # noqa: N802
        self.polls += 1
        return self.slots[min(self.polls, len(self.slots)) - 1]


_CLUSTER_CFG = {"master": "spark://m1:7077", "workers": 2}


@pytest.fixture(autouse=True)
def _no_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """No master's JSON page answers (as during a takeover): no other application is seen."""
    monkeypatch.setattr(spark, "alive_master", lambda *args, **kwargs: None)


def _view(holder_cores: int) -> MasterView:
    other = Application("app-other", "their-etl", holder_cores, "RUNNING", 1024)
    own = Application(_Cluster.applicationId, "trainstack-runner", 0, "WAITING", 1024)
    return MasterView("http://m1:8080/json/", (own, other), 0 if holder_cores else 2, (4096,))


def test_a_job_is_queued_without_a_limit_while_another_application_holds_the_cores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(spark, "FIRST_EXECUTOR_WAIT_SECONDS", 1.0)
    monkeypatch.setattr(spark.CoreQueue, "CHECK_SECONDS", 0.0)
    views = [_view(2)] * 15 + [_view(0)]  # the other application ends after 15 checks
    seen: list[bool] = []

    def master(*args: object, **kwargs: object) -> MasterView:
        seen.append((tmp_path / WAITING_FILE).exists())
        return views[min(len(seen), len(views)) - 1]

    monkeypatch.setattr(spark, "alive_master", master)
    cluster = _Cluster([0] * 17 + [2])
    cfg = TrainConfig(**_CLUSTER_CFG, output=str(tmp_path))
    queued = wait_for_slots(cluster, cfg)  # type: ignore[arg-type]
    assert 2.5 < queued < 6, queued  # 15 polls of 0.2 s, and the checks
    # Past FIRST_EXECUTOR_WAIT_SECONDS (15 polls of 0.2 s), and waiting.json while queued.
    assert cluster.polls == 18 and seen[1:15] == [True] * 14, (cluster.polls, seen)
    assert not (tmp_path / WAITING_FILE).exists()
    err = capsys.readouterr().err
    assert err.count("[trainstack] queued: waiting for cores held by application app-other "
                     "(their-etl)") == 1, err  # fmt: skip
    assert "the cores are free" in err


def test_waits_for_the_executors_slots_before_training() -> None:
    cluster = _Cluster([0, 0, 1, 2, 2])
    wait_for_slots(cluster, TrainConfig(**_CLUSTER_CFG))  # type: ignore[arg-type]
    assert cluster.polls == 4  # returned at the first poll with one slot per worker


def test_too_few_slots_are_left_to_the_barrier_check_after_sparks_wait() -> None:
    cluster = _Cluster([1], registered_wait_ms=1000)
    start = time.perf_counter()
    wait_for_slots(cluster, TrainConfig(**_CLUSTER_CFG))  # type: ignore[arg-type]
    assert 0.8 < time.perf_counter() - start < 5


def test_executors_the_master_has_granted_are_waited_for_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One executor has registered; the master has granted the cores of both (the second's
    JVM is still starting on a loaded machine): waited for as the first one is, not for
    Spark's 30 s (a CI run's ssh stack failed its first job that way)."""
    monkeypatch.setattr(spark, "FIRST_EXECUTOR_WAIT_SECONDS", 2.5)
    monkeypatch.setattr(spark.CoreQueue, "CHECK_SECONDS", 0.0)
    own = Application(_Cluster.applicationId, "trainstack-runner", 2, "RUNNING", 1024)
    view = MasterView("http://m1:8080/json/", (own,), 0, (4096, 4096), total_cores=2)
    monkeypatch.setattr(spark, "alive_master", lambda *args, **kwargs: view)
    cluster = _Cluster([1] * 8 + [2], registered_wait_ms=300)
    start = time.perf_counter()
    wait_for_slots(cluster, TrainConfig(**_CLUSTER_CFG))  # type: ignore[arg-type]
    assert cluster.polls == 9, cluster.polls  # waited until the second executor's slot
    assert time.perf_counter() - start < 5


def test_a_worker_still_registering_with_the_master_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The master knows one worker of the two the job needs (the other registers late: a
    master that started after it, as on the ssh target's first `up`): waited for as the first
    executor is, not for Spark's 30 s; with both workers known and the cores not granted, the
    job is left to the barrier check after Spark's wait, as before."""
    monkeypatch.setattr(spark, "FIRST_EXECUTOR_WAIT_SECONDS", 2.5)
    monkeypatch.setattr(spark.CoreQueue, "CHECK_SECONDS", 0.0)
    own = Application(_Cluster.applicationId, "trainstack-runner", 1, "RUNNING", 1024)
    one_worker = MasterView("http://m1:8080/json/", (own,), 0, (4096,), total_cores=1)
    monkeypatch.setattr(spark, "alive_master", lambda *args, **kwargs: one_worker)
    cluster = _Cluster([1] * 8 + [2], registered_wait_ms=300)
    wait_for_slots(cluster, TrainConfig(**_CLUSTER_CFG))  # type: ignore[arg-type]
    assert cluster.polls == 9, cluster.polls
    both = MasterView("http://m1:8080/json/", (own,), 1, (4096, 4096), total_cores=2)
    monkeypatch.setattr(spark, "alive_master", lambda *args, **kwargs: both)
    cluster = _Cluster([1] * 8 + [2], registered_wait_ms=300)
    wait_for_slots(cluster, TrainConfig(**_CLUSTER_CFG))  # type: ignore[arg-type]
    assert cluster.polls < 9, cluster.polls


def test_no_executor_yet_is_waited_for_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark, "FIRST_EXECUTOR_WAIT_SECONDS", 2.5)
    cluster = _Cluster([0], registered_wait_ms=500)
    start = time.perf_counter()
    wait_for_slots(cluster, TrainConfig(**_CLUSTER_CFG))  # type: ignore[arg-type]
    assert 2.3 < time.perf_counter() - start < 7  # not the 0.5 s of Spark's wait


def test_time_split_follows_the_last_worker_and_adds_up() -> None:
    fast = {
        "task_launch": 1.0,
        "import_tf": 2.0,
        "fit": 3.0,
        "save_model": 0.1,
        "worker_total": 5.5,
    }
    slow = {
        **{"task_launch": 2.0, "import_tf": 3.0, "strategy_setup": 0.5},
        **{"load_shards": 0.2, "build_model": 0.3, "fit": 4.0, "save_model": 1.0},
        "worker_total": 9.0,
    }
    split = time_split(30.0, 12.0, 2.0, 16.0, [fast, slow])
    assert split == {
        "spark_startup": 12.0,  # 10 s before the stage (12 less 2 of data) + 2 s of task launch
        "data": 2.0,
        "tensorflow_startup": 4.0,
        "training": 4.0,
        "input_wait": 0.0,  # no reads waited for (in memory)
        "finish": 3.0,  # 1 s of model save + 2 s after the stage
        "other": 5.0,  # the rest of the stage
    }


def test_time_split_never_exceeds_the_stage() -> None:
    # A worker clock ahead of the driver's: the timings add up to more than the stage.
    timings = [{"task_launch": 5.0, "import_tf": 8.0, "fit": 10.0, "worker_total": 20.0}]
    split = time_split(25.0, 5.0, 1.0, 15.0, timings)
    assert split["training"] == 2.0 and split["other"] == 0.0
    assert sum(split.values()) == pytest.approx(25.0)
    assert time_split(10.0, 4.0, 9.0, 5.0, [])["data"] == 4.0  # data cut to the time before


def test_hold_file_freezes_the_run_at_an_epoch_end_until_removed(tmp_path: Path) -> None:
    # The failure drills' hook (docs/training.md, test-only hooks): while the file exists,
    # every worker waits after the epoch's backup and epochs.jsonl row; never after the last.
    import os
    import subprocess
    import sys
    import threading

    out, hold = tmp_path / "run", tmp_path / ".test-hold"
    hold.touch()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainstack_training", "--job-dir", str(EXAMPLES / "digits"),
         "--master", "local[2]", "--workers", "2",
         "--epochs", "2", "--output", str(out), "--hold-file", str(hold), "--no-plot"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    lines: list[str] = []  # both streams (with a local master the workers' print is on stderr)

    def pump(stream: Any) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    streams = (proc.stdout, proc.stderr)
    pumps = [threading.Thread(target=pump, args=(s,), daemon=True) for s in streams]
    for t in pumps:
        t.start()

    def said(text: str) -> list[str]:
        return [ln for ln in lines if text in ln]

    def times(text: str) -> int:
        # Counted in the text, not by line: the two workers share the stream, and two
        # prints at once can land on one line.
        return sum(ln.count(text) for ln in lines)

    def wait_for(what: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while times(what) < count:
            if proc.poll() is not None:  # ended: read what it wrote last, then judge
                for t in pumps:
                    t.join(timeout=10)
                assert times(what) >= count, f"the job ended before {what!r}:\n" + "\n".join(
                    lines[-40:]
                )
                return
            assert time.monotonic() < deadline, f"no {what!r}:\n" + "\n".join(lines[-40:])
            time.sleep(0.2)

    try:
        wait_for(f"holding after epoch 1 while {hold} exists", 2, timeout=240)  # both workers
        who = {w for ln in said("holding after") for w in re.findall(r"worker \d, attempt \d", ln)}
        assert who == {"worker 0, attempt 1", "worker 1, attempt 1"}, who
        assert [r["epoch"] for r in _epoch_rows(out)] == [1]  # row written, then held
        time.sleep(1.5)
        assert proc.poll() is None and [r["epoch"] for r in _epoch_rows(out)] == [1]
        hold.unlink()
        wait_for("hold released after epoch 1", 2, timeout=30)
        hold.touch()  # again: it must not hold after the last epoch
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for t in pumps:
        t.join(timeout=10)
    assert rc == 0, "\n".join(lines[-40:])
    s = json.loads(next(ln for ln in reversed(lines) if ln.startswith("{")))
    assert s["ok"] and s["epochs"] == 2 and s["attempts"] == 1, s
    assert [r["epoch"] for r in _epoch_rows(out)] == [1, 2]
    assert not said("holding after epoch 2") and not said(f"WARNING: {hold}")
