"""The stack's configuration: read once, typed, validated, in one place.

Every key lives under the `trainstack:` namespace (`pulumi config set trainstack:workers 3`).
`load()` reads them from the stack; `StackConfig.from_mapping()` is the pure part that the
unit tests drive directly. All problems are reported together, each naming the key, the
value and what is allowed, before any resource is declared.

The package, by concept:

- `infra.config` (here): `StackConfig`, the values read from the stack, parsed and checked;
  `load()` reads the current stack's keys.
- `infra.config.stack`: `StackValues`, every key with its default and the derived values.
- `infra.config.checks`: the checks `StackConfig.validate` runs, one per rule.
- `infra.config.servers`: the ssh target's server list (`Server`, `parse_servers`).
- `infra.config.aws`: the aws target's keys and their checks (`require_aws`).
- `infra.config.values`: the namespace, key names, sizes and durations, `ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from infra.config import checks
from infra.config.servers import parse_servers
from infra.config.stack import StackValues
from infra.config.values import NAMESPACE, ConfigError, camel

__all__ = ["ConfigError", "StackConfig", "load"]

# Keys whose values must be Pulumi secrets (encrypted in Pulumi.<stack>.yaml and the state).
SECRET_KEYS = ("s3SecretKey",)


@dataclass(frozen=True)
class StackConfig(StackValues):
    """The stack's values (`StackValues`: every key and its default), read and checked:
    `from_mapping` parses `{camelKey: value}` and runs every check of `infra.config.checks`,
    raising one `ConfigError` that lists each problem."""

    @classmethod
    def config_keys(cls) -> dict[str, str]:
        """Config key (camelCase, as users type it) -> field name."""
        return {camel(f.name): f.name for f in fields(cls)}

    @classmethod
    def from_mapping(
        cls, raw: Mapping[str, Any], secret_keys: frozenset[str] | None = None
    ) -> StackConfig:
        """Build from `{camelKey: value}` (strings as Pulumi stores them, or typed values).
        `secret_keys`: the camelCase keys the stack keeps as secrets (`load()` passes them);
        a key of SECRET_KEYS set in plain text is refused."""
        errors: list[str] = []
        if secret_keys is not None:
            errors += [
                f"{NAMESPACE}:{key}: is stored in plain text; set it as a secret: "
                f"pulumi config set --secret {NAMESPACE}:{key} VALUE"
                for key in SECRET_KEYS
                if raw.get(key) and key not in secret_keys
            ]
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
        errors = checks.errors(self)
        if errors:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))


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


def load() -> StackConfig:
    """Read every `trainstack:*` key of the current stack and validate it."""
    from pulumi.runtime.config import CONFIG, is_config_secret

    prefix = f"{NAMESPACE}:"
    raw = {k[len(prefix) :]: v for k, v in CONFIG.get().items() if k.startswith(prefix)}
    secret = frozenset(k for k in raw if is_config_secret(prefix + k))
    return StackConfig.from_mapping(raw, secret)
