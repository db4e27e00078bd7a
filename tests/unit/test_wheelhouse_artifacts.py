"""The wheelhouse's non-wheel sets: objectstore/ (the SeaweedFS binary, built with Go) and s3a/
(hadoop-aws and the AWS SDK bundle from Maven Central). No network and no Go: the build is
replaced by a fake, and the jars come from a file:// repository in a temporary directory.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from infra.provisioning import wheelhouse
from infra.provisioning.wheelhouse import KEY_FILE, MavenJar, WheelhouseError

pytestmark = pytest.mark.unit

FAKE_WEED = b"#!/bin/sh\necho fake weed\n"


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the Go build with one that writes a small executable; records each build."""
    calls: list[Path] = []

    def fake_build(out: Path) -> None:
        calls.append(out)
        out.write_bytes(FAKE_WEED)
        out.chmod(0o755)

    monkeypatch.setattr(wheelhouse, "build_seaweedfs", fake_build)
    return calls


def _no_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(wheelhouse, "GO_FALLBACK_DIRS", ())


def _repo_jar(repo: Path, artifact: str, data: bytes, sha256: str | None = None) -> MavenJar:
    jar = MavenJar(
        "org.example.s3",
        artifact,
        "1.0",
        sha256 or hashlib.sha256(data).hexdigest(),
        repository=repo.as_uri(),
    )
    path = repo / "org/example/s3" / artifact / "1.0" / jar.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return jar


def test_pins_name_the_maven_central_jars() -> None:
    assert [jar.url for jar in wheelhouse.S3A_JARS] == [
        "https://repo1.maven.org/maven2/org/apache/hadoop/hadoop-aws/3.4.1/hadoop-aws-3.4.1.jar",
        "https://repo1.maven.org/maven2/software/amazon/awssdk/bundle/2.24.6/bundle-2.24.6.jar",
    ]
    assert all(len(jar.sha256) == 64 for jar in wheelhouse.S3A_JARS)


def test_download_cache_follows_setup_sh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRAINSTACK_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert wheelhouse.download_cache() == tmp_path / "home/.cache/trainstack"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # empty counts as unset, as in ${VAR:-default}
    assert wheelhouse.download_cache() == tmp_path / "home/.cache/trainstack"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert wheelhouse.download_cache() == tmp_path / "xdg/trainstack"
    monkeypatch.setenv("TRAINSTACK_CACHE", str(tmp_path / "own"))
    assert wheelhouse.download_cache() == tmp_path / "own"


