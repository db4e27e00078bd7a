"""Failure drills on the shared stack (tests/platform/conftest.py): each failure a user will
meet, done to the running platform, its outcome asserted and its recovery time written to
bench/results/drills.json.

They run after test_60_scaling, on 3 workers with 2 TensorFlow workers, so a node can be lost
and the job still has its two slots. A drill that strikes a run in the middle first holds the
run at its first epoch's end with the job's test-only hold file, strikes, then releases it: no
race with a workload that must be slow enough. The drills run in order and each leaves the
stack usable for the next:

  7  a second `pulumi up` while another runs is refused with Pulumi's lock message
  1  a TensorFlow worker's process is SIGKILLed mid-training (during that other `up`)
  2  the ALIVE Spark master's container is killed mid-training
  6  a corrupted data set (truncated Parquet, CSV rows with the wrong number of fields)
  5  every container of the stack restarted at once
  3  the submitting node (control-3, the job drivers' node) is down when training is due
  4  one SIGINT during training; two SIGINTs during training (the job goes on in its
     container; the next `up` resumes it). Drill 4a, two SIGINTs during provisioning, strikes
     the secret rotation's `up` (test_50_rotation): one rotation serves both, and drill 2
     then shows that a standby restarted by that interrupted rotation still takes over.
  (8, the MLflow server stopped mid-job, is in test_79_tracking.)
  9  a worker is lost (its container killed) while two one-worker jobs of `trainstack submit`
     train side by side: the job on it resumes from its backup on the free worker, the other
     trains on untouched
"""

from __future__ import annotations

import io
import json
import re
import signal
import socket
import tarfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.stacks import (
    TENSORFLOW_PIDS,
    BackgroundUp,
    Stack,
    wait_until,
)

from .cli import EXAMPLES, rank_hosts, record, trainstack, wait_state
from .conftest import CONFIG, DATA, MODELS, hold, record_drill, release

pytestmark = pytest.mark.drills

WORKERS = 3  # test_60_scaling added the third
MASTERS = ("control-1", "control-2")
CONTROLS = ("control-1", "control-2", "control-3")


# --------------------------------------------------------------------------------------------
# Helpers


def container(engine: Any, stack: Stack, node: str) -> Any:
    return engine.containers.get(f"{stack.label}-{node}")


def sh(engine: Any, stack: Stack, node: str, script: str, user: str = "") -> tuple[int, str]:
    code, out = container(engine, stack, node).exec_run(["sh", "-c", script], user=user)
    return code, out.decode(errors="replace")


