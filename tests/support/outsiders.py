"""An outsider on a stack's network, and the secrets it must not find: a fresh container from
the node image on the cluster's network has Spark, ZooKeeper's jars and Java, but not the
cluster's secrets (docs/security.md)."""

from __future__ import annotations

import json
import re
import subprocess
import time

import docker

from infra.nodes import NODE_PATHS
from tests.support.stacks import LABEL_STACK, ROOT, Stack

SPARK_HOME = f"{NODE_PATHS.venv_dir}/lib/python3.11/site-packages/pyspark"
JAAS_CLIENT = f"{NODE_PATHS.spark_conf_dir}/zookeeper-client.jaas"
APP_NAME = "outsider-app"


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


def leaks(stack: Stack, outputs: dict, values: dict[str, str]) -> list[str]:
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
