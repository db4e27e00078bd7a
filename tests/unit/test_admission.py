"""The queue's rule (trainstack_training.admission): FIFO, a job admitted only when its ranks
fit, a large job never starved by small ones behind it, priority ahead but never pre-empting."""

from __future__ import annotations

import pytest
from trainstack_training.queue.admission import decide

pytestmark = pytest.mark.unit

NOW = 1000.0


def job(id_, workers=1, submitted=0.0, state="queued", slots=0, beat=NOW, priority=0):
    return {"id": id_, "workers": workers, "submitted_at": submitted, "state": state,
            "slots": slots, "heartbeat": beat, "priority": priority}  # fmt: skip


def test_two_one_worker_jobs_fit_two_slots_together():
    a = job("a", submitted=1, state="running", slots=1)
    verdict = decide(job("b", submitted=2), [a], capacity=2, now=NOW)
    assert verdict.admitted and verdict.free == 1


def test_a_job_that_does_not_fit_waits_and_says_for_what():
    a = job("a", submitted=1, state="running", slots=1)
    verdict = decide(job("b", workers=2, submitted=2), [a], capacity=2, now=NOW)
    assert not verdict.admitted
    assert verdict.reason == "queued: first in line; needs 2 slots, 1 of 2 free (held by a 1)"


def test_a_large_job_first_in_line_holds_back_small_ones_behind_it():
    """The small job would fit the free slot, but it would delay the large one: it waits."""
    running = job("a", submitted=1, state="running", slots=1)
    large = job("big", workers=2, submitted=2)
    small = job("small", submitted=3)
    verdict = decide(small, [running, large], capacity=2, now=NOW)
    assert not verdict.admitted and verdict.ahead == ("big",)
    assert verdict.reason == "queued: 1 job ahead (big); needs 1 slot, 1 of 2 free"
    # Once the running job ends, the large one goes first.
    ended = {**running, "state": "succeeded"}
    assert decide(large, [ended, small], capacity=2, now=NOW).admitted
    assert not decide(small, [ended, large], capacity=2, now=NOW).admitted


def test_priority_goes_ahead_of_earlier_jobs_but_never_pre_empts():
    running = job("a", workers=2, submitted=1, state="running", slots=2)
    early = job("early", submitted=2)
    urgent = job("urgent", submitted=3, priority=5)
    assert not decide(urgent, [running, early], capacity=2, now=NOW).admitted  # no pre-emption
    ended = {**running, "state": "failed"}
    assert decide(urgent, [ended, early], capacity=2, now=NOW).admitted
    verdict = decide(early, [ended, urgent], capacity=2, now=NOW)
    assert not verdict.admitted and verdict.ahead == ("urgent",)


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_an_ended_job_holds_no_slot(state):
    ended = job("a", workers=2, state=state, slots=2)
    assert decide(job("b", workers=2), [ended], capacity=2, now=NOW).admitted


def test_a_job_whose_queue_process_stopped_beating_holds_nothing_and_keeps_no_place():
    lost_holder = job("lost", workers=2, state="running", slots=2, beat=NOW - 60)
    lost_waiter = job("gone", submitted=0, beat=NOW - 60)
    assert decide(job("b", workers=2, submitted=5), [lost_holder, lost_waiter], 2, NOW).admitted


def test_an_admitted_job_waiting_for_cores_keeps_its_slots_and_is_not_in_line():
    """A running job whose Spark application waits for another application's cores is shown
    `queued` (waiting_for), but it was admitted: it holds its slots and is not ahead of anyone."""
    admitted = job("a", workers=1, submitted=1, state="queued", slots=1)
    verdict = decide(job("b", submitted=2), [admitted], capacity=1, now=NOW)
    assert not verdict.admitted and verdict.ahead == ()
    assert verdict.reason == "queued: first in line; needs 1 slot, 0 of 1 free (held by a 1)"


def test_an_installing_job_does_not_hold_the_queue():
    installing = job("inst", submitted=1, state="installing")
    assert decide(job("b", workers=2, submitted=2), [installing], capacity=2, now=NOW).admitted
