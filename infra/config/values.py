"""The config's vocabulary: its namespace and key names, sizes, durations, ConfigError.

Every other module of the package builds on these; this one imports none of them.
"""

from __future__ import annotations

import re
from pathlib import Path

NAMESPACE = "trainstack"
# The project directory (Pulumi.yaml): relative paths in the config are relative to it.
PROJECT_DIR = Path(__file__).resolve().parents[2]
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)b?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
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


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def config_key(attr: str) -> str:
    """The key a user types for the field `attr`: `trainstack:workerMemory`."""
    return f"{NAMESPACE}:{camel(attr)}"
