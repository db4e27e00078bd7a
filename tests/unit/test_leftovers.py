"""`make clean-test-stacks` removes only what the tests create."""

from __future__ import annotations

import pytest

from tests.support.leftovers import is_test_object

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "labels",
    [
        {"org.trainstack.stack": "tsmon-t5ae624"},
        {"org.trainstack.stack": "tsit-t0a1b2c"},
        {"org.trainstack.stack": "tsbjvm-tffffff"},
        {"org.trainstack.stack": "trainstack-newcomer-0a1b2c"},
        {"trainstack.test": "tstest-123abc"},
        {"org.trainstack.test-sshd": "tsssh"},
    ],
)
def test_test_objects_are_recognised(labels):
    assert is_test_object(labels)


@pytest.mark.parametrize(
    "labels",
    [
        None,
        {},
        {"org.trainstack.stack": "trainstack-dev"},
        {"org.trainstack.stack": "trainstack-t5ae624"},
        {"org.trainstack.stack": "tsmon-prod"},
        {"org.trainstack.stack": "tsmon-t5ae624-extra"},
        {"org.trainstack.stack": "trainstack-newcomer"},
        {"org.trainstack.stack": "trainstack-newcomer-0a1b2c3"},
        {"org.trainstack.project": "trainstack"},
    ],
)
def test_other_objects_are_left_alone(labels):
    assert not is_test_object(labels)
