"""Fast checks without containers: syntax, role defaults, pins, the program's inventory,
events. The role READMEs are checked in tests/unit/test_role_docs.py; ansible-lint's production
profile and yamllint run in `make lint` (scripts/lint.sh), beside these in `make test-fast`."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from infra import topology
from infra.config import StackConfig
from infra.nodes import NODE_PATHS
from infra.provisioning import inventory as inv
from infra.provisioning import runner, wheelhouse

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
PLAYBOOKS = sorted(p.name for p in (REPO / "playbooks").glob("*.yml"))
pytestmark = pytest.mark.unit


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
    )
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, check=False)


def _defaults(role: str) -> dict:
    path = REPO / "roles" / role / "defaults" / "main.yml"
    return yaml.safe_load(path.read_text()) or {} if path.exists() else {}


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook, tmp_path):
    inventory = tmp_path / "hosts.json"
    inventory.write_text(
        '{"all": {"hosts": {"n1": {}}, "children": {"zookeeper": {"hosts": {"n1": {}}}}}}'
    )
    proc = _run(
        [
            str(VENV_BIN / "ansible-playbook"),
            "--syntax-check",
            "-i",
            str(inventory),
            f"playbooks/{playbook}",
        ]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("role", ROLES)
def test_role_defaults_prefixed_and_commented(role):
    path = REPO / "roles" / role / "defaults" / "main.yml"
    assert path.exists(), f"{role} has no defaults/main.yml"
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^([a-z_][a-z0-9_]*):", line)
        if not m:
            continue
        assert m.group(1).startswith(role + "_"), (
            f"{role}: {m.group(1)} is not prefixed with {role}_"
        )
        before = [x for x in lines[:i] if x.strip()]
        assert before and (before[-1].startswith("#") or re.match(rf"^{role}_", before[-1])), (
            f"{role}: {m.group(1)} has no comment above it"
        )


def test_pins_agree_between_wheelhouse_and_roles():
    assert f"pyspark=={_defaults('spark')['spark_pyspark_version']}" == wheelhouse.PYSPARK
    assert (
        f"tensorflow-cpu=={_defaults('tensorflow')['tensorflow_version']}" == wheelhouse.TENSORFLOW
    )
    assert (
        f"tf-keras=={_defaults('tensorflow')['tensorflow_tf_keras_version']}" == wheelhouse.TF_KERAS
    )
    assert f"mlflow[auth]=={_defaults('mlflow')['mlflow_version']}" == wheelhouse.MLFLOW
    assert wheelhouse.WheelSet("mlflow", [wheelhouse.MLFLOW]) in wheelhouse.default_sets()
    # The control machine's client is the same MLflow (constraints.txt).
    assert f"mlflow=={_defaults('mlflow')['mlflow_version']}" in (
        (REPO / "constraints.txt").read_text().splitlines()
    )


def test_wheelhouse_key_depends_on_pins_only():
    a = wheelhouse.requirements_key(["pyspark==4.0.1", "b"], ["x"])
    assert a == wheelhouse.requirements_key(["b", "pyspark==4.0.1"], ["x"])
    assert a != wheelhouse.requirements_key(["pyspark==4.0.2", "b"], ["x"])


def test_wheelhouse_cache_hit_skips_pip(tmp_path, monkeypatch):
    dest = tmp_path / "spark"
    dest.mkdir()
    (dest / "x-1-py3-none-any.whl").write_text("")
    (dest / wheelhouse.KEY_FILE).write_text(wheelhouse.requirements_key(["x==1"]))
    monkeypatch.setattr(
        wheelhouse, "_pip", lambda *a, **k: pytest.fail("pip called on a cache hit")
    )
    assert wheelhouse.build_wheelhouse(dest, ["x==1"]) == dest


def test_wheelhouse_error_names_the_set(tmp_path):
    with pytest.raises(wheelhouse.WheelhouseError, match="wheel set spark"):
        wheelhouse.build_wheelhouse(
            tmp_path / "spark", ["--no-index", "trainstack-no-such-wheel==1"]
        )


def test_program_inventory_contract():
    """The inventory the roles get is the program's (infra.topology, the stack's `inventory`
    output): every group the playbooks and roles name, with the host variables they read."""
    config = StackConfig()
    data = topology.inventory(config, "t", topology.plan(config))
    groups = data["all"]["children"]

    def hosts(group: str) -> list[str]:
        return list(groups[group]["hosts"])

    named = set()
    for path in [*(REPO / "playbooks").glob("*.yml"), *(REPO / "roles").rglob("*.yml")]:
        named |= set(re.findall(r"'([a-z_]+)' in group_names", path.read_text()))
    assert named and named <= set(groups), named - set(groups)
    assert hosts("zookeeper") == ["control-1", "control-2", "control-3"]
    assert hosts("spark_master") == ["control-1", "control-2"]
    assert hosts("spark_worker") == ["worker-1", "worker-2"]
    assert hosts("tensorflow") == ["worker-1", "worker-2"]
    assert hosts("monitoring") == ["control-1"]
    assert data["all"]["vars"]["ansible_connection"] == "docker"
    worker = groups["workers"]["hosts"]["worker-1"]
    assert worker["ansible_host"] == "t-worker-1"
    assert worker["trainstack_node_address"] == "worker-1"
    assert worker["trainstack_spark_worker_memory"] == "1g"
    assert groups["control"]["hosts"]["control-2"]["trainstack_zookeeper_id"] == 2
    assert data["all"]["vars"]["trainstack_stack"] == "t"
    # The node layout, which playbooks/group_vars maps onto the roles (test_node_layout.py).
    assert NODE_PATHS.inventory_vars().items() <= data["all"]["vars"].items()
    # No secret in it: the program passes the Spark auth secret apart (SECRET_ENV).
    assert inv.split_secrets(data) == (data, {})


def test_split_secrets_removes_secret_everywhere():
    config = StackConfig()
    data = topology.inventory(config, "t", topology.plan(config))
    data["all"]["vars"]["trainstack_spark_auth_secret"] = "topsecret"
    data["all"]["children"]["control"]["hosts"]["control-1"]["trainstack_spark_auth_secret"] = (
        "topsecret"
    )
    clean, found = inv.split_secrets(data)
    assert found == {"trainstack_spark_auth_secret": "topsecret"}
    assert "topsecret" not in repr(clean)
    assert "topsecret" in repr(data)  # the caller's dict is untouched


def test_task_event_from_runner_events():
    ok = runner._task_event(
        {
            "event": "runner_on_ok",
            "event_data": {"host": "h", "task": "T.", "res": {"changed": True}},
        }
    )
    assert (ok.host, ok.task, ok.status) == ("h", "T.", "changed")
    failed = runner._task_event(
        {
            "event": "runner_on_failed",
            "event_data": {"host": "h", "task": "T.", "res": {"msg": "boom"}},
        }
    )
    assert failed.status == "failed" and failed.message == "boom"
    unreachable = runner._task_event(
        {
            "event": "runner_on_unreachable",
            "event_data": {"host": "h", "task": "T.", "res": {"msg": "no route"}},
        }
    )
    assert unreachable.status == "unreachable" and "no route" in str(unreachable)
    assert runner._task_event({"event": "playbook_on_start"}) is None


@pytest.mark.parametrize("line,status", [("changed: [h]", "changed"), ("ok: [h]", "ok")])
def test_task_event_of_a_no_log_task_says_whether_it_changed(line, status):
    # `no_log` censors the whole result, `changed` included; Ansible's own line does not.
    censored = {"censored": "the output has been hidden due to the fact that 'no_log: true'"}
    event = runner._task_event(
        {
            "event": "runner_on_ok",
            "stdout": f"\r\nTASK [other : Another host's task header.] ***\r\n{line}",
            "event_data": {"host": "h", "task": "Ensure the secret file.", "res": censored},
        }
    )
    assert event.status == status


def test_stats_normalized_per_host():
    stats = runner._normalize_stats(
        {"ok": {"a": 3}, "changed": {"a": 1}, "dark": {"b": 1}}, ["a", "b"]
    )
    assert stats["a"]["ok"] == 3 and stats["a"]["changed"] == 1 and stats["b"]["unreachable"] == 1
    assert stats["b"]["changed"] == 0


def test_zookeeper_config_does_not_follow_the_inventory_host_order():
    """The inventory crosses Pulumi as a map: its host order may change between runs, and a
    reordered zoo.cfg would restart every ZooKeeper server for nothing."""
    import jinja2

    source = Path(__file__).resolve().parents[2] / "roles/zookeeper/templates/zoo.cfg.j2"
    env = jinja2.Environment(trim_blocks=True)
    env.filters["bool"] = bool  # Ansible's filter; the values here are Python booleans
    template = env.from_string(source.read_text())
    hostvars = {
        f"control-{i}": {"zookeeper_id": i, "zookeeper_node_address": f"control-{i}"}
        for i in (1, 2, 3)
    }

    def render(order: list[str]) -> str:
        return template.render(
            groups={"zookeeper": order},
            zookeeper_group="zookeeper",
            hostvars=hostvars,
            zookeeper_peer_port=2888,
            zookeeper_election_port=3888,
            zookeeper_client_port_address="",
            zookeeper_sasl_enabled=True,
            zookeeper_quorum_sasl_enabled=True,
        )

    first = render(["control-1", "control-2", "control-3"])
    assert "server.2=control-2:2888:3888" in first
    assert render(["control-2", "control-1", "control-3"]) == first
    assert "enforce.auth.enabled=true" in first and "quorum.auth.enableSasl=true" in first


def test_training_wheel_is_the_same_from_any_clone(tmp_path):
    """Two copies of training/ with other modification times build byte-identical wheels, so
    a node image baked from one clone holds the wheel every other clone provisions."""
    digests = []
    for i, when in enumerate((1_600_000_000, 1_700_000_000)):
        source = tmp_path / f"clone-{i}" / "training"
        shutil.copytree(
            REPO / "training", source, ignore=shutil.ignore_patterns("build", "*.egg-info")
        )
        for path in source.rglob("*"):
            os.utime(path, (when, when))
        built = wheelhouse.build_training_wheel(tmp_path / f"wheels-{i}", source)
        (wheel,) = built.glob("*.whl")
        digests.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_training_wheel_ships_no_leftover_of_an_earlier_build(tmp_path):
    """A module removed since an earlier build, still in the tree's build/ directory, is not in
    the wheel: the wheel is what its key (the sources) names."""
    source = tmp_path / "training"
    shutil.copytree(REPO / "training", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    stale = source / "build" / "lib" / "trainstack_training" / "removed_module.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("STALE = True\n")
    (wheel,) = wheelhouse.build_training_wheel(tmp_path / "wheels", source).glob("*.whl")
    with zipfile.ZipFile(wheel) as built:
        names = built.namelist()
    assert "trainstack_training/__init__.py" in names
    assert not [n for n in names if "removed_module" in n], names
    assert not (source / "trainstack_training.egg-info").exists()  # nothing built in the tree
