"""The ssh target's server list (`trainstack:servers`): the `Server` record, how an entry
is parsed and checked, and what makes a list of servers a cluster the roles can build."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.config.values import NAMESPACE

# What a server can run: the inventory groups the roles install (docs/provisioning.md).
ROLES = ("zookeeper", "spark_master", "spark_worker", "tensorflow", "monitoring")
_HOST_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$",
    re.IGNORECASE,
)
_UNIX_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class Server:
    """One server the ssh target provisions: an existing machine (`trainstack:servers`) or
    an instance the aws target declared (its outputs are these records).

    `address` is where the control machine connects; `node_address` what the other nodes
    use to reach this one (a private address; "": `address`). An empty `private_key_file`
    leaves the key to ssh (agent, ~/.ssh/id_*).
    """

    name: str
    address: str
    user: str
    roles: tuple[str, ...]
    port: int = 22
    private_key_file: str = ""
    node_address: str = ""
    gpus: int = 0  # NVIDIA GPUs its Spark worker offers (spark.worker.resource.gpu.*)

    @property
    def reach(self) -> str:
        return self.node_address or self.address

    @property
    def group(self) -> str:
        return "workers" if "spark_worker" in self.roles else "control"

    def as_dict(self) -> dict[str, Any]:
        """The record as the config key and the aws target's outputs spell it (`gpus` only
        when it has some: a server's record, an input of its facts probe, stays as it was)."""
        record: dict[str, Any] = {
            "name": self.name,
            "address": self.address,
            "nodeAddress": self.node_address,
            "port": self.port,
            "user": self.user,
            "privateKeyFile": self.private_key_file,
            "roles": list(self.roles),
        }
        if self.gpus:
            record["gpus"] = self.gpus
        return record


_SERVER_FIELDS = {
    "name": "name",
    "address": "address",
    "nodeAddress": "node_address",
    "port": "port",
    "user": "user",
    "privateKeyFile": "private_key_file",
    "roles": "roles",
    "gpus": "gpus",
}
_SERVER_REQUIRED = ("name", "address", "user", "roles")


