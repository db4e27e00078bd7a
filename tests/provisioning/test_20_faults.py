"""Bad input names the host, the task and the cause; a re-run after the fix converges.

The nodes come from the node image, whose digest makes site.yml skip the install parts: the
faults in an install part run them anyway (FORCE_INSTALL), as on a server without the image."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.provisioning
# playbooks/site.yml: the install parts run although the node's image carries them.
FORCE_INSTALL = {"trainstack_image_installed": False}


def _only_failures_on(result, host):
    assert not result.ok
    assert result.failures, result.summary()
    assert {f.host for f in result.failures} == {host}, result.summary()
    return result.failures[0]


def test_unreachable_node_is_named(provisioned):
    inventory = copy.deepcopy(provisioned.inventory)
    # A worker whose container does not exist, in the program's inventory (host variables
    # under the node's group, as infra.topology writes them).
    inventory["all"]["children"]["workers"]["hosts"]["ghost"] = {
        "ansible_connection": "community.docker.docker",
        "ansible_host": f"{provisioned.name}-no-such-container",
    }
    result = provisioned.run(inventory=inventory, limit="ghost")
    failure = _only_failures_on(result, "ghost")
    assert failure.task == (
        "Ensure python3 and python3-apt are installed (raw, before facts can be gathered)."
    )
    # Over SSH this is "unreachable"; the Docker connection reports the engine's answer as a
    # failure of the first task. Either way the host, the task and the cause are named.
    assert failure.unreachable or "No such container" in failure.message, failure
    assert "no-such-container" in failure.message, failure


def test_failed_package_install_is_named_then_rerun_converges(provisioned):
    host = "control-3"
    bad = provisioned.run(
        limit=host,
        extravars={**FORCE_INSTALL, "common_extra_packages": ["trainstack-no-such-package"]},
    )
    failure = _only_failures_on(bad, host)
    assert failure.task == "Ensure base OS packages are installed."
    assert "trainstack-no-such-package" in failure.message
    fixed = provisioned.run(limit=host)
    assert fixed.ok, fixed.summary()
    assert fixed.changed() == {host: 0}


def test_missing_wheel_is_named_then_rerun_converges(provisioned):
    host = "control-3"
    bad = provisioned.run(limit=host, extravars={**FORCE_INSTALL, "spark_pyspark_version": "9.9.9"})
    failure = _only_failures_on(bad, host)
    assert failure.task == "Ensure pyspark is installed in the virtual environment."
    assert "pyspark==9.9.9" in failure.message
    fixed = provisioned.run(limit=host)
    assert fixed.ok, fixed.summary()
    assert fixed.changed() == {host: 0}


def _worker_pid(provisioned, host, other_than=None, timeout=30):
    """spark-worker's PID on `host` once supervisord reports it RUNNING (with `other_than`:
    under another PID than that one). Fails the test, with supervisorctl's last answer, when
    it does not within `timeout` seconds: a missing PID would compare with nothing."""
    import re

    import docker

    from tests.support.cluster import wait_for

    container = docker.from_env().containers.get(provisioned.containers[host])
    last = {"status": ""}

    def pid():
        out = container.exec_run(["supervisorctl", "status", "spark-worker"]).output.decode()
        last["status"] = out.strip()
        m = re.search(r"RUNNING\s+pid (\d+)", out)
        return int(m.group(1)) if m and int(m.group(1)) != other_than else None

    try:
        return wait_for(pid, timeout)
    except TimeoutError:
        pytest.fail(
            f"no RUNNING spark-worker on {host}"
            + (f" under another PID than {other_than}" if other_than is not None else "")
            + f" within {timeout}s; supervisorctl status: {last['status']!r}",
            pytrace=False,
        )


def test_config_change_restarts_spark_daemon_then_converges(provisioned):
    host = "worker-1"
    before = _worker_pid(provisioned, host)
    assert isinstance(before, int) and before > 0, before
    changed = provisioned.run(
        limit=host, extravars={"spark_extra_conf": {"spark.ui.showConsoleProgress": "false"}}
    )
    assert changed.ok, changed.summary()
    assert changed.changed()[host] >= 2  # spark-defaults.conf + the handler's restart
    # spark-worker was restarted after its configuration changed: it runs under a new PID.
    after = _worker_pid(provisioned, host, other_than=before)
    assert after != before, (before, after)
    restored = provisioned.run(limit=host)
    assert restored.ok, restored.summary()
    again = provisioned.run(limit=host)
    assert again.ok and again.changed() == {host: 0}, again.summary()
