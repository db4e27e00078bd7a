"""Monitoring keys, topology and the utilisation summary, without an engine."""

import pytest

from infra import monitoring, topology
from infra.config import ConfigError, StackConfig
from infra.config.values import parse_duration

pytestmark = pytest.mark.unit


def test_monitoring_defaults_on_the_first_control_node():
    config = StackConfig()
    nodes = topology.plan(config)
    assert [n.key for n in nodes if n.is_monitoring] == ["control-1"]
    assert [n.monitoring_port for n in nodes if n.monitoring_port is not None] == [19090]
    assert topology.monitoring_node(nodes).key == "control-1"


def test_monitoring_off_leaves_no_monitoring_node_or_port():
    config = StackConfig.from_mapping({"monitoring": "false"})
    nodes = topology.plan(config)
    assert topology.monitoring_node(nodes) is None
    assert all(n.monitoring_port is None for n in nodes)
    inv = topology.inventory(config, "p", nodes)
    assert inv["all"]["vars"]["trainstack_monitoring_enabled"] is False
    assert inv["all"]["children"]["monitoring"]["hosts"] == {}


def test_inventory_carries_the_monitoring_settings():
    config = StackConfig.from_mapping(
        {
            "workers": "3",
            "monitoringScrapeInterval": "10s",
            "monitoringRetention": "7d",
            "monitoringAlertFor": "30s",
            "monitoringProgressTimeout": "5m",
        }
    )
    inv = topology.inventory(config, "p", topology.plan(config))
    all_vars = inv["all"]["vars"]
    assert set(inv["all"]["children"]["monitoring"]["hosts"]) == {"control-1"}
    assert all_vars["trainstack_monitoring_enabled"] is True
    assert all_vars["trainstack_monitoring_scrape_interval"] == "10s"
    assert all_vars["trainstack_monitoring_retention"] == "7d"
    assert all_vars["trainstack_monitoring_alert_for"] == "30s"
    assert all_vars["trainstack_monitoring_progress_timeout_seconds"] == 300
    assert all_vars["trainstack_pushgateway_url"] == "http://control-1:9091"
    assert all_vars["trainstack_spark_driver_host"] == "control-3"  # the drivers' node


def test_scaling_workers_changes_only_the_worker_groups():
    small = StackConfig(workers=2)
    big = StackConfig(workers=3)
    inv_small = topology.inventory(small, "p", topology.plan(small))
    inv_big = topology.inventory(big, "p", topology.plan(big))
    assert inv_small["all"]["vars"] == inv_big["all"]["vars"]
    assert "worker-3" in inv_big["all"]["children"]["spark_worker"]["hosts"]


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        ({"monitoringPort": "80"}, ["trainstack:monitoringPort", "80", "1024..65535"]),
        ({"monitoringPort": "-2"}, ["trainstack:monitoringPort", "-2", "allowed is -1"]),
        ({"uiPortBase": "65000"}, ["trainstack:monitoringPort", "66010", "out of range"]),
        ({"monitoringPort": "18081"}, ["trainstack:monitoringPort", "Spark master UI"]),
        ({"monitoringRetention": "forever"}, ["trainstack:monitoringRetention", "not a duration"]),
        ({"monitoringRetention": "30m"}, ["trainstack:monitoringRetention", "minimum of 3600s"]),
        ({"monitoringScrapeInterval": "500ms"}, ["monitoringScrapeInterval", "minimum of 1s"]),
        ({"monitoringScrapeInterval": "5 s"}, ["monitoringScrapeInterval", "not a duration"]),
        ({"monitoringAlertFor": "1h30m"}, ["trainstack:monitoringAlertFor", "one unit"]),
        ({"monitoringProgressTimeout": "10s"}, ["monitoringProgressTimeout", "minimum of 60s"]),
        ({"monitoring": "sometimes"}, ["trainstack:monitoring", "not a bool"]),
    ],
)
def test_bad_monitoring_values_are_named(raw, fragments):
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping(raw)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("raw", "port"),
    [
        ({}, 19090),
        ({"uiPortBase": "28080"}, 29090),
        ({"uiPortBase": "0"}, 0),  # stacks that let the engine pick ports never collide
        ({"uiPortBase": "0", "monitoringPort": "19999"}, 19999),
        ({"monitoringPort": "0"}, 0),
    ],
)
def test_monitoring_port_follows_the_ui_ports_unless_set(raw, port):
    config = StackConfig.from_mapping(raw)
    assert [n.monitoring_port for n in topology.plan(config) if n.is_monitoring] == [port]


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15), ("5m", 300), ("2d", 172800), ("0s", 0), ("250ms", 0.25)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_bottleneck_is_the_node_busiest_relative_to_its_limit(monkeypatch):
    cpu = {"control-1": [(0, 0.25), (5, 0.25)], "worker-1": [(0, 0.4), (5, 0.4)]}
    memory = {"control-1": [(0, 2 * 1024**2)], "worker-1": [(0, 3 * 1024**2)]}
    answers = iter([cpu, memory])
    monkeypatch.setattr(monitoring, "query_range", lambda *a, **k: next(answers))
    data = monitoring.utilisation("http://x", 0, 10, {"control-1": 0.3, "worker-1": 0.8})
    # control-1 uses 83 % of its 0.3 CPU, worker-1 50 % of its 0.8.
    assert data["bottleneck"] == "control-1"
    assert data["nodes"]["worker-1"]["memory_mib_peak"] == 3.0


def test_no_samples_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(monitoring, "query_range", lambda *a, **k: {})
    with pytest.raises(monitoring.MonitoringError, match="no CPU samples"):
        monitoring.utilisation("http://x", 0, 10, {})


def test_the_plot_is_written(tmp_path):
    data = {
        "start": 0.0,
        "cpu": {"worker-1": [(0.0, 0.2), (5.0, 0.5)]},
        "memory": {"worker-1": [(0.0, 1e8), (5.0, 2e8)]},
        "nodes": {"worker-1": {"cpu_share_of_limit": 0.6}},
        "bottleneck": "worker-1",
    }
    path = tmp_path / "u.png"
    monitoring.write_plot(data, {"worker-1": 0.55}, path)
    assert path.stat().st_size > 1000


def test_rendered_targets_and_rules_follow_the_topology(tmp_path):
    """The prometheus role's own templates, rendered for 3 workers (what provisioning writes)."""
    import yaml

    from infra.monitoring.__main__ import render

    render(tmp_path, StackConfig(workers=3))
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    workers = [t["targets"][0] for t in jobs["spark_worker"]["static_configs"]]
    assert workers == ["worker-1:8081", "worker-2:8081", "worker-3:8081"]
    assert len(jobs["node"]["static_configs"]) == 6
    rules = yaml.safe_load((tmp_path / "rules.yml").read_text())["groups"][0]["rules"]
    missing = next(r for r in rules if r["alert"] == "SparkWorkersMissing")
    assert missing["expr"].endswith("< 3")
