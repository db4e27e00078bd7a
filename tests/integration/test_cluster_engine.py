"""`pulumi up` of a small cluster on the real engine, checked through the Docker API."""

from __future__ import annotations

import socket

import pytest

from tests.support.stacks import Stack, engine_objects

pytestmark = pytest.mark.engine

SMALL = {
    "controlNodes": "1",
    "masters": "1",
    "workers": "1",
    "controlCpus": "0.2",
    "workerCpus": "0.2",
    "controlMemory": "512m",
    "workerMemory": "512m",
    "workerSparkMemory": "256m",
    "uiPortBase": "0",
    # Servers only: provisioning and training have their own tests.
    "provision": "false",
    "train": "false",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, engine):
    s = Stack(tmp_path_factory.mktemp("state"))
    s.init(**SMALL)
    s.up()
    yield s
    s.destroy_and_remove()


def test_up_creates_network_volumes_and_containers(stack, engine):
    found = engine_objects(stack.label)
    p = stack.label
    assert found["networks"] == [f"{p}-net"]
    assert found["containers"] == [f"{p}-control-1", f"{p}-worker-1"]
    assert found["volumes"] == sorted(
        [
            f"{p}-data",
            f"{p}-checkpoints",
            f"{p}-models",
            f"{p}-zookeeper-control-1",
            f"{p}-spark-recovery-control-1",
            # The tracking server's stores (trainstack:tracking, on by default).
            f"{p}-mlflow-control-1",
            # The object store's data (trainstack:objectStore, on by default).
            f"{p}-objectstore-control-1",
        ]
    )


def test_containers_run_with_limits_hostname_and_network(stack, engine):
    worker = engine.containers.get(f"{stack.label}-worker-1")
    assert worker.status == "running"
    assert worker.attrs["Config"]["Hostname"] == "worker-1"
    assert worker.attrs["HostConfig"]["NanoCpus"] == int(0.2 * 1e9)
    assert worker.attrs["HostConfig"]["Memory"] == 512 * 1024**2
    assert worker.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    net = worker.attrs["NetworkSettings"]["Networks"][f"{stack.label}-net"]
    assert "worker-1" in net["Aliases"]
    mounts = {m["Destination"]: m["Name"] for m in worker.attrs["Mounts"]}
    assert mounts["/srv/trainstack/data"] == f"{stack.label}-data"


def test_nodes_resolve_each_other_by_hostname(stack, engine):
    worker = engine.containers.get(f"{stack.label}-worker-1")
    code, out = worker.exec_run(["getent", "hosts", "control-1"])
    assert code == 0, out


def test_master_ui_port_is_published_on_loopback_only(stack, engine):
    control = engine.containers.get(f"{stack.label}-control-1")
    bindings = control.attrs["NetworkSettings"]["Ports"]["8080/tcp"]
    assert [b["HostIp"] for b in bindings] == ["127.0.0.1"]
    outputs = stack.outputs()
    assert outputs["sparkUiUrls"]["control-1"] == f"http://127.0.0.1:{bindings[0]['HostPort']}"
    assert outputs["sparkMasterUrl"] == "spark://control-1:7077"
    assert set(outputs["inventory"]["all"]["children"]["spark_worker"]["hosts"]) == {"worker-1"}


def test_second_up_changes_nothing(stack):
    stack.run("preview", "--expect-no-changes")


def test_scaling_workers_adds_and_removes_exactly_one_node(stack, engine):
    before = {c.name: c.id for c in engine.containers.list(all=True)}
    stack.set_config(workers="2")
    stack.up()
    after = {c.name: c.id for c in engine.containers.list(all=True)}
    added = set(after) - set(before)
    assert added == {f"{stack.label}-worker-2"}
    assert all(after[name] == cid for name, cid in before.items() if name.startswith(stack.label))
    stack.set_config(workers="1")
    stack.up()
    final = {c.name: c.id for c in engine.containers.list(all=True)}
    assert f"{stack.label}-worker-2" not in final
    assert all(final[name] == cid for name, cid in before.items() if name.startswith(stack.label))


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("controlNodes", "2", "trainstack:controlNodes: 2 makes an even ZooKeeper ensemble"),
        ("masters", "3", "trainstack:masters: 3 is more than"),
        ("workerMemory", "lots", "trainstack:workerMemory: 'lots' is not a size"),
        ("wrokers", "3", "trainstack:wrokers: unknown key"),
    ],
)
def test_bad_config_fails_preview_before_anything_is_created(
    tmp_path, engine, key, value, fragment
):
    s = Stack(tmp_path / "state")
    s.init(**SMALL)
    s.set_config(**{key: value})
    try:
        proc = s.run("preview", check=False)
        assert proc.returncode != 0
        assert fragment in proc.stdout + proc.stderr
        assert engine_objects(s.label) == {"containers": [], "networks": [], "volumes": []}
    finally:
        s.destroy_and_remove()


def test_taken_port_is_reported(tmp_path, engine):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s = Stack(tmp_path / "state")
        s.init(**{**SMALL, "uiPortBase": str(port)})
        try:
            proc = s.run("up", "--yes", "--skip-preview", check=False)
            assert proc.returncode != 0
            assert f"port 127.0.0.1:{port} on the host is already in use" in proc.stdout
        finally:
            s.destroy_and_remove()


def test_engine_that_does_not_answer_is_reported(tmp_path):
    s = Stack(tmp_path / "state")
    s.init(**SMALL)
    s.env["DOCKER_HOST"] = f"unix://{tmp_path}/no-such-engine.sock"
    try:
        proc = s.run("preview", check=False)
        assert proc.returncode != 0
        assert "the Docker engine does not answer" in proc.stdout
    finally:
        s.env.pop("DOCKER_HOST")
        s.destroy_and_remove()


def test_destroy_removes_everything_but_retained_data(tmp_path, engine):
    s = Stack(tmp_path / "state")
    s.init(**{**SMALL, "retainData": "true"})
    try:
        s.up()
        s.run("destroy", "--yes")
        left = engine_objects(s.label)
        assert left["containers"] == [] and left["networks"] == []
        assert f"{s.label}-data" in left["volumes"]
        assert f"{s.label}-zookeeper-control-1" in left["volumes"]
        # Without retention a destroy leaves nothing at all.
        s.set_config(retainData="false")
        s.up()
        s.run("destroy", "--yes")
        assert engine_objects(s.label) == {"containers": [], "networks": [], "volumes": []}
    finally:
        s.destroy_and_remove()


def test_stack_made_by_the_old_resources_is_named_not_taken_over(tmp_path, engine):
    """Containers of this stack without the managed-by label: a sentence, nothing made."""
    s = Stack(tmp_path / "state")
    s.init(**SMALL)
    old = engine.containers.create(
        "debian:bookworm",
        ["sleep", "infinity"],
        name=f"{s.label}-control-1",
        labels={"org.trainstack.stack": s.label},
    )
    try:
        proc = s.run("preview", check=False)
        assert proc.returncode != 0
        assert "made by an older trainstack" in proc.stdout
        assert "Traceback" not in proc.stdout + proc.stderr
        assert engine_objects(s.label)["networks"] == []
    finally:
        old.remove(force=True)
        s.destroy_and_remove()
