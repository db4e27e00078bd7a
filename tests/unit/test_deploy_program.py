"""Provisioning and training as resources, under Pulumi's mocks, and their triggers."""

from __future__ import annotations

from dataclasses import replace

import pulumi
import pytest

from infra.components.provisioning import Provisioning, ProvisioningArgs, tree_digest
from infra.components.training import Training, TrainingArgs
from infra.config import StackConfig
from infra.program import training_trigger

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
            submit_container="trainstack-unit-worker-1",
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

    return t.result.apply(check)


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