def test_objectstore_set_is_built_once_into_the_cache_and_hard_linked(
    builds: list[Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    dest = wheelhouse.build_objectstore_set(tmp_path / "root/objectstore", cache)

    cached = cache / f"seaweedfs-{wheelhouse.SEAWEEDFS_VERSION}" / "weed"
    assert len(builds) == 1
    assert (dest / "weed").read_bytes() == FAKE_WEED
    assert os.access(dest / "weed", os.X_OK)
    assert (dest / "weed").stat().st_ino == cached.stat().st_ino
    assert (dest / KEY_FILE).read_text().strip() == wheelhouse.seaweedfs_key()
    assert (cached.parent / KEY_FILE).read_text().strip() == wheelhouse.seaweedfs_key()
    assert not list(tmp_path.rglob("*.partial"))


def test_objectstore_set_with_a_matching_key_does_no_work(
    builds: list[Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    dest = wheelhouse.build_objectstore_set(tmp_path / "root/objectstore", cache)
    mtime = (dest / KEY_FILE).stat().st_mtime_ns
    _no_go(monkeypatch, tmp_path)
    (cache / f"seaweedfs-{wheelhouse.SEAWEEDFS_VERSION}" / "weed").unlink()  # not even looked at

    wheelhouse.build_objectstore_set(dest, cache)

    assert len(builds) == 1
    assert (dest / KEY_FILE).stat().st_mtime_ns == mtime


def test_a_fresh_wheelhouse_root_reuses_the_cached_binary(
    builds: list[Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    wheelhouse.build_objectstore_set(tmp_path / "first/objectstore", cache)
    dest = wheelhouse.build_objectstore_set(tmp_path / "second/objectstore", cache)
    assert len(builds) == 1
    assert (dest / "weed").read_bytes() == FAKE_WEED


def test_set_is_copied_when_hard_links_fail(
    builds: list[Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(wheelhouse.os, "link", cross_device)
    cache = tmp_path / "cache"
    dest = wheelhouse.build_objectstore_set(tmp_path / "root/objectstore", cache)

    cached = cache / f"seaweedfs-{wheelhouse.SEAWEEDFS_VERSION}" / "weed"
    assert (dest / "weed").stat().st_ino != cached.stat().st_ino
    assert (dest / "weed").read_bytes() == FAKE_WEED
    assert os.access(dest / "weed", os.X_OK)


def test_missing_go_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_go(monkeypatch, tmp_path)
    with pytest.raises(WheelhouseError) as err:
        wheelhouse.build_objectstore_set(tmp_path / "root/objectstore", tmp_path / "cache")
    message = str(err.value)
    assert "needs Go" in message
    assert "`go` is not on PATH" in message
    assert "install Go" in message
    assert not (tmp_path / "root/objectstore").exists()


def test_go_failure_shows_the_end_of_go_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text('#!/bin/sh\nfor i in $(seq 1 30); do echo "go: line $i" >&2; done\nexit 2\n')
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    with pytest.raises(WheelhouseError) as err:
        wheelhouse.build_objectstore_set(tmp_path / "root/objectstore", tmp_path / "cache")
    message = str(err.value)
    assert message.startswith("objectstore set (github.com/seaweedfs/seaweedfs@")
    assert "(exit 2)" in message
    assert "go: line 30" in message
    assert "go: line 16" in message
    assert "go: line 15\n" not in message
    assert not (tmp_path / "root/objectstore").exists()


def test_s3a_set_downloads_verifies_and_links_from_the_cache(tmp_path: Path) -> None:
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    jars = (_repo_jar(repo, "connector", b"connector"), _repo_jar(repo, "sdk", b"sdk" * 1000))

    dest = wheelhouse.build_s3a_set(tmp_path / "root/s3a", cache, jars)

    for jar in jars:
        assert (dest / jar.filename).stat().st_ino == (cache / "maven" / jar.filename).stat().st_ino
        assert hashlib.sha256((dest / jar.filename).read_bytes()).hexdigest() == jar.sha256
    assert (dest / KEY_FILE).read_text().strip() == wheelhouse.s3a_key(jars)
    assert not list(tmp_path.rglob("*.partial"))


def test_s3a_set_with_a_matching_key_does_no_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    jars = (_repo_jar(repo, "connector", b"connector"),)
    dest = wheelhouse.build_s3a_set(tmp_path / "root/s3a", cache, jars)

    def no_download(url: str, sha256: str, dest: Path) -> Path:
        raise AssertionError(f"downloaded {url} again")

    monkeypatch.setattr(wheelhouse, "download_verified", no_download)
    monkeypatch.setattr(wheelhouse, "_file_sha256", no_download)
    wheelhouse.build_s3a_set(dest, cache, jars)
    # A fresh root is filled from the cache (verified there, not downloaded).
    monkeypatch.undo()
    monkeypatch.setattr(wheelhouse, "download_verified", no_download)
    fresh = wheelhouse.build_s3a_set(tmp_path / "fresh/s3a", cache, jars)
    assert (fresh / jars[0].filename).read_bytes() == b"connector"


def test_a_corrupt_cached_jar_is_downloaded_again(tmp_path: Path) -> None:
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    jar = _repo_jar(repo, "connector", b"connector")
    (cache / "maven").mkdir(parents=True)
    (cache / "maven" / jar.filename).write_bytes(b"truncated")

    dest = wheelhouse.build_s3a_set(tmp_path / "root/s3a", cache, (jar,))

    assert (dest / jar.filename).read_bytes() == b"connector"


def test_checksum_mismatch_names_url_expected_and_actual(tmp_path: Path) -> None:
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    expected = "0" * 64
    jar = _repo_jar(repo, "connector", b"tampered", sha256=expected)

    with pytest.raises(WheelhouseError) as err:
        wheelhouse.build_s3a_set(tmp_path / "root/s3a", cache, (jar,))

    message = str(err.value)
    assert jar.url in message
    assert expected in message
    assert hashlib.sha256(b"tampered").hexdigest() in message
    assert not (cache / "maven" / jar.filename).exists()
    assert not list(tmp_path.rglob("*.partial"))
    assert not (tmp_path / "root/s3a").exists()


def test_unreachable_url_is_a_wheelhouse_error(tmp_path: Path) -> None:
    jar = MavenJar("org.example", "gone", "1.0", "0" * 64, repository=(tmp_path / "no").as_uri())
    with pytest.raises(WheelhouseError, match=r"cannot download .*gone-1\.0\.jar"):
        wheelhouse.build_s3a_set(tmp_path / "root/s3a", tmp_path / "cache", (jar,))


def test_node_wheelhouse_builds_both_new_sets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built: list[str] = []
    monkeypatch.setattr(wheelhouse, "build_wheelhouse", lambda dest, *a: built.append(dest.name))
    monkeypatch.setattr(
        wheelhouse, "build_training_wheel", lambda dest, *a: built.append(dest.name)
    )
    monkeypatch.setattr(
        wheelhouse, "build_objectstore_set", lambda dest, *a: built.append(dest.name)
    )
    monkeypatch.setattr(wheelhouse, "build_s3a_set", lambda dest, *a: built.append(dest.name))

    wheelhouse.build_node_wheelhouse(tmp_path / "root")

    assert {"objectstore", "s3a", "spark", "tensorflow", "mlflow", "training"} <= set(built)
