"""`python -m infra.monitoring check`: render Prometheus's configuration and alert rules for
the default topology with the prometheus role's own templates, then `promtool check` them.

`make lint` runs it, so a template or rule that Prometheus would reject fails before any stack.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from infra import topology
from infra.config import StackConfig

ROOT = Path(__file__).resolve().parents[2]

# The handler (reload through supervisor) does nothing here: this play defines no Prometheus
# program.
PLAYBOOK = """\
- name: Render the Prometheus configuration for promtool.
  hosts: monitoring
  gather_facts: false
  tasks:
    - name: Render prometheus.yml and rules.yml.
      ansible.builtin.include_role:
        name: prometheus
        tasks_from: files.yml
"""


def render(out: Path, config: StackConfig | None = None) -> None:
    config = config or StackConfig()
    nodes = topology.plan(config)
    inventory = topology.inventory(config, topology.resource_prefix(config, "lint"), nodes)
    work = Path(tempfile.mkdtemp(prefix="trainstack-promcheck-"))
    try:
        (work / "inventory.json").write_text(json.dumps(inventory))
        (work / "render.yml").write_text(PLAYBOOK)
        # The project's mapping of role variables from the inventory (playbooks/group_vars), next
        # to the inventory and the play, as the playbooks have it: also in every host's hostvars.
        (work / "group_vars").symlink_to(ROOT / "playbooks" / "group_vars")
        env = {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_STDOUT_CALLBACK": "default",
        }
        cmd = [
            str(Path(sys.executable).with_name("ansible-playbook")),
            "-i",
            str(work / "inventory.json"),
            str(work / "render.yml"),
            "-e",
            json.dumps(
                {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "prometheus_conf_dir": str(out),
                }
            ),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"rendering the Prometheus templates failed:\n{proc.stdout[-3000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check() -> int:
    promtool = shutil.which("promtool")
    if not promtool:
        print("promtool is not on PATH: run `make setup` (step promtool)", file=sys.stderr)
        return 1
    out = Path(tempfile.mkdtemp(prefix="trainstack-prometheus-"))
    try:
        render(out)
        for args in (
            ["check", "config", str(out / "prometheus.yml")],
            ["check", "rules", str(out / "rules.yml")],
        ):
            proc = subprocess.run([promtool, *args], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                print(f"promtool {' '.join(args[:2])} failed:\n{proc.stdout}{proc.stderr}")
                return proc.returncode
            print(f"promtool {' '.join(args[:2])}: ok")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.monitoring")
    parser.add_argument("command", choices=["check"])
    parser.parse_args(argv)
    return check()


if __name__ == "__main__":
    sys.exit(main())
