"""The training cluster on the local Docker engine: network, storage, nodes, outputs."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker

from infra import topology
from infra.components.node import Node, NodeArgs
from infra.components.secret import RandomSecret
from infra.config import StackConfig
from infra.topology import LABEL_DATA


@dataclass
class ClusterArgs:
    config: StackConfig
    project: str
    stack: str
    # The image every node starts from (an id): the baked node image, or the base image.
    image: pulumi.Input[str]
    # The baked node image's tag (repository:digest) when `image` is it (its CMD runs
    # supervisord; the inventory records it); None when nodes start from the base image.
    node_image_tag: str | None = None


class Cluster(pulumi.ComponentResource):
    """Servers, storage and network of one stack, and what the provisioning needs."""

    nodes: pulumi.Output[list[dict]]
    spark_master_url: str
    ui_urls: pulumi.Output[dict[str, str]]
    monitoring_url: pulumi.Output[str] | None
    inventory: pulumi.Output[dict]
    spark_auth_secret: pulumi.Output[str]
    secret_id: pulumi.Output[str]

    def __init__(
        self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:cluster:Cluster", name, None, opts)
        config = args.config
        prefix = topology.resource_prefix(config, args.stack)
        self.prefix = prefix
        labels = topology.labels(args.project, prefix)
        plan = topology.plan(config)
        child = pulumi.ResourceOptions(parent=self)

        self.network_name = f"{prefix}-net"
        network = docker.Network(
            "network",
            name=self.network_name,
            driver="bridge",
            labels=[docker.NetworkLabelArgs(label=k, value=v) for k, v in sorted(labels.items())],
            opts=child,
        )

        # Shared storage: the data set and shards, checkpoints, models and metrics.
        shared: list[tuple[pulumi.Input[str], str]] = []
        for suffix, target in topology.SHARED_MOUNTS.items():
            volume = docker.Volume(
                suffix,
                name=f"{prefix}-{suffix}",
                labels=[
                    docker.VolumeLabelArgs(label=k, value=v)
                    for k, v in sorted({**labels, LABEL_DATA: "true"}.items())
                ],
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=config.retain_data),
            )
            shared.append((volume.name, target))

        nodes = {
            spec.key: Node(
                spec.key,
                NodeArgs(
                    spec=spec,
                    prefix=prefix,
                    image=args.image,
                    baked=args.node_image_tag is not None,
                    network_name=network.name,
                    labels=labels,
                    memory_bytes=(
                        config.control_memory_bytes
                        if spec.group == "control"
                        else config.worker_memory_bytes
                    ),
                    bind_address=config.bind_address,
                    shared_volumes=shared,
                    retain_data=config.retain_data,
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[network]),
            )
            for spec in plan
        }

        # A new trainstack:rotateSecrets token replaces the secret; provisioning then re-runs
        # (it follows the secret's id) and every service restarts with the new one.
        secret = RandomSecret(
            "spark-auth-secret",
            keepers={"rotate": config.rotate_secrets} if config.rotate_secrets else {},
            opts=child,
        )
        self.spark_auth_secret = secret.value
        self.secret_id = secret.id
        self.spark_master_url = topology.master_url(plan)
        shown_host = "127.0.0.1" if config.bind_address == "0.0.0.0" else config.bind_address
        addresses = pulumi.Output.all(**{k: n.address for k, n in nodes.items()})
        masters = [spec.key for spec in plan if spec.ui_port is not None]
        ports = pulumi.Output.all(**{k: nodes[k].ui_port for k in masters})
        container_ids = pulumi.Output.all(**{k: n.container_id for k, n in nodes.items()})

        self.ui_urls = ports.apply(
            lambda p: {k: f"http://{shown_host}:{port}" for k, port in p.items() if port}
        )
        monitor = topology.monitoring_node(plan)
        self.monitoring_url = (
            nodes[monitor.key].monitoring_port.apply(
                lambda port: f"http://{shown_host}:{port}" if port else ""
            )
            if monitor
            else None
        )
        self.nodes = pulumi.Output.all(addresses, container_ids).apply(
            lambda ac: [
                {
                    "name": spec.key,
                    "container": f"{prefix}-{spec.key}",
                    "roles": list(spec.roles),
                    "address": ac[0][spec.key],
                    "container_id": ac[1][spec.key],
                }
                for spec in plan
            ]
        )
        self.inventory = addresses.apply(
            lambda a: topology.inventory(
                config, prefix, plan, addresses=a, node_image=args.node_image_tag
            )
        )
        self.register_outputs(
            {
                "nodes": self.nodes,
                "spark_master_url": self.spark_master_url,
                "ui_urls": self.ui_urls,
                "inventory": self.inventory,
                "network": self.network_name,
            }
        )
