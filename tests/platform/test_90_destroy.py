"""`pulumi destroy` leaves nothing of the shared stack on the engine. Runs last."""

from __future__ import annotations

import pytest

from tests.support.stacks import engine_objects

pytestmark = pytest.mark.e2e


def test_destroy_leaves_nothing_of_the_stack(platform):
    stack = platform.stack
    stack.run("destroy", "--yes")
    assert engine_objects(stack.label) == {"containers": [], "networks": [], "volumes": []}
