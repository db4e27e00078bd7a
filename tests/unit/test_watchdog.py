"""The no-progress timeout of a rank (trainstack_training.watchdog) with real threads: it
fires after the timeout with every thread's stack on file, a touch keeps it quiet, 0 is off."""

from __future__ import annotations

import threading
import time

import pytest
from trainstack_training.watchdog import Watchdog

pytestmark = pytest.mark.unit


def stuck_in_user_code(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.05)


def test_no_progress_fails_the_rank_with_every_threads_stack(tmp_path):
    fired: list[str] = []
    stop = threading.Event()
    user = threading.Thread(target=stuck_in_user_code, args=(stop,))
    user.start()
    try:
        with Watchdog(0.5, tmp_path, 3, fired.append):
            deadline = time.monotonic() + 10
            while not fired and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        stop.set()
        user.join()
    (message,) = fired
    assert message.startswith("no progress for 0.5 s on rank 3")
    stacks = (tmp_path / "stacks-rank3.txt").read_text()
    assert str(tmp_path / "stacks-rank3.txt") in message
    assert "stuck_in_user_code" in stacks and "test_watchdog.py" in stacks


def test_progress_keeps_it_quiet_and_zero_turns_it_off(tmp_path):
    fired: list[str] = []
    with Watchdog(0.5, tmp_path, 0, fired.append) as watchdog:
        for _ in range(15):  # 1.5 s, three timeouts long, touched every 0.1 s
            time.sleep(0.1)
            watchdog.touch()
    with Watchdog(0, tmp_path, 1, fired.append):
        time.sleep(0.3)
    assert fired == [] and not list(tmp_path.iterdir())