def epoch_rows(engine: Any, stack: Stack, run_dir: str) -> list[dict[str, Any]]:
    # control-3 holds no master: no drill kills it while a run goes on.
    code, out = sh(engine, stack, "control-3", f"cat {run_dir}/epochs.jsonl 2>/dev/null")
    return [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")] if code == 0 else []


def ip_of(engine: Any, stack: Stack, node: str) -> str:
    c = container(engine, stack, node)
    c.reload()
    return c.attrs["NetworkSettings"]["Networks"][f"{stack.label}-net"]["IPAddress"]


def master_status(engine: Any, stack: Stack, node: str) -> dict[str, Any] | None:
    try:
        url = f"http://{ip_of(engine, stack, node)}:8080/json/"
        with urllib.request.urlopen(url, timeout=3) as resp:
            return json.loads(resp.read())
    except Exception:
        return None


def zookeeper_mode(engine: Any, stack: Stack, node: str) -> str:
    """`leader`, `follower`, or why not (ZooKeeper's `srvr` four-letter command)."""
    try:
        with socket.create_connection((ip_of(engine, stack, node), 2181), timeout=3) as conn:
            conn.sendall(b"srvr")
            conn.settimeout(3)
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
    except Exception as exc:
        return f"unreachable ({exc})"
    found = re.search(rb"Mode: (\w+)", data)
    return found[1].decode() if found else data.decode(errors="replace")[:80]


def cluster_state(engine: Any, stack: Stack) -> dict[str, Any]:
    masters = {m: master_status(engine, stack, m) for m in MASTERS}
    alive = [m for m, s in masters.items() if s and s["status"] == "ALIVE"]
    workers = 0
    if len(alive) == 1:
        status = masters[alive[0]]
        assert status is not None
        workers = sum(1 for w in status["workers"] if w["state"] == "ALIVE")
    return {
        "alive": alive,
        "standby": [m for m, s in masters.items() if s and s["status"] == "STANDBY"],
        "workers": workers,
        "zookeeper": {c: zookeeper_mode(engine, stack, c) for c in CONTROLS},
    }


def healthy(state: dict[str, Any]) -> bool:
    """ZooKeeper quorum (one leader, the rest followers), one ALIVE master, the others
    STANDBY, every worker ALIVE and registered."""
    modes = sorted(state["zookeeper"].values())
    return (
        modes == ["follower", "follower", "leader"]
        and len(state["alive"]) == 1
        and len(state["alive"]) + len(state["standby"]) == len(MASTERS)
        and state["workers"] == WORKERS
    )


def wait_healthy(engine: Any, stack: Stack, timeout: float) -> dict[str, Any]:
    return wait_until(
        "ZooKeeper quorum, one ALIVE master, every worker",
        lambda: (s := cluster_state(engine, stack)) and healthy(s) and s,
        timeout,
        every=1,
    )


def model_digests(engine: Any, stack: Stack) -> dict[str, str]:
    _, out = sh(engine, stack, "control-3", f"sha256sum {MODELS}/*/model.keras 2>/dev/null")
    return {p: d for d, p in (ln.split() for ln in out.splitlines() if ln.strip())}


def put_file(engine: Any, stack: Stack, node: str, path: str, data: bytes) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(Path(path).name)
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    assert container(engine, stack, node).put_archive(str(Path(path).parent), archive.getvalue())


def retrain(stack: Stack, token: str) -> None:
    stack.set_config(retrain=token)


def held_run(platform: Any, engine: Any, token: str) -> tuple[BackgroundUp, str]:
    """A retrain `up` in the background whose run is held after its first epoch (the hold file
    stays until the caller releases it): the `up` and the run's directory, once that epoch's
    row is written."""
    stack = platform.stack
    retrain(stack, token)
    hold(platform)
    try:
        up = BackgroundUp(stack)
        run_dir = up.run_dir(MODELS)
        wait_until("the first epoch", lambda: epoch_rows(engine, stack, run_dir), timeout=600)
    except BaseException:
        release(platform)
        raise
    return up, run_dir


# --------------------------------------------------------------------------------------------
# The stack


@pytest.fixture(scope="module")
def three_workers(platform):
    """test_60_scaling added the third worker; run alone (`make drills`), the drills add it."""
    stack = platform.stack
    if sum("spark_worker" in n["roles"] for n in stack.outputs()["nodes"]) < WORKERS:
        stack.set_config(workers=str(WORKERS))
        stack.up()


@pytest.fixture
def settled(platform, three_workers, engine):
    """The shared stack, healthy: what every drill starts from."""
    wait_healthy(engine, platform.stack, timeout=300)
    return platform.stack


@pytest.fixture(scope="module")
def held_up(platform, three_workers, engine):
    """A retrain `up` in the background whose run is held after its first epoch: drills 7 and 1
    strike it while it runs."""
    wait_healthy(engine, platform.stack, timeout=300)
    up, run_dir = held_run(platform, engine, "drill-1")
    try:
        yield up, run_dir
    finally:
        release(platform)
        up.finish()


def test_drill_7_second_up_is_refused_with_the_lock_message(platform, held_up, engine):
    stack, (first, _) = platform.stack, held_up  # it holds the lock; its run is held
    started = time.monotonic()
    second = stack.run("up", "--yes", "--skip-preview", check=False, timeout=600)
    refused_s = time.monotonic() - started
    text = second.stdout + second.stderr
    assert second.returncode != 0
    assert "the stack is currently locked" in text, text[-3000:]
    assert "pulumi cancel" in text  # Pulumi's own hint for a lock left by a killed process
    assert "Traceback" not in text
    assert first.proc.poll() is None, "the first `up` died: " + first.output[-3000:]
    record_drill(
        "7_concurrent_up",
        outcome="refused with Pulumi's lock message; the first `up` went on",
        refused_after_s=round(refused_s, 1),
        recovery_s=0.0,
        lost="nothing",
    )


def _tf_worker_pids(engine: Any, stack: Stack) -> list[tuple[str, int]]:
    """(node, pid) of every process that has TensorFlow loaded on the workers."""
    found = []
    for i in range(1, WORKERS + 1):
        node = f"worker-{i}"
        _, out = sh(
            engine,
            stack,
            node,
            TENSORFLOW_PIDS,
            user="trainstack",
        )
        found += [(node, int(pid)) for pid in out.split()]
    return found


def test_drill_1_killed_tensorflow_worker_resumes_from_its_backup(platform, held_up, engine):
    stack, (first, run_dir) = platform.stack, held_up
    rows = epoch_rows(engine, stack, run_dir)
    pids = wait_until("a TensorFlow worker process", lambda: _tf_worker_pids(engine, stack), 60)
    node, pid = pids[0]
    done_before = max(len(rows), len(epoch_rows(engine, stack, run_dir)))
    assert done_before == 1, rows  # held after its first epoch
    code, out = sh(engine, stack, node, f"kill -KILL {pid}", user="trainstack")
    killed = time.monotonic()
    assert code == 0, out
    release(platform)  # the retried attempt goes on to the end
    retried = wait_until(
        "an epoch finished by the retried attempt",
        lambda: [r for r in epoch_rows(engine, stack, run_dir) if r["attempt"] == 2],
        timeout=900,
    )
    recovery_s = time.monotonic() - killed
    code, out = first.finish()
    assert code == 0, out[-4000:]
    result = stack.outputs()["training"]
    assert result["ok"] and result["attempts"] == 2, result
    assert result["final_val_accuracy"] >= 0.90, result
    metrics = json.loads((Path(result["host_dir"]) / "metrics.json").read_text())
    resumed = metrics["epoch_attempt"].index(2) + 1
    # Resumed from the backup of the last finished epoch, not from the start.
    assert resumed == retried[0]["epoch"] and resumed > 1, metrics["epoch_attempt"]
    assert resumed >= done_before, (resumed, done_before)
    record_drill(
        "1_tensorflow_worker_killed",
        outcome="run finished from its backup",
        killed=f"{node} pid {pid}, after {done_before} finished epoch(s)",
        attempts=result["attempts"],
        resumed_epoch=resumed,
        final_val_accuracy=round(result["final_val_accuracy"], 4),
        recovery_s=round(recovery_s, 1),
        recovery_is="from the kill to the first epoch finished by the retried barrier stage",
        lost=f"the unfinished part of epoch {resumed} (redone); no finished epoch",
    )


def test_drill_2_alive_master_killed_mid_training_job_finishes(platform, settled, engine):
    stack = settled
    before = cluster_state(engine, stack)
    (old,) = before["alive"]
    up, _ = held_run(platform, engine, "drill-2")
    try:
        container(engine, stack, old).kill()
        killed = time.monotonic()
        new = wait_until(
            "the standby ALIVE with every worker",
            lambda: [
                m
                for m in MASTERS
                if m != old
                and (s := master_status(engine, stack, m))
                and s["status"] == "ALIVE"
                and sum(w["state"] == "ALIVE" for w in s["workers"]) == WORKERS
            ],
            timeout=300,
        )
        failover_s = time.monotonic() - killed
        release(platform)
        code, out = up.finish()
        job_after_kill_s = time.monotonic() - killed
    finally:
        release(platform)
        up.finish()
        container(engine, stack, old).start()  # killed by hand: the engine leaves it stopped
    assert code == 0, out[-4000:]
    result = stack.outputs()["training"]
    assert result["ok"] and result["final_val_accuracy"] >= 0.90, result
    assert result["attempts"] == 1, result  # the job went on, no stage was retried
    back = wait_healthy(engine, stack, timeout=300)
    record_drill(
        "2_alive_master_killed",
        outcome=f"job finished against the standby ({new[0]})",
        killed=f"{old} (container, ZooKeeper member included)",
        failover_s=round(failover_s, 1),
        recovery_s=round(failover_s, 1),
        recovery_is="from the kill to the standby ALIVE with every worker registered",
        job_end_after_kill_s=round(job_after_kill_s, 1),
        attempts=result["attempts"],
        final_val_accuracy=round(result["final_val_accuracy"], 4),
        after_restart=f"{old} back as STANDBY; ALIVE: {back['alive'][0]}",
        lost="nothing",
    )


CSV_HEADER = ",".join([*(f"f{i}" for i in range(4)), "label"])
CORRUPT = {
    "truncated-parquet": (f"{DATA}/drill-truncated.parquet", "is not a readable Parquet file"),
    "csv-wrong-fields": (f"{DATA}/drill-fields.csv", "line 4 has 4 fields, the header has 5"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_drill_6_corrupted_data_fails_naming_file_and_problem(settled, engine, case):
    stack = settled
    path, problem = CORRUPT[case]
    if case == "truncated-parquet":
        # A real Parquet file of the data set, cut in half (as a failed copy leaves it).
        run_dir = stack.outputs()["training"]["cluster_run_dir"]
        code, out = sh(
            engine,
            stack,
            "worker-1",
            f"f=$(ls {run_dir}/data/source/*.parquet | head -1) && "
            f'head -c $(($(stat -c %s "$f") / 2)) "$f" > {path} && chmod 644 {path}',
        )
        assert code == 0, out
    else:
        rows = ["0.1,0.2,0.3,0.4,1", "0.5,0.6,0.7,0.8,2", "0.9,0.1,0.2,3"]  # line 4: 4 fields
        put_file(engine, stack, "worker-1", path, "\n".join([CSV_HEADER, *rows, ""]).encode())
    models_before = model_digests(engine, stack)
    outputs_before = stack.outputs()["training"]
    assert models_before
    stack.set_config(trainData=path)
    try:
        started = time.monotonic()
        failed = stack.run("up", "--yes", "--skip-preview", check=False)
        failed_after_s = time.monotonic() - started
    finally:
        stack.run("config", "rm", "trainstack:trainData")
    text = failed.stdout + failed.stderr
    assert failed.returncode != 0
    errors = [ln for ln in text.splitlines() if "error" in ln.lower()]
    assert path in text and problem in text, "\n".join(errors[-10:]) or text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert model_digests(engine, stack) == models_before
    assert stack.outputs()["training"] == outputs_before
    stack.run("preview", "--expect-no-changes")
    message = next(ln for ln in text.splitlines() if problem in ln)
    record_drill(
        f"6_corrupted_data_{case}",
        outcome="job failed before training, naming the file and the problem",
        error=message.strip()[-400:],
        failed_after_s=round(failed_after_s, 1),
        recovery_s=0.0,
        recovery_is="nothing to recover: the earlier models and outputs are untouched",
        models_checked=len(models_before),
        lost="nothing",
    )


def test_drill_5_every_container_restarted_at_once(settled, engine):
    stack = settled
    containers = engine.containers.list(filters={"label": stack.selector})
    assert len(containers) == len(CONTROLS) + WORKERS
    started = time.monotonic()
    with ThreadPoolExecutor(len(containers)) as pool:
        list(pool.map(lambda c: c.restart(timeout=10), containers))
    restarted_s = time.monotonic() - started
    state = wait_healthy(engine, stack, timeout=600)
    recovery_s = time.monotonic() - started
    preview = stack.run("preview", "--expect-no-changes", check=False)
    assert preview.returncode == 0, preview.stdout[-3000:]
    record_drill(
        "5_all_containers_restarted",
        outcome="quorum, one ALIVE master, every worker registered; next `up` a no-op",
        restart_calls_s=round(restarted_s, 1),
        recovery_s=round(recovery_s, 1),
        recovery_is="from `docker restart` of all containers at once to a healthy cluster",
        alive_master=state["alive"][0],
        zookeeper=state["zookeeper"],
        lost="nothing (volumes keep data, models, ZooKeeper and recovery state)",
    )


def test_drill_3_submitting_node_down_a_worker_submits(settled, engine):
    """The job drivers' node (control-3, the first of the stack's `jobNodes`) is stopped when
    training is due: `up` submits from the first worker instead, and the run finishes."""
    stack = settled
    down = container(engine, stack, "control-3")
    down.stop(timeout=10)
    try:
        retrain(stack, "drill-3")
        started = time.monotonic()
        up = stack.run("up", "--yes", "--skip-preview", check=False)
        up_s = time.monotonic() - started
    finally:
        down.start()
    assert up.returncode == 0, up.stdout[-4000:]
    assert f"skipped {stack.label}-control-3: exited" in up.stdout, up.stdout[-3000:]
    result = stack.outputs()["training"]
    assert result["submitted_on"] == f"{stack.label}-worker-1", result
    assert result["ok"] and result["final_val_accuracy"] >= 0.90, result
    wait_healthy(engine, stack, timeout=300)
    record_drill(
        "3_submitting_node_down",
        outcome="submitted from worker-1; the run finished (ZooKeeper kept its quorum of 2)",
        down="control-3, the job drivers' node (container stopped)",
        up_s=round(up_s, 1),
        recovery_s=0.0,
        recovery_is="no wait: `up` picks the first healthy node of jobNodes itself",
        final_val_accuracy=round(result["final_val_accuracy"], 4),
        lost="nothing",
    )


def test_drill_4_sigint_during_training_next_up_converges(platform, settled, engine):
    """Ctrl-C (one SIGINT) while the job runs: Pulumi cancels after the running step, so the
    job is not cut off; it finishes, its result is recorded in the state, and the next `up`
    launches nothing and only writes the outputs back."""
    stack = settled
    up, run_dir = held_run(platform, engine, "drill-4")
    try:
        up.proc.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        up.wait_for(r"\^C received; cancelling", timeout=60)
    finally:
        release(platform)
    code, out = up.finish(timeout=1200)
    assert code != 0
    assert "^C received; cancelling" in out and "update canceled" in out, out[-3000:]
    assert "validation accuracy" in out, out[-3000:]  # the running job was not cut off
    again = stack.up()
    recovery_s = time.monotonic() - interrupted
    assert "launching on" not in again.stdout, again.stdout[-3000:]
    assert "pending operations" not in again.stdout + again.stderr
    result = stack.outputs()["training"]
    assert result["cluster_run_dir"] == run_dir and result["ok"], result
    assert result["attempts"] == 1 and result["final_val_accuracy"] >= 0.90, result
    stack.run("preview", "--expect-no-changes")
    record_drill(
        "4b_sigint_during_training",
        outcome="the running job finished, Pulumi then cancelled; the next `up` converged "
        "without launching anything (no pending operation, no hand edit)",
        recovery_s=round(recovery_s, 1),
        recovery_is="from the SIGINT to the end of the next `up` (the job's rest included)",
        lost="nothing",
    )


def test_drill_4_two_sigints_during_training_next_up_resumes_the_run(platform, settled, engine):
    """Ctrl-C twice while the job runs: Pulumi stops at once and its provider with it, but
    the job started with `docker exec` goes on in the container. The next `up` stops that
    launch and launches the same run again, which resumes from the backup of the last
    finished epoch instead of starting over."""
    stack = settled
    try:
        up, run_dir = held_run(platform, engine, "drill-4c")
        interrupted = time.monotonic()
        code, out = up.stop_at_once()
        assert code != 0, out[-3000:]
        done_before = len(epoch_rows(engine, stack, run_dir))
        # The next `up` finds the earlier launch still running (held), stops it and launches
        # the same run again; released from here on.
        again = BackgroundUp(stack)
        again.wait_for(r"an earlier launch of this run still runs on", timeout=600)
    finally:
        release(platform)
    code, text = again.finish()
    recovery_s = time.monotonic() - interrupted
    assert code == 0, text[-4000:]
    assert "Traceback" not in text
    assert f"--output {run_dir}" in text, text[-3000:]  # the same run, launched again
    result = stack.outputs()["training"]
    assert result["ok"] and result["cluster_run_dir"] == run_dir, result
    assert result["final_val_accuracy"] >= 0.90, result
    epochs = [r["epoch"] for r in epoch_rows(engine, stack, run_dir)]
    # Resumed, not started over: the first epoch was trained once, every epoch is there.
    assert epochs.count(1) == 1, epochs
    assert set(epochs) == set(range(1, int(CONFIG["trainEpochs"]) + 1)), epochs
    stack.run("preview", "--expect-no-changes")
    record_drill(
        "4c_two_sigints_during_training",
        outcome="Pulumi stopped at once, the job went on in the container; the next `up` "
        "stopped it and launched the same run, which resumed from its backup",
        epochs_done_before=done_before,
        epoch_rows=epochs,
        final_val_accuracy=round(result["final_val_accuracy"], 4),
        recovery_s=round(recovery_s, 1),
        recovery_is="from the second SIGINT to the end of the next `up` (the rest of the run)",
        lost="the unfinished epoch at the stop (redone)",
    )


def test_drill_9_lost_worker_with_two_jobs_resumes_its_job_leaves_the_other(
    platform, settled, engine
):
    """Two one-worker jobs train side by side (`trainstack submit --workers 1`); the container
    of the worker under one of them is killed (the drivers of both run on the drivers' node,
    control-3, which a worker's loss leaves alone). That job's barrier stage is retried on the
    third worker's free slot and resumes from the backup of its last finished epoch; the other
    job is never retried and keeps training. The killed worker, started again, registers again."""
    stack = settled
    digits = str(EXAMPLES / "digits")
    jobs = []
    for _ in range(2):
        submitted = trainstack(platform, "submit", digits, "--workers", "1", "--epochs", "400")
        assert submitted.returncode == 0, submitted.stderr
        jobs.append(submitted.stdout.strip())
    run_dirs = {j: f"{MODELS}/{j}" for j in jobs}
    try:
        wait_until(
            "two finished epochs of each job, and each rank's host",
            lambda: all(
                len(epoch_rows(engine, stack, run_dirs[j])) >= 2 and rank_hosts(platform, j)
                for j in jobs
            ),
            300,
            every=2,
        )
        # The submitting node (its container's name in the record) runs both jobs' drivers:
        # the drivers' node, not a worker.
        submitting = {record(platform, j)["node"].removeprefix(f"{stack.label}-") for j in jobs}
        assert submitting == {"control-3"}, submitting
        # A rank's log names its host by address: the worker's container on the stack's network.
        nodes = {ip_of(engine, stack, f"worker-{i}"): f"worker-{i}" for i in range(1, WORKERS + 1)}
        hosts = {j: nodes[rank_hosts(platform, j)[0]] for j in jobs}
        assert len(set(hosts.values())) == 2, hosts  # a slot each, on two workers
        struck = jobs[0]
        other = next(j for j in jobs if j != struck)
        node = hosts[struck]
        done_before = len(epoch_rows(engine, stack, run_dirs[struck]))
        other_before = len(epoch_rows(engine, stack, run_dirs[other]))
        container(engine, stack, node).kill()
        killed = time.monotonic()
        try:
            retried = wait_until(
                f"an epoch of {struck} finished by its retried attempt",
                lambda: [
                    r for r in epoch_rows(engine, stack, run_dirs[struck]) if r["attempt"] > 1
                ],
                timeout=600,
                every=2,
            )
            recovery_s = time.monotonic() - killed
        finally:
            container(engine, stack, node).start()  # killed by hand: the engine leaves it stopped
        rows = epoch_rows(engine, stack, run_dirs[struck])
        first_retried = retried[0]["epoch"]
        # Resumed from the backup of its last finished epoch, not from the start.
        assert first_retried > 1 and first_retried >= done_before - 1, (done_before, rows)
        assert record(platform, struck)["state"] == "running"
        new_host = nodes.get(rank_hosts(platform, struck)[0], rank_hosts(platform, struck)[0])
        # The other job: never retried, and it trained on through the loss.
        other_rows = epoch_rows(engine, stack, run_dirs[other])
        assert {r["attempt"] for r in other_rows} == {1}, other_rows
        assert len(other_rows) > other_before, (other_before, other_rows)
        assert record(platform, other)["state"] == "running"
        back = wait_healthy(engine, stack, timeout=300)
    finally:
        for job_id in jobs:
            trainstack(platform, "cancel", job_id, timeout=60)
    for job_id in jobs:
        assert wait_state(platform, job_id, ("cancelled",), timeout=120)["state"] == "cancelled"
    record_drill(
        "9_lost_worker_two_jobs",
        outcome=f"{struck} resumed from its backup on {new_host}; {other} trained on, "
        "never retried",
        killed=f"{node} (container), under {struck} after {done_before} finished epoch(s)",
        resumed_epoch=first_retried,
        recovery_s=round(recovery_s, 1),
        recovery_is="from the kill to the first epoch finished by the retried barrier stage",
        after_restart=f"{node} registered again; workers ALIVE: {back['workers']}",
        lost=f"the unfinished part of epoch {first_retried} of {struck} (redone); nothing of "
        f"{other}",
    )
