"""Dynamic providers for Docker networks, volumes and containers, and a random secret.

Each provider talks to the engine named by the usual Docker environment (DOCKER_HOST,
or the local socket). Inputs are plain JSON-able values so state diffs stay readable.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

import pulumi
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)

_INTERNAL = ("__provider",)


class EngineError(RuntimeError):
    """The Docker engine did not answer or refused a request."""


def docker_client() -> Any:
    """A client for the engine of the current environment, checked to answer."""
    import docker  # imported here: the provider process needs it, mocks do not

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # the SDK raises several types for "no engine"
        raise EngineError(
            f"the Docker engine does not answer ({exc}); start it (`make setup` starts "
            "dockerd on Linux) or point DOCKER_HOST at one"
        ) from exc
    return client


def _is_not_found(exc: Exception) -> bool:
    return type(exc).__name__ == "NotFound"


def _plain(props: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k not in _INTERNAL}


def _changed(olds: dict[str, Any], news: dict[str, Any], keys: list[str]) -> list[str]:
    return [k for k in keys if olds.get(k) != news.get(k)]


# --------------------------------------------------------------------------- network


class _NetworkProvider(ResourceProvider):
    serialize_as_secret_always = False
    _KEYS = ["name", "driver", "labels", "internal"]

    def create(self, props: dict[str, Any]) -> CreateResult:
        client = docker_client()
        net = client.networks.create(
            props["name"],
            driver=props.get("driver") or "bridge",
            labels=props.get("labels") or {},
            internal=bool(props.get("internal")),
            check_duplicate=True,
        )
        return CreateResult(net.id, {**_plain(props), "network_id": net.id})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        try:
            net = docker_client().networks.get(id_)
        except Exception as exc:
            if _is_not_found(exc):
                return ReadResult(None, {})  # gone: refresh drops it from state
            raise
        return ReadResult(id_, {**props, "name": net.name, "labels": net.attrs.get("Labels")})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = _changed(olds, news, self._KEYS)
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        try:
            docker_client().networks.get(id_).remove()
        except Exception as exc:
            if not _is_not_found(exc):
                raise


class Network(Resource, module="docker", name="Network"):
    """A user-defined Docker network."""

    network_id: pulumi.Output[str]
    name: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        name: pulumi.Input[str],
        labels: dict[str, str] | None = None,
        driver: str = "bridge",
        internal: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "name": name,
            "labels": labels or {},
            "driver": driver,
            "internal": internal,
            "network_id": None,
        }
        super().__init__(_NetworkProvider(), resource_name, props, opts)


# --------------------------------------------------------------------------- volume


class _VolumeProvider(ResourceProvider):
    serialize_as_secret_always = False
    _KEYS = ["name", "driver", "labels"]

    def create(self, props: dict[str, Any]) -> CreateResult:
        client = docker_client()
        try:
            # A volume kept by an earlier stack (retainData) is adopted, not lost.
            vol = client.volumes.get(props["name"])
        except Exception as exc:
            if not _is_not_found(exc):
                raise
            vol = client.volumes.create(
                props["name"], driver=props.get("driver") or "local", labels=props.get("labels")
            )
        return CreateResult(vol.name, {**_plain(props), "mountpoint": vol.attrs.get("Mountpoint")})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        try:
            vol = docker_client().volumes.get(id_)
        except Exception as exc:
            if _is_not_found(exc):
                return ReadResult(None, {})
            raise
        return ReadResult(id_, {**props, "mountpoint": vol.attrs.get("Mountpoint")})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = _changed(olds, news, self._KEYS)
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        try:
            docker_client().volumes.get(id_).remove(force=True)
        except Exception as exc:
            if not _is_not_found(exc):
                raise


class Volume(Resource, module="docker", name="Volume"):
    """A named Docker volume."""

    name: pulumi.Output[str]
    mountpoint: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        name: pulumi.Input[str],
        labels: dict[str, str] | None = None,
        driver: str = "local",
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {"name": name, "labels": labels or {}, "driver": driver, "mountpoint": None}
        super().__init__(_VolumeProvider(), resource_name, props, opts)


# ------------------------------------------------------------------------ container


@dataclass
class PortBinding:
    """Publish `internal`/tcp on `host_ip:external` (external 0: the engine picks)."""

    internal: int
    external: int = 0
    host_ip: str = "127.0.0.1"


@dataclass
class VolumeMount:
    """A named volume (`kind="volume"`) or a host folder (`kind="bind"`) at `target`."""

    volume: str
    target: str
    read_only: bool = False
    kind: str = "volume"


@dataclass
class ContainerArgs:
    name: str
    image: str
    hostname: str
    network: str
    aliases: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=lambda: ["sleep", "infinity"])
    env: dict[str, str] = field(default_factory=dict)
    cpus: float = 1.0
    memory: str = "1g"
    restart: str = "unless-stopped"
    ports: list[PortBinding] = field(default_factory=list)
    mounts: list[VolumeMount] = field(default_factory=list)


def _port_free(host_ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host_ip, port))
        except OSError:
            return False
    return True


def _published(container: Any) -> dict[str, int]:
    ports = container.attrs.get("NetworkSettings", {}).get("Ports") or {}
    out: dict[str, int] = {}
    for key, bindings in ports.items():
        if bindings:
            out[key.split("/")[0]] = int(bindings[0]["HostPort"])
    return out


class _ContainerProvider(ResourceProvider):
    serialize_as_secret_always = False
    # Changes to these need a new container; cpus, memory and restart update in place.
    _REPLACE = [
        "name",
        "image",
        "hostname",
        "network",
        "aliases",
        "labels",
        "command",
        "env",
        "ports",
        "mounts",
        "network_ref",
    ]
    _UPDATE = ["cpus", "memory", "restart"]

    def create(self, props: dict[str, Any]) -> CreateResult:
        from docker.types import Mount

        client = docker_client()
        ports = {}
        for raw in props.get("ports") or []:
            # Numbers come back from the engine's protobuf Structs as floats.
            p = {**raw, "internal": int(raw["internal"]), "external": int(raw["external"])}
            if p["external"] and not _port_free(p["host_ip"], p["external"]):
                raise EngineError(
                    f"port {p['host_ip']}:{p['external']} on the host is already in use "
                    f"(wanted for {props['name']}:{p['internal']}); free it or change "
                    "trainstack:uiPortBase (0 lets the engine pick free ports)"
                )
            ports[f"{p['internal']}/tcp"] = (p["host_ip"], p["external"] or None)
        mounts = [
            Mount(
                m["target"],
                m["volume"],
                type=m.get("kind") or "volume",
                read_only=bool(m["read_only"]),
            )
            for m in props.get("mounts") or []
        ]
        try:
            stale = client.containers.get(props["name"])
        except Exception as exc:
            if not _is_not_found(exc):
                raise
        else:
            # Left over by an interrupted run of this same stack (same labels): replace it.
            if stale.labels.get("org.trainstack.stack") == props["labels"].get(
                "org.trainstack.stack"
            ):
                stale.remove(force=True)
        container = client.containers.create(
            props["image"],
            props["command"],
            name=props["name"],
            hostname=props["hostname"],
            labels=props["labels"],
            environment=props.get("env") or {},
            nano_cpus=int(float(props["cpus"]) * 1e9),
            mem_limit=props["memory"],
            restart_policy={"Name": props["restart"]},
            ports=ports,
            mounts=mounts,
            init=True,
            detach=True,
        )
        # Attach to our network (with aliases) instead of the default bridge.
        with contextlib.suppress(Exception):  # not attached to the default bridge
            client.networks.get("bridge").disconnect(container)
        client.networks.get(props["network"]).connect(
            container, aliases=props.get("aliases") or [props["hostname"]]
        )
        container.start()
        container.reload()
        return CreateResult(container.id, self._outs(props, container))

    def _outs(self, props: dict[str, Any], container: Any) -> dict[str, Any]:
        nets = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
        address = (nets.get(props["network"]) or {}).get("IPAddress", "")
        return {
            **_plain(props),
            "container_id": container.id,
            "ip_address": address,
            "published_ports": _published(container),
        }

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        try:
            container = docker_client().containers.get(id_)
        except Exception as exc:
            if _is_not_found(exc):
                return ReadResult(None, {})
            raise
        return ReadResult(id_, self._outs(props, container))

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = _changed(olds, news, self._REPLACE)
        updates = _changed(olds, news, self._UPDATE)
        return DiffResult(
            changes=bool(replaces or updates), replaces=replaces, delete_before_replace=True
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        container = docker_client().containers.get(id_)
        container.update(
            nano_cpus=int(float(news["cpus"]) * 1e9),
            mem_limit=news["memory"],
            memswap_limit=-1,
            restart_policy={"Name": news["restart"]},
        )
        container.reload()
        return UpdateResult(self._outs(news, container))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        try:
            docker_client().containers.get(id_).remove(force=True, v=False)
        except Exception as exc:
            if not _is_not_found(exc):
                raise


class Container(Resource, module="docker", name="Container"):
    """A long-running Docker container attached to one user-defined network."""

    container_id: pulumi.Output[str]
    ip_address: pulumi.Output[str]
    published_ports: pulumi.Output[dict[str, int]]
    name: pulumi.Output[str]
    hostname: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        args: ContainerArgs,
        *,
        network_id: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props: dict[str, Any] = asdict(args)
        # Depend on the network's id so a replaced network replaces its containers.
        props["network_ref"] = network_id
        props.update({"container_id": None, "ip_address": None, "published_ports": None})
        super().__init__(_ContainerProvider(), resource_name, props, opts)


# ---------------------------------------------------------------------------- secret


class _RandomSecretProvider(ResourceProvider):
    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> CreateResult:
        value = secrets.token_urlsafe(int(props.get("length") or 32))
        return CreateResult(secrets.token_hex(8), {**_plain(props), "value": value})

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = _changed(olds, news, ["length", "keepers"])
        return DiffResult(changes=bool(changed), replaces=changed)


class RandomSecret(Resource, module="secret", name="RandomSecret"):
    """A random token made once and kept, encrypted, in the stack's state."""

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
