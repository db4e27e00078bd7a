"""Tracking (docs/monitoring.md, "Compare runs"; issue 40), side by side in one run on the
default stack:

    python bench/bench_tracking.py --out bench/results/bench_tracking.json [--pairs 5]
        [--runs 200] [--stack NAME] [--only overhead|search|server_killed_mid_job ...]

- the digits job's whole time (submit to end) with tracking working (the sync daemon and the
  server up) and with it stopped (both supervisor programs stopped on the tracking node),
  `--pairs` times, alternating, back to back in the warm runner: the jobs never talk to MLflow,
  so this is the cost of the sync beside them on the cluster;
- `--runs` recorded runs (params `lr`, `batch`, `seed`; one metric) made in an experiment of
  their own through the MLflow API, then one param searched (`params.lr = '0.003'`): the
  search's time, median of 5;
- the tracking server killed mid-job (a 80-epoch digits job; `supervisorctl stop mlflow` once
  some epochs are in its run, started again once the job ended): the run's metrics lost and
  duplicated, per metric key, once the sync completed it.

Brings up a default stack of its own and destroys it at the end; `--stack NAME` uses a running
stack of this project instead (the dev stack of `make up`), left as it is.
"""

from __future__ import annotations

import argparse
import configparser
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_runner import cli, run_job
from bench.common import emit
from infra.jobs.commands import project_env
from infra.nodes import NODE_PATHS
from tests.support.stacks import ROOT, Stack

CONFIG = {"uiPortBase": "0", "monitoringPort": "0", "trackingPort": "0", "trainWorkers": "2"}
DIGITS = ROOT / "examples" / "digits"
PROGRAMS = ("mlflow", "trainstack-tracking-sync")
KEYS = ("loss", "accuracy", "val_loss", "val_accuracy")


class RunningStack(Stack):
    """A stack of this project that is already up, in the project's own backend."""

    def __init__(self, name: str) -> None:  # no new backend, no passphrase of the tests'
        self.backend = ROOT / ".pulumi-state"
        self.name = name
        self.prefix = ""
        self.env = project_env()


def tracking_node(stack: Stack) -> str:
    return str(stack.outputs()["tracking"]["node"]["container"])


