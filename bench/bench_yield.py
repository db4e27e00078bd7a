"""The warm runner yields (docs/jobs.md, "The warm runner"; issue 38): how long a plain Spark
application waits for cores while the runner is idle, and what the trainstack jobs after it
pay, side by side in one run on the default stack.

    python bench/bench_yield.py --out bench/results/bench_yield.json [--cycles 3]

Brings up a default stack of its own (2 workers, the digits example, `runnerKeepAlive` 10m and
`runnerYield` true: the defaults) and, after one job has left the runner up and idle, repeats
`--cycles` times:

- a plain PySpark application (tests/support/plain_spark.py: not trainstack's code) started on
  control-3 with the cluster's client config: submitted to its context up, and its context up
  to its first task (the time the idle runner took to give the cores: the goal is 10 s);
- the same application again at once, on a free cluster (the runner has gone): what Spark
  itself takes from a context to its first task on these workers, the floor of the above;
- the next trainstack job, which starts the runner again: submit to its first training step
  (cold: about 45 s before the yield existed);
- the job after it: submit to its first training step (warm again: about 6 s).
No job may fail. The stack is destroyed at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_runner import run_job
from bench.common import emit, median
from tests.support.plain_spark import PlainApp
from tests.support.stacks import Stack

CONFIG = {"uiPortBase": "0", "monitoringPort": "0", "trainWorkers": "2"}
DRIVER_NODE = "control-3"


def plain_app(stack: Stack) -> dict[str, Any]:
    done = PlainApp(f"{stack.label}-{DRIVER_NODE}", f"bench-{int(time.time())}").result(600)
    return {
        "app": done["app"],
        "submit_to_context_up_s": round(done["up"] - done["submitted"], 2),
        "context_up_to_first_task_s": round(done["first_task"] - done["up"], 2),
        "submit_to_first_task_s": round(done["first_task"] - done["submitted"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    result: dict[str, Any] = {"config": CONFIG, "cycles": args.cycles}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp) / "state", prefix="tsbench")
        try:
            stack.init(**CONFIG)
            stack.up()
            result["first_job"] = run_job(stack)  # leaves the runner up and idle
            cycles = []
            for _ in range(args.cycles):
                plain = plain_app(stack)
                free = plain_app(stack)
                after = run_job(stack)
                warm = run_job(stack)
                cycles.append(
                    {
                        "plain": plain,
                        "plain_on_a_free_cluster": free,
                        "job_after_yield": after,
                        "job_after_that": warm,
                    }
                )
            result["cycles"] = cycles
            plains = [c["plain"] for c in cycles]
            frees = [c["plain_on_a_free_cluster"] for c in cycles]
            result["median"] = {
                "plain_context_up_to_first_task_s": median(plains, "context_up_to_first_task_s"),
                "free_cluster_context_up_to_first_task_s": median(
                    frees, "context_up_to_first_task_s"
                ),
                "plain_submit_to_first_task_s": median(plains, "submit_to_first_task_s"),
                "job_after_yield_submit_to_first_step_s": median(
                    [c["job_after_yield"] for c in cycles], "submit_to_first_step_s"
                ),
                "job_after_that_submit_to_first_step_s": median(
                    [c["job_after_that"] for c in cycles], "submit_to_first_step_s"
                ),
            }
            result["spark_applications"] = [
                [c[k]["spark_application"] for k in ("job_after_yield", "job_after_that")]
                for c in cycles
            ]
        finally:
            stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
