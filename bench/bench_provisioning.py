"""Provisioning numbers, one command, JSON on stdout.

    .venv/bin/python bench/bench_provisioning.py [--strict-cold] [--no-pip-cache]

Measures on the default topology without monitoring (3 control + 2 worker containers from the
base image, a Docker-API test cluster with the program's inventory, infra.topology):
  wheelhouse_build_uncached_s  building the node wheelhouse into an empty directory
                               (pip's own download cache is used unless --no-pip-cache)
  wheelhouse_build_cached_s    the same call again (cache hit, keyed by the pinned versions)
  cold_provision_s             site.yml on fresh containers (wheelhouse already built)
  cold_provision_uncached_wheelhouse_s = wheelhouse_build_uncached_s + cold_provision_s
                               (with --strict-cold: a second fresh cluster provisioned right
                               after building a fresh wheelhouse, measured end to end)
  noop_rerun_s                 a second site.yml run (asserted changed=0 on every host)
  failover_s                   the ALIVE master's container is killed; time until a standby is
                               ALIVE with every worker re-registered
Containers, networks and temp wheelhouses are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra.config import StackConfig  # noqa: E402
from infra.provisioning import run_playbook  # noqa: E402
from infra.provisioning.wheelhouse import build_node_wheelhouse  # noqa: E402
from tests.support import cluster as cl  # noqa: E402
from tests.support.failover import measure_failover  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# Without the monitoring roles, as the cluster this bench used before: its numbers stay
# comparable with earlier runs.
CONFIG = StackConfig(monitoring=False)


def provision(name: str, wheelhouse: Path, workdir: Path) -> tuple[cl.Cluster, float]:
    cluster = cl.create(name, CONFIG)
    result = run_playbook(
        cluster.inventory(),
        "site.yml",
        extravars=cluster.extravars(wheelhouse),
        on_event=None,
        artifacts_dir=workdir / name,
    )
    if not result.ok:
        raise SystemExit(f"cold provisioning failed:\n{result.summary()}")
    return cluster, result.duration_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--strict-cold", action="store_true", help="provision a second fresh cluster end to end"
    )
    parser.add_argument(
        "--no-pip-cache",
        action="store_true",
        help="build the uncached wheelhouse with PIP_NO_CACHE_DIR",
    )
    args = parser.parse_args()

    out: dict = {
        "topology": "3 control (zookeeper; 2 spark masters) + 2 workers (spark worker + tensorflow)"
    }
    work = Path(tempfile.mkdtemp(prefix="trainstack-bench-"))
    names: list[str] = []
    try:
        fresh = work / "wheelhouse"
        if args.no_pip_cache:
            os.environ["PIP_NO_CACHE_DIR"] = "1"
        t = time.monotonic()
        build_node_wheelhouse(fresh)
        out["wheelhouse_build_uncached_s"] = round(time.monotonic() - t, 1)
        os.environ.pop("PIP_NO_CACHE_DIR", None)
        t = time.monotonic()
        build_node_wheelhouse(fresh)
        out["wheelhouse_build_cached_s"] = round(time.monotonic() - t, 2)
        log(
            f"wheelhouse: {out['wheelhouse_build_uncached_s']}s uncached, "
            f"{out['wheelhouse_build_cached_s']}s cached"
        )

        name = f"tsbench-{uuid.uuid4().hex[:6]}"
        names.append(name)
        cluster, cold = provision(name, fresh, work)
        out["cold_provision_s"] = round(cold, 1)
        log(f"cold provisioning: {cold:.0f}s")

        rerun = run_playbook(
            cluster.inventory(),
            "site.yml",
            extravars=cluster.extravars(fresh),
            on_event=None,
            artifacts_dir=work / name,
        )
        if not rerun.ok or any(rerun.changed().values()):
            raise SystemExit(f"no-change re-run was not clean:\n{rerun.summary()}")
        out["noop_rerun_s"] = round(rerun.duration_s, 1)
        log(f"no-change re-run: {rerun.duration_s:.0f}s")

        workers = len([n for n in cluster.plan if "spark_worker" in n.roles])
        masters = {n.key: cluster.containers[n.key] for n in cluster.plan if n.is_master}
        old, new, seconds = measure_failover(masters, workers)
        out["failover_s"] = round(seconds, 1)
        out["failover"] = f"{old} -> {new}"
        log(f"failover {old} -> {new}: {seconds:.1f}s")
        cl.destroy(name)

        if args.strict_cold:
            strict = work / "wheelhouse-strict"
            t = time.monotonic()
            build_node_wheelhouse(strict)
            name2 = f"tsbench-{uuid.uuid4().hex[:6]}"
            names.append(name2)
            provision(name2, strict, work)
            out["cold_provision_uncached_wheelhouse_s"] = round(time.monotonic() - t, 1)
            cl.destroy(name2)
        else:
            out["cold_provision_uncached_wheelhouse_s"] = round(
                out["wheelhouse_build_uncached_s"] + cold, 1
            )
        out["cold_provision_cached_wheelhouse_s"] = round(
            out["wheelhouse_build_cached_s"] + cold, 1
        )
        out["cpu_count"] = os.cpu_count()
    finally:
        for name in names:
            cl.destroy(name)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
