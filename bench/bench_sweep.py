"""Sweeps (docs/jobs.md, "Sweeps"): what running trials side by side and stopping lagging ones
buys, what the driver costs, and a killed driver resumed.

    python bench/bench_sweep.py --out bench/results/bench_sweep.json [--trials 16]

Brings up a default stack of its own (2 workers, a training slot each), warms its runner with
one job, then, side by side in one run, a TPE sweep of the digits example over two parameters
(its learning rate, log-uniform, and its hidden units), `--trials` trials of 6 epochs at one
seed:

- **two at a time** and **one at a time**, early stopping off: the time from `trainstack
  sweep` until the sweep ended, and the ratio;
- **two at a time with early stopping** (`median`): the epochs the trials spent against the
  same sweep without it, and both best values;
- **the driver's overhead**: from a trial's end (its record's `ended_at`) to the next trial's
  submission (`submitted_at`), one at a time (where nothing else hides it);
- **killed and resumed**: a sweep of 6 trials whose driver is killed once its first two trials
  run, then `trainstack sweep resume`: trials lost, trials run twice, and the MLflow child
  runs under the sweep's parent (each trial once).

The stack is destroyed at the end.
"""

from __future__ import annotations

import argparse
import configparser
import itertools
import json
import os
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
from tests.support.stacks import ROOT, Stack

CONFIG = {"uiPortBase": "0", "monitoringPort": "0", "trainEpochs": "6", "trainWorkers": "2"}
EPOCHS = 6
SEED = 7
FINAL = ("succeeded", "failed", "cancelled")
SPACE = """
[sweep.params]
learning_rate = { distribution = "loguniform", low = 0.0001, high = 0.1 }
hidden_units = { distribution = "int", low = 16, high = 256, step = 16 }
"""


