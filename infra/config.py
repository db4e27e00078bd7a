"""The stack's configuration: read once, typed, validated, in one place.

Every key lives under the `trainstack:` namespace (`pulumi config set trainstack:workers 3`).
`load()` reads them from the stack; `StackConfig.from_mapping()` is the pure part that the
unit tests drive directly. All problems are reported together, each naming the key, the
value and what is allowed, before any resource is declared.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

NAMESPACE = "trainstack"
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
    train: bool = True
    train_epochs: int = 10
    train_workers: int = 0
    train_batch_size: int = 32
    train_data: str = "digits"
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
    def training_workers(self) -> int:
        """TensorFlow workers of a run: as configured, or one per worker node; one with the
        `single` strategy."""
        if self.train_strategy == "single":
            return 1
        return self.train_workers or self.workers


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


def _rotate_token(c: StackConfig) -> str | None:
    if c.rotate_secrets and not re.match(r"^[A-Za-z0-9._:-]{1,64}$", c.rotate_secrets):
        return (
            f"{_key('rotate_secrets')}: {c.rotate_secrets!r} is not a token; use 1..64 letters, "
            "digits and '.', '_', ':', '-' (e.g. a date: 2026-11-30)"
        )
    return None


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
    _training_needs_provisioning,
    _monitoring_port,
    _duration_check("monitoring_retention", 3600),
    _duration_check("monitoring_scrape_interval", 1),
    _duration_check("monitoring_alert_for", 0),
    _duration_check("monitoring_progress_timeout", 60),
    _rotate_token,
]


def load() -> StackConfig:
    """Read every `trainstack:*` key of the current stack and validate it."""
    from pulumi.runtime.config import CONFIG

    prefix = f"{NAMESPACE}:"
    raw = {k[len(prefix) :]: v for k, v in CONFIG.get().items() if k.startswith(prefix)}
    return StackConfig.from_mapping(raw)
