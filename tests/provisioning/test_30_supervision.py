"""Every daemon is restarted by supervisord when its process dies."""

from __future__ import annotations

import re

import docker
import pytest

from tests.support.cluster import wait_for

pytestmark = pytest.mark.provisioning

DAEMONS = [("control-1", "zookeeper"), ("control-2", "spark-master"), ("worker-1", "spark-worker")]


def _pid(container, program: str) -> int | None:
    out = container.exec_run(["supervisorctl", "status", program]).output.decode()
    m = re.search(r"RUNNING\s+pid (\d+)", out)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize(("host", "program"), DAEMONS)
def test_killed_daemon_is_restarted(provisioned, host, program):
    assert provisioned.first.ok
    container = docker.from_env().containers.get(provisioned.containers[host])
    # Settled first: killing a ZooKeeper member (the test before) can make a master lose its
    # session and exit, and supervisord is then still restarting it.
    before = wait_for(lambda: _pid(container, program), timeout=90, what=f"{program} running")
    container.exec_run(["kill", "-9", str(before)])
    after = wait_for(
        lambda: (p := _pid(container, program)) and p != before and p,
        timeout=60,
        what=f"{program} restarted",
    )
    assert after != before