def cli(stack: Stack, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra.jobs.cli", "-s", stack.name, *args],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def job_dir(root: Path, trials: int, parallel: int, early_stop: str) -> Path:
    """examples/digits with its learning rate a parameter and this sweep in its manifest."""
    directory = root / f"digits-{trials}-{parallel}-{early_stop}"
    shutil.copytree(ROOT / "examples" / "digits", directory)
    model = directory / "model.py"
    model.write_text(
        model.read_text().replace(
            "learning_rate=ctx.learning_rate", 'learning_rate=float(ctx.params["learning_rate"])'
        )
    )
    (directory / "trainstack.toml").write_text(
        '[job]\nentry = "model"\n\n[params]\nhidden_units = 128\ndropout = 0.2\n'
        "learning_rate = 0.001\n\n[sweep]\n"
        f'metric = "val_accuracy"\ngoal = "max"\nmethod = "tpe"\ntrials = {trials}\n'
        f'parallel = {parallel}\nearly_stop = "{early_stop}"\nseed = {SEED}\n' + SPACE
    )
    return directory


def start(stack: Stack, directory: Path) -> str:
    proc = cli(stack, "sweep", str(directory), "--epochs", str(EPOCHS))
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed to start: {proc.stderr}")
    return proc.stdout.strip()


def status(stack: Stack, sweep_id: str) -> dict[str, Any]:
    proc = cli(stack, "sweep", "status", sweep_id, "--json")
    return json.loads(proc.stdout) if proc.stdout.startswith("{") else {}


def wait_end(stack: Stack, sweep_id: str, timeout: float = 3600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = status(stack, sweep_id)
        if found.get("state") in FINAL:
            if found["state"] != "succeeded":
                raise SystemExit(f"sweep {sweep_id} ended {found['state']}: {found.get('error')}")
            return found
        time.sleep(3.0)
    raise SystemExit(f"sweep {sweep_id} did not end within {timeout:.0f} s")


def jobs(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = cli(stack, "list", "--json")
    return {r["id"]: r for r in json.loads(listed.stdout)} if listed.returncode == 0 else {}


def run_sweep(stack: Stack, root: Path, trials: int, parallel: int, early_stop: str) -> dict:
    started = time.time()
    sweep_id = start(stack, job_dir(root, trials, parallel, early_stop))
    found = wait_end(stack, sweep_id)
    took = float(found["ended_at"]) - started
    records = jobs(stack)
    mine = sorted(
        (records[t["job_id"]] for t in found["trials"]), key=lambda r: float(r["submitted_at"])
    )
    gaps = [
        float(later["submitted_at"]) - float(earlier["ended_at"])
        for earlier, later in itertools.pairwise(mine)
        if float(later["submitted_at"]) >= float(earlier["ended_at"])
    ]
    return {
        "sweep": sweep_id,
        "parallel": parallel,
        "early_stop": early_stop,
        "until_ended_s": round(took, 1),
        "epochs_spent": sum(int(t["epochs"]) for t in found["trials"]),
        "states": {
            s: [t["state"] for t in found["trials"]].count(s)
            for s in ("succeeded", "pruned", "failed")
        },
        "best_value": found["best"]["value"],
        "best_params": found["best"]["params"],
        "trial_end_to_next_submit_s": {
            "median": round(statistics.median(gaps), 2) if gaps else None,
            "max": round(max(gaps), 2) if gaps else None,
        },
    }


def mlflow_children(stack: Stack, sweep_id: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    auth = subprocess.run(
        ["docker", "exec", f"{stack.label}-control-1", "cat", "/etc/trainstack/mlflow/auth.ini"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    ini = configparser.ConfigParser()
    ini.read_string(auth)
    os.environ["MLFLOW_TRACKING_USERNAME"] = ini["mlflow"]["admin_username"]
    os.environ["MLFLOW_TRACKING_PASSWORD"] = ini["mlflow"]["admin_password"]
    client = MlflowClient(stack.outputs()["mlflowUiUrl"])
    experiments = [e.experiment_id for e in client.search_experiments()]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        parents = client.search_runs(
            experiments,
            filter_string=f"tags.`trainstack.sweep` = '{sweep_id}' and "
            "tags.`trainstack.kind` = 'sweep'",
        )
        if len(parents) == 1 and parents[0].info.status == "FINISHED":
            break
        time.sleep(3.0)
    children = client.search_runs(
        experiments, filter_string=f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'"
    )
    ids = [c.data.tags.get("trainstack.job_id") for c in children]
    return {"parents": len(parents), "children": len(ids), "distinct_children": len(set(ids))}


def killed_and_resumed(stack: Stack, root: Path) -> dict[str, Any]:
    sweep_id = start(stack, job_dir(root, 6, 2, "off"))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        records = jobs(stack)
        if (
            sum(records.get(f"{sweep_id}-t{n:03d}", {}).get("state") == "running" for n in (0, 1))
            == 2
        ):
            break
        time.sleep(1.0)
    record = status(stack, sweep_id)
    node = next(
        n["container"] for n in stack.outputs()["nodes"]
        if record["node"] in (n["name"], n["container"]) or record["node"].endswith(n["name"])
    )  # fmt: skip
    subprocess.run(["docker", "exec", node, "kill", "-KILL", str(record["pid"])], check=True)
    resumed = cli(stack, "sweep", "resume", sweep_id)
    if resumed.returncode != 0:
        raise SystemExit(f"resume failed: {resumed.stderr}")
    found = wait_end(stack, sweep_id)
    starts = [t["job_id"] for t in found["trials"]]
    run_dirs = [j for j in jobs(stack) if j.startswith(f"{sweep_id}-t")]
    return {
        "sweep": sweep_id,
        "trials_asked": 6,
        "trials_lost": 6 - len({t["job_id"] for t in found["trials"] if t["state"] in FINAL}),
        "trials_run_twice": len(starts) - len(set(starts)) + len(run_dirs) - len(set(run_dirs)),
        "run_dirs": len(run_dirs),
        "mlflow": mlflow_children(stack, sweep_id),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--trials", type=int, default=16)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "config": CONFIG,
        "sweep": f"examples/digits, TPE over learning_rate and hidden_units, {args.trials} "
        f"trials of {EPOCHS} epochs, seed {SEED}, one worker a trial",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        stack = Stack(root / "state", prefix="tsbench")
        try:
            stack.init(**CONFIG)
            stack.up()
            warm = cli(stack, "submit", str(ROOT / "examples" / "digits"), "--workers", "1")
            cli(stack, "logs", "-f", warm.stdout.strip())  # the warm runner is up from here
            two = run_sweep(stack, root, args.trials, 2, "off")
            one = run_sweep(stack, root, args.trials, 1, "off")
            pruned = run_sweep(stack, root, args.trials, 2, "median")
            result["two_at_a_time"], result["one_at_a_time"] = two, one
            result["two_at_a_time_median_stop"] = pruned
            result["speed_up"] = round(one["until_ended_s"] / two["until_ended_s"], 2)
            result["epochs_saved_by_early_stop"] = round(
                1 - pruned["epochs_spent"] / two["epochs_spent"], 2
            )
            result["best_without_and_with_early_stop"] = [two["best_value"], pruned["best_value"]]
            result["killed_and_resumed"] = killed_and_resumed(stack, root)
        finally:
            stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
