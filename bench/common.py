"""What the benchmarks share: timing a call and writing the JSON result."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    fn()
    return round(time.perf_counter() - start, 2)


def median(runs: list[dict[str, Any]], key: str) -> float:
    """The median of `key` over `runs`, to 2 decimals."""
    return round(statistics.median(float(r[key]) for r in runs), 2)


def emit(result: dict, out: Path | None) -> None:
    """Print the result as JSON, and write it to `out` too when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def run_stack_job(container: str, master: str, args: list[str], conf: str, run: str) -> dict:
    """Run `trainstack-train` on a stack's node as the job user (as `pulumi up` does) with
    `--spark-conf conf` and `args`; its output under <models dir>/bench-<run>.
    The job is the stack's default, examples/digits, which `pulumi up` shipped to the cluster.
    Returns the job's summary line; exits with its output when the job fails."""
    from infra.config.values import PROJECT_DIR
    from infra.jobs import pack
    from infra.jobs.remote import JOBS_DIR, MODELS_DIR, NODE_ENV, NODE_VENV

    command = [
        f"{NODE_VENV}/bin/trainstack-train",
        "--job-dir",
        f"{JOBS_DIR}/{pack(PROJECT_DIR / 'examples' / 'digits').sha}",
        "--master",
        master,
        *args,
        "--output",
        f"{MODELS_DIR}/bench-{run}",
        "--spark-conf",
        conf,
    ]
    env = [f"--env={k}={v}" for k, v in NODE_ENV.items()]
    proc = subprocess.run(
        ["docker", "exec", "-u", "trainstack", *env, container, *command],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    summary: dict = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or not summary.get("ok"):
        raise SystemExit(f"job {run} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return summary
