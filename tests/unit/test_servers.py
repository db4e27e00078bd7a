"""The ssh target's server list: validation, and the inventory the one builder makes of it."""

from __future__ import annotations

import json

import pytest

from infra import topology
from infra.config import ConfigError, StackConfig
from infra.config.servers import Server, parse_servers, server_list_errors

pytestmark = pytest.mark.unit


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "id_ed25519"
    path.write_text("not a real key\n")
    path.chmod(0o600)
    return str(path)


def entry(name: str, address: str, *roles: str, **more) -> dict:
    return {"name": name, "address": address, "user": "deploy", "roles": list(roles), **more}


def cluster(key_file: str = "") -> list[dict]:
    extra = {"privateKeyFile": key_file} if key_file else {}
    return [
        entry("zk-a", "192.0.2.10", "zookeeper", "spark_master", "monitoring", **extra),
        entry("zk-b", "192.0.2.11", "zookeeper", "spark_master", port=2222, **extra),
        entry("zk-c", "zk-c.example.org", "zookeeper", nodeAddress="10.0.0.12", **extra),
        entry("gpu-1", "192.0.2.20", "spark_worker", "tensorflow", **extra),
        entry("gpu-2", "192.0.2.21", "spark_worker", "tensorflow", **extra),
    ]


def test_a_server_list_as_pulumi_stores_it_is_typed(key_file):
    servers, errors = parse_servers(json.dumps(cluster(key_file)))
    assert errors == []
    assert [s.name for s in servers] == ["zk-a", "zk-b", "zk-c", "gpu-1", "gpu-2"]
    assert servers[1] == Server(
        name="zk-b",
        address="192.0.2.11",
        user="deploy",
        roles=("zookeeper", "spark_master"),
        port=2222,
        private_key_file=key_file,
    )
    assert servers[0].port == 22
    assert (servers[2].reach, servers[0].reach) == ("10.0.0.12", "192.0.2.10")
    assert [s.group for s in servers] == ["control"] * 3 + ["workers"] * 2
    assert server_list_errors(servers) == []


@pytest.mark.parametrize(
    ("bad", "fragments"),
    [
        ({"name": "Web_1"}, ["trainstack:servers[0].name", "'Web_1'", "not a host name"]),
        ({"address": "300.1.2.3"}, ["[0].address", "'300.1.2.3'", "not an IP address or DNS"]),
        ({"address": "bad host"}, ["[0].address", "'bad host'", "not an IP address or DNS"]),
        ({"nodeAddress": "-x"}, ["[0].nodeAddress", "'-x'"]),
        ({"port": 70000}, ["[0].port", "70000", "1..65535"]),
        ({"port": "ssh"}, ["[0].port", "'ssh'", "1..65535"]),
        ({"port": True}, ["[0].port", "True", "1..65535"]),
        ({"user": "Root User"}, ["[0].user", "'Root User'", "not a user name"]),
        ({"roles": []}, ["[0].roles", "[]", "non-empty list", "spark_worker"]),
        ({"roles": ["zookeeper", "hdfs"]}, ["[0].roles", "'hdfs'", "not a role", "allowed"]),
        ({"roles": ["zookeeper", "zookeeper"]}, ["[0].roles", "names a role twice"]),
        ({"password": "hunter2"}, ["[0].password", "unknown field", "privateKeyFile"]),
        ({"privateKeyFile": "keys/id"}, ["[0].privateKeyFile", "'keys/id'", "relative"]),
        ({"privateKeyFile": "/nonexistent/id"}, ["'/nonexistent/id'", "does not exist"]),
    ],
)
def test_a_bad_field_is_named_with_its_value_and_what_is_allowed(bad, fragments):
    servers = cluster()
    servers[0] = {**servers[0], **bad}
    parsed, errors = parse_servers(servers)
    assert parsed == ()
    text = "\n".join(errors)
    for fragment in fragments:
        assert fragment in text
    assert len(errors) == 1, errors  # only the bad field, not its neighbours


def test_missing_fields_and_non_mappings_are_named():
    _, errors = parse_servers([{"name": "a"}, "192.0.2.1"])
    text = "\n".join(errors)
    for fragment in (
        "trainstack:servers[0].address: missing",
        "trainstack:servers[0].user: missing",
        "trainstack:servers[0].roles: missing",
        "trainstack:servers[1]: '192.0.2.1' is not a server",
    ):
        assert fragment in text


def test_not_a_list_is_an_error_naming_the_key():
    assert parse_servers("{not json")[1][0].startswith("trainstack:servers: not a JSON list")
    assert parse_servers({"name": "a"})[1] == [
        "trainstack:servers: {'name': 'a'} is not a list of servers"
    ]


def test_a_key_file_others_can_read_is_refused_with_the_fix(tmp_path):
    key = tmp_path / "id_rsa"
    key.write_text("x")
    key.chmod(0o644)
    servers = cluster()
    servers[3] = {**servers[3], "privateKeyFile": str(key)}
    _, errors = parse_servers(servers)
    assert errors == [
        f"trainstack:servers[3].privateKeyFile: {str(key)!r} has mode 0644, readable by "
        f"others; ssh refuses such keys: chmod 600 {key}"
    ]


