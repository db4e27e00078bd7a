"""The stack's configuration: read once, typed, validated, in one place.

Every key lives under the `trainstack:` namespace (`pulumi config set trainstack:workers 3`).
`load()` reads them from the stack; `StackConfig.from_mapping()` is the pure part that the
unit tests drive directly. All problems are reported together, each naming the key, the
value and what is allowed, before any resource is declared.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

NAMESPACE = "trainstack"
# The project directory (Pulumi.yaml): relative paths in the config are relative to it.
PROJECT_DIR = Path(__file__).resolve().parents[1]
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)b?$", re.IGNORECASE)
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
# trainstack:monitoringPort -1 (the default) puts Prometheus's UI at uiPortBase + this: 19090.
MONITORING_PORT_OFFSET = 1010
# A Prometheus duration with one unit: 30s, 5m, 2h, 7d.
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w|y)$")
_DURATION_SECONDS = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
    "y": 365 * 86400,
}


class ConfigError(ValueError):
    """One or more configuration values are invalid; the message lists each of them."""


# Targets: how the nodes come to exist (docs/targets.md). `aws` exists on paper only.
TARGETS = ("docker", "ssh", "aws")
SELECTABLE_TARGETS = ("docker", "ssh")
# What a server can run: the inventory groups the roles install (docs/provisioning.md).
ROLES = ("zookeeper", "spark_master", "spark_worker", "tensorflow", "monitoring")
_HOST_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$",
    re.IGNORECASE,
)
_UNIX_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_AWS_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")
_AWS_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_SSH_PUBLIC_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com)"
    r" [A-Za-z0-9+/]+={0,3}(?: \S.*)?$"
)
# A narrower operator CIDR than this opens SSH and the UIs to a large part of the internet.
MIN_OPERATOR_PREFIX = 8


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

    @property
    def reach(self) -> str:
        return self.node_address or self.address

    @property
    def group(self) -> str:
        return "workers" if "spark_worker" in self.roles else "control"

    def as_dict(self) -> dict[str, Any]:
        """The record as the config key and the aws target's outputs spell it."""
        return {
            "name": self.name,
            "address": self.address,
            "nodeAddress": self.node_address,
            "port": self.port,
            "user": self.user,
            "privateKeyFile": self.private_key_file,
            "roles": list(self.roles),
        }


