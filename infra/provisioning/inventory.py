"""What provisioning reads from an inventory: its secret variables and its Docker nodes.

The inventory itself is built by the program, in one place: `infra.topology.inventory` (the
stack's `inventory` output; see docs/provisioning.md for the contract).
"""

from __future__ import annotations

import copy
from typing import Any

# Variables that must never be written to an inventory file or a command line: run_playbook
# moves them into a 0600 extravars file inside the runner's private data dir.
SECRET_VARS = ("trainstack_spark_auth_secret", "trainstack_s3_secret_key")
# The environment variable in which the program hands the secret to `python -m
# infra.provisioning` (never on its command line).
SECRET_ENV = "TRAINSTACK_SPARK_AUTH_SECRET"
# The same for an external S3 endpoint's secret key (trainstack:s3SecretKey), when one is set.
S3_SECRET_ENV = "TRAINSTACK_S3_SECRET_KEY"


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
