#!/usr/bin/env python3
"""The data stage reading from the object store, beside Spark's own floor; one command, JSON out.

    python bench/bench_s3_data.py --out bench/results/bench_s3_data.json \
        [--rows 3000000] [--features 32]

Brings up a default stack of its own (object store on, no declared job, batches of 4096; the
node image as `make up` has it), then, side by side in one run:

- a seeded Parquet set (float32 f0..f{n-1} and a float32 label `progression`; ~128 MB files,
  ~8 MiB row groups), made here once; its size;
- `trainstack data put` of it to s3://<bucket>/bench/data/ (wall time, MB/s), and a copy onto
  the shared storage (/srv/trainstack/data/bench/data/, every node sees it);
- the floor: a plain PySpark application (spark-submit where the job's driver runs, on the
  first of `jobNodes` (control-3), as the job user, with the node's environment) that reads
  the set, takes every column's min and max in one aggregation and writes it as
  `repartition(<workers>)` Parquet to the shared storage; its
  wall time (spark-submit start to exit) and its read + aggregate + write inside it, for
  s3a:// and for file:// ;
- the data stage: examples/regression submitted with `--data <the set> --epochs 1`, for
  s3a:// and for the shared storage; its own seconds from metrics.json (`data_seconds`: from
  the data stage's start, after the SparkContext exists, to its shards written; and
  `time_split.data`: the same less the Spark SQL session's start and the slot check), its
  `data_path`, MB/s, and its ratio to the floor's in-app and whole-app times.

The issue's bar (issue 48): the data stage takes at most 1.3x as long as the floor. The stack
is destroyed at the end.
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

from bench.common import emit
from infra.jobs.remote import JOB_USER, NODE_ENV
from infra.nodes import NODE_PATHS
from tests.support.stacks import ROOT, Stack

EXAMPLE = ROOT / "examples" / "regression"
# No declared job, and batches of 4096: the bench measures the data stage, and the epoch after
# it then takes seconds instead of minutes (the digits would not fill a batch this size).
CONFIG = {
    "uiPortBase": "0",
    "monitoringPort": "0",
    "train": "false",
    "trainEpochs": "1",
    "trainBatchSize": "4096",
}
SHARED = f"{NODE_PATHS.data_dir}/bench"  # the bench's directory on the shared storage
DATA = f"{SHARED}/data"
SPARK_SUBMIT = f"{NODE_PATHS.venv_dir}/bin/spark-submit"  # the venv's pyspark
FILE_MB = 128
ROW_GROUP_MIB = 8

# The floor: read, every column's min and max in one aggregation, one partition per worker.
FLOOR = """
import json, sys, time
t0 = time.perf_counter()
from pyspark.sql import SparkSession, functions as F
src, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = SparkSession.builder.appName("bench-floor").getOrCreate()
sc = spark.sparkContext
session_s = time.perf_counter() - t0
mark = time.perf_counter()
# Wait for the executors (the warm runner may hold the cores until it yields them).
while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < workers:
    if time.perf_counter() - mark > 300:
        break
    time.sleep(0.1)
executors_wait_s = time.perf_counter() - mark
mark = time.perf_counter()
df = spark.read.parquet(src)
aggs = [F.min(c).alias("min_" + c) for c in df.columns]
aggs += [F.max(c).alias("max_" + c) for c in df.columns]
row = df.agg(F.count(F.lit(1)).alias("rows"), *aggs).collect()[0]
agg_s = time.perf_counter() - mark
w = time.perf_counter()
df.repartition(workers).write.mode("overwrite").parquet(out)
write_s = time.perf_counter() - w
work_s = time.perf_counter() - mark
spark.stop()
print("FLOOR " + json.dumps({
    "rows": row["rows"], "session_s": session_s, "executors_wait_s": executors_wait_s,
    "read_aggregate_s": agg_s, "write_s": write_s, "in_app_s": work_s,
    "driver_total_s": time.perf_counter() - t0,
}))
"""


def cli(stack: Stack, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra.jobs.cli", "-s", stack.name, *args],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"docker {' '.join(args[:3])} failed: {proc.stdout}{proc.stderr}")
    return proc.stdout


def wait_for_other_stacks(timeout: float = 3600) -> None:
    """The machine is small: wait until bench_object_store's stacks (tsbos-*) are gone."""
    deadline = time.monotonic() + timeout
    while docker("ps", "-q", "--filter", "name=tsbos", check=False).strip():
        if time.monotonic() > deadline:
            raise SystemExit("tsbos-* containers still running")
        time.sleep(10)


