"""Spark HA failover on containers: stop the ALIVE master's container and time the standby's
takeover (used by tests/provisioning on a stack's nodes and by bench/bench_provisioning.py on
a Docker-API test cluster)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping

import docker

from tests.support.cluster import wait_for


def master_status(ip: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:8080/json/", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def container_ip(container) -> str:
    """The container's address on its network (a node is on exactly one)."""
    networks = container.attrs["NetworkSettings"]["Networks"]
    addresses = [n["IPAddress"] for n in networks.values() if n.get("IPAddress")]
    if len(addresses) != 1:
        raise AssertionError(f"{container.name}: expected one network address, got {networks}")
    return addresses[0]


def measure_failover(
    masters: Mapping[str, str], worker_count: int, timeout: float = 120.0
) -> tuple[str, str, float]:
    """Stop the ALIVE master's container; return (old, new, seconds until the new master is
    ALIVE with every worker ALIVE and registered).

    `masters`: node name -> container name, for every Spark master node (a stack's `nodes`
    output gives both; so does a test cluster's `containers`)."""
    client = docker.from_env()
    ips = {m: container_ip(client.containers.get(c)) for m, c in masters.items()}

    def settled():
        # Earlier tests kill daemons (a ZooKeeper server a master talks to, a worker): wait
        # until one master is ALIVE with every worker ALIVE before measuring.
        statuses = {m: master_status(ip) for m, ip in ips.items()}
        alive = [m for m, s in statuses.items() if s and s["status"] == "ALIVE"]
        if len(alive) != 1:
            return None
        live = [w for w in statuses[alive[0]]["workers"] if w["state"] == "ALIVE"]
        return alive[0] if len(live) == worker_count else None

    old = wait_for(settled, timeout=120, interval=1, what="one ALIVE master with every worker")
    start = time.monotonic()
    # Kill the whole node, its ZooKeeper member included.
    client.containers.get(masters[old]).kill()

    def new_leader():
        for m, ip in ips.items():
            if m == old:
                continue
            s = master_status(ip)
            if s and s["status"] == "ALIVE":
                live = [w for w in s["workers"] if w["state"] == "ALIVE"]
                if len(live) == worker_count:
                    return m
        return None

    new = wait_for(
        new_leader, timeout=timeout, interval=0.2, what="standby master ALIVE with all workers"
    )
    return old, new, time.monotonic() - start
