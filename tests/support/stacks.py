"""Drive the real Pulumi CLI on this project with an isolated backend and stack."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from infra.jobs.commands import project_env as cli_project_env

ROOT = Path(__file__).resolve().parents[2]
LABEL_STACK = "org.trainstack.stack"


def project_env(backend: Path) -> dict[str, str]:
    """The environment `eval "$(make -s env)"` gives, with the state kept in `backend`."""
    env = cli_project_env()
    env["PULUMI_BACKEND_URL"] = f"file://{backend}"
    env["PULUMI_CONFIG_PASSPHRASE"] = "trainstack-tests"
    env.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
    return env


@dataclass
class Stack:
    """A stack of this project, named uniquely, in a private file backend."""

    backend: Path
    name: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:6]}")
    prefix: str = "tsit"

    def __post_init__(self) -> None:
        self.backend.mkdir(parents=True, exist_ok=True)
        self.env = project_env(self.backend)

    @property
    def label(self) -> str:
        """The value of the stack label on everything this stack creates."""
        return f"{self.prefix}-{self.name}"

    @property
    def selector(self) -> str:
        """A Docker label filter for everything this stack creates."""
        return f"{LABEL_STACK}={self.label}"

    def run(self, *args: str, check: bool = True, timeout: int = 1800):
        proc = subprocess.run(
            ["pulumi", *args, "--stack", self.name, "--non-interactive"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"pulumi {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        return proc

    def init(self, **config: str) -> None:
        self.run("stack", "init")
        self.set_config(namePrefix=self.prefix, **config)

    def set_config(self, **config: str) -> None:
        """All the keys in one `pulumi config set-all` (one CLI start, not one per key)."""
        pairs = [f"--plaintext=trainstack:{key}={value}" for key, value in config.items()]
        if pairs:
            self.run("config", "set-all", *pairs)

    def up(self, *extra: str):
        return self.run("up", "--yes", "--skip-preview", *extra)

    def outputs(self) -> dict:
        return json.loads(self.run("stack", "output", "--json").stdout)

    def destroy_and_remove(self) -> None:
        self.run("destroy", "--yes", check=False)
        self.run("stack", "rm", "--yes", "--force", check=False)
        remove_leftovers(self.label)


def remove_leftovers(label: str) -> None:
    """Whatever a failed test left on the engine under this stack's label."""
    remove_engine_objects({"label": f"{LABEL_STACK}={label}"})


def remove_engine_objects(
    filters: dict[str, str], matches: Callable[[dict[str, str]], bool] = lambda labels: True
) -> list[str]:
    """Remove the containers, then the networks and volumes (which containers hold), that
    Docker's `filters` select and whose labels `matches`; returns what was removed."""
    client = docker.from_env()
    removed: list[str] = []
    for container in client.containers.list(all=True, filters=filters):
        if matches(container.labels):
            container.remove(force=True)
            removed.append(f"container {container.name}")
    for network in client.networks.list(filters=filters):
        if matches(network.attrs.get("Labels") or {}):
            network.remove()
            removed.append(f"network {network.name}")
    for volume in client.volumes.list(filters=filters):
        if matches(volume.attrs.get("Labels") or {}):
            volume.remove(force=True)
            removed.append(f"volume {volume.name}")
    return removed


def engine_objects(label: str) -> dict[str, list[str]]:
    client = docker.from_env()
    selector = {"label": f"{LABEL_STACK}={label}"}
    return {
        "containers": sorted(c.name for c in client.containers.list(all=True, filters=selector)),
        "networks": sorted(n.name for n in client.networks.list(filters=selector)),
        "volumes": sorted(v.name for v in client.volumes.list(filters=selector)),
    }


# Variables of the outer test run that the nested one must not see: TRAINSTACK_TIMES_FILE is
# where the outer run writes its times (tests/conftest.py), which the nested run would overwrite.
HOST_CHECKS_ENV_DROP = ("TRAINSTACK_TIMES_FILE",)
# The fewest checks a healthy stack passes: one per check function of tests/hosts that runs on
# ZooKeeper, Spark master or Spark worker nodes (test_java 1, test_secrets 5, test_spark 8,
# test_tensorflow 1, test_zookeeper 6), which every stack has; most run on several nodes.
HOST_CHECKS_MIN_PASSED = 21


def run_host_checks(stack: Stack, inventory: dict, workdir: Path) -> subprocess.CompletedProcess:
    """The tests/hosts suite (testinfra) against `inventory`, as an operator runs it."""
    import sys

    path = workdir / "inventory.json"
    path.write_text(json.dumps(inventory))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--color=no",
            "tests/hosts",
            "--hosts=ansible://all",
            f"--ansible-inventory={path}",
        ],
        cwd=ROOT,
        env={k: v for k, v in stack.env.items() if k not in HOST_CHECKS_ENV_DROP},
        capture_output=True,
        text=True,
        check=False,
    )


