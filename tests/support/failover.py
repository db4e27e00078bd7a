"""Spark HA failover on a Docker-API test cluster: stop the ALIVE master's container and time
the standby's takeover (used by tests/provisioning and bench/bench_provisioning.py)."""

from __future__ import annotations

import json
import time
import urllib.request

import docker

from tests.support.cluster import wait_for


def master_status(ip: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:8080/json/", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def measure_failover(cluster, worker_count: int, timeout: float = 120.0) -> tuple[str, str, float]:
    """Stop the ALIVE master's container; return (old, new, seconds until the new master is
    ALIVE with every worker ALIVE and registered)."""
    client = docker.from_env()
    masters = [n.name for n in cluster.nodes if "spark_master" in n.groups]
    ips = {}
    for m in masters:
        c = client.containers.get(cluster.containers[m])
        ips[m] = c.attrs["NetworkSettings"]["Networks"][cluster.network]["IPAddress"]

    def settled():
        # Earlier tests kill daemons (a ZooKeeper server a master talks to, a worker): wait
        # until one master is ALIVE with every worker ALIVE before measuring.
        statuses = {m: master_status(ips[m]) for m in masters}
        alive = [m for m, s in statuses.items() if s and s["status"] == "ALIVE"]
        if len(alive) != 1:
            return None
        live = [w for w in statuses[alive[0]]["workers"] if w["state"] == "ALIVE"]
        return alive[0] if len(live) == worker_count else None

    old = wait_for(settled, timeout=120, interval=1, what="one ALIVE master with every worker")
    start = time.monotonic()
    # Kill the whole node, its ZooKeeper member included.
    client.containers.get(cluster.containers[old]).kill()

    def new_leader():
        for m in masters:
            if m == old:
                continue
            s = master_status(ips[m])
            if s and s["status"] == "ALIVE":
                live = [w for w in s["workers"] if w["state"] == "ALIVE"]
                if len(live) == worker_count:
                    return m
        return None

    new = wait_for(
        new_leader, timeout=timeout, interval=0.2, what="standby master ALIVE with all workers"
    )
    return old, new, time.monotonic() - start