_SERVER_FIELDS = {
    "name": "name",
    "address": "address",
    "nodeAddress": "node_address",
    "port": "port",
    "user": "user",
    "privateKeyFile": "private_key_file",
    "roles": "roles",
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


def parse_size(value: str) -> int:
    """Bytes in a Docker-style size: '512m', '2g', '1.5g', '1048576'."""
    match = _SIZE.match(value.strip())
    if not match:
        raise ValueError(value)
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_duration(value: str) -> float:
    """Seconds in a Prometheus duration with one unit: '15s', '5m', '2d'."""
    match = _DURATION.match(value.strip())
    if not match:
        raise ValueError(value)
    return int(match.group(1)) * _DURATION_SECONDS[match.group(2)]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


@dataclass(frozen=True)
class StackConfig:
    """Every key of the `trainstack:` namespace, with its default.

    Defaults fit the whole local stack in 2 cores and 8 GiB: 3 x (0.3 CPU, 1 GiB) control
    nodes and 2 x (0.55 CPU, 2 GiB) workers.
    """

    control_nodes: int = 3
    masters: int = 2
    workers: int = 2
    control_cpus: float = 0.3
    control_memory: str = "1g"
    worker_cpus: float = 0.55
    worker_memory: str = "2g"
    worker_spark_cores: int = 1
    worker_spark_memory: str = "1g"
    base_image: str = "debian:bookworm"
    bake_image: bool = True
    image_repository: str = "trainstack-node"
    name_prefix: str = "trainstack"
    bind_address: str = "127.0.0.1"
    ui_port_base: int = 18080
    retain_data: bool = False
    wheelhouse: str = "~/.cache/trainstack/wheelhouse"
    provision: bool = True
    provision_cpu_boost: bool = True
    provision_mitogen: bool = True
    train: bool = True
    # The job (docs/jobs.md): a directory with trainstack.toml and the user's code, relative to
    # the project directory or absolute, and a JSON object of parameters over its [params].
    job: str = "examples/digits"
    job_params: str = ""
    train_epochs: int = 10
    train_workers: int = 0
    train_batch_size: int = 32
    # "" (not set): the job's manifest names the data set, else the digits (program.job_data).
    train_data: str = ""
    train_rows: int = 0
    train_strategy: str = "multi-worker"
    retrain: str = ""
    # Monitoring (docs/monitoring.md): Prometheus on the first control node.
    monitoring: bool = True
    monitoring_port: int = -1  # -1: uiPortBase + 1010 (19090), or 0 when uiPortBase is 0
    monitoring_retention: str = "2d"
    monitoring_scrape_interval: str = "5s"
    monitoring_alert_for: str = "1m"
    monitoring_progress_timeout: str = "10m"
    # Targets (docs/targets.md): only docker is selectable.
    target: str = "docker"
    servers: tuple[Server, ...] = ()  # the ssh target's server list
    # The aws target, on paper: tested under Pulumi's mocks only.
    aws_region: str = "us-east-1"
    aws_operator_cidr: str = ""
    aws_control_instance_type: str = "t3.medium"
    aws_worker_instance_type: str = "m6i.xlarge"
    aws_public_key: str = ""
    aws_private_key_file: str = ""
    aws_data_volume_gb: int = 50
    # Security (docs/security.md).
    spark_network_crypto: bool = True  # AES-based RPC and block transfer encryption
    spark_io_encryption: bool = False  # encrypt shuffle and spill files on the nodes' disks
    rotate_secrets: str = ""  # a new token makes new cluster secrets on the next `up`

    @classmethod
    def config_keys(cls) -> dict[str, str]:
        """Config key (camelCase, as users type it) -> field name."""
        return {_camel(f.name): f.name for f in fields(cls)}

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> StackConfig:
        """Build from `{camelKey: value}` (strings as Pulumi stores them, or typed values)."""
        errors: list[str] = []
        known = cls.config_keys()
        for key in sorted(set(raw) - set(known)):
            errors.append(
                f"{NAMESPACE}:{key}: unknown key; allowed keys: "
                + ", ".join(f"{NAMESPACE}:{k}" for k in sorted(known))
            )
        values: dict[str, Any] = {}
        defaults = cls()
        for key, attr in known.items():
            if key not in raw:
                continue
            default = getattr(defaults, attr)
            if isinstance(default, tuple):  # trainstack:servers, a structured value
                values[attr], problems = parse_servers(raw[key])
                errors.extend(problems)
                continue
            try:
                values[attr] = _coerce(raw[key], type(default))
            except ValueError:
                errors.append(f"{NAMESPACE}:{key}: {raw[key]!r} is not a {type(default).__name__}")
        if errors:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        errors = [msg for check in _CHECKS if (msg := check(self))]
        if errors:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))

    # Derived values -------------------------------------------------------------

    @property
    def control_memory_bytes(self) -> int:
        return parse_size(self.control_memory)

    @property
    def worker_memory_bytes(self) -> int:
        return parse_size(self.worker_memory)

    @property
    def monitoring_host_port(self) -> int:
        """Host port of Prometheus's UI: as set, or next to the Spark UIs' (engine-picked
        with them), so stacks that let the engine pick their ports never collide."""
        if self.monitoring_port != -1:
            return self.monitoring_port
        return self.ui_port_base + MONITORING_PORT_OFFSET if self.ui_port_base else 0

    @property
    def monitoring_progress_timeout_seconds(self) -> int:
        return int(parse_duration(self.monitoring_progress_timeout))

    @property
    def job_path(self) -> Path:
        """The job directory: `job` as an absolute path, or relative to the project."""
        path = Path(self.job).expanduser()
        return path if path.is_absolute() else PROJECT_DIR / path

    @property
    def job_params_dict(self) -> dict[str, Any]:
        """`job_params` as a dict; ValueError naming the problem when it is not a JSON
        object."""
        if isinstance(self.job_params, dict):
            return dict(self.job_params)
        text = str(self.job_params or "").strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{text[:80]!r} is not a JSON object ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(
                f"{text[:80]!r} is not a JSON object; give name/value pairs, e.g. "
                '{"learning_rate": 0.01}'
            )
        return value

    @property
    def training_workers(self) -> int:
        """TensorFlow workers of a run: as configured, or one per worker node; one with the
        `single` strategy."""
        if self.train_strategy == "single":
            return 1
        if self.train_workers:
            return self.train_workers
        if self.target == "ssh":
            return sum("tensorflow" in s.roles for s in self.servers)
        return self.workers


