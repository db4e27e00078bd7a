"""The image digest: what changes it and what does not (no engine)."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The package re-exports the function `bake`, which hides the module of the same name.
b = importlib.import_module("infra.images.bake")
BASE = ("debian:bookworm", "sha256:" + "0" * 64)
pytestmark = pytest.mark.unit


def _copy_tree(dest: Path) -> Path:
    """The inputs of the digest plus a few unrelated files, as a stand-alone tree."""
    for tree in ("roles", "training"):
        shutil.copytree(
            REPO / tree, dest / tree, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info")
        )
    for name in (
        "playbooks/image.yml",
        "playbooks/bootstrap.yml",
        "playbooks/group_vars/all.yml",
        "playbooks/site.yml",
        "ansible.cfg",
        "constraints.txt",
        "README.md",
        "infra/provisioning/wheelhouse.py",
        "infra/topology.py",
    ):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _copy_tree(tmp_path / "a")


def test_digest_is_stable_across_copies(tree, tmp_path):
    other = _copy_tree(tmp_path / "elsewhere" / "b")
    assert b.image_digest(*BASE, root=tree) == b.image_digest(*BASE, root=other)
    assert len(b.image_digest(*BASE, root=tree)) == 16


def test_repository_digest_matches_a_copy(tree):
    assert b.image_digest(*BASE) == b.image_digest(*BASE, root=tree)


def test_role_change_changes_digest(tree):
    before = b.image_digest(*BASE, root=tree)
    path = tree / "roles" / "java" / "tasks" / "install.yml"
    path.write_text(path.read_text() + "\n# changed\n")
    assert b.image_digest(*BASE, root=tree) != before


@pytest.mark.parametrize(
    "name",
    [
        "playbooks/image.yml",
        "playbooks/group_vars/all.yml",
        "ansible.cfg",
        "constraints.txt",
        "training/pyproject.toml",
    ],
)
def test_input_change_changes_digest(tree, name):
    before = b.image_digest(*BASE, root=tree)
    (tree / name).write_text((tree / name).read_text() + "\n# changed\n")
    assert b.image_digest(*BASE, root=tree) != before


@pytest.mark.parametrize(
    "name",
    [
        "README.md",
        "roles/common/README.md",
        "training/README.md",
        "playbooks/site.yml",
        "infra/topology.py",
        "training/build/lib/x.py",
        "training/__pycache__/x.cpython-311.pyc",
        "training/x.egg-info/PKG-INFO",
    ],
)
def test_unrelated_change_keeps_digest(tree, name):
    before = b.image_digest(*BASE, root=tree)
    path = tree / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((path.read_text() if path.exists() else "") + "\n# changed\n")
    assert b.image_digest(*BASE, root=tree) == before


def test_pins_count_not_the_rest_of_wheelhouse_py(tree):
    path = tree / "infra" / "provisioning" / "wheelhouse.py"
    before = b.image_digest(*BASE, root=tree)
    path.write_text(path.read_text() + "\n# a comment\n")
    assert b.image_digest(*BASE, root=tree) == before
    path.write_text(path.read_text().replace('PYSPARK = "pyspark==', 'PYSPARK = "pyspark==9'))
    assert b.image_digest(*BASE, root=tree) != before


def test_the_node_layout_counts(tree, monkeypatch):
    """The roles get the node paths from the inventory (infra/nodes.py), not from a file the
    digest reads: a moved path changes what the image holds, so it changes the digest."""
    from dataclasses import replace

    before = b.image_digest(*BASE, root=tree)
    monkeypatch.setattr(b, "NODE_PATHS", replace(b.NODE_PATHS, venv_dir="/opt/elsewhere/venv"))
    assert b.image_digest(*BASE, root=tree) != before


def test_base_image_name_and_id_count(tree):
    digest = b.image_digest(*BASE, root=tree)
    assert b.image_digest("debian:trixie", BASE[1], root=tree) != digest
    assert b.image_digest(BASE[0], "sha256:" + "1" * 64, root=tree) != digest


def test_image_tag():
    assert b.image_tag(digest="0123456789abcdef") == "trainstack-node:0123456789abcdef"
    assert b.image_tag("tsit-node", "ab") == "tsit-node:ab"
    with pytest.raises(ValueError):
        b.image_tag("tsit-node")


def test_cli_reports_a_dead_engine_in_one_sentence(monkeypatch, capsys):
    from infra.images import __main__ as cli

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert cli.main(["digest"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the Docker engine does not answer") and "\n" not in err


def test_wheelhouse_failure_is_one_sentence_naming_the_path(tmp_path, monkeypatch):
    def boom(root):
        raise b.WheelhouseError("wheel set spark: `pip wheel` failed (exit 1):\nline\nNo network")

    monkeypatch.setattr(b, "build_node_wheelhouse", boom)
    with pytest.raises(b.BakeError) as err:
        b._build_wheelhouse(tmp_path / "wh")
    text = str(err.value)
    assert str(tmp_path / "wh") in text and "No network" in text and "\n" not in text
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.undo()
    with pytest.raises(b.BakeError, match="cannot create the wheelhouse at"):
        b._build_wheelhouse(blocked / "wh")


@pytest.mark.parametrize(
    "name",
    [
        "roles/common/README.md",
        "training/__pycache__/x.cpython-311.pyc",
        "training/x.egg-info/PKG-INFO",
    ],
)
def test_provisioning_trigger_leaves_out_what_the_image_digest_leaves_out(tree, name):
    """One reading of the source trees (infra.digest) for the image and for provisioning."""
    from infra.components.provisioning import tree_digest

    sources = ("roles", "training", "ansible.cfg")
    before = tree_digest(tree, sources)
    path = tree / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((path.read_text() if path.exists() else "") + "\n# changed\n")
    assert tree_digest(tree, sources) == before
    role = tree / "roles" / "java" / "tasks" / "install.yml"
    role.write_text(role.read_text() + "\n# changed\n")
    assert tree_digest(tree, sources) != before
