#!/usr/bin/env python3
"""What the object store costs a stack, and its S3 throughput; one command, JSON out.

    python bench/bench_object_store.py --out bench/results/bench_object_store.json [--rounds 2]

Side by side in one run, default stacks with `trainstack:objectStore` off and on, alternated
(`--rounds` of each; training off: the job's time does not depend on the store; provisioning
on, from the baked node image, which `make images` makes beforehand):

- `up_s`: `pulumi up` from nothing to provisioned nodes, and its median per setting;
- `idle_memory_mib`: after 60 s idle, the memory every container of the stack uses (the
  engine's figure less the page cache), summed; and the store's own resident memory and CPU
  over those 60 s;
- `s3`: on the last stack with the store, a `--mib` MiB object written to and read back from
  `objectStoreUrl` with pyarrow's S3 filesystem, from this machine, in MB/s.

The issue's bar (issue 48): at most 10 s more `up`, at most 300 MB more idle memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import docker

from bench.common import emit
from tests.support.stacks import Stack

IDLE_S = 60


def _container_memory(container: Any) -> int:
    """Bytes in use less the page cache (cgroup v1 `cache`, v2 `inactive_file`)."""
    stats = container.stats(stream=False)["memory_stats"]
    inner = stats.get("stats", {})
    cache = inner.get("cache", inner.get("inactive_file", 0))
    return int(stats.get("usage", 0)) - int(cache)


def _store_process(container: Any) -> tuple[int, float]:
    """The store's resident KiB and its CPU seconds so far (utime + stime)."""
    _code, out = container.exec_run(
        [
            "sh",
            "-c",
            "p=$(pgrep -f 'bin/weed' | head -1); grep VmRSS /proc/$p/status; "
            "cut -d' ' -f14,15 /proc/$p/stat",
        ]
    )
    lines = out.decode().split("\n")
    rss = int(lines[0].split()[1])
    ticks = sum(int(v) for v in lines[1].split())
    return rss, ticks / os.sysconf("SC_CLK_TCK")


def _s3(outputs: dict[str, Any], mib: int) -> dict[str, float]:
    from pyarrow import fs

    s3 = fs.S3FileSystem(
        access_key=outputs["objectStoreAccessKey"],
        secret_key=outputs["objectStoreSecretKey"],
        endpoint_override=outputs["objectStoreUrl"].removeprefix("http://"),
        scheme="http",
        region="us-east-1",
        force_virtual_addressing=False,
    )
    path = f"{outputs['objectStoreBucket']}/bench/blob"
    chunk = os.urandom(8 << 20)
    start = time.perf_counter()
    with s3.open_output_stream(path) as out:
        for _ in range(mib // 8):
            out.write(chunk)
    put_s = time.perf_counter() - start
    start = time.perf_counter()
    with s3.open_input_stream(path) as inp:
        while inp.read(8 << 20):
            pass
    get_s = time.perf_counter() - start
    size_mb = (mib // 8) * 8 * 1.048576
    return {
        "mib": (mib // 8) * 8,
        "put_MBps": round(size_mb / put_s, 1),
        "get_MBps": round(size_mb / get_s, 1),
    }


def measure(store: bool, mib: int, client: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbos")
        try:
            stack.init(objectStore=str(store).lower(), train="false", uiPortBase="0")
            start = time.monotonic()
            stack.up()
            up_s = time.monotonic() - start
            outputs = json.loads(stack.run("stack", "output", "--json", "--show-secrets").stdout)
            containers = client.containers.list(filters={"label": stack.selector})
            store_node = next((c for c in containers if c.name.endswith("control-1")), None)
            before = _store_process(store_node) if store and store_node else None
            time.sleep(IDLE_S)
            result: dict[str, Any] = {
                "object_store": store,
                "up_s": round(up_s, 1),
                "idle_memory_mib": round(sum(_container_memory(c) for c in containers) / 2**20),
            }
            if store and store_node and before:
                rss, cpu = _store_process(store_node)
                result["store_rss_mib"] = round(rss / 1024)
                result["store_idle_cpu_share"] = round((cpu - before[1]) / IDLE_S, 4)
                result["s3"] = _s3(outputs, mib)
            return result
        finally:
            stack.destroy_and_remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mib", type=int, default=256, help="size of the S3 object")
    args = parser.parse_args()
    client = docker.from_env()
    runs = [measure(store, args.mib, client) for _ in range(args.rounds) for store in (False, True)]

    def median(store: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["object_store"] is store)

    emit(
        {
            "what": "default stack, provisioned, no training; objectStore off vs on, alternated",
            "runs": runs,
            "up_s_median": {"off": median(False, "up_s"), "on": median(True, "up_s")},
            "up_s_added": round(median(True, "up_s") - median(False, "up_s"), 1),
            "idle_memory_mib_added": round(
                median(True, "idle_memory_mib") - median(False, "idle_memory_mib")
            ),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