def host_checks_counts(stdout: str) -> dict[str, int]:
    """The counts of a pytest run's summary line ("== 40 passed, 12 deselected in 9.1s =="):
    passed, failed, errors, skipped, ...; {} when there is no summary line."""
    lines = [
        line
        for line in re.sub(r"\x1b\[[0-9;]*m", "", stdout).splitlines()
        if re.fullmatch(r"=+ .* in [0-9.]+s( \([0-9:]+\))? =+", line.strip())
    ]
    if not lines:
        return {}
    counts = {"passed": 0, "failed": 0, "errors": 0}
    for number, word in re.findall(r"(\d+) (\w+)", lines[-1]):
        counts[{"error": "errors", "warning": "warnings"}.get(word, word)] = int(number)
    return counts


def assert_host_checks_passed(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The nested testinfra run passed: exit code 0, and its own summary says that at least
    HOST_CHECKS_MIN_PASSED checks passed and none failed or erred. Its counts."""
    output = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, output
    counts = host_checks_counts(proc.stdout)
    assert counts, f"no pytest summary line in the host checks' output:\n{output}"
    assert counts["failed"] == 0 and counts["errors"] == 0, (counts, output)
    assert counts["passed"] >= HOST_CHECKS_MIN_PASSED, (counts, output)
    return counts


class BackgroundUp:
    """`pulumi up` in the background, its output collected line by line as it comes."""

    def __init__(self, stack: Stack, *extra: str) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["pulumi", "up", "--yes", "--skip-preview", *extra, "--stack", stack.name,
             "--non-interactive"],
            cwd=ROOT,
            env=stack.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.proc.poll() is not None:
                self._reader.join(5)
                found = re.search(pattern, self.output)
                if found:
                    return found
                raise AssertionError(
                    f"`pulumi up` ended ({self.proc.returncode}) before {pattern!r}:\n"
                    f"{self.output[-4000:]}"
                )
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} within {timeout:.0f} s:\n{self.output[-4000:]}")

    def run_dir(self, models: str, timeout: float = 1500) -> str:
        """The run directory (under `models`, on the nodes) of the job this `up` launches."""
        return self.wait_for(rf"launching on \S+: .* --output ({models}/run-\w+)", timeout)[1]

    def stop_at_once(self) -> tuple[int, str]:
        """Ctrl-C twice, as a user who does not want to wait: Pulumi stops at once."""
        self.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        self.proc.send_signal(signal.SIGINT)
        return self.finish(timeout=300)

    def finish(self, timeout: float = 1800) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        return self.proc.returncode, self.output


# Prints the pid of every TensorFlow worker: a process with TensorFlow loaded that is not an
# executor's Python daemon (whose parent is the executor's JVM: in the warm runner the daemon
# imports TensorFlow before forking the task's worker, trainstack_training.daemon). Run it as
# the job's user (root in a container may not read another user's /proc/<pid>/maps).
TENSORFLOW_PIDS = (
    "for p in /proc/[0-9]*; do grep -qs _pywrap_tensorflow $p/maps || continue; "
    "pp=$(cut -d' ' -f4 $p/stat 2>/dev/null); "
    '[ "$(cat /proc/$pp/comm 2>/dev/null)" = java ] || echo ${p#/proc/}; done; true'
)


def processes_naming(text: str) -> list[str]:
    """The processes of this machine whose command line contains `text`."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if text in cmdline:
                found.append(f"{entry.name}: {cmdline[:160]}")
    return found


def wait_until(
    what: str, check: Any, timeout: float, every: float = 0.5, up_to: float | None = None
) -> Any:
    """`check()`'s first truthy value, tried every `every` s for `timeout` s (with `up_to`, the
    pause doubles after each try up to that many seconds: a back-off for a costly check). An
    exception of
    `check` counts as a falsy try; if none succeeded in time, the AssertionError names the
    last value and the last exception (type and message) and is raised from that exception,
    so its traceback shows where the check failed."""
    deadline = time.monotonic() + timeout
    last: Any = None
    error: Exception | None = None
    tries = raised = 0
    while time.monotonic() < deadline:
        tries += 1
        try:
            last = check()
            if last:
                return last
        except Exception as exc:
            error, raised = exc, raised + 1
        time.sleep(every)
        if up_to is not None:
            every = min(max(every, 0.05) * 2, up_to)
    said = f"{what}: not within {timeout:.0f} s (last: {last!r}"
    if error is not None:
        said += f"; {raised} of {tries} tries raised, the last {type(error).__name__}: {error}"
    raise AssertionError(said + ")") from error
