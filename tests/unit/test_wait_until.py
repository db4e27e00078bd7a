"""The tests' `wait_until` (tests/support/stacks.py): the check's first truthy value; a check
that raises is tried again, and when time runs out the failure says what the check last
raised, chained to it, instead of losing the cause."""

from __future__ import annotations

import pytest

from tests.support.stacks import wait_until

pytestmark = pytest.mark.unit


def test_the_first_truthy_value_after_falsy_and_raising_tries():
    tries: list[int] = []

    def check() -> list[int]:
        tries.append(1)
        if len(tries) == 1:
            raise OSError("not there yet")
        return [] if len(tries) == 2 else [7]

    assert wait_until("the value", check, timeout=30, every=0) == [7]
    assert len(tries) == 3


def test_the_timeout_names_and_chains_the_checks_last_exception():
    calls: list[int] = []

    def check() -> int:
        calls.append(1)
        raise KeyError(f"no row {len(calls)}")

    with pytest.raises(AssertionError) as failed:
        wait_until("the row", check, timeout=0.2, every=0.01)
    said = str(failed.value)
    assert said.startswith("the row: not within 0 s"), said
    assert f"{len(calls)} of {len(calls)} tries raised" in said, said
    assert f"the last KeyError: 'no row {len(calls)}'" in said, said
    cause = failed.value.__cause__
    assert isinstance(cause, KeyError) and cause.args == (f"no row {len(calls)}",), cause


def test_a_check_that_only_returned_falsy_names_its_last_value_and_no_exception():
    with pytest.raises(AssertionError) as failed:
        wait_until("a count", lambda: 0, 0.1, every=0.01)
    assert str(failed.value) == "a count: not within 0 s (last: 0)"
    assert failed.value.__cause__ is None


def test_up_to_doubles_the_pause_after_each_try(monkeypatch):
    import tests.support.stacks as stacks

    pauses: list[float] = []
    monkeypatch.setattr(stacks.time, "sleep", pauses.append)
    tries: list[int] = []

    def check() -> bool:
        tries.append(1)
        return len(tries) == 6

    assert wait_until("the fifth pause", check, timeout=30, every=0.5, up_to=5.0)
    assert pauses == [0.5, 1.0, 2.0, 4.0, 5.0]
