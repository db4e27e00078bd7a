"""Fixtures for provisioning tests against real containers (``-m provisioning``).

One cluster of the default topology (3 control + 2 worker containers from the base image) is
created per session through the Docker API, provisioned once with playbooks/site.yml, shared by
all tests, and removed at the end (everything labelled ``trainstack.test=<name>``).

Its own cluster, not the suite's shared stack (tests/platform): it tests the full install from
the bare base image (the shared stack's nodes come from the baked image, where every install
task is `ok`), and the fault tests feed Ansible bad input directly.

Environment:
  TRAINSTACK_WHEELHOUSE   wheelhouse root on this machine (default ~/.cache/trainstack/wheelhouse)
  TRAINSTACK_KEEP_CLUSTER=1  keep the containers after the session (debugging)
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra.provisioning import run_playbook  # noqa: E402
from infra.provisioning.inventory import split_secrets  # noqa: E402
from infra.provisioning.wheelhouse import build_node_wheelhouse  # noqa: E402
from tests.support import cluster as cl  # noqa: E402

WHEELHOUSE = Path(os.environ.get("TRAINSTACK_WHEELHOUSE", cl.CACHE / "wheelhouse"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "provisioning: real provisioning runs against Docker containers (slow)"
    )
    config.addinivalue_line("markers", "unit: fast checks without containers")


class Provisioned:
    def __init__(self, cluster: cl.Cluster, workdir: Path):
        self.cluster = cluster
        self.workdir = workdir
        self.inventory = cluster.inventory(WHEELHOUSE)
        self.first = None
        self.events: list = []

    def run(self, playbook: str = "site.yml", inventory: dict | None = None, **kwargs):
        kwargs.setdefault("artifacts_dir", self.workdir / "runner")
        kwargs.setdefault("on_event", self._event)
        result = run_playbook(inventory or self.inventory, playbook, **kwargs)
        print(result.summary(), file=sys.stderr)
        return result

    def _event(self, event) -> None:
        self.events.append(event)
        if event.status != "skipped":
            print(event, file=sys.stderr, flush=True)

    def inventory_file(self) -> Path:
        """The inventory without secrets, for testinfra (--ansible-inventory)."""
        path = self.workdir / "inventory.json"
        inv, _ = split_secrets(self.inventory)
        path.write_text(json.dumps(inv))
        return path


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    try:
        return build_node_wheelhouse(WHEELHOUSE)
    except Exception as exc:
        pytest.fail(f"cannot build the wheelhouse at {WHEELHOUSE}: {exc}")


@pytest.fixture(scope="session")
def provisioned(wheelhouse, tmp_path_factory) -> Provisioned:
    name = f"tstest-{uuid.uuid4().hex[:6]}"
    try:
        cluster = cl.create(name)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    prov = Provisioned(cluster, tmp_path_factory.mktemp("provisioning"))
    try:
        prov.first = prov.run()
        yield prov
    finally:
        if os.environ.get("TRAINSTACK_KEEP_CLUSTER") != "1":
            cl.destroy(name)
