"""The ssh target end to end, on real sshd servers (tests/sshd_servers.py).

Four Debian containers running `openssh-server` stand in for the operator's machines: a
non-root `deploy` user with sudo, a key pair made for this module, host keys made when each
container starts. They share only /srv/trainstack (the operator's NFS mount in a real
deployment). One stack goes through the life cycle; the tests run in order on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.pulumi_cli import ROOT, Stack, run_host_checks
from tests.sshd_servers import SshServers, make_key

pytestmark = pytest.mark.ssh

ROLES = {
    "ctl-1": ["zookeeper", "spark_master", "monitoring"],
    "ctl-2": ["spark_master"],
    "wrk-1": ["spark_worker", "tensorflow"],
    "wrk-2": ["spark_worker", "tensorflow"],
}
CONFIG = {
    "target": "ssh",
    "trainEpochs": "6",
    # Fixed, so removing a server does not launch a new run.
    "trainWorkers": "2",
}
# What trainstack puts on a server, and what its teardown must take away again.
INSTALLED = ("/opt/trainstack", "/etc/trainstack", "/var/lib/trainstack", "/var/log/trainstack")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, engine):
    work = tmp_path_factory.mktemp("ssh")
    servers = SshServers("tsssh", make_key(work / "key"), engine)
    servers.remove()  # what an interrupted earlier run left
    servers.start(list(ROLES))
    servers.wait_ready(list(ROLES))
    stack = Stack(work / "state", prefix="tsssh")
    stack.init(**CONFIG)
    stack.run("config", "set", "trainstack:servers", json.dumps(servers.server_records(ROLES)))
    first = stack.up()
    yield stack, servers, first
    stack.destroy_and_remove()
    servers.remove()


def on(servers: SshServers, name: str, command: str) -> tuple[int, str]:
    container = servers.client.containers.get(f"{servers.prefix}-{name}")
    code, out = container.exec_run(["sh", "-c", command])
    return code, out.decode(errors="replace")


def test_up_from_nothing_ends_with_a_trained_model(cluster):
    stack, _, first = cluster
    outputs = stack.outputs()
    result = outputs["training"]
    assert result["ok"] is True
    assert result["final_val_accuracy"] >= 0.90
    assert result["workers"] == 2
    assert result["submitted_on"] in ("wrk-1", "wrk-2")
    for name in ("model.keras", "metrics.json"):
        assert (Path(result["host_dir"]) / name).stat().st_size > 0
    assert "] changed" in first.stdout
    assert "launching on" in first.stdout


def test_every_server_records_its_facts(cluster):
    stack, servers, _ = cluster
    nodes = {n["name"]: n for n in stack.outputs()["nodes"]}
    assert set(nodes) == set(ROLES)
    for name, node in nodes.items():
        assert node["address"] == servers.address(name)
        assert node["facts"]["os_id"] == "debian" and node["facts"]["os_version"] == "12"
        assert node["facts"]["cores"] >= 1 and node["facts"]["memory_bytes"] > 2**30


def test_known_hosts_holds_the_keys_the_servers_really_have(cluster):
    stack, servers, _ = cluster
    known = (ROOT / ".artifacts" / stack.name / "ssh" / "known_hosts").read_text().splitlines()
    assert len(known) >= len(ROLES)
    for name in ROLES:
        assert servers.host_key_line(name) in known
    mode = (ROOT / ".artifacts" / stack.name / "ssh" / "known_hosts").stat().st_mode
    assert mode & 0o077 == 0


def test_the_services_run_as_trainstack_not_as_the_login_user(cluster):
    _, servers, _ = cluster
    code, out = on(servers, "ctl-1", "ps -o user= -C java")
    assert code == 0 and set(out.split()) == {"trainstack"}, out


def test_hosts_pass_testinfra_over_ssh_against_the_stack_inventory(cluster, tmp_path):
    stack, _, _ = cluster
    proc = run_host_checks(stack, stack.outputs()["inventory"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
    # testinfra went through ssh (the inventory's connection), not through the engine.
    assert stack.outputs()["inventory"]["all"]["vars"]["ansible_connection"] == "ssh"


def test_second_up_changes_nothing_and_launches_no_training(cluster):
    stack, _, _ = cluster
    stack.run("preview", "--expect-no-changes")
    second = stack.up()
    assert "launching on" not in second.stdout


def test_an_unreachable_server_fails_the_up_by_name_and_touches_nothing(cluster):
    stack, servers, _ = cluster
    records = servers.server_records(ROLES)
    records.append({**records[-1], "name": "wrk-9", "port": 2})
    stack.run("config", "set", "trainstack:servers", json.dumps(records))
    failed = stack.run("up", "--yes", "--skip-preview", check=False)
    assert failed.returncode != 0
    text = failed.stdout + failed.stderr
    assert f"server wrk-9 (deploy@{records[-1]['address']}:2): cannot connect" in text
    assert "Traceback" not in text
    stack.run("config", "set", "trainstack:servers", json.dumps(servers.server_records(ROLES)))
    stack.run("preview", "--expect-no-changes")


def test_removing_a_worker_from_the_list_tears_it_down(cluster):
    stack, servers, _ = cluster
    run_before = stack.outputs()["training"]["run_id"]
    kept = {name: roles for name, roles in ROLES.items() if name != "wrk-2"}
    stack.run("config", "set", "trainstack:servers", json.dumps(servers.server_records(kept)))
    removed = stack.up()
    assert "server wrk-2 (deploy@" in removed.stdout and "trainstack removed" in removed.stdout
    assert "launching on" not in removed.stdout
    assert stack.outputs()["training"]["run_id"] == run_before
    for path in INSTALLED:
        code, _ = on(servers, "wrk-2", f"test -e {path}")
        assert code != 0, f"{path} is still on wrk-2"
    code, out = on(servers, "wrk-2", "pgrep -u trainstack || id trainstack")
    assert code != 0, out
    # The rest of the machine is as it was: its login user, sshd, and the shared storage
    # that the other servers still use.
    assert on(servers, "wrk-2", "id deploy")[0] == 0
    assert on(servers, "wrk-2", "pgrep -x sshd")[0] == 0
    assert on(servers, "wrk-1", "test -d /opt/trainstack/venv")[0] == 0
    result_dir = stack.outputs()["training"]["cluster_run_dir"]
    assert on(servers, "wrk-2", f"test -f {result_dir}/model.keras")[0] == 0


def test_destroy_removes_trainstack_from_every_server(cluster):
    stack, servers, _ = cluster
    destroyed = stack.run("destroy", "--yes")
    said = r"server (\S+) \(deploy@[^)]*\): trainstack removed"
    removed = set(re.findall(said, destroyed.stdout))
    assert removed == set(ROLES) - {"wrk-2"}  # wrk-2 went with its removal from the list
    for name in ROLES:
        for path in INSTALLED:
            code, _ = on(servers, name, f"test -e {path}")
            assert code != 0, f"{path} is still on {name}"
