"""Which containers the provisioning CPU boost touches, from the one inventory builder."""

import pytest

from infra import topology
from infra.config import StackConfig
from infra.provisioning.inventory import docker_containers

pytestmark = pytest.mark.unit


def test_every_node_of_a_docker_inventory_is_boosted():
    config = StackConfig(workers=3)
    inv = topology.inventory(config, "trainstack-dev", topology.plan(config))
    assert docker_containers(inv) == [
        "trainstack-dev-control-1",
        "trainstack-dev-control-2",
        "trainstack-dev-control-3",
        "trainstack-dev-worker-1",
        "trainstack-dev-worker-2",
        "trainstack-dev-worker-3",
    ]


def test_hosts_reached_over_ssh_are_not_containers():
    inv = {
        "all": {
            "vars": {"ansible_connection": "ssh"},
            "children": {
                "control": {"hosts": {"c1": {"ansible_host": "10.0.0.5"}}},
                "workers": {
                    "hosts": {
                        "w1": {
                            "ansible_host": "box-w1",
                            "ansible_connection": "community.docker.docker",
                        }
                    }
                },
            },
        }
    }
    assert docker_containers(inv) == ["box-w1"]
    assert docker_containers({}) == []
