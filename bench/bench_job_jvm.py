"""The training job on the default stack: Spark's default JIT (C1 then C2) against C1 only,
and the small set's data stage without Spark against the distributed Spark stage, the same
job side by side in one run.

    python bench/bench_job_jvm.py --out bench/results/bench_job_jvm.json

One stack of its own with the default topology (3 control nodes at 0.3 CPU, 2 workers at
0.55 CPU, monitoring on, no job at `up`); then the default digits job (2 workers, 10 epochs)
is submitted on worker-1 as `pulumi up` submits it, alternately with the driver's heap
setting only (`c2`: Spark's default tiered compilation) and with the job's Java options of
`infra/program.py` for the driver and the executors (`c1`: `-XX:TieredStopAtLevel=1`), and
with those options and `--local-prep-mb 0` (`c1-spark-data`: the data stage as a distributed
Spark stage, which starts Spark SQL; the digits otherwise take the `arrow` path, read with
pyarrow in the driver), `--repeats` times each. Reports every run's phases (`job_phases` of
metrics.json), its `time_split` (Spark start-up, data, TensorFlow start-up, training, finish),
two shares of the job (`barrier_share`: the barrier stage, TensorFlow's start-up included;
`training_share`: `model.fit` alone) and the medians per setting.
`--rows 50000 --epochs 8` is the drills' workload.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, run_stack_job, timed
from infra.program import DRIVER_CONF, DRIVER_MEMORY_CONF, JOB_JAVA_OPTIONS
from tests.support.stacks import Stack

# name: (--spark-conf, extra job flags)
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "c2": (DRIVER_MEMORY_CONF, []),
    "c1": (DRIVER_CONF, []),
    "c1-spark-data": (DRIVER_CONF, ["--local-prep-mb", "0"]),
}


def run_job(container: str, master: str, args: argparse.Namespace, name: str, run: str) -> dict:
    job_args = ["--workers", "2", "--epochs", str(args.epochs), "--batch-size", "32"]
    job_args += ["--data", "digits", "--rows", str(args.rows)]
    conf, flags = SETTINGS[name]
    summary = run_stack_job(container, master, [*job_args, *flags], conf, f"jvm-{run}")
    metrics = json.loads(
        subprocess.run(
            ["docker", "exec", container, "cat", summary["metrics_path"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    total, train = float(metrics["total_seconds"]), float(metrics["train_seconds"])
    return {
        "total_s": round(total, 2),
        "data_s": round(float(metrics["data_seconds"]), 2),
        "train_s": round(train, 2),
        "barrier_share": round(train / total, 3),
        "training_share": float(metrics["training_share"]),
        "split": metrics["time_split"],
        "accuracy": round(float(summary["accuracy"]), 4),
        "data_path": metrics.get("data_path"),
        "phases": {k: round(float(v), 2) for k, v in metrics["job_phases"].items()},
        "import_tf_s": [round(w["import_tf"], 2) for w in metrics["worker_timings"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--rows", type=int, default=0, help="digits rows (0: the 1,797 real)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting")
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbjvm")
        stack.init(uiPortBase="0", train="false")
        try:
            up = timed(stack.up)
            outputs = stack.outputs()
            worker = next(n for n in outputs["nodes"] if n["name"] == "worker-1")
            for i in range(args.repeats):
                for name in SETTINGS:
                    runs[name].append(
                        run_job(
                            worker["container"],
                            outputs["sparkMasterUrl"],
                            args,
                            name,
                            f"{name}-{i}",
                        )
                    )
        finally:
            stack.destroy_and_remove()

    keys = ("total_s", "data_s", "train_s", "barrier_share", "training_share")
    medians = {
        name: {k: round(statistics.median(r[k] for r in rs), 3) for k in keys}
        | {
            f"phase_{p}": round(statistics.median(r["phases"][p] for r in rs), 2)
            for p in rs[0]["phases"]
        }
        | {
            f"split_{p}": round(statistics.median(r["split"][p] for r in rs), 2)
            for p in rs[0]["split"]
        }
        for name, rs in runs.items()
    }
    emit(
        {
            "benchmark": "job_jvm",
            "what": "the digits job on the default stack: Spark's default JIT vs C1 only; "
            "the small set's arrow data path vs the distributed Spark stage",
            "c1_java_options": JOB_JAVA_OPTIONS,
            "topology": "3 control (0.3 CPU), 2 workers (0.55 CPU), monitoring on",
            "rows": args.rows,
            "epochs": args.epochs,
            "repeats": args.repeats,
            "up_s": round(up, 1),
            "runs": runs,
            "median": medians,
            "total_c1_over_c2": round(medians["c1"]["total_s"] / medians["c2"]["total_s"], 3),
            "total_c1_over_c1_spark_data": round(
                medians["c1"]["total_s"] / medians["c1-spark-data"]["total_s"], 3
            ),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
