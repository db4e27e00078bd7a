"""Ansible's progress as a `pulumi up` streams it: one line per host and task
(`infra.provisioning.TaskEvent.__str__`), read back into events."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from infra.provisioning import TaskEvent

ROOT = Path(__file__).resolve().parents[2]
# A progress line of the provisioning child (TaskEvent.__str__), as Pulumi streams it.
EVENT_LINE = re.compile(
    r"\[(?P<host>[A-Za-z0-9_.-]+)\] (?P<status>ok|changed|failed|unreachable|skipped) +"
    r"(?P<task>\S.*?)(?: :: .*)?(?: \(ignored\))?\s*$",
    re.M,
)


def streamed_events(output: str) -> list[TaskEvent]:
    """The per-host, per-task progress lines in a `pulumi up`'s output, each once, in order
    (Pulumi may show a line in the update's stream and again under its diagnostics)."""
    seen: dict[tuple[str, str, str], TaskEvent] = {}
    for m in EVENT_LINE.finditer(output):
        key = (m["host"], m["status"], m["task"].strip())
        seen.setdefault(key, TaskEvent(host=key[0], task=key[2], status=key[1]))
    return list(seen.values())


def role_tasks(part: str) -> set[str]:
    """The names of the roles' tasks in `part` (`install.yml` or `configure.yml`)."""
    names: set[str] = set()
    for path in (ROOT / "roles").glob(f"*/tasks/{part}"):
        names |= {t["name"] for t in yaml.safe_load(path.read_text()) or [] if "name" in t}
    return names
