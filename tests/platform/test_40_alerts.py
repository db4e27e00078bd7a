"""An alert on the shared stack: a worker's Spark daemon killed until `SparkWorkersMissing`
fires, then left to supervisord, which brings it back, and the alert clears. Changes the stack
for a minute; leaves it as it found it."""

from __future__ import annotations

import pytest

from tests.support.prometheus import firing, scalar
from tests.support.stacks import wait_until

from .conftest import WORKERS

pytestmark = pytest.mark.monitoring


def test_killed_worker_daemon_fires_its_alert_and_clears(platform, engine):
    stack, outputs = platform.stack, platform.outputs()
    url = outputs["monitoringUrl"]
    worker = engine.containers.get(f"{stack.label}-worker-2")

    def kill_worker_daemon():
        code, out = worker.exec_run(["supervisorctl", "pid", "spark-worker"])
        pid = out.decode().strip()
        if code == 0 and pid.isdigit() and pid != "0":
            worker.exec_run(["kill", "-9", pid])
        return firing(url, "SparkWorkersMissing")

    # supervisord restarts the daemon within seconds: keep killing it until the alert fires.
    fired = wait_until("SparkWorkersMissing firing", kill_worker_daemon, timeout=120, every=2)
    assert "ALIVE worker" in fired[0]["annotations"]["description"]
    # Left alone, supervisord brings it back, it registers again and the alert clears.
    wait_until(
        "SparkWorkersMissing cleared", lambda: not firing(url, "SparkWorkersMissing"), 150, every=2
    )
    assert scalar(url, "max(metrics_master_aliveWorkers_Value)") == WORKERS
