"""Several jobs at once on the shared stack (docs/jobs.md, "The queue"): jobs sized in workers
are admitted together when their ranks fit the training slots, run side by side in the warm
runner, and stay each their own: logs, status, result, cancel, failure. The stack's declared
job is in `trainstack list` with the same record.

By now the stack has three workers (test_60), a training slot each."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.jobs import JobWatch
from tests.support.stacks import wait_until

from .cli import EXAMPLES, job_nodes, record, status, trainstack, wait_state
from .conftest import MODELS, sh

pytestmark = pytest.mark.e2e

ENDED = ("succeeded", "failed", "cancelled")


def submit(platform, *args: str) -> str:
    submitted = trainstack(platform, "submit", *args)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def epochs_done(platform, job_id: str) -> int:
    code, out = sh(platform.container("control-3"), f"cat {MODELS}/{job_id}/epochs.jsonl")
    return len([line for line in out.splitlines() if line.startswith("{")]) if code == 0 else 0


def final(platform, job_id: str) -> dict:
    return dict(status(platform, job_id)["result"]["final"])


def test_two_one_worker_jobs_train_at_once_and_each_equals_its_run_alone(platform):
    """Admitted together (each holds one slot while both run), their epochs interleave, each
    has its own output and result; the same job run alone afterwards, at the same seed, ends
    with the same metrics."""
    digits = str(EXAMPLES / "digits")
    jobs = [submit(platform, digits, "--workers", "1", "--epochs", "4") for _ in range(2)]
    wait_until(
        "both jobs running at once, a slot each",
        lambda: all(
            (r := record(platform, j)).get("state") == "running" and r.get("slots") == 1
            for j in jobs
        ),
        300,
        up_to=2.0,
    )
    listed = trainstack(platform, "list")
    assert listed.returncode == 0 and "free slots: " in listed.stdout, listed.stdout
    for job_id in jobs:
        wait_state(platform, job_id, ENDED)
    records = [status(platform, j) for j in jobs]
    assert [r["state"] for r in records] == ["succeeded", "succeeded"], records
    first, second = records
    assert second["started_at"] < first["ended_at"] and first["started_at"] < second["ended_at"]
    for job_id in jobs:
        logs = trainstack(platform, "logs", job_id)
        assert logs.returncode == 0 and "[trainstack] epoch 4/4 " in logs.stdout, logs.stdout
        other = next(j for j in jobs if j != job_id)
        assert other not in logs.stdout, logs.stdout[-2000:]
        ranks = sh(platform.container("control-3"), f"ls {MODELS}/{job_id}")[1].split()
        assert [name for name in ranks if name.startswith("rank-") and name.endswith(".log")] == [
            "rank-0.log"
        ], ranks
    alone = submit(platform, digits, "--workers", "1", "--epochs", "4")
    assert wait_state(platform, alone, ENDED)["state"] == "succeeded"
    expected = final(platform, alone)
    for job_id in jobs:
        got = final(platform, job_id)
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, abs=1e-5), (job_id, name, got, expected)


def test_a_failed_a_stuck_and_a_cancelled_job_leave_the_one_beside_them_training(
    platform, tmp_path
):
    """One long one-worker job trains while another fails on its code, a third makes no
    progress and fails on its `progress_timeout` (its rank's watchdog ends that rank's process
    in the warm runner's daemon), and a fourth is cancelled mid-training: the long one is
    never retried nor stopped, and the cancelled one's processes (its ranks among them, by
    PID) are gone."""
    steady = submit(platform, str(EXAMPLES / "digits"), "--workers", "1", "--epochs", "400")
    wait_until("the steady job's first epoch", lambda: epochs_done(platform, steady) >= 1, 300)
    broken = tmp_path / "broken"
    shutil.copytree(EXAMPLES / "digits", broken)
    with (broken / "model.py").open("a") as model:
        model.write("\n\ndef build_model(ctx):\n    raise RuntimeError('no model today')\n")
    failed = submit(platform, str(broken), "--workers", "1")
    assert wait_state(platform, failed, ENDED)["state"] == "failed"
    assert "no model today" in status(platform, failed)["error"]
    stuck_dir = tmp_path / "stuck"
    stuck_dir.mkdir()
    (stuck_dir / "trainstack.toml").write_text(
        '[job]\nentry = "stuck"\ndata = "none"\nprogress_timeout = 5\n'
    )
    (stuck_dir / "stuck.py").write_text(
        "import time\n\n\ndef wait_forever():\n    while True:\n        time.sleep(0.2)\n"
        "\n\ndef train(ctx):\n    wait_forever()\n"
    )
    stuck = submit(platform, str(stuck_dir), "--workers", "1")
    assert wait_state(platform, stuck, ENDED)["state"] == "failed"
    error = status(platform, stuck)["error"]
    assert error.startswith("no progress for 5 s on rank 0"), error
    stacks = sh(platform.container("control-3"), f"cat {MODELS}/{stuck}/stacks-rank0.txt")[1]
    assert "in wait_forever" in stacks, stacks[:2000]
    # The next job's processes are the new ones: the steady job's run already.
    watch = JobWatch(sh, job_nodes(platform))
    cancelled = submit(platform, str(EXAMPLES / "digits"), "--workers", "1", "--epochs", "400")
    wait_until(
        "the cancelled job's first epoch", lambda: epochs_done(platform, cancelled) >= 1, 300
    )
    wait_until("its rank seen", lambda: bool(watch.sample()), 60, up_to=2.0)
    before = epochs_done(platform, steady)
    stop = trainstack(platform, "cancel", cancelled, timeout=60)
    assert stop.returncode == 0 and "cancelled" in stop.stdout, stop.stdout + stop.stderr
    left = watch.wait_gone(30)
    assert not left, "30 s after cancel, still running:\n" + "\n".join(map(str, left))
    wait_until(
        "the steady job's next epochs", lambda: epochs_done(platform, steady) > before + 1, 120
    )
    assert record(platform, steady)["state"] == "running"
    code, out = sh(platform.container("control-3"), f"cat {MODELS}/{steady}/epochs.jsonl")
    attempts = {json.loads(line)["attempt"] for line in out.splitlines() if line.startswith("{")}
    assert code == 0 and attempts == {1}, out[-2000:]  # never retried
    stop = trainstack(platform, "cancel", steady, timeout=60)
    assert stop.returncode == 0 and "cancelled" in stop.stdout, stop.stdout + stop.stderr


def test_a_job_larger_than_the_cluster_is_refused_with_both_numbers(platform):
    slots = int(platform.outputs()["jobDefaults"]["slots"])
    refused = trainstack(platform, "submit", str(EXAMPLES / "digits"), "--workers", str(slots + 1))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = refused.stderr.strip().splitlines()[-1]
    assert said == (
        f"trainstack: error: --workers {slots + 1}: this cluster has {slots} training slots "
        f"(one rank each); ask for at most {slots}"
    ), refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_stacks_declared_job_is_listed_with_the_same_record(platform):
    run_id = platform.outputs()["training"]["run_id"]
    listed = json.loads(trainstack(platform, "list", "--json").stdout)
    declared = next((r for r in listed if r["id"] == run_id), None)
    assert declared is not None, [r["id"] for r in listed]
    assert declared["origin"] == "stack" and declared["state"] == "succeeded", declared
    shown = status(platform, run_id)
    assert shown["framework"] and shown["workers"] and shown["result"]["final"], shown
