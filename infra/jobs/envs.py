"""A job's own packages: resolved on this machine, installed once per lock on the cluster.

The nodes reach no package index, so a job's requirements file is resolved here, where one
is reachable: `pip download` fetches wheels for the nodes' Python (CPython 3.11, Linux
x86_64) under the project's pins (constraints.txt), so the nodes' TensorFlow, PySpark and
NumPy are never replaced. The lock is the exact set of wheels that came back; its digest
names the environment. The wheels the nodes do not have already are shipped once and
installed (offline, without dependencies: the lock is complete) into an overlay on shared
storage, ENVS_DIR/<lock digest>/site, which the job's processes put on sys.path after their
own code. An unchanged requirements file costs no download (the lock is cached here, in
CACHE_DIR) and no install (the overlay is on the cluster already).

Used by `trainstack submit` (infra.jobs.commands) and the stack's declared job
(infra.components.training).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from infra.errors import UserFacingError
from infra.nodes import NODE_PATHS
from infra.transport import Transport, TransportError

# Where overlays live on the nodes (shared storage, beside the runs and the jobs' code).
ENVS_DIR = f"{NODE_PATHS.models_dir}/envs"
# Where locks and their wheels are cached on this machine.
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "trainstack" / "envs"
CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"
# The nodes' interpreter (Debian bookworm's CPython 3.11, glibc 2.36, x86_64): pip takes
# wheels for it, whatever this machine runs. pip does not widen a manylinux tag given with
# --platform to the older ones the interpreter also accepts, so they are listed.
NODE_PYTHON = (
    "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3",
    "--abi", "none",
    *(f for minor in range(36, 4, -1) for f in ("--platform", f"manylinux_2_{minor}_x86_64")),
    "--platform", "manylinux2014_x86_64", "--platform", "manylinux2010_x86_64",
    "--platform", "manylinux1_x86_64",
)  # fmt: skip
# Packages of the node venv that a job's overlay may shadow with another version: packaging
# tools the platform does not import while it runs (torch's triton needs setuptools>=77; the
# nodes' venv has Debian's 66.1.1).
SHADOWABLE = frozenset({"setuptools"})
DOWNLOAD_TIMEOUT_S = 600
INSTALL_TIMEOUT_S = 600
# The packages the platform itself runs on (a requirement's name -> the nodes' package): a
# job may name them only at the nodes' version, and they are never downloaded again.
PLATFORM_PACKAGES = {
    "tensorflow": "tensorflow-cpu",  # the nodes run TensorFlow's CPU build under this name
    "tensorflow-cpu": "tensorflow-cpu",
    "keras": "keras",
    "pyspark": "pyspark",
    "numpy": "numpy",
    "protobuf": "protobuf",
}


class EnvError(UserFacingError):
    """A requirements file that cannot be installed; the message names it and the fix."""


@dataclass(frozen=True)
class Env:
    """A resolved requirements file: its lock and the wheels that make it."""

    sha: str
    """Hex sha256 of the lock (one `name==version` per line): the overlay's name."""
    lock: tuple[str, ...]
    wheels: Path
    """The directory that holds the lock's wheels on this machine."""

    @property
    def short(self) -> str:
        return self.sha[:12]

    @property
    def site(self) -> str:
        """The overlay's directory on the nodes (what the job puts on sys.path)."""
        return f"{ENVS_DIR}/{self.sha}/site"


def read_pins(constraints: Path = CONSTRAINTS) -> dict[str, str]:
    """The project's pins: canonical name -> version."""
    pins: dict[str, str] = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.split(";")[0].strip()
    return pins


def requirement_lines(path: Path) -> list[Requirement]:
    """The requirements in `path`: one plain requirement per line (name, extras, version
    specifiers, markers). Options, includes, editables and URLs are refused by line."""
    found = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path.name}:{number}"
        if line.startswith("-"):
            raise EnvError(
                f"{where}: {line!r}: pip options, includes and editables are not supported; "
                "list packages by name, for example tabulate==0.9.0"
            )
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise EnvError(f"{where}: {line!r} is not a requirement: {exc}") from None
        if req.url:
            raise EnvError(
                f"{where}: {line!r}: URLs are not supported (the nodes reach no network); "
                "name a package on the index instead"
            )
        found.append(req)
    return found