def node_sh(container: str, command: str) -> str:
    proc = subprocess.run(
        ["docker", "exec", container, "sh", "-c", command],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{container}: {command}: {proc.stdout}{proc.stderr}")
    return proc.stdout


def client(stack: Stack) -> Any:
    from mlflow.tracking import MlflowClient

    ini = configparser.ConfigParser()
    ini.read_string(node_sh(tracking_node(stack), f"cat {NODE_PATHS.mlflow_auth_file}"))
    os.environ["MLFLOW_TRACKING_USERNAME"] = ini["mlflow"]["admin_username"]
    os.environ["MLFLOW_TRACKING_PASSWORD"] = ini["mlflow"]["admin_password"]
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    return MlflowClient(stack.outputs()["mlflowUiUrl"])


def programs(stack: Stack, action: str) -> None:
    node_sh(tracking_node(stack), f"supervisorctl {action} {' '.join(PROGRAMS)}")


def wait_healthy(mlflow: Any, timeout: float = 300) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            mlflow.search_experiments(max_results=1)
            return round(time.monotonic() - started, 1)
        except Exception:  # any error: not up yet
            time.sleep(1)
    raise SystemExit(f"the tracking server did not answer within {timeout} s")


def overhead(stack: Stack, mlflow: Any, pairs: int) -> dict[str, Any]:
    """The digits job with tracking working and with it stopped, alternating."""
    on, off = [], []
    run_job(stack, DIGITS)  # the runner warm, the job's code shipped
    for _ in range(pairs):
        on.append(run_job(stack, DIGITS))
        programs(stack, "stop")
        try:
            off.append(run_job(stack, DIGITS))
        finally:
            programs(stack, "start")
            wait_healthy(mlflow)
    med_on = statistics.median(r["whole_job_s"] for r in on)
    med_off = statistics.median(r["whole_job_s"] for r in off)
    return {
        "tracking_on_whole_s": [r["whole_job_s"] for r in on],
        "tracking_off_whole_s": [r["whole_job_s"] for r in off],
        "median_on_s": round(med_on, 2),
        "median_off_s": round(med_off, 2),
        "difference_s": round(med_on - med_off, 2),
        "difference_pct": round(100 * (med_on - med_off) / med_off, 1),
    }


def search(mlflow: Any, runs: int) -> dict[str, Any]:
    """`runs` recorded runs, then one param searched through the API."""
    from mlflow.entities import Metric, Param

    name = f"bench-search-{int(time.time())}"
    experiment = mlflow.create_experiment(name)
    rates = ("0.1", "0.03", "0.01", "0.003", "0.001")
    started = time.monotonic()
    for i in range(runs):
        run = mlflow.create_run(experiment, run_name=f"run-{i}")
        params = [Param("lr", rates[i % 5]), Param("batch", str(32 * (1 + i % 4))),
                  Param("seed", str(i))]  # fmt: skip
        metric = Metric("val_loss", 1.0 / (i + 1), int(time.time() * 1000), 1)
        mlflow.log_batch(run.info.run_id, metrics=[metric], params=params)
        mlflow.set_terminated(run.info.run_id)
    recorded_s = time.monotonic() - started
    times, found = [], []
    for _ in range(5):
        t = time.monotonic()
        found = mlflow.search_runs([experiment], "params.lr = '0.003'", max_results=1000)
        times.append(time.monotonic() - t)
    return {
        "runs": runs,
        "record_s": round(recorded_s, 1),
        "found": len(found),
        "expected": runs // 5,
        "search_s": [round(t, 3) for t in times],
        "median_search_s": round(statistics.median(times), 3),
    }


def server_killed(stack: Stack, mlflow: Any, epochs: int = 80) -> dict[str, Any]:
    submitted = cli(stack, "submit", str(DIGITS), "--epochs", str(epochs))
    if submitted.returncode != 0:
        raise SystemExit(submitted.stderr)
    job_id = submitted.stdout.strip()
    tag = f"tags.`trainstack.job_id` = '{job_id}'"
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    before: list[int] = []
    deadline = time.monotonic() + 300
    while not before and time.monotonic() < deadline:
        runs = mlflow.search_runs(experiments, tag) if experiments else []
        if runs:
            before = [m.step for m in mlflow.get_metric_history(runs[0].info.run_id, "val_loss")]
        else:
            experiments = [e.experiment_id for e in mlflow.search_experiments()]
            time.sleep(0.3)
    node_sh(tracking_node(stack), "supervisorctl stop mlflow")
    stopped = time.monotonic()
    follow = cli(stack, "logs", "-f", job_id)
    job_end = time.monotonic() - stopped
    node_sh(tracking_node(stack), "supervisorctl start mlflow")
    back = wait_healthy(mlflow)
    run = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = mlflow.search_runs(experiments, tag)
        if found and found[0].info.status != "RUNNING":
            run = found[0]
            break
        time.sleep(1)
    if run is None or follow.returncode != 0:
        raise SystemExit(f"job {job_id}: the run was not completed ({follow.stdout[-500:]})")
    lost, duplicated = {}, {}
    for key in KEYS:
        steps = [m.step for m in mlflow.get_metric_history(run.info.run_id, key)]
        lost[key] = len(set(range(1, epochs + 1)) - set(steps))
        duplicated[key] = len(steps) - len(set(steps))
    return {
        "job": job_id,
        "epochs": epochs,
        "epochs_tracked_when_stopped": len(before),
        "job_ran_on_without_server_s": round(job_end, 1),
        "server_back_after_start_s": back,
        "status": run.info.status,
        "lost": lost,
        "duplicated": duplicated,
    }


PARTS = ("overhead", "search", "server_killed_mid_job")


def measure(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    mlflow = client(stack)
    wait_healthy(mlflow)
    parts = {
        "overhead": lambda: overhead(stack, mlflow, args.pairs),
        "search": lambda: search(mlflow, args.runs),
        "server_killed_mid_job": lambda: server_killed(stack, mlflow),
    }
    return {name: parts[name]() for name in args.only or PARTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--stack", help="a running stack of this project (left as it is)")
    parser.add_argument("--only", action="append", choices=PARTS, help="measure only these")
    args = parser.parse_args()
    result: dict[str, Any] = {"pairs": args.pairs}
    if args.stack:
        result["stack"] = args.stack
        result |= measure(RunningStack(args.stack), args)
    else:
        result["config"] = CONFIG
        with tempfile.TemporaryDirectory() as tmp:
            stack = Stack(Path(tmp) / "state", prefix="tsbench")
            try:
                stack.init(**CONFIG)
                stack.up()
                result |= measure(stack, args)
            finally:
                stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
