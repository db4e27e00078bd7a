"""Shipping a job's code (infra.jobs.remote) through a transport that runs on this machine:
unpacked once per content SHA, never shipped twice, and a directory that changed since the
program packed it is refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.jobs import remote
from infra.jobs.package import pack
from infra.transport import Transport

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class LocalNode(Transport):
    """Runs the commands here (the user is ignored): enough for ship's mkdir/tar/mv."""

    name = "local"

    def __init__(self) -> None:
        self.puts: list[str] = []

    def unavailable(self):
        return None

    def run(self, argv, *, user=None, env=None, stdin=None):
        proc = subprocess.run(argv, capture_output=True, check=False)
        return proc.returncode, proc.stdout + proc.stderr

    def stream(self, argv, *, env=None, user=None):
        raise AssertionError("not here")

    def fetch(self, path):
        return Path(path).read_bytes()

    def put(self, path, data, mode=0o644, user=None):
        self.puts.append(path)
        Path(path).write_bytes(data)

    def copy_command(self, path):
        return f"cp -r {path} ."


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "JOBS_DIR", str(tmp_path / "jobs"))
    return tmp_path / "jobs"


def test_code_is_unpacked_once_per_sha(jobs_dir):
    node, packed = LocalNode(), pack(EXAMPLES / "digits-cnn")
    dest = remote.ship(node, packed)
    assert dest == f"{jobs_dir}/{packed.sha}"
    assert sorted(p.name for p in Path(dest).iterdir()) == ["cnn.py", "trainstack.toml"]
    assert not list(jobs_dir.glob(".*.tar.gz"))  # the archive is removed once unpacked
    assert remote.ship(node, packed) == dest and len(node.puts) == 1


def test_a_directory_changed_since_the_program_packed_it_is_refused(jobs_dir, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "trainstack.toml").write_text('[job]\nentry = "m"\n')
    (job / "m.py").write_text("def train(ctx): ...\n")
    sha = pack(job).sha
    (job / "m.py").write_text("def train(ctx): return {}\n")
    with pytest.raises(remote.RemoteError, match="changed while `pulumi up` ran"):
        remote.ship_directory(LocalNode(), str(job), sha)
    assert not jobs_dir.exists() or not any(jobs_dir.iterdir())
    node = LocalNode()
    assert remote.ship_directory(node, str(job), pack(job).sha).endswith(pack(job).sha)
