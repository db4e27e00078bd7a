"""Test cluster of Docker containers, created through the Docker API, for what a stack cannot
do: the images test starts containers from a test image with its own CMD, and
bench/bench_provisioning.py times bare runs of the playbook.

The nodes are the program's plan (``infra.topology.plan``) and the inventory is the program's
(``infra.topology.inventory``): containers are named ``<name>-<node>`` and reached by their node
name (a network alias), as on a stack. Every object is labelled ``trainstack.test=<name>`` and
removed by ``destroy``. Each container gets its own apt archive directory (a host bind mount)
pre-seeded with hard links from a shared pool, and new .deb files are linked back into the pool
afterwards: the nodes download Java and friends from Debian's mirror once per machine, without
two apt processes sharing one lock.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from infra import topology
from infra.config import StackConfig
from infra.config.values import parse_size

BASE_IMAGE = os.environ.get("TRAINSTACK_BASE_IMAGE", "debian:bookworm")
CACHE = Path(os.environ.get("TRAINSTACK_CACHE", Path.home() / ".cache" / "trainstack"))
APT_POOL = CACHE / "apt" / "pool"
LABEL = "trainstack.test"
# Memory per container: 3 x 1 GiB control + 2 x 2.5 GiB workers = 8 GiB (the topology's budget).
MEM = {"control": "1g", "workers": "2560m"}  # parsed by infra.config.values.parse_size
KEEP_ALIVE = ["sleep", "infinity"]


def _link_tree(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for deb in src.glob("*.deb"):
        target = dst / deb.name
        if not target.exists():
            with contextlib.suppress(OSError):
                os.link(deb, target)


@dataclass
class Cluster:
    name: str
    config: StackConfig
    plan: list[topology.NodeSpec]
    secret: str
    network: str
    containers: dict[str, str] = field(default_factory=dict)  # inventory host -> container name

    def inventory(self, node_image: str | None = None) -> dict:
        """The program's inventory for these containers (no secret in it)."""
        return topology.inventory(self.config, self.name, self.plan, node_image=node_image)

    def extravars(self, wheelhouse_dir: Path) -> dict:
        """What `python -m infra.provisioning` adds for the program: the wheelhouse and the
        Spark auth secret (run_playbook keeps the secret out of the inventory and the command)."""
        return {
            "trainstack_wheelhouse_dir": str(wheelhouse_dir),
            "trainstack_spark_auth_secret": self.secret,
        }


def client() -> docker.DockerClient:
    try:
        c = docker.from_env()
        c.ping()
    except Exception as exc:
        raise RuntimeError(f"Docker engine not reachable ({exc}); start dockerd first") from exc
    try:
        c.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound as exc:
        raise RuntimeError(
            f"base image {BASE_IMAGE} is missing locally (docker pull cannot work here)"
        ) from exc
    return c


def create(
    name: str,
    config: StackConfig | None = None,
    *,
    image: str = BASE_IMAGE,
    command: list[str] | None = KEEP_ALIVE,
    init: bool = True,
) -> Cluster:
    """Containers for the nodes ``config`` plans (default: the default topology) from ``image``.

    The default is a bare server: the base image kept alive by ``sleep`` (the supervisor role
    starts supervisord as a service). For the node image pass ``command=None, init=False``:
    its own CMD, supervisord, is then the main process.
    """
    c = client()
    destroy(name)
    config = config or StackConfig()
    plan = topology.plan(config)
    net = c.networks.create(f"{name}-net", driver="bridge", labels={LABEL: name})
    cluster = Cluster(
        name=name,
        config=config,
        plan=plan,
        secret=secrets.token_urlsafe(32),
        network=net.name,
    )
    for spec in plan:
        container = f"{name}-{spec.key}"
        apt_dir = CACHE / "apt" / "nodes" / container
        _link_tree(APT_POOL, apt_dir)
        (apt_dir / "partial").mkdir(parents=True, exist_ok=True)
        c.containers.run(
            image,
            command=command,
            name=container,
            hostname=spec.key,
            detach=True,
            init=init,
            network=net.name,
            # Nodes reach each other by node name, as on a stack (topology.inventory).
            networking_config={net.name: c.api.create_endpoint_config(aliases=[spec.key])},
            labels={LABEL: name},
            # As the stack's: the shares of the services a node hosts on top (tracking, object
            # store, job drivers).
            mem_limit=parse_size(MEM[spec.group]) + topology.service_memory(config, spec),
            volumes={str(apt_dir): {"bind": "/var/cache/apt/archives", "mode": "rw"}},
        )
        cluster.containers[spec.key] = container
    return cluster


def destroy(name: str) -> None:
    c = docker.from_env()
    for container in c.containers.list(all=True, filters={"label": f"{LABEL}={name}"}):
        container.remove(force=True)
    for net in c.networks.list(filters={"label": f"{LABEL}={name}"}):
        net.remove()
    nodes_dir = CACHE / "apt" / "nodes"
    if nodes_dir.exists():
        for apt_dir in nodes_dir.glob(f"{name}-*"):
            _link_tree(apt_dir, APT_POOL)


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout}s (last: {last!r})")
