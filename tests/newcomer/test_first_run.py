"""The README's first command, once, as a new user runs it: a fresh clone, a fresh HOME.

Download caches are reused to keep CI's time down (pip's, Go's, and the per-user cache of
built Pulumi binaries); the project's own folders and state are not: the clone has no
`.venv`, `tools/`, `.pulumi-state/` (so a new passphrase) or stack, and the wheelhouse
location (under the fresh HOME) is empty, and the node image of this tree is removed so that
`make up` bakes it. One clone, one `make up`, then `make destroy`.

The one difference from a user's shell is the stack's name: `STACK=newcomer-<6 hex>` in the
environment (the Makefile's `STACK ?= dev`), so that a developer's own `dev` stack on the same
engine is not touched by it (a stack of its own on the default ports is named before the
test starts: the newcomer's stack needs those ports), and a run killed half-way leaves objects
that `make clean-test-stacks` recognises as a test's (`tests/support/leftovers.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import docker
import pytest

from tests.support.stacks import ROOT, engine_objects

pytestmark = pytest.mark.newcomer

REAL_HOME = Path(os.environ.get("HOME", "/root"))


def newcomer_env(home: Path) -> dict[str, str]:
    """The machine's environment with a fresh HOME, keeping only download caches."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PULUMI_", "VIRTUAL_ENV", "TRAINSTACK_", "PYTEST_"))
        and k not in ("JAVA_HOME",)
    }
    cache = REAL_HOME / ".cache"
    # A PATH without the project's own tools and venv in front.
    path = [p for p in keep.get("PATH", "").split(":") if p and str(ROOT) not in p]
    return {
        **keep,
        "HOME": str(home),
        "PATH": ":".join(path),
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(cache / "pip")),
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(cache / "uv")),
        "GOCACHE": os.environ.get("GOCACHE", str(cache / "go-build")),
        "GOMODCACHE": os.environ.get("GOMODCACHE", str(REAL_HOME / "go" / "pkg" / "mod")),
        "TRAINSTACK_CACHE": str(cache / "trainstack"),
    }


def run(args: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: int):
    with log.open("w") as out:
        proc = subprocess.run(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
        )
    text = log.read_text()
    return proc.returncode, text


# The host ports a stack of the README's defaults publishes (uiPortBase 18080: three masters'
# UIs, Prometheus at +1010, MLflow at +1020, the object store at +1030; docs/config.md).
DEFAULT_PORTS = (18080, 18081, 18082, 19090, 19100, 19110)


def held_default_ports(engine) -> dict[int, str]:
    """The default ports that a running container already publishes, with its name."""
    held: dict[int, str] = {}
    for container in engine.containers.list():
        for bindings in (container.attrs["NetworkSettings"]["Ports"] or {}).values():
            for binding in bindings or []:
                if int(binding["HostPort"]) in DEFAULT_PORTS:
                    held[int(binding["HostPort"])] = container.name
    return held


@pytest.fixture(scope="module")
def clone(tmp_path_factory, engine):
    stack = f"newcomer-{uuid.uuid4().hex[:6]}"  # the README's default is "dev"
    # A newcomer's stack takes the default ports: another stack on them (a developer's `dev`
    # left up) would fail its `make up` with the engine's "port is already allocated".
    held = held_default_ports(engine)
    if held:
        pytest.fail(
            f"the README's default ports are held by running containers {held}: the newcomer's "
            "`make up` needs them; remove that stack (`make destroy STACK=<its stack>`) first"
        )
    # A new machine has no node image either: remove this tree's tag (no container of the
    # tests uses it between modules), so `make up` bakes it as a newcomer's would.
    from infra.images.bake import current_digest, image_tag

    tag = image_tag(digest=current_digest())
    try:
        engine.images.remove(tag, noprune=False)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        pytest.fail(f"could not remove {tag} to bake it afresh ({exc}); is a stack still using it?")
    base = tmp_path_factory.mktemp("newcomer")
    home = base / "home"
    home.mkdir()
    repo = base / "trainstack"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    env = {**newcomer_env(home), "STACK": stack}
    yield repo, env, base
    # Whatever happened, leave nothing behind on the engine, and keep only the logs on disk:
    # the clone's venv, tools and the fresh HOME's wheelhouse take about 5 GB.
    subprocess.run(["make", "destroy"], cwd=repo, env=env, capture_output=True, check=False)
    for heavy in (repo, home):
        shutil.rmtree(heavy, ignore_errors=True)


def test_make_up_once_trains_and_make_destroy_leaves_nothing(clone, engine):
    repo, env, base = clone
    stack = env["STACK"]
    wheelhouse = Path(env["HOME"]) / ".cache" / "trainstack" / "wheelhouse"
    assert not wheelhouse.exists()

    code, out = run(["make", "up"], repo, env, base / "make-up.log", timeout=3600)
    assert code == 0, (
        f"`make up` failed on a fresh clone (log {base / 'make-up.log'}):\n" + out[-6000:]
    )
    assert "Traceback" not in out, out[-6000:]
    assert "validation accuracy" in out
    assert "builder container trainstack-node-builder-" in out, "the node image was not baked"
    # The bake ran the roles (its log is the one tests/images would have read of its own bake).
    bake_logs = list((repo / ".artifacts" / stack / "image").glob("bake-*.log"))
    assert bake_logs, f"no bake log under .artifacts/{stack}/image"
    assert "Ensure TensorFlow is installed in the virtual environment." in bake_logs[0].read_text()
    assert any(wheelhouse.glob("*/*.whl")), "the wheelhouse was not filled"

    outputs = subprocess.run(
        ["make", "-s", "outputs"], cwd=repo, env=env, capture_output=True, text=True, check=False
    )
    assert outputs.returncode == 0, outputs.stdout + outputs.stderr
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'eval "$(scripts/env.sh)" && pulumi stack output training --json -s {stack}',
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    training = json.loads(proc.stdout)
    assert training["ok"] is True
    assert training["final_val_accuracy"] >= 0.9, training

    # Nothing the user should commit changed: no stack file, no secret material.
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert status.stdout == "", status.stdout

    # namePrefix "trainstack" (the default), then the stack: the label on what `make up` made.
    # Before `make destroy`, the same filter finds the stack's containers, network and volumes,
    # so that its empty answer afterwards means they are gone, not that it matches nothing.
    label = f"trainstack-{stack}"
    made = engine_objects(label)
    print(f"before `make destroy`, label {label}: {made}")
    assert all(made[kind] for kind in ("containers", "networks", "volumes")), made

    code, out = run(["make", "destroy"], repo, env, base / "make-destroy.log", timeout=900)
    assert code == 0, out[-4000:]
    left = engine_objects(label)
    assert left == {"containers": [], "networks": [], "volumes": []}, (left, made)
