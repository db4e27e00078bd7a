"""The node-side runner of submitted jobs (trainstack_training.queue) with real processes:
records and states, the FIFO queue on one lock, a line per epoch, cancel while queued and
while running. No Spark: the job is a small Python command."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra.jobs.cli import _data, _params, build_parser
from infra.jobs.commands import CliError
from tests.support.processes import Proc, Recorder, wait_gone

pytestmark = pytest.mark.unit

JOB = (
    "import json, sys, time, pathlib\n"
    "out = pathlib.Path(sys.argv[1])\n"
    "for e in range(1, int(sys.argv[2]) + 1):\n"
    "    time.sleep(float(sys.argv[3]))\n"
    "    with (out / 'epochs.jsonl').open('a') as f:\n"
    "        f.write(json.dumps({'epoch': e, 'loss': 1.0 / e, 'train_seconds': 0.1}) + '\\n')\n"
    "print(json.dumps({'ok': True, 'epochs': int(sys.argv[2])}))\n"
)


def start(
    root: Path,
    name: str,
    epochs: int,
    pause: float,
    install: str = "",
    workers: int = 1,
    slots: int = 0,
) -> tuple[subprocess.Popen, Path]:
    """The runner of one job; `install`: the text of its packages' install script; `workers`:
    its ranks; `slots`: the cluster's (0: not given, one job at a time)."""
    run_dir = root / name
    run_dir.mkdir()
    state = "installing" if install else "queued"
    (run_dir / "job.json").write_text(
        json.dumps({"id": name, "state": state, "submitted_at": time.time(), "workers": workers})
    )
    extra = ["--slots", str(slots)] if slots else []
    if install:
        (run_dir / "install.sh").write_text(install)
        extra += ["--install", str(run_dir / "install.sh")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainstack_training.queue", str(run_dir), "--lock",
         str(root / ".lock"), "--epochs", str(epochs), *extra, "--",
         sys.executable, "-c", JOB, str(run_dir), str(epochs), str(pause)],
    )  # fmt: skip
    return proc, run_dir


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "job.json").read_text())


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def wait_for(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("not within the timeout")


def test_a_job_runs_to_success_with_a_line_per_epoch(tmp_path):
    proc, run_dir = start(tmp_path, "job-a", 3, 0.1)
    assert proc.wait(timeout=30) == 0
    done = record(run_dir)
    assert done["state"] == "succeeded" and done["exit_code"] == 0
    assert done["result"] == {"ok": True, "epochs": 3}
    output = (run_dir / "output.log").read_text()
    assert "[trainstack] epoch 3/3 loss 0.3333" in output
    assert output.rstrip().endswith("[trainstack] job succeeded")


def test_tee_streams_the_job_output_as_it_keeps_it(tmp_path):
    """The stack's declared job runs under the runner in the foreground (--tee): `pulumi up`
    sees the job's output, summary line included, and the run keeps the same output.log and
    record as a submitted job."""
    run_dir = tmp_path / "run-a"
    run_dir.mkdir()
    (run_dir / "job.json").write_text(json.dumps({"id": "run-a", "state": "queued"}))
    done = subprocess.run(
        [sys.executable, "-m", "trainstack_training.queue", str(run_dir), "--lock",
         str(tmp_path / ".lock"), "--epochs", "2", "--tee", "--",
         sys.executable, "-c", JOB, str(run_dir), "2", "0.1"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines()[-1] == '{"ok": true, "epochs": 2}'
    output = (run_dir / "output.log").read_text()
    assert '{"ok": true, "epochs": 2}' in output and "[trainstack] job succeeded" in output
    assert record(run_dir)["state"] == "succeeded"
    assert record(run_dir)["result"] == {"ok": True, "epochs": 2}


def test_jobs_queue_first_in_first_out_on_one_lock(tmp_path):
    first, first_dir = start(tmp_path, "job-1", 3, 0.5)
    wait_for(lambda: record(first_dir).get("state") == "running")
    second, second_dir = start(tmp_path, "job-2", 1, 0.1)
    time.sleep(0.3)
    third, third_dir = start(tmp_path, "job-3", 1, 0.1)
    wait_for(lambda: "queued: 1 job ahead (job-2)" in text(third_dir / "output.log"))
    assert record(second_dir)["state"] == "queued"
    assert record(second_dir)["waiting_for"].startswith("queued: first in line; needs 1 slot")
    for proc in (first, second, third):
        assert proc.wait(timeout=60) == 0
    starts = [record(d)["started_at"] for d in (first_dir, second_dir, third_dir)]
    ends = [record(d)["ended_at"] for d in (first_dir, second_dir, third_dir)]
    assert starts == sorted(starts) and starts[1] >= ends[0] and starts[2] >= ends[1]


def test_jobs_that_fit_run_side_by_side_and_a_larger_one_waits_for_its_slots(tmp_path):
    """Two one-worker jobs on two slots run at once; a two-worker job behind them starts when
    both have ended (all of its ranks together), and holds back a one-worker job behind it."""
    one, one_dir = start(tmp_path, "job-1", 4, 0.4, slots=2)
    two, two_dir = start(tmp_path, "job-2", 4, 0.4, slots=2)
    wait_for(lambda: all(record(d).get("state") == "running" for d in (one_dir, two_dir)))
    assert record(one_dir)["slots"] == 1 and record(two_dir)["slots"] == 1
    big, big_dir = start(tmp_path, "job-3", 1, 0.1, workers=2, slots=2)
    time.sleep(0.2)
    small, small_dir = start(tmp_path, "job-4", 1, 0.1, slots=2)
    wait_for(lambda: "1 job ahead (job-3)" in record(small_dir).get("waiting_for", ""))
    assert record(big_dir)["waiting_for"].startswith("queued: first in line; needs 2 slots, 0 of 2")
    for proc in (one, two, big, small):
        assert proc.wait(timeout=60) == 0
    one_r, two_r, big_r, small_r = (record(d) for d in (one_dir, two_dir, big_dir, small_dir))
    assert two_r["started_at"] < one_r["ended_at"]  # side by side
    assert big_r["started_at"] >= max(one_r["ended_at"], two_r["ended_at"])
    assert small_r["started_at"] >= big_r["started_at"]  # not before the larger job ahead


def recorded(recorder: Recorder, what: str, found) -> Proc:
    """Sample the runner's processes until one of them is `found`; that process."""
    seen: list[Proc] = []

    def check() -> bool:
        seen[:] = [p for p in recorder.sample() if found(p)]
        return bool(seen)

    try:
        wait_for(check)
    except AssertionError:
        names = [str(p) for p in recorder.seen.values()]
        raise AssertionError(f"{what} never ran below the runner; saw {names}") from None
    return seen[0]


def test_cancel_while_running_stops_the_whole_process_group(tmp_path):
    proc, run_dir = start(tmp_path, "job-c", 100, 0.2)
    recorder = Recorder(proc.pid)
    job = recorded(recorder, "the job", lambda p: p.cmdline.endswith(f"{run_dir} 100 0.2"))
    wait_for(lambda: (run_dir / "epochs.jsonl").exists())
    recorder.sample()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 1
    assert record(run_dir)["state"] == "cancelled"
    assert job in recorder.seen.values()
    # Every process seen below the runner is gone, the job's included.
    assert [str(p) for p in wait_gone(list(recorder.seen.values()), 5)] == []


# A driver the way PySpark's behaves: SIGINT raises KeyboardInterrupt, on which it cleans up
# (cancels its Spark jobs, stops the context) and exits. It has a child in its process group
# that ignores SIGINT, as PySpark's JVM gateway does.
DRIVER = (
    "import pathlib, signal, subprocess, sys, time\n"
    "out = pathlib.Path(sys.argv[1])\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)', 'gateway-of', str(out)])\n"
    "(out / 'epochs.jsonl').write_text('{\"epoch\": 1, \"loss\": 1.0}\\n')\n"
    "if sys.argv[2] == 'deaf':\n"
    "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "try:\n"
    "    time.sleep(600)\n"
    "except KeyboardInterrupt:\n"
    "    (out / 'stopped-cleanly').touch()\n"
    "    sys.exit(130)\n"
)


def start_driver(root: Path, mode: str, grace: float = 12.0) -> tuple[subprocess.Popen, Path]:
    run_dir = root / f"job-{mode}"
    run_dir.mkdir()
    runner = (
        "import sys, trainstack_training.queue.process as r\n"
        f"r.STOP_GRACE_SECONDS = r.KILL_AFTER_SECONDS = {grace}\n"
        "sys.exit(r.main(sys.argv[1:]))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", runner, str(run_dir), "--lock", str(root / ".lock"), "--",
         sys.executable, "-c", DRIVER, str(run_dir), mode],
    )  # fmt: skip
    wait_for(lambda: (run_dir / "epochs.jsonl").exists())
    wait_for(lambda: left_behind(run_dir))  # the gateway has started
    return proc, run_dir


def left_behind(run_dir: Path) -> str:
    found = subprocess.run(["pgrep", "-af", str(run_dir)], capture_output=True, check=False)
    return found.stdout.decode().strip()


def test_cancel_lets_the_driver_stop_the_spark_way_and_ends_its_process_group(tmp_path):
    proc, run_dir = start_driver(tmp_path, "polite")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 1
    assert (run_dir / "stopped-cleanly").exists()  # SIGINT first: PySpark cancels its jobs
    assert record(run_dir)["state"] == "cancelled"
    assert left_behind(run_dir) == ""  # the gateway that ignored SIGINT went with the group


def test_a_driver_that_ignores_the_signals_is_killed_after_the_grace(tmp_path):
    proc, run_dir = start_driver(tmp_path, "deaf", grace=0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 1
    assert not (run_dir / "stopped-cleanly").exists()
    assert record(run_dir)["state"] == "cancelled"
    assert left_behind(run_dir) == ""


def test_the_record_is_never_torn_or_rolled_back_by_the_heartbeat(tmp_path):
    from trainstack_training.queue.process import read_record, write_record

    stop, torn, seen, errors = threading.Event(), [], [], []

    def beat() -> None:
        while not stop.is_set():
            try:
                write_record(tmp_path, heartbeat=time.time(), padding="x" * 4000)
            except OSError as exc:  # a heartbeat thread that dies leaves the job "lost"
                errors.append(repr(exc))
                return

    def read() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                raw = (tmp_path / "job.json").read_text()
                try:
                    seen.append(json.loads(raw).get("n", -1))
                except ValueError:
                    torn.append(raw[:80])

    threads = [threading.Thread(target=beat), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for n in range(2000):
        write_record(tmp_path, state="running", n=n)
    write_record(tmp_path, state="cancelled")
    time.sleep(0.2)  # heartbeats after the final state keep it
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and torn == []
    rolled_back = [(a, b) for a, b in itertools.pairwise(seen) if b < a]
    assert rolled_back == [], rolled_back[:5]  # a heartbeat wrote back an older record
    assert read_record(tmp_path)["state"] == "cancelled" and read_record(tmp_path)["n"] == 1999


def test_cancel_while_queued_never_runs_the_job(tmp_path):
    first, first_dir = start(tmp_path, "job-x", 4, 0.5)
    wait_for(lambda: record(first_dir).get("state") == "running")
    queued, queued_dir = start(tmp_path, "job-y", 1, 0.1)
    wait_for(lambda: record(queued_dir).get("pid"))
    queued.send_signal(signal.SIGTERM)
    assert queued.wait(timeout=20) == 1
    assert record(queued_dir)["state"] == "cancelled"
    assert "started_at" not in record(queued_dir)
    assert first.wait(timeout=60) == 0


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [(["lr=0.01", "name=cnn", "layers=[8, 16]"], {"lr": 0.01, "name": "cnn", "layers": [8, 16]})],
)
def test_params_are_json_when_they_parse(pairs, expected):
    assert _params(pairs) == expected


def test_the_cli_takes_the_stack_before_the_command():
    args = build_parser().parse_args(["-s", "dev", "logs", "-f", "job-1"])
    assert (args.stack, args.command, args.job_id, args.follow) == ("dev", "logs", "job-1", True)


@pytest.mark.parametrize("value", ["digits", "/srv/trainstack/data/t.parquet", "s3a://b/t"])
def test_submit_data_takes_what_the_cluster_reads(value):
    args = build_parser().parse_args(["submit", "job", "--data", value])
    assert _data(args.data) == value


@pytest.mark.parametrize("value", ["data/t.csv", "t.parquet", "ftp://h/t.csv", ""])
def test_submit_data_refuses_a_path_of_this_machine_by_name(value):
    with pytest.raises(CliError) as err:
        _data(value)
    assert repr(value) in str(err.value) and "manifest's data" in str(err.value)


def test_a_job_with_packages_is_installing_then_queued_then_running(tmp_path):
    gate = tmp_path / "install-may-end"
    proc, run_dir = start(
        tmp_path,
        "job-i",
        1,
        0.1,
        f"echo pip says hello\nwhile [ ! -e {gate} ]; do sleep 0.1; done\n",
    )
    wait_for(lambda: "pip says hello" in text(run_dir / "output.log"))
    assert record(run_dir)["state"] == "installing"
    gate.touch()
    assert proc.wait(timeout=30) == 0
    assert record(run_dir)["state"] == "succeeded"
    output = text(run_dir / "output.log")
    assert "[trainstack] installing the job's packages on the cluster ..." in output
    assert re.search(r"\[trainstack\] packages installed in [0-9.]+ s", output), output


def test_a_failed_install_fails_the_job_without_running_it(tmp_path):
    proc, run_dir = start(tmp_path, "job-f", 1, 0.1, "echo 'no such wheel' >&2\nexit 3\n")
    assert proc.wait(timeout=30) == 1
    done = record(run_dir)
    assert done["state"] == "failed" and done["exit_code"] == 3, done
    assert done["error"].startswith("installing the job's packages failed (exit 3)"), done
    assert "no such wheel" in text(run_dir / "output.log")
    assert not (run_dir / "epochs.jsonl").exists()  # the job never ran


def test_cancel_while_installing_stops_the_install_and_never_runs_the_job(tmp_path):
    proc, run_dir = start(tmp_path, "job-x", 1, 0.1, "echo started\nsleep 60\n")
    wait_for(lambda: "started" in text(run_dir / "output.log"))
    # The install's `sleep` never names the run directory: it is recorded by its place below
    # the runner, then looked for by its PID and start time.
    recorder = Recorder(proc.pid)
    sleep = recorded(recorder, "the install's `sleep 60`", lambda p: p.cmdline == "sleep 60")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 1
    done = record(run_dir)
    assert done["state"] == "cancelled" and done["error"] == "cancelled while installing", done
    assert not (run_dir / "epochs.jsonl").exists()
    left = wait_gone(list(recorder.seen.values()), 5)
    assert [str(p) for p in left] == [], f"left running after the cancel (the sleep: {sleep})"