def _address_error(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{value!r} is not an IP address or DNS name"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if _DNS_NAME.match(value) and not value.replace(".", "").isdigit():
        return None
    return f"{value!r} is not an IP address or DNS name (e.g. 10.0.0.5 or node1.example.org)"


def key_file_error(value: Any) -> str | None:
    """Why ssh could not use `value` as a private key file, or None.

    Checked before anything is created: ssh itself refuses a key that others can read.
    """
    if not isinstance(value, str) or not value:
        return f"{value!r} is not a path"
    path = Path(value).expanduser()
    if not path.is_absolute():
        return (
            f"{value!r} is a relative path; give an absolute path or one under ~ "
            "(the program's working directory is not yours)"
        )
    if not path.is_file():
        return f"{value!r} does not exist or is not a file"
    if not os.access(path, os.R_OK):
        return f"{value!r} is not readable by this user"
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return (
            f"{value!r} has mode {mode:04o}, readable by others; ssh refuses such keys: "
            f"chmod 600 {value}"
        )
    return None


def _server_entry(key: str, entry: Any, errors: list[str]) -> Server | None:
    if not isinstance(entry, Mapping):
        errors.append(
            f"{key}: {entry!r} is not a server; give a mapping with " + ", ".join(_SERVER_FIELDS)
        )
        return None
    problems: list[str] = []
    for field_name in sorted(set(entry) - set(_SERVER_FIELDS)):
        problems.append(f"{key}.{field_name}: unknown field; allowed: {', '.join(_SERVER_FIELDS)}")
    for field_name in _SERVER_REQUIRED:
        if field_name not in entry:
            problems.append(f"{key}.{field_name}: missing; every server needs it")
    name = entry.get("name", "")
    if "name" in entry and not (isinstance(name, str) and _HOST_NAME.match(name)):
        problems.append(
            f"{key}.name: {name!r} is not a host name; use lowercase letters, digits and '-', "
            "not starting or ending with '-', at most 63 characters"
        )
    for field_name in ("address", "nodeAddress"):
        given = field_name in entry and (field_name == "address" or entry[field_name] != "")
        if given and (msg := _address_error(entry[field_name])):
            problems.append(f"{key}.{field_name}: {msg}")
    port = entry.get("port", 22)
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        problems.append(f"{key}.port: {entry.get('port')!r} is not a port; allowed is 1..65535")
    user = entry.get("user", "")
    if "user" in entry and not (isinstance(user, str) and _UNIX_USER.match(user)):
        problems.append(
            f"{key}.user: {user!r} is not a user name; use lowercase letters, digits, '_' "
            "and '-', starting with a letter or '_', at most 32 characters"
        )
    key_file = entry.get("privateKeyFile", "")
    if key_file != "" and (msg := key_file_error(key_file)):
        problems.append(f"{key}.privateKeyFile: {msg}")
    roles = entry.get("roles", [])
    if isinstance(roles, str):
        roles = [r.strip() for r in roles.split(",") if r.strip()]
    if not isinstance(roles, list | tuple) or ("roles" in entry and not roles):
        problems.append(
            f"{key}.roles: {entry.get('roles')!r} is not a non-empty list of roles; "
            f"allowed roles: {', '.join(ROLES)}"
        )
        roles = []
    for role in roles:
        if role not in ROLES:
            problems.append(f"{key}.roles: {role!r} is not a role; allowed: {', '.join(ROLES)}")
    if len(set(roles)) != len(roles):
        problems.append(f"{key}.roles: {list(roles)!r} names a role twice")
    gpus = entry.get("gpus", 0)
    if isinstance(gpus, str) and gpus.strip().isdigit():
        gpus = int(gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        problems.append(
            f"{key}.gpus: {entry.get('gpus')!r} is not a GPU count; allowed is 0 or more "
            "(the server's NVIDIA GPUs its Spark worker offers)"
        )
    elif gpus and "spark_worker" not in roles:
        problems.append(
            f"{key}.gpus: {gpus} on a server without the role spark_worker; only a Spark "
            "worker offers GPUs, so allowed here is 0"
        )
    if problems:
        errors.extend(problems)
        return None
    return Server(
        name=name,
        address=entry["address"],
        user=user,
        roles=tuple(roles),
        port=port,
        private_key_file=key_file,
        node_address=entry.get("nodeAddress", ""),
        gpus=gpus,
    )


def server_list_errors(servers: tuple[Server, ...], key: str = f"{NAMESPACE}:servers") -> list[str]:
    """What makes a list of valid servers not a cluster the roles can build."""
    errors: list[str] = []
    names = [s.name for s in servers]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"{key}: the name {name!r} is used by more than one server")
    endpoints = [(s.address, s.port) for s in servers]
    for address, port in sorted({e for e in endpoints if endpoints.count(e) > 1}):
        errors.append(f"{key}: {address}:{port} is listed more than once (one server, one entry)")
    count = {role: sum(role in s.roles for s in servers) for role in ROLES}
    if count["zookeeper"] % 2 == 0:
        errors.append(
            f"{key}: {count['zookeeper']} servers have the role zookeeper; an ensemble needs "
            "an odd number (1, 3, 5) so a majority survives a loss"
        )
    for role in ("spark_master", "spark_worker"):
        if count[role] == 0:
            errors.append(f"{key}: no server has the role {role}; at least one must")
    if count["monitoring"] > 1:
        errors.append(
            f"{key}: {count['monitoring']} servers have the role monitoring; at most one may"
        )
    for s in servers:
        if "tensorflow" in s.roles and "spark_worker" not in s.roles:
            errors.append(
                f"{key}: server {s.name!r} has the role tensorflow without spark_worker; "
                "TensorFlow runs in the Spark workers' executors"
            )
    return errors


def parse_servers(value: Any) -> tuple[tuple[Server, ...], list[str]]:
    """`trainstack:servers` (a JSON list as Pulumi stores it, or a list) -> (servers, errors).

    Every problem of an entry is reported, each naming the entry, the field, the value and
    what is allowed; the cluster-wide rules (`server_list_errors`) are the config's checks.
    """
    key = f"{NAMESPACE}:servers"
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            return (), [f"{key}: not a JSON list of servers ({exc.msg} at column {exc.colno})"]
    if not isinstance(value, list | tuple):
        return (), [f"{key}: {value!r} is not a list of servers"]
    errors: list[str] = []
    servers = [_server_entry(f"{key}[{i}]", entry, errors) for i, entry in enumerate(value)]
    if errors:
        return (), errors
    return tuple(s for s in servers if s is not None), []
