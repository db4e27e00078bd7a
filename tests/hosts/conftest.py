"""testinfra checks of a provisioned trainstack, for any inventory.

Run against the hosts of an Ansible inventory (local containers or SSH servers)::

    .venv/bin/pytest tests/hosts --hosts='ansible://all' --ansible-inventory=INVENTORY

Tests marked ``@pytest.mark.group("NAME", ...)`` run only on hosts of those inventory groups; other
hosts are deselected (reported as deselected, never skipped). Cluster-wide checks (one
ZooKeeper leader, one ALIVE master, registered workers) query every member from the host under
test, so they also exercise the network between nodes.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

import pytest
import testinfra.utils.ansible_runner

from infra.nodes import NODE_PATHS


def pytest_configure(config):
    # testinfra runs ansible-inventory / ansible from PATH: use the ones of this interpreter's venv.
    venv_bin = os.path.dirname(sys.executable)
    if venv_bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    config.addinivalue_line("markers", "group(*names): run only on hosts of these inventory groups")


def _runner(config) -> testinfra.utils.ansible_runner.AnsibleRunner:
    inventory = config.getoption("ansible_inventory", None)
    if not inventory:
        raise pytest.UsageError(
            "tests/hosts needs --ansible-inventory=INVENTORY (and --hosts='ansible://all')"
        )
    return testinfra.utils.ansible_runner.AnsibleRunner(inventory)


def _host_name(item, hosts: list[str]) -> str:
    """Inventory host of a testinfra item: its id is "ansible://<host>" (then "-<param>")."""
    callspec_id = item.callspec.id
    for host in sorted(hosts, key=len, reverse=True):
        prefix = f"ansible://{host}"
        if callspec_id == prefix or callspec_id.startswith(prefix + "-"):
            return host
    return ""


def _is_host_check(item) -> bool:
    return item.get_closest_marker("hosts") is not None


def pytest_report_header(config):
    if not config.getoption("ansible_inventory", None):
        return "tests/hosts: no --ansible-inventory, host checks deselected"
    return None


def pytest_collection_modifyitems(config, items):
    if not any(_is_host_check(i) for i in items):
        return
    if not config.getoption("ansible_inventory", None):
        # Host checks need a target inventory; a plain `pytest` run reports them as deselected.
        drop = [i for i in items if _is_host_check(i)]
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if not _is_host_check(i)]
        return
    runner = None
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("group")
        if marker is None or not hasattr(item, "callspec"):
            keep.append(item)
            continue
        runner = runner or _runner(config)
        name = _host_name(item, runner.get_hosts("all"))
        members = {h for group in marker.args for h in runner.get_hosts(group)}
        (keep if name in members else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def inventory(request) -> testinfra.utils.ansible_runner.AnsibleRunner:
    return _runner(request.config)


@pytest.fixture(scope="session")
def node_vars(inventory):
    """Per-host variables of every inventory host (hostvars)."""
    return {h: inventory.get_variables(h) for h in inventory.get_hosts("all")}


def address_of(node_vars, host: str) -> str:
    hv = node_vars[host]
    return str(hv.get("trainstack_node_address") or hv.get("ansible_host") or host)


@pytest.fixture(scope="session")
def masters(inventory, node_vars) -> list[str]:
    return [address_of(node_vars, h) for h in inventory.get_hosts("spark_master")]


VENV = NODE_PATHS.venv_dir


def fetch_json(host, url: str) -> dict:
    """GET a URL from the node under test (python3 is on every node; curl need not be)."""
    code = (
        "import sys,urllib.request;"
        "print(urllib.request.urlopen(sys.argv[1],timeout=5).read().decode())"
    )
    out = host.check_output(f"python3 -c {shlex.quote(code)} {shlex.quote(url)}")
    return json.loads(out)


def zk_command(host, address: str, word: str, port: int = 2181) -> str:
    code = (
        "import socket,sys;s=socket.create_connection((sys.argv[1],int(sys.argv[2])),5);"
        "s.sendall(sys.argv[3].encode());b=b''\n"
        "while True:\n d=s.recv(4096)\n if not d: break\n b+=d\nprint(b.decode())"
    )
    return host.check_output(f"python3 -c {shlex.quote(code)} {address} {port} {word}")
