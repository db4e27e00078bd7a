"""The stack's outputs kept beside its local state (infra.jobs.outputs_cache): Pulumi is asked
once per state of the stack, again when the state file changed, every time when there is no
state file here; the cache file is private, and one that does not read back is ignored."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from infra.config.values import PROJECT_DIR
from infra.jobs import commands
from infra.jobs.commands import CliError, stack_outputs
from infra.jobs.outputs_cache import CACHE_DIR, cached_outputs, state_key

pytestmark = pytest.mark.unit

OUTPUTS = {"jobNodes": [{"name": "worker-1"}], "jobDefaults": {"stack": "dev"}, "pw": "[secret]"}


class FakePulumi:
    """Stands in for `pulumi stack output`: counts its calls, returns what it is set to."""

    def __init__(self, outputs: dict[str, Any]) -> None:
        self.calls = 0
        self.outputs = outputs

    def __call__(self) -> dict[str, Any]:
        self.calls += 1
        return dict(self.outputs)


@pytest.fixture
def backend(tmp_path: Path) -> Path:
    """A file backend with the state of stack `dev` of this project."""
    state = tmp_path / "state" / ".pulumi" / "stacks" / "trainstack" / "dev.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"version": 3}')
    return tmp_path / "state"


@pytest.fixture
def env(backend: Path, tmp_path: Path) -> dict[str, str]:
    return {"PULUMI_BACKEND_URL": f"file://{backend}", "PULUMI_HOME": str(tmp_path / "home")}


def state_file(backend: Path, stack: str = "dev") -> Path:
    return backend / ".pulumi" / "stacks" / "trainstack" / f"{stack}.json"


def cache_file(backend: Path, stack: str = "dev") -> Path:
    return backend / CACHE_DIR / "trainstack" / f"{stack}.json"


def test_an_unchanged_state_asks_pulumi_once(env: dict[str, str], backend: Path) -> None:
    pulumi = FakePulumi(OUTPUTS)
    assert cached_outputs("dev", env, pulumi) == OUTPUTS
    assert cached_outputs("dev", env, pulumi) == OUTPUTS
    assert cached_outputs("organization/trainstack/dev", env, pulumi) == OUTPUTS
    assert pulumi.calls == 1


def test_a_rewritten_state_asks_pulumi_again(env: dict[str, str], backend: Path) -> None:
    pulumi = FakePulumi(OUTPUTS)
    cached_outputs("dev", env, pulumi)
    pulumi.outputs = {**OUTPUTS, "jobDefaults": {"stack": "dev", "epochs": 9}}
    # Another size, in place, with the old mtime (a write within the clock's granularity).
    before = state_file(backend).stat()
    state_file(backend).write_text('{"version": 3, "more": 1}')
    os.utime(state_file(backend), ns=(before.st_atime_ns, before.st_mtime_ns))
    assert state_file(backend).stat().st_ino == before.st_ino
    assert cached_outputs("dev", env, pulumi) == pulumi.outputs
    assert pulumi.calls == 2
    # The same size, only a newer mtime (a `refresh` that changed nothing of the size).
    st = state_file(backend).stat()
    os.utime(state_file(backend), ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cached_outputs("dev", env, pulumi) == pulumi.outputs
    assert cached_outputs("dev", env, pulumi) == pulumi.outputs
    assert pulumi.calls == 3


def test_a_destroyed_or_unknown_stack_asks_pulumi_every_time(
    env: dict[str, str], backend: Path
) -> None:
    pulumi = FakePulumi(OUTPUTS)
    cached_outputs("dev", env, pulumi)
    state_file(backend).unlink()  # `pulumi stack rm`
    for _ in range(3):
        cached_outputs("dev", env, pulumi)
    cached_outputs("other", env, pulumi)
    assert pulumi.calls == 5


def test_another_backend_asks_pulumi_every_time(env: dict[str, str]) -> None:
    pulumi = FakePulumi(OUTPUTS)
    for url in ("https://api.pulumi.com", "s3://bucket/state", ""):
        cached_outputs("dev", {**env, "PULUMI_BACKEND_URL": url}, pulumi)
        cached_outputs("dev", {**env, "PULUMI_BACKEND_URL": url}, pulumi)
    assert pulumi.calls == 6


def test_the_cache_is_private_and_written_whole(env: dict[str, str], backend: Path) -> None:
    cached_outputs("dev", env, FakePulumi(OUTPUTS))
    path = cache_file(backend)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((backend / CACHE_DIR).stat().st_mode) == 0o700
    assert json.loads(path.read_text())["outputs"] == OUTPUTS
    assert sorted(p.name for p in path.parent.iterdir()) == ["dev.json"]  # no temporary left


@pytest.mark.parametrize(
    "spoil",
    [
        lambda p: p.write_text('{"key": '),  # cut short
        lambda p: p.write_text("[]"),
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "outputs": [1]})),
        lambda p: p.write_bytes(b"\xff\xfe"),
        lambda p: p.chmod(0o644),  # not private any more: someone may have written it
    ],
    ids=["truncated", "not-an-object", "outputs-not-an-object", "not-utf8", "not-private"],
)
def test_a_spoiled_cache_is_ignored(env: dict[str, str], backend: Path, spoil: Any) -> None:
    pulumi = FakePulumi(OUTPUTS)
    cached_outputs("dev", env, pulumi)
    spoil(cache_file(backend))
    assert cached_outputs("dev", env, pulumi) == OUTPUTS
    assert pulumi.calls == 2
    assert cached_outputs("dev", env, pulumi) == OUTPUTS  # written again, whole
    assert pulumi.calls == 2


def test_a_cache_of_another_key_is_ignored(env: dict[str, str], backend: Path) -> None:
    """A cache file copied from another stack, or kept for another backend URL."""
    cached_outputs("dev", env, FakePulumi(OUTPUTS))
    state_file(backend, "prod").write_text('{"version": 3}')
    cache_file(backend, "prod").write_bytes(cache_file(backend).read_bytes())
    cache_file(backend, "prod").chmod(0o600)
    pulumi = FakePulumi({**OUTPUTS, "jobDefaults": {"stack": "prod"}})
    assert cached_outputs("prod", env, pulumi) == pulumi.outputs
    assert pulumi.calls == 1


def test_an_unwritable_cache_asks_pulumi_every_time(env: dict[str, str], backend: Path) -> None:
    (backend / CACHE_DIR).write_text("not a folder")
    pulumi = FakePulumi(OUTPUTS)
    assert cached_outputs("dev", env, pulumi) == OUTPUTS
    assert cached_outputs("dev", env, pulumi) == OUTPUTS
    assert pulumi.calls == 2


def select(env: dict[str, str], stack: str, url: str | None = None, legacy: str = "") -> None:
    """`pulumi stack select STACK` as Pulumi 3.2xx records it (checked against v3.274.1): the
    workspace file named by the SHA-1 of Pulumi.yaml's real path, the stack under the backend
    URL (`url`, default env's); `legacy` is the older, backend-less `stack` field."""
    yaml_path = os.path.join(os.path.realpath(PROJECT_DIR), "Pulumi.yaml")
    digest = hashlib.sha1(yaml_path.encode()).hexdigest()
    workspace = Path(env["PULUMI_HOME"]) / "workspaces" / f"trainstack-{digest}-workspace.json"
    workspace.parent.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {"stacks": {url or env["PULUMI_BACKEND_URL"]: stack}}
    workspace.write_text(json.dumps({**settings, **({"stack": legacy} if legacy else {})}))


def keyed_stack(stack: str | None, env: dict[str, str]) -> str | None:
    """The stack whose state keys the cache, or None when nothing is cached."""
    found = state_key(stack, env)
    return str(found[1]["stack"]) if found else None


def test_the_selected_stack_is_cached_as_itself(env: dict[str, str], backend: Path) -> None:
    pulumi = FakePulumi(OUTPUTS)
    cached_outputs(None, env, pulumi)  # nothing selected: no key, Pulumi says which
    assert pulumi.calls == 1
    select(env, "organization/trainstack/dev")
    assert keyed_stack(None, env) == "dev"
    cached_outputs(None, env, pulumi)
    cached_outputs(None, env, pulumi)
    cached_outputs("dev", env, pulumi)
    assert pulumi.calls == 2
    # Another stack selected: its own state, its own outputs.
    state_file(backend, "prod").write_text('{"version": 3}')
    select(env, "prod")
    pulumi.outputs = {**OUTPUTS, "jobDefaults": {"stack": "prod"}}
    assert cached_outputs(None, env, pulumi) == pulumi.outputs
    assert pulumi.calls == 3


def test_the_selection_is_the_backends_own(env: dict[str, str], backend: Path) -> None:
    state_file(backend, "prod").write_text('{"version": 3}')
    select(env, "dev", url=env["PULUMI_BACKEND_URL"] + "/", legacy="prod")  # another URL
    assert keyed_stack(None, env) == "prod"  # Pulumi's fallback: the legacy field
    select(env, "dev", url="https://api.pulumi.com")
    assert keyed_stack(None, env) is None


def test_pulumi_stack_picks_the_stack_as_for_pulumi(env: dict[str, str], backend: Path) -> None:
    """Pulumi (v3.274.1): `--stack` first, then $PULUMI_STACK, then the selection."""
    state_file(backend, "prod").write_text('{"version": 3}')
    select(env, "dev")
    picked = {**env, "PULUMI_STACK": "organization/trainstack/prod"}
    assert keyed_stack(None, picked) == "prod"
    assert keyed_stack("dev", picked) == "dev"
    assert keyed_stack(None, env) == "dev"


# -- through `stack_outputs`, with a fake `pulumi` on PATH ----------------------------------


@pytest.fixture
def fake_pulumi(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """A `pulumi` that appends its arguments to a log and prints the JSON in a file."""
    bin_dir, log, printed = tmp_path / "bin", tmp_path / "calls.log", tmp_path / "outputs.json"
    bin_dir.mkdir()
    script = bin_dir / "pulumi"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncat {printed}\n')
    script.chmod(0o755)
    printed.write_text(json.dumps(OUTPUTS))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return log, printed


def test_stack_outputs_runs_pulumi_once_per_state(
    fake_pulumi: tuple[Path, Path], backend: Path
) -> None:
    log, printed = fake_pulumi
    assert stack_outputs("dev") == OUTPUTS
    assert stack_outputs("dev") == OUTPUTS
    assert log.read_text().splitlines() == ["stack output --json --non-interactive --stack dev"]
    printed.write_text(json.dumps({"jobNodes": [], "jobDefaults": {}}))
    state_file(backend).write_text('{"version": 3, "destroyed": true}')
    for _ in range(2):  # kept, and still refused
        with pytest.raises(CliError, match="no jobNodes/jobDefaults"):
            stack_outputs("dev")
    assert len(log.read_text().splitlines()) == 2


def test_stack_outputs_refuses_what_is_not_json(
    fake_pulumi: tuple[Path, Path], backend: Path
) -> None:
    log, printed = fake_pulumi
    printed.write_text("not json")
    for _ in range(2):  # nothing kept: Pulumi is asked again
        with pytest.raises(CliError, match="printed no JSON object") as raised:
            stack_outputs("dev")
        assert raised.value.code == commands.EXIT_UNREACHABLE
    assert len(log.read_text().splitlines()) == 2
    assert not cache_file(backend).exists()
    printed.write_text("[1]")
    with pytest.raises(CliError, match="printed no JSON object") as raised:
        stack_outputs("dev")
    assert raised.value.code == commands.EXIT_UNREACHABLE
    assert not cache_file(backend).exists()
