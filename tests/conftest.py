"""Fixtures shared by the engine and end-to-end tests, and a guard on the engine's disk."""

import docker
import pytest

from infra.images.bake import free_bytes

# What a whole run needs on the engine's disk at its peak: the newcomer's clone, wheelhouse
# and freshly baked image (about 9 GB) and a full-install cluster from the base image (about
# 5 GB), with room to spare. Below it, runs fail half-way with ENOSPC or hang; better to stop
# at once and say why.
MIN_FREE_GB = 25
_DISK_MARKERS = {
    "engine",
    "provisioning",
    "hosts",
    "e2e",
    "monitoring",
    "newcomer",
    "security",
    "drills",
}


def pytest_collection_modifyitems(session, config, items):
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
