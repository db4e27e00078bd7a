"""The cluster on AWS, on paper: the docker target's topology as EC2 instances.

Never run against a real account (none exists here); tested under Pulumi's mocks only
(tests/unit/test_aws_target.py). Its outputs are the ssh target's server list and the
inventory built from it by the one inventory builder (`topology.inventory`). What a real
run would need: docs/targets.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra import topology
from infra.config import StackConfig
from infra.config.aws import require_aws
from infra.config.servers import Server
from infra.topology import NodeSpec

# Debian's own account publishes the official Debian 12 ("bookworm") AMIs; their login
# user is `admin` (sudo without a password), the key comes from the key pair.
DEBIAN_AMI_OWNER = "136693071363"
DEBIAN_AMI_NAME = "debian-12-{arch}-*"
LOGIN_USER = "admin"
SSH_PORT = 22
VPC_CIDR = "10.42.0.0/16"
SUBNET_CIDR = "10.42.1.0/24"
ROOT_VOLUME_GB = 20
DATA_DEVICE = "/dev/sdf"  # on Nitro instances it shows up as /dev/nvme1n1
# Graviton families (t4g, m7g, c6gn, x2gd, a1, ...) run arm64 images.
_ARM_FAMILY = re.compile(r"^(a1|[a-z]+\d+[a-z]*g[a-z]*)$")
# UIs the operator may reach: (security group, port, which nodes listen on it).
UI_PORTS = (
    ("spark-ui", topology.SPARK_MASTER_UI_PORT, lambda spec: spec.is_master),
    ("monitoring-ui", topology.PROMETHEUS_PORT, lambda spec: spec.is_monitoring),
)


def architecture(instance_type: str) -> str:
    """The AMI architecture an instance type runs: "arm64" or "x86_64"."""
    family = instance_type.split(".", 1)[0]
    return "arm64" if _ARM_FAMILY.match(family) else "x86_64"


@dataclass
class AwsClusterArgs:
    config: StackConfig
    project: str
    stack: str


class AwsCluster(pulumi.ComponentResource):
    """Network, security groups, key pair, instances and data disks of one stack on AWS."""

    servers: pulumi.Output[list[dict]]
    inventory: pulumi.Output[dict]
    vpc_id: pulumi.Output[str]
    security_group_ids: dict[str, pulumi.Output[str]]

    def __init__(
        self, name: str, args: AwsClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        config = args.config
        require_aws(config)  # before anything is declared
        super().__init__("trainstack:aws:Cluster", name, None, opts)
        prefix = topology.resource_prefix(config, args.stack)
        plan = topology.plan(config)
        tags = {"trainstack:project": args.project, "trainstack:stack": prefix}
        provider = aws.Provider(
            "aws",
            region=config.aws_region,
            default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
            opts=pulumi.ResourceOptions(parent=self),
        )
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        invoke = pulumi.InvokeOutputOptions(parent=self, provider=provider)

        def named(suffix: str) -> dict[str, str]:
            return {"Name": f"{prefix}-{suffix}"}

        # Network: one VPC, one public subnet in the first available zone, a route out.
        zone = aws.get_availability_zones_output(state="available", opts=invoke).names[0]
        vpc = aws.ec2.Vpc(
            "vpc",
            cidr_block=VPC_CIDR,
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags=named("vpc"),
            opts=child,
        )
        subnet = aws.ec2.Subnet(
            "subnet",
            vpc_id=vpc.id,
            cidr_block=SUBNET_CIDR,
            availability_zone=zone,
            map_public_ip_on_launch=True,
            tags=named("subnet"),
            opts=child,
        )
        gateway = aws.ec2.InternetGateway(
            "gateway", vpc_id=vpc.id, tags=named("gateway"), opts=child
        )
        routes = aws.ec2.RouteTable("routes", vpc_id=vpc.id, tags=named("routes"), opts=child)
        # Outbound only: apt and pip on the nodes. No ingress rule below is this wide.
        aws.ec2.Route(
            "default-route",
            route_table_id=routes.id,
            destination_cidr_block="0.0.0.0/0",
            gateway_id=gateway.id,
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            "subnet-routes", subnet_id=subnet.id, route_table_id=routes.id, opts=child
        )

        # Security: every node is in `cluster`, open to itself (all traffic between the
        # nodes' private addresses) and to the operator for SSH; each UI has a group of
        # its own, on the nodes that serve it, open to the operator only.
        cluster = aws.ec2.SecurityGroup(
            "cluster",
            vpc_id=vpc.id,
            description="trainstack nodes: each other, and SSH from the operator",
            tags=named("cluster"),
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            "cluster-internal",
            security_group_id=cluster.id,
            referenced_security_group_id=cluster.id,
            ip_protocol="-1",
            description="all traffic between the cluster's nodes",
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            "cluster-ssh",
            security_group_id=cluster.id,
            cidr_ipv4=config.aws_operator_cidr,
            ip_protocol="tcp",
            from_port=SSH_PORT,
            to_port=SSH_PORT,
            description="SSH from the operator",
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            "cluster-egress",
            security_group_id=cluster.id,
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="-1",
            description="outbound: packages, wheels, time",
            opts=child,
        )
        ui_groups: dict[str, aws.ec2.SecurityGroup] = {}
        for group_name, port, serves in UI_PORTS:
            if not any(serves(spec) for spec in plan):
                continue
            group = aws.ec2.SecurityGroup(
                group_name,
                vpc_id=vpc.id,
                description=f"trainstack {group_name}: port {port} from the operator",
                tags=named(group_name),
                opts=child,
            )
            aws.vpc.SecurityGroupIngressRule(
                f"{group_name}-operator",
                security_group_id=group.id,
                cidr_ipv4=config.aws_operator_cidr,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                description=f"port {port} from the operator",
                opts=child,
            )
            ui_groups[group_name] = group

        key_pair = aws.ec2.KeyPair(
            "key-pair",
            key_name=f"{prefix}-key",
            public_key=config.aws_public_key.strip(),
            tags=named("key"),
            opts=child,
        )
        amis = {
            arch: aws.ec2.get_ami_output(
                most_recent=True,
                owners=[DEBIAN_AMI_OWNER],
                filters=[
                    aws.ec2.GetAmiFilterArgs(
                        name="name",
                        values=[
                            DEBIAN_AMI_NAME.format(arch="arm64" if arch == "arm64" else "amd64")
                        ],
                    ),
                    aws.ec2.GetAmiFilterArgs(name="architecture", values=[arch]),
                    aws.ec2.GetAmiFilterArgs(name="virtualization-type", values=["hvm"]),
                ],
                opts=invoke,
            ).id
            for arch in sorted(
                {
                    architecture(config.aws_control_instance_type),
                    architecture(config.aws_worker_instance_type),
                }
            )
        }

        instances: dict[str, aws.ec2.Instance] = {}
        for spec in plan:
            instance_type = (
                config.aws_control_instance_type
                if spec.group == "control"
                else config.aws_worker_instance_type
            )
            groups = [cluster.id] + [
                ui_groups[g].id for g, _, serves in UI_PORTS if g in ui_groups and serves(spec)
            ]
            node_tags = {**named(spec.key), "trainstack:roles": ",".join(spec.roles)}
            instance = aws.ec2.Instance(
                spec.key,
                ami=amis[architecture(instance_type)],
                instance_type=instance_type,
                subnet_id=subnet.id,
                vpc_security_group_ids=groups,
                key_name=key_pair.key_name,
                associate_public_ip_address=True,
                root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                    volume_size=ROOT_VOLUME_GB, volume_type="gp3", encrypted=True
                ),
                # IMDSv2 only: no credential theft through a plain GET from a node.
                metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                    http_tokens="required", http_endpoint="enabled"
                ),
                tags=node_tags,
                opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[gateway]),
            )
            data = aws.ebs.Volume(
                f"{spec.key}-data",
                availability_zone=subnet.availability_zone,
                size=config.aws_data_volume_gb,
                type="gp3",
                encrypted=True,
                tags={**named(f"{spec.key}-data"), "trainstack:node": spec.key},
                opts=pulumi.ResourceOptions(
                    parent=self, provider=provider, retain_on_delete=config.retain_data
                ),
            )
            aws.ec2.VolumeAttachment(
                f"{spec.key}-data",
                device_name=DATA_DEVICE,
                volume_id=data.id,
                instance_id=instance.id,
                opts=child,
            )
            instances[spec.key] = instance

        endpoints = pulumi.Output.all(
            **{key: pulumi.Output.all(i.public_ip, i.private_ip) for key, i in instances.items()}
        )
        key_file = config.aws_private_key_file
        records = endpoints.apply(lambda e: servers_of(plan, e, key_file))
        self.servers = records.apply(lambda rs: [r.as_dict() for r in rs])
        self.inventory = records.apply(
            lambda rs: topology.inventory(config, prefix, plan, servers=rs)
        )
        self.vpc_id = vpc.id
        self.security_group_ids = {
            "cluster": cluster.id,
            **{name: group.id for name, group in ui_groups.items()},
        }
        self.register_outputs(
            {
                "servers": self.servers,
                "inventory": self.inventory,
                "vpc_id": self.vpc_id,
                "security_group_ids": self.security_group_ids,
            }
        )


def servers_of(
    plan: list[NodeSpec], endpoints: dict[str, list[str]], private_key_file: str
) -> list[Server]:
    """The ssh target's server list: node key -> [public, private] address.

    Ansible connects to the public address; the nodes reach each other at the private one
    (only that traffic matches the cluster group's rule for itself).
    """
    return [
        Server(
            name=spec.key,
            address=endpoints[spec.key][0],
            node_address=endpoints[spec.key][1],
            user=LOGIN_USER,
            port=SSH_PORT,
            private_key_file=private_key_file,
            # The ssh target puts the tracking server on its first control server itself;
            # `tracking` is no role a server lists.
            roles=tuple(r for r in spec.roles if r != topology.TRACKING_ROLE),
        )
        for spec in plan
    ]
