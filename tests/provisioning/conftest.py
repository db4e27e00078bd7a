"""Fixtures for provisioning tests against real containers (``-m provisioning``).

One stack of the real program per session (``tests/support/stacks.Stack``, prefix ``tsprov``):
3 control nodes (ZooKeeper's quorum, 2 masters) and one worker, the smallest topology with
every kind of node, without monitoring (its roles are checked on the shared stack,
tests/platform/test_20_monitoring.py) and ``train=false``. Its nodes start from this tree's
node image (``bakeImage`` true, the default: the newcomer test of stage 1 has baked it; run
alone, this module's first ``up`` bakes it), so its one ``pulumi up`` is the program's
provisioning of the configure parts, through the program's inventory (``infra.topology``) and
its provisioning resource. The re-runs and the fault cases then call ``run_playbook`` directly
with the inventory the stack exported and the secret the program used, as
``python -m infra.provisioning`` does for the program, so that they neither rotate nor break
it. A fault in an install part (a package, a wheel) forces the install parts with
``trainstack_image_installed=false`` (playbooks/site.yml), as a server without the image
would run them.

The full install from bare Debian is not repeated here: the ssh module (tests/ssh) installs
one server from bare Debian over SSH with site.yml, the bake (tests/newcomer, tests/images)
runs every install part from the bare base image over the docker connection, and
tests/unit/test_deploy_program.py checks what the program declares with ``bakeImage=false``
(tests/README.md, "Which module proves what").

Environment:
  TRAINSTACK_WHEELHOUSE      the stack's trainstack:wheelhouse (default
                             ~/.cache/trainstack/wheelhouse)
  TRAINSTACK_BASE_IMAGE      the stack's trainstack:baseImage (default debian:bookworm)
  TRAINSTACK_KEEP_CLUSTER=1  keep the stack after the session (debugging; its state is in the
                             session's pytest temp directory, `make clean-test-stacks` removes it)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra.components.provisioning import integral  # noqa: E402
from infra.engine import cpu_boost  # noqa: E402
from infra.provisioning import TaskEvent, run_playbook  # noqa: E402
from tests.support.cluster import BASE_IMAGE, CACHE  # noqa: E402
from tests.support.events import streamed_events  # noqa: E402
from tests.support.stacks import Stack  # noqa: E402

WHEELHOUSE = Path(os.environ.get("TRAINSTACK_WHEELHOUSE", CACHE / "wheelhouse"))
CONFIG = {
    "train": "false",
    "workers": "1",
    "monitoring": "false",
    "baseImage": BASE_IMAGE,
    "wheelhouse": str(WHEELHOUSE),
    # Engine-picked host ports: no clash with a dev stack or the shared stack.
    "uiPortBase": "0",
    "monitoringPort": "0",
}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "provisioning: real provisioning runs against Docker containers (slow)"
    )
    config.addinivalue_line("markers", "unit: fast checks without containers")


def spark_auth_secret(stack: Stack) -> str:
    """The cluster's Spark auth secret, as the program gave it to provisioning: the value of
    its `spark-auth-secret` resource (infra/components/secret.py) in the stack's state."""
    state = json.loads(stack.run("stack", "export", "--show-secrets").stdout)
    for resource in state["deployment"].get("resources", []):
        if resource["urn"].endswith("::spark-auth-secret"):
            value = (resource.get("outputs") or {}).get("value")
            if isinstance(value, dict) and "plaintext" in value:  # a decrypted secret
                value = json.loads(value["plaintext"])
            if isinstance(value, str) and value:
                return value
            raise AssertionError(f"spark-auth-secret has no readable value: {value!r}")
    raise AssertionError("no spark-auth-secret resource in the stack's state")


