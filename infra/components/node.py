"""One server of the local stack: a long-running container and its own volumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker

from infra.topology import (
    LABEL_DATA,
    LABEL_NODE,
    LABEL_ROLES,
    PROMETHEUS_PORT,
    SPARK_MASTER_UI_PORT,
    NodeSpec,
)

# The main process of a node that is not started from the baked image (trainstack:bakeImage
# false): it only keeps the container up; provisioning installs supervisord and its role
# starts it, exactly once. A baked image's own CMD is supervisord (docs/provisioning.md).
IDLE_COMMAND = ["sleep", "infinity"]


def mebibytes(size_bytes: int) -> int:
    """pulumi-docker takes memory in MiB."""
    return max(1, size_bytes // 1024**2)


def docker_labels(labels: dict[str, str]) -> list[docker.ContainerLabelArgs]:
    return [docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())]


@dataclass
class NodeArgs:
    spec: NodeSpec
    prefix: str
    image: pulumi.Input[str]  # an image id (the baked node image, or the base image)
    baked: bool  # the image's CMD runs supervisord; otherwise IDLE_COMMAND
    network_name: pulumi.Input[str]
    labels: dict[str, str]
    memory_bytes: int
    bind_address: str = "127.0.0.1"
    # (volume name, mount path); names as outputs of the volumes, so nodes wait for them.
    shared_volumes: list[tuple[pulumi.Input[str], str]] = field(default_factory=list)
    retain_data: bool = False


class Node(pulumi.ComponentResource):
    """A container with a stable hostname on the stack's network, limits and labels."""

    container_id: pulumi.Output[str]
    address: pulumi.Output[str]
    ui_port: pulumi.Output[int | None]
    monitoring_port: pulumi.Output[int | None]

    def __init__(
        self, name: str, args: NodeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:cluster:Node", name, None, opts)
        spec = args.spec
        mounts = [
            docker.ContainerMountArgs(type="volume", source=v, target=t)
            for v, t in args.shared_volumes
        ]
        own_volumes = []
        for suffix, target in spec.volumes.items():
            volume = docker.Volume(
                suffix,
                name=f"{args.prefix}-{suffix}",
                labels=[
                    docker.VolumeLabelArgs(label=k, value=v)
                    for k, v in sorted({**args.labels, LABEL_DATA: "true"}.items())
                ],
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_data),
            )
            own_volumes.append(volume)
            mounts.append(
                docker.ContainerMountArgs(type="volume", source=volume.name, target=target)
            )
        # Published ports: the master UI and Prometheus's, on the nodes that have them.
        published = {SPARK_MASTER_UI_PORT: spec.ui_port, PROMETHEUS_PORT: spec.monitoring_port}
        ports = [
            docker.ContainerPortArgs(internal=inner, external=outer or None, ip=args.bind_address)
            for inner, outer in published.items()
            if outer is not None
        ]
        memory = mebibytes(args.memory_bytes)
        container = docker.Container(
            f"{name}-container",
            name=f"{args.prefix}-{spec.key}",
            image=args.image,
            hostname=spec.key,
            command=None if args.baked else IDLE_COMMAND,
            networks_advanced=[
                docker.ContainerNetworksAdvancedArgs(name=args.network_name, aliases=[spec.key])
            ],
            labels=docker_labels(
                {**args.labels, LABEL_NODE: spec.key, LABEL_ROLES: ",".join(spec.roles)}
            ),
            cpus=f"{spec.cpus:g}",
            # Swap equal to memory: no swap, and no `memorySwap` diff on every preview.
            memory=memory,
            memory_swap=memory,
            restart="unless-stopped",
            init=True,
            ports=ports,
            mounts=mounts,
            opts=pulumi.ResourceOptions(parent=self, depends_on=own_volumes),
        )
        self.container_id = container.id
        self.address = container.network_datas.apply(
            lambda nets: next((n.ip_address or "" for n in nets or []), "")
        )
        self.ui_port = container.ports.apply(lambda ps: _host_port(ps, SPARK_MASTER_UI_PORT))
        self.monitoring_port = container.ports.apply(lambda ps: _host_port(ps, PROMETHEUS_PORT))
        self.register_outputs(
            {"container_id": self.container_id, "address": self.address, "ui_port": self.ui_port}
        )


def _host_port(ports: Any, internal: int) -> int | None:
    """The host port the engine published for `internal`, or None."""
    return next(
        (int(p.external) for p in ports or [] if p.internal == internal and p.external), None
    )
