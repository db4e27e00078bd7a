"""The cost of Spark's RPC encryption on the training job: the data stage and training.

    python bench/bench_security.py --out bench/results/bench_security.json

One small stack of its own (3 control nodes, 2 workers, no monitoring, no job at `up`), its
daemons with `trainstack:sparkNetworkCrypto false` so that both kinds of application are
accepted; then the same job is submitted on worker-1 alternately with
`spark.network.crypto.enabled` false and true (`--repeats` times each), side by side in one
run. The application's own traffic (driver <-> executors: the data set's shards, task results,
broadcasts, block transfers) follows the application's setting; only its control messages to
the master and workers fall back to SASL authentication (still authenticated, not encrypted).
`--local-prep-mb 0` makes the data stage go through the executors (not the driver), so the
data crosses the network. Reports the job's data_seconds, train_seconds and total per setting
and the relative cost of encryption.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, run_stack_job, timed
from infra.program import DRIVER_MEMORY_CONF
from tests.support.stacks import Stack


def run_job(container: str, master: str, args: argparse.Namespace, crypto: bool, run: str) -> dict:
    conf = f"{DRIVER_MEMORY_CONF},spark.network.crypto.enabled={str(crypto).lower()}"
    job_args = ["--workers", str(args.workers), "--epochs", str(args.epochs)]
    job_args += ["--rows", str(args.rows), "--local-prep-mb", "0", "--no-plot"]
    summary = run_stack_job(container, master, job_args, conf, f"security-{run}")
    return {
        "data_s": float(summary["data_seconds"]),
        "train_s": float(summary["train_seconds"]),
        "total_s": float(summary["total_seconds"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--rows", type=int, default=50000, help="generated digits rows")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting")
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {"plain": [], "encrypted": []}
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbsec")
        stack.init(uiPortBase="0", monitoring="false", train="false", sparkNetworkCrypto="false")
        try:
            up = timed(stack.up)
            outputs = stack.outputs()
            worker = next(n for n in outputs["nodes"] if n["name"] == "worker-1")
            for i in range(args.repeats):
                for name, crypto in (("plain", False), ("encrypted", True)):
                    runs[name].append(
                        run_job(
                            worker["container"],
                            outputs["sparkMasterUrl"],
                            args,
                            crypto,
                            f"{name}-{i}",
                        )
                    )
        finally:
            stack.destroy_and_remove()

    medians = {
        name: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]}
        for name, rs in runs.items()
    }
    cost = {
        k: round(medians["encrypted"][k] / medians["plain"][k] - 1, 3) for k in medians["plain"]
    }
    emit(
        {
            "benchmark": "security",
            "what": "spark.network.crypto.enabled false vs true, same job, same stack",
            "topology": "3 control, 2 masters, 2 workers",
            "rows": args.rows,
            "epochs": args.epochs,
            "workers": args.workers,
            "repeats": args.repeats,
            "up_s": round(up, 1),
            "runs": runs,
            "median": medians,
            "encryption_cost_relative": cost,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
