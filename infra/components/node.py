"""One server of the local stack: a long-running container and its own volumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi

from infra.local_docker import Container, ContainerArgs, PortBinding, Volume, VolumeMount
from infra.topology import (
    LABEL_DATA,
    LABEL_NODE,
    LABEL_ROLES,
    SPARK_MASTER_UI_PORT,
    NodeSpec,
)

# The container's main process. Containers have no init system: once provisioning has
# installed supervisord (which keeps every daemon up), this loop keeps supervisord itself
# up, also after the container restarts (restart policy) or the engine does.
KEEP_SUPERVISOR = (
    "while :; do if [ -x /etc/init.d/supervisor ]; then "
    "/etc/init.d/supervisor status >/dev/null 2>&1 "
    "|| /etc/init.d/supervisor start >/dev/null 2>&1; "
    "fi; sleep 10; done"
)


@dataclass
class NodeArgs:
    spec: NodeSpec
    prefix: str
    image: str
    network_name: str
    network_id: pulumi.Input[str]
    labels: dict[str, str]
    bind_address: str = "127.0.0.1"
    shared_mounts: dict[str, str] = field(default_factory=dict)  # volume name -> path
    host_mounts: dict[str, str] = field(default_factory=dict)  # host folder -> path, read-only
    retain_data: bool = False


class Node(pulumi.ComponentResource):
    """A container with a stable hostname on the stack's network, limits and labels."""

    container_id: pulumi.Output[str]
    address: pulumi.Output[str]
    ui_port: pulumi.Output[int | None]

    def __init__(
        self, name: str, args: NodeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:cluster:Node", name, None, opts)
        spec = args.spec
        child = pulumi.ResourceOptions(parent=self)
        mounts = [VolumeMount(volume=v, target=t) for v, t in args.shared_mounts.items()]
        mounts += [
            VolumeMount(volume=h, target=t, read_only=True, kind="bind")
            for h, t in args.host_mounts.items()
        ]
        own_volumes = []
        for suffix, target in spec.volumes.items():
            volume_name = f"{args.prefix}-{suffix}"
            own_volumes.append(
                Volume(
                    suffix,
                    name=volume_name,
                    labels={**args.labels, LABEL_DATA: "true"},
                    opts=pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_data),
                )
            )
            mounts.append(VolumeMount(volume=volume_name, target=target))
        ports = []
        if spec.ui_port is not None:
            ports.append(
                PortBinding(
                    internal=SPARK_MASTER_UI_PORT, external=spec.ui_port, host_ip=args.bind_address
                )
            )
        container_args = ContainerArgs(
            name=f"{args.prefix}-{spec.key}",
            image=args.image,
            hostname=spec.key,
            network=args.network_name,
            aliases=[spec.key],
            command=["sh", "-c", KEEP_SUPERVISOR],
            labels={**args.labels, LABEL_NODE: spec.key, LABEL_ROLES: ",".join(spec.roles)},
            cpus=spec.cpus,
            memory=spec.memory,
            ports=ports,
            mounts=mounts,
        )
        container = Container(
            f"{name}-container",
            container_args,
            network_id=args.network_id,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=own_volumes)
            ),
        )
        self.container_id = container.container_id
        self.address = container.ip_address
        self.ui_port = container.published_ports.apply(
            lambda p: (
                int(p[str(SPARK_MASTER_UI_PORT)]) if p and str(SPARK_MASTER_UI_PORT) in p else None
            )
        )
        self.register_outputs(
            {"container_id": self.container_id, "address": self.address, "ui_port": self.ui_port}
        )
