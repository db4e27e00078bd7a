#!/usr/bin/env python3
"""Streamed input against in-memory input (docs/training.md, "Streaming"); one command, JSON out.

    python bench/bench_stream.py --out bench/results/bench_stream.json [--rows 1200000]

In Spark local mode on this machine (local[2], two workers of one core each), side by side in
one run, on generated data (`--features` float32 features, a label of 10 classes, Parquet,
written once), the digits examples' MLP (simple mode; examples/digits, examples/digits-torch):

- throughput: samples/s of the training steps, in memory and streamed, on a tenth of the rows
  (a set both hold), for TensorFlow and, when its overlay is cached, torch; the streamed share
  of the in-memory samples/s;
- memory flat in data size: each worker's peak resident memory streamed on `--rows` rows and on
  a tenth of them, and in memory on `--rows` rows, for contrast; the in-memory arrays' own size.

Not measured here: the stack's 2 GiB workers and an object store (the stack declares none
yet); the data stage's MB/s beside plain PySpark (bench_jobs.py measures the data stage).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit

ROOT = Path(__file__).resolve().parents[1]
JOBS = {"tensorflow": ROOT / "examples" / "digits", "torch": ROOT / "examples" / "digits-torch"}


def write_data(path: Path, rows: int, features: int) -> float:
    """Ten classes, each row's the largest of ten noisy linear scores; returns the Parquet
    set's size in MB."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(features, 10)).astype(np.float32)
    step = 200_000
    for k, first in enumerate(range(0, rows, step)):
        n = min(step, rows - first)
        x = rng.random((n, features), dtype=np.float32)
        scores = x @ weights + rng.normal(scale=0.1, size=(n, 10)).astype(np.float32)
        cols = {f"f{i}": x[:, i] for i in range(features)}
        cols["label"] = scores.argmax(axis=1).astype(np.int32)
        pq.write_table(pa.table(cols), path / f"part-{k:05d}.parquet")
    return round(sum(f.stat().st_size for f in path.glob("*.parquet")) / 1e6, 1)


def run_job(
    data: Path, out: Path, stream: str, epochs: int, framework: str, extra: list[str]
) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "trainstack_training", "--job-dir", str(JOBS[framework]),
        "--data", str(data), "--master", "local[2]", "--workers", "2",
        "--epochs", str(epochs), "--batch-size", "256", "--data-stream", stream,
        "--no-plot", "--output", str(out), *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({stream}, {data.name}):\n{proc.stdout[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {
        "input": metrics["input"],
        "samples_per_second": round(metrics["samples_per_second"], 1),
        "peak_rss_mb_per_worker": [round(v, 1) for v in metrics["peak_rss_mb_per_worker"]],
        "input_wait_s": metrics["time_split"]["input_wait"],
        "final": metrics["final"],
        "wall_s": round(wall, 1),
        "in_memory_mb": metrics["worker_input"][0].get("in_memory_mb"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", type=int, default=1_200_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count()},
        "rows": args.rows,
        "features": args.features,
        "batch_size": 256,
        "workers": 2,
    }
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        base = Path(tmp)
        big, small = base / "big", base / "small"
        result["parquet_mb"] = {
            "big": write_data(big, args.rows, args.features),
            "small": write_data(small, args.rows // 10, args.features),
        }
        runs: dict[str, Any] = {}
        frameworks: list[tuple[str, list[str]]] = [("tensorflow", [])]
        torch_site = _torch_site()
        if torch_site:
            frameworks.append(("torch", ["--job-env", torch_site]))
        for name, extra in frameworks:
            for stream in ("off", "on"):
                key = f"{name}_small_{'memory' if stream == 'off' else 'stream'}"
                runs[key] = run_job(small, base / key, stream, args.epochs, name, extra)
        runs["tensorflow_big_stream"] = run_job(big, base / "bs", "on", 1, "tensorflow", [])
        runs["tensorflow_big_memory"] = run_job(big, base / "bm", "off", 1, "tensorflow", [])
        result["runs"] = runs
        result["streamed_share_of_in_memory_samples_per_second"] = {
            name: round(
                runs[f"{name}_small_stream"]["samples_per_second"]
                / runs[f"{name}_small_memory"]["samples_per_second"],
                3,
            )
            for name, _ in frameworks
        }
        result["peak_rss_mb"] = {
            "stream_big": max(runs["tensorflow_big_stream"]["peak_rss_mb_per_worker"]),
            "stream_small": max(runs["tensorflow_small_stream"]["peak_rss_mb_per_worker"]),
            "memory_big": max(runs["tensorflow_big_memory"]["peak_rss_mb_per_worker"]),
        }
    emit(result, args.out)


def _torch_site() -> str:
    """The torch overlay of the tests, when it is cached (building it takes minutes)."""
    from tests.support.overlays import TORCH_OVERLAYS

    sites = sorted(TORCH_OVERLAYS.glob("*/.complete"))
    return str(sites[-1].parent / "site") if sites else ""


if __name__ == "__main__":
    main()
