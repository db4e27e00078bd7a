"""The product, end to end: `pulumi up` from nothing to a trained model, then destroy.

One stack of the default topology (3 control nodes, 2 masters, 2 workers) goes through
the whole life cycle; the tests run in order on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pulumi_cli import Stack, engine_objects, run_host_checks

pytestmark = pytest.mark.e2e

CONFIG = {
    "uiPortBase": "0",
    "workerCpus": "0.8",
    "controlCpus": "0.3",
    "trainEpochs": "8",
    # Fixed, so scaling the servers does not launch a new run.
    "trainWorkers": "2",
}


@pytest.fixture(scope="module")
def platform(tmp_path_factory, engine):
    stack = Stack(tmp_path_factory.mktemp("e2e"), prefix="tse2e")
    stack.init(**CONFIG)
    first = stack.up()
    yield stack, first
    stack.destroy_and_remove()


def test_up_from_nothing_ends_with_a_trained_model(platform):
    stack, first = platform
    result = stack.outputs()["training"]
    assert result["ok"] is True
    assert result["final_val_accuracy"] >= 0.90
    assert result["workers"] == 2
    assert result["epochs"] == 8
    for name in ("model.keras", "metrics.json"):
        assert (Path(result["host_dir"]) / name).stat().st_size > 0
    # Ansible's progress and the job's output showed up in Pulumi's output as they ran.
    assert "] changed" in first.stdout
    assert "launching on" in first.stdout


def test_outputs_list_masters_uis_and_nodes(platform):
    stack, _ = platform
    outputs = stack.outputs()
    assert outputs["sparkMasterUrl"] == "spark://control-1:7077,control-2:7077"
    assert set(outputs["sparkUiUrls"]) == {"control-1", "control-2"}
    assert [n["name"] for n in outputs["nodes"]][-1] == "worker-2"


def test_hosts_pass_testinfra_against_the_stack_inventory(platform, tmp_path):
    stack, _ = platform
    proc = run_host_checks(stack, stack.outputs()["inventory"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


def test_second_up_changes_nothing_and_launches_no_training(platform):
    stack, _ = platform
    stack.run("preview", "--expect-no-changes")
    second = stack.up()
    assert "launching on" not in second.stdout


def test_scaling_workers_adds_a_provisioned_node_without_retraining(platform, engine):
    stack, _ = platform
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


def test_failed_training_keeps_servers_and_converges_once_fixed(platform, engine):
    stack, _ = platform
    before = {c.name: c.id for c in engine.containers.list(filters={"label": stack.selector})}
    missing = "/srv/trainstack/data/no-such-set.csv"
    stack.set_config(trainData=missing)
    failed = stack.run("up", "--yes", "--skip-preview", check=False)
    assert failed.returncode != 0
    assert "training job on" in failed.stdout and missing in failed.stdout
    # One message naming the node, the cause and the log; no Python traceback.
    assert "Traceback" not in failed.stdout + failed.stderr, failed.stdout[-3000:]
    assert "job output: " in failed.stdout
    after = {c.name: c.id for c in engine.containers.list(filters={"label": stack.selector})}
    assert after == before
    stack.run("config", "rm", "trainstack:trainData")
    stack.run("preview", "--expect-no-changes")


def test_destroy_leaves_nothing_of_the_stack(platform):
    stack, _ = platform
    stack.run("destroy", "--yes")
    assert engine_objects(stack.label) == {"containers": [], "networks": [], "volumes": []}
