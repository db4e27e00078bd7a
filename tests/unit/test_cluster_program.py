"""What the Pulumi program declares, under Pulumi's mocks (no engine)."""

from __future__ import annotations

import pulumi
import pytest

from infra import topology
from infra.config import StackConfig
from infra.targets.docker import DockerCluster, DockerClusterArgs
from infra.topology import LABEL_MANAGED_BY, LABEL_ROLES, LABEL_STACK, MANAGED_BY

pytestmark = pytest.mark.unit

CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
NETWORK = "docker:index/network:Network"


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outs = dict(args.inputs)
        if args.typ == CONTAINER:
            n = len(self.resources)
            outs["networkDatas"] = [{"ipAddress": f"10.9.0.{n}", "networkName": "net"}]
            outs["ports"] = [
                {**p, "external": p.get("external") or 30000 + n} for p in outs.get("ports") or []
            ]
        return [f"{args.name}-id", outs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}

    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]


def labels(inputs: dict) -> dict[str, str]:
    return {item["label"]: item["value"] for item in inputs.get("labels") or []}


@pytest.fixture
def mocks() -> Mocks:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="trainstack", stack="unit", preview=False)
    return m


def build(config: StackConfig, baked: bool = True) -> DockerCluster:
    return DockerCluster(
        "cluster",
        DockerClusterArgs(
            config=config,
            plan=topology.plan(config),
            project="trainstack",
            stack="unit",
            image="sha256:img",
            node_image_tag="trainstack-node:abc" if baked else None,
        ),
    )


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
                "trainstack-unit-mlflow-control-1",
                "trainstack-unit-objectstore-control-1",
            ]
        )

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_containers_carry_labels_limits_hostnames_and_network(mocks):
    cluster = build(StackConfig(worker_cpus=0.5, worker_memory="1536m"))

    def check(_):
        by_host = {c.inputs["hostname"]: c.inputs for c in mocks.of_type(CONTAINER)}
        worker = by_host["worker-1"]
        assert worker["image"] == "sha256:img"
        assert worker["cpus"] == "0.5"
        assert worker["memory"] == 1536
        assert worker["memorySwap"] == 1536  # no swap, and no diff on every preview
        assert worker["networksAdvanced"] == [
            {"name": "trainstack-unit-net", "aliases": ["worker-1"]}
        ]
        assert worker["restart"] == "unless-stopped"
        assert labels(worker)[LABEL_STACK] == "trainstack-unit"
        assert labels(worker)[LABEL_MANAGED_BY] == MANAGED_BY
        assert labels(worker)[LABEL_ROLES] == "spark_worker,tensorflow"
        assert labels(by_host["control-1"])[LABEL_ROLES] == (
            "zookeeper,spark_master,monitoring,tracking,object_store"
        )
        assert labels(by_host["control-2"])[LABEL_ROLES] == "zookeeper,spark_master"
        # controlMemory, plus trackingMemory on the tracking node (the MLflow server) and
        # objectStoreMemory on the object store's (the same node).
        assert by_host["control-1"]["memory"] == 2048 + 512
        assert by_host["control-2"]["memory"] == 1024
        # driverMemory and driverCpus on the job drivers' node.
        assert by_host["control-3"]["memory"] == 1024 + 1024
        assert float(by_host["control-3"]["cpus"]) == pytest.approx(0.6)
        assert labels(by_host["control-3"])[LABEL_ROLES] == "zookeeper,driver"
        targets = {m["target"] for m in worker["mounts"]}
        assert {"/srv/trainstack/data", "/srv/trainstack/checkpoints"} <= targets
        assert all(m["type"] == "volume" for m in worker["mounts"])  # no host folders

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_baked_nodes_run_the_image_command_and_others_idle(mocks):
    cluster = build(StackConfig(), baked=False)

    def check(_):
        containers = mocks.of_type(CONTAINER)
        assert [list(c.inputs["command"]) for c in containers] == [["sleep", "infinity"]] * 5

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_baked_nodes_keep_the_image_cmd(mocks):
    cluster = build(StackConfig(), baked=True)

    def check(_):
        assert all("command" not in c.inputs for c in mocks.of_type(CONTAINER))

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_only_master_uis_are_published_and_on_loopback(mocks):
    cluster = build(StackConfig())

    def check(urls):
        published = {
            c.inputs["hostname"]: c.inputs["ports"]
            for c in mocks.of_type(CONTAINER)
            if c.inputs.get("ports")
        }
        assert set(published) == {"control-1", "control-2"}
        # control-1 also publishes Prometheus's UI (the monitoring node, docs/monitoring.md)
        # MLflow's (the tracking node) and the object store's S3 endpoint, in the order the
        # provider reads them back (by the internal port; another order is a diff that
        # replaces the container every `up`).
        assert [(p["internal"], p["ip"]) for p in published["control-1"]] == [
            (5000, "127.0.0.1"),
            (8080, "127.0.0.1"),
            (8333, "127.0.0.1"),
            (9090, "127.0.0.1"),
        ]
        assert [(p["internal"], p["ip"]) for p in published["control-2"]] == [(8080, "127.0.0.1")]
        assert urls == {
            "control-1": "http://127.0.0.1:18080",
            "control-2": "http://127.0.0.1:18081",
        }

    return cluster.ui_urls.apply(check)


