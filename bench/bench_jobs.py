"""Your own code on a running stack: what `trainstack submit`, `logs` and `cancel` cost.

    python bench/bench_jobs.py --out bench/results/bench_jobs.json [--cycles 20]

Brings up a default stack of its own (2 workers, 8 epochs; the node image as `make up` has it),
then, side by side in one run:

- `submit` wall time: the same code (already on the cluster; median of 5) and a changed code
  directory (shipped first);
- from `submit` of changed code to its first epoch line in `trainstack logs -f`, and the
  job's own start-up before training (its `time_split`: Spark, data, TensorFlow);
- how long an epoch's line takes to reach `logs -f` (its arrival against the epoch's end,
  `ended_at` in epochs.jsonl; the same clock: the containers share this machine's);
- a job's own packages (a requirements file, docs/jobs.md): `submit` with a lock new to this
  machine and the cluster (resolved by pip with empty caches, shipped) and the job's time in
  its `installing` state, then with changed code and the same lock (installs nothing),
  beside changed code without packages;
- `cancel` cycles: submit, wait for the first epoch, cancel, then the time until no process of
  the job is left on any worker node, and the processes left after all cycles.
The stack is destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit
from infra.nodes import NODE_PATHS
from tests.support.jobs import JOB_PROCESSES
from tests.support.stacks import ROOT, Stack

EXAMPLE = ROOT / "examples" / "digits"
CONFIG = {"uiPortBase": "0", "monitoringPort": "0", "trainEpochs": "8", "trainWorkers": "2"}


def cli(stack: Stack, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra.jobs.cli", "-s", stack.name, *args],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def submit(stack: Stack, directory: Path, *extra: str) -> tuple[str, float]:
    start = time.perf_counter()
    proc = cli(stack, "submit", str(directory), *extra)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"submit failed: {proc.stderr}")
    return proc.stdout.strip(), seconds


def status(stack: Stack, job_id: str) -> dict[str, Any]:
    return dict(json.loads(cli(stack, "status", job_id, "--json").stdout))


def wait_state(stack: Stack, job_id: str, states: tuple[str, ...], timeout: float = 900) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = status(stack, job_id)
        if record.get("state") in states:
            return record
        time.sleep(0.5)
    raise SystemExit(f"job {job_id} not in {states} within {timeout:.0f} s")


def follow(stack: Stack, job_id: str) -> list[tuple[float, str]]:
    """`logs -f` to the end: each line with the wall time it arrived."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.jobs.cli", "-s", stack.name, "logs", "-f", job_id],
        cwd=ROOT, env=stack.env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = [(time.time(), line.rstrip("\n")) for line in proc.stdout]
    proc.wait(timeout=60)
    return lines