def check_pins(
    requirements: list[Requirement], pins: dict[str, str], where: str
) -> list[Requirement]:
    """Refuse a requirement that conflicts with a pin of the packages the platform runs on;
    returns the requirements left to download (those the nodes' packages satisfy are not)."""
    left = []
    for req in requirements:
        node_name = PLATFORM_PACKAGES.get(canonicalize_name(req.name))
        pinned = pins.get(node_name or "")
        if node_name is None or not pinned:
            left.append(req)
            continue
        if not req.specifier.contains(pinned, prereleases=True):
            raise EnvError(
                f"{where} asks for {req}, but the nodes run {node_name} {pinned}, which the "
                f"platform needs (constraints.txt); drop the version or accept {pinned}"
            )
    return left


def _key(requirements: list[Requirement], constraints: Path) -> str:
    text = "\n".join(sorted(str(r) for r in requirements))
    digest = hashlib.sha256(text.encode())
    digest.update(constraints.read_bytes())
    digest.update(" ".join(NODE_PYTHON).encode())
    return digest.hexdigest()


def _lock_of(wheels: Path) -> tuple[str, ...]:
    lock = []
    for wheel in sorted(wheels.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        lock.append(f"{name}=={version}")
    return tuple(sorted(lock))


def resolve(
    directory: Path,
    requirements_file: str,
    *,
    constraints: Path = CONSTRAINTS,
    cache: Path = CACHE_DIR,
) -> Env | None:
    """The job's environment (None when it lists no requirements), downloaded once per
    requirements file and pins; raises EnvError with one sentence otherwise."""
    if not requirements_file:
        return None
    path = directory / requirements_file
    requirements = requirement_lines(path)
    if not requirements:
        return None
    requirements = check_pins(requirements, read_pins(constraints), requirements_file)
    if not requirements:  # only packages the nodes have: an empty overlay
        return Env(hashlib.sha256(b"").hexdigest(), (), cache / "none")
    entry = cache / _key(requirements, constraints)
    if not (entry / "lock.json").is_file():
        _download(requirements, requirements_file, constraints, entry)
    lock = tuple(json.loads((entry / "lock.json").read_text()))
    return Env(hashlib.sha256("\n".join(lock).encode()).hexdigest(), lock, entry / "wheels")


def _download(requirements: list[Requirement], where: str, constraints: Path, entry: Path) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".download-"))
    try:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--only-binary=:all:", *NODE_PYTHON, "--dest", str(tmp / "wheels"),
            "-c", str(constraints), *(str(r) for r in requirements),
        ]  # fmt: skip
        print(f"resolving {where} for the nodes (pip download) ...", file=sys.stderr, flush=True)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise EnvError(
                f"{where}: pip download took more than {DOWNLOAD_TIMEOUT_S} s; is a package "
                "index reachable from this machine?"
            ) from None
        if done.returncode != 0:
            said = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
            reason = next((ln for ln in said if ln.startswith("ERROR")), said[-1] if said else "")
            raise EnvError(
                f"{where} cannot be installed on the nodes (CPython 3.11, Linux x86_64, "
                f"wheels only, under constraints.txt): {reason[:400]}"
            )
        (tmp / "lock.json").write_text(json.dumps(list(_lock_of(tmp / "wheels"))))
        if not entry.exists():  # else another process resolved the same file meanwhile
            os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _node_packages(node: Transport, python: str) -> dict[str, str]:
    code, out = node.run(
        [python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"]
    )
    if code != 0:
        said = out.decode(errors="replace").strip()[-300:]
        raise EnvError(f"{node.name}: cannot list the node's packages: {said}")
    return {canonicalize_name(p["name"]): p["version"] for p in json.loads(out)}


def install_script(archive: str, env_dir: str, python: str) -> str:
    """The node-side install: once per lock (a lock file serialises concurrent submits),
    offline, into a partial directory renamed into place when complete. `archive` is a
    plain tar of wheels (pack_wheels); it and the partial directory are removed however the
    script ends."""
    q = shlex.quote
    return f"""set -eu
env={q(env_dir)}
archive={q(archive)}
partial=
trap 'rm -f "$archive"; [ -z "$partial" ] || rm -rf "$partial"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$(dirname "$env")"
exec 9>"$env.lock"
flock -w {INSTALL_TIMEOUT_S} 9
if [ ! -f "$env/.complete" ]; then
  partial="$env.partial.$$"
  rm -rf "$partial" && mkdir -p "$partial/wheels"
  tar -xf "$archive" -C "$partial/wheels"
  if ls "$partial"/wheels/*.whl >/dev/null 2>&1; then
    timeout {INSTALL_TIMEOUT_S} {q(python)} -m pip install --quiet --no-index --no-deps \\
      --disable-pip-version-check --target "$partial/site" "$partial"/wheels/*.whl
  fi
  mkdir -p "$partial/site" && rm -rf "$partial/wheels" && touch "$partial/.complete"
  rm -rf "$env" && mv -T "$partial" "$env"
fi
"""


def pack_wheels(wheels: list[Path], archive: Path) -> None:
    """Write `wheels` into the file `archive` as a plain tar: wheels are zip files, compressed
    already (gzip would spend a core for nothing), and the tar is written to disk, never held
    in memory (a PyTorch lock is about 3 GB)."""
    with tarfile.open(archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)


@dataclass(frozen=True)
class Staged:
    """A job's packages made ready on the cluster: `site` is the overlay's site directory;
    `script` the node-side install still to run (install_script), "" when the overlay is
    there already."""

    site: str
    script: str


def stage(node: Transport, env: Env, python: str, user: str) -> Staged:
    """Check `env` against the nodes' packages and ship the wheels the nodes lack (once per
    lock). A version the nodes pin otherwise is an EnvError here, before anything runs."""
    env_dir = f"{ENVS_DIR}/{env.sha}"
    try:
        code, _ = node.run(["test", "-f", f"{env_dir}/.complete"], user=user)
        if code == 0:
            print(f"packages {env.short} are on the cluster already", file=sys.stderr)
            return Staged(env.site, "")
        have = _node_packages(node, python)
        ship = []
        for wheel in sorted(env.wheels.glob("*.whl")):
            name, version, _, _ = parse_wheel_filename(wheel.name)
            if have.get(name) == str(version):
                continue  # the node venv has it: the overlay does not shadow it
            if name in have and name not in SHADOWABLE:
                raise EnvError(
                    f"the requirements need {name} {version}, but the nodes run "
                    f"{name} {have[name]}; pin {name}=={have[name]} in the requirements file"
                )
            ship.append(wheel)
        # A name of its own per staging: two submits of one lock never write one file, and
        # each install script removes only the archive it was made with.
        archive = f"{ENVS_DIR}/.{env.sha}.{secrets.token_hex(6)}.tar"
        # The temporary tar beside the cached wheels (the same disk; /tmp may be memory).
        near = env.wheels.parent if env.wheels.is_dir() else None
        with tempfile.TemporaryDirectory(dir=near, prefix=".ship-") as tmp:
            local = Path(tmp) / "wheels.tar"
            pack_wheels(ship, local)
            node.run(["mkdir", "-p", ENVS_DIR], user=user)
            node.put_file(archive, local, mode=0o644, user=user)
    except TransportError as exc:
        raise EnvError(f"cannot ship the job's packages: {exc}") from None
    names = ", ".join(w.name.split("-")[0] for w in ship) or "nothing new"
    print(f"packages {env.short} shipped to the cluster ({names})", file=sys.stderr)
    return Staged(env.site, install_script(archive, env_dir, python))


def install(node: Transport, env: Env, python: str, user: str) -> str:
    """Install `env` into its overlay on the cluster's shared storage (once per lock), now,
    and return the overlay's site directory (the stack's declared job; a submitted job
    installs in its `installing` state instead: trainstack_training.queue)."""
    staged = stage(node, env, python, user)
    if not staged.script:
        return staged.site
    print(f"installing packages {env.short} on the cluster ...", file=sys.stderr)
    try:
        code, out = node.run(["sh", "-c", staged.script], user=user)
    except TransportError as exc:
        raise EnvError(f"cannot install the job's packages: {exc}") from None
    if code != 0:
        said = out.decode(errors="replace").strip()[-400:]
        raise EnvError(f"installing the job's packages on {node.name} failed: {said}")
    return staged.site
