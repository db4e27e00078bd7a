import pytest
from conftest import address_of, zk_command

pytestmark = pytest.mark.hosts


@pytest.mark.group("zookeeper")
def test_zookeeper_supervised_and_running(host):
    assert " RUNNING " in host.check_output("supervisorctl status zookeeper")


def _listening(host, port: int) -> bool:
    return (
        host.socket(f"tcp://0.0.0.0:{port}").is_listening
        or host.socket(f"tcp://:::{port}").is_listening
    )


@pytest.mark.group("zookeeper")
def test_zookeeper_serves_clients(host):
    assert _listening(host, 2181)


@pytest.mark.group("zookeeper")
def test_zookeeper_election_port_matches_the_ensemble(host, inventory):
    # 2888 (peer) listens on the leader only; 3888 (election) on every member of an
    # ensemble, and on none of a single server, which runs standalone.
    assert _listening(host, 3888) is (len(inventory.get_hosts("zookeeper")) > 1)


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
    if len(modes) == 1:
        assert modes == ["standalone"], modes
    else:
        assert sorted(modes) == sorted(["leader"] + ["follower"] * (len(modes) - 1)), modes


@pytest.mark.group("zookeeper")
def test_session_timeout_bounded_for_fast_failover(host):
    cfg = host.file("/etc/trainstack/zookeeper/zoo.cfg").content_string
    assert "maxSessionTimeout=6000" in cfg
