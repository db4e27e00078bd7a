"""Provisioning runs Ansible under Mitogen, or stock Ansible when asked: a real run on localhost."""

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.provisioning.runner import mitogen_env, run_playbook
from tests.support.processes import Proc, Recorder, descendants, wait_gone
from tests.support.stacks import processes_naming

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


STUCK = """\
- name: Hang like a node that stopped answering.
  hosts: all
  gather_facts: false
  tasks:
    - name: Sleep far longer than the run may take.
      ansible.builtin.command: sleep 120
      changed_when: false
"""


@contextlib.contextmanager
def recording(root: int, every: float = 0.2) -> Iterator[dict[tuple[int, int], Proc]]:
    """The processes that ran below `root` while the block ran (those there before it left
    out), sampled in a thread: the run is stopped before the block ends, and Mitogen's
    multiplexer (a session of its own) is reparented out of the tree once ansible-playbook is
    killed, so what is seen is kept by PID and start time, whatever it is called since."""
    before = {(p.pid, p.started) for p in descendants(root)}
    recorder = Recorder(root)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            recorder.sample()
            stop.wait(every)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    seen: dict[tuple[int, int], Proc] = {}
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
        seen.update((k, p) for k, p in recorder.seen.items() if k not in before)


def _stuck_run(tmp_path, **kwargs):
    playbook = tmp_path / "stuck.yml"
    playbook.write_text(STUCK)
    here = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"here": here}}}
    return run_playbook(
        inventory, str(playbook), on_event=None, artifacts_dir=tmp_path / "runner", **kwargs
    )


def _assert_nothing_left(seen: dict[tuple[int, int], Proc]) -> None:
    """The run's stuck `sleep 120` and its Mitogen context were seen while it ran, and no
    process seen then is still running."""
    procs = list(seen.values())
    names = [str(p) for p in procs]
    assert any(p.cmdline == "sleep 120" for p in procs), f"the stuck task was not seen: {names}"
    # Mitogen names its interpreter processes `python(mitogen:user@host:pid)`.
    assert any("(mitogen:" in p.cmdline for p in procs), f"no Mitogen context seen: {names}"
    assert [str(p) for p in wait_gone(procs, 10)] == []


def test_a_run_that_outlives_its_timeout_is_stopped_and_named(tmp_path):
    with recording(os.getpid()) as seen:
        result = _stuck_run(tmp_path, timeout=8)
    assert not result.ok
    assert result.status == "timeout", result.summary()
    assert result.duration_s < 60, result.duration_s
    assert "did not finish within 8 s" in result.summary(), result.summary()
    # Nothing of the run is left: not ansible-playbook, not Mitogen's multiplexer, not the
    # context it renamed, not the task's `sleep`.
    _assert_nothing_left(seen)
    assert processes_naming(str(tmp_path / "runner")) == []


def test_a_cancelled_run_stops_and_leaves_no_process(tmp_path):
    started = time.monotonic()
    with recording(os.getpid()) as seen:
        result = _stuck_run(tmp_path, cancel=lambda: time.monotonic() - started > 5)
    assert result.status == "canceled", result.summary()
    assert result.duration_s < 60, result.duration_s
    assert "stopped before it finished" in result.summary(), result.summary()
    _assert_nothing_left(seen)
    assert processes_naming(str(tmp_path / "runner")) == []
