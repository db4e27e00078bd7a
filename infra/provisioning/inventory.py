"""Build the Ansible inventory the roles expect (see docs/provisioning.md for the contract)."""

from __future__ import annotations

import copy
import secrets as _secrets
from dataclasses import dataclass, field
from typing import Any

GROUPS = (
    "zookeeper",
    "spark_master",
    "spark_worker",
    "tensorflow",
    "control",
    "workers",
    # Prometheus, the Pushgateway and the blackbox exporter (docs/monitoring.md); with
    # all_vars trainstack_monitoring_enabled: true every node also gets the exporters.
    "monitoring",
)
# Variables that must never be written to an inventory file or a command line: run_playbook
# moves them into a 0600 extravars file inside the runner's private data dir.
SECRET_VARS = ("trainstack_spark_auth_secret",)


@dataclass
class Node:
    """One server of the platform.

    ``name`` is the inventory hostname. For the local stack ``connection`` is
    ``docker`` and ``address`` the container name; for SSH hosts ``connection``
    is ``ssh`` and ``address`` the IP or DNS name (``ssh_user`` / ``ssh_private_key_file``
    optional).
    """

    name: str
    groups: list[str]
    address: str
    connection: str = "docker"
    zookeeper_id: int | None = None
    worker_cores: int | None = None
    worker_memory: str | None = None
    node_address: str | None = None  # address other nodes use; defaults to `address`
    ssh_user: str | None = None
    ssh_private_key_file: str | None = None
    extra_vars: dict[str, Any] = field(default_factory=dict)

    def hostvars(self) -> dict[str, Any]:
        hv: dict[str, Any] = {"ansible_connection": self.connection, "ansible_host": self.address}
        if self.node_address:
            hv["trainstack_node_address"] = self.node_address
        if self.zookeeper_id is not None:
            hv["trainstack_zookeeper_id"] = self.zookeeper_id
        if self.worker_cores is not None:
            hv["trainstack_spark_worker_cores"] = self.worker_cores
        if self.worker_memory is not None:
            hv["trainstack_spark_worker_memory"] = self.worker_memory
        if self.ssh_user:
            hv["ansible_user"] = self.ssh_user
        if self.ssh_private_key_file:
            hv["ansible_ssh_private_key_file"] = self.ssh_private_key_file
        hv.update(self.extra_vars)
        return hv


def generate_secret(nbytes: int = 32) -> str:
    """A fresh spark.authenticate secret (URL-safe, no characters that need quoting)."""
    return _secrets.token_urlsafe(nbytes)


def build_inventory(
    nodes: list[Node],
    *,
    stack: str,
    wheelhouse_dir: str,
    spark_auth_secret: str | None = None,
    all_vars: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return an inventory dict (YAML/JSON inventory format) for ``nodes``."""
    unknown = {g for n in nodes for g in n.groups} - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown inventory groups {sorted(unknown)}; known: {list(GROUPS)}")
    zk_ids = [n.zookeeper_id for n in nodes if "zookeeper" in n.groups]
    if any(i is None for i in zk_ids) or len(set(zk_ids)) != len(zk_ids):
        raise ValueError(f"every zookeeper node needs a unique zookeeper_id, got {zk_ids}")
    vars_: dict[str, Any] = {
        "trainstack_stack": stack,
        "trainstack_wheelhouse_dir": str(wheelhouse_dir),
    }
    if spark_auth_secret is not None:
        vars_["trainstack_spark_auth_secret"] = spark_auth_secret
    vars_.update(all_vars or {})
    children: dict[str, Any] = {}
    for group in GROUPS:
        members: dict[str, Any] = {n.name: {} for n in nodes if group in n.groups}
        children[group] = {"hosts": members}
    return {
        "all": {
            "hosts": {n.name: n.hostvars() for n in nodes},
            "vars": vars_,
            "children": children,
        }
    }


def default_topology(
    prefix: str, *, worker_cores: int = 1, worker_memory: str = "1g"
) -> list[Node]:
    """The default platform: 3 control nodes (ZooKeeper; the first 2 also Spark masters) and
    2 worker nodes (Spark worker + TensorFlow). Containers are named ``{prefix}-control-N`` /
    ``{prefix}-worker-N``."""
    nodes = []
    for i in (1, 2, 3):
        groups = ["control", "zookeeper"] + (["spark_master"] if i <= 2 else [])
        nodes.append(Node(f"control-{i}", groups, f"{prefix}-control-{i}", zookeeper_id=i))
    for i in (1, 2):
        nodes.append(
            Node(
                f"worker-{i}",
                ["workers", "spark_worker", "tensorflow"],
                f"{prefix}-worker-{i}",
                worker_cores=worker_cores,
                worker_memory=worker_memory,
            )
        )
    return nodes


def split_secrets(inventory: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (inventory without secret vars, the secret vars) - from all vars and any host."""
    inv = copy.deepcopy(inventory)
    found: dict[str, Any] = {}

    def scrub(d: dict[str, Any] | None) -> None:
        if not d:
            return
        for key in SECRET_VARS:
            if key in d:
                found[key] = d.pop(key)

    def walk(group: dict[str, Any]) -> None:
        scrub(group.get("vars"))
        for hv in (group.get("hosts") or {}).values():
            scrub(hv)
        for child in (group.get("children") or {}).values():
            walk(child or {})

    for group in inv.values():
        walk(group or {})
    return inv, found


def hosts_in_group(inventory: dict[str, Any], group: str) -> list[str]:
    children = inventory.get("all", {}).get("children", {})
    return list((children.get(group) or {}).get("hosts", {}) or {})


def host_address(inventory: dict[str, Any], host: str) -> str:
    hv = inventory["all"]["hosts"][host] or {}
    return str(hv.get("trainstack_node_address") or hv.get("ansible_host") or host)


# Ansible's names for its Docker connection (`docker` is routed to the collection's plugin).
DOCKER_CONNECTIONS = ("docker", "community.docker.docker")


def docker_containers(inventory: dict[str, Any]) -> list[str]:
    """The containers of an inventory whose hosts Ansible reaches through Docker."""
    names: set[str] = set()

    def walk(group: dict[str, Any], connection: Any) -> None:
        connection = (group.get("vars") or {}).get("ansible_connection", connection)
        for hostvars in (group.get("hosts") or {}).values():
            hostvars = hostvars or {}
            via = hostvars.get("ansible_connection", connection)
            if via in DOCKER_CONNECTIONS and hostvars.get("ansible_host"):
                names.add(str(hostvars["ansible_host"]))
        for child in (group.get("children") or {}).values():
            walk(child or {}, connection)

    walk(inventory.get("all") or {}, None)
    return sorted(names)
