"""The Docker engine as the program sees it: one client, and the checks made before any
resource is declared (engine answers, base image present, ports free, no legacy stack).

The resources themselves are `pulumi_docker`'s; this module only looks, it never creates.
The one change it makes is temporary: `cpu_boost` lifts the nodes' CPU limits while they are
provisioned and puts back exactly what the containers had.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

from infra.topology import LABEL_MANAGED_BY, LABEL_STACK, MANAGED_BY


class EngineError(RuntimeError):
    """The Docker engine did not answer, or something on it stops the stack; the message
    says what and what to do."""


def docker_client(timeout: int = 120) -> Any:
    """A client for the engine of the current environment, checked to answer."""
    import docker  # imported here: unit tests under mocks do not need an engine

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # the SDK raises several types for "no engine"
        raise EngineError(
            f"the Docker engine does not answer ({exc}); start it (`make setup` starts "
            "dockerd on Linux) or point DOCKER_HOST at one"
        ) from None
    return client


def image_id(client: Any, name: str) -> str | None:
    """The id of a local image, or None when the engine does not have it."""
    try:
        return str(client.images.get(name).id)
    except Exception as exc:
        if type(exc).__name__ in ("ImageNotFound", "NotFound"):
            return None
        raise EngineError(f"the engine failed to look up image {name!r}: {exc}") from None


def require_image(client: Any, name: str, key: str) -> str:
    """The id of `name`, or a clear error naming the config key that chose it."""
    found = image_id(client, name)
    if found is None:
        raise EngineError(
            f"{key}: image {name!r} is not on the Docker engine; `make setup` makes "
            "debian:bookworm (pulled, or built locally with debootstrap), or `docker pull` "
            "or `docker tag` another image under that name"
        )
    return found


def check_no_legacy_stack(client: Any, prefix: str) -> None:
    """Stacks made before the move to pulumi-docker cannot be taken over in place."""
    old = [
        c.name
        for c in client.containers.list(all=True, filters={"label": f"{LABEL_STACK}={prefix}"})
        if c.labels.get(LABEL_MANAGED_BY) != MANAGED_BY
    ]
    if old:
        raise EngineError(
            f"the containers {', '.join(sorted(old))} were made by an older trainstack "
            "(home-made Docker resources, before pulumi-docker); destroy that stack with the "
            "version that made it (`git checkout <that commit> && make destroy`), then come "
            "back and run `make up` (docs/troubleshooting.md, 'older trainstack')"
        )


def check_ports_free(
    client: Any,
    wanted: dict[str, tuple[str, int]],
    what: str = "Spark UI",
    key: str = "trainstack:uiPortBase",
) -> None:
    """Every fixed host port is free, or already published by this stack's own node.

    `wanted` maps a node's container name to (host address, port). Checked before anything
    is created, so a taken port is one clear sentence instead of a half-made stack.
    """
    for container, (host_ip, port) in sorted(wanted.items()):
        if not port or _published_by(client, container, port):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host_ip, port))
            except OSError as exc:
                raise EngineError(
                    f"port {host_ip}:{port} on the host is already in use ({exc.strerror}),"
                    f" wanted for {container}'s {what}; free it, or change "
                    f"{key} (0 lets the engine pick free ports)"
                ) from None


def _published_by(client: Any, container: str, port: int) -> bool:
    try:
        found = client.containers.get(container)
    except Exception:
        return False
    bindings = (found.attrs.get("HostConfig") or {}).get("PortBindings") or {}
    return any(str(b.get("HostPort")) == str(port) for bs in bindings.values() for b in bs or [])


def _set_cpus(containers: dict[str, int]) -> None:
    """`docker update --cpus` (nano-CPUs; the SDK has no call for NanoCpus), one call per
    limit: the CLI updates every container it names, going on past one that fails, so a
    restore is quick and never stops half-way."""
    docker_cli = shutil.which("docker") or "docker"
    by_limit: dict[int, list[str]] = {}
    for name, nano in containers.items():
        by_limit.setdefault(nano, []).append(name)
    errors = []
    for nano, names in by_limit.items():
        proc = subprocess.run(
            [docker_cli, "update", "--cpus", f"{nano / 1e9:g}", *names],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            errors.append(
                f"could not set the CPU limit of {', '.join(names)} to {nano / 1e9:g}: "
                f"{(proc.stderr or proc.stdout).strip()}"
            )
    if errors:
        raise EngineError("; ".join(errors))


@contextlib.contextmanager
def cpu_boost(containers: list[str], cpus: float | None = None) -> Iterator[dict[str, float]]:
    """Run the block with the CPU limit of `containers` raised to `cpus` (default: every CPU
    of the engine's host), then give each container back the limit it had.

    Provisioning starts every daemon of a node at once (JVMs for ZooKeeper and Spark) while
    Ansible runs its modules there; under a limit of a fraction of a CPU that start-up is
    what takes the time, as for Kubernetes' start-up CPU boost. Containers without a limit
    are left alone. Yields {container: limit it had, in CPUs}.
    """
    client = docker_client()
    target = int((cpus or float(client.info().get("NCPU") or os.cpu_count() or 1)) * 1e9)
    before: dict[str, int] = {}
    for name in containers:
        nano = int((client.containers.get(name).attrs.get("HostConfig") or {}).get("NanoCpus") or 0)
        if 0 < nano < target:
            before[name] = nano
    try:
        _set_cpus(dict.fromkeys(before, target))
        yield {name: nano / 1e9 for name, nano in before.items()}
    finally:
        _set_cpus(before)