def _coerce(value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "yes", "1", "on"):
            return True
        if text in ("false", "no", "0", "off"):
            return False
        raise ValueError(value)
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        return int(str(value).strip()) if not isinstance(value, int | float) else int(value)
    if kind is float:
        return float(value)
    return str(value)


def _key(attr: str) -> str:
    return f"{NAMESPACE}:{_camel(attr)}"


def _size_check(attr: str) -> Callable[[StackConfig], str | None]:
    def check(c: StackConfig) -> str | None:
        value = getattr(c, attr)
        try:
            size = parse_size(value)
        except ValueError:
            return f"{_key(attr)}: {value!r} is not a size; use a number with k, m or g (e.g. 2g)"
        if size < 256 * 1024**2:
            return f"{_key(attr)}: {value!r} is below the minimum of 256m"
        return None

    return check


def _min(attr: str, low: float) -> Callable[[StackConfig], str | None]:
    def check(c: StackConfig) -> str | None:
        value = getattr(c, attr)
        if value < low:
            return f"{_key(attr)}: {value!r} is below the minimum of {low}"
        return None

    return check


def _odd_ensemble(c: StackConfig) -> str | None:
    if c.control_nodes % 2 == 0:
        return (
            f"{_key('control_nodes')}: {c.control_nodes} makes an even ZooKeeper ensemble, "
            "which tolerates no more failures than one node fewer; use an odd number (1, 3, 5)"
        )
    return None


def _masters_fit(c: StackConfig) -> str | None:
    if c.masters > c.control_nodes:
        return (
            f"{_key('masters')}: {c.masters} is more than {_key('control_nodes')} "
            f"({c.control_nodes}); masters run on control nodes, so allowed is 1..{c.control_nodes}"
        )
    return None


def _spark_memory_fits(c: StackConfig) -> str | None:
    try:
        spark, node = parse_size(c.worker_spark_memory), parse_size(c.worker_memory)
    except ValueError:
        return None  # reported by the size checks
    if spark > node:
        return (
            f"{_key('worker_spark_memory')}: {c.worker_spark_memory!r} is more than the "
            f"worker's memory {_key('worker_memory')}={c.worker_memory!r}"
        )
    return None


def _name_prefix(c: StackConfig) -> str | None:
    if not _NAME.match(c.name_prefix):
        return (
            f"{_key('name_prefix')}: {c.name_prefix!r} is not allowed; use lowercase letters, "
            "digits and '-', starting with a letter or digit, at most 31 characters"
        )
    return None


def _image_repository(c: StackConfig) -> str | None:
    if not re.match(
        r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$", c.image_repository
    ):
        return (
            f"{_key('image_repository')}: {c.image_repository!r} is not a Docker repository "
            "name; use lowercase letters, digits and '.', '_', '-' or '/' between them "
            "(e.g. trainstack-node)"
        )
    return None


def _port_base(c: StackConfig) -> str | None:
    if c.ui_port_base != 0 and not 1024 <= c.ui_port_base <= 65535 - c.masters:
        return (
            f"{_key('ui_port_base')}: {c.ui_port_base} is out of range; allowed is 0 (the "
            f"engine picks free ports) or 1024..{65535 - c.masters}"
        )
    return None


def _bind_address(c: StackConfig) -> str | None:
    parts = c.bind_address.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) <= 255 for p in parts):
        return f"{_key('bind_address')}: {c.bind_address!r} is not an IPv4 address (e.g. 127.0.0.1)"
    return None


def _training_slots(c: StackConfig) -> str | None:
    slots = c.workers * c.worker_spark_cores
    if c.train_workers > slots:
        return (
            f"{_key('train_workers')}: {c.train_workers} TensorFlow workers need as many Spark "
            f"slots, but {_key('workers')} x {_key('worker_spark_cores')} offer {slots}; "
            f"allowed is 0 (one per worker node) or 1..{slots}"
        )
    return None


TRAIN_STRATEGIES = ("multi-worker", "single")


def _job_params(c: StackConfig) -> str | None:
    try:
        _ = c.job_params_dict
    except ValueError as exc:
        return f"{_key('job_params')}: {exc}"
    return None


