#!/usr/bin/env python3
"""A data set twice a worker's memory limit, trained from the object store; one command, JSON out.

    python bench/bench_big_data.py --out bench/results/bench_big_data.json \
        [--rows 30300000] [--features 32] [--batch-size 4096]

Brings up a default stack of its own (2 workers with their 2 GiB limit, the object store on,
`trainBatchSize` as given, no declared job), then, side by side in one run:

- a seeded Parquet set of `--rows` rows (float32 f0..f{n-1} and a float32 label
  `progression`, ~132 B a row: 30.3 M rows are 4.0 GB; ~128 MB files, ~8 MiB row groups), made
  here, and a tenth of it (its first files); both put to the stack's store with
  `trainstack data put`;
- examples/regression submitted on each, one epoch, from s3a://: the tenth with
  `--data-stream on`, the whole set with the default (`auto`, which must choose to stream);
- while each job runs, each worker container's memory and that of the job drivers' node
  (control-3, the first of `jobNodes`), read from its cgroup every second on this machine:
  the peak of its working set (usage less inactive file cache, as `docker stats` counts it),
  of its resident memory (`total_rss`), its limit and its OOM kills; and from the job's
  metrics.json each rank's own peak (VmHWM), its input (memory or stream) and why, the
  data stage's and the barrier stage's seconds, the rows and the final metrics;
- every 5 s, each of those nodes' process table (`ps` in the container): the one whose resident
  total was the largest is kept, its processes named by what they are (the executor's JVM,
  the Spark worker, the warm runner's driver, the preloaded framework daemon, a rank...), so
  the peak is itemised. Resident sizes count a forked process's shared pages in each process.

The issue's bar (issue 48): at least one epoch trains on two workers, each worker's peak under
its limit (and the drivers' node's under its own), and the peak about the same for a tenth of
the data. The stack is destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_s3_data import EXAMPLE, cli, docker, make_data, wait_for_other_stacks
from bench.common import emit
from infra.nodes import NODE_PATHS
from tests.support.stacks import Stack

CGROUP = Path("/sys/fs/cgroup/memory/docker")  # cgroup v1 with the cgroupfs driver, as here
MIB = 1 << 20
# What a node's processes are, by a piece of their command line (the first that matches).
PROCESS_KINDS = (
    ("CoarseGrainedExecutorBackend", "executor JVM"),
    ("deploy.worker.Worker", "Spark worker JVM"),
    ("SparkSubmit", "driver JVM (spark-submit)"),
    ("trainstack_training.daemon", "preloaded framework daemon and its ranks"),
    ("trainstack-train", "trainstack-train (the job's driver)"),
    ("trainstack_training.warm", "warm runner (Python)"),
    ("trainstack_training.queue", "job queue (Python)"),
)


class MemorySampler:
    """Each container's memory every `every` seconds, from its cgroup, until `stop()`."""

    def __init__(self, containers: dict[str, str], every: float = 1.0) -> None:
        self.ids = {
            name: docker("inspect", "-f", "{{.Id}}", container).strip()
            for name, container in containers.items()
        }
        for name, full in self.ids.items():
            if not (CGROUP / full).is_dir():
                raise SystemExit(f"no cgroup v1 memory directory for {name}: {CGROUP / full}")
        self.every = every
        self.peaks: dict[str, dict[str, float]] = {n: {} for n in self.ids}
        self.start_oom = {n: self._oom_kills(n) for n in self.ids}
        self._stop = threading.Event()
        self.tables: dict[str, dict[str, Any]] = {n: {"total_mb": 0.0} for n in self.ids}
        self._threads = [
            threading.Thread(target=self._run, daemon=True),
            threading.Thread(target=self._run_ps, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, name: str) -> dict[str, float]:
        base = CGROUP / self.ids[name]
        stat = dict(
            (k, int(v))
            for k, v in (ln.split() for ln in (base / "memory.stat").read_text().splitlines())
        )
        usage = int((base / "memory.usage_in_bytes").read_text())
        return {
            "working_set_mb": (usage - stat.get("total_inactive_file", 0)) / MIB,
            "rss_mb": stat.get("total_rss", 0) / MIB,
            "usage_with_cache_mb": usage / MIB,
        }

    def _oom_kills(self, name: str) -> int:
        text = (CGROUP / self.ids[name] / "memory.oom_control").read_text()
        return int(dict(ln.split() for ln in text.splitlines()).get("oom_kill", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for name in self.ids:
                try:
                    seen = self._read(name)
                except OSError:
                    continue
                peaks = self.peaks[name]
                for key, value in seen.items():
                    peaks[key] = max(peaks.get(key, 0.0), value)

    def _run_ps(self, every: float = 5.0) -> None:
        while not self._stop.wait(every):
            for name, full in self.ids.items():
                try:
                    text = docker("exec", full, "ps", "-ww", "-eo", "rss=,args=", check=False)
                except OSError:
                    continue
                kinds: dict[str, float] = {}
                for line in text.splitlines():
                    rss, _, args = line.strip().partition(" ")
                    if not rss.isdigit() or args.startswith("ps "):
                        continue
                    kind = next((k for key, k in PROCESS_KINDS if key in args), args[:60])
                    kinds[kind] = kinds.get(kind, 0.0) + int(rss) / 1024
                total = sum(kinds.values())
                if total > self.tables[name]["total_mb"]:
                    self.tables[name] = {
                        "total_mb": round(total, 1),
                        "processes_mb": {
                            k: round(v, 1)
                            for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
                            if v >= 5
                        },
                    }

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        out = {}
        for name, full in self.ids.items():
            limit = int((CGROUP / full / "memory.limit_in_bytes").read_text())
            out[name] = {
                **{f"peak_{k}": round(v, 1) for k, v in self.peaks[name].items()},
                "limit_mb": round(limit / MIB, 1),
                "oom_kills": self._oom_kills(name) - self.start_oom[name],
                "largest_process_table_rss": self.tables[name],
            }
        return out


def train(
    stack: Stack, control: str, data: str, sampled: dict[str, str], *extra: str
) -> dict[str, Any]:
    """examples/regression on `data`, one epoch, with the nodes' memory (`sampled`: the
    workers and the drivers' node) sampled meanwhile."""
    sampler = MemorySampler(sampled)
    start = time.perf_counter()
    proc = cli(stack, "submit", str(EXAMPLE), "--data", data, "--epochs", "1", *extra)
    if proc.returncode != 0:
        sampler.stop()
        raise SystemExit(f"submit failed: {proc.stdout}{proc.stderr}")
    job_id = proc.stdout.strip().splitlines()[-1].split()[0]
    record: dict[str, Any] = {}
    deadline = time.monotonic() + 3 * 3600
    while time.monotonic() < deadline:
        record = json.loads(cli(stack, "status", job_id, "--json").stdout or "{}")
        if record.get("state") in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(5)
    wall = time.perf_counter() - start
    memory = sampler.stop()
    result: dict[str, Any] = {
        "job_id": job_id,
        "state": record.get("state"),
        "submit_to_end_s": round(wall, 1),
        "nodes_memory": memory,
    }
    if record.get("state") != "succeeded":
        result["error"] = str(record.get("error", ""))[:2000]
        return result
    metrics = json.loads(
        docker("exec", control, "cat", f"{NODE_PATHS.models_dir}/{job_id}/metrics.json")
    )
    result.update(
        {
            "data_path": metrics.get("data_path"),
            "data_rows": metrics.get("data_rows"),
            "train_rows": metrics.get("train_rows"),
            "shard_rows": metrics.get("shard_rows"),
            "data_seconds": round(float(metrics["data_seconds"]), 1),
            "train_seconds": round(float(metrics["train_seconds"]), 1),
            "total_seconds": round(float(metrics["total_seconds"]), 1),
            "epochs": len(metrics.get("epoch_attempt", [])),
            "input": metrics.get("input"),
            "worker_input": metrics.get("worker_input"),
            "rank_peak_rss_mb": metrics.get("peak_rss_mb_per_worker"),
            "final": metrics.get("final"),
        }
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", type=int, default=30_300_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4096)
    args = parser.parse_args()
    config = {
        "uiPortBase": "0",
        "monitoringPort": "0",
        "train": "false",  # no declared job: the digits would not fill a batch this size
        "trainBatchSize": str(args.batch_size),
    }
    result: dict[str, Any] = {"config": config, "rows": args.rows, "features": args.features}
    with tempfile.TemporaryDirectory() as tmp:
        whole, tenth = Path(tmp) / "whole", Path(tmp) / "tenth"
        whole.mkdir()
        tenth.mkdir()
        start = time.perf_counter()
        files, size = make_data(whole, args.rows, args.features)
        parts = sorted(whole.glob("*.parquet"))
        for part in parts[: max(1, round(len(parts) / 10))]:
            os.link(part, tenth / part.name)
        tenth_size = sum(p.stat().st_size for p in tenth.glob("*.parquet"))
        result["data"] = {
            "files": files,
            "MB": round(size / 1e6, 1),
            "tenth_files": len(list(tenth.glob("*.parquet"))),
            "tenth_MB": round(tenth_size / 1e6, 1),
            "generate_s": round(time.perf_counter() - start, 1),
        }
        print(f"data: {result['data']}", file=sys.stderr, flush=True)

        wait_for_other_stacks()
        stack = Stack(Path(tmp) / "state", prefix="tsbbig")
        try:
            stack.init(**config)
            start = time.monotonic()
            stack.up()
            result["up_s"] = round(time.monotonic() - start, 1)
            outputs = json.loads(stack.run("stack", "output", "--json").stdout)
            nodes = {n["name"]: n["container"] for n in outputs["nodes"]}
            workers = {n: c for n, c in sorted(nodes.items()) if n.startswith("worker")}
            control = sorted(c for n, c in nodes.items() if n.startswith("control"))[-1]
            # The job drivers' node: the first of jobNodes (control-3 on the default stack).
            drivers = outputs["jobNodes"][0]["name"]
            sampled = {**workers, drivers: nodes[drivers]}
            result["drivers_node"] = drivers
            bucket = outputs["objectStoreBucket"]
            for name, local in (("tenth", tenth), ("whole", whole)):
                start = time.perf_counter()
                put = cli(stack, "data", "put", str(local), f"s3://{bucket}/bench/{name}/")
                if put.returncode != 0:
                    raise SystemExit(f"data put failed: {put.stdout}{put.stderr}")
                seconds = time.perf_counter() - start
                result[f"put_{name}_s"] = round(seconds, 1)
                print(f"put {name}: {seconds:.1f} s", file=sys.stderr, flush=True)
            shutil.rmtree(whole)
            runs: dict[str, Any] = {}
            result["runs"] = runs
            runs["tenth_streamed"] = train(
                stack, control, f"s3a://{bucket}/bench/tenth/", sampled, "--data-stream", "on"
            )
            print(f"tenth: {runs['tenth_streamed']}", file=sys.stderr, flush=True)
            runs["whole_auto"] = train(stack, control, f"s3a://{bucket}/bench/whole/", sampled)
            print(f"whole: {runs['whole_auto']}", file=sys.stderr, flush=True)
            result["workers"] = len(workers)
            small, big = runs["tenth_streamed"], runs["whole_auto"]
            if small.get("state") == big.get("state") == "succeeded":
                result["peak_working_set_mb"] = {
                    name: [
                        small["nodes_memory"][name]["peak_working_set_mb"],
                        big["nodes_memory"][name]["peak_working_set_mb"],
                    ]
                    for name in sampled
                }
                result["rank_peak_rss_mb"] = [small["rank_peak_rss_mb"], big["rank_peak_rss_mb"]]
        except SystemExit as exc:  # keep what was measured
            result["error"] = str(exc)[-3000:]
            raise
        finally:
            stack.destroy_and_remove()
            emit(result, args.out)


if __name__ == "__main__":
    main()
