"""Run a provisioning playbook through ansible-runner's Python API.

``run_playbook`` takes the inventory (built from the Pulumi outputs), runs a playbook from
``playbooks/``, streams task progress to ``on_event`` as it happens, keeps ansible-runner's
artifacts folder for debugging and returns per-host stats plus the failures (host, task, cause).

Secrets (``inventory.SECRET_VARS`` found in the inventory or in ``extravars``) go to
``<private_data_dir>/env/extravars`` with mode 0600 and the file is deleted after the run; they
never appear on a command line, in the inventory file or in the events streamed to the caller
(tasks handling them are ``no_log``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from .inventory import SECRET_VARS, split_secrets

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS_DIR = REPO_ROOT / "playbooks"
ROLES_DIR = REPO_ROOT / "roles"
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"

_STATUS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
    "runner_item_on_failed": "failed",
}


@dataclass(frozen=True)
class TaskEvent:
    """One task result on one host, as it happens."""

    host: str
    task: str
    status: str  # ok | changed | failed | unreachable | skipped
    message: str = ""
    ignored: bool = False

    def __str__(self) -> str:
        text = f"[{self.host}] {self.status:<11} {self.task}"
        if self.message and self.status in {"failed", "unreachable"}:
            text += f" :: {self.message}"
        return text + (" (ignored)" if self.ignored else "")


@dataclass(frozen=True)
class Failure:
    host: str
    task: str
    message: str
    unreachable: bool = False

    def __str__(self) -> str:
        kind = "unreachable" if self.unreachable else "failed"
        return f"host {self.host}: task '{self.task}' {kind}: {self.message}"


@dataclass
class ProvisionResult:
    ok: bool
    status: str  # ansible-runner status: successful | failed | timeout | canceled
    rc: int | None
    stats: dict[str, dict[str, int]]  # host -> {ok, changed, failures, unreachable, skipped, ...}
    failures: list[Failure] = field(default_factory=list)
    artifacts_dir: Path | None = None
    duration_s: float = 0.0

    def changed(self) -> dict[str, int]:
        return {host: s.get("changed", 0) for host, s in self.stats.items()}

    def summary(self) -> str:
        lines = [f"provisioning {self.status} in {self.duration_s:.0f}s"]
        lines[0] += f" (artifacts: {self.artifacts_dir})"
        for host, s in sorted(self.stats.items()):
            lines.append(
                f"  {host}: ok={s.get('ok', 0)} changed={s.get('changed', 0)} "
                f"failed={s.get('failures', 0)} "
                f"unreachable={s.get('unreachable', 0)} skipped={s.get('skipped', 0)}"
            )
        lines.extend(f"  FAILED {f}" for f in self.failures)
        return "\n".join(lines)


class ProvisioningError(RuntimeError):
    def __init__(self, result: ProvisionResult):
        self.result = result
        super().__init__(result.summary())


def _message(res: dict[str, Any]) -> str:
    if not isinstance(res, dict):
        return str(res)
    if res.get("censored"):
        return str(res["censored"])
    parts = []
    for key in ("msg", "reason", "stderr", "module_stderr", "stdout"):
        value = res.get(key)
        if value and str(value).strip() and str(value).strip() not in parts:
            parts.append(str(value).strip())
        if parts and key in ("msg", "reason") and not res.get("stderr"):
            break
    if not parts and res.get("results"):  # loop: report the failed items
        failed = [r for r in res["results"] if isinstance(r, dict) and r.get("failed")]
        parts = [_message(r) for r in failed[:3]]
    text = " | ".join(parts)
    return text[-2000:] if len(text) > 2000 else text


def _task_event(event: dict[str, Any]) -> TaskEvent | None:
    kind = event.get("event")
    if kind not in _STATUS:
        return None
    data = event.get("event_data", {}) or {}
    res = data.get("res", {}) or {}
    status = _STATUS[kind]
    if status == "ok" and isinstance(res, dict) and res.get("changed"):
        status = "changed"
    elif status == "ok" and isinstance(res, dict) and "censored" in res:
        # A `no_log` task's result is censored, `changed` included; Ansible's own line for it
        # (the last line of the event's stdout, e.g. "changed: [worker-1]") still says which.
        lines = str(event.get("stdout", "")).strip().splitlines()
        if lines and lines[-1].startswith("changed"):
            status = "changed"
    message = _message(res) if status in {"failed", "unreachable"} else ""
    return TaskEvent(
        host=str(data.get("host", "?")),
        task=str(data.get("task", "?")),
        status=status,
        message=message,
        ignored=bool(data.get("ignore_errors")),
    )


def print_event(event: TaskEvent) -> None:
    """Default progress printer: one line per task result, to stderr."""
    if event.status != "skipped":
        print(event, file=sys.stderr, flush=True)


def _write_private(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh)
    os.chmod(path, 0o600)


def _normalize_stats(
    raw: dict[str, dict[str, int]] | None, hosts: list[str]
) -> dict[str, dict[str, int]]:
    stats: dict[str, dict[str, int]] = {h: {} for h in hosts}
    for key, per_host in (raw or {}).items():
        name = "unreachable" if key == "dark" else key
        for host, count in (per_host or {}).items():
            stats.setdefault(host, {})[name] = int(count)
    for s in stats.values():
        for k in ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored"):
            s.setdefault(k, 0)
    return stats


def _all_hosts(inventory: dict[str, Any]) -> list[str]:
    hosts: list[str] = []

    def walk(group: dict[str, Any]) -> None:
        for h in group.get("hosts") or {}:
            if h not in hosts:
                hosts.append(h)
        for child in (group.get("children") or {}).values():
            walk(child or {})

    for group in inventory.values():
        walk(group or {})
    return hosts


def mitogen_env() -> dict[str, str]:
    """The settings that run plays with Mitogen for Ansible's ``mitogen_free`` strategy.

    Mitogen keeps one Python interpreter per host for the whole run and sends modules to it
    over that channel, instead of one `docker exec` (or SSH session) and a fresh interpreter
    per task: Ansible's per-task cost on the controller and the node is what provisioning a
    node from the image waits for (docs/provisioning.md). It takes over the plain connection
    names only (`docker`, `ssh`, `local`), which is why the inventory says `docker`; a play
    that names its own strategy (bootstrap.yml, which may run before a node has Python) keeps
    Ansible's.
    """
    import ansible_mitogen

    strategies = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(strategies), "ANSIBLE_STRATEGY": "mitogen_free"}


def _kill_leftovers(marker: str) -> None:
    """Kill what is left of a run: processes whose command line names its inventory file.

    ansible-runner kills the process group of ansible-playbook when a run times out or is
    cancelled, but Mitogen's connection multiplexer, forked from it into a session of its
    own, survives and keeps the run's connections (and tasks) alive. A run that ended
    normally leaves nothing, so this finds nothing then. Linux' /proc only; elsewhere a no-op.
    """
    me = os.getpid()
    # Again until a pass finds nothing: a process may fork between the listing and its kill,
    # and a killed one keeps its command line until it is gone.
    for _ in range(50):
        found = False
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                pid = int(entry.name)
                if pid != me and marker in cmdline.decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
                    found = True
            except (OSError, ValueError):
                continue  # gone already, or not ours to read
        if not found:
            return
        time.sleep(0.1)


# The longest a playbook may run: a full install of five nodes from the base image takes
# 2-6 minutes here; a run still going after this is stuck, not slow.
DEFAULT_TIMEOUT_S = 1800


def run_playbook(
    inventory: dict[str, Any],
    playbook: str = "site.yml",
    extravars: dict[str, Any] | None = None,
    on_event: Callable[[TaskEvent], None] | None = print_event,
    artifacts_dir: Path | str | None = None,
    *,
    limit: str | None = None,
    forks: int = 10,
    verbosity: int = 0,
    envvars: dict[str, str] | None = None,
    mitogen: bool = True,
    timeout: int | None = DEFAULT_TIMEOUT_S,
    cancel: Callable[[], bool] | None = None,
) -> ProvisionResult:
    """Run ``playbook`` (a name in playbooks/ or a path) against ``inventory``.

    ``artifacts_dir`` is ansible-runner's private data dir, kept after the run: its
    ``artifacts/<ident>/`` holds stdout, job events and the command (without secrets).
    ``mitogen``: run the plays that name no strategy with Mitogen for Ansible's
    ``mitogen_free`` (see ``mitogen_env``); off, Ansible's own ``free`` (ansible.cfg).
    ``timeout``: seconds after which the run is stopped and reported as timed out, so that a
    node that stops answering (or a full disk) cannot hang the caller; None waits forever.
    ``cancel``: polled every few seconds; True stops the run (status ``canceled``).
    Whatever way the run ends, no process of it is left behind (see ``_kill_leftovers``).
    """
    started = time.monotonic()
    pdd = Path(artifacts_dir) if artifacts_dir else REPO_ROOT / ".provisioning" / "runner"
    pdd.mkdir(parents=True, exist_ok=True)
    os.chmod(pdd, 0o700)
    playbook_path = Path(playbook)
    if not playbook_path.is_absolute():
        playbook_path = PLAYBOOKS_DIR / playbook
    if not playbook_path.exists():
        raise FileNotFoundError(f"playbook {playbook_path} does not exist")

    clean_inventory, secret_vars = split_secrets(inventory)
    extra = dict(extravars or {})
    for key in SECRET_VARS:
        if key in extra:
            secret_vars[key] = extra.pop(key)
    extra.update(secret_vars)

    ident = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    inventory_file = pdd / "inventory" / f"{ident}.json"
    _write_private(inventory_file, clean_inventory)
    extravars_file = pdd / "env" / "extravars"
    _write_private(extravars_file, extra)

    venv_bin = str(Path(sys.executable).parent)
    env = {
        # ansible-runner looks ansible-playbook up on PATH: put this interpreter's venv first.
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_ROLES_PATH": str(ROLES_DIR),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if mitogen:
        env.update(mitogen_env())
    env.update(envvars or {})

    failures: list[Failure] = []

    def handler(event: dict[str, Any]) -> bool:
        te = _task_event(event)
        if te is not None:
            if te.status in {"failed", "unreachable"} and not te.ignored:
                failures.append(Failure(te.host, te.task, te.message, te.status == "unreachable"))
            if on_event is not None:
                on_event(te)
        return True  # keep the event in the artifacts

    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = env["PATH"]  # ansible-runner resolves the binary in this process
    try:
        runner = ansible_runner.run(
            private_data_dir=str(pdd),
            project_dir=str(playbook_path.parent),
            playbook=str(playbook_path),
            inventory=str(inventory_file),
            ident=ident,
            envvars=env,
            limit=limit,
            forks=forks,
            verbosity=verbosity,
            event_handler=handler,
            quiet=True,
            rotate_artifacts=20,
            timeout=timeout,
            cancel_callback=cancel,
        )
    finally:
        os.environ["PATH"] = old_path
        _kill_leftovers(str(inventory_file))
        extravars_file.unlink(missing_ok=True)
        # ansible-runner saves the environment it was given here and reads it back on the next
        # run in this directory: each run names its own (e.g. with or without Mitogen).
        (pdd / "env" / "envvars").unlink(missing_ok=True)

    hosts = _all_hosts(clean_inventory)
    stats = _normalize_stats(runner.stats, hosts if not limit else [])
    ok = runner.status == "successful" and runner.rc == 0 and not failures
    if not ok and not failures:
        tail = ""
        with contextlib.suppress(Exception):  # stdout may be missing when ansible never started
            tail = "\n".join(runner.stdout.read().splitlines()[-20:])
        what = (
            f"the run did not finish within {timeout} s and was stopped"
            if runner.status == "timeout"
            else "the run was stopped before it finished"
            if runner.status == "canceled"
            else f"ansible-runner status {runner.status} rc={runner.rc}"
        )
        failures.append(Failure("-", "-", f"{what}: {tail}"))
    elif runner.status == "timeout":
        failures.append(Failure("-", "-", f"the run did not finish within {timeout} s"))
    elif runner.status == "canceled":
        failures.append(Failure("-", "-", "the run was stopped before it finished"))
    return ProvisionResult(
        ok=ok,
        status=runner.status,
        rc=runner.rc,
        stats=stats,
        failures=failures,
        artifacts_dir=pdd / "artifacts" / ident,
        duration_s=time.monotonic() - started,
    )
