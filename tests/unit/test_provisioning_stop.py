"""`python -m infra.provisioning` stopped the way Pulumi stops a plugin: a real run on localhost.

Pulumi sends SIGINT to the plugin's whole process group (the provisioning child is in it)
and SIGKILL to the group a few seconds later if the plugin is still there. The child must
finish its stop anyway (Ansible killed, CPU limits given back, its result written): failure
drill 4 once found most nodes still boosted because the group SIGKILL came mid-restore.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.stacks import ROOT, processes_naming, wait_until
from tests.unit.test_mitogen import STUCK

pytestmark = pytest.mark.unit

# The plugin: leads its own process group (as Pulumi starts plugins), starts the provisioning
# child in that group and waits for it. The wheelhouse step is replaced (no network here);
# everything else is the real module: its signal handling, ansible-runner, Ansible.
PLUGIN = textwrap.dedent(
    """\
    import subprocess, sys
    child_code = (
        "import sys; import infra.provisioning.__main__ as m; "
        "m.build_node_wheelhouse = lambda root: root; sys.exit(m.main(sys.argv[1:]))"
    )
    out, err, pid_file, *args = sys.argv[1:]
    with open(out, "w") as stdout, open(err, "w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", child_code, *args], stdout=stdout, stderr=stderr
        )
        open(pid_file, "w").write(str(child.pid))
        child.wait()
    """
)


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaps (an orphan in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _below(pid: int, ancestor: int) -> bool:
    """`pid` is `ancestor` or one of its descendants (walking /proc's parent links)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def test_a_stop_by_group_signals_finishes_despite_the_group_kill(tmp_path):
    playbook = tmp_path / "stuck.yml"
    playbook.write_text(STUCK)
    here = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"here": here}}}))
    runner = tmp_path / "runner"
    out, err, pid_file = tmp_path / "out", tmp_path / "err", tmp_path / "pid"
    args = ["--inventory", str(inventory), "--playbook", str(playbook)]
    args += ["--wheelhouse", str(tmp_path / "wheels"), "--artifacts-dir", str(runner)]
    plugin = subprocess.Popen(
        [sys.executable, "-c", PLUGIN, str(out), str(err), str(pid_file), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    try:
        # This run's stuck task: a `sleep 120` below its provisioning child (another test's
        # may still be running on this machine).
        child = wait_until("the provisioning child", lambda: int(pid_file.read_text()), 60)
        wait_until(
            "the stuck task running",
            lambda: any(_below(int(p.split(":")[0]), child) for p in processes_naming("sleep 120")),
            60,
        )
        os.killpg(plugin.pid, signal.SIGINT)
        time.sleep(0.3)  # Pulumi waits 5 s; far less here, so a stop that stays loses
        os.killpg(plugin.pid, signal.SIGKILL)
        plugin.wait(10)
        wait_until("the child's exit", lambda: _gone(child), 60)
    finally:
        if plugin.poll() is None:
            os.killpg(plugin.pid, signal.SIGKILL)
            plugin.wait()
    lines = out.read_text().splitlines()
    assert lines, (
        "the child wrote no result: killed before it finished its stop\n"
        + (err.read_text()[-2000:])
    )
    result = json.loads(lines[-1])
    assert result["ok"] is False
    assert any("stopped before it finished" in f for f in result["failures"]), result
    assert "SIGINT received: stopping the run" in err.read_text()
    assert processes_naming(str(runner)) == []
