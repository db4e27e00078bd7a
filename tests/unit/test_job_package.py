"""infra.jobs.package: which files of a job directory are shipped, the deterministic archive,
the size cap, symlinks, and the node-side unpack command (run here with `sh`)."""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import UserFacingError
from infra.jobs import (
    DEFAULT_CAP_BYTES,
    IGNORE_FILE,
    JobDirError,
    Packed,
    list_files,
    pack,
    unpack_command,
)

pytestmark = pytest.mark.unit


def write(root: Path, rel: str, content: str | bytes = "x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def names(directory: Path) -> list[str]:
    return [path.as_posix() for path in list_files(directory)]


def members(packed: Packed) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        return {info.name: info for info in tar.getmembers()}


def contents(packed: Packed) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        for info in tar.getmembers():
            handle = tar.extractfile(info)
            assert handle is not None
            out[info.name] = handle.read()
    return out


def job_error(call: Callable[[], Any]) -> str:
    """The message of the JobDirError `call` raises: one line, a UserFacingError."""
    with pytest.raises(JobDirError) as caught:
        call()
    assert isinstance(caught.value, UserFacingError)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- what is shipped -------------------------------------------------------------------------


def test_constants() -> None:
    assert DEFAULT_CAP_BYTES == 50 * 1024 * 1024
    assert IGNORE_FILE == ".trainstackignore"


def test_files_are_relative_sorted_paths(tmp_path: Path) -> None:
    write(tmp_path, "train.py")
    write(tmp_path, "pkg/b.py")
    write(tmp_path, "pkg/a.py")
    found = list_files(tmp_path)
    assert found == [Path("pkg/a.py"), Path("pkg/b.py"), Path("train.py")]
    assert all(not path.is_absolute() for path in found)


def test_git_directory_and_worktree_git_file_are_never_packed(tmp_path: Path) -> None:
    write(tmp_path, "train.py")
    write(tmp_path, ".git/config", "[remote]\n url = https://token@example.com\n")
    write(tmp_path, ".git/objects/ab/cdef", b"\0")
    write(tmp_path, "vendor/lib/.git", "gitdir: ../../.git/modules/lib\n")
    write(tmp_path, "vendor/lib/lib.py")
    # No ignore file can bring them back.
    write(tmp_path, IGNORE_FILE, "!.git\n!.git/\n!**/.git\n")
    assert names(tmp_path) == [IGNORE_FILE, "train.py", "vendor/lib/lib.py"]


def test_fixed_rules_drop_caches_and_trainstack_dirs(tmp_path: Path) -> None:
    write(tmp_path, "train.py")
    write(tmp_path, "__pycache__/train.cpython-311.pyc")
    write(tmp_path, "pkg/__pycache__/mod.cpython-311.pyc")
    write(tmp_path, "pkg/stale.pyc")
    write(tmp_path, ".trainstack/state.json")
    write(tmp_path, "pkg/mod.py")
    assert names(tmp_path) == ["pkg/mod.py", "train.py"]


def test_nested_gitignore_applies_to_its_own_subtree(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "*.tmp\n")
    write(tmp_path, "sub/.gitignore", "local.txt\n/only_here.txt\n!wanted.tmp\n")
    for rel in (
        "local.txt",
        "only_here.txt",
        "a.tmp",
        "wanted.tmp",
        "sub/local.txt",
        "sub/deeper/local.txt",
        "sub/only_here.txt",
        "sub/deeper/only_here.txt",
        "sub/a.tmp",
        "sub/wanted.tmp",
        "other/local.txt",
    ):
        write(tmp_path, rel)
    assert names(tmp_path) == [
        ".gitignore",
        "local.txt",  # the nested rule does not reach up
        "only_here.txt",
        "other/local.txt",  # nor sideways
        "sub/.gitignore",
        "sub/deeper/only_here.txt",  # anchored to sub/
        "sub/wanted.tmp",  # the deeper negation wins over the root's *.tmp
    ]


def test_trainstackignore_excludes_more_and_may_reinclude(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "*.env\n")
    write(tmp_path, IGNORE_FILE, "notebooks/\n*.csv\n!config.env\n")
    write(tmp_path, "train.py")
    write(tmp_path, "notebooks/explore.ipynb")
    write(tmp_path, "data/rows.csv")
    write(tmp_path, "sub/more.csv")
    write(tmp_path, "secret.env")
    write(tmp_path, "config.env")
    assert names(tmp_path) == [".gitignore", IGNORE_FILE, "config.env", "train.py"]


def test_negation_keeps_one_file(tmp_path: Path) -> None:
    write(tmp_path, ".gitignore", "*.log\n!keep.log\n")
    write(tmp_path, "run.log")
    write(tmp_path, "keep.log")
    write(tmp_path, "logs/old.log")
    write(tmp_path, "logs/keep.log")
    assert names(tmp_path) == [".gitignore", "keep.log", "logs/keep.log"]


def test_ignored_directory_is_not_descended_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, ".gitignore", "data/\n")
    write(tmp_path, IGNORE_FILE, "outputs\n")
    write(tmp_path, "train.py")
    for i in range(50):
        write(tmp_path, f"data/shard-{i}/part.bin", b"\0")
        write(tmp_path, f"outputs/run-{i}/model.h5", b"\0")
    write(tmp_path, "data/.gitignore", "!*\n")  # never read: git does not look inside either
    scanned: list[str] = []
    real_scandir = os.scandir

    def spy(path: Any = ".") -> Any:
        scanned.append(os.path.relpath(path, tmp_path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", spy)
    assert names(tmp_path) == [".gitignore", IGNORE_FILE, "train.py"]
    assert scanned == ["."]


# --- symlinks --------------------------------------------------------------------------------


def test_symlink_to_a_file_inside_is_packed_as_the_file(tmp_path: Path) -> None:
    write(tmp_path, "real.py", "print('hi')\n")
    (tmp_path / "alias.py").symlink_to("real.py")
    write(tmp_path, "sub/keep.txt")
    (tmp_path / "sub/up.py").symlink_to("../real.py")
    packed = pack(tmp_path)
    assert packed.files == ["alias.py", "real.py", "sub/keep.txt", "sub/up.py"]
    infos = members(packed)
    assert all(info.isreg() for info in infos.values())
    assert contents(packed)["alias.py"] == contents(packed)["sub/up.py"] == b"print('hi')\n"


def test_symlink_outside_is_an_error_naming_it(tmp_path: Path) -> None:
    job = tmp_path / "job"
    write(job, "train.py")
    write(tmp_path, "secret.txt")
    (job / "leak.txt").symlink_to(tmp_path / "secret.txt")
    message = job_error(lambda: pack(job))
    assert "leak.txt" in message
    assert "outside" in message
    assert IGNORE_FILE in message


def test_dangling_symlink_is_an_error_naming_it(tmp_path: Path) -> None:
    write(tmp_path, "train.py")
    (tmp_path / "gone.py").symlink_to("nowhere.py")
    message = job_error(lambda: list_files(tmp_path))
    assert "gone.py" in message
    assert "nowhere.py" in message
    assert "does not exist" in message


def test_symlink_to_a_directory_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "pkg/mod.py")
    (tmp_path / "alias").symlink_to("pkg")
    assert "alias" in job_error(lambda: list_files(tmp_path))


def test_ignored_symlinks_are_not_checked(tmp_path: Path) -> None:
    write(tmp_path, IGNORE_FILE, "venv\n")
    write(tmp_path, "train.py")
    (tmp_path / "venv").symlink_to("/nonexistent/venv")
    assert names(tmp_path) == [IGNORE_FILE, "train.py"]


# --- refusals --------------------------------------------------------------------------------


def test_missing_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-job"
    message = job_error(lambda: pack(missing))
    assert str(missing) in message
    assert "does not exist" in message


def test_a_file_is_not_a_job_directory(tmp_path: Path) -> None:
    path = write(tmp_path, "train.py")
    message = job_error(lambda: pack(path))
    assert str(path) in message
    assert "not a directory" in message


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    assert str(tmp_path) in job_error(lambda: pack(tmp_path))


def test_directory_with_only_ignored_files_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, ".git/HEAD")
    write(tmp_path, "__pycache__/x.pyc")
    assert "no files to ship" in job_error(lambda: pack(tmp_path))


