"""Provisioning and training as resources, under Pulumi's mocks, and their triggers."""

from __future__ import annotations

from dataclasses import replace

import pulumi
import pytest

from infra.components.provisioning import Provisioning, ProvisioningArgs, tree_digest
from infra.components.training import Training, TrainingArgs
from infra.config import StackConfig
from infra.program import training_settings, training_trigger

pytestmark = pytest.mark.unit

SETTINGS = {"workers": 2, "epochs": 10, "batch_size": 32, "data": "digits", "rows": 0}


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: dict[str, pulumi.runtime.MockResourceArgs] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources[args.typ] = args
        return [f"{args.name}-id", dict(args.inputs)]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


@pytest.fixture
def mocks() -> Mocks:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="trainstack", stack="unit", preview=False)
    return m


@pulumi.runtime.test
def test_provisioning_runs_site_playbook_with_secret_and_content_hash(mocks):
    p = Provisioning(
        "provisioning",
        ProvisioningArgs(
            inventory={"all": {"hosts": {}}},
            spark_auth_secret="s3cr3t",
            wheelhouse="/w",
            artifacts_dir="/a",
        ),
    )

    def check(_):
        run = mocks.resources["pulumi-python:dynamic/ansible:PlaybookRun"]
        assert run.inputs["playbook"] == "site.yml"
        assert run.inputs["content_hash"] == tree_digest()
        assert run.inputs["wheelhouse"] == "/w"

    return p.stats.apply(check)


@pulumi.runtime.test
def test_training_job_is_keyed_by_its_trigger(mocks):
    t = Training(
        "training",
        TrainingArgs(
            master_url="spark://control-1:7077",
            submit_candidates=["trainstack-unit-worker-1", "trainstack-unit-worker-2"],
            settings=SETTINGS,
            trigger="abcdef0123456789",
            host_artifacts_dir="/h",
        ),
    )

    def check(_):
        job = mocks.resources["pulumi-python:dynamic/training:TrainingJob"]
        assert job.inputs["run_id"] == "run-abcdef012345"
        assert job.inputs["master_url"] == "spark://control-1:7077"
        assert job.inputs["settings"]["epochs"] == 10
        assert job.inputs["submit_candidates"] == [
            "trainstack-unit-worker-1",
            "trainstack-unit-worker-2",
        ]

    return t.result.apply(check)


class _FakeContainer:
    def __init__(self, name: str, status: str, installed: bool = True) -> None:
        self.name, self.status, self.installed = name, status, installed

    def exec_run(self, command):
        return (0 if self.installed else 1), b""


class _FakeEngine:
    def __init__(self, *containers: _FakeContainer) -> None:
        self.by_name = {c.name: c for c in containers}
        self.containers = self

    def get(self, name: str) -> _FakeContainer:
        if name not in self.by_name:
            raise LookupError(f"No such container: {name}")
        return self.by_name[name]


def test_submitter_is_the_first_healthy_worker(monkeypatch, capsys):
    from infra import engine
    from infra.components.training import TrainingError, _submitter

    fake = _FakeEngine(
        _FakeContainer("w1", "exited"),
        _FakeContainer("w2", "running", installed=False),
        _FakeContainer("w3", "running"),
    )
    monkeypatch.setattr(engine, "docker_client", lambda: fake)
    assert _submitter(["w0", "w1", "w2", "w3"]).name == "w3"
    said = capsys.readouterr().err
    assert "submitting from w3; skipped w0: not on the engine" in said
    assert (
        "w1: exited" in said and "w2: /opt/trainstack/venv/bin/trainstack-train is missing" in said
    )
    with pytest.raises(TrainingError, match=r"no worker node can submit the job \(w1: exited\)"):
        _submitter(["w1"])


def test_training_trigger_changes_only_with_settings_or_retrain_token():
    config = StackConfig()
    base = training_trigger(config, SETTINGS)
    assert training_trigger(config, dict(SETTINGS)) == base
    assert training_trigger(replace(config, workers=3), SETTINGS) == base
    assert training_trigger(config, {**SETTINGS, "epochs": 11}) != base
    assert training_trigger(replace(config, retrain="again"), SETTINGS) != base


def test_content_hash_follows_the_roles(tmp_path):
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    task = tmp_path / "roles" / "r" / "tasks" / "main.yml"
    task.write_text("---\n- name: A\n")
    first = tree_digest(tmp_path, ("roles",))
    task.write_text("---\n- name: B\n")
    second = tree_digest(tmp_path, ("roles",))
    assert second != first
    # Caches written beside the sources do not count.
    (tmp_path / "roles" / "r" / "__pycache__").mkdir()
    (tmp_path / "roles" / "r" / "__pycache__" / "x.pyc").write_bytes(b"1")
    assert tree_digest(tmp_path, ("roles",)) == second


def test_inventory_numbers_are_ints_again_after_the_engine():
    from infra.components.provisioning import integral

    raw = {"all": {"hosts": {"c": {"trainstack_zookeeper_id": 1.0, "cpus": 0.5}}, "l": [2.0]}}
    assert integral(raw) == {
        "all": {"hosts": {"c": {"trainstack_zookeeper_id": 1, "cpus": 0.5}}, "l": [2]}
    }


def test_job_jvms_compile_with_c1_only_and_the_training_package_parses_it():
    """The launch settings' spark_conf reaches Spark as three settings: the driver's heap and
    C1-only compilation for the job's driver and executors (docs/training.md)."""
    from trainstack_training.config import TrainConfig

    settings = training_settings(StackConfig())
    conf = TrainConfig(spark_conf=settings["spark_conf"]).spark_settings()
    assert conf == {
        "spark.driver.memory": "512m",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }
