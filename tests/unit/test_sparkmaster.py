"""What the warm runner and a waiting job read of the ALIVE master's JSON page
(trainstack_training.sparkmaster): who holds the cores, who waits for them, and which master
of a multi-master URL answers as ALIVE."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from trainstack_training.sparkmaster import (
    Application,
    MasterView,
    alive_master,
    master_hosts,
    parse,
    waiting_for_cores,
)

pytestmark = pytest.mark.unit

OWN = "app-20261204100000-0000"


def app(app_id: str, cores: int, state: str, memory: int = 1024, name: str = "") -> dict:
    return {
        "id": app_id, "name": name or app_id, "cores": cores, "state": state,
        "memoryperexecutor": memory, "user": "trainstack",
    }  # fmt: skip


def page(apps: list[dict], free: int = 0, memory: int = 1024, status: str = "ALIVE") -> dict:
    """A master's /json/ page as Spark 4 writes it (two ALIVE workers, one DEAD)."""
    workers = [
        {"id": "w1", "state": "ALIVE", "cores": 1, "coresfree": free, "memory": memory},
        {"id": "w2", "state": "ALIVE", "cores": 1, "coresfree": 0, "memory": memory},
        {"id": "w3", "state": "DEAD", "cores": 1, "coresfree": 1, "memory": 8192},
    ]
    return {"status": status, "workers": workers, "activeapps": apps, "completedapps": []}


def view(apps: list[dict], **kwargs: Any) -> MasterView:
    return parse("http://m1:8080/json/", page(apps, **kwargs))


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        ("spark://master-1:7077,master-2:7077", ["master-1", "master-2"]),
        ("spark://10.0.0.5:7077", ["10.0.0.5"]),
        ("spark://m1", ["m1"]),
        ("local[2]", []),
        ("yarn", []),
    ],
)
def test_the_masters_of_a_url(url: str, hosts: list[str]) -> None:
    assert master_hosts(url) == hosts


def test_an_application_that_waits_gets_the_idle_holders_cores() -> None:
    seen = view([app(OWN, 2, "RUNNING"), app("app-x", 0, "WAITING", name="etl")])
    other = waiting_for_cores(seen, OWN)
    assert other is not None and other.id == "app-x"
    assert str(other) == "application app-x (etl)"


def test_one_on_fewer_cores_than_it_could_take_counts_when_no_core_is_free() -> None:
    running = [app(OWN, 1, "RUNNING"), app("app-x", 1, "RUNNING")]
    assert waiting_for_cores(view(running, free=0), OWN) == Application(
        "app-x", "app-x", 1, "RUNNING", 1024
    )
    # A free core somewhere: the other application could have taken it; it has what it wants.
    assert waiting_for_cores(view(running, free=1), OWN) is None


@pytest.mark.parametrize(
    ("apps", "why"),
    [
        ([app(OWN, 2, "RUNNING")], "nobody else"),
        ([app(OWN, 0, "WAITING"), app("app-x", 0, "WAITING")], "the holder holds nothing"),
        ([app("app-x", 0, "WAITING")], "the holder is not on this master"),
        ([app(OWN, 2, "RUNNING"), app("app-x", 0, "WAITING", memory=4096)], "never fits"),
    ],
)
def test_no_yield(apps: list[dict], why: str) -> None:
    assert waiting_for_cores(view(apps), OWN) is None, why


def test_holders_are_the_others_with_cores_the_largest_first() -> None:
    seen = view([app(OWN, 0, "WAITING"), app("app-a", 1, "RUNNING"), app("app-b", 3, "RUNNING"),
                 app("app-c", 0, "WAITING")])  # fmt: skip
    assert [a.id for a in seen.holders(OWN)] == ["app-b", "app-a"]
    assert seen.free_cores == 0 and seen.worker_memory_mb == (1024, 1024)  # the DEAD one left out


class _Master(BaseHTTPRequestHandler):
    pages: dict[str, dict] = {}

    def do_GET(self) -> None:
        body = json.dumps(self.pages[self.server.server_address[0]]).encode()  # type: ignore[index]
        self.send_response(200 if self.path == "/json/" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def masters() -> Iterator[int]:
    """Two masters' web UIs on one port: 127.0.0.1 STANDBY, 127.0.0.2 ALIVE."""
    _Master.pages = {
        "127.0.0.1": page([], status="STANDBY"),
        "127.0.0.2": page([app(OWN, 2, "RUNNING"), app("app-x", 0, "WAITING")]),
    }
    first = ThreadingHTTPServer(("127.0.0.1", 0), _Master)
    port = first.server_address[1]
    second = ThreadingHTTPServer(("127.0.0.2", port), _Master)
    for server in (first, second):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield port
    finally:
        for server in (first, second):
            server.shutdown()
            server.server_close()


def test_the_alive_master_is_the_one_asked(masters: int) -> None:
    seen = alive_master("spark://127.0.0.1:7077,127.0.0.2:7077", masters)
    assert seen is not None and seen.url == f"http://127.0.0.2:{masters}/json/"
    assert [a.id for a in seen.apps] == [OWN, "app-x"]


def test_no_alive_master_is_none(masters: int) -> None:
    assert alive_master("spark://127.0.0.1:7077", masters) is None  # STANDBY only
    assert alive_master("spark://127.0.0.3:7077", masters, timeout=0.5) is None  # nobody
    assert alive_master("local[2]", masters) is None