def epoch_rows(container: str, run_dir: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["docker", "exec", container, "cat", f"{run_dir}/epochs.jsonl"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def job_processes(nodes: list[str]) -> int:
    count = 0
    for container in nodes:
        out = subprocess.run(
            ["docker", "exec", container, "sh", "-c", JOB_PROCESSES],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        count += len(out.splitlines())
    return count


def changed_copy(root: Path, n: int) -> Path:
    """examples/digits with one line changed: new code, a new SHA, shipped at submit."""
    job = root / f"digits-{n}"
    shutil.copytree(EXAMPLE, job)
    with (job / "model.py").open("a") as fh:
        fh.write(f"\n# change {n} {time.time()}\n")
    return job


def with_packages(root: Path, n: int) -> Path:
    """changed_copy(n) with a requirements file (a package the nodes do not have)."""
    job = changed_copy(root, n)
    (job / "requirements.txt").write_text("tabulate==0.9.0\n")
    manifest = job / "trainstack.toml"
    manifest.write_text(
        manifest.read_text().replace("[job]\n", '[job]\nrequirements = "requirements.txt"\n')
    )
    return job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cycles", type=int, default=20, help="cancel cycles")
    args = parser.parse_args()
    result: dict[str, Any] = {"config": CONFIG, "cycles": args.cycles}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp) / "state", prefix="tsbench")
        try:
            stack.init(**CONFIG)
            stack.up()
            outputs = stack.outputs()
            job_nodes = [n["container"] for n in outputs["jobNodes"]]  # drivers, workers
            control = [n["container"] for n in outputs["nodes"] if n["name"].startswith("control")][
                -1
            ]

            # submit: changed code (shipped), then its first epoch line in logs -f
            job_id, seconds = submit(stack, changed_copy(Path(tmp), 0))
            submitted_at = time.time() - seconds
            result["submit_changed_code_s"] = round(seconds, 3)
            lines = follow(stack, job_id)
            first = next(t for t, line in lines if line.startswith("[trainstack] epoch 1/"))
            result["submit_to_first_epoch_line_s"] = round(first - submitted_at, 2)
            record = status(stack, job_id)
            split = record["result"]["time_split"]
            result["job_time_split"] = split
            result["job_startup_before_training_s"] = round(
                split["spark_startup"] + split["data"] + split["tensorflow_startup"], 2
            )
            run_dir = f"{NODE_PATHS.models_dir}/{job_id}"
            ended = {int(r["epoch"]): float(r["ended_at"]) for r in epoch_rows(control, run_dir)}
            arrivals = {
                int(line.split()[2].split("/")[0]): t
                for t, line in lines
                if line.startswith("[trainstack] epoch ")
            }
            lags = [arrivals[e] - ended[e] for e in sorted(ended) if e in arrivals]
            result["epoch_line_lag_s"] = {
                "median": round(statistics.median(lags), 2),
                "max": round(max(lags), 2),
                "epochs": len(lags),
            }

            # submit of code already on the cluster (median of 5; each job cancelled at once)
            same = []
            for _ in range(5):
                job_id, seconds = submit(stack, EXAMPLE)
                same.append(seconds)
                cli(stack, "cancel", job_id)
            result["submit_same_code_s"] = {
                "median": round(statistics.median(same), 3),
                "max": round(max(same), 3),
            }

            # a job's own packages: a new lock (empty pip and trainstack caches), then the
            # same lock with changed code; each job cancelled at once
            caches = Path(tmp) / "caches"
            stack.env["XDG_CACHE_HOME"] = str(caches)
            try:
                job_id, seconds = submit(stack, with_packages(Path(tmp), 100))
                result["submit_new_packages_s"] = round(seconds, 3)
                installed = time.monotonic()
                wait_state(stack, job_id, ("queued", "running", "succeeded", "failed"))
                result["installing_state_s"] = round(time.monotonic() - installed, 2)
                cli(stack, "cancel", job_id)
                job_id, seconds = submit(stack, with_packages(Path(tmp), 101))
                result["submit_same_packages_changed_code_s"] = round(seconds, 3)
                result["same_packages_state_after_submit"] = status(stack, job_id).get("state")
                cli(stack, "cancel", job_id)
            finally:
                del stack.env["XDG_CACHE_HOME"]
            job_id, seconds = submit(stack, changed_copy(Path(tmp), 102))
            result["submit_changed_code_no_packages_s"] = round(seconds, 3)
            cli(stack, "cancel", job_id)

            # cancel cycles
            gone = []
            for n in range(args.cycles):
                job_id, _ = submit(stack, EXAMPLE, "--epochs", "50")
                run_dir = f"{NODE_PATHS.models_dir}/{job_id}"
                deadline = time.monotonic() + 300
                while not epoch_rows(control, run_dir) and time.monotonic() < deadline:
                    time.sleep(0.5)
                start = time.monotonic()
                stop = cli(stack, "cancel", job_id, timeout=60)
                if stop.returncode != 0:
                    raise SystemExit(f"cancel {n} failed: {stop.stderr}")
                while job_processes(job_nodes) and time.monotonic() - start < 60:
                    time.sleep(0.25)
                gone.append(time.monotonic() - start)
            time.sleep(5)
            result["cancel_to_no_process_s"] = {
                "median": round(statistics.median(gone), 2) if gone else None,
                "max": round(max(gone), 2) if gone else None,
                "all": [round(g, 2) for g in gone],
            }
            result["stray_processes_after_cycles"] = job_processes(job_nodes)
        finally:
            stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