def _job(c: StackConfig) -> str | None:
    """The job directory, checked as the nodes will load it (manifest, entry module and
    function, requirements), before anything is created."""
    if not c.train:
        return None
    from trainstack_training.job import JobError, load_spec

    try:
        params = c.job_params_dict
    except ValueError:
        return None  # reported by _job_params
    try:
        load_spec(c.job_path, params)
    except JobError as exc:
        return f"{_key('job')}: {exc}"
    return None


def _train_strategy(c: StackConfig) -> str | None:
    if c.train_strategy not in TRAIN_STRATEGIES:
        return (
            f"{_key('train_strategy')}: {c.train_strategy!r} is not a training strategy; "
            f"allowed: {', '.join(TRAIN_STRATEGIES)}"
        )
    return None


def _training_needs_provisioning(c: StackConfig) -> str | None:
    if c.train and not c.provision:
        return (
            f"{_key('train')}: true needs {_key('provision')}: true (the job runs on "
            "provisioned nodes); set trainstack:train false too"
        )
    return None


def _duration_check(attr: str, low: float) -> Callable[[StackConfig], str | None]:
    def check(c: StackConfig) -> str | None:
        value = getattr(c, attr)
        try:
            seconds = parse_duration(value)
        except ValueError:
            return (
                f"{_key(attr)}: {value!r} is not a duration; use a number with one unit "
                "of ms, s, m, h, d, w, y (e.g. 30s, 5m, 2d)"
            )
        if seconds < low:
            return f"{_key(attr)}: {value!r} is below the minimum of {low:g}s"
        return None

    return check


def _monitoring_port(c: StackConfig) -> str | None:
    port = c.monitoring_host_port
    if c.monitoring_port < -1 or (port != 0 and not 1024 <= port <= 65535):
        return (
            f"{_key('monitoring_port')}: {c.monitoring_port} gives port {port}, out of range; "
            "allowed is -1 (uiPortBase + 1010, or engine-picked when uiPortBase is 0), 0 (the "
            "engine picks a free port) or 1024..65535"
        )
    if port and c.ui_port_base and c.ui_port_base <= port < c.ui_port_base + c.masters:
        return (
            f"{_key('monitoring_port')}: {port} is one of the Spark master UI ports "
            f"({_key('ui_port_base')} {c.ui_port_base} and the next {c.masters - 1}); "
            "choose another port"
        )
    return None


def _target(c: StackConfig) -> str | None:
    if c.target == "ssh" and not c.servers:
        return (
            f"{_key('target')}: 'ssh' provisions the servers of {_key('servers')}, which is "
            "empty; list your servers (docs/targets.md)"
        )
    if c.target == "aws":
        return (
            f"{_key('target')}: 'aws' has only run under Pulumi's mocks, never against a real "
            "account; use docker, or ssh with the instances you made (docs/targets.md)"
        )
    if c.target not in SELECTABLE_TARGETS:
        return (
            f"{_key('target')}: {c.target!r} is not a target; allowed: "
            f"{', '.join(SELECTABLE_TARGETS)} (aws exists on paper only; docs/targets.md)"
        )
    return None


def _rotate_token(c: StackConfig) -> str | None:
    if c.rotate_secrets and not re.match(r"^[A-Za-z0-9._:-]{1,64}$", c.rotate_secrets):
        return (
            f"{_key('rotate_secrets')}: {c.rotate_secrets!r} is not a token; use 1..64 letters, "
            "digits and '.', '_', ':', '-' (e.g. a date: 2026-11-30)"
        )
    return None


def _server_list(c: StackConfig) -> str | None:
    if not c.servers:
        return None
    if c.target != "ssh":
        return (
            f"{_key('servers')}: only the ssh target takes a server list; "
            f"{_key('target')} is {c.target!r}, which makes its own nodes"
        )
    return "\n  ".join(server_list_errors(c.servers)) or None


def _aws_region(c: StackConfig) -> str | None:
    if not _AWS_REGION.match(c.aws_region):
        return f"{_key('aws_region')}: {c.aws_region!r} is not an AWS region (e.g. eu-central-1)"
    return None


def _aws_instance_type(attr: str) -> Callable[[StackConfig], str | None]:
    def check(c: StackConfig) -> str | None:
        value = getattr(c, attr)
        if not _AWS_INSTANCE_TYPE.match(value):
            return f"{_key(attr)}: {value!r} is not an EC2 instance type (e.g. t3.medium)"
        return None

    return check


