"""The ssh target's pure parts: facts, fit, ssh command lines, inventories (no servers)."""

from __future__ import annotations

import json

import pytest

from infra import topology
from infra.config import StackConfig
from infra.config.servers import Server
from infra.targets import ssh
from infra.targets.ssh import cli as ssh_cli
from infra.targets.ssh import facts as ssh_facts
from infra.targets.ssh import known_hosts as ssh_known_hosts

pytestmark = pytest.mark.unit

FACTS = """\
os_id=debian
os_version=12
os_name=Debian GNU/Linux 12 (bookworm)
cores=4
memory_kb=8000000
disk_free_kb=20000000
python3=/usr/bin/python3
become=yes
"""


def server(**changes) -> Server:
    fields = {
        "name": "wrk-1",
        "address": "192.0.2.20",
        "user": "deploy",
        "roles": ("spark_worker", "tensorflow"),
        "port": 22,
        "private_key_file": "/keys/id_ed25519",
    }
    fields.update(changes)
    return Server(**fields)


def test_facts_are_read_from_the_probe_output():
    facts = ssh_facts.parse_facts(FACTS)
    assert (facts.os_id, facts.os_version, facts.cores) == ("debian", "12", 4)
    assert facts.memory_bytes == 8000000 * 1024
    assert facts.become and facts.python3 == "/usr/bin/python3"


def test_a_fitting_server_has_no_errors():
    assert ssh_facts.fit_errors(server(), ssh_facts.parse_facts(FACTS), 2 * 2**30) == []


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("os_id=ubuntu\nos_name=Ubuntu 24.04", "runs Ubuntu 24.04; the roles support debian 12"),
        ("memory_kb=1000000", "GiB of memory; its roles (spark_worker, tensorflow) need"),
        ("disk_free_kb=1000", "free on /; the install needs 4 GiB"),
        ("python3=", "has no python3"),
        ("become=no", "user deploy cannot sudo without a password"),
    ],
)
def test_a_server_that_does_not_fit_is_named_with_the_reason(line, fragment):
    key = line.split("=", 1)[0]
    text = "\n".join(x for x in FACTS.splitlines() if not x.startswith(key + "=")) + "\n" + line
    errors = ssh_facts.fit_errors(server(), ssh_facts.parse_facts(text), 2 * 2**30)
    assert any(fragment in e for e in errors), errors


def test_the_facts_connection_records_a_new_key_but_refuses_a_changed_one(tmp_path):
    from infra.transport import SshTransport

    known = str(tmp_path / "known_hosts")
    first = SshTransport("wrk-1", "192.0.2.20", 2222, "deploy", "/k", known, first_contact=True)
    later = SshTransport("wrk-1", "192.0.2.20", 2222, "deploy", "/k", known)
    assert "StrictHostKeyChecking=accept-new" in first.ssh_options()
    assert "StrictHostKeyChecking=yes" in later.ssh_options()
    for transport in (first, later):
        assert "StrictHostKeyChecking=no" not in transport.ssh_options()
        assert f"UserKnownHostsFile={known}" in transport.ssh_options()
    assert ssh_known_hosts.known_hosts_entry(server(port=2222)) == "[192.0.2.20]:2222"
    assert ssh_known_hosts.known_hosts_entry(server()) == "192.0.2.20"


def test_known_hosts_holds_exactly_the_recorded_keys_with_a_tight_mode(tmp_path):
    path = tmp_path / "ssh" / "known_hosts"
    ssh_known_hosts.write_known_hosts(
        path, ["b ssh-ed25519 BBBB", "a ssh-ed25519 AAAA", "a ssh-ed25519 AAAA"]
    )
    assert path.read_text() == "a ssh-ed25519 AAAA\nb ssh-ed25519 BBBB\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_server_still_listed_at_the_same_address_is_not_torn_down(tmp_path, monkeypatch):
    current = tmp_path / "servers.json"
    current.write_text(json.dumps([{"name": "renamed", "address": "192.0.2.20", "port": 22}]))
    monkeypatch.setenv(ssh_cli.CURRENT_ENV, str(current))
    assert "still listed, as renamed" in ssh_cli.teardown(server(), tmp_path / "kh", tmp_path / "a")
    # Listed under its own name (the last `up`'s list, as `pulumi destroy` sees it): removed.
    current.write_text(json.dumps([{"name": "wrk-1", "address": "192.0.2.20", "port": 22}]))
    assert ssh_cli._renamed(server()) == ""


