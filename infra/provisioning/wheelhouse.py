"""Build the control machine's wheelhouse: every Python wheel the nodes need, downloaded once.

Layout of a wheelhouse root (``trainstack_wheelhouse_dir``)::

    <root>/spark/        pyspark (+ py4j): Spark runtime for ZooKeeper, masters and workers
    <root>/tensorflow/   tensorflow-cpu, tf-keras (no deps) and the training package's other
                         dependencies (pyspark is in spark/ only)
    <root>/training/     the trainstack-training wheel built from ``training/``
    <root>/mlflow/       MLflow with its auth extra (the tracking server and the sync daemon,
                         in a venv layered on the training venv: pip on the node installs
                         only what that venv lacks)
    <root>/objectstore/weed
                         the SeaweedFS server binary (an S3-compatible object store, 164 MB),
                         built here with ``go build`` from its Go module (no release download
                         site is reachable; the Go module proxy is)
    <root>/s3a/hadoop-aws-<v>.jar, <root>/s3a/bundle-<v>.jar
                         Spark's s3a connector for the Hadoop client pyspark ships, and the
                         AWS SDK v2 bundle it was built against (558 MB), from Maven Central,
                         each checked against a SHA-256 pinned here

Each set directory holds a ``.trainstack-key`` file: the SHA-256 of the pinned requirement set
(or of the training sources, or of the pins and build recipe). A set whose key matches is reused
as it is (no network, no rewrite, so the roles' copies stay unchanged and idempotent); otherwise
it is rebuilt. The objectstore and s3a sets are filled from the per-user download cache
(``download_cache()``): ``<cache>/seaweedfs-<version>/weed`` and
``<cache>/maven/<artifact>-<version>.jar``, by hard link where it is on the same filesystem, so
a wheelhouse under a fresh HOME neither rebuilds the binary nor downloads the jars again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINING_DIR = REPO_ROOT / "training"
KEY_FILE = ".trainstack-key"

# Pins of the nodes' Python environment. The roles' defaults carry the same versions
# (spark_pyspark_version, tensorflow_version, tensorflow_tf_keras_version); a unit test
# checks they agree.
PYSPARK = "pyspark==4.0.1"
TENSORFLOW = "tensorflow-cpu==2.21.0"
TF_KERAS = "tf-keras==2.21.0"  # installed with --no-deps: its metadata pulls full `tensorflow`
# The tracking server (the mlflow role's mlflow_version; the control machine's client pin in
# pyproject.toml's dev extra and constraints.txt is the same).
MLFLOW = "mlflow[auth]==3.17.2"
# The object store's server (objectstore set). `go install` refuses the module (its go.mod has
# replace lines), so it is built inside a copy of the module; `weed version` says 4.53.
SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
# Static, and the same bytes from every build of the same module with the same Go.
SEAWEEDFS_BUILD_ENV = {"CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
SEAWEEDFS_BUILD_FLAGS = ("-trimpath", "-ldflags", "-s -w")
# Where setup looks for Go when `go` is not on PATH (the official archive's place).
GO_FALLBACK_DIRS = ("/usr/local/go/bin",)
# Spark's s3a connector (s3a set): hadoop-aws matching the hadoop-client 3.4.1 jars pyspark
# 4.0.1 ships, and the AWS SDK v2 bundle it was built against (hadoop-project 3.4.1's
# aws-java-sdk-v2.version). The SHA-256s were computed on 2026-12-06 from downloads whose SHA-1
# matched Maven Central's published .sha1 files (hadoop-aws-3.4.1.jar.sha1:
# 641d8fe1d7683cdcc05cc3a794c0374553f6bd6a, bundle-2.24.6.jar.sha1:
# 242317b028d951dbbf6a142241e041b684696a3b); Central publishes no .sha256 for these jars.
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
HADOOP_AWS_VERSION = "3.4.1"
HADOOP_AWS_SHA256 = "01334a07e179cae2b7e251f24857f11e3759108c9d6a79dcbe362a4295227da2"
AWS_SDK_BUNDLE_VERSION = "2.24.6"  # 558 MB
AWS_SDK_BUNDLE_SHA256 = "890bf9f2a80488f7a8aa8277d64d13a9ea3a3cdff8607ef3b63a878d8b467b41"


class WheelhouseError(RuntimeError):
    """A set could not be downloaded or built; the message names the set and the tool's error."""


