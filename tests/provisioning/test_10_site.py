"""Cold provisioning, idempotence and the testinfra checks on one shared cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.provisioning


def test_site_converges(provisioned):
    result = provisioned.first
    assert result.ok, result.summary()
    assert set(result.stats) == {n.name for n in provisioned.cluster.nodes}
    assert all(s["failures"] == 0 and s["unreachable"] == 0 for s in result.stats.values())
    print(f"cold provisioning took {result.duration_s:.0f}s", file=sys.stderr)


def test_progress_streamed_per_host_and_task(provisioned):
    statuses = {e.status for e in provisioned.events}
    assert {"ok", "changed"} <= statuses
    hosts = {e.host for e in provisioned.events}
    assert hosts == {n.name for n in provisioned.cluster.nodes}


def test_artifacts_kept_without_secret(provisioned):
    result = provisioned.first
    assert (result.artifacts_dir / "job_events").is_dir()
    secret = provisioned.cluster.secret
    root = result.artifacts_dir.parent.parent  # the private data dir
    leaks = [p for p in root.rglob("*") if p.is_file() and secret in p.read_text(errors="ignore")]
    assert not leaks, f"secret found in {leaks}"


def test_second_run_reports_no_change(provisioned):
    result = provisioned.run()
    assert result.ok, result.summary()
    assert result.changed() == {n.name: 0 for n in provisioned.cluster.nodes}, result.summary()


def test_testinfra_checks_pass(provisioned):
    """The same tests/hosts checks an operator runs against SSH hosts."""
    inventory = provisioned.inventory_file()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        str(REPO / "tests" / "hosts"),
        "--hosts=ansible://all",
        f"--ansible-inventory={inventory}",
        "--rootdir",
        str(REPO / "tests" / "hosts"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    print(proc.stdout[-6000:], proc.stderr[-2000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
