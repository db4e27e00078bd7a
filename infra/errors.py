"""Errors a user meets on a normal failure path: one message, the details in a log file.

Pulumi's dynamic-provider host reports any exception from a provider with its full Python
traceback (`traceback.format_exc()` in `pulumi.dynamic.__main__`). For the failures a user
is expected to meet (provisioning failed, training failed, an image did not bake) that is
noise: the provider raises `UserFacingError`, whose message names the node, the resource,
the cause and the log with the details, and `short_provider_errors()` makes the host
report that message alone. Any other exception keeps its traceback: that is a bug.

The program itself (`pulumi up`'s Python process) ends quietly when the engine cancels it,
see `quiet_cancellation()`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
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


# pulumi-language-python-exec's exit code for "the error has been shown to the user": the
# language host then adds no "program exited with non-zero exit code" of its own.
SHOWN_EXIT_CODE = 32
# What the SDK says when the engine has shut the resource monitor down (its UNAVAILABLE case).
MONITOR_SHUT_DOWN = "Resource monitor has terminated, shutting down"


def quiet_cancellation() -> None:
    """In the Pulumi program: when the engine cancels it, end without a traceback.

    When a resource fails (say a server's `Command` cannot connect) the engine cancels the
    program, and what the program has in flight then ends in one of two ways; each printed a
    Python traceback under the stack, depending on timing:

    - The engine stops the language host at once: it asks it to cancel the run, and the host
      sends the program SIGINT (pulumi/pulumi#21145), then the engine interrupts the host's
      process group. Python raises `KeyboardInterrupt` wherever the program is; the exec script
      (`pulumi-language-python-exec`) catches `Exception` only, so Python prints the whole
      chain, ending with the RPC error the program was handling. `exit_at_once` ends the
      program instead, with the exit code that tells the host the error has been shown: the
      engine reports the failed resource.
    - The program sees its pending RPCs fail first, see `cancelled_rpcs_are_shutdown`.

    Call it once, from the program's entry point only (not in tests: it takes over SIGINT).
    """
    cancelled_rpcs_are_shutdown()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, exit_at_once)


def cancelled_rpcs_are_shutdown() -> None:
    """Report a registration the engine cancelled as the SDK reports a monitor that shut down.

    A registration waiting for its step gets UNAVAILABLE, which the SDK turns into `RunError`
    (one line, no traceback). One still waiting for its default provider gets CANCELLED
    "context canceled" (the engine returns `context.Canceled`), which the SDK's
    `grpc_error_to_exception` turns into a plain `Exception`: the exec script reports it as
    "Program failed with an unhandled exception" with its traceback. Both mean the same.
    """
    # By module name: `pulumi.runtime.invoke` is also the name of a function of that package.
    for name in ("pulumi.runtime.settings", "pulumi.runtime.invoke"):
        module = importlib.import_module(name)
        convert = getattr(module, "grpc_error_to_exception", None)
        if convert is not None and not getattr(convert, "_cancelled_is_shutdown", False):
            module.grpc_error_to_exception = _cancelled_is_shutdown(convert)  # type: ignore[attr-defined]


def _cancelled_is_shutdown(convert: Callable[[Any], Exception]) -> Callable[[Any], Exception]:
    import grpc
    import pulumi

    def grpc_error_to_exception(exn: Any) -> Exception:
        if exn.code() == grpc.StatusCode.CANCELLED:
            return pulumi.RunError(MONITOR_SHUT_DOWN)
        return convert(exn)

    grpc_error_to_exception._cancelled_is_shutdown = True  # type: ignore[attr-defined]
    return grpc_error_to_exception


def exit_at_once(signum: int, frame: FrameType | None) -> None:
    """SIGINT handler of the program: flush what it printed and exit, no traceback."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(SHOWN_EXIT_CODE)


def write_details(log: Path, text: str) -> Path:
    """Append failure details (output tail, traceback) to `log`; returns its path."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(text.rstrip() + "\n")
    return log
