"""The program's provisioning of nodes from the node image, its streamed progress, its kept
artifacts, and idempotence, on one stack. The testinfra checks (tests/hosts) run against the
shared stack (tests/platform/test_10_platform.py) and the ssh stack (tests/ssh, one server
installed from bare Debian over SSH), not a third time here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.support.events import role_tasks

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.provisioning


def test_site_converges(provisioned):
    """The program's provisioning output: every node ran, none failed or was unreachable."""
    result = provisioned.first
    assert result.ok, result.summary()
    assert set(result.stats) == set(provisioned.hosts), result.summary()
    assert all(s["ok"] > 0 for s in result.stats.values()), result.summary()
    print(f"cold provisioning took {result.duration_s:.0f}s", file=sys.stderr)


def test_nodes_start_from_the_node_image(provisioned):
    """bakeImage true (the default): the nodes run this tree's node image, the inventory names
    it, and provisioning skipped the install parts the image carries."""
    outputs = provisioned.outputs
    tag = outputs["nodeImage"]["tag"]
    assert tag.startswith("trainstack-node:"), tag
    assert provisioned.inventory["all"]["vars"]["trainstack_node_image"] == tag
    client = docker.from_env()
    image = client.images.get(tag).id
    for container in provisioned.containers.values():
        assert client.containers.get(container).image.id == image, container
    install = role_tasks("install.yml")
    ran = {e.task for e in provisioned.events if e.status in ("ok", "changed")}
    assert install and not ran & install, sorted(ran & install)


def test_progress_streamed_per_host_and_task(provisioned):
    """Pulumi's output of the `up` carried Ansible's progress, one line per host and task."""
    statuses = {e.status for e in provisioned.events}
    assert {"ok", "changed"} <= statuses, statuses
    hosts = {e.host for e in provisioned.events}
    assert hosts == set(provisioned.hosts)
    # Every node was configured: some configure task changed it (from the stream; the `no_log`
    # tasks show as `ok` there).
    configure = role_tasks("configure.yml")
    changed = {e.host for e in provisioned.events if e.status == "changed" and e.task in configure}
    assert changed == set(provisioned.hosts), sorted(changed)
    # The per-host stats the program exports agree: the stream saw every host change.
    assert all(n > 0 for n in provisioned.first.changed().values()), provisioned.first.summary()


def test_artifacts_kept_without_secret(provisioned):
    """The runner's artifacts of the program's run (.artifacts/<stack>/ansible) hold the job
    events but not the secret; the secret is the one the nodes use."""
    root = provisioned.first.artifacts_dir
    assert list(root.glob("artifacts/*/job_events")), f"no job_events under {root}"
    secret = provisioned.secret
    leaks = [p for p in root.rglob("*") if p.is_file() and secret in p.read_text(errors="ignore")]
    assert not leaks, f"secret found in {leaks}"
    for node in provisioned.hosts:
        conf = subprocess.run(
            [
                "docker",
                "exec",
                provisioned.containers[node],
                "cat",
                "/etc/trainstack/spark/spark-defaults.conf",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = re.search(r"^spark\.authenticate\.secret\s+(\S+)$", conf, re.M)
        assert found and found.group(1) == secret, f"{node}: not the stack's secret"


def test_second_run_reports_no_change(provisioned):
    """A direct run with the stack's inventory and the program's secret changes nothing (a
    wrong secret or inventory would rewrite the configuration and restart the daemons)."""
    result = provisioned.run()
    assert result.ok, result.summary()
    assert result.changed() == dict.fromkeys(provisioned.hosts, 0), result.summary()
    # This run's own artifacts (a direct run: checked here, not on the program's) hold no
    # secret either.
    root = provisioned.workdir / "runner"
    secret = provisioned.secret
    leaks = [p for p in root.rglob("*") if p.is_file() and secret in p.read_text(errors="ignore")]
    assert not leaks, f"secret found in {leaks}"
