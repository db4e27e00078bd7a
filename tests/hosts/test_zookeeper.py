import pytest
from conftest import address_of, zk_command

pytestmark = pytest.mark.hosts


@pytest.mark.group("zookeeper")
def test_zookeeper_supervised_and_running(host):
    assert " RUNNING " in host.check_output("supervisorctl status zookeeper")


@pytest.mark.group("zookeeper")
@pytest.mark.parametrize("port", [2181, 3888])  # 2888 (peer) listens on the leader only
def test_zookeeper_listening(host, port):
    assert (
        host.socket(f"tcp://0.0.0.0:{port}").is_listening
        or host.socket(f"tcp://:::{port}").is_listening
    )


@pytest.mark.group("zookeeper")
def test_zookeeper_myid_matches_inventory(host, node_vars):
    name = host.ansible.get_variables()["inventory_hostname"]
    assert host.file("/var/lib/trainstack/zookeeper/myid").content_string.strip() == str(
        node_vars[name]["trainstack_zookeeper_id"]
    )


@pytest.mark.group("zookeeper")
def test_ensemble_has_one_leader(host, inventory, node_vars):
    modes = []
    for member in inventory.get_hosts("zookeeper"):
        out = zk_command(host, address_of(node_vars, member), "srvr")
        modes.append(
            next(
                line.split(":", 1)[1].strip()
                for line in out.splitlines()
                if line.startswith("Mode:")
            )
        )
    assert sorted(modes) == sorted(["leader"] + ["follower"] * (len(modes) - 1)), modes


@pytest.mark.group("zookeeper")
def test_session_timeout_bounded_for_fast_failover(host):
    cfg = host.file("/etc/trainstack/zookeeper/zoo.cfg").content_string
    assert "maxSessionTimeout=6000" in cfg
