"""What the Pulumi program declares, under Pulumi's mocks (no engine)."""

from __future__ import annotations

import pulumi
import pytest

from infra.components import Cluster, ClusterArgs
from infra.config import StackConfig
from infra.topology import LABEL_ROLES, LABEL_STACK

pytestmark = pytest.mark.unit

CONTAINER = "pulumi-python:dynamic/docker:Container"
VOLUME = "pulumi-python:dynamic/docker:Volume"
NETWORK = "pulumi-python:dynamic/docker:Network"


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outs = dict(args.inputs)
        if args.typ == CONTAINER:
            n = len(self.resources)
            outs.update(
                container_id=f"c{n}",
                ip_address=f"10.9.0.{n}",
                published_ports={"8080": 30000 + n} if outs.get("ports") else {},
            )
        if args.typ == NETWORK:
            outs["network_id"] = "net-1"
        return [f"{args.name}-id", outs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}

    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]


@pytest.fixture
def mocks() -> Mocks:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="trainstack", stack="unit", preview=False)
    return m


def build(config: StackConfig) -> Cluster:
    return Cluster("cluster", ClusterArgs(config=config, project="trainstack", stack="unit"))


@pulumi.runtime.test
def test_default_stack_declares_network_storage_and_five_servers(mocks):
    cluster = build(StackConfig())

    def check(_):
        containers = mocks.of_type(CONTAINER)
        assert sorted(c.inputs["name"] for c in containers) == [
            "trainstack-unit-control-1",
            "trainstack-unit-control-2",
            "trainstack-unit-control-3",
            "trainstack-unit-worker-1",
            "trainstack-unit-worker-2",
        ]
        assert [n.inputs["name"] for n in mocks.of_type(NETWORK)] == ["trainstack-unit-net"]
        volumes = sorted(v.inputs["name"] for v in mocks.of_type(VOLUME))
        assert volumes == sorted(
            [
                "trainstack-unit-data",
                "trainstack-unit-checkpoints",
                "trainstack-unit-models",
                "trainstack-unit-zookeeper-control-1",
                "trainstack-unit-zookeeper-control-2",
                "trainstack-unit-zookeeper-control-3",
                "trainstack-unit-spark-recovery-control-1",
                "trainstack-unit-spark-recovery-control-2",
            ]
        )

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_containers_carry_labels_limits_hostnames_and_network(mocks):
    cluster = build(StackConfig(worker_cpus=0.5, worker_memory="1536m"))

    def check(_):
        by_host = {c.inputs["hostname"]: c.inputs for c in mocks.of_type(CONTAINER)}
        worker = by_host["worker-1"]
        assert worker["cpus"] == 0.5
        assert worker["memory"] == "1536m"
        assert worker["network"] == "trainstack-unit-net"
        assert worker["aliases"] == ["worker-1"]
        assert worker["restart"] == "unless-stopped"
        assert worker["labels"][LABEL_STACK] == "trainstack-unit"
        assert worker["labels"][LABEL_ROLES] == "spark_worker,tensorflow"
        assert by_host["control-1"]["labels"][LABEL_ROLES] == "zookeeper,spark_master"
        targets = {m["target"] for m in worker["mounts"]}
        assert {"/srv/trainstack/data", "/srv/trainstack/checkpoints"} <= targets

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_only_master_uis_are_published_and_on_loopback(mocks):
    cluster = build(StackConfig())

    def check(urls):
        published = {
            c.inputs["hostname"]: c.inputs["ports"]
            for c in mocks.of_type(CONTAINER)
            if c.inputs["ports"]
        }
        assert set(published) == {"control-1", "control-2"}
        for ports in published.values():
            assert [(p["internal"], p["host_ip"]) for p in ports] == [(8080, "127.0.0.1")]
        assert set(urls) == {"control-1", "control-2"}
        assert all(u.startswith("http://127.0.0.1:") for u in urls.values())

    return cluster.ui_urls.apply(check)


@pulumi.runtime.test
def test_outputs_and_inventory_shape(mocks):
    cluster = build(StackConfig(workers=3))
    assert cluster.spark_master_url == "spark://control-1:7077,control-2:7077"

    def check(args):
        nodes, inventory = args
        assert [n["name"] for n in nodes][-1] == "worker-3"
        assert {"name", "container", "roles", "address", "container_id"} <= set(nodes[0])
        hosts = inventory["all"]["children"]["workers"]["hosts"]
        assert hosts["worker-3"]["trainstack_node_address"] == "worker-3"
        assert hosts["worker-3"]["trainstack_ip_address"].startswith("10.9.0.")
        assert set(inventory["all"]["children"]["spark_worker"]["hosts"]) == {
            "worker-1",
            "worker-2",
            "worker-3",
        }

    return pulumi.Output.all(cluster.nodes, cluster.inventory).apply(check)
