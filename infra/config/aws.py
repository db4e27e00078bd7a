"""The aws target's keys (`trainstack:aws*`): their checks, and what the target needs
beyond them (`require_aws`). The target exists on paper only (docs/targets.md): it cannot
be selected, but its keys are checked like every other."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from infra.config.servers import key_file_error
from infra.config.stack import StackValues
from infra.config.values import ConfigError
from infra.config.values import config_key as _key

_AWS_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")
_AWS_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_SSH_PUBLIC_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com)"
    r" [A-Za-z0-9+/]+={0,3}(?: \S.*)?$"
)
# A narrower operator CIDR than this opens SSH and the UIs to a large part of the internet.
MIN_OPERATOR_PREFIX = 8


def _aws_region(c: StackValues) -> str | None:
    if not _AWS_REGION.match(c.aws_region):
        return f"{_key('aws_region')}: {c.aws_region!r} is not an AWS region (e.g. eu-central-1)"
    return None


def _aws_instance_type(attr: str) -> Callable[[StackValues], str | None]:
    def check(c: StackValues) -> str | None:
        value = getattr(c, attr)
        if not _AWS_INSTANCE_TYPE.match(value):
            return f"{_key(attr)}: {value!r} is not an EC2 instance type (e.g. t3.medium)"
        return None

    return check


def _aws_operator_cidr(c: StackValues) -> str | None:
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


def _aws_public_key(c: StackValues) -> str | None:
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


def _aws_private_key_file(c: StackValues) -> str | None:
    if c.aws_private_key_file and (msg := key_file_error(c.aws_private_key_file)):
        return f"{_key('aws_private_key_file')}: {msg}"
    return None


def _aws_data_volume(c: StackValues) -> str | None:
    if not 1 <= c.aws_data_volume_gb <= 16384:
        return (
            f"{_key('aws_data_volume_gb')}: {c.aws_data_volume_gb} is out of range; "
            "allowed is 1..16384 (GiB of gp3)"
        )
    return None


def require_aws(c: StackValues) -> None:
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


# In the order `infra.config.checks` runs them (the order of the messages).
CHECKS: list[Callable[[StackValues], str | None]] = [
    _aws_region,
    _aws_instance_type("aws_control_instance_type"),
    _aws_instance_type("aws_worker_instance_type"),
    _aws_operator_cidr,
    _aws_public_key,
    _aws_private_key_file,
    _aws_data_volume,
]
