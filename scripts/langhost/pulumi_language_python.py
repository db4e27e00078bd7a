"""A Python language host for the Pulumi CLI (`pulumi-language-python`).

Why this exists: the Pulumi CLI finds the language host for `runtime: python` as a
separate plugin binary. Its Go module is not served by the module proxy this project
builds from, so setup installs this host instead. It speaks the same gRPC protocol
(`pulumirpc.LanguageRuntime`) and runs the program the same way the official host
does: through the SDK's own `pulumi-language-python-exec` launcher, with the stack's
config passed in `PULUMI_CONFIG` / `PULUMI_CONFIG_SECRET_KEYS`.

Scope: what `pulumi preview|up|destroy|refresh|stack` need for a Python program in a
ready virtual environment. Dependency installation is left to the project's setup
(`make setup`), so `InstallDependencies` only checks that the environment is usable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

VERSION = "3.274.1"  # reported to the CLI; kept equal to the CLI built by setup
# The exec launcher exits with 32 after it has shown the user an actionable message.
_EXIT_SHOWN_TO_USER = 32
# The SDK's launcher; setup puts it beside the CLI and the wrapper names it.
_EXEC_SCRIPT = Path(
    os.environ.get("PULUMI_LANGUAGE_PYTHON_EXEC")
    or Path(__file__).resolve().with_name("pulumi-language-python-exec")
)


def _options(info: language_pb2.ProgramInfo | None) -> dict:
    if info is None or not info.HasField("options"):
        return {}
    return {k: v for k, v in info.options.items()}


def _python(root: str, options: dict) -> str:
    """The interpreter for the program: `runtime.options.virtualenv` if set, else ours."""
    venv = options.get("virtualenv") or os.environ.get("PULUMI_RUNTIME_VIRTUALENV")
    if venv:
        path = Path(venv) if os.path.isabs(venv) else Path(root) / venv
        candidate = path / "bin" / "python"
        if not candidate.exists():
            raise FileNotFoundError(
                f"runtime.options.virtualenv is {venv!r} but {candidate} does not exist; "
                "run `make setup` to create the virtual environment"
            )
        return str(candidate)
    return sys.executable


class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
    def __init__(self, engine_address: str, root: str | None) -> None:
        self.engine_address = engine_address
        self.root = root
        self.program_dir: str | None = None
        self._children: set[subprocess.Popen] = set()

    def Handshake(self, request, context):  # noqa: N802 - gRPC method name
        self.engine_address = request.engine_address or self.engine_address
        if request.HasField("root_directory"):
            self.root = request.root_directory
        if request.HasField("program_directory"):
            self.program_dir = request.program_directory
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(self, request, context):  # noqa: N802
        return plugin_pb2.PluginInfo(version=VERSION)

    def GetRequiredPlugins(self, request, context):  # noqa: N802
        # Dynamic providers are hosted by `pulumi-resource-pulumi-python`, which the
        # engine resolves itself; the program needs no downloadable plugin.
        return language_pb2.GetRequiredPluginsResponse(plugins=[])

    def GetRequiredPackages(self, request, context):  # noqa: N802
        return language_pb2.GetRequiredPackagesResponse(packages=[])

    def InstallDependencies(self, request, context):  # noqa: N802
        root = request.info.root_directory if request.HasField("info") else self.root or "."
        python = _python(root, _options(request.info if request.HasField("info") else None))
        probe = subprocess.run(
            [python, "-c", "import pulumi"], capture_output=True, text=True, check=False
        )
        if probe.returncode != 0:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{python} cannot import pulumi ({probe.stderr.strip()[-300:]}); run `make setup`",
            )
        yield language_pb2.InstallDependenciesResponse(
            stdout=f"Using the environment of {python}\n".encode()
        )

    def About(self, request, context):  # noqa: N802
        version = subprocess.run(
            [sys.executable, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        return language_pb2.AboutResponse(
            executable=sys.executable, version=version.replace("Python ", "")
        )

    def GetProgramDependencies(self, request, context):  # noqa: N802
        out = subprocess.run(
            [sys.executable, "-m", "pip", "list", "--format=json"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        deps = [
            language_pb2.DependencyInfo(name=d["name"], version=d["version"])
            for d in json.loads(out or "[]")
        ]
        return language_pb2.GetProgramDependenciesResponse(dependencies=deps)

    def RuntimeOptionsPrompts(self, request, context):  # noqa: N802
        return language_pb2.RuntimeOptionsResponse()

    def Run(self, request, context):  # noqa: N802
        info = request.info if request.HasField("info") else None
        root = (info.root_directory if info else "") or self.root or request.pwd
        program_dir = (info.program_directory if info else "") or self.program_dir or request.pwd
        entry = (info.entry_point if info else "") or request.program or "."
        program = program_dir if entry in ("", ".") else os.path.join(program_dir, entry)
        try:
            python = _python(root, _options(info))
        except FileNotFoundError as exc:
            return language_pb2.RunResponse(error=str(exc))

        env = dict(os.environ)
        env["PULUMI_CONFIG"] = json.dumps(dict(request.config))
        env["PULUMI_CONFIG_SECRET_KEYS"] = json.dumps(list(request.configSecretKeys))
        env.pop("PYTHONHOME", None)
        args = [
            python,
            "-u",
            str(_EXEC_SCRIPT),
            "--monitor",
            request.monitor_address,
            "--engine",
            self.engine_address,
            "--project",
            request.project,
            "--root_directory",
            root,
            "--stack",
            request.stack,
            "--pwd",
            request.pwd or program_dir,
            "--dry_run",
            "true" if request.dryRun else "false",
            "--parallel",
            str(request.parallel),
            "--organization",
            request.organization,
            program,
            *request.args,
        ]
        # The program's stdout/stderr go to ours, which the engine shows to the user.
        child = subprocess.Popen(args, env=env, cwd=request.pwd or program_dir)
        self._children.add(child)
        try:
            code = child.wait()
        finally:
            self._children.discard(child)
        if code == 0:
            return language_pb2.RunResponse()
        if code == _EXIT_SHOWN_TO_USER:
            return language_pb2.RunResponse(bail=True)
        return language_pb2.RunResponse(error=f"Program exited with non-zero exit code: {code}")

    def Cancel(self, request, context):  # noqa: N802
        for child in list(self._children):
            child.send_signal(signal.SIGINT)
        return empty_pb2.Empty()


def main(argv: list[str]) -> int:
    positional = [a for a in argv if not a.startswith("-")]
    root = next((a.split("=", 1)[1] for a in argv if a.startswith("-root=")), None)
    engine = positional[-1] if positional else ""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", 400 * 1024 * 1024)],
    )
    host = LanguageHost(engine, root)
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(host, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    # The CLI reads the port from our first line of stdout.
    print(port, flush=True)
    # The CLI interrupts its plugins when it is done with them: stop quietly.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: server.stop(0))
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