def test_cap_names_total_cap_and_the_five_largest_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "train.py")
    (tmp_path / "data").mkdir()
    with (tmp_path / "data/big.npy").open("wb") as f:
        f.truncate(200 * 1024 * 1024)  # sparse: no disk, but 200 MB to stat
    for i, mb in enumerate((10, 9, 8, 7, 6)):
        with (tmp_path / f"shard-{i}.bin").open("wb") as f:
            f.truncate(mb * 1024 * 1024)

    def no_reading(self: Path) -> bytes:
        raise AssertionError(f"read {self} before checking the cap")

    monkeypatch.setattr(pathlib.Path, "read_bytes", no_reading)
    start = time.monotonic()
    message = job_error(lambda: pack(tmp_path))
    assert time.monotonic() - start < 1.0
    assert "data/big.npy (200.0 MB)" in message
    assert "240.0 MB" in message  # the total
    assert "50.0 MB cap" in message
    for i, mb in enumerate((10, 9, 8, 7)):
        assert f"shard-{i}.bin ({mb}.0 MB)" in message
    assert "shard-4.bin" not in message  # the sixth largest
    assert IGNORE_FILE in message


def test_cap_is_on_the_uncompressed_sum(tmp_path: Path) -> None:
    write(tmp_path, "a.bin", b"\0" * 600)
    write(tmp_path, "b.bin", b"\0" * 500)
    assert pack(tmp_path, cap_bytes=1100).size == 1100
    job_error(lambda: pack(tmp_path, cap_bytes=1099))