@pulumi.runtime.test
def test_monitoring_url_is_the_published_prometheus_port(mocks):
    cluster = build(StackConfig())
    assert cluster.monitoring_url is not None

    def check(url):
        assert url == "http://127.0.0.1:19090"

    return cluster.monitoring_url.apply(check)


@pulumi.runtime.test
def test_monitoring_off_publishes_no_prometheus_port(mocks):
    cluster = build(StackConfig(monitoring=False))
    assert cluster.monitoring_url is None

    def check(_):
        ports = [p for c in mocks.of_type(CONTAINER) for p in c.inputs.get("ports") or []]
        assert all(p["internal"] in (8080, 5000, 8333) for p in ports)
        assert any(p["internal"] == 5000 for p in ports)  # tracking stays on

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_tracking_url_is_the_published_mlflow_port_and_in_the_inventory(mocks):
    cluster = build(StackConfig())
    assert cluster.tracking_url is not None

    def check(args):
        url, inventory = args
        assert url == "http://127.0.0.1:19100"
        all_vars = inventory["all"]["vars"]
        assert not any("ui_url" in key for key in all_vars)
        assert all_vars["trainstack_tracking_uri"] == "http://control-1:5000"
        assert list(inventory["all"]["children"]["tracking"]["hosts"]) == ["control-1"]
        control_1 = next(
            c.inputs for c in mocks.of_type(CONTAINER) if c.inputs["hostname"] == "control-1"
        )
        mounts = {m["target"]: m["source"] for m in control_1["mounts"]}
        assert mounts["/var/lib/trainstack/mlflow"] == "trainstack-unit-mlflow-control-1"

    return pulumi.Output.all(cluster.tracking_url, cluster.inventory).apply(check)


@pulumi.runtime.test
def test_tracking_off_publishes_no_mlflow_port_and_declares_no_volume(mocks):
    cluster = build(StackConfig(tracking=False))
    assert cluster.tracking_url is None

    def check(inventory):
        ports = [p for c in mocks.of_type(CONTAINER) for p in c.inputs.get("ports") or []]
        assert all(p["internal"] != 5000 for p in ports)
        assert not any("mlflow" in v.inputs["name"] for v in mocks.of_type(VOLUME))
        assert inventory["all"]["children"]["tracking"]["hosts"] == {}
        assert inventory["all"]["vars"]["trainstack_tracking_enabled"] is False

    return cluster.inventory.apply(check)


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
        assert "trainstack_wheelhouse_mount" not in inventory["all"]["vars"]

    return pulumi.Output.all(cluster.nodes, cluster.inventory).apply(check)