@dataclass(frozen=True)
class WheelSet:
    name: str
    requirements: list[str]
    nodeps: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MavenJar:
    group: str
    artifact: str
    version: str
    sha256: str
    repository: str = MAVEN_CENTRAL

    @property
    def filename(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    @property
    def url(self) -> str:
        group = self.group.replace(".", "/")
        return f"{self.repository}/{group}/{self.artifact}/{self.version}/{self.filename}"


S3A_JARS = (
    MavenJar("org.apache.hadoop", "hadoop-aws", HADOOP_AWS_VERSION, HADOOP_AWS_SHA256),
    MavenJar("software.amazon.awssdk", "bundle", AWS_SDK_BUNDLE_VERSION, AWS_SDK_BUNDLE_SHA256),
)


def training_dependencies(training_dir: Path = TRAINING_DIR) -> list[str]:
    pyproject = training_dir / "pyproject.toml"
    if not pyproject.exists():
        return []
    data = tomllib.loads(pyproject.read_text())
    return list(data.get("project", {}).get("dependencies", []))


def default_sets(training_dir: Path = TRAINING_DIR) -> list[WheelSet]:
    # pyspark (415 MB) is in the spark set only: every tensorflow host is a Spark worker
    # (infra.config enforces it), whose spark role installs pyspark before the training
    # package asks for it; the training role finds it in both sets.
    tf_reqs = [TENSORFLOW]
    for dep in training_dependencies(training_dir):
        if dep not in tf_reqs and dep != PYSPARK:
            tf_reqs.append(dep)
    return [
        WheelSet("spark", [PYSPARK]),
        WheelSet("tensorflow", tf_reqs, nodeps=[TF_KERAS]),
        WheelSet("mlflow", [MLFLOW]),
    ]


def requirements_key(requirements: list[str], nodeps: list[str] | None = None) -> str:
    payload = json.dumps(
        {
            "requirements": sorted(requirements),
            "nodeps": sorted(nodeps or []),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "platform": sys.platform,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _pip(args: list[str], what: str, env: dict[str, str] | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})}
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise WheelhouseError(f"{what}: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")


def _cached(dest: Path, key: str) -> bool:
    key_file = dest / KEY_FILE
    return key_file.exists() and key_file.read_text().strip() == key and any(dest.glob("*.whl"))


def build_wheelhouse(dest: Path, requirements: list[str], nodeps: list[str] | None = None) -> Path:
    """Download wheels for ``requirements`` (with deps) and ``nodeps`` (without) into ``dest``.

    Cached by a hash of the pinned requirement set: a second call with the same set returns at
    once. Wheels only (sdists are built here), so nodes never need a compiler or network.
    """
    dest = Path(dest)
    key = requirements_key(requirements, nodeps)
    if _cached(dest, key):
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # `pip wheel` rather than `pip download --only-binary`: pyspark is published as an sdist only,
    # so it is built here once into a pure-Python wheel; everything else comes as binary wheels.
    common = ["wheel", "--prefer-binary", "--disable-pip-version-check", "-w", str(tmp)]
    if requirements:
        _pip([*common, *requirements], f"wheel set {dest.name}")
    if nodeps:
        _pip([*common, "--no-deps", *nodeps], f"wheel set {dest.name} (no-deps)")
    (tmp / KEY_FILE).write_text(key + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


# What a build leaves in a source tree, and what the wheel is never built from.
_BUILD_LEFTOVERS = ("build", "dist", "__pycache__", "*.egg-info")


def _is_leftover(part: str) -> bool:
    return part in {"build", "dist", "__pycache__"} or part.endswith(".egg-info")


def _tree_key(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or any(_is_leftover(p) for p in rel.parts):
            continue
        digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# The training wheel is built reproducibly: its zip entries get this date, not the files'
# modification times, so every clone of the same sources builds the same bytes, and a node
# image baked from one clone holds the very wheel another clone provisions (its checksum
# matches; nothing is reinstalled). 1980-01-01, the earliest date a zip file can hold.
REPRODUCIBLE_BUILD = {"SOURCE_DATE_EPOCH": "315532800"}
# Part of the wheel's cache key: wheels cached before the builds were reproducible, or built
# in a tree with an earlier build's leftovers, are rebuilt.
TRAINING_BUILD_RECIPE = "sde-315532800+clean-copy"


def build_training_wheel(dest: Path, source: Path = TRAINING_DIR) -> Path:
    """Build the training package's wheel into ``dest``, cached by a hash of its sources."""
    dest = Path(dest)
    if not (source / "pyproject.toml").exists():
        raise WheelhouseError(f"training package: {source / 'pyproject.toml'} does not exist")
    key = f"{_tree_key(source)}+{TRAINING_BUILD_RECIPE}"
    if _cached(dest, key):
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # Built from a copy of the sources alone: setuptools reuses an in-tree build/ directory,
    # so a module removed since an earlier build (data.py, now the data/ package) would still
    # be shipped, and the wheel would not be the one its key names.
    with tempfile.TemporaryDirectory(prefix="trainstack-training-src-") as copy:
        clean = Path(copy) / source.name
        shutil.copytree(source, clean, ignore=shutil.ignore_patterns(*_BUILD_LEFTOVERS))
        _pip(
            ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp), str(clean)],
            "training wheel",
            env=REPRODUCIBLE_BUILD,
        )
    (tmp / KEY_FILE).write_text(key + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def download_cache() -> Path:
    """The per-user download cache: scripts/setup.sh's CACHE (it survives a fresh HOME)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("TRAINSTACK_CACHE") or Path(base) / "trainstack")


def _artifact_key(payload: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _current(directory: Path, key: str, names: list[str]) -> bool:
    key_file = directory / KEY_FILE
    return (
        key_file.exists()
        and key_file.read_text().strip() == key
        and all((directory / name).is_file() for name in names)
    )


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem (or no hard links there)
        shutil.copy2(source, target)


def _fill_set(dest: Path, key: str, files: list[Path]) -> Path:
    """Make ``dest`` hold ``files`` (from the download cache) and ``key``, replacing it whole."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for source in files:
        _link_or_copy(source, tmp / source.name)
    (tmp / KEY_FILE).write_text(key + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def seaweedfs_key() -> str:
    return _artifact_key(
        {
            "module": SEAWEEDFS_MODULE,
            "version": SEAWEEDFS_VERSION,
            "env": SEAWEEDFS_BUILD_ENV,
            "flags": list(SEAWEEDFS_BUILD_FLAGS),
            "package": "./weed",
            "platform": sys.platform,
            "machine": platform.machine(),
        }
    )


def _find_go() -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), *GO_FALLBACK_DIRS])
    go = shutil.which("go", path=path)
    if go is None:
        raise WheelhouseError(
            "objectstore set: building SeaweedFS needs Go, and `go` is not on PATH nor in "
            f"{', '.join(GO_FALLBACK_DIRS)}: install Go (https://go.dev/dl/, or the golang "
            "package), the same Go `make setup` uses to build the Pulumi CLI, and run again"
        )
    return go


