"""torch for the torch jobs of the tests and benchmarks on this machine: the digits-torch
example's requirements, resolved and installed as a job's packages are (infra.jobs.envs: the
lock and its 2.8 GB of wheels cached in ~/.cache/trainstack/envs), into an overlay, once per
lock (about 70 s)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH_OVERLAYS = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / (
    "trainstack/test-overlays"
)


def torch_overlay() -> str:
    """The site directory of an overlay with torch in it (what --job-env names)."""
    from infra.jobs.envs import resolve

    env = resolve(ROOT / "examples" / "digits-torch", "requirements.txt")
    assert env is not None
    done = TORCH_OVERLAYS / env.sha
    if not (done / ".complete").exists():
        partial = TORCH_OVERLAYS / f".{env.sha}.partial.{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        wheels = sorted(str(w) for w in env.wheels.glob("*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
             "--disable-pip-version-check", "--target", str(partial / "site"), *wheels],
            check=True, timeout=900,
        )  # fmt: skip
        (partial / ".complete").touch()
        shutil.rmtree(done, ignore_errors=True)
        partial.rename(done)
    return str(done / "site")
