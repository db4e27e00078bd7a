"""The docker target (the default): the nodes are containers on the local engine.

`cluster()` checks the engine first (`preflight`: what would fail half-way), declares the
node image (baked by the roles, infra.components.image) or pulls the base image, then one
`DockerCluster`: the stack's network, shared volumes and one `Node` (a container and its own
volumes) per planned node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker

from infra import engine, topology
from infra.components.image import NodeImage, NodeImageArgs
from infra.components.secret import cluster_secret
from infra.config import StackConfig
from infra.images.bake import image_digest, image_tag
from infra.targets.base import TargetArgs
from infra.topology import (
    LABEL_DATA,
    LABEL_NODE,
    LABEL_ROLES,
    MLFLOW_PORT,
    OBJECT_STORE_PORT,
    PROMETHEUS_PORT,
    SPARK_MASTER_UI_PORT,
    NodeSpec,
)

# The main process of a node that is not started from the baked image (trainstack:bakeImage
# false): it only keeps the container up; provisioning installs supervisord and its role
# starts it, exactly once. A baked image's own CMD is supervisord (docs/provisioning.md).
IDLE_COMMAND = ["sleep", "infinity"]


def preflight(config: StackConfig, prefix: str, plan: list[NodeSpec]) -> str:
    """Everything that would fail half-way, checked before any resource is declared.

    Returns the base image's id.
    """
    client = engine.docker_client()
    engine.check_no_legacy_stack(client, prefix)
    base_id = engine.require_image(client, config.base_image, "trainstack:baseImage")
    published = (
        ("ui_port", "Spark UI", "trainstack:uiPortBase"),
        ("monitoring_port", "Prometheus UI", "trainstack:monitoringPort"),
        ("tracking_port", "MLflow UI", "trainstack:trackingPort"),
        ("object_store_port", "object store", "trainstack:objectStorePort"),
    )
    for attr, what, key in published:
        engine.check_ports_free(
            client,
            {
                f"{prefix}-{spec.key}": (config.bind_address, getattr(spec, attr))
                for spec in plan
                if getattr(spec, attr)
            },
            what=what,
            key=key,
        )
    return base_id


def cluster(target: TargetArgs) -> DockerCluster:
    """The docker target: the node image (baked by the roles) and the containers."""
    config = target.config
    plan = topology.plan(config)
    prefix = topology.resource_prefix(config, target.stack)
    try:
        base_id = preflight(config, prefix, plan)
    except engine.EngineError as exc:
        raise pulumi.RunError(str(exc)) from None
    node_image_tag: str | None = None
    if config.bake_image:
        tag = node_image_tag = image_tag(
            config.image_repository, image_digest(config.base_image, base_id)
        )
        node_image = NodeImage(
            "node-image",
            NodeImageArgs(
                tag=tag,
                base_image=config.base_image,
                repository=config.image_repository,
                wheelhouse=str(target.wheelhouse),
                log_path=str(target.artifacts / "image" / f"bake-{tag.rsplit(':', 1)[-1]}.log"),
            ),
        )
        image_id: pulumi.Output[str] = node_image.image_id
        pulumi.export("nodeImage", node_image.summary)
    else:
        base = docker.RemoteImage("base-image", name=config.base_image, keep_locally=True)
        image_id = base.image_id
        pulumi.export("nodeImage", {"tag": config.base_image, "size_bytes": 0, "bake_s": 0.0})
    return DockerCluster(
        "cluster",
        DockerClusterArgs(
            config=config,
            plan=plan,
            project=pulumi.get_project(),
            stack=target.stack,
            image=image_id,
            node_image_tag=node_image_tag,
        ),
    )


@dataclass
class DockerClusterArgs:
    config: StackConfig
    plan: list[NodeSpec]  # topology.plan(config)
    project: str
    stack: str
    # The image every node starts from (an id): the baked node image, or the base image.
    image: pulumi.Input[str]
    # The baked node image's tag (repository:digest) when `image` is it (its CMD runs
    # supervisord; the inventory records it); None when nodes start from the base image.
    node_image_tag: str | None = None


class DockerCluster(pulumi.ComponentResource):
    """Servers, storage and network of one stack, and what the provisioning needs
    (infra.targets.base.ClusterOutputs)."""

    plan: list[NodeSpec]
    nodes: pulumi.Output[list[dict]]
    inventory: pulumi.Output[dict]
    spark_master_url: str
    ui_urls: pulumi.Output[dict[str, str]]
    monitoring_url: pulumi.Output[str] | None
    tracking_url: pulumi.Output[str] | None
    object_store_url: pulumi.Output[str] | None
    spark_auth_secret: pulumi.Output[str]
    secret_id: pulumi.Output[str]
    submit_candidates: list[dict]
    tracking_node: dict | None
    network_name: str
    cpu_boost: bool

    def __init__(
        self, name: str, args: DockerClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:cluster:Cluster", name, None, opts)
        config = args.config
        prefix = topology.resource_prefix(config, args.stack)
        self.prefix = prefix
        labels = topology.labels(args.project, prefix)
        plan = self.plan = args.plan
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
                    memory_bytes=topology.memory_limit(config, spec),
                    bind_address=config.bind_address,
                    shared_volumes=shared,
                    retain_data=config.retain_data,
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[network]),
            )
            for spec in plan
        }

        secret = cluster_secret(config.rotate_secrets, parent=self)
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

        def published(node: topology.NodeSpec | None, port: str) -> pulumi.Output[str] | None:
            """A UI's URL on this machine, from its node's published port (None: no node)."""
            if node is None:
                return None
            return getattr(nodes[node.key], port).apply(
                lambda p: f"http://{shown_host}:{p}" if p else ""
            )

        self.monitoring_url = published(topology.monitoring_node(plan), "monitoring_port")
        self.tracking_url = published(topology.tracking_node(plan), "tracking_port")
        self.object_store_url = published(topology.object_store_node(plan), "object_store_port")
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
            lambda at: topology.inventory(
                config, prefix, plan, addresses=at, node_image=args.node_image_tag
            )
        )
        # Node records (infra.transport): the docker target's nodes are its containers.
        records = {
            spec.key: {"name": spec.key, "transport": "docker", "container": f"{prefix}-{spec.key}"}
            for spec in plan
        }
        self.submit_candidates = [records[s.key] for s in topology.submit_nodes(plan)]
        tracker = topology.tracking_node(plan)
        self.tracking_node = records[tracker.key] if tracker else None
        # The boost lifts the CPU limits of the local engine's containers.
        self.cpu_boost = config.provision_cpu_boost
        self.register_outputs(
            {
                "nodes": self.nodes,
                "spark_master_url": self.spark_master_url,
                "ui_urls": self.ui_urls,
                "inventory": self.inventory,
                "network": self.network_name,
            }
        )


# One server of the local stack: a long-running container and its own volumes.


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
    tracking_port: pulumi.Output[int | None]
    object_store_port: pulumi.Output[int | None]

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
        # Published ports: the master UI, Prometheus's, MLflow's and the object store's S3
        # endpoint, on the nodes that have them.
        published = {
            SPARK_MASTER_UI_PORT: spec.ui_port,
            PROMETHEUS_PORT: spec.monitoring_port,
            MLFLOW_PORT: spec.tracking_port,
            OBJECT_STORE_PORT: spec.object_store_port,
        }
        # In the order of the internal port: the provider reads them back sorted, and any other
        # order is a diff that replaces the container on every `up`.
        ports = [
            docker.ContainerPortArgs(internal=inner, external=outer or None, ip=args.bind_address)
            for inner, outer in sorted(published.items())
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
            # The workstation's NVIDIA GPUs (trainstack:dockerGpus); None: no input, so a
            # stack without GPUs declares its containers as before.
            gpus=spec.container_gpus or None,
            opts=pulumi.ResourceOptions(parent=self, depends_on=own_volumes),
        )
        self.container_id = container.id
        self.address = container.network_datas.apply(
            lambda nets: next((n.ip_address or "" for n in nets or []), "")
        )
        self.ui_port = container.ports.apply(lambda ps: _host_port(ps, SPARK_MASTER_UI_PORT))
        self.monitoring_port = container.ports.apply(lambda ps: _host_port(ps, PROMETHEUS_PORT))
        self.tracking_port = container.ports.apply(lambda ps: _host_port(ps, MLFLOW_PORT))
        self.object_store_port = container.ports.apply(lambda ps: _host_port(ps, OBJECT_STORE_PORT))
        self.register_outputs(
            {"container_id": self.container_id, "address": self.address, "ui_port": self.ui_port}
        )


def _host_port(ports: Any, internal: int) -> int | None:
    """The host port the engine published for `internal`, or None."""
    return next(
        (int(p.external) for p in ports or [] if p.internal == internal and p.external), None
    )
