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

import pytest

from tests.support.processes import descendants, proc, wait_gone
from tests.support.stacks import ROOT, processes_naming, wait_until
from tests.unit.test_mitogen import STUCK, recording

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
        # Every process of this run, sampled from the plugin down while it runs and stops:
        # the stuck `sleep 120` carries no marker of the run (another test's may be running
        # on this machine), Mitogen renames its children, and the plugin's tree ends at its kill.
        with recording(plugin.pid) as seen:
            child = proc(
                wait_until("the provisioning child", lambda: int(pid_file.read_text()), 60)
            )
            assert child is not None, "the provisioning child exited before the stop"
            stuck = wait_until(
                "the stuck task running below the provisioning child",
                lambda: [p for p in descendants(child.pid) if p.cmdline == "sleep 120"],
                60,
            )
            os.killpg(plugin.pid, signal.SIGINT)
            time.sleep(0.3)  # Pulumi waits 5 s; far less here, so a stop that stays loses
            os.killpg(plugin.pid, signal.SIGKILL)
            plugin.wait(10)
            assert wait_gone([child], 60) == [], "the provisioning child did not exit"
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
    # Nothing of the run is left: the stuck `sleep` seen above, nor any other process seen.
    procs = list(seen.values())
    assert set(stuck) <= set(procs) and child in procs
    assert [str(p) for p in wait_gone(procs, 10)] == []
    assert processes_naming(str(runner)) == []
