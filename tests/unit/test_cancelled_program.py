"""A failed resource ends `pulumi up` with its one-line error, never a traceback (issue 28).

When a resource fails, the engine cancels the program while it still has registrations in
flight, and stops the language host at once, which sends the program SIGINT. Without
`infra.errors.quiet_cancellation()` the program printed a traceback under the stack: a
`KeyboardInterrupt` chain (the SIGINT came first), or "Program failed with an unhandled
exception ... StatusCode.CANCELLED ... context canceled" (the program reported a registration
that had been waiting for its default provider). The engine tests force each case with a
small program, the real CLI and a file backend (no Docker), a few seconds each.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pulumi
import pytest

from infra import errors
from tests.support.stacks import ROOT, project_env

# What infra/__main__.py does before the program: the programs below start the same way.
HEAD = """\
import asyncio
import signal

import pulumi
import pulumi_command as command

from infra.errors import quiet_cancellation

quiet_cancellation()
"""

# A server that cannot be reached: its Command fails at once, and the engine cancels the
# program while registrations keep coming (every 10 ms, for up to 4 s).
COMMAND_FAILS = """\
command.local.Command(
    "server-wrk-9",
    create="echo 'trainstack: server wrk-9 (deploy@192.0.2.9:2): cannot connect' >&2; exit 1",
)


async def keep_registering():
    for i in range(400):
        command.local.Command(f"later-{i}", create="true")
        await asyncio.sleep(0.01)
    return 400


pulumi.export("later", pulumi.Output.from_input(keep_registering()))
"""

# A registration that waits for its default provider when the engine cancels: the provider
# (a version that is not installed) fails, and the engine answers the registration CANCELLED
# "context canceled", the error of issue 28. The program ignores SIGINT, so that it reports
# its failed RPCs itself before the engine stops it.
PROVIDER_FAILS = """\
signal.signal(signal.SIGINT, signal.SIG_IGN)
waiting = command.local.Command(
    "waiting", create="true", opts=pulumi.ResourceOptions(version="0.0.1")
)
# The stack's outputs wait for it too: nothing else is in flight when the engine cancels.
pulumi.export("waiting", waiting.urn)
"""
PROVIDER_ERROR = "no resource plugin 'pulumi-resource-command' found"


def up(tmp_path: Path, program: str) -> str:
    """`pulumi up` of a new stack running `program`: its output (the up must fail)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: cancelled\nruntime: python\n")
    (project / "__main__.py").write_text(program)
    (tmp_path / "state").mkdir()
    env = project_env(tmp_path / "state")
    env["PYTHONPATH"] = str(ROOT)
    env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] = "true"

    def pulumi_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pulumi", *args, "--stack", "cancelled", "--non-interactive"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    init = pulumi_cli("stack", "init")
    assert init.returncode == 0, init.stdout + init.stderr
    proc = pulumi_cli("up", "--yes", "--skip-preview")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    return text


def assert_no_traceback(text: str) -> None:
    for noise in ("Traceback", "KeyboardInterrupt", "context canceled", "Program failed"):
        assert noise not in text, text[-6000:]


@pytest.mark.engine
def test_a_failed_command_ends_the_up_with_its_error_alone(tmp_path):
    text = up(tmp_path, HEAD + COMMAND_FAILS)
    assert "trainstack: server wrk-9 (deploy@192.0.2.9:2): cannot connect" in text, text
    assert_no_traceback(text)


@pytest.mark.engine
def test_a_registration_the_engine_cancels_is_reported_in_one_line(tmp_path):
    text = up(tmp_path, HEAD + PROVIDER_FAILS)
    assert PROVIDER_ERROR in text, text
    assert_no_traceback(text)
    assert f"error: {errors.MONITOR_SHUT_DOWN}" in text, text  # what the SDK says for UNAVAILABLE


class _RpcError(grpc.RpcError):
    """What a failed unary gRPC call raises: an error that is also the call."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.fixture
def sdk_modules(monkeypatch):
    """The SDK modules `cancelled_rpcs_are_shutdown` changes, restored after the test."""
    modules = [importlib.import_module(f"pulumi.runtime.{m}") for m in ("settings", "invoke")]
    for module in modules:
        monkeypatch.setattr(module, "grpc_error_to_exception", module.grpc_error_to_exception)
    return modules


@pytest.mark.unit
def test_a_cancelled_rpc_is_the_sdk_shutdown_error(sdk_modules):
    settings, invoke = sdk_modules
    cancelled = _RpcError(grpc.StatusCode.CANCELLED, "context canceled")
    with pytest.raises(Exception, match="context canceled") as before:
        settings.handle_grpc_error(cancelled)
    assert not isinstance(before.value, pulumi.RunError)  # what the SDK does alone
    errors.cancelled_rpcs_are_shutdown()
    errors.cancelled_rpcs_are_shutdown()  # idempotent
    # handle_grpc_error is what register_resource, read_resource, invoke and call use.
    with pytest.raises(pulumi.RunError, match=errors.MONITOR_SHUT_DOWN):
        settings.handle_grpc_error(cancelled)
    shutdown = invoke.grpc_error_to_exception(cancelled)
    assert isinstance(shutdown, pulumi.RunError), shutdown
    # Other codes keep the SDK's answers: UNAVAILABLE its RunError, the rest their details.
    unavailable = settings.grpc_error_to_exception(_RpcError(grpc.StatusCode.UNAVAILABLE, "x"))
    assert isinstance(unavailable, pulumi.RunError)
    other = invoke.grpc_error_to_exception(_RpcError(grpc.StatusCode.INTERNAL, "bad input"))
    assert type(other) is Exception and str(other) == "bad input"


@pytest.mark.unit
def test_sigint_ends_the_program_at_once_without_a_traceback():
    script = textwrap.dedent(
        """
        import os, signal, time
        from infra.errors import quiet_cancellation
        quiet_cancellation()
        print("printed before", end="")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
        print("not reached")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == errors.SHOWN_EXIT_CODE, proc
    assert proc.stdout == "printed before", proc
    assert proc.stderr == "", proc


@pytest.mark.unit
def test_the_program_entry_point_calls_it_before_the_program():
    tree = ast.parse((ROOT / "infra" / "__main__.py").read_text())
    calls = [
        node.value.func.id
        for node in tree.body
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
    ]
    assert calls == ["quiet_cancellation", "main"], calls
