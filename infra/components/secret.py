"""A random secret made once and kept, encrypted, in the stack's state.

A dynamic provider: the stock `pulumi_random` provider plugin cannot be downloaded or built
here (docs/provisioning.md), and this is the whole of what the stack needs from it.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider


class _RandomSecretProvider(ResourceProvider):
    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> CreateResult:
        value = secrets.token_urlsafe(int(props.get("length") or 32))
        return CreateResult(secrets.token_hex(8), {**props, "value": value})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in ("length", "keepers") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=changed)


class RandomSecret(Resource, module="secret", name="RandomSecret"):
    """A random URL-safe token; `value` is a Pulumi secret."""

    value: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        length: int = 32,
        keepers: dict[str, str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {"length": length, "keepers": keepers or {}, "value": None}
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["value"])
        )
        super().__init__(_RandomSecretProvider(), resource_name, props, opts)


def cluster_secret(rotate: str, parent: pulumi.Resource) -> RandomSecret:
    """The cluster's Spark auth secret, a child of the target's cluster (`parent`).

    A new trainstack:rotateSecrets token (`rotate`) replaces the secret; provisioning then
    re-runs (it follows the secret's id) and every service restarts with the new one.
    """
    return RandomSecret(
        "spark-auth-secret",
        keepers={"rotate": rotate} if rotate else {},
        opts=pulumi.ResourceOptions(parent=parent),
    )


def derived_secret(cluster: str, purpose: str) -> str:
    """A service's secret derived from the cluster secret, rotated with it: the SHA-256 (hex)
    of `<cluster secret>:<purpose>`. playbooks/group_vars/all.yml derives the same with
    Ansible's `hash('sha256')` (e.g. purpose "object-store": the object store's secret key,
    which the stack also exports as the secret output objectStoreSecretKey)."""
    return hashlib.sha256(f"{cluster}:{purpose}".encode()).hexdigest()
