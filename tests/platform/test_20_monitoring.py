"""Monitoring on the shared stack, read only: Prometheus scrapes every target, counts the
workers, has the run's pushed metrics, and the run's utilisation picture exists. Changes
nothing (the alert that fires and clears is test_40_alerts)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.prometheus import api, firing, scalar
from tests.support.stacks import wait_until

from .conftest import CONFIG, WORKERS

pytestmark = pytest.mark.monitoring

# Every scrape job and how many targets the default topology gives it.
JOBS = {
    "prometheus": 1,
    "node": 5,
    "process": 5,
    "spark_master": 2,
    "spark_worker": WORKERS,
    "spark_master_status": 2,
    "zookeeper": 3,
    "pushgateway": 1,
    "spark_application": 1,
}


@pytest.fixture(scope="module")
def monitored(platform):
    return platform.stack, platform.outputs()


def test_prometheus_url_is_a_stack_output(monitored):
    _, outputs = monitored
    url = outputs["monitoringUrl"]
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(f"{url}/-/ready", timeout=10) as resp:
        assert resp.status == 200


def test_no_change_up_stays_a_no_op(monitored):
    stack, _ = monitored
    stack.run("preview", "--diff", "--expect-no-changes")


def test_every_target_is_up(monitored):
    _, outputs = monitored
    url = outputs["monitoringUrl"]

    def targets():
        active = api(url, "/api/v1/targets", state="active")["activeTargets"]
        jobs: dict[str, list[str]] = {}
        for t in active:
            jobs.setdefault(t["labels"]["job"], []).append(t["health"])
        return jobs

    jobs = targets()
    assert {job: len(h) for job, h in jobs.items()} == JOBS
    # Every daemon's target is up (the application's driver only while a run is going).
    wait_until(
        "every target up",
        lambda: all(
            h == "up" for job, hs in targets().items() if job != "spark_application" for h in hs
        ),
        timeout=60,
        every=2,
    )
    # The run's executors were scraped while it ran (spark.ui.prometheus.enabled).
    assert scalar(url, 'max_over_time(up{job="spark_application"}[1h])') == 1
    executors = api(
        url,
        "/api/v1/series",
        **{"match[]": '{__name__=~"metrics_executor_.+"}', "start": f"{time.time() - 3600:.0f}"},
    )
    assert executors, "no metrics of the training application's executors"


def test_alive_workers_masters_and_zookeeper_quorum(monitored):
    _, outputs = monitored
    url = outputs["monitoringUrl"]
    assert scalar(url, "max(metrics_master_aliveWorkers_Value)") == WORKERS
    assert scalar(url, 'sum(probe_success{job="spark_master_status"})') == 1
    assert scalar(url, 'sum(probe_success{job="zookeeper"})') == 3
    assert firing(url, "SparkWorkersMissing") == []


def test_training_metrics_are_present_with_the_run_id(monitored):
    _, outputs = monitored
    url = outputs["monitoringUrl"]
    run_id = outputs["training"]["run_id"]
    selector = f'{{job="trainstack_training",run_id="{run_id}"}}'
    epochs = int(CONFIG["trainEpochs"])
    assert scalar(url, f"trainstack_training_epoch{selector}") == epochs
    assert scalar(url, f"trainstack_training_epochs{selector}") == epochs
    assert scalar(url, f"trainstack_training_attempt{selector}") == 1
    assert scalar(url, f"trainstack_training_samples_per_second{selector}") > 0
    assert 0 < scalar(url, f"trainstack_training_val_accuracy{selector}") <= 1
    assert scalar(url, f"trainstack_training_loss{selector}") > 0
    # A finished run is not reported as stalled.
    assert firing(url, "TrainingNoProgress") == []


def test_utilisation_picture_names_the_bottleneck(monitored, engine):
    stack, outputs = monitored
    result = outputs["training"]
    assert "utilisation_error" not in result, result.get("utilisation_error")
    plot = Path(result["utilisation_plot"])
    assert plot.name == "utilisation.png"
    assert plot.parent == Path(result["host_dir"])  # next to curves.png
    data = plot.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    nodes = {n["name"] for n in outputs["nodes"]}
    assert result["bottleneck_node"] in nodes
    assert set(result["utilisation"]) == nodes
    worker = engine.containers.get(f"{stack.label}-worker-1")
    code, out = worker.exec_run(["test", "-s", f"{result['cluster_run_dir']}/utilisation.png"])
    assert code == 0, out
