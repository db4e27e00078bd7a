"""High availability: stop the ALIVE master's container; a standby takes over and every worker
re-registers with it. Runs last: it leaves the stack with one master."""

from __future__ import annotations

import sys

import pytest

from tests.support.failover import measure_failover

pytestmark = pytest.mark.provisioning


def test_standby_takes_over_and_workers_reregister(provisioned):
    assert provisioned.first.ok
    masters = {m: provisioned.containers[m] for m in provisioned.with_roles("spark_master")}
    workers = provisioned.with_roles("spark_worker")
    old, new, seconds = measure_failover(masters, len(workers))
    print(f"FAILOVER {old} -> {new} in {seconds:.1f}s", file=sys.stderr)
    assert new != old
    assert seconds < 30, f"failover took {seconds:.1f}s"