def test_cluster_rules_are_checked_on_the_whole_list():
    servers, errors = parse_servers(
        [
            entry("a", "192.0.2.1", "zookeeper", "monitoring"),
            entry("a", "192.0.2.2", "zookeeper", "monitoring"),
            entry("c", "192.0.2.2", "tensorflow"),
        ]
    )
    assert errors == []
    problems = server_list_errors(servers)
    assert problems == [
        "trainstack:servers: the name 'a' is used by more than one server",
        "trainstack:servers: 192.0.2.2:22 is listed more than once (one server, one entry)",
        "trainstack:servers: 2 servers have the role zookeeper; an ensemble needs an odd "
        "number (1, 3, 5) so a majority survives a loss",
        "trainstack:servers: no server has the role spark_master; at least one must",
        "trainstack:servers: no server has the role spark_worker; at least one must",
        "trainstack:servers: 2 servers have the role monitoring; at most one may",
        "trainstack:servers: server 'c' has the role tensorflow without spark_worker; "
        "TensorFlow runs in the Spark workers' executors",
    ]


def test_a_server_list_needs_the_ssh_target():
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping({"servers": json.dumps(cluster())})
    assert "trainstack:servers: only the ssh target takes a server list" in str(err.value)
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping({"target": "ssh", "servers": json.dumps(cluster()[:2])})
    text = str(err.value)
    # The whole list's rules are reported, before anything is created.
    assert "2 servers have the role zookeeper" in text
    assert "no server has the role spark_worker" in text


def test_entry_errors_come_through_the_config_with_the_others():
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping(
            {"workers": "0", "servers": json.dumps([entry("ok", "192.0.2.1", "x")])}
        )
    text = str(err.value)
    assert "trainstack:servers[0].roles: 'x' is not a role" in text


def test_the_one_inventory_builder_makes_an_ssh_inventory_of_a_server_list(key_file):
    servers, _ = parse_servers(cluster(key_file))
    config = StackConfig(worker_spark_cores=2)
    nodes = topology.server_plan(config, servers)
    assert [(n.key, n.group, n.zookeeper_id) for n in nodes] == [
        ("zk-a", "control", 1),
        ("zk-b", "control", 2),
        ("zk-c", "control", 3),
        ("gpu-1", "workers", None),
        ("gpu-2", "workers", None),
    ]
    inv = topology.inventory(config, "trainstack-prod", nodes, servers=servers)
    all_vars = inv["all"]["vars"]
    assert all_vars["ansible_connection"] == "ssh"
    assert all_vars["ansible_host_key_checking"] is True  # ansible.cfg's False is for docker
    assert all_vars["trainstack_spark_master_url"] == "spark://192.0.2.10:7077,192.0.2.11:7077"
    assert all_vars["trainstack_zookeeper_connect"] == (
        "192.0.2.10:2181,192.0.2.11:2181,10.0.0.12:2181"
    )
    assert all_vars["trainstack_pushgateway_url"] == "http://192.0.2.10:9091"
    assert all_vars["trainstack_spark_driver_host"] == "192.0.2.20"
    children = inv["all"]["children"]
    assert children["control"]["hosts"]["zk-b"] == {
        "ansible_host": "192.0.2.11",
        "ansible_port": 2222,
        "ansible_user": "deploy",
        "ansible_ssh_private_key_file": key_file,
        "trainstack_node_address": "192.0.2.11",
        "trainstack_ip_address": "192.0.2.11",
        "spark_local_ip": "192.0.2.11",
        "ansible_become": True,
        "trainstack_zookeeper_id": 2,
    }
    zk_c = children["control"]["hosts"]["zk-c"]
    assert (zk_c["ansible_host"], zk_c["trainstack_node_address"]) == (
        "zk-c.example.org",
        "10.0.0.12",
    )
    assert children["workers"]["hosts"]["gpu-2"]["trainstack_spark_worker_cores"] == 2
    assert set(children["spark_master"]["hosts"]) == {"zk-a", "zk-b"}
    assert set(children["tensorflow"]["hosts"]) == {"gpu-1", "gpu-2"}
    assert set(children["monitoring"]["hosts"]) == {"zk-a"}


def test_without_a_key_file_ssh_chooses_and_the_docker_inventory_is_unchanged():
    servers, _ = parse_servers(cluster())
    config = StackConfig()
    inv = topology.inventory(config, "p", topology.server_plan(config, servers), servers=servers)
    host = inv["all"]["children"]["workers"]["hosts"]["gpu-1"]
    assert "ansible_ssh_private_key_file" not in host
    docker = topology.inventory(config, "p", topology.plan(config))
    assert docker["all"]["vars"]["ansible_connection"] == "docker"
    assert "ansible_host_key_checking" not in docker["all"]["vars"]
    assert docker["all"]["vars"]["trainstack_spark_master_url"] == (
        "spark://control-1:7077,control-2:7077"
    )


def test_servers_that_do_not_match_the_nodes_are_a_bug_not_a_guess():
    servers, _ = parse_servers(cluster())
    config = StackConfig()
    with pytest.raises(ValueError, match="do not match the nodes"):
        topology.inventory(config, "p", topology.plan(config), servers=servers)
