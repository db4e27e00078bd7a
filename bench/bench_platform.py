"""The product's numbers: from nothing to a trained model, a no-change `up`, `destroy`.

    python bench/bench_platform.py --out bench/results/bench_platform.json

Runs the default topology in its own stack (wheelhouse cached after the first run) and
splits the first `up` into phases: the node image (0 when the engine has it), servers,
provisioning, the job's data stage and training (the rest of the job: Spark start-up,
copying results). `--rebake` removes the current node image first, so the first `up`
bakes it; a second provisioning run is timed and its changed count reported.
`--also KEY=VALUE` (repeatable) then provisions one more stack per setting, e.g.
`--also provisionCpuBoost=false --also provisionMitogen=false` (servers and provisioning only),
for the effect of each side by side in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, timed
from tests.support.stacks import Stack


def reprovision(stack: Stack, outputs: dict) -> dict:
    """Run site.yml again against the stack's nodes: its time and changed count per host."""
    import json
    import subprocess

    from infra.components.provisioning import integral

    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inventory.json"
        # As the provisioning resource does: numbers come back from the engine as floats.
        inventory.write_text(json.dumps(integral(outputs["inventory"])))
        node = outputs["nodes"][0]["container"]
        secret = subprocess.run(
            [
                "docker",
                "exec",
                node,
                "sh",
                "-c",
                "sed -n 's/^spark.authenticate.secret *//p' "
                "/etc/trainstack/spark/spark-defaults.conf",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "infra.provisioning",
                "--inventory",
                str(inventory),
                "--wheelhouse",
                str(Path.home() / ".cache" / "trainstack" / "wheelhouse"),
                "--artifacts-dir",
                str(Path(tmp) / "runner"),
            ],
            cwd=Path(__file__).resolve().parents[1],
            env={**stack.env, "TRAINSTACK_SPARK_AUTH_SECRET": secret},
            capture_output=True,
            text=True,
            check=False,
        )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "duration_s": result["duration_s"],
        "changed": {h: s["changed"] for h, s in result["stats"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rebake", action="store_true", help="bake the node image again")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also provision a stack with this trainstack setting (servers and provisioning only)",
    )
    args = parser.parse_args()
    if args.rebake:
        import docker

        from infra.images.bake import current_digest, image_tag

        with contextlib.suppress(docker.errors.ImageNotFound):
            docker.from_env().images.remove(image_tag(digest=current_digest()))

    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbench")
        stack.init(uiPortBase="0", trainEpochs=str(args.epochs))
        try:
            up = timed(stack.up)
            outputs = stack.outputs()
            # A second provisioning run (retrigger by a changed inventory is not needed:
            # run the playbook directly against the stack's inventory).
            second = reprovision(stack, outputs)
            no_change = timed(stack.up)
            destroy = timed(lambda: stack.run("destroy", "--yes"))
        finally:
            stack.destroy_and_remove()

    variants: dict[str, float] = {}
    for setting in args.also:
        key, _, value = setting.partition("=")
        with tempfile.TemporaryDirectory() as state:
            other = Stack(Path(state), prefix="tsbench")
            other.init(uiPortBase="0", train="false", **{key: value})
            try:
                other.up()
                variants[setting] = float(other.outputs()["provisioning"]["duration_s"])
            finally:
                other.destroy_and_remove()

    training = outputs["training"]
    provisioning = float(outputs["provisioning"]["duration_s"])
    job = float(training["total_seconds"])
    image = float(outputs["nodeImage"]["bake_s"])
    phases = {
        "image_s": round(image, 1),
        "servers_s": round(up - image - provisioning - job, 1),
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
        "node_image": outputs["nodeImage"],
        "provisioning_changed_first": {
            h: s["changed"] for h, s in outputs["provisioning"]["hosts"].items()
        },
        "second_provisioning": second,
        "provisioning_with_s": variants,
        "up_no_change_s": no_change,
        "destroy_s": destroy,
        "cpus": os.cpu_count(),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
