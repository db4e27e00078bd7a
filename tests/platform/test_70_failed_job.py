"""A training job that fails keeps the servers, says why in one message, and the stack
converges once the setting is fixed. Leaves the shared stack as it found it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_failed_training_keeps_servers_and_converges_once_fixed(platform, engine):
    stack = platform.stack
    before = {c.name: c.id for c in engine.containers.list(filters={"label": stack.selector})}
    missing = "/srv/trainstack/data/no-such-set.csv"
    stack.set_config(trainData=missing)
    try:
        failed = stack.run("up", "--yes", "--skip-preview", check=False)
    finally:
        stack.run("config", "rm", "trainstack:trainData")
    assert failed.returncode != 0
    assert "training job on" in failed.stdout and missing in failed.stdout
    # One message naming the node, the cause and the log; no Python traceback.
    assert "Traceback" not in failed.stdout + failed.stderr, failed.stdout[-3000:]
    assert "job output: " in failed.stdout
    after = {c.name: c.id for c in engine.containers.list(filters={"label": stack.selector})}
    assert after == before
    stack.run("preview", "--expect-no-changes")
