"""Build the control machine's wheelhouse: every Python wheel the nodes need, downloaded once.

Layout of a wheelhouse root (``trainstack_wheelhouse_dir``)::

    <root>/spark/        pyspark (+ py4j): Spark runtime for ZooKeeper, masters and workers
    <root>/tensorflow/   tensorflow-cpu, tf-keras (no deps) and the training package's other
                         dependencies (pyspark is in spark/ only)
    <root>/training/     the trainstack-training wheel built from ``training/``
    <root>/mlflow/       MLflow with its auth extra (the tracking server and the sync daemon,
                         in a venv layered on the training venv: pip on the node installs
                         only what that venv lacks)

Each set directory holds a ``.trainstack-key`` file: the SHA-256 of the pinned requirement set
(or of the training sources). A set whose key matches is reused as it is (no network, no
rewrite, so the roles' copies stay unchanged and idempotent); otherwise it is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
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


class WheelhouseError(RuntimeError):
    """A wheel could not be downloaded or built; the message names the set and pip's error."""


@dataclass(frozen=True)
class WheelSet:
    name: str
    requirements: list[str]
    nodeps: list[str] = field(default_factory=list)


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
    return root


if (
    __name__ == "__main__"
):  # pragma: no cover - manual use: python -m infra.provisioning.wheelhouse DIR
    print(build_node_wheelhouse(Path(sys.argv[1] if len(sys.argv) > 1 else ".wheelhouse")))