@dataclass
class FirstRun:
    """The stack's first provisioning run, as the program reports it: the `provisioning`
    output (per-host stats, duration), the `pulumi up` that ran it (its streamed progress)
    and the runner's artifacts the program keeps (.artifacts/<stack>/ansible)."""

    up_output: str
    stats: dict[str, dict[str, int]]
    duration_s: float
    artifacts_dir: Path
    events: list[TaskEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """`pulumi up` succeeded (it fails when provisioning fails) and no host failed."""
        return bool(self.stats) and all(
            s.get("failures", 0) == 0 and s.get("unreachable", 0) == 0 for s in self.stats.values()
        )

    def changed(self) -> dict[str, int]:
        return {host: s.get("changed", 0) for host, s in self.stats.items()}

    def summary(self) -> str:
        return f"first provisioning in {self.duration_s:.0f}s: " + json.dumps(self.stats)


class Provisioned:
    """The stack and what the tests use of it.

    ``inventory``: the stack's `inventory` output (no secret in it); ``extravars``: what
    ``python -m infra.provisioning`` adds to it for the program (the wheelhouse, the Spark auth
    secret); ``nodes``: the `nodes` output; ``containers``: node name -> container name.
    """

    def __init__(self, stack: Stack, workdir: Path, up_output: str):
        self.stack = stack
        self.workdir = workdir
        self.outputs: dict[str, Any] = stack.outputs()
        self.name = stack.label  # engine-side names start with it
        self.nodes: list[dict[str, Any]] = self.outputs["nodes"]
        self.hosts = [n["name"] for n in self.nodes]
        self.containers = {n["name"]: n["container"] for n in self.nodes}
        # Numbers come back from the engine as floats (as the provisioning resource knows).
        self.inventory: dict[str, Any] = integral(self.outputs["inventory"])
        self.secret = spark_auth_secret(stack)
        self.extravars = {
            "trainstack_wheelhouse_dir": str(WHEELHOUSE),
            "trainstack_spark_auth_secret": self.secret,
        }
        provisioning = integral(self.outputs["provisioning"])
        self.first = FirstRun(
            up_output=up_output,
            stats=provisioning["hosts"],
            duration_s=float(provisioning["duration_s"]),
            artifacts_dir=REPO / ".artifacts" / stack.name / "ansible",
            events=streamed_events(up_output),
        )
        self.events = self.first.events

    def with_roles(self, role: str) -> list[str]:
        return [n["name"] for n in self.nodes if role in n["roles"]]

    def run(self, playbook: str = "site.yml", inventory: dict | None = None, **kwargs):
        """site.yml (or `playbook`) against the stack's nodes, as the program runs it: the
        same inventory, secret and wheelhouse, Mitogen on, the nodes' CPU limits lifted."""
        kwargs.setdefault("artifacts_dir", self.workdir / "runner")
        kwargs.setdefault("on_event", _print_event)
        kwargs["extravars"] = {**self.extravars, **(kwargs.get("extravars") or {})}
        # The stack's containers only: a test's inventory may name one that does not exist.
        with cpu_boost(sorted(self.containers.values())):
            result = run_playbook(inventory or self.inventory, playbook, **kwargs)
        print(result.summary(), file=sys.stderr)
        return result


def _print_event(event: TaskEvent) -> None:
    if event.status != "skipped":
        print(event, file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def provisioned(tmp_path_factory, engine):
    workdir = tmp_path_factory.mktemp("provisioning")
    stack = Stack(workdir / "state", prefix="tsprov")
    keep = os.environ.get("TRAINSTACK_KEEP_CLUSTER") == "1"
    try:
        stack.init(**CONFIG)
        # The nodes from the node image: provisioning configures them (install parts skipped).
        up = stack.run("up", "--yes", "--skip-preview", timeout=3600)
        print(up.stdout[-3000:], file=sys.stderr)
        yield Provisioned(stack, workdir, up.stdout + up.stderr)
    finally:
        if keep:
            print(
                f"kept stack {stack.name} ({stack.label}-*), state in {stack.backend}",
                file=sys.stderr,
            )
        else:
            stack.destroy_and_remove()
            shutil.rmtree(REPO / ".artifacts" / stack.name, ignore_errors=True)
