#!/usr/bin/env python3
"""Benchmark the training package; one command, JSON out.

    python bench/bench_training.py --out bench-training.json

Measures, in Spark local mode on this machine:
  * training samples/s with 1 and with 2 TensorFlow workers, one core each (pinned), and the
    peak memory (VmHWM) of each worker process;
  * the data stage's rows/s at 1e5 and 1e6 rows (generated digits, generation time excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def bench_training(workers: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out = root / f"train-{workers}w"
    cmd = [
        sys.executable, "-m", "trainstack_training",
        "--master", f"local[{max(2, workers)}]",
        "--workers", str(workers),
        "--cores-per-worker", "1",
        "--pin-cores",
        "--epochs", str(args.epochs),
        "--rows", str(args.train_rows),
        "--batch-size", str(args.batch_size),
        "--output", str(out),
        "--no-plot",
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        raise SystemExit(f"training run failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads(Path(summary["metrics_path"]).read_text())
    return {
        "workers": workers,
        "cores_per_worker": 1,
        "rows": metrics["data_rows"],
        "epochs": metrics["epochs"],
        "per_worker_batch": args.batch_size,
        "global_batch": metrics["global_batch"],
        "samples_per_second": metrics["samples_per_second"],
        "final_val_accuracy": metrics["final_val_accuracy"],
        "peak_rss_mb_per_worker": metrics["peak_rss_mb_per_worker"],
        "data_seconds": metrics["data_seconds"],
        "train_stage_seconds": metrics["train_seconds"],
        "command_seconds": time.perf_counter() - start,
    }


def bench_data(sizes: list[int], args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    from trainstack_training.config import TrainConfig
    from trainstack_training.data import generate_digits, prepare
    from trainstack_training.launcher import build_session

    base = TrainConfig(
        master=args.data_master, workers=2, output=str(root / "data"),
        spark_conf=f"spark.driver.memory={args.driver_memory}",
    )  # fmt: skip
    spark = build_session(base)
    results = []
    try:
        # Warm-up on the 1797 digits: the first Spark job pays JVM and codegen start-up.
        prepare(spark, base, root / "data" / "warmup")
        for rows in sizes:
            src = root / "data" / f"src-{rows}"
            t0 = time.perf_counter()
            generate_digits(src, rows=rows, seed=base.seed)
            gen_seconds = time.perf_counter() - t0
            cfg = TrainConfig(**{**base.to_dict(), "data": str(src)})
            info = prepare(spark, cfg, root / "data" / f"out-{rows}")
            results.append(
                {
                    "rows": rows,
                    "seconds": info.seconds,
                    "rows_per_second": rows / info.seconds,
                    "generate_seconds": gen_seconds,
                    "shard_rows": info.shard_rows,
                    "val_rows": info.val_rows,
                }
            )
    finally:
        spark.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-training.json", help="JSON output file")
    parser.add_argument(
        "--train-rows",
        type=int,
        default=20_000,
        help="rows of generated digits for the training runs",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="per-worker batch")
    parser.add_argument("--workers", default="1,2", help="worker counts to train with")
    parser.add_argument(
        "--data-rows", default="100000,1000000", help="row counts for the data-stage benchmark"
    )
    parser.add_argument("--data-master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--workdir", default="", help="scratch directory (default: a temp dir)")
    args = parser.parse_args()

    root = Path(args.workdir or tempfile.mkdtemp(prefix="trainstack-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    training = [bench_training(int(w), args, root) for w in args.workers.split(",") if w]
    data = bench_data([int(r) for r in args.data_rows.split(",") if r], args, root)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "training": training,
        "data_stage": data,
        "bench_seconds": time.perf_counter() - started,
        "workdir": str(root),
    }
    text = json.dumps(result, indent=2)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
