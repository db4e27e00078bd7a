"""The tracking server's keys, node, inventory and secrets, without an engine (issue 40)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra import topology
from infra.config import ConfigError, StackConfig
from infra.config.servers import Server
from infra.nodes import NODE_PATHS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_tracking_defaults_on_the_first_control_node_with_its_own_volume():
    nodes = topology.plan(StackConfig())
    tracker = topology.tracking_node(nodes)
    assert tracker is not None and tracker.key == "control-1"
    assert [n.key for n in nodes if n.is_tracking] == ["control-1"]
    assert [n.tracking_port for n in nodes if n.tracking_port is not None] == [19100]
    assert tracker.volumes["mlflow-control-1"] == NODE_PATHS.mlflow_data_dir


def test_tracking_off_leaves_no_node_port_volume_or_group_member():
    config = StackConfig.from_mapping({"tracking": "false"})
    nodes = topology.plan(config)
    assert topology.tracking_node(nodes) is None
    assert all(n.tracking_port is None for n in nodes)
    assert not any(NODE_PATHS.mlflow_data_dir in n.volumes.values() for n in nodes)
    inv = topology.inventory(config, "p", nodes)
    assert inv["all"]["children"]["tracking"]["hosts"] == {}
    assert inv["all"]["vars"]["trainstack_tracking_enabled"] is False
    assert "trainstack_tracking_uri" not in inv["all"]["vars"]


def test_inventory_carries_the_tracking_uri_and_not_the_ui_url():
    """The UI's URL can be an engine-picked port that a container restart changes: in the
    inventory it would make provisioning run again after every restart."""
    config = StackConfig()
    inv = topology.inventory(config, "p", topology.plan(config))
    all_vars = inv["all"]["vars"]
    assert set(inv["all"]["children"]["tracking"]["hosts"]) == {"control-1"}
    assert all_vars["trainstack_tracking_enabled"] is True
    assert all_vars["trainstack_tracking_port"] == topology.MLFLOW_PORT == 5000
    assert all_vars["trainstack_tracking_uri"] == "http://control-1:5000"
    assert not any("ui_url" in key for key in all_vars)


def test_ssh_target_tracks_on_the_first_control_server_at_its_cluster_address():
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
        Server(name="ctl-2", address="10.0.0.3", user="root", roles=("zookeeper",)),
    ]
    nodes = topology.server_plan(config, servers)
    assert [n.key for n in nodes if n.is_tracking] == ["ctl-1"]
    assert all(n.tracking_port is None and not n.volumes for n in nodes)
    inv = topology.inventory(config, "p", nodes, servers=servers)
    assert set(inv["all"]["children"]["tracking"]["hosts"]) == {"ctl-1"}
    assert inv["all"]["vars"]["trainstack_tracking_uri"] == "http://10.0.0.1:5000"


@pytest.mark.parametrize(
    ("keys", "port"),
    [
        ({}, 19100),
        ({"uiPortBase": "0"}, 0),
        ({"trackingPort": "0"}, 0),
        ({"trackingPort": "25000"}, 25000),
    ],
)
def test_tracking_port(keys, port):
    assert StackConfig.from_mapping(keys).tracking_host_port == port


@pytest.mark.parametrize(
    ("keys", "fragment"),
    [
        ({"trackingPort": "-2"}, "out of range"),
        ({"trackingPort": "80"}, "out of range"),
        ({"trackingPort": "18081"}, "Spark master UI ports"),
        ({"trackingPort": "19090"}, "Prometheus's UI port"),
    ],
)
def test_tracking_port_checks(keys, fragment):
    with pytest.raises(ConfigError, match="trainstack:trackingPort") as err:
        StackConfig.from_mapping(keys)
    assert fragment in str(err.value)


def test_a_port_that_clashes_is_fine_with_tracking_off():
    config = StackConfig.from_mapping({"tracking": "false", "trackingPort": "19090"})
    assert not config.tracking


def test_the_mlflow_logins_derive_from_the_cluster_secret_like_zookeepers():
    group_vars = yaml.safe_load((REPO / "playbooks/group_vars/all.yml").read_text())
    for name, suffix in (
        ("trainstack_zookeeper_secret", ":zookeeper"),
        ("trainstack_mlflow_admin_secret", ":mlflow"),
        ("trainstack_mlflow_flask_secret", ":mlflow-flask"),
    ):
        assert group_vars[name].strip() == (
            "{{ ((trainstack_spark_auth_secret | default('')) ~ '"
            + suffix
            + "') | hash('sha256') }}"
        )
    assert group_vars["mlflow_admin_password"] == "{{ trainstack_mlflow_admin_secret }}"
    assert group_vars["mlflow_flask_secret_key"] == "{{ trainstack_mlflow_flask_secret }}"


def test_every_task_that_writes_an_mlflow_secret_is_no_log():
    tasks = yaml.safe_load((REPO / "roles/mlflow/tasks/configure.yml").read_text())
    secret = [
        t
        for t in tasks
        if t.get("ansible.builtin.template", {}).get("src") in ("auth.ini.j2", "server.env.j2")
        or "admin login" in t["name"]
        or "secret key are set" in t["name"]
    ]
    assert len(secret) == 4
    assert all(t.get("no_log") is True for t in secret), [t["name"] for t in secret]
    written = [t["ansible.builtin.template"] for t in secret if "ansible.builtin.template" in t]
    assert all(w["mode"] == "0600" and w["owner"] == "{{ mlflow_user }}" for w in written)


def test_the_sync_program_gets_the_layout_and_the_tracking_uri():
    """The arguments the sync module's `watch` command takes (trainstack_training.tracking)."""
    text = (REPO / "roles/mlflow/tasks/configure.yml").read_text()
    for arg in ("watch", "--models-dir", "--tracking-uri", "--auth-file", "--ui-url"):
        assert arg in text
    group_vars = yaml.safe_load((REPO / "playbooks/group_vars/all.yml").read_text())
    assert group_vars["mlflow_auth_file"] == "{{ trainstack_mlflow_auth_file }}"
    assert group_vars["mlflow_sync_models_dir"] == "{{ trainstack_models_dir }}"
    assert "mlflow_ui_url" not in group_vars  # the role's default: "" (no URL recorded)
    assert NODE_PATHS.tracking_artifacts_dir.startswith(NODE_PATHS.models_dir + "/.")