# --- the archive -----------------------------------------------------------------------------


def make_job(root: Path, mtime: int) -> Path:
    write(root, "train.py", "import pkg\n")
    write(root, "pkg/__init__.py", "")
    write(root, "pkg/model.py", "LAYERS = 3\n")
    write(root, "run.sh", "#!/bin/sh\n").chmod(0o755)
    write(root, ".gitignore", "*.ckpt\n")
    write(root, "old.ckpt", b"\1" * 100)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (mtime, mtime))
    return root


def test_same_content_same_archive_whatever_mtimes_and_parent(tmp_path: Path) -> None:
    one = make_job(tmp_path / "a" / "job", mtime=1_000_000)
    two = make_job(tmp_path / "b" / "deeper" / "elsewhere", mtime=1_700_000_000)
    first, second = pack(one), pack(two)
    assert first.sha == second.sha
    assert first.data == second.data
    assert first.files == second.files == sorted(first.files)
    assert pack(one) == first  # and again, the same

    write(two, "pkg/model.py", "LAYERS = 4\n")
    assert pack(two).sha != first.sha


def test_packed_fields(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job", mtime=5)
    packed = pack(job)
    assert len(packed.sha) == 64
    int(packed.sha, 16)
    assert packed.short == packed.sha[:12]
    assert packed.files == [".gitignore", "pkg/__init__.py", "pkg/model.py", "run.sh", "train.py"]
    assert packed.size == sum((job / name).stat().st_size for name in packed.files)
    assert packed.data[:2] == b"\x1f\x8b"
    assert "data=" not in repr(packed)


def test_entries_are_normalised(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job", mtime=123456)
    write(job, "private.py").chmod(0o600)
    write(job, "tool.py").chmod(0o744)
    infos = members(pack(job))
    assert list(infos) == sorted(infos)
    for info in infos.values():
        assert info.isreg()
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname) == (0, 0, 0, "", "")
    assert infos["run.sh"].mode == 0o755
    assert infos["tool.py"].mode == 0o755
    assert infos["private.py"].mode == 0o644
    assert infos["train.py"].mode == 0o644


def test_round_trip_with_tarfile(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job", mtime=42)
    write(job, "weights/small.bin", bytes(range(256)) * 10)
    packed = pack(job)
    out = tmp_path / "out"
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        tar.extractall(out, filter="data")
    extracted = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert extracted == packed.files
    for name in packed.files:
        assert (out / name).read_bytes() == (job / name).read_bytes()


# --- unpacking on a node ---------------------------------------------------------------------


def test_unpack_command_extracts_atomically_and_once(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job", mtime=7)
    packed = pack(job)
    node = tmp_path / "node with space $HOME"
    archive = node / f"job-{packed.short}.tar.gz"
    dest = node / "jobs" / packed.sha

    node.mkdir()
    archive.write_bytes(packed.data)
    argv = unpack_command(str(archive), str(dest))
    assert argv[:2] == ["sh", "-c"]
    subprocess.run(argv, check=True, timeout=60)
    extracted = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert extracted == packed.files
    assert (dest / "pkg/model.py").read_bytes() == (job / "pkg/model.py").read_bytes()
    assert os.access(dest / "run.sh", os.X_OK)
    assert (dest / "train.py").stat().st_mtime > 0  # not the archive's mtime 0
    assert not archive.exists()
    assert sorted(p.name for p in dest.parent.iterdir()) == [packed.sha]  # no partial copy

    # The second time: the destination is left alone (its marker survives), archive removed.
    (dest / "marker").write_text("kept")
    archive.write_bytes(packed.data)
    subprocess.run(argv, check=True, timeout=60)
    assert (dest / "marker").read_text() == "kept"
    assert not archive.exists()


def test_unpack_command_failure_leaves_nothing(tmp_path: Path) -> None:
    archive = write(tmp_path, "broken.tar.gz", b"not a gzip file")
    dest = tmp_path / "jobs" / "abc"
    result = subprocess.run(
        unpack_command(str(archive), str(dest)), capture_output=True, timeout=60
    )
    assert result.returncode != 0
    assert not dest.exists()
    assert list((tmp_path / "jobs").iterdir()) == []


def test_unpack_command_quotes_its_arguments() -> None:
    script = unpack_command("/tmp/a'b.tar.gz", "/srv/x; rm -rf /")[2]
    assert "archive='/tmp/a'\"'\"'b.tar.gz'" in script
    assert "dest='/srv/x; rm -rf /'" in script
