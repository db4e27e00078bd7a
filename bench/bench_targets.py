"""The two targets side by side: `pulumi up` from nothing to a trained model, one run.

    python bench/bench_targets.py --out bench/results/bench_targets.json

docker: the default topology (3 control nodes, 2 masters, 2 workers) from the node image
(baked first when the engine lacks it, reported as `image_s`). ssh: four sshd servers
(tests/support/sshd.py: Debian 12 containers running openssh-server, one shared volume at
/srv/trainstack): 1 ZooKeeper + master + monitoring, 1 standby master, 2 workers; no image,
so provisioning is the full install over SSH. Same epochs, data and TensorFlow workers.
Each `up` is split into servers, provisioning and the job; a no-change `up` and `destroy`
are timed too. The sshd containers themselves (start, sshd ready) are timed apart: on real
servers they exist before `pulumi up`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, timed
from tests.support.stacks import Stack

SSH_ROLES = {
    "ctl-1": ["zookeeper", "spark_master", "monitoring"],
    "ctl-2": ["spark_master"],
    "wrk-1": ["spark_worker", "tensorflow"],
    "wrk-2": ["spark_worker", "tensorflow"],
}


def measure(stack: Stack) -> dict:
    up = timed(stack.up)
    outputs = stack.outputs()
    no_change = timed(stack.up)
    destroy = timed(lambda: stack.run("destroy", "--yes"))
    training = outputs["training"]
    provisioning = float(outputs["provisioning"]["duration_s"])
    job = float(training["total_seconds"])
    image = float((outputs.get("nodeImage") or {}).get("bake_s") or 0.0)
    return {
        "up_from_nothing_to_result_s": up,
        "phases": {
            "image_s": round(image, 1),
            "servers_s": round(up - image - provisioning - job, 1),
            "provisioning_s": provisioning,
            "job_s": round(job, 1),
            "training_s": round(float(training["train_seconds"]), 1),
        },
        "validation_accuracy": training["final_val_accuracy"],
        "submitted_on": training["submitted_on"],
        "up_no_change_s": no_change,
        "destroy_s": destroy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    import docker

    from tests.support.sshd import SshServers, make_key

    common = {"trainEpochs": str(args.epochs), "trainWorkers": "2"}
    result: dict = {"benchmark": "targets", "epochs": args.epochs, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbdock")
        stack.init(uiPortBase="0", **common)
        try:
            result["docker"] = {"nodes": 5, **measure(stack)}
        finally:
            stack.destroy_and_remove()

    with tempfile.TemporaryDirectory() as state:
        servers = SshServers("tsbssh", make_key(Path(state) / "key"), docker.from_env())
        servers.remove()
        try:
            started = time.perf_counter()
            servers.start(list(SSH_ROLES))
            servers.wait_ready(list(SSH_ROLES))
            sshd_s = round(time.perf_counter() - started, 2)
            stack = Stack(Path(state) / "state", prefix="tsbssh")
            stack.init(target="ssh", **common)
            stack.run(
                "config", "set", "trainstack:servers", json.dumps(servers.server_records(SSH_ROLES))
            )
            try:
                result["ssh"] = {
                    "nodes": len(SSH_ROLES),
                    "sshd_containers_ready_s": sshd_s,
                    **measure(stack),
                }
            finally:
                stack.destroy_and_remove()
        finally:
            servers.remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
