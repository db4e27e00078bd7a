"""The product, end to end, read only: the first `pulumi up` from nothing ends with a trained
model, the outputs name the masters, UIs and nodes, the hosts pass testinfra, and a second `up`
changes nothing. Changes nothing on the shared stack (tests/platform/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stacks import assert_host_checks_passed, run_host_checks

from .conftest import CONFIG, WORKERS

pytestmark = pytest.mark.e2e


def test_up_from_nothing_ends_with_a_trained_model(platform):
    result = platform.outputs()["training"]
    assert result["ok"] is True
    assert result["final_val_accuracy"] >= 0.90
    assert result["workers"] == int(CONFIG["trainWorkers"])
    assert result["epochs"] == int(CONFIG["trainEpochs"])
    for name in ("model.keras", "metrics.json"):
        assert (Path(result["host_dir"]) / name).stat().st_size > 0
    for rank in range(result["workers"]):  # each TensorFlow worker's own output, copied back
        log = (Path(result["host_dir"]) / f"rank-{rank}.log").read_text()
        assert log.startswith(f"--- rank {rank}, attempt 1, on "), log[:300]
    # Ansible's progress and the job's output showed up in Pulumi's output as they ran.
    assert "] changed" in platform.first.stdout
    assert "launching on" in platform.first.stdout


def test_outputs_list_masters_uis_and_nodes(platform):
    outputs = platform.outputs()
    assert outputs["sparkMasterUrl"] == "spark://control-1:7077,control-2:7077"
    assert set(outputs["sparkUiUrls"]) == {"control-1", "control-2"}
    assert [n["name"] for n in outputs["nodes"]][-1] == f"worker-{WORKERS}"


def test_hosts_pass_testinfra_against_the_stack_inventory(platform, tmp_path):
    stack = platform.stack
    proc = run_host_checks(stack, stack.outputs()["inventory"], tmp_path)
    assert_host_checks_passed(proc)


def test_second_up_changes_nothing_and_launches_no_training(platform):
    stack = platform.stack
    stack.run("preview", "--diff", "--expect-no-changes")
    second = stack.up()
    assert "launching on" not in second.stdout
