"""Monitoring on a real stack: Prometheus scrapes every target, counts the workers, has the
run's pushed metrics, fires and clears an alert, and the run's utilisation picture exists.

One stack for the whole module (one `pulumi up`, one destroy); the tests run in order on it,
the disruptive one (killing a worker's daemon) last. Short alert `for:` and scrape interval so
an alert fires within seconds.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.pulumi_cli import Stack

pytestmark = pytest.mark.monitoring

CONFIG = {
    "uiPortBase": "0",
    "monitoringPort": "0",
    "monitoringScrapeInterval": "2s",
    "monitoringAlertFor": "4s",
    "trainEpochs": "3",
}
WORKERS = 2
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
def monitored(tmp_path_factory, engine):
    stack = Stack(tmp_path_factory.mktemp("monitoring"), prefix="tsmon")
    try:
        stack.init(**CONFIG)
        stack.up()
        outputs = stack.outputs()
        yield stack, outputs
    finally:
        stack.destroy_and_remove()


def api(url: str, path: str, **params: str) -> dict:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=20) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def instant(url: str, query: str) -> list[dict]:
    return api(url, "/api/v1/query", query=query)["result"]


def scalar(url: str, query: str) -> float:
    result = instant(url, query)
    assert len(result) == 1, f"{query}: {result}"
    return float(result[0]["value"][1])


def wait_for(what: str, check, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def firing(url: str, name: str) -> list[dict]:
    alerts = api(url, "/api/v1/alerts")["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


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
    wait_for(
        "every target up",
        lambda: all(
            h == "up" for job, hs in targets().items() if job != "spark_application" for h in hs
        ),
        timeout=60,
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
    assert scalar(url, f"trainstack_training_epoch{selector}") == 3
    assert scalar(url, f"trainstack_training_epochs{selector}") == 3
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


def test_killed_worker_daemon_fires_its_alert_and_clears(monitored, engine):
    stack, outputs = monitored
    url = outputs["monitoringUrl"]
    worker = engine.containers.get(f"{stack.label}-worker-2")

    def kill_worker_daemon():
        code, out = worker.exec_run(["supervisorctl", "pid", "spark-worker"])
        pid = out.decode().strip()
        if code == 0 and pid.isdigit() and pid != "0":
            worker.exec_run(["kill", "-9", pid])
        return firing(url, "SparkWorkersMissing")

    # supervisord restarts the daemon within seconds: keep killing it until the alert fires.
    fired = wait_for("SparkWorkersMissing firing", kill_worker_daemon, timeout=120, every=2)
    assert "ALIVE worker" in fired[0]["annotations"]["description"]
    # Left alone, supervisord brings it back, it registers again and the alert clears.
    wait_for("SparkWorkersMissing cleared", lambda: not firing(url, "SparkWorkersMissing"), 150)
    assert scalar(url, "max(metrics_master_aliveWorkers_Value)") == WORKERS
