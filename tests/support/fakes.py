"""A fake worker node for unit tests of the launch paths (no engine): it records the commands
it is given, answers `pgrep` with `pids`, and ends every streamed training command with a
successful summary line."""

from __future__ import annotations

import json

from infra.transport import Transport, TransportError


class SubmittingNode(Transport):
    """A worker node that can submit; records the commands it is given."""

    name = "ts-worker-1"

    def __init__(self, run_dir: str = "", pids: bytes = b"") -> None:
        self.run_dir, self.pids = run_dir, pids
        self.ran: list[list[str]] = []
        self.streamed: list[list[str]] = []
        self.written: dict[str, bytes] = {}  # put's files by path

    def unavailable(self) -> str | None:
        return None

    def run(self, argv, *, user=None, env=None, stdin=None):
        self.ran.append(argv)
        if argv[0] == "pgrep":
            return (0 if self.pids else 1), self.pids
        return 0, b""

    def stream(self, argv, *, env=None, user=None):
        self.streamed.append(argv)
        summary = {"ok": True, "final_val_accuracy": 0.97, "epochs": 8}
        return 0, "validation accuracy 0.97\n" + json.dumps(summary) + "\n"

    def fetch(self, path):
        if path.endswith(("model.keras", "metrics.json")):
            return b"{}"
        raise TransportError(f"{self.name}: cannot read {path} (missing)")

    def put(self, path, data, mode=0o644, user=None):
        self.written[path] = bytes(data)

    def copy_command(self, path):
        return f"docker cp {self.name}:{path} ."
