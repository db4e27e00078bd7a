"""The node image of this tree, and a 1-control + 1-worker cluster provisioned from it.

The image is this tree's `trainstack-node:<digest>`: in a whole run the newcomer test has just
baked it from nothing through `make up` (and checks that bake's log); run alone, this module
bakes it. Its labels, command and contents are checked; containers from it run supervisord as
their main process; site.yml then finds every install task `ok`, copies no wheels, and a
second run changes nothing. A second tag in a test repository (``tsit-node``, removed at the
end) lets `clean` be tried without touching the real repository's other tags.

Its own cluster, not the suite's shared stack (tests/platform): it forces the install parts on
the cluster's first run, which a stack never does, and its containers come from the test
repository's image rather than the one a stack would bake or pick. The nodes and the inventory
are still the program's (infra.topology, through tests/support/cluster.py).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import uuid
from pathlib import Path

import docker
import pytest

from infra.config import StackConfig
from infra.nodes import NODE_PATHS
from infra.provisioning import run_playbook
from infra.provisioning.wheelhouse import WheelhouseError, build_node_wheelhouse
from tests.support import cluster as cl
from tests.support.events import role_tasks

from .conftest import TEST_REPOSITORY

REPO = Path(__file__).resolve().parents[2]
# The package re-exports the function `bake`, which hides the module of the same name.
b = importlib.import_module("infra.images.bake")
WHEELHOUSE = Path(os.environ.get("TRAINSTACK_WHEELHOUSE", cl.CACHE / "wheelhouse"))
VENV_PY = f"{NODE_PATHS.venv_dir}/bin/python"
pytestmark = pytest.mark.provisioning


def _remove_test_images() -> None:
    client = docker.from_env()
    for image in client.images.list(name=TEST_REPOSITORY):
        for tag in image.tags:
            if tag.startswith(TEST_REPOSITORY + ":"):
                client.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    """This tree's image (baked here only when no earlier test or `make up` baked it), and
    the same image tagged into the test repository."""
    log = tmp_path_factory.mktemp("bake") / "bake.log"
    try:
        cl.client()  # engine up, base image present
        result = b.bake(cl.BASE_IMAGE, b.DEFAULT_REPOSITORY, WHEELHOUSE, log)
    except (RuntimeError, b.BakeError) as exc:
        pytest.fail(str(exc))
    print(f"bake: {result.to_json()}", file=sys.stderr)
    docker.from_env().images.get(result.tag).tag(TEST_REPOSITORY, result.tag.split(":")[1])
    try:
        yield result, log
    finally:
        if os.environ.get("TRAINSTACK_KEEP_CLUSTER") != "1":
            _remove_test_images()


@pytest.fixture(scope="module")
def node(baked):
    """One bare container from the image, started with its own CMD (no --init)."""
    client = docker.from_env()
    container = client.containers.run(
        baked[0].tag, detach=True, name=f"tsit-{uuid.uuid4().hex[:6]}", labels={cl.LABEL: "img"}
    )
    try:
        yield container
    finally:
        container.remove(force=True)


class Events:
    def __init__(self) -> None:
        self.items: list = []

    def __call__(self, event) -> None:
        self.items.append(event)
        if event.status != "skipped":
            print(event, file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def cluster(baked, tmp_path_factory):
    name = f"tsimg-{uuid.uuid4().hex[:6]}"
    # One control node (ZooKeeper, the Spark master) and one worker, as the program plans them.
    config = StackConfig(control_nodes=1, masters=1, workers=1, monitoring=False)
    # bake() fills the wheelhouse only when it bakes; with the image already there (the
    # newcomer's), the wheelhouse here may hold another tree's training wheel. Provisioning
    # needs this tree's, as the program's wheelhouse step gives it before every run.
    try:
        build_node_wheelhouse(WHEELHOUSE)
    except WheelhouseError as exc:
        pytest.fail(f"cannot build the wheelhouse at {WHEELHOUSE}: {exc}")
    c = cl.create(name, config, image=baked[0].tag, command=None, init=False)
    workdir = tmp_path_factory.mktemp("image-cluster")
    # The program's inventory for nodes from the image: it names the image.
    inventory = c.inventory(node_image=baked[0].tag)
    runs = []

    def run(extravars=None):
        events = Events()
        result = run_playbook(
            inventory,
            "site.yml",
            on_event=events,
            artifacts_dir=workdir / "runner",
            extravars={**c.extravars(WHEELHOUSE), **(extravars or {})},
        )
        print(result.summary(), file=sys.stderr)
        runs.append((result, events.items))
        return result, events.items

    try:
        # The first run forces the install parts, to prove that the image carries exactly
        # what the roles install (each install task must report `ok`).
        run({"trainstack_image_installed": False})
        yield c, run, runs
    finally:
        if os.environ.get("TRAINSTACK_KEEP_CLUSTER") != "1":
            cl.destroy(name)


def test_bake_commits_a_labelled_image_with_supervisord_as_cmd(baked):
    result, log = baked
    assert result.tag == b.image_tag(digest=b.current_digest(cl.BASE_IMAGE))
    image = docker.from_env().images.get(result.tag)
    assert image.id == result.image_id
    assert image.attrs["Config"]["Cmd"] == b.NODE_CMD
    # The builder's wheelhouse bind must not become a VOLUME of the image (every node would
    # then get an anonymous volume that outlives it).
    assert not image.attrs["Config"].get("Volumes"), image.attrs["Config"].get("Volumes")
    labels = image.attrs["Config"]["Labels"]
    assert labels[b.LABEL_IMAGE] == "node"
    assert labels[b.LABEL_DIGEST] == result.tag.split(":")[1]
    assert labels.get(b.LABEL_BUILDER) != "true"
    assert result.size_bytes > 500_000_000
    if result.baked:  # else the newcomer test checked the log of the bake that made it
        assert "Ensure TensorFlow is installed in the virtual environment." in log.read_text()
    leftovers = docker.from_env().containers.list(
        all=True, filters={"label": f"{b.LABEL_BUILDER}=true"}
    )
    assert not [c.name for c in leftovers if c.name.startswith(b.DEFAULT_REPOSITORY)]


def test_second_bake_reuses_the_tag(baked):
    again = b.bake(cl.BASE_IMAGE, b.DEFAULT_REPOSITORY, WHEELHOUSE, baked[1].with_name("x.log"))
    assert not again.baked and again.tag == baked[0].tag and again.image_id == baked[0].image_id


def test_container_runs_supervisord_as_pid1(node):
    def cmdline():
        node.reload()
        return node.exec_run(["cat", "/proc/1/cmdline"]).output.decode()

    assert "supervisord" in cl.wait_for(lambda: "supervisord" in cmdline() and cmdline(), 30)
    out = cl.wait_for(
        lambda: (o := node.exec_run(["supervisorctl", "pid"]).output.decode().strip()) == "1" and o,
        timeout=30,
        what="supervisorctl pid",
    )
    assert out == "1"


def test_image_has_java_17_and_the_venv(node):
    java = node.exec_run(["java", "-version"])
    assert java.exit_code == 0 and 'version "17.' in java.output.decode()
    code = (
        "import importlib.metadata as m, pyspark, tensorflow, trainstack_training;"
        "print(m.version('pyspark'), m.version('tensorflow-cpu'), m.version('tf-keras'))"
    )
    out = node.exec_run([VENV_PY, "-c", code], environment={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.exit_code == 0, out.output.decode()[-2000:]
    assert out.output.decode().split()[-3:] == ["4.0.1", "2.21.0", "2.21.0"]
    # Nothing bake-only left behind: no wheels in the node's wheelhouse (the roles keep them in
    # sets, one folder deep: spark/, tensorflow/, training/), no apt archives. `find` lists every
    # file and folder under both, nested ones too; it exits 0 and names both starting folders
    # only when it could read them, so a listing without a wheel or a .deb is an answer.
    dirs = [NODE_PATHS.node_wheelhouse_dir, "/var/cache/apt/archives"]
    found = node.exec_run(["find", *dirs])
    listing = found.output.decode().splitlines()
    assert found.exit_code == 0 and set(dirs) <= set(listing), found.output.decode()[-2000:]
    left = [p for p in listing if p.endswith((".whl", ".deb"))]
    assert not left, f"bake leftovers in the image: {left}"


def test_provisioning_from_the_image_installs_nothing(cluster):
    c, _run, runs = cluster
    first, events = runs[0]
    assert first.ok, first.summary()
    install = role_tasks("install.yml")
    changed = sorted(
        {(e.host, e.task) for e in events if e.status == "changed" and e.task in install}
    )
    assert not changed, f"install tasks changed on nodes from the image: {changed}"
    ran_ok = {e.task for e in events if e.status == "ok" and e.task in install}
    assert len(ran_ok) > 20, f"the forced run did not run the install parts: {sorted(ran_ok)}"
    print(
        f"first run on the image: {first.duration_s:.0f}s, changed={first.changed()}",
        file=sys.stderr,
    )
    client = docker.from_env()
    for container in c.containers.values():
        out = client.containers.get(container).exec_run(
            ["sh", "-c", "find /opt/trainstack/wheelhouse -type f | wc -l"]
        )
        assert out.output.decode().strip() == "0", f"wheels copied to {container}"


def test_second_run_changes_nothing(cluster):
    _c, run, _runs = cluster
    result, events = run()
    assert result.ok, result.summary()
    assert result.changed() == {"control-1": 0, "worker-1": 0}, result.summary()
    # The default on a node whose image marker matches: the install parts do not run at all.
    install = role_tasks("install.yml")
    ran = sorted({e.task for e in events if e.task in install and e.status != "skipped"})
    assert not ran, f"install tasks ran on nodes from a matching image: {ran}"
    print(f"second run on the image: {result.duration_s:.0f}s", file=sys.stderr)


@pytest.mark.parametrize(
    ("host", "program"),
    [("control-1", "zookeeper"), ("control-1", "spark-master"), ("worker-1", "spark-worker")],
)
def test_daemons_run_under_the_main_supervisord(cluster, host, program):
    c, _run, _runs = cluster
    container = docker.from_env().containers.get(c.containers[host])

    def status():
        out = container.exec_run(["supervisorctl", "status", program]).output.decode()
        return re.search(r"RUNNING\s+pid \d+", out) and out

    assert cl.wait_for(status, timeout=60, what=f"{program} RUNNING")
    # One supervisord, the container's main process.
    pids = container.exec_run(["pgrep", "-f", "bin/supervisord"]).output.decode().split()
    assert pids == ["1"], pids


def test_clean_keeps_an_image_in_use(cluster, baked):
    client = docker.from_env()
    removed, skipped = b._clean(client, TEST_REPOSITORY, keep_digest="other")
    test_tag = f"{TEST_REPOSITORY}:{baked[0].tag.split(':')[1]}"
    assert removed == [] and any(test_tag in s for s in skipped), (removed, skipped)