def _go(go: str, args: list[str], cwd: Path, what: str) -> str:
    cmd = [go, *args]
    env = {**os.environ, **SEAWEEDFS_BUILD_ENV}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise WheelhouseError(f"{what}: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def build_seaweedfs(out: Path) -> None:
    """``go build`` the pinned SeaweedFS module's ``weed`` command into the file ``out``."""
    go = _find_go()
    what = f"objectstore set ({SEAWEEDFS_MODULE}@{SEAWEEDFS_VERSION})"
    with tempfile.TemporaryDirectory(prefix="trainstack-seaweedfs-", dir=out.parent) as work:
        info = json.loads(
            _go(
                go,
                ["mod", "download", "-json", f"{SEAWEEDFS_MODULE}@{SEAWEEDFS_VERSION}"],
                Path(work),
                what,
            )
        )
        # The module cache is read-only and `-mod=mod` may update go.sum: build in a copy.
        src = Path(work) / "src"
        shutil.copytree(info["Dir"], src)
        for path in [src, *src.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        _go(go, ["build", *SEAWEEDFS_BUILD_FLAGS, "-o", str(out), "./weed"], src, what)


def seaweedfs_binary(cache: Path) -> Path:
    """The pinned ``weed`` binary in the download cache, built once."""
    final = cache / f"seaweedfs-{SEAWEEDFS_VERSION}"
    key = seaweedfs_key()
    if _current(final, key, ["weed"]):
        return final / "weed"
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(
        f"wheelhouse: building SeaweedFS {SEAWEEDFS_VERSION} with Go (minutes, once; "
        f"cached in {final})",
        file=sys.stderr,
        flush=True,
    )
    build_seaweedfs(tmp / "weed")
    (tmp / KEY_FILE).write_text(key + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final / "weed"


def build_objectstore_set(dest: Path, cache: Path | None = None) -> Path:
    """``dest/weed``: the SeaweedFS server, from the download cache (built there once)."""
    dest = Path(dest)
    key = seaweedfs_key()
    if _current(dest, key, ["weed"]):
        return dest
    return _fill_set(dest, key, [seaweedfs_binary(cache or download_cache())])


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download_verified(url: str, sha256: str, dest: Path) -> Path:
    """Stream ``url`` to ``dest`` (through ``dest.partial``), checked against ``sha256``."""
    tmp = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    print(f"wheelhouse: downloading {url}", file=sys.stderr, flush=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, tmp.open("wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:  # URLError, timeouts, a full disk
        tmp.unlink(missing_ok=True)
        raise WheelhouseError(f"s3a set: cannot download {url}: {exc}") from exc
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise WheelhouseError(
            f"s3a set: checksum mismatch for {url}: expected SHA-256 {sha256}, "
            f"got {digest.hexdigest()}"
        )
    os.replace(tmp, dest)
    return dest


def maven_jar(jar: MavenJar, cache: Path) -> Path:
    """``jar`` in the download cache (``<cache>/maven/``), downloaded once and verified."""
    path = cache / "maven" / jar.filename
    if path.is_file() and _file_sha256(path) == jar.sha256:
        return path
    return download_verified(jar.url, jar.sha256, path)


def s3a_key(jars: tuple[MavenJar, ...]) -> str:
    return _artifact_key({"jars": sorted([jar.url, jar.sha256] for jar in jars)})


def build_s3a_set(
    dest: Path, cache: Path | None = None, jars: tuple[MavenJar, ...] = S3A_JARS
) -> Path:
    """``dest/<artifact>-<version>.jar`` for each of ``jars``, from the download cache."""
    dest = Path(dest)
    key = s3a_key(jars)
    if _current(dest, key, [jar.filename for jar in jars]):
        return dest
    cache = cache or download_cache()
    return _fill_set(dest, key, [maven_jar(jar, cache) for jar in jars])


def build_node_wheelhouse(
    root: Path, training_dir: Path = TRAINING_DIR, with_training: bool = True
) -> Path:
    """Build every set the roles expect under ``root`` (see module docstring); returns ``root``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for wheel_set in default_sets(training_dir):
        build_wheelhouse(root / wheel_set.name, wheel_set.requirements, wheel_set.nodeps)
    if with_training:
        build_training_wheel(root / "training", training_dir)
    build_objectstore_set(root / "objectstore")
    build_s3a_set(root / "s3a")
    return root


if (
    __name__ == "__main__"
):  # pragma: no cover - manual use: python -m infra.provisioning.wheelhouse DIR
    print(build_node_wheelhouse(Path(sys.argv[1] if len(sys.argv) > 1 else ".wheelhouse")))
