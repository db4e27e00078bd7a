"""The product's numbers: from nothing to a trained model, a no-change `up`, `destroy`.

    python bench/bench_platform.py --out bench/results/bench_platform.json

Runs the default topology in its own stack (wheelhouse cached after the first run) and
splits the first `up` into phases: servers, provisioning, the job's data stage and
training (the rest of the job: Spark start-up, copying results).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, timed
from tests.pulumi_cli import Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbench")
        stack.init(uiPortBase="0", trainEpochs=str(args.epochs))
        try:
            up = timed(stack.up)
            outputs = stack.outputs()
            no_change = timed(stack.up)
            destroy = timed(lambda: stack.run("destroy", "--yes"))
        finally:
            stack.destroy_and_remove()

    training = outputs["training"]
    provisioning = float(outputs["provisioning"]["duration_s"])
    job = float(training["total_seconds"])
    phases = {
        "servers_s": round(up - provisioning - job, 1),
        "provisioning_s": provisioning,
        "data_s": round(float(training["data_seconds"]), 1),
        "training_s": round(float(training["train_seconds"]), 1),
        "job_other_s": round(job - training["data_seconds"] - training["train_seconds"], 1),
    }
    result = {
        "benchmark": "platform",
        "topology": "default (3 control, 2 masters, 2 workers)",
        "epochs": args.epochs,
        "up_from_nothing_to_result_s": up,
        "phases": phases,
        "phase_share": {k: round(v / up, 3) for k, v in phases.items()},
        "validation_accuracy": training["final_val_accuracy"],
        "samples_per_second": training["samples_per_second"],
        "up_no_change_s": no_change,
        "destroy_s": destroy,
        "cpus": os.cpu_count(),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
