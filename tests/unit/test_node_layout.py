"""The node layout has one definition, infra/nodes.py's NODE_PATHS.

Every inventory the project builds carries it as `trainstack_*` variables;
playbooks/group_vars/all.yml maps every role variable that holds a node path onto them (the role
defaults keep the same literal paths, for a role run alone); no other module under infra/ writes
one of those paths. The mapping is resolved here as Ansible would (Jinja over the inventory,
group_vars and the role defaults), without running Ansible.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import jinja2
import jinja2.meta
import pytest
import yaml

from infra import nodes, topology
from infra.config import StackConfig
from infra.config.servers import Server
from infra.nodes import NODE_PATHS, ROOTS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
LAYOUT = NODE_PATHS.inventory_vars()
GROUP_VARS = yaml.safe_load((REPO / "playbooks/group_vars/all.yml").read_text())
DEFAULTS = {
    name: value
    for role in ROLES
    if (REPO / "roles" / role / "defaults/main.yml").exists()
    for name, value in (
        yaml.safe_load((REPO / "roles" / role / "defaults/main.yml").read_text()) or {}
    ).items()
}
# The facts and play variables a path may be computed from (spark_home: the venv's Python).
FACTS = {
    "ansible_facts": {"python": {"version": {"major": 3, "minor": 11}}},
    "group_names": ["spark_worker", "tensorflow"],
}
# Role variables whose project value is another role's path, not their own default:
# SPARK_HOME is the spark role's `spark_home` (pyspark in the venv), not the distribution's.
NOT_THEIR_DEFAULT = {"spark_master_spark_home", "spark_worker_spark_home"}
_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined)


def _node_paths(value: object) -> list[str]:
    """The node paths in a value (a string, or a list of strings)."""
    items = value if isinstance(value, list) else [value]
    return [v for v in items if isinstance(v, str) and v.startswith(ROOTS) and "{{" not in v]


def _resolve(name: str, layout: dict[str, str], seen: tuple[str, ...] = ()) -> object:
    """A variable's value in a play: the inventory's layout, else group_vars, else the role
    defaults (Ansible's precedence for these three), templates rendered with their names
    resolved the same way. A name none of them has stays undefined (`default()` applies)."""
    assert name not in seen, f"loop: {' -> '.join((*seen, name))}"
    if name in layout:
        return layout[name]
    if name in FACTS:
        return FACTS[name]
    raw = GROUP_VARS[name] if name in GROUP_VARS else DEFAULTS[name]
    return _render(raw, layout, (*seen, name))


def _render(raw: object, layout: dict[str, str], seen: tuple[str, ...]) -> object:
    if isinstance(raw, list):
        return [_render(item, layout, seen) for item in raw]
    if not isinstance(raw, str) or "{{" not in raw:
        return raw
    names = jinja2.meta.find_undeclared_variables(_JINJA.parse(raw))
    known = {
        n: _resolve(n, layout, seen)
        for n in names
        if n in layout or n in FACTS or n in GROUP_VARS or n in DEFAULTS
    }
    return _JINJA.from_string(raw).render(known)


# The role variables that hold a node path: by their literal default, or by their mapping.
PATH_VARS = sorted(
    {name for name, value in DEFAULTS.items() if _node_paths(value)}
    | {
        name
        for name, raw in GROUP_VARS.items()
        if any(var in str(raw) for var in LAYOUT) and name not in LAYOUT
    }
)


def test_the_layout_is_under_the_roots():
    assert LAYOUT and all(path.startswith(ROOTS) for path in LAYOUT.values())
    assert all(name.startswith("trainstack_") for name in LAYOUT)
    assert len(set(LAYOUT.values())) == len(LAYOUT), "two layout variables share a path"


def _inventories() -> dict[str, dict]:
    config = StackConfig()
    servers = [
        Server(name="ctl-1", address="10.0.0.1", user="root", roles=("zookeeper", "spark_master")),
        Server(name="wrk-1", address="10.0.0.2", user="root", roles=("spark_worker", "tensorflow")),
    ]
    bake = importlib.import_module("infra.images.bake")
    baked: dict = {}

    def capture(inventory, playbook, **_kwargs):
        baked["inventory"] = inventory
        raise RuntimeError("captured")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bake, "run_playbook", capture)
        with pytest.raises(bake.BakeError):
            bake._run_image_playbook("b", Path("/wh"), _Sink(), Path("/log"), "t:d", None)
    return {
        "docker": topology.inventory(config, "t", topology.plan(config)),
        "ssh": topology.inventory(
            config, "t", topology.server_plan(config, servers), servers=servers
        ),
        "teardown": topology.teardown_inventory(servers, "/state/known_hosts"),
        "bake": baked["inventory"],
    }


class _Sink:
    def write(self, _text: str) -> None:
        pass


@pytest.mark.parametrize("kind", ["docker", "ssh", "teardown", "bake"])
def test_every_inventory_carries_the_layout(kind):
    """The stack's inventory (both targets), the ssh target's teardown and the image bake."""
    all_vars = _inventories()[kind]["all"]["vars"]
    assert {name: all_vars.get(name) for name in LAYOUT} == LAYOUT


def test_path_role_variables_are_found():
    # A sample of what the scan must find, so an empty scan cannot pass the tests below.
    assert {
        "common_venv_dir",
        "common_shared_directories",
        "spark_conf_dir",
        "zookeeper_data_dir",
        "spark_worker_python",
        "supervisor_program_log_dir",
    } <= set(PATH_VARS)


@pytest.mark.parametrize("name", PATH_VARS)
def test_group_vars_map_a_path_variable_onto_the_layout(name):
    """Mapped onto the inventory's `trainstack_*` path variables: with the layout moved, the
    value moves with it (no literal path in group_vars or in a role default it falls back to),
    and with the layout as it is, the value is the role's own default (so the roles and the
    node image do the same as before, and the role run alone puts things in the same place)."""
    assert name in GROUP_VARS, f"{name} holds a node path: map it in playbooks/group_vars/all.yml"
    moved = _resolve(name, {var: "/moved" + path for var, path in LAYOUT.items()})
    values = moved if isinstance(moved, list) else [moved]
    assert values and all(str(v).startswith("/moved/") for v in values), (name, moved)
    default = DEFAULTS.get(name)
    if _node_paths(default) and name not in NOT_THEIR_DEFAULT:
        assert _resolve(name, LAYOUT) == default, name


def test_every_layout_variable_reaches_a_role():
    unused = [var for var in LAYOUT if not any(var in str(raw) for raw in GROUP_VARS.values())]
    assert not unused, f"no role variable is mapped onto {unused}"


def test_the_master_url_and_zookeeper_connect_come_from_the_inventory():
    """group_vars takes them from the inventory as they are; the spark role's group-computed
    values are its own defaults only (a role run alone)."""
    assert GROUP_VARS["spark_master_url"] == "{{ trainstack_spark_master_url }}"
    assert GROUP_VARS["spark_zookeeper_url"] == "{{ trainstack_zookeeper_connect }}"
    assert DEFAULTS["spark_master_url"] == "{{ spark_master_url_from_group }}"
    assert DEFAULTS["spark_zookeeper_url"] == "{{ spark_zookeeper_url_from_group }}"
    assert "_from_group" not in (REPO / "playbooks/group_vars/all.yml").read_text()
    config = StackConfig()
    all_vars = topology.inventory(config, "t", topology.plan(config))["all"]["vars"]
    assert all_vars["trainstack_spark_master_url"] == "spark://control-1:7077,control-2:7077"
    assert all_vars["trainstack_zookeeper_connect"] == (
        "control-1:2181,control-2:2181,control-3:2181"
    )


def test_no_other_module_under_infra_writes_a_node_path():
    layout_module = Path(nodes.__file__).resolve()
    found = [
        f"{path.relative_to(REPO)}:{i}: {line.strip()}"
        for path in sorted((REPO / "infra").rglob("*.py"))
        if path.resolve() != layout_module
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if any(root in line for root in ROOTS)
    ]
    assert not found, "node paths outside infra/nodes.py (use NODE_PATHS):\n" + "\n".join(found)


def test_the_python_users_read_the_layout():
    from infra.jobs import envs, remote

    assert NODE_PATHS.venv_dir == remote.NODE_VENV
    assert NODE_PATHS.models_dir == remote.MODELS_DIR
    assert remote.NODE_ENV["SPARK_CONF_DIR"] == NODE_PATHS.spark_conf_dir
    assert remote.NODE_ENV["PYSPARK_PYTHON"] == f"{NODE_PATHS.venv_dir}/bin/python"
    assert envs.ENVS_DIR.startswith(NODE_PATHS.models_dir + "/")
    assert set(topology.SHARED_MOUNTS.values()) == {
        NODE_PATHS.data_dir,
        NODE_PATHS.checkpoints_dir,
        NODE_PATHS.models_dir,
    }
    config = StackConfig()
    mounts = {m for n in topology.plan(config) for m in n.volumes.values()}
    assert mounts == {
        NODE_PATHS.zookeeper_data_dir,
        NODE_PATHS.spark_recovery_dir,
        NODE_PATHS.mlflow_data_dir,
        NODE_PATHS.object_store_data_dir,
    }


def test_teardown_removes_the_warm_runners_state_where_the_runner_keeps_it():
    from trainstack_training import warm

    assert DEFAULTS["common_warm_runner_dir_prefix"] == warm.STATE_DIR_PREFIX
