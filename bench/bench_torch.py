"""PyTorch jobs on the default stack (docs/jobs.md, "PyTorch jobs"; issue 39), side by side in
one run: trainstack's torch digits job against the same model and loop through a plain
`TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(fn)` from a PySpark
driver on a node, which is what a Spark user writes without trainstack.

    python bench/bench_torch.py --out bench/results/bench_torch.json [--cycles 3] [--warm 5]

Brings up a default stack of its own (2 workers), then:
- the first torch job: its one-time cost (resolving torch here, shipping and installing it on
  the cluster's shared storage) and its whole time;
- `--cycles` times: the plain TorchDistributor application on control-3 (the idle warm runner
  yields its cores to it), then trainstack's torch job after it (its runner starts again),
  then `--warm` warm jobs: submit to the first training step, and each job's whole time;
- the ratios: trainstack's whole job (cold and warm) over the plain application's.
Every job trains the digits for 10 epochs on two ranks. No job may fail. The stack is
destroyed at the end. Two ranks against one process on the same cores (scaling) is
bench/bench_training.py's, with `--job examples/digits-torch`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_runner import run_job
from bench.common import emit, median
from infra.jobs.envs import resolve
from infra.nodes import NODE_PATHS
from tests.support.stacks import ROOT, Stack

CONFIG = {"uiPortBase": "0", "monitoringPort": "0", "trainWorkers": "2"}
DRIVER_NODE = "control-3"
TORCH_JOB = ROOT / "examples" / "digits-torch"
EPOCHS = 10
# The plain application: the digits (scaled to [0, 1] as trainstack's data stage does), the
# same split sizes, model, optimizer, batch and epochs as the torch example in simple mode,
# written as a TorchDistributor user writes it.
PLAIN = """
import json, sys, time
site, name, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, site)
from pyspark.sql import SparkSession
from pyspark.ml.torch.distributor import TorchDistributor

spark = (SparkSession.builder.appName(name).config("spark.driver.memory", "512m")
         .config("spark.executorEnv.PYTHONPATH", site).config("spark.ui.enabled", "false")
         .config("pytorch.spark.distributor.ignoreSsl", "true").getOrCreate())
up = time.time()

def train(epochs):
    import time
    import numpy as np
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(42)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(42).permutation(len(x))
    val, rest = order[:352], order[352:]
    mine = rest[rank::world]
    xs, ys = torch.tensor(x[mine]), torch.tensor(y[mine]).long()
    xv, yv = torch.tensor(x[val]), torch.tensor(y[val]).long()
    nn = torch.nn
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    steps = (len(rest) // world) // 32
    first = None
    for epoch in range(epochs):
        ddp.train()
        perm = torch.randperm(len(xs), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            idx = perm[step * 32:(step + 1) * 32]
            if first is None:
                first = time.time()
            loss = loss_fn(ddp(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(xv).argmax(dim=1) == yv).float().mean())
    dist.destroy_process_group()
    return {"first_step": first, "accuracy": accuracy}

out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, epochs)
print(json.dumps({"event": "done", "up": up, "first_step": out["first_step"],
                  "accuracy": out["accuracy"], "ended": time.time()}), flush=True)
spark.stop()
"""


def plain_torch_distributor(stack: Stack, site: str) -> dict[str, Any]:
    container = f"{stack.label}-{DRIVER_NODE}"
    submitted = time.time()
    proc = subprocess.run(
        [
            "docker", "exec", "-u", "trainstack", container,
            "env", f"SPARK_CONF_DIR={NODE_PATHS.spark_conf_dir}",
            f"PYSPARK_PYTHON={NODE_PATHS.venv_dir}/bin/python",
            f"{NODE_PATHS.venv_dir}/bin/python", "-c", PLAIN, site,
            f"plain-torch-{int(submitted)}", str(EPOCHS),
        ],
        capture_output=True, text=True, errors="replace", timeout=900, check=False,
    )  # fmt: skip
    done = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith('{"event"')]
    if proc.returncode != 0 or not done:
        raise SystemExit(f"the plain TorchDistributor run failed:\n{proc.stderr[-4000:]}")
    end = done[-1]
    return {
        "whole_s": round(end["ended"] - submitted, 2),
        "submit_to_first_step_s": round(end["first_step"] - submitted, 2),
        "context_up_s": round(end["up"] - submitted, 2),
        "accuracy": end["accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--warm", type=int, default=5)
    args = parser.parse_args()
    result: dict[str, Any] = {"config": CONFIG, "epochs": EPOCHS, "cycles": args.cycles}
    epochs = ("--epochs", str(EPOCHS))
    env = resolve(TORCH_JOB, "requirements.txt")
    assert env is not None
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp) / "state", prefix="tsbench")
        try:
            stack.init(**CONFIG)
            stack.up()
            result["tensorflow_job"] = run_job(stack, ROOT / "examples" / "digits", *epochs)
            first = time.time()
            result["first_torch_job"] = run_job(stack, TORCH_JOB, *epochs)
            result["first_torch_job"]["submit_to_end_s"] = round(time.time() - first, 2)
            cycles = []
            for _ in range(args.cycles):
                plain = plain_torch_distributor(stack, env.site)
                after = run_job(stack, TORCH_JOB, *epochs)
                warm = [run_job(stack, TORCH_JOB, *epochs) for _ in range(args.warm)]
                cycles.append({"plain": plain, "job_after_plain": after, "warm": warm})
            result["cycles"] = cycles
            plains = [c["plain"] for c in cycles]
            colds = [c["job_after_plain"] for c in cycles]
            warms = [w for c in cycles for w in c["warm"]]
            plain_whole = median(plains, "whole_s")
            result["median"] = {
                "plain_whole_s": plain_whole,
                "plain_submit_to_first_step_s": median(plains, "submit_to_first_step_s"),
                "trainstack_cold_whole_s": median(colds, "whole_job_s"),
                "trainstack_warm_whole_s": median(warms, "whole_job_s"),
                "trainstack_warm_submit_to_first_step_s": median(warms, "submit_to_first_step_s"),
                "trainstack_torch_accuracy": median(warms, "accuracy"),
                "plain_accuracy": median(plains, "accuracy"),
            }
            m = result["median"]
            m["ratio_cold_over_plain"] = round(m["trainstack_cold_whole_s"] / plain_whole, 3)
            m["ratio_warm_over_plain"] = round(m["trainstack_warm_whole_s"] / plain_whole, 3)
            print(
                f"whole job: trainstack cold {m['trainstack_cold_whole_s']} s, warm "
                f"{m['trainstack_warm_whole_s']} s, plain TorchDistributor {plain_whole} s "
                f"(ratios {m['ratio_cold_over_plain']}, {m['ratio_warm_over_plain']})",
                file=sys.stderr,
            )
        finally:
            stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
