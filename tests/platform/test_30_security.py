"""Security for shared networks on the shared stack, each check as an outsider (docs/security.md),
read only: Spark refuses clients without the secret or without encryption, ZooKeeper refuses
outsiders' writes and serves its quorum with SASL, the warm runner takes work only from its
node's job user, and no secret is anywhere in plain text.
Changes nothing (rotation is test_50_rotation).
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from trainstack_training.warm import STATE_DIR_PREFIX

from tests.support.outsiders import (
    JAAS_CLIENT,
    leaks,
    node,
    outsider,
    refused_spark_client,
    sh,
    spark_client,
    spark_refused,
    spark_secret,
    spark_znode,
    zk_cli,
    zk_listing,
    zookeeper_password,
)

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def secured(platform):
    return platform.stack, platform.outputs()


def test_the_stack_trained_with_encryption_on(secured):
    _, outputs = secured
    assert outputs["training"]["ok"], outputs["training"]
    conf = sh(
        node(outputs, "worker-1")["container"], "cat /etc/trainstack/spark/spark-defaults.conf"
    )
    assert re.search(r"^spark\.network\.crypto\.enabled\s+true$", conf[1], re.M)


def test_the_warm_runner_takes_work_only_from_its_nodes_job_user(secured):
    """The warm runner (docs/jobs.md) started by the first `up`'s job: its Py4J gateway
    listens on the node's loopback only, and its secret is readable by the job user alone."""
    _, outputs = secured
    submitter = outputs["jobNodes"][0]
    container, name = submitter["container"], submitter["name"]
    code, text = sh(container, f"cat {STATE_DIR_PREFIX}*/runner.json", user="trainstack")
    assert code == 0, f"no warm runner on {name}: {text}"
    port = int(json.loads(text)["port"])
    # Every listening socket on that port is bound to 127.0.0.1 (/proc/net/tcp, LISTEN = 0A).
    code, table = sh(container, "cat /proc/net/tcp /proc/net/tcp6")
    listening = [
        line.split()[1]
        for line in table.splitlines()[1:]
        if len(line.split()) > 3
        and line.split()[3] == "0A"
        and line.split()[1].endswith(f":{port:04X}")
    ]
    assert listening and all(a.startswith("0100007F:") for a in listening), listening
    # Another user of the node cannot read the secret, nor list the runner's directory.
    code, out = sh(container, f"cat {STATE_DIR_PREFIX}*/runner.json", user="nobody")
    assert code != 0, out
    code, out = sh(container, f"ls {STATE_DIR_PREFIX}*/", user="nobody")
    assert code != 0 and "Permission denied" in out, out
    # An outsider on the cluster network reaches the node (the control: a port it serves to
    # the cluster, its Spark worker UI on a worker, ZooKeeper's client port on the drivers'
    # node) but not the gateway.
    roles = next(n["roles"] for n in outputs["nodes"] if n["name"] == name)
    served = 8081 if "spark_worker" in roles else 2181
    probe = "timeout 5 bash -c 'exec 3<>/dev/tcp/{}/{}' && echo open || echo closed"
    code, out = outsider(outputs, f"{probe.format(name, served)}; {probe.format(name, port)}")
    assert [w for w in out.split() if w in ("open", "closed")] == ["open", "closed"], out


@pytest.fixture(scope="module")
def clients(secured):
    """Four Spark applications from an outsider container, at the same time: no secret (Spark's
    defaults: no authentication, no encryption), a wrong secret, the right secret without
    encryption, each stopped as soon as it logged its refusal, and the right secret with
    encryption (the control, which runs a job)."""
    _, outputs = secured
    # The warm runner holds every core of the cluster while it is up (docs/jobs.md): the
    # control application would wait for one. Stop it; the next job starts it again.
    submitter = outputs["jobNodes"][0]["container"]
    sh(submitter, "pkill -TERM -f '[t]rainstack_training[.]warm'", user="trainstack")
    stopped = time.monotonic()
    while sh(submitter, "pgrep -f '[t]rainstack_training[.]warm'")[0] == 0:
        assert time.monotonic() - stopped < 60, "the warm runner did not stop on SIGTERM"
        time.sleep(1)
    secret = spark_secret(outputs)
    refused = {
        "no secret": (None, False),
        "wrong secret": ("not-the-cluster-secret-0123456789", True),
        "no encryption": (secret, False),
    }
    with ThreadPoolExecutor(len(refused) + 1) as pool:
        futures = {k: pool.submit(refused_spark_client, outputs, *v) for k, v in refused.items()}
        control = pool.submit(spark_client, outputs, secret, True)
        return {k: f.result() for k, f in futures.items()} | {"control": control.result()[1]}


