"""Errors a user meets on a normal failure path: one message, the details in a log file.

Pulumi's dynamic-provider host reports any exception from a provider with its full Python
traceback (`traceback.format_exc()` in `pulumi.dynamic.__main__`). For the failures a user
is expected to meet (provisioning failed, training failed, an image did not bake) that is
noise: the provider raises `UserFacingError`, whose message names the node, the resource,
the cause and the log with the details, and `short_provider_errors()` makes the host
report that message alone. Any other exception keeps its traceback: that is a bug.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any


class UserFacingError(RuntimeError):
    """An expected failure, reported as its message alone (no traceback)."""


class _ShortTracebacks:
    """Stands in for the `traceback` module inside the dynamic-provider host only."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def format_exc(self, *args: Any, **kwargs: Any) -> str:
        exc = sys.exc_info()[1]
        if isinstance(exc, UserFacingError):
            return str(exc)
        return self._real.format_exc(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def short_provider_errors() -> bool:
    """In the dynamic-provider host, report `UserFacingError`s without a traceback.

    Returns whether the host was found (it is not, under the program or in tests).
    """
    host = sys.modules.get("__main__")
    if host is None or not hasattr(host, "_abort_with_traceback"):
        return False
    if not isinstance(getattr(host, "traceback", None), _ShortTracebacks):
        host.traceback = _ShortTracebacks(traceback)  # type: ignore[attr-defined]
    return True


def write_details(log: Path, text: str) -> Path:
    """Append failure details (output tail, traceback) to `log`; returns its path."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(text.rstrip() + "\n")
    return log
