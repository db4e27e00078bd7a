"""Secret rotation on the shared stack, interrupted once: `rotateSecrets` and an `up` that is
stopped with two SIGINTs (Ctrl-C twice) right after the new secret was written and before the
daemons restarted; the next `up` converges, every service has new secrets, every daemon was
restarted, and the old secrets are refused. Changes the stack's secrets.

One rotation serves two checks that each used to pay for their own: the rotation itself, and
failure drill 4a (bench/results/drills.json `4a_two_sigints_during_provisioning`), whose
interrupted provisioning needs a change that restarts daemons, which a rotation is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.outsiders import (
    JAAS_CLIENT,
    leaks,
    node,
    sh,
    spark_client,
    spark_secret,
    spark_znode,
    wait_alive,
    zk_cli,
    zk_listing,
    zookeeper_password,
)
from tests.support.stacks import ROOT, BackgroundUp, processes_naming, wait_until

from .conftest import record_drill

pytestmark = pytest.mark.security

# Prints `stale <program>` for a Spark daemon started before its configuration was last written.
STALE_SPARK = (
    "conf=$(find /etc/trainstack/spark -type f -printf '%T@\\n' | sort -n | tail -n 1); "
    "for prog in spark-master spark-worker; do "
    "p=$(supervisorctl pid $prog 2>/dev/null); case $p in ''|0|*[!0-9]*) continue;; esac; "
    "age=$(ps -o etimes= -p $p | tr -d ' '); "
    "[ $(( $(date +%s) - age + 2 )) -lt ${conf%.*} ] && echo stale $prog; done; true"
)


@dataclass
class Rotation:
    old: dict[str, str]
    new: dict[str, str]
    started: float  # wall clock, when the rotation's first `up` began
    interrupted_out: str  # the stopped `up`'s output
    stopped_s: float  # from the second SIGINT to the `up`'s exit
    servers_before: dict[str, Any]  # container name -> (id, CPU limit) before the rotation
    servers_after_stop: dict[str, Any]  # the same, once the stopped run's processes are gone
    next_up: str  # the converging `up`'s output
    recovery_s: float  # from the second SIGINT to the end of the next `up`


def _servers(engine: Any, selector: str) -> dict[str, Any]:
    return {
        c.name: (c.id, c.attrs["HostConfig"]["NanoCpus"])
        for c in engine.containers.list(filters={"label": selector})
    }


@pytest.fixture(scope="module")
def rotation(platform, engine) -> Iterator[Rotation]:
    stack, outputs = platform.stack, platform.outputs()
    old = {"spark secret": spark_secret(outputs), "zookeeper password": zookeeper_password(outputs)}
    before = _servers(engine, stack.selector)
    started = time.time()
    stack.set_config(rotateSecrets="rotation-1")
    up = BackgroundUp(stack)
    # The new secret is on the nodes, the restart handlers have not run yet.
    up.wait_for(r"changed\s+Ensure spark-defaults.conf", timeout=600)
    interrupted = time.monotonic()
    code, out = up.stop_at_once()
    assert code != 0, out[-3000:]
    stopped_s = time.monotonic() - interrupted
    artifacts = str(ROOT / ".artifacts" / stack.name)
    wait_until("no process of the interrupted run", lambda: not processes_naming(artifacts), 30)
    after = _servers(engine, stack.selector)
    again = stack.up()
    recovery_s = time.monotonic() - interrupted
    new = {"spark secret": spark_secret(outputs), "zookeeper password": zookeeper_password(outputs)}
    yield Rotation(
        old, new, started, out, stopped_s, before, after, again.stdout + again.stderr, recovery_s
    )


@pytest.mark.drills
def test_two_sigints_during_provisioning_stop_the_run_with_pulumi(rotation):
    """Pulumi stops at once and kills its providers; the Ansible run stops with them (no
    process left, the nodes' CPU limits given back) and the servers are the same."""
    assert rotation.servers_after_stop == rotation.servers_before


@pytest.mark.drills
def test_the_next_up_converges_with_no_daemon_on_the_old_configuration(platform, rotation):
    """The next `up` re-runs provisioning, which restarts the daemons still running the old
    secret; a preview after it has nothing to do."""
    assert "Traceback" not in rotation.next_up
    outputs = platform.outputs()
    wait_alive(outputs)
    for n in outputs["nodes"]:
        _, stale = sh(n["container"], STALE_SPARK)
        assert "stale" not in stale, f"{n['name']} runs Spark with an old configuration: {stale}"
    platform.stack.run("preview", "--expect-no-changes")
    record_drill(
        "4a_two_sigints_during_provisioning",
        outcome="Pulumi stopped at once; the run was stopped with it (no Ansible process left, "
        "CPU limits given back); the next `up` re-ran provisioning, which restarted the "
        "daemons still on the old secret; no hand edit",
        stopped_after_s=round(rotation.stopped_s, 1),
        pending_operations_mentioned="pending" in rotation.next_up,
        recovery_s=round(rotation.recovery_s, 1),
        recovery_is="from the second SIGINT to the end of the next `up`",
        lost="nothing",
    )


def test_rotation_reaches_every_service(platform, rotation):
    stack, outputs = platform.stack, platform.outputs()
    old, new = rotation.old, rotation.new
    assert all(new[k] != old[k] for k in old)
    # Every node has the new secret, and every daemon started after the rotation began.
    for n in outputs["nodes"]:
        _, conf = sh(n["container"], "cat /etc/trainstack/spark/spark-defaults.conf")
        assert new["spark secret"] in conf, n["name"]
        _, status = sh(n["container"], "supervisorctl status")
        for line in status.splitlines():
            if line.split()[0] in ("zookeeper", "spark-master", "spark-worker"):
                _, since = sh(
                    n["container"],
                    f"ps -o lstart= -p $(supervisorctl pid {line.split()[0]}) | date -f - +%s",
                )
                assert int(since.strip()) >= int(rotation.started) - 1, (n["name"], line)
    # The cluster works with the new secrets: a master is ALIVE (it logged in to ZooKeeper
    # with the new password) with the worker back (same secret), a client with the new secret
    # runs a job, and the old secrets are refused.
    wait_alive(outputs)
    with ThreadPoolExecutor(2) as pool:
        with_new = pool.submit(spark_client, outputs, new["spark secret"], True)
        with_old = pool.submit(spark_client, outputs, old["spark secret"], True)
        log_new, log_old = with_new.result()[1], with_old.result()[1]
    assert "REGISTERED" in log_new, log_new[-3000:]
    assert "REGISTERED" not in log_old, log_old[-3000:]
    _, log = sh(
        node(outputs, "control-1")["container"],
        zk_cli(outputs, f"ls {spark_znode(outputs)}", jaas=JAAS_CLIENT),
        user="trainstack",
    )
    assert "leader_election" in zk_listing(log), log[-2000:]
    assert leaks(stack, outputs, {**new, **{f"old {k}": v for k, v in old.items()}}) == []
