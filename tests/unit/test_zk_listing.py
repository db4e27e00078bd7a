"""The platform tests' reading of a zkCli `ls` (tests/support/outsiders.py): the client prints
its watcher's events from another thread, before, after or inside the listing."""

from __future__ import annotations

import pytest

from tests.support.outsiders import zk_listing

pytestmark = pytest.mark.unit

CONNECTED = "\nWATCHER::\n\nWatchedEvent state:SyncConnected type:None path:null zxid: -1\n"
SASL = "\nWATCHER::\n\nWatchedEvent state:SaslAuthenticated type:None path:null zxid: -1\n"


@pytest.mark.parametrize(
    "log",
    [
        f"Connecting to a:2181\n{CONNECTED}{SASL}[leader_election, master_status]\n",
        f"Connecting to a:2181\n{CONNECTED}[leader_election, master_status]\n{SASL}",
        # The event inside the listing (CI, 2026-12-07).
        f"Connecting to a:2181\n{CONNECTED}[leader_election{SASL}, master_status]\n",
    ],
    ids=["before", "after", "inside"],
)
def test_the_listing_is_read_wherever_the_watcher_s_events_land(log: str) -> None:
    assert zk_listing(log) == "[leader_election, master_status]"


def test_an_empty_listing_and_none_at_all() -> None:
    assert zk_listing(f"Connecting to a:2181\n{CONNECTED}[]\n") == "[]"
    assert zk_listing("Connecting to a:2181\nKeeperErrorCode = NoAuth for /spark\n") == ""
