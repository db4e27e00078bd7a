"""Secret rotation on the shared stack: `rotateSecrets` and one `up` give every service new
secrets, restart every daemon, and the old secrets are refused. Changes the stack's secrets."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.outsiders import (
    JAAS_CLIENT,
    leaks,
    node,
    refused_spark_client,
    sh,
    spark_client,
    spark_refused,
    spark_secret,
    spark_znode,
    wait_alive,
    zk_cli,
    zk_listing,
    zookeeper_password,
)
from tests.support.stacks import wait_until

pytestmark = pytest.mark.security


def election_nodes(outputs: dict) -> list[str]:
    """The children of the Spark masters' leader election in ZooKeeper (one per master whose
    ZooKeeper client is logged in)."""
    _, log = sh(
        node(outputs, "control-1")["container"],
        zk_cli(outputs, f"ls {spark_znode(outputs)}/leader_election", jaas=JAAS_CLIENT),
        user="trainstack",
    )
    listing = zk_listing(log).strip("[]")
    return [child.strip() for child in listing.split(",") if child.strip()]


# The supervisor program of each daemon whose role a node has (roles/*/defaults: *_program).
DAEMONS = {"zookeeper": "zookeeper", "spark_master": "spark-master", "spark_worker": "spark-worker"}


def test_rotation_reaches_every_service(platform):
    stack, outputs = platform.stack, platform.outputs()
    old = {"spark secret": spark_secret(outputs), "zookeeper password": zookeeper_password(outputs)}
    started = time.time()
    stack.set_config(rotateSecrets="rotation-1")
    stack.up()
    new = {"spark secret": spark_secret(outputs), "zookeeper password": zookeeper_password(outputs)}
    assert all(new[k] != old[k] for k in old)
    # Every node has the new secret, and every daemon started after the rotation began.
    for n in outputs["nodes"]:
        _, conf = sh(n["container"], "cat /etc/trainstack/spark/spark-defaults.conf")
        assert new["spark secret"] in conf, n["name"]
        _, status = sh(n["container"], "supervisorctl status")
        listed = {line.split()[0]: line for line in status.splitlines() if line.split()}
        expected = [program for role, program in DAEMONS.items() if role in n["roles"]]
        # The listing has the node's daemons before they are judged.
        assert expected and set(expected) <= set(listed), (n["name"], expected, status)
        for program in expected:
            _, since = sh(
                n["container"],
                f"ps -o lstart= -p $(supervisorctl pid {program}) | date -f - +%s",
            )
            assert int(since.strip()) >= int(started) - 1, (n["name"], listed[program])
    # The cluster works with the new secrets: a master is ALIVE (it logged in to ZooKeeper
    # with the new password) with the worker back (same secret), a client with the new secret
    # runs a job, and the old secrets are refused.
    wait_alive(outputs)
    with ThreadPoolExecutor(2) as pool:
        with_new = pool.submit(spark_client, outputs, new["spark secret"], True)
        with_old = pool.submit(refused_spark_client, outputs, old["spark secret"], True)
        log_new, log_old = with_new.result()[1], with_old.result()
    assert "REGISTERED" in log_new, log_new[-3000:]
    assert spark_refused(outputs, log_old), log_old[-3000:]
    assert "REGISTERED" not in log_old, log_old[-3000:]
    _, log = sh(
        node(outputs, "control-1")["container"],
        zk_cli(outputs, f"ls {spark_znode(outputs)}", jaas=JAAS_CLIENT),
        user="trainstack",
    )
    assert "leader_election" in zk_listing(log), log[-2000:]
    # Every master, not only the ALIVE one, is logged in with the new password: each holds a
    # node of the leader election, so a standby can take over (a master whose SASL login
    # failed keeps running as STANDBY with none; docs/troubleshooting.md).
    masters = [n for n in outputs["nodes"] if "spark_master" in n["roles"]]
    assert len(masters) >= 2, masters

    def every_master_elects() -> list[str] | None:
        found = election_nodes(outputs)
        return found if len(found) == len(masters) else None

    latches = wait_until(
        f"a leader-election node for each of the {len(masters)} masters",
        every_master_elects,
        timeout=60,
        every=5,
    )
    assert len(latches) == len(masters), latches
    assert leaks(stack, outputs, {**new, **{f"old {k}": v for k, v in old.items()}}) == []
