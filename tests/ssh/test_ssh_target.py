"""The ssh target end to end, on real sshd servers (tests/support/sshd.py).

Four Debian containers running `openssh-server` stand in for the operator's machines: a
non-root `deploy` user with sudo, a key pair made for this module, host keys made when each
container starts. They share only /srv/trainstack (the operator's NFS mount in a real
deployment). One stack goes through the life cycle; the tests run in order on it. Its first
`up` runs in the background, so that a TensorFlow worker can be killed in the middle of the
run it launches.

One server (`ctl-1`: ZooKeeper, a master, monitoring, tracking) is bare Debian: the first `up`
installs it over SSH with site.yml (sudo, the wheelhouse's rsync over the inventory's SSH
options, host keys, facts, every install task of its roles). The other three start from this
tree's node image with the same sshd added (tests/support/sshd.py): their install tasks find
the work done, as on servers an earlier `up` installed, so the run pays one full install, not
four. The workers' install from bare Debian (TensorFlow, the training package) is the bake's
(tests/newcomer, tests/images), with the same roles.

Its own stack, not the suite's shared one (tests/platform): it is another target (`ssh`), with
servers that are not containers of the docker target, an install over SSH, and a transport of
its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trainstack_training.warm import STATE_DIR_PREFIX

from infra.images import bake
from infra.nodes import NODE_PATHS, SHARED_ROOT
from tests.support.events import role_tasks, streamed_events
from tests.support.sshd import SshServers, make_key
from tests.support.stacks import (
    ROOT,
    TENSORFLOW_PIDS,
    BackgroundUp,
    Stack,
    assert_host_checks_passed,
    run_host_checks,
    wait_until,
)

pytestmark = pytest.mark.ssh

ROLES = {
    "ctl-1": ["zookeeper", "spark_master", "monitoring"],
    "ctl-2": ["spark_master"],
    "wrk-1": ["spark_worker", "tensorflow"],
    "wrk-2": ["spark_worker", "tensorflow"],
}
CONFIG = {
    "target": "ssh",
    "trainEpochs": "8",
    # Fixed, so removing a server does not launch a new run.
    "trainWorkers": "2",
    # The warm runner that the first `up`'s job starts serves the submitted job however slowly
    # the checks between them run (docs/jobs.md#the-warm-runner).
    "runnerKeepAlive": "30m",
}
# Installed from bare Debian over SSH; the others start from the node image.
BARE = ("ctl-1",)
# What trainstack puts on a server, and what its teardown must take away again.
INSTALLED = (NODE_PATHS.install_dir, NODE_PATHS.conf_dir, NODE_PATHS.home_dir, NODE_PATHS.log_dir)
MODELS = NODE_PATHS.models_dir
# The job's test-only hold hook (docs/training.md#test-only-hooks): the first run waits after
# its first epoch while this file exists on the shared mount, so a worker is killed mid-run
# without racing the job.
HOLD_ENV = "TRAINSTACK_TEST_HOLD_FILE"
HOLD_FILE = f"{SHARED_ROOT}/.test-hold"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, engine):
    """The servers and the stack, its first `up` running in the background."""
    work = tmp_path_factory.mktemp("ssh")
    servers = SshServers("tsssh", make_key(work / "key"), engine)
    servers.remove()  # what an interrupted earlier run left
    stack: Stack | None = None
    first: BackgroundUp | None = None
    try:
        servers.start(list(BARE))
        # This tree's node image: the newcomer test of stage 1 baked it; run alone, baked here.
        node_image = bake(progress=None).tag
        servers.start([n for n in ROLES if n not in BARE], node_image=node_image)
        servers.wait_ready(list(ROLES))
        stack = Stack(work / "state", prefix="tsssh")
        stack.env[HOLD_ENV] = HOLD_FILE
        stack.init(**CONFIG)
        stack.run("config", "set", "trainstack:servers", json.dumps(servers.server_records(ROLES)))
        code, out = on(servers, "ctl-2", f"touch {HOLD_FILE}")
        assert code == 0, out
        first = BackgroundUp(stack)
        yield stack, servers, first
    finally:
        if first is not None and first.proc.poll() is None:
            first.proc.kill()
            first.proc.wait()
        if stack is not None:
            stack.destroy_and_remove()
        servers.remove()


def release(servers: SshServers) -> None:
    code, out = on(servers, "ctl-2", f"rm -f {HOLD_FILE}")
    assert code == 0, out


@pytest.fixture(scope="module")
def settled(cluster):
    """The stack after its first `up` has finished: (stack, servers, that up's output)."""
    stack, servers, first = cluster
    release(servers)  # whatever the test before did
    code, out = first.finish()
    assert code == 0, out[-4000:]
    return stack, servers, out


def on(servers: SshServers, name: str, command: str, user: str = "") -> tuple[int, str]:
    container = servers.client.containers.get(f"{servers.prefix}-{name}")
    code, out = container.exec_run(["sh", "-c", command], user=user)
    return code, out.decode(errors="replace")


def epoch_rows(servers: SshServers, run_dir: str) -> list[dict]:
    """The run's epochs.jsonl, read on a server that runs no TensorFlow worker."""
    code, out = on(servers, "ctl-2", f"cat {run_dir}/epochs.jsonl 2>/dev/null")
    return [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")] if code == 0 else []


def tensorflow_pids(servers: SshServers) -> list[tuple[str, int]]:
    """(server, pid) of every TensorFlow worker (TENSORFLOW_PIDS), looked up as its user."""
    found = []
    for name in ("wrk-1", "wrk-2"):
        _, out = on(servers, name, TENSORFLOW_PIDS, user="trainstack")
        found += [(name, int(pid)) for pid in out.split()]
    return found


def test_a_killed_tensorflow_worker_resumes_from_the_shared_backup(cluster):
    """The backup lives on the shared mount: the retried barrier stage resumes from it, not
    from the start."""
    stack, servers, first = cluster
    run_dir = first.run_dir(MODELS)
    rows = wait_until("the first epoch", lambda: epoch_rows(servers, run_dir), timeout=900)
    pids = wait_until("a TensorFlow worker process", lambda: tensorflow_pids(servers), 60)
    name, pid = pids[0]
    done_before = max(len(rows), len(epoch_rows(servers, run_dir)))
    assert done_before == 1, rows  # held after its first epoch
    code, out = on(servers, name, f"kill -KILL {pid}", user="trainstack")
    assert code == 0, out
    release(servers)  # the retried attempt goes on to the end
    code, out = first.finish()
    assert code == 0, out[-4000:]
    result = stack.outputs()["training"]
    assert result["ok"] and result["attempts"] == 2, result
    metrics = json.loads((Path(result["host_dir"]) / "metrics.json").read_text())
    resumed = metrics["epoch_attempt"].index(2) + 1
    assert resumed > 1 and resumed >= done_before, (metrics["epoch_attempt"], done_before)


def test_up_from_nothing_ends_with_a_trained_model(settled):
    stack, _, first = settled
    outputs = stack.outputs()
    result = outputs["training"]
    assert result["ok"] is True
    assert result["final_val_accuracy"] >= 0.90
    assert result["workers"] == 2
    assert result["submitted_on"] in ("wrk-1", "wrk-2")
    for name in ("model.keras", "metrics.json"):
        assert (Path(result["host_dir"]) / name).stat().st_size > 0
    for rank in range(result["workers"]):  # each TensorFlow worker's own output, copied back
        log = (Path(result["host_dir"]) / f"rank-{rank}.log").read_text()
        assert log.startswith(f"--- rank {rank}, attempt 1, on "), log[:300]
    assert "] changed" in first
    assert "launching on" in first


def test_the_bare_server_got_the_full_install_and_the_others_found_it_done(settled):
    """The first `up` streamed each server's tasks: the bare server's install tasks changed
    it; on the servers from the node image the same install tasks ran and changed nothing
    (each `ok`, or skipped where its condition found the work done)."""
    _, _, first = settled
    events = streamed_events(first)
    install = role_tasks("install.yml")
    ran = {(e.host, e.task): e.status for e in events if e.task in install}
    changed = {host for (host, _), status in ran.items() if status == "changed"}
    assert changed == set(BARE), sorted(changed)
    for name in ROLES:
        tasks = [task for host, task in ran if host == name]
        assert tasks, f"no install task ran on {name}"
        if name not in BARE:  # ok, or skipped where the work's condition is already met
            statuses = {ran[(name, t)] for t in tasks}
            assert "ok" in statuses and statuses <= {"ok", "skipped"}, (name, statuses)


def test_every_server_records_its_facts(settled):
    stack, servers, _ = settled
    nodes = {n["name"]: n for n in stack.outputs()["nodes"]}
    assert set(nodes) == set(ROLES)
    for name, node in nodes.items():
        assert node["address"] == servers.address(name)
        assert node["facts"]["os_id"] == "debian" and node["facts"]["os_version"] == "12"
        assert node["facts"]["cores"] >= 1 and node["facts"]["memory_bytes"] > 2**30


def test_known_hosts_holds_the_keys_the_servers_really_have(settled):
    stack, servers, _ = settled
    known = (ROOT / ".artifacts" / stack.name / "ssh" / "known_hosts").read_text().splitlines()
    assert len(known) >= len(ROLES)
    for name in ROLES:
        assert servers.host_key_line(name) in known
    mode = (ROOT / ".artifacts" / stack.name / "ssh" / "known_hosts").stat().st_mode
    assert mode & 0o077 == 0


def test_the_services_run_as_trainstack_not_as_the_login_user(settled):
    _, servers, _ = settled
    code, out = on(servers, "ctl-1", "ps -o user= -C java")
    assert code == 0 and set(out.split()) == {"trainstack"}, out


def test_hosts_pass_testinfra_over_ssh_against_the_stack_inventory(settled, tmp_path):
    stack, _, _ = settled
    proc = run_host_checks(stack, stack.outputs()["inventory"], tmp_path)
    assert_host_checks_passed(proc)
    # testinfra went through ssh (the inventory's connection), not through the engine.
    assert stack.outputs()["inventory"]["all"]["vars"]["ansible_connection"] == "ssh"


def probed_facts(stack: Stack) -> dict[str, dict]:
    """The facts each server's ServerProbe holds in the state, by server name."""
    state = json.loads(stack.run("stack", "export").stdout)
    return {
        r["urn"].rsplit("::probe-", 1)[1]: r["outputs"]["facts"]
        for r in state["deployment"]["resources"]
        if r["type"].endswith("ssh:ServerProbe")
    }


def test_refresh_reads_the_facts_again_and_names_a_server_it_cannot_reach(settled):
    stack, servers, _ = settled
    _, line = on(servers, "ctl-2", "grep '^PRETTY_NAME=' /etc/os-release")
    original = line.strip().split("=", 1)[1].strip('"')
    edit = "sed -i --follow-symlinks 's|^PRETTY_NAME=.*|PRETTY_NAME=\"{}\"|' /etc/os-release"
    wrk_2 = servers.client.containers.get(f"{servers.prefix}-wrk-2")
    try:
        on(servers, "ctl-2", edit.format("Debian GNU/Linux 12 (refreshed)"))
        stack.run("refresh", "--yes", "--skip-preview")
        assert probed_facts(stack)["ctl-2"]["os"] == "Debian GNU/Linux 12 (refreshed)"
        # A frozen server accepts the TCP connection but never answers: the probe's
        # ConnectTimeout ends the wait.
        wrk_2.pause()
        try:
            failed = stack.run("refresh", "--yes", "--skip-preview", check=False)
        finally:
            wrk_2.unpause()
        text = failed.stdout + failed.stderr
        assert failed.returncode != 0, text[-3000:]
        said = f"trainstack: server wrk-2 (deploy@{servers.address('wrk-2')}:22): cannot connect"
        assert said in text, text[-3000:]
        assert "Traceback" not in text
    finally:
        on(servers, "ctl-2", edit.format(original))
    stack.run("refresh", "--yes", "--skip-preview")
    assert probed_facts(stack)["ctl-2"]["os"] == original
    # Refreshed facts are not a change to apply.
    stack.run("preview", "--expect-no-changes")


def test_second_up_changes_nothing_and_launches_no_training(settled):
    stack, _, _ = settled
    stack.run("preview", "--expect-no-changes")
    second = stack.up()
    assert "launching on" not in second.stdout


def test_a_submitted_job_runs_over_ssh_and_logs_follow_it(settled):
    """`trainstack submit`, `logs -f` and `status` on the ssh target (docs/jobs.md): the CLI
    reaches the servers over SSH with the stack's key and recorded host keys, as the program
    does, and opens no port. A submitted job changes nothing in the stack."""
    stack, _, _ = settled

    def trainstack(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "infra.jobs.cli", "-s", stack.name, *args],
            cwd=ROOT,
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    submitted = trainstack("submit", str(ROOT / "examples" / "digits"), "--epochs", "2")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip()
    assert job.startswith("job-"), submitted.stdout
    logs = trainstack("logs", "-f", job)
    assert logs.returncode == 0, logs.stdout[-3000:] + logs.stderr
    for epoch in (1, 2):
        assert f"[trainstack] epoch {epoch}/2 " in logs.stdout, logs.stdout[-3000:]
    assert "[trainstack] job succeeded" in logs.stdout, logs.stdout[-3000:]
    record = json.loads(trainstack("status", job, "--json").stdout)
    assert record["state"] == "succeeded" and record["result"]["epochs"] == 2, record
    # It ran in the warm runner that the first `up`'s job started on the same server.
    assert record["result"]["spark_application"] == "warm-runner", record["result"]
    stack.run("preview", "--expect-no-changes")


def test_an_unreachable_server_fails_the_up_by_name_and_touches_nothing(settled):
    stack, servers, _ = settled
    records = servers.server_records(ROLES)
    records.append({**records[-1], "name": "wrk-9", "port": 2})
    stack.run("config", "set", "trainstack:servers", json.dumps(records))
    failed = stack.run("up", "--yes", "--skip-preview", check=False)
    assert failed.returncode != 0
    text = failed.stdout + failed.stderr
    assert f"server wrk-9 (deploy@{records[-1]['address']}:2): cannot connect" in text
    # The engine cancels the program with registrations in flight: no KeyboardInterrupt or
    # "context canceled" traceback from the program (infra.errors.quiet_cancellation, issue 28).
    assert "Traceback" not in text, text[-4000:]
    assert "KeyboardInterrupt" not in text and "context canceled" not in text, text[-4000:]
    stack.run("config", "set", "trainstack:servers", json.dumps(servers.server_records(ROLES)))
    stack.run("preview", "--expect-no-changes")


def test_removing_a_worker_from_the_list_tears_it_down(settled):
    stack, servers, _ = settled
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


def test_destroy_removes_trainstack_from_every_server(settled):
    stack, servers, _ = settled
    destroyed = stack.run("destroy", "--yes")
    said = r"server (\S+) \(deploy@[^)]*\): trainstack removed"
    removed = set(re.findall(said, destroyed.stdout))
    assert removed == set(ROLES) - {"wrk-2"}  # wrk-2 went with its removal from the list
    for name in ROLES:
        for path in INSTALLED:
            code, _ = on(servers, name, f"test -e {path}")
            assert code != 0, f"{path} is still on {name}"
        # Nor the warm runner's state (its gateway secret) in the node's /tmp.
        code, out = on(servers, name, f"ls -d {STATE_DIR_PREFIX}*")
        assert code != 0, f"{out} is still on {name}"
