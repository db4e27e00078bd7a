"""How the control machine reaches a node: run a command, stream one, read or write a file.

One interface, `Transport` (`base.py`, with `TransportError`), two transports:

* `DockerTransport` (`docker.py`): a container on the local Docker engine (the docker
  target), through the docker SDK.
* `SshTransport` (`ssh.py`): an existing server (the ssh target), through the OpenSSH client,
  host keys checked, no password prompt, other users through `sudo -n`.

`transport_for` makes one from a node record as the Pulumi program passes it to a provider:
``{"name": "worker-1", "transport": "docker", "container": "ts-dev-worker-1"}`` or
``{"name": "wrk-1", "transport": "ssh", "host": "10.0.0.5", "port": 22, "user": "deploy",
"private_key_file": "/path/key", "known_hosts_file": "/path/known_hosts"}``. A bare string
is a container name (the state of stacks made before node records holds those).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.transport.base import Transport, TransportError, one_line
from infra.transport.docker import DockerTransport, EngineClient
from infra.transport.ssh import SshTransport

__all__ = [
    "DockerTransport",
    "SshTransport",
    "Transport",
    "TransportError",
    "one_line",
    "transport_for",
    "transports_for",
]


def _require(node: Mapping[str, Any], key: str) -> Any:
    value = node.get(key)
    if value in (None, ""):
        raise TransportError(f"node record {dict(node)!r}: `{key}` is missing")
    return value


def transport_for(node: Mapping[str, Any] | str, *, engine: Any = None) -> Transport:
    """The transport of one node record (a bare string: a container name)."""
    if isinstance(node, str):
        return DockerTransport(node, engine=engine)
    kind = node.get("transport") or "docker"
    if kind == "docker":
        return DockerTransport(str(_require(node, "container")), engine=engine)
    if kind == "ssh":
        return SshTransport(
            name=str(node.get("name") or _require(node, "host")),
            host=str(_require(node, "host")),
            # Numbers come back from Pulumi's engine as floats.
            port=int(node.get("port") or 22),
            user=str(_require(node, "user")),
            private_key_file=node.get("private_key_file") or None,
            known_hosts_file=node.get("known_hosts_file") or None,
        )
    raise TransportError(f"node record {dict(node)!r}: unknown transport {kind!r} (docker or ssh)")


def transports_for(nodes: Sequence[Mapping[str, Any] | str]) -> list[Transport]:
    """The transports of a list of node records; the docker ones share one engine client."""
    engine = EngineClient()
    return [transport_for(node, engine=engine) for node in nodes]
