"""Fixtures shared by the engine and end-to-end tests, a guard on the engine's disk, the order
the tiers run in, and each module's wall time at the end of the run."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import docker
import pytest

from infra.images.bake import free_bytes

# What a whole run needs on the engine's disk at its peak: the newcomer's clone, wheelhouse
# and freshly baked image (about 9 GB) and a full-install cluster from the base image (about
# 5 GB), with room to spare. Below it, runs fail half-way with ENOSPC or hang; better to stop
# at once and say why. The testinfra checks (marker `hosts`) build nothing: a stack's test runs
# them in a nested pytest, whose own guard must not stop them on a disk the outer run is using.
MIN_FREE_GB = 25
_DISK_MARKERS = {
    "engine",
    "provisioning",
    "e2e",
    "monitoring",
    "newcomer",
    "security",
    "drills",
}


# The order the suite runs in, cheapest first, so a mistake shows within minutes instead of after
# an hour (collection alone would be alphabetical). The newcomer test comes first among the
# engine tests: its `make up` bakes this tree's node image (it removes it first, as a new
# machine has none), and every later stack reuses that image instead of baking it again.
# The platform package shares one stack and orders its own modules (tests/platform/conftest.py).
ORDER = (
    "tests/unit/",
    "tests/images/test_digest.py",
    "tests/provisioning/test_unit.py",
    "tests/training/",
    "tests/newcomer/",
    "tests/integration/",
    "tests/images/",
    "tests/provisioning/",
    "tests/platform/",
    "tests/ssh/",
)


def tier(nodeid: str) -> int:
    """The place of a test's module in ORDER (modules not listed run last, in their order)."""
    return next((i for i, prefix in enumerate(ORDER) if nodeid.startswith(prefix)), len(ORDER))


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: tier(item.nodeid))  # stable: a module keeps its own order
    if not any(_DISK_MARKERS & {m.name for m in item.iter_markers()} for item in items):
        return
    try:
        found = free_bytes(docker.from_env())
    except Exception:
        return  # no engine: the `engine` fixture fails the tests that need it, with the reason
    if found is None:
        return  # an engine on another machine: its disk is not ours to measure
    root, free = found
    free_gb = free / 1024**3
    if free_gb < MIN_FREE_GB:
        pytest.exit(
            f"only {free_gb:.1f} GB are free under the Docker engine's data root {root}; the "
            f"engine tests need {MIN_FREE_GB} GB: remove node images of other digests with "
            "`make clean-images` (and old stacks with `make destroy`), then run the tests again",
            returncode=1,
        )


@pytest.fixture(scope="session")
def engine():
    """The Docker engine; these tests need it and fail (not skip) without it."""
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.fail(f"the Docker engine does not answer ({exc}); run `make setup` first")
    return client


# Wall time per module (setup, call and teardown of its tests, module fixtures included).
_MODULE_SECONDS: dict[str, float] = defaultdict(float)
_MODULE_STARTED = time.monotonic()


def pytest_runtest_logreport(report):
    _MODULE_SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    total = round(time.monotonic() - _MODULE_STARTED)
    write_times(terminalreporter, total)
    if not _MODULE_SECONDS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("wall time per module")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: tier(kv[0])):
        minutes, rest = divmod(round(seconds), 60)
        write(f"{minutes:4d}:{rest:02d}  {module}")
    write(f"{total // 60:4d}:{total % 60:02d}  (the whole session, collection included)")


def write_times(terminalreporter, total: int) -> None:
    """Per-module wall times and the counts into $TRAINSTACK_TIMES_FILE, for the CI time table
    (scripts/testplan.py sets it for each stream it runs)."""
    path = os.environ.get("TRAINSTACK_TIMES_FILE")
    if not path:
        return
    counts = {
        key: len(terminalreporter.stats.get(key, []))
        for key in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    }
    modules = {
        module: round(seconds, 1)
        for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: tier(kv[0]))
    }
    Path(path).write_text(json.dumps({"modules": modules, "counts": counts, "seconds": total}))
