import pytest
from conftest import VENV, fetch_json

pytestmark = pytest.mark.hosts

PROGRAMS = {"spark_master": "spark-master", "spark_worker": "spark-worker"}


def _size_mb(text: str) -> int:
    text = str(text).strip().lower()
    units = {"g": 1024, "m": 1, "t": 1024 * 1024}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


@pytest.fixture(scope="module")
def statuses(host, masters):
    return {m: fetch_json(host, f"http://{m}:8080/json/") for m in masters}


@pytest.mark.group("spark_master")
def test_master_supervised_and_running(host):
    assert " RUNNING " in host.check_output("supervisorctl status spark-master")


@pytest.mark.group("spark_master")
@pytest.mark.parametrize("port", [7077, 8080])
def test_master_listening(host, port):
    # The master binds to its node address (not 0.0.0.0), so ask ss for the port on any address.
    assert host.check_output(f"ss -Htln 'sport = :{port}'"), f"nothing listens on {port}"


@pytest.mark.group("spark_master")
def test_exactly_one_master_alive_others_standby(statuses):
    states = sorted(s["status"] for s in statuses.values())
    assert states == sorted(["ALIVE"] + ["STANDBY"] * (len(states) - 1)), statuses


@pytest.mark.group("spark_master")
def test_masters_use_zookeeper_recovery(host):
    conf = host.file("/etc/trainstack/spark/spark-defaults.conf")
    assert "ZOOKEEPER" in host.check_output(
        "grep recoveryMode /etc/trainstack/spark/spark-defaults.conf"
    )
    assert conf.exists


@pytest.mark.group("spark_worker")
def test_worker_supervised_and_running(host):
    assert " RUNNING " in host.check_output("supervisorctl status spark-worker")


@pytest.mark.group("spark_worker")
def test_worker_registered_with_alive_master(host, masters):
    hv = host.ansible.get_variables()
    address = (
        hv.get("trainstack_node_address") or hv.get("ansible_host") or hv["inventory_hostname"]
    )
    alive = [
        s
        for s in (fetch_json(host, f"http://{m}:8080/json/") for m in masters)
        if s["status"] == "ALIVE"
    ]
    assert len(alive) == 1
    mine = [w for w in alive[0]["workers"] if w["host"] == address and w["state"] == "ALIVE"]
    assert mine, f"{address} not among {[w['host'] for w in alive[0]['workers']]}"
    assert mine[0]["cores"] == int(hv["trainstack_spark_worker_cores"])
    assert mine[0]["memory"] == _size_mb(hv["trainstack_spark_worker_memory"])


@pytest.mark.group("spark_worker", "spark_master", "tensorflow", "driver")
def test_clients_use_multi_master_url(host, masters):
    line = host.check_output("grep '^spark.master ' /etc/trainstack/spark/spark-defaults.conf")
    assert line.split()[1] == "spark://" + ",".join(f"{m}:7077" for m in masters)


@pytest.mark.group("zookeeper", "spark_master", "spark_worker", "tensorflow")
def test_pyspark_installed(host):
    assert (
        host.run(
            f"{VENV}/bin/python -c 'import pyspark; print(pyspark.__version__)'"
        ).stdout.strip()
        == "4.0.1"
    )