def make_data(root: Path, rows: int, features: int) -> tuple[int, int]:
    """The seeded set under `root`: (files, bytes)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(48)
    width = (features + 1) * 4
    group = max(1, (ROW_GROUP_MIB << 20) // width)
    per_file = max(group, (FILE_MB * 10**6 // width) // group * group)
    weights = rng.normal(size=features).astype(np.float32)
    names = [f"f{i}" for i in range(features)] + ["progression"]
    done = n = 0
    while done < rows:
        writer = None
        take = min(per_file, rows - done)
        for start in range(0, take, group):
            k = min(group, take - start)
            x = rng.normal(size=(k, features)).astype(np.float32)
            y = (x @ weights + rng.normal(scale=0.1, size=k)).astype(np.float32)
            table = pa.table([*(x[:, i] for i in range(features)), y], names=names)
            if writer is None:
                writer = pq.ParquetWriter(
                    root / f"part-{n:05d}.parquet", table.schema, use_dictionary=False
                )
            writer.write_table(table, row_group_size=group)
        assert writer is not None
        writer.close()
        done += take
        n += 1
    return n, sum(p.stat().st_size for p in root.glob("*.parquet"))


def floor(container: str, master: str, src: str, out: str, workers: int) -> dict[str, Any]:
    """spark-submit of the floor script on `container` as the job user; its timings."""
    env = [f"--env={k}={v}" for k, v in NODE_ENV.items()]
    command = [SPARK_SUBMIT, "--master", master, f"{SHARED}/floor.py", src, out, str(workers)]
    start = time.perf_counter()
    proc = subprocess.run(
        ["docker", "exec", "-u", JOB_USER, *env, container, *command],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    app_s = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("FLOOR ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"floor {src} failed:\n{proc.stdout[-3000:]}{proc.stderr[-5000:]}")
    inner = json.loads(lines[-1].removeprefix("FLOOR "))
    return {"app_s": round(app_s, 2), **{k: round(v, 2) for k, v in inner.items()}}


def data_stage(stack: Stack, control: str, data: str, tries: int = 3) -> dict[str, Any]:
    """examples/regression on `data`, 1 epoch: its data stage from metrics.json. A job that
    fails (e.g. too few free slots while another application's cores are being released) is
    submitted again after 30 s, up to `tries` times; the failures are kept."""
    failures: list[str] = []
    for _ in range(tries):
        start = time.perf_counter()
        proc = cli(stack, "submit", str(EXAMPLE), "--data", data, "--epochs", "1")
        if proc.returncode != 0:
            raise SystemExit(f"submit failed: {proc.stdout}{proc.stderr}")
        job_id = proc.stdout.strip().splitlines()[-1].split()[0]
        deadline = time.monotonic() + 1800
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            record = json.loads(cli(stack, "status", job_id, "--json").stdout or "{}")
            if record.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(1)
        job_s = time.perf_counter() - start
        if record.get("state") == "succeeded":
            break
        logs = cli(stack, "logs", job_id).stdout
        error = next((ln for ln in reversed(logs.splitlines()) if '"error"' in ln), logs[-500:])
        failures.append(f"{job_id}: {record.get('state')}: {error[:400]}")
        print(f"job {job_id} on {data} failed, again in 30 s:\n{logs[-3000:]}", file=sys.stderr)
        time.sleep(30)
    else:
        raise SystemExit(f"the job on {data} failed {tries} times: {failures}")
    metrics = json.loads(
        docker("exec", control, "cat", f"{NODE_PATHS.models_dir}/{job_id}/metrics.json")
    )
    phases = metrics.get("job_phases", {})
    return {
        "job_id": job_id,
        "data_path": metrics.get("data_path"),
        "data_seconds": round(float(metrics["data_seconds"]), 2),
        "time_split_data_s": metrics["time_split"]["data"],
        "data_rows": metrics.get("data_rows"),
        "phases": {k: round(float(v), 2) for k, v in phases.items()},
        "spark_application": metrics.get("spark_application"),
        "total_seconds": round(float(metrics["total_seconds"]), 2),
        "submit_to_final_s": round(job_s, 1),
        "failed_tries": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--features", type=int, default=32)
    args = parser.parse_args()
    result: dict[str, Any] = {"config": CONFIG, "rows": args.rows, "features": args.features}
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "data"
        local.mkdir()
        start = time.perf_counter()
        files, size = make_data(local, args.rows, args.features)
        mb = size / 1e6
        result["data"] = {
            "files": files,
            "MB": round(mb, 1),
            "generate_s": round(time.perf_counter() - start, 1),
        }
        print(f"data set: {files} files, {mb:.1f} MB", file=sys.stderr)

        wait_for_other_stacks()
        stack = Stack(Path(tmp) / "state", prefix="tsbs3")
        try:
            stack.init(**CONFIG)
            start = time.monotonic()
            stack.up()
            result["up_s"] = round(time.monotonic() - start, 1)
            outputs = json.loads(stack.run("stack", "output", "--json").stdout)
            nodes = {n["name"]: n["container"] for n in outputs["nodes"]}
            workers = sorted(c for name, c in nodes.items() if name.startswith("worker"))
            control = sorted(c for name, c in nodes.items() if name.startswith("control"))
            master, bucket = outputs["sparkMasterUrl"], outputs["objectStoreBucket"]
            # The floor's driver where the job's runs: the first of jobNodes (the drivers' node).
            drivers = outputs["jobNodes"][0]["container"]
            s3a = f"s3a://{bucket}/bench/data/"

            # upload, and the copy onto the shared storage
            start = time.perf_counter()
            put = cli(stack, "data", "put", str(local), f"s3://{bucket}/bench/data/")
            put_s = time.perf_counter() - start
            if put.returncode != 0:
                raise SystemExit(f"data put failed: {put.stdout}{put.stderr}")
            result["put"] = {"s": round(put_s, 2), "MBps": round(mb / put_s, 1)}
            (Path(tmp) / "floor.py").write_text(FLOOR)
            start = time.perf_counter()
            docker("exec", control[-1], "mkdir", "-p", SHARED)
            docker("cp", str(local), f"{control[-1]}:{DATA}")
            docker("cp", str(Path(tmp) / "floor.py"), f"{control[-1]}:{SHARED}/floor.py")
            docker("exec", control[-1], "chown", "-R", f"{JOB_USER}:{JOB_USER}", SHARED)
            result["shared_copy_s"] = round(time.perf_counter() - start, 2)
            print(f"uploaded: {result['put']}", file=sys.stderr)

            runs: dict[str, Any] = {}
            result["runs"] = runs
            for kind, floor_src, job_src in (
                ("s3a", s3a, s3a),
                ("shared", f"file://{DATA}/", f"{DATA}/"),
            ):
                out = f"file://{SHARED}/floor-{kind}"
                f = floor(drivers, master, floor_src, out, len(workers))
                print(f"floor {kind}: {f}", file=sys.stderr)
                d = data_stage(stack, control[-1], job_src)
                print(f"data stage {kind}: {d}", file=sys.stderr)
                runs[kind] = {
                    "floor": {**f, "in_app_MBps": round(mb / f["in_app_s"], 1)},
                    "data_stage": {
                        **d,
                        "MBps": round(mb / d["data_seconds"], 1),
                        "ratio_to_floor_in_app": round(d["data_seconds"] / f["in_app_s"], 2),
                        "ratio_to_floor_app": round(d["data_seconds"] / f["app_s"], 2),
                        "work_ratio_to_floor_in_app": round(
                            d["time_split_data_s"] / f["in_app_s"], 2
                        ),
                    },
                }
            result["workers"] = len(workers)
        except SystemExit as exc:  # keep what was measured
            result["error"] = str(exc)[-3000:]
            raise
        finally:
            stack.destroy_and_remove()
            emit(result, args.out)


if __name__ == "__main__":
    main()