def _aws_operator_cidr(c: StackConfig) -> str | None:
    if not c.aws_operator_cidr:
        return None  # required by the aws target only (require_aws)
    key, value = _key("aws_operator_cidr"), c.aws_operator_cidr
    try:
        network = ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        return (
            f"{key}: {value!r} is not an IPv4 network with its host bits zero; give your own "
            "address as a /32 (e.g. 203.0.113.7/32)"
        )
    if network.prefixlen < MIN_OPERATOR_PREFIX:
        return (
            f"{key}: {value!r} opens SSH and the UIs to {network.num_addresses} addresses, "
            f"the internet or much of it; allowed is /{MIN_OPERATOR_PREFIX} or narrower "
            "(your own address as a /32, e.g. 203.0.113.7/32)"
        )
    return None


def _aws_public_key(c: StackConfig) -> str | None:
    value = c.aws_public_key.strip()
    if not value:
        return None  # required by the aws target only (require_aws)
    key = _key("aws_public_key")
    if "PRIVATE KEY" in value:
        # Never echo it: it is a secret that was put where a public key belongs.
        return (
            f"{key}: the value is a private key (not shown); give the public key, the "
            "one-line contents of the .pub file, and remove the private key from the config"
        )
    if not _SSH_PUBLIC_KEY.match(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return (
            f"{key}: {shown!r} is not an OpenSSH public key; give the one line of the .pub "
            "file (ssh-ed25519 AAAA..., ssh-rsa AAAA... or ecdsa-sha2-nistp256 AAAA...)"
        )
    return None


def _aws_private_key_file(c: StackConfig) -> str | None:
    if c.aws_private_key_file and (msg := key_file_error(c.aws_private_key_file)):
        return f"{_key('aws_private_key_file')}: {msg}"
    return None


def _aws_data_volume(c: StackConfig) -> str | None:
    if not 1 <= c.aws_data_volume_gb <= 16384:
        return (
            f"{_key('aws_data_volume_gb')}: {c.aws_data_volume_gb} is out of range; "
            "allowed is 1..16384 (GiB of gp3)"
        )
    return None


def require_aws(c: StackConfig) -> None:
    """What the aws target needs beyond the checked values; raised before any resource."""
    missing = [
        f"{_key(attr)}: not set; {why}"
        for attr, why in (
            (
                "aws_operator_cidr",
                "the only network SSH and the UIs are open to (e.g. 203.0.113.7/32)",
            ),
            ("aws_public_key", "the public key the instances accept for the user admin"),
        )
        if not getattr(c, attr).strip()
    ]
    if missing:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(missing))


_CHECKS: list[Callable[[StackConfig], str | None]] = [
    _min("control_nodes", 1),
    _min("masters", 1),
    _min("workers", 1),
    _min("control_cpus", 0.1),
    _min("worker_cpus", 0.1),
    _min("worker_spark_cores", 1),
    _odd_ensemble,
    _masters_fit,
    _size_check("control_memory"),
    _size_check("worker_memory"),
    _size_check("worker_spark_memory"),
    _spark_memory_fits,
    _name_prefix,
    _image_repository,
    _port_base,
    _bind_address,
    _min("train_epochs", 1),
    _min("train_workers", 0),
    _min("train_batch_size", 1),
    _min("train_rows", 0),
    _training_slots,
    _train_strategy,
    _job_params,
    _job,
    _training_needs_provisioning,
    _monitoring_port,
    _duration_check("monitoring_retention", 3600),
    _duration_check("monitoring_scrape_interval", 1),
    _duration_check("monitoring_alert_for", 0),
    _duration_check("monitoring_progress_timeout", 60),
    _target,
    _server_list,
    _aws_region,
    _aws_instance_type("aws_control_instance_type"),
    _aws_instance_type("aws_worker_instance_type"),
    _aws_operator_cidr,
    _aws_public_key,
    _aws_private_key_file,
    _aws_data_volume,
    _rotate_token,
]


def load() -> StackConfig:
    """Read every `trainstack:*` key of the current stack and validate it."""
    from pulumi.runtime.config import CONFIG

    prefix = f"{NAMESPACE}:"
    raw = {k[len(prefix) :]: v for k, v in CONFIG.get().items() if k.startswith(prefix)}
    return StackConfig.from_mapping(raw)
