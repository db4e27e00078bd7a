"""The provisioning CPU boost on the real engine: lifted inside, given back after."""

from __future__ import annotations

import uuid

import pytest

from infra.engine import cpu_boost
from tests.support.cluster import BASE_IMAGE

pytestmark = pytest.mark.engine


@pytest.fixture
def containers(engine):
    made = []
    for nano in (300_000_000, 0):  # one capped node, one without a limit
        made.append(
            engine.containers.run(
                BASE_IMAGE,
                ["sleep", "300"],
                detach=True,
                name=f"tsboost-{uuid.uuid4().hex[:6]}",
                nano_cpus=nano or None,
            )
        )
    yield made
    for c in made:
        c.remove(force=True)


def _nano(c) -> int:
    c.reload()
    return int(c.attrs["HostConfig"].get("NanoCpus") or 0)


def test_limits_are_lifted_inside_and_restored_after(engine, containers):
    capped, free = containers
    ncpu = int(engine.info()["NCPU"])
    with cpu_boost([capped.name, free.name]) as limits:
        assert limits == {capped.name: 0.3}
        assert _nano(capped) == ncpu * 1_000_000_000
        assert _nano(free) == 0
    assert _nano(capped) == 300_000_000
    assert _nano(free) == 0


def test_limits_are_restored_when_the_block_fails(containers):
    capped, _free = containers
    with pytest.raises(RuntimeError, match="provisioning failed"), cpu_boost([capped.name]):
        raise RuntimeError("provisioning failed")
    assert _nano(capped) == 300_000_000
