"""Security for shared networks, each check as an outsider on a real stack (docs/security.md).

One small stack for the whole module (3 control nodes, 1 worker, no monitoring, a 1-epoch
job); the tests run in order on it, rotation (a second `pulumi up`) last. An outsider is a
fresh container from the node image on the cluster's network: it has Spark, ZooKeeper's jars
and Java, but not the cluster's secrets.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import docker
import pytest

from tests.pulumi_cli import LABEL_STACK, ROOT, Stack

pytestmark = pytest.mark.security

CONFIG = {
    "uiPortBase": "0",
    "workers": "1",
    "monitoring": "false",
    "trainEpochs": "1",
}
SPARK_HOME = "/opt/trainstack/venv/lib/python3.11/site-packages/pyspark"
JAAS_CLIENT = "/etc/trainstack/spark/zookeeper-client.jaas"
APP_NAME = "outsider-app"


@pytest.fixture(scope="module")
def secured(tmp_path_factory, engine):
    stack = Stack(tmp_path_factory.mktemp("security"), prefix="tssec")
    try:
        stack.init(**CONFIG)
        stack.up()
        yield stack, stack.outputs()
    finally:
        stack.destroy_and_remove()


def node(outputs: dict, name: str) -> dict:
    return next(n for n in outputs["nodes"] if n["name"] == name)


def sh(container: str, command: str, user: str = "root") -> tuple[int, str]:
    """Run a shell command in a node as `user`: (exit code, stdout+stderr)."""
    proc = subprocess.run(
        ["docker", "exec", "-u", user, container, "bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def outsider(outputs: dict, command: str, timeout: int = 180) -> tuple[int, str]:
    """Run `command` in a new container from the node image on the cluster network."""
    image = outputs["nodeImage"]["tag"]
    client = docker.from_env()
    container = client.containers.run(
        image,
        ["bash", "-c", command],
        network=outputs["network"],
        user="trainstack",
        detach=True,
        labels={LABEL_STACK: f"tssec-outsider-{outputs['network']}"},
    )
    try:
        code = container.wait(timeout=timeout)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def spark_secret(outputs: dict) -> str:
    conf = sh(
        node(outputs, "worker-1")["container"], "cat /etc/trainstack/spark/spark-defaults.conf"
    )
    return re.search(r"^spark\.authenticate\.secret\s+(\S+)$", conf[1], re.M).group(1)


def zookeeper_password(outputs: dict) -> str:
    jaas = sh(node(outputs, "control-1")["container"], "cat /etc/trainstack/zookeeper/jaas.conf")
    return re.search(r'user_spark="([^"]+)"', jaas[1]).group(1)


def zookeeper_connect(outputs: dict) -> str:
    return ",".join(f"{n['address']}:2181" for n in outputs["nodes"] if "zookeeper" in n["roles"])


def spark_client(outputs: dict, secret: str | None, crypto: bool) -> tuple[int, str]:
    """A Spark application from outside the cluster: registers with the masters, or not."""
    conf = {
        "spark.master": outputs["sparkMasterUrl"],
        "spark.app.name": APP_NAME,
        "spark.network.crypto.enabled": str(crypto).lower(),
        "spark.driver.memory": "512m",
        "spark.cores.max": "1",
    }
    if secret is not None:
        conf |= {"spark.authenticate": "true", "spark.authenticate.secret": secret}
    script = (
        "import socket\n"
        "from pyspark import SparkConf, SparkContext\n"
        f"conf = SparkConf().setAll({sorted(conf.items())!r})\n"
        "conf.set('spark.driver.host', socket.gethostbyname(socket.gethostname()))\n"
        "sc = SparkContext(conf=conf)\n"
        "print('REGISTERED', sc.applicationId, sc.parallelize(range(10), 1).sum(), flush=True)\n"
        "sc.stop()\n"
    )
    # Standalone registration retries 3 x 20 s before giving up: 50 s tell refused from slow.
    return outsider(
        outputs,
        f"export SPARK_CONF_DIR=/tmp; timeout 50 /opt/trainstack/venv/bin/python -c {shq(script)}",
    )


def shq(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def zk_cli(outputs: dict, command: str, jaas: str | None = None) -> str:
    flags = f"-Djava.security.auth.login.config={jaas}" if jaas else "-Dzookeeper.sasl.client=false"
    return (
        f"timeout 40 java {flags} -cp '{SPARK_HOME}/jars/*' org.apache.zookeeper.ZooKeeperMain "
        f"-server {zookeeper_connect(outputs)} {command} 2>&1"
    )


def zk_listing(log: str) -> str:
    """The children `ls` printed. The client prints its watcher's events too, and the
    SaslAuthenticated event may come after the listing, so it is not always the last line."""
    lines = [line.strip() for line in log.splitlines()]
    return next(
        (line for line in reversed(lines) if line.startswith("[") and line.endswith("]")), ""
    )


def wait_alive(outputs: dict, timeout: float = 240) -> dict:
    """The ALIVE master's status once it has every worker back (after a restart the new
    leader recovers from ZooKeeper first)."""
    workers = sum("spark_worker" in n["roles"] for n in outputs["nodes"])
    masters = [n for n in outputs["nodes"] if "spark_master" in n["roles"]]
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        for m in masters:
            code, out = sh(
                m["container"],
                'python3 -c "import urllib.request; print(urllib.request.urlopen('
                f"'http://{m['address']}:8080/json', timeout=5).read().decode())\"",
            )
            if code == 0:
                status = json.loads(out)
                seen.append(f"{m['name']}: {status['status']} {status['aliveworkers']}")
                if status["status"] == "ALIVE" and status["aliveworkers"] == workers:
                    return status
        time.sleep(3)
    raise AssertionError(f"no ALIVE master with {workers} workers in {timeout}s: {seen[-4:]}")


def spark_znode(outputs: dict) -> str:
    return f"/trainstack/{outputs['inventory']['all']['vars']['trainstack_stack']}/spark"


def test_the_stack_trained_with_encryption_on(secured):
    _, outputs = secured
    assert outputs["training"]["ok"], outputs["training"]
    conf = sh(
        node(outputs, "worker-1")["container"], "cat /etc/trainstack/spark/spark-defaults.conf"
    )
    assert re.search(r"^spark\.network\.crypto\.enabled\s+true$", conf[1], re.M)


@pytest.fixture(scope="module")
def clients(secured):
    """Four Spark applications from an outsider container, at the same time (each refused one
    waits out its registration): no secret, a wrong secret, the right secret without
    encryption, and the right secret with encryption (the control)."""
    _, outputs = secured
    secret = spark_secret(outputs)
    cases = {
        "no secret": (None, True),
        "wrong secret": ("not-the-cluster-secret-0123456789", True),
        "no encryption": (secret, False),
        "control": (secret, True),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {k: pool.submit(spark_client, outputs, *v) for k, v in cases.items()}
        return {k: f.result()[1] for k, f in futures.items()}


def test_outsider_without_secret_cannot_register(clients):
    for case in ("no secret", "wrong secret"):
        assert "REGISTERED" not in clients[case], (case, clients[case][-3000:])
    assert "REGISTERED" in clients["control"] and " 45" in clients["control"], clients["control"]


def test_client_without_encryption_is_refused(clients):
    """With the right secret but no RPC encryption the cluster refuses the client (Spark's
    AES auth handler does not know the plain SASL challenge: no fallback); the same client
    with encryption registers and runs a job, so the refusal is about encryption."""
    log = clients["no encryption"]
    assert "REGISTERED" not in log, log[-3000:]
    assert "Unknown challenge message" in log, log[-3000:]
    assert "REGISTERED" in clients["control"], clients["control"][-3000:]


def test_outsider_cannot_write_spark_znodes(secured):
    _, outputs = secured
    znode = spark_znode(outputs)
    # No credentials; then SASL with a wrong password.
    wrong = (
        "printf 'Client {\\n org.apache.zookeeper.server.auth.DigestLoginModule required\\n"
        ' username="spark" password="wrong";\\n};\\n\' > /tmp/wrong.jaas; '
    )
    for command in (
        zk_cli(outputs, f"create {znode}/outsider x"),
        wrong + zk_cli(outputs, f"create {znode}/outsider x", jaas="/tmp/wrong.jaas"),
        zk_cli(outputs, f"delete {znode}/leader_election"),
    ):
        _, log = outsider(outputs, command)
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


def _leaks(stack: Stack, outputs: dict, values: dict[str, str]) -> list[str]:
    found = []
    for n in outputs["nodes"]:
        _, procs = sh(n["container"], "ps -eo args")
        _, logs = sh(n["container"], "cat /var/log/trainstack/* 2>/dev/null")
        for what, value in values.items():
            if value in procs:
                found.append(f"{what} in the process arguments on {n['name']}")
            if value in logs:
                found.append(f"{what} in the logs on {n['name']}")
    artifacts = ROOT / ".artifacts" / stack.name
    assert artifacts.is_dir(), artifacts
    for path in artifacts.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="ignore")
            found += [f"{what} in {path}" for what, value in values.items() if value in text]
    state = stack.run("stack", "export").stdout
    found += [f"{what} in the Pulumi state" for what, value in values.items() if value in state]
    return found


def test_secrets_nowhere_in_plain_text(secured):
    stack, outputs = secured
    values = {
        "spark secret": spark_secret(outputs),
        "zookeeper password": zookeeper_password(outputs),
    }
    assert all(len(v) >= 32 for v in values.values())
    assert _leaks(stack, outputs, values) == []


def test_rotation_reaches_every_service(secured):
    stack, outputs = secured
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
        for line in status.splitlines():
            if line.split()[0] in ("zookeeper", "spark-master", "spark-worker"):
                _, since = sh(
                    n["container"],
                    f"ps -o lstart= -p $(supervisorctl pid {line.split()[0]}) | date -f - +%s",
                )
                assert int(since.strip()) >= int(started) - 1, (n["name"], line)
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
    assert _leaks(stack, outputs, {**new, **{f"old {k}": v for k, v in old.items()}}) == []
