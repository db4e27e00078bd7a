"""Expected failures reach the user as one message; unexpected ones keep their traceback."""

from __future__ import annotations

import sys
import traceback
import types

import pytest

from infra.errors import UserFacingError, short_provider_errors

pytestmark = pytest.mark.unit


@pytest.fixture
def provider_host(monkeypatch):
    """A stand-in for `pulumi.dynamic.__main__`, the module that formats provider errors."""
    host = types.ModuleType("__main__")
    host._abort_with_traceback = lambda fn: fn  # what identifies the real host
    host.traceback = traceback
    monkeypatch.setitem(sys.modules, "__main__", host)
    return host


def test_outside_the_provider_host_nothing_changes():
    assert short_provider_errors() is False


def test_user_facing_errors_are_their_message_alone(provider_host):
    assert short_provider_errors() is True
    try:
        raise UserFacingError("training job on worker-1 failed (exit 1): boom; job output: /x")
    except UserFacingError:
        text = provider_host.traceback.format_exc()
    assert text == "training job on worker-1 failed (exit 1): boom; job output: /x"


def test_other_errors_keep_their_traceback(provider_host):
    short_provider_errors()
    short_provider_errors()  # idempotent
    try:
        raise KeyError("bug")
    except KeyError:
        text = provider_host.traceback.format_exc()
    assert text.startswith("Traceback (most recent call last):")
    assert "KeyError: 'bug'" in text