def test_the_cli_reports_an_unreachable_server_in_one_line(tmp_path, monkeypatch, capsys):
    record = server(address="127.0.0.1", port=1).as_dict()
    record["privateKeyFile"] = ""
    monkeypatch.setenv(ssh_cli.SERVER_ENV, json.dumps(record))
    monkeypatch.setenv(ssh_cli.KNOWN_HOSTS_ENV, str(tmp_path / "known_hosts"))
    assert ssh_cli.main(["facts"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("trainstack: server wrk-1 (deploy@127.0.0.1:1): cannot connect")
    assert "Traceback" not in err[0]


def test_the_stack_inventory_checks_host_keys_against_the_recorded_file():
    servers = (
        server(
            name="ctl-1",
            roles=("zookeeper", "spark_master"),
            address="192.0.2.10",
            private_key_file="",
        ),
        server(private_key_file=""),
    )
    config = StackConfig.from_mapping(
        {"target": "ssh", "servers": json.dumps([s.as_dict() for s in servers])}
    )
    plan = topology.server_plan(config, config.servers)
    inventory = topology.inventory(
        config, "ts", plan, servers=config.servers, known_hosts="/state/known_hosts"
    )
    all_vars = inventory["all"]["vars"]
    assert all_vars["ansible_connection"] == "ssh"
    assert all_vars["ansible_host_key_checking"] is True
    assert all_vars["ansible_ssh_common_args"] == (
        "-o UserKnownHostsFile=/state/known_hosts -o StrictHostKeyChecking=yes"
    )
    # No ssh compression: the wheel sets are compressed already (rsync goes over this ssh).
    assert "-C" not in all_vars["ansible_ssh_args"].split()
    assert all_vars["trainstack_shared_storage_check"] is True
    assert config.training_workers == 1


def test_the_teardown_inventory_names_only_the_removed_servers():
    inventory = topology.teardown_inventory([server()], "/state/known_hosts")
    assert list(inventory["all"]["hosts"]) == ["wrk-1"]
    host = inventory["all"]["hosts"]["wrk-1"]
    assert (host["ansible_host"], host["ansible_user"]) == ("192.0.2.20", "deploy")
    assert "StrictHostKeyChecking=yes" in inventory["all"]["vars"]["ansible_ssh_common_args"]


def test_an_unreachable_server_does_not_block_its_removal(tmp_path, monkeypatch, capsys):
    record = server(address="127.0.0.1", port=1).as_dict()
    record["privateKeyFile"] = ""
    monkeypatch.setenv(ssh_cli.SERVER_ENV, json.dumps(record))
    monkeypatch.setenv(ssh_cli.KNOWN_HOSTS_ENV, str(tmp_path / "known_hosts"))
    monkeypatch.delenv(ssh_cli.CURRENT_ENV, raising=False)
    assert ssh_cli.main(["teardown"]) == 0
    err = capsys.readouterr().err
    assert "server wrk-1 (deploy@127.0.0.1:1): cannot be reached (" in err
    assert "trainstack's files stay on it" in err


RECORDED = {
    "os": "Debian GNU/Linux 12 (bookworm)",
    "cores": 4,
    "host_keys": ["[h]:22 ssh-ed25519 AAAA"],
}


def probe_props(key_file: str = "/keys/id_ed25519", **changes) -> dict:
    props = {
        "server": json.dumps(server(private_key_file=key_file).as_dict(), sort_keys=True),
        "min_memory": "1024",
        "recorded": RECORDED,
        "facts": RECORDED,
    }
    props.update(changes)
    return props


def test_the_probe_takes_the_commands_facts_on_create_without_connecting(monkeypatch):
    monkeypatch.setattr(ssh, "probe", lambda *a, **k: pytest.fail("connected on create"))
    created = ssh._ProbeProvider().create(probe_props(facts=None))
    assert created.id == "wrk-1"
    assert created.outs["facts"] == RECORDED


def test_a_refresh_reads_the_facts_again_trusting_only_the_recorded_keys(monkeypatch, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("key")
    key.chmod(0o600)
    seen = {}

    def fake_probe(target, known_hosts, min_memory, *, first_contact=True):
        seen.update(
            name=target.name,
            keys=known_hosts.read_text(),
            min_memory=min_memory,
            first_contact=first_contact,
        )
        return {**RECORDED, "cores": 8}

    monkeypatch.setattr(ssh, "probe", fake_probe)
    read = ssh._ProbeProvider().read("wrk-1", probe_props(str(key)))
    assert read.outs["facts"]["cores"] == 8
    assert read.outs["recorded"] == RECORDED  # the inputs stay: the next up shows no change
    assert read.inputs is None
    assert seen == {
        "name": "wrk-1",
        "keys": "[h]:22 ssh-ed25519 AAAA\n",
        "min_memory": 1024,
        "first_contact": False,
    }


def test_a_refresh_names_a_server_that_cannot_be_reached(monkeypatch, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("key")
    key.chmod(0o600)

    def unreachable(target, *a, **k):
        raise ssh_facts.SshTargetError(
            f"{ssh_facts.describe(target)}: cannot connect over SSH: timed out"
        )

    monkeypatch.setattr(ssh, "probe", unreachable)
    with pytest.raises(ssh.UserFacingError, match=r"^trainstack: server wrk-1 \(deploy@"):
        ssh._ProbeProvider().read("wrk-1", probe_props(str(key)))


def test_refreshed_facts_alone_are_no_change_to_apply():
    provider = ssh._ProbeProvider()
    refreshed = probe_props(facts={**RECORDED, "cores": 8})
    assert not provider.diff("wrk-1", refreshed, probe_props(facts=None)).changes
    moved = probe_props(recorded={**RECORDED, "os": "other"}, facts=None)
    assert provider.diff("wrk-1", refreshed, moved).changes


def test_a_refresh_names_the_server_whose_key_file_is_gone():
    with pytest.raises(ssh.UserFacingError) as failed:
        ssh._ProbeProvider().read("wrk-1", probe_props("/nonexistent/id"))
    assert str(failed.value).startswith(
        "trainstack: server wrk-1: '/nonexistent/id' does not exist"
    )