def test_outsider_without_secret_cannot_register(secured, clients):
    _, outputs = secured
    for case in ("no secret", "wrong secret"):
        assert spark_refused(outputs, clients[case]), (case, clients[case][-3000:])
        assert "REGISTERED" not in clients[case], (case, clients[case][-3000:])
    assert "REGISTERED" in clients["control"] and " 45" in clients["control"], clients["control"]


def test_client_without_encryption_is_refused(secured, clients):
    """With the right secret but no RPC encryption the cluster refuses the client (Spark's
    AES auth handler does not know the plain SASL challenge: no fallback); the same client
    with encryption registers and runs a job, so the refusal is about encryption.

    The server answers the plain SASL challenge with an error and closes the channel; which of
    the two the client sees first is timing (a CI run saw only the closed channel), so either
    counts, as long as it is the plain SASL bootstrap that failed."""
    log = clients["no encryption"]
    assert "REGISTERED" not in log, log[-3000:]
    assert spark_refused(secured[1], log), log[-3000:]
    assert "Unknown challenge message" in log or (
        "Exception while bootstrapping client" in log and "SaslClientBootstrap" in log
    ), log[-3000:]
    assert "REGISTERED" in clients["control"], clients["control"][-3000:]


def test_outsider_cannot_write_spark_znodes(secured):
    _, outputs = secured
    znode = spark_znode(outputs)
    # No credentials; then SASL with a wrong password.
    wrong = (
        "printf 'Client {\\n org.apache.zookeeper.server.auth.DigestLoginModule required\\n"
        ' username="spark" password="wrong";\\n};\\n\' > /tmp/wrong.jaas; '
    )
    commands = (
        zk_cli(outputs, f"create {znode}/outsider x"),
        wrong + zk_cli(outputs, f"create {znode}/outsider x", jaas="/tmp/wrong.jaas"),
        zk_cli(outputs, f"delete {znode}/leader_election"),
    )
    # The three outsiders at the same time (each is a container of its own).
    with ThreadPoolExecutor(len(commands)) as pool:
        logs = list(pool.map(lambda command: outsider(outputs, command)[1], commands))
    for log in logs:
        assert "Created" not in log, log[-2000:]
        assert "authenticate" in log or "AuthFailed" in log, log[-2000:]
    # The cluster's own login reads Spark's path, and the outsider's node is not there.
    _, log = sh(
        node(outputs, "control-1")["container"],
        zk_cli(outputs, f"ls {znode}", jaas=JAAS_CLIENT),
        user="trainstack",
    )
    listing = zk_listing(log)
    assert "leader_election" in listing and "outsider" not in listing, log[-2000:]


def test_zookeeper_quorum_serves_with_sasl(secured):
    _, outputs = secured
    modes = []
    for n in outputs["nodes"]:
        if "zookeeper" not in n["roles"]:
            continue
        _, cfg = sh(n["container"], "cat /etc/trainstack/zookeeper/zoo.cfg")
        assert "quorum.auth.enableSasl=true" in cfg
        _, out = sh(
            n["container"],
            "python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', 2181)); "
            "s.sendall(b'srvr'); print(s.recv(4096).decode())\"",
        )
        modes += re.findall(r"Mode: (\w+)", out)
    assert sorted(modes) == ["follower", "follower", "leader"], modes


def test_secrets_nowhere_in_plain_text(secured):
    stack, outputs = secured
    values = {
        "spark secret": spark_secret(outputs),
        "zookeeper password": zookeeper_password(outputs),
    }
    assert all(len(v) >= 32 for v in values.values())
    assert leaks(stack, outputs, values) == []
