"""The warm runner (docs/jobs.md): what a job waits before its first training step, cold and
warm, side by side in one run on the default stack.

    python bench/bench_runner.py --out bench/results/bench_runner.json [--warm 5]

Brings up a default stack of its own (2 workers, 10 epochs of the digits example, the node
image as `make up` has it, `runnerKeepAlive` KEEP_ALIVE) and measures:

- nothing to trained model: the first `pulumi up` (the image is present), and its job's split;
- warm: `trainstack submit` to the job's first training step (the first TensorFlow worker
  entering fit), and the whole job (submitted to ended), for jobs submitted back to back
  while the runner is up (median of `--warm`);
- restart after the keep-alive: the same, for a job submitted after the runner stopped;
- cold, without a runner (`runnerKeepAlive 0`: the job starts and stops its own application).
The stack is destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
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

EXAMPLE = ROOT / "examples" / "digits"
KEEP_ALIVE_S = 30
CONFIG = {
    "uiPortBase": "0",
    "monitoringPort": "0",
    "trainWorkers": "2",
    "runnerKeepAlive": f"{KEEP_ALIVE_S}s",
}


def cli(stack: Stack, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra.jobs.cli", "-s", stack.name, *args],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def run_job(stack: Stack, example: Path = EXAMPLE, *args: str) -> dict[str, Any]:
    """Submit a job (the digits example by default), wait for its end; its times from the
    submit."""
    submitted = time.time()
    proc = cli(stack, "submit", str(example), *args)
    if proc.returncode != 0:
        raise SystemExit(f"submit failed: {proc.stderr}")
    job_id = proc.stdout.strip()
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        record = json.loads(cli(stack, "status", job_id, "--json").stdout or "{}")
        if record.get("state") in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    else:
        raise SystemExit(f"job {job_id} did not end within 900 s")
    result = record.get("result") or {}
    if record.get("state") != "succeeded":
        raise SystemExit(f"job {job_id} {record.get('state')}: {record.get('error')}")
    split = result["time_split"]
    return {
        "job": job_id,
        "spark_application": result.get("spark_application"),
        "submit_to_first_step_s": round(float(result["first_step_at"]) - submitted, 2),
        "whole_job_s": round(float(record["ended_at"]) - submitted, 2),
        "startup_before_training_s": round(
            split["spark_startup"] + split["data"] + split["tensorflow_startup"], 2
        ),
        "time_split": split,
        "accuracy": result.get("accuracy"),
        "train_seconds": result.get("train_seconds"),
        "samples_per_second": result.get("samples_per_second"),
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("submit_to_first_step_s", "whole_job_s", "startup_before_training_s")
    return {
        **{k: round(statistics.median(r[k] for r in runs), 2) for k in keys},
        "max_submit_to_first_step_s": max(r["submit_to_first_step_s"] for r in runs),
        "runs": runs,
    }


def wait_runner_gone(stack: Stack, node: str, timeout: float) -> float:
    """Seconds until no warm runner runs on `node`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        code = subprocess.run(
            ["docker", "exec", node, "pgrep", "-f", "[t]rainstack_training[.]warm"],
            capture_output=True, check=False,
        ).returncode  # fmt: skip
        if code != 0:
            return round(time.monotonic() - start, 1)
        time.sleep(1)
    raise SystemExit(f"the warm runner on {node} did not stop within {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--warm", type=int, default=5, help="warm jobs (median)")
    args = parser.parse_args()
    result: dict[str, Any] = {"config": CONFIG, "warm_jobs": args.warm}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp) / "state", prefix="tsbench")
        try:
            stack.init(**CONFIG)
            start = time.monotonic()
            stack.up()
            result["make_up_to_trained_model_s"] = round(time.monotonic() - start, 1)
            outputs = stack.outputs()
            training = outputs["training"]
            result["make_up_job"] = {
                "time_split": training.get("time_split"),
                "spark_application": training.get("spark_application"),
            }
            submitter = outputs["jobNodes"][0]["container"]

            result["warm"] = medians([run_job(stack) for _ in range(args.warm)])

            result["runner_idle_stop_s"] = wait_runner_gone(stack, submitter, KEEP_ALIVE_S + 60)
            result["restart_after_keep_alive"] = run_job(stack)

            stack.run("config", "set", "trainstack:runnerKeepAlive", "0")
            stack.up()
            wait_runner_gone(stack, submitter, KEEP_ALIVE_S + 60)
            result["cold_own_application"] = medians([run_job(stack) for _ in range(2)])
        finally:
            stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
