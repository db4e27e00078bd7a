"""The aws target on paper: what it declares, under Pulumi's mocks (no account exists here)."""

from __future__ import annotations

import ipaddress
import json

import pulumi
import pytest

from infra.config import ConfigError, StackConfig
from infra.targets.aws import DEBIAN_AMI_OWNER, AwsCluster, AwsClusterArgs, architecture

pytestmark = pytest.mark.unit

OPERATOR = "203.0.113.7/32"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9wZXJhdG9yLWtleS1mb3ItdGVzdHM operator@laptop"
T = {
    "component": "trainstack:aws:Cluster",
    "provider": "pulumi:providers:aws",
    "vpc": "aws:ec2/vpc:Vpc",
    "subnet": "aws:ec2/subnet:Subnet",
    "gateway": "aws:ec2/internetGateway:InternetGateway",
    "route_table": "aws:ec2/routeTable:RouteTable",
    "route": "aws:ec2/route:Route",
    "association": "aws:ec2/routeTableAssociation:RouteTableAssociation",
    "group": "aws:ec2/securityGroup:SecurityGroup",
    "ingress": "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
    "egress": "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
    "key_pair": "aws:ec2/keyPair:KeyPair",
    "instance": "aws:ec2/instance:Instance",
    "volume": "aws:ebs/volume:Volume",
    "attachment": "aws:ec2/volumeAttachment:VolumeAttachment",
}


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []
        self.calls: list[pulumi.runtime.MockCallArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outs = dict(args.inputs)
        if args.typ == T["instance"]:
            n = len(self.of_type(T["instance"]))
            outs["publicIp"] = f"198.51.100.{n}"
            outs["privateIp"] = f"10.42.1.{10 + n}"
        # Ids name the kind and the resource, so the tests see what refers to what.
        return [f"{args.typ.rsplit(':', 1)[-1]}/{args.name}", outs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append(args)
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": ["us-east-1a", "us-east-1b"], "zoneIds": ["use1-az1", "use1-az2"]}
        if args.token == "aws:ec2/getAmi:getAmi":
            arch = next(f["values"][0] for f in args.args["filters"] if f["name"] == "architecture")
            return {"id": f"ami-debian12-{arch}", "architecture": arch}
        raise AssertionError(f"unexpected invoke {args.token}")

    def of_type(self, key_or_type: str) -> list[pulumi.runtime.MockResourceArgs]:
        typ = T.get(key_or_type, key_or_type)
        return [r for r in self.resources if r.typ == typ]

    def named(self, key: str, name: str) -> pulumi.runtime.MockResourceArgs:
        (found,) = [r for r in self.of_type(key) if r.name == name]
        return found


@pytest.fixture
def mocks() -> Mocks:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="trainstack", stack="unit", preview=False)
    return m


def aws_config(**overrides) -> StackConfig:
    values = {"aws_operator_cidr": OPERATOR, "aws_public_key": PUBLIC_KEY, **overrides}
    return StackConfig(**values)


def build(config: StackConfig) -> AwsCluster:
    return AwsCluster("aws", AwsClusterArgs(config=config, project="trainstack", stack="unit"))


def declare(config: StackConfig) -> tuple[list[dict], dict]:
    """Run the component under the mocks to the end (every registration answered); its
    server list and inventory as plain values."""
    result: dict = {}

    @pulumi.runtime.test
    def run():
        cluster = build(config)
        return pulumi.Output.all(cluster.servers, cluster.inventory).apply(
            lambda v: result.update(servers=v[0], inventory=v[1])
        )

    run()
    return result["servers"], result["inventory"]


def test_every_resource_of_the_default_topology(mocks):
    declare(aws_config())
    counts = {key: len(mocks.of_type(key)) for key in T}
    assert counts == {
        "component": 1,
        "provider": 1,
        "vpc": 1,
        "subnet": 1,
        "gateway": 1,
        "route_table": 1,
        "route": 1,
        "association": 1,
        "group": 3,  # cluster, spark-ui, monitoring-ui
        "ingress": 4,  # itself, SSH, Spark UI, Prometheus UI
        "egress": 1,
        "key_pair": 1,
        "instance": 5,
        "volume": 5,
        "attachment": 5,
    }
    assert len(mocks.resources) == sum(counts.values())  # nothing else
    provider = mocks.of_type("provider")[0]
    assert provider.inputs["region"] == "us-east-1"
    # A provider's nested settings reach it as JSON text.
    assert json.loads(provider.inputs["defaultTags"])["tags"] == {
        "trainstack:project": "trainstack",
        "trainstack:stack": "trainstack-unit",
    }
    # Every AWS resource goes through the stack's own provider (its region).
    for r in mocks.resources:
        if r.typ not in (T["provider"], T["component"]):
            assert r.provider and "pulumi:providers:aws::aws::" in r.provider, r.name
    vpc = mocks.of_type("vpc")[0].inputs
    subnet = mocks.of_type("subnet")[0].inputs
    assert ipaddress.ip_network(subnet["cidrBlock"]).subnet_of(
        ipaddress.ip_network(vpc["cidrBlock"])
    )
    assert subnet["vpcId"] == "Vpc/vpc"
    assert subnet["availabilityZone"] == "us-east-1a"
    route = mocks.of_type("route")[0].inputs
    assert route["destinationCidrBlock"] == "0.0.0.0/0"
    assert route["gatewayId"] == "InternetGateway/gateway"
    assert route["routeTableId"] == "RouteTable/routes"
    association = mocks.of_type("association")[0].inputs
    assert association == {"subnetId": "Subnet/subnet", "routeTableId": "RouteTable/routes"}
    key_pair = mocks.of_type("key_pair")[0].inputs
    assert key_pair["publicKey"] == PUBLIC_KEY
    assert key_pair["keyName"] == "trainstack-unit-key"


def test_instances_per_role_with_sizes_disks_and_the_debian_image(mocks):
    declare(aws_config(workers=3, aws_data_volume_gb=80))
    instances = {r.name: r.inputs for r in mocks.of_type("instance")}
    assert sorted(instances) == [
        "control-1",
        "control-2",
        "control-3",
        "worker-1",
        "worker-2",
        "worker-3",
    ]
    for name, inputs in instances.items():
        expected = "t3.medium" if name.startswith("control") else "m6i.xlarge"
        assert inputs["instanceType"] == expected
        assert inputs["ami"] == "ami-debian12-x86_64"
        assert inputs["subnetId"] == "Subnet/subnet"
        assert inputs["keyName"] == "trainstack-unit-key"
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        assert inputs["rootBlockDevice"]["encrypted"] is True
        assert inputs["tags"]["Name"] == f"trainstack-unit-{name}"
    assert instances["worker-2"]["tags"]["trainstack:roles"] == "spark_worker,tensorflow"
    assert instances["control-1"]["tags"]["trainstack:roles"] == (
        "zookeeper,spark_master,monitoring,tracking,object_store"
    )
    volumes = {r.name: r.inputs for r in mocks.of_type("volume")}
    assert sorted(volumes) == sorted(f"{n}-data" for n in instances)
    assert all(v["size"] == 80 and v["encrypted"] is True for v in volumes.values())
    assert all(v["availabilityZone"] == "us-east-1a" for v in volumes.values())
    attachments = {r.name: r.inputs for r in mocks.of_type("attachment")}
    for name in instances:
        assert attachments[f"{name}-data"]["instanceId"] == f"Instance/{name}"
        assert attachments[f"{name}-data"]["volumeId"] == f"Volume/{name}-data"
    (ami_call,) = [c for c in mocks.calls if c.token == "aws:ec2/getAmi:getAmi"]
    assert ami_call.args["owners"] == [DEBIAN_AMI_OWNER]
    assert ami_call.args["mostRecent"] is True
    filters = {f["name"]: f["values"] for f in ami_call.args["filters"]}
    assert filters["name"] == ["debian-12-amd64-*"]


def test_graviton_workers_get_the_arm64_image(mocks):
    declare(aws_config(aws_worker_instance_type="m7g.xlarge"))
    amis = {r.name: r.inputs["ami"] for r in mocks.of_type("instance")}
    assert amis["control-1"] == "ami-debian12-x86_64"
    assert amis["worker-1"] == amis["worker-2"] == "ami-debian12-arm64"
    names = sorted(
        next(f["values"][0] for f in c.args["filters"] if f["name"] == "name")
        for c in mocks.calls
        if c.token == "aws:ec2/getAmi:getAmi"
    )
    assert names == ["debian-12-amd64-*", "debian-12-arm64-*"]


@pytest.mark.parametrize(
    ("instance_type", "arch"),
    [
        ("t3.medium", "x86_64"),
        ("m6i.xlarge", "x86_64"),
        ("g5.xlarge", "x86_64"),
        ("g4dn.xlarge", "x86_64"),
        ("t4g.small", "arm64"),
        ("c7gn.large", "arm64"),
        ("m6gd.large", "arm64"),
        ("g5g.xlarge", "arm64"),
        ("a1.large", "arm64"),
    ],
)
def test_architecture_of_instance_types(instance_type, arch):
    assert architecture(instance_type) == arch


def test_no_ingress_from_the_internet_ssh_and_uis_only_from_the_operator(mocks):
    declare(aws_config())
    groups = {r.name: r.inputs for r in mocks.of_type("group")}
    assert sorted(groups) == ["cluster", "monitoring-ui", "spark-ui"]
    # No inline rules: every rule is one of the resources checked below.
    assert not any(g.get("ingress") or g.get("egress") for g in groups.values())
    rules = {r.name: r.inputs for r in mocks.of_type("ingress")}
    for rule in rules.values():
        assert "cidrIpv6" not in rule
        cidr = rule.get("cidrIpv4")
        if cidr is not None:
            assert cidr == OPERATOR  # never 0.0.0.0/0, never anyone else
    assert rules["cluster-internal"] == {
        "securityGroupId": "SecurityGroup/cluster",
        "referencedSecurityGroupId": "SecurityGroup/cluster",
        "ipProtocol": "-1",
        "description": "all traffic between the cluster's nodes",
    }
    opened = {
        (r["securityGroupId"], r["ipProtocol"], r["fromPort"], r["toPort"], r["cidrIpv4"])
        for r in rules.values()
        if "cidrIpv4" in r
    }
    assert opened == {
        ("SecurityGroup/cluster", "tcp", 22, 22, OPERATOR),
        ("SecurityGroup/spark-ui", "tcp", 8080, 8080, OPERATOR),
        ("SecurityGroup/monitoring-ui", "tcp", 9090, 9090, OPERATOR),
    }
    (egress,) = [r.inputs for r in mocks.of_type("egress")]
    assert (egress["securityGroupId"], egress["cidrIpv4"]) == (
        "SecurityGroup/cluster",
        "0.0.0.0/0",
    )
    # Each UI group only on the nodes that serve the UI.
    attached = {r.name: r.inputs["vpcSecurityGroupIds"] for r in mocks.of_type("instance")}
    assert attached == {
        "control-1": [
            "SecurityGroup/cluster",
            "SecurityGroup/spark-ui",
            "SecurityGroup/monitoring-ui",
        ],
        "control-2": ["SecurityGroup/cluster", "SecurityGroup/spark-ui"],
        "control-3": ["SecurityGroup/cluster"],
        "worker-1": ["SecurityGroup/cluster"],
        "worker-2": ["SecurityGroup/cluster"],
    }


def test_without_monitoring_there_is_no_prometheus_port(mocks):
    declare(aws_config(monitoring=False))
    assert sorted(r.name for r in mocks.of_type("group")) == ["cluster", "spark-ui"]
    assert all(r.inputs.get("fromPort") != 9090 for r in mocks.of_type("ingress"))


def test_outputs_are_the_ssh_targets_server_list_and_its_inventory(mocks, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("not a real key\n")
    key.chmod(0o600)
    servers, inventory = declare(aws_config(aws_private_key_file=str(key)))
    by_name = {s["name"]: s for s in servers}
    assert list(by_name) == ["control-1", "control-2", "control-3", "worker-1", "worker-2"]
    instances = [r.name for r in mocks.of_type("instance")]
    for n, name in enumerate(instances, start=1):
        assert by_name[name]["address"] == f"198.51.100.{n}"
        assert by_name[name]["nodeAddress"] == f"10.42.1.{10 + n}"
    assert all(s["user"] == "admin" and s["port"] == 22 for s in servers)
    assert all(s["privateKeyFile"] == str(key) for s in servers)
    assert by_name["worker-1"]["roles"] == ["spark_worker", "tensorflow"]

    all_vars = inventory["all"]["vars"]
    assert all_vars["ansible_connection"] == "ssh"
    private = {name: by_name[name]["nodeAddress"] for name in by_name}
    assert all_vars["trainstack_spark_master_url"] == (
        f"spark://{private['control-1']}:7077,{private['control-2']}:7077"
    )
    assert all_vars["trainstack_zookeeper_connect"] == ",".join(
        f"{private[f'control-{i}']}:2181" for i in (1, 2, 3)
    )
    assert all_vars["trainstack_pushgateway_url"] == f"http://{private['control-1']}:9091"
    children = inventory["all"]["children"]
    host = children["workers"]["hosts"]["worker-2"]
    assert host["ansible_host"] == by_name["worker-2"]["address"]
    assert host["trainstack_node_address"] == by_name["worker-2"]["nodeAddress"]
    assert host["ansible_user"] == "admin"
    assert host["ansible_port"] == 22
    assert host["ansible_ssh_private_key_file"] == str(key)
    assert set(children["spark_master"]["hosts"]) == {"control-1", "control-2"}
    assert set(children["monitoring"]["hosts"]) == {"control-1"}
    assert children["control"]["hosts"]["control-3"]["trainstack_zookeeper_id"] == 3


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"aws_operator_cidr": ""}, ["trainstack:awsOperatorCidr", "not set"]),
        ({"aws_public_key": ""}, ["trainstack:awsPublicKey", "not set"]),
    ],
)
def test_missing_keys_fail_before_any_resource(mocks, overrides, fragments):
    with pytest.raises(ConfigError) as err:
        build(aws_config(**overrides))
    for fragment in fragments:
        assert fragment in str(err.value)
    assert mocks.resources == []
