"""The object store's keys, node, inventory and secret key, without an engine (issue 48)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from infra import topology
from infra.components.secret import derived_secret
from infra.config import ConfigError, StackConfig
from infra.config.servers import Server
from infra.nodes import NODE_PATHS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_object_store_defaults_on_the_first_control_node_with_its_own_volume():
    nodes = topology.plan(StackConfig())
    store = topology.object_store_node(nodes)
    assert store is not None and store.key == "control-1"
    assert [n.key for n in nodes if n.is_object_store] == ["control-1"]
    assert [n.object_store_port for n in nodes if n.object_store_port is not None] == [19110]
    assert store.volumes["objectstore-control-1"] == NODE_PATHS.object_store_data_dir


def test_object_store_off_leaves_no_node_port_volume_or_endpoint():
    config = StackConfig.from_mapping({"objectStore": "false"})
    nodes = topology.plan(config)
    assert topology.object_store_node(nodes) is None
    assert all(n.object_store_port is None for n in nodes)
    assert not any(NODE_PATHS.object_store_data_dir in n.volumes.values() for n in nodes)
    inv = topology.inventory(config, "p", nodes)
    assert inv["all"]["children"]["object_store"]["hosts"] == {}
    assert inv["all"]["vars"]["trainstack_object_store_enabled"] is False
    assert "trainstack_s3_endpoint" not in inv["all"]["vars"]


def test_inventory_carries_the_endpoint_on_the_cluster_network_and_no_secret():
    config = StackConfig()
    inv = topology.inventory(config, "p", topology.plan(config))
    all_vars = inv["all"]["vars"]
    assert set(inv["all"]["children"]["object_store"]["hosts"]) == {"control-1"}
    assert all_vars["trainstack_s3_endpoint"] == "http://control-1:8333"
    assert all_vars["trainstack_object_store_port"] == topology.OBJECT_STORE_PORT
    assert all_vars["trainstack_object_store_access_key"] == "trainstack"
    assert not any("secret" in key for key in all_vars if "object_store" in key or "s3" in key)


def test_ssh_target_puts_the_store_on_the_first_control_server_at_its_cluster_address():
    config = StackConfig()
    servers = [
        Server(name="wrk-1", address="10.0.0.2", user="root", roles=("spark_worker", "tensorflow")),
        Server(
            name="ctl-1",
            address="203.0.113.1",
            node_address="10.0.0.1",
            user="root",
            roles=("zookeeper", "spark_master"),
        ),
    ]
    nodes = topology.server_plan(config, servers)
    store = topology.object_store_node(nodes)
    assert store is not None and store.key == "ctl-1"
    reach = {s.name: s.reach for s in servers}
    assert topology.object_store_vars(config, nodes, reach)["trainstack_s3_endpoint"] == (
        "http://10.0.0.1:8333"
    )


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"objectStorePort": "80"}, "out of range"),
        ({"objectStorePort": "19100"}, "trainstack:trackingPort's port"),
        ({"objectStorePort": "19090"}, "trainstack:monitoringPort's port"),
        ({"objectStorePort": "18080"}, "Spark master UI ports"),
        ({"objectStoreMemory": "lots"}, "trainstack:objectStoreMemory"),
    ],
)
def test_bad_object_store_keys_are_refused_naming_the_key(raw, needle):
    with pytest.raises(ConfigError, match=needle):
        StackConfig.from_mapping(raw)


def test_object_store_port_free_when_the_store_is_off():
    StackConfig.from_mapping({"objectStore": "false", "objectStorePort": "19100"})


def test_secret_key_is_derived_as_ansible_derives_it():
    """The stack's secret output and the server's identity (group_vars) must agree: both
    are sha256(<cluster secret>:object-store)."""
    expected = hashlib.sha256(b"s3cr3t-token:object-store").hexdigest()
    assert derived_secret("s3cr3t-token", "object-store") == expected
    group_vars = yaml.safe_load((REPO / "playbooks/group_vars/all.yml").read_text())
    formula = " ".join(str(group_vars["trainstack_object_store_secret"]).split())
    assert "~ ':object-store') | hash('sha256')" in formula
    assert "trainstack_spark_auth_secret" in formula


EXTERNAL = {
    "s3Endpoint": "https://s3.eu-west-1.amazonaws.com",
    "s3AccessKey": "AKIAEXAMPLE",
    "s3SecretKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}


def test_an_external_endpoint_replaces_the_stores_for_s3a_and_keeps_its_secret_out():
    config = StackConfig.from_mapping(
        {**EXTERNAL, "s3Region": "eu-west-1", "s3PathStyle": "false"},
        secret_keys=frozenset({"s3SecretKey"}),
    )
    inv = topology.inventory(config, "p", topology.plan(config))
    all_vars = inv["all"]["vars"]
    assert all_vars["trainstack_s3_endpoint"] == "https://s3.eu-west-1.amazonaws.com"
    assert all_vars["trainstack_s3_access_key"] == "AKIAEXAMPLE"
    assert all_vars["trainstack_s3_region"] == "eu-west-1"
    assert all_vars["trainstack_s3_path_style"] is False
    # The stack's own store still runs (trainstack data put/ls, S3 tools on this machine).
    assert all_vars["trainstack_object_store_enabled"] is True
    assert EXTERNAL["s3SecretKey"] not in repr(inv)
    assert EXTERNAL["s3SecretKey"] not in repr(config)


def test_an_external_secret_key_in_plain_text_is_refused_naming_the_command():
    with pytest.raises(ConfigError, match="pulumi config set --secret trainstack:s3SecretKey"):
        StackConfig.from_mapping(EXTERNAL, secret_keys=frozenset())


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({**EXTERNAL, "s3Endpoint": "s3.amazonaws.com"}, "is not an endpoint URL"),
        ({**EXTERNAL, "s3Endpoint": "https://host/bucket"}, "is not an endpoint URL"),
        ({"s3Endpoint": "https://minio.lan:9000", "s3AccessKey": "k"}, "needs trainstack:s3Secr"),
        ({"s3AccessKey": "k"}, "set without trainstack:s3Endpoint"),
    ],
)
def test_bad_external_endpoints_are_refused_naming_the_key(raw, needle):
    with pytest.raises(ConfigError, match=needle):
        StackConfig.from_mapping(raw)


def test_the_secret_key_never_shows_in_an_error():
    with pytest.raises(ConfigError) as caught:
        StackConfig.from_mapping({**EXTERNAL, "s3Endpoint": "nope"})
    assert EXTERNAL["s3SecretKey"] not in str(caught.value)


def test_provisioning_hands_the_external_key_to_ansible_as_a_secret_variable():
    from infra.provisioning.inventory import SECRET_VARS, split_secrets

    assert "trainstack_s3_secret_key" in SECRET_VARS
    inventory = {"all": {"vars": {"trainstack_s3_secret_key": "x" * 20, "other": 1}}}
    public, secret = split_secrets(inventory)
    assert secret == {"trainstack_s3_secret_key": "x" * 20}
    assert "trainstack_s3_secret_key" not in public["all"]["vars"]
