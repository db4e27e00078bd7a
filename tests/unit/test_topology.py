"""The cluster's shape per config, without Pulumi."""

import pytest

from infra import topology
from infra.config import StackConfig

pytestmark = pytest.mark.unit


def test_default_topology():
    nodes = topology.plan(StackConfig())
    assert [n.key for n in nodes] == ["control-1", "control-2", "control-3", "worker-1", "worker-2"]
    assert [n.key for n in nodes if n.is_master] == ["control-1", "control-2"]
    assert [n.zookeeper_id for n in nodes if n.zookeeper_id] == [1, 2, 3]
    assert all(n.roles == ("spark_worker", "tensorflow") for n in nodes if n.group == "workers")


def test_the_job_drivers_node_is_the_last_control_node_with_its_shares():
    config = StackConfig()
    nodes = {n.key: n for n in topology.plan(config)}
    assert [k for k, n in nodes.items() if n.is_driver] == ["control-3"]
    assert nodes["control-3"].roles == ("zookeeper", "driver")
    # Its limits: the control node's plus trainstack:driverMemory and driverCpus.
    assert nodes["control-3"].cpus == pytest.approx(0.6)
    assert topology.memory_limit(config, nodes["control-3"]) == 2 * 1024**3
    assert topology.memory_limit(config, nodes["control-2"]) == 1024**3
    assert topology.memory_limit(config, nodes["worker-1"]) == 2 * 1024**3
    # Jobs are submitted there first, then on the workers (when it is down).
    submit = [n.key for n in topology.submit_nodes(list(nodes.values()))]
    assert submit == ["control-3", "worker-1", "worker-2"]
    inv = topology.inventory(config, "trainstack-dev", list(nodes.values()))
    assert set(inv["all"]["children"]["driver"]["hosts"]) == {"control-3"}


def test_a_single_control_node_hosts_the_drivers_too():
    config = StackConfig(control_nodes=1, masters=1, driver_memory="512m")
    nodes = {n.key: n for n in topology.plan(config)}
    assert nodes["control-1"].is_driver and nodes["control-1"].is_master
    # The control node's 1 GiB, tracking's 1 GiB, the object store's 512 MiB, the drivers'.
    assert topology.memory_limit(config, nodes["control-1"]) == (1024 + 1024 + 512 + 512) * 1024**2


def test_master_url_lists_every_master():
    nodes = topology.plan(StackConfig(control_nodes=5, masters=3))
    assert topology.master_url(nodes) == "spark://control-1:7077,control-2:7077,control-3:7077"


@pytest.mark.parametrize(("base", "ports"), [(18080, [18080, 18081]), (0, [0, 0])])
def test_only_masters_publish_their_ui(base, ports):
    nodes = topology.plan(StackConfig(ui_port_base=base))
    assert [n.ui_port for n in nodes if n.ui_port is not None] == ports
    assert [n.key for n in nodes if n.ui_port is not None] == ["control-1", "control-2"]


def test_inventory_groups_and_host_vars():
    config = StackConfig(workers=3)
    inv = topology.inventory(config, "trainstack-dev", topology.plan(config))
    groups = inv["all"]["children"]
    assert set(groups["zookeeper"]["hosts"]) == {"control-1", "control-2", "control-3"}
    assert set(groups["spark_master"]["hosts"]) == {"control-1", "control-2"}
    assert set(groups["spark_worker"]["hosts"]) == {"worker-1", "worker-2", "worker-3"}
    assert groups["control"]["hosts"]["control-2"]["trainstack_zookeeper_id"] == 2
    worker = groups["workers"]["hosts"]["worker-3"]
    assert worker["ansible_host"] == "trainstack-dev-worker-3"
    assert worker["trainstack_spark_worker_cores"] == 1
    assert inv["all"]["vars"]["ansible_connection"] == "docker"
    assert inv["all"]["vars"]["trainstack_zookeeper_connect"] == (
        "control-1:2181,control-2:2181,control-3:2181"
    )


def test_inventory_names_the_node_image_only_when_nodes_start_from_it():
    config = StackConfig()
    plan = topology.plan(config)
    plain = topology.inventory(config, "trainstack-dev", plan)
    assert "trainstack_node_image" not in plain["all"]["vars"]
    baked = topology.inventory(config, "trainstack-dev", plan, node_image="trainstack-node:abc")
    assert baked["all"]["vars"]["trainstack_node_image"] == "trainstack-node:abc"
