"""Provisioning runs Ansible under Mitogen, or stock Ansible when asked: a real run on localhost."""

import sys
from pathlib import Path

import pytest

from infra.provisioning.runner import mitogen_env, run_playbook

pytestmark = pytest.mark.unit

PLAYBOOK = """\
- name: Record the process a task's module runs under.
  hosts: all
  gather_facts: false
  tasks:
    - name: Write the module's parent process down.
      ansible.builtin.shell: tr '\\\\0' ' ' < /proc/$PPID/cmdline > {{ out }}
      changed_when: true
"""


def test_mitogen_env_names_the_installed_strategy():
    env = mitogen_env()
    assert env["ANSIBLE_STRATEGY"] == "mitogen_free"
    assert (Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_free.py").is_file()


@pytest.mark.parametrize("mitogen", [True, False], ids=["mitogen", "stock"])
def test_modules_run_inside_mitogen_only_when_asked(tmp_path, mitogen):
    out = tmp_path / "parent.txt"
    playbook = tmp_path / "parent.yml"
    playbook.write_text(PLAYBOOK)
    inventory = {
        "all": {
            "hosts": {
                "here": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                }
            },
            "vars": {"out": str(out)},
        }
    }
    result = run_playbook(
        inventory, str(playbook), on_event=None, artifacts_dir=tmp_path / "runner", mitogen=mitogen
    )
    assert result.ok, result.summary()
    # Mitogen names its interpreter processes `python(mitogen:user@host:pid)`.
    assert ("(mitogen:" in out.read_text()) is mitogen, out.read_text()
    # The next run in the same directory does not inherit this run's environment.
    assert not (tmp_path / "runner" / "env" / "envvars").exists()
