"""Scaling: one more worker is added and provisioned, and no training is launched for it.
Changes the shared stack: 2 -> 3 workers, which the drills after it need."""

from __future__ import annotations

import pytest

from tests.support.stacks import engine_objects

pytestmark = pytest.mark.e2e


def test_scaling_workers_adds_a_provisioned_node_without_retraining(platform, engine):
    stack = platform.stack
    run_before = stack.outputs()["training"]["run_id"]
    stack.set_config(workers="3")
    scaled = stack.up()
    assert f"{stack.label}-worker-3" in engine_objects(stack.label)["containers"]
    assert "launching on" not in scaled.stdout
    assert stack.outputs()["training"]["run_id"] == run_before
    worker = engine.containers.get(f"{stack.label}-worker-3")
    code, out = worker.exec_run(
        ["/opt/trainstack/venv/bin/python", "-c", "import trainstack_training"]
    )
    assert code == 0, out
