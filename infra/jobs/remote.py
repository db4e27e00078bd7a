"""Jobs on the cluster's nodes: where they live, which node submits, shipping their code.

Used by the stack's declared job (infra.components.training, from `pulumi up`) and by the
`trainstack` CLI (infra.jobs.commands), over the same transports (infra.transport).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainstack_training import rundir

from infra.errors import UserFacingError
from infra.jobs.package import JobDirError, Packed, pack, unpack_command
from infra.nodes import NODE_PATHS
from infra.transport import Transport, TransportError, transports_for

# The node layout (infra/nodes.py): the venv the roles install into, the runs' shared storage.
NODE_VENV = NODE_PATHS.venv_dir
# The tracking node's venv (MLflow and the training package): `trainstack sync` runs there.
MLFLOW_VENV = NODE_PATHS.mlflow_venv_dir
MODELS_DIR = NODE_PATHS.models_dir
# The jobs' code, content-addressed (<sha>/), on the same shared volume as the runs.
JOBS_DIR = f"{MODELS_DIR}/{rundir.JOBS_DIR}"
# The queue lock: each admission decision, for the stack's job and submitted jobs (flock).
QUEUE_LOCK = f"{MODELS_DIR}/{rundir.QUEUE_LOCK}"
JOB_USER = "trainstack"
# What a login shell on a node gets from the common role's profile (NODE_PATHS.profile_file):
# Spark's client config (the multi-master URL, spark.authenticate and the secret) and the
# Python that executors must run (the node's venv, which has the training package).
NODE_ENV = {
    "SPARK_CONF_DIR": NODE_PATHS.spark_conf_dir,
    "PYSPARK_PYTHON": f"{NODE_VENV}/bin/python",
    "PYTHONUNBUFFERED": "1",
}


class RemoteError(UserFacingError):
    """No node can do it, or shipping failed; the message names the nodes and the cause."""


def _reason(exc: TransportError) -> str:
    """A transport's error without the node's name in front (the caller names the node)."""
    return str(exc).split(": ", 1)[-1].splitlines()[0][:120]


def submitter(candidates: Sequence[Any], *, check_venv: bool = True) -> Transport:
    """The first candidate that is reachable and (with `check_venv`) can start a job (the
    training package is installed): no single node is required to launch or resume a run,
    because the run's directory, data and backup are on storage every node mounts.
    `candidates`: transports, or node records."""
    nodes: list[Transport] = (
        list(candidates)
        if all(isinstance(c, Transport) for c in candidates)
        else transports_for(list(candidates))
    )
    why = []
    for node in nodes:
        try:
            reason = node.unavailable()
        except TransportError as exc:  # nothing reachable at all (no Docker engine)
            raise RemoteError(f"training job: {exc}") from None
        if reason:
            why.append(f"{node.name}: {reason}")
            continue
        if check_venv:
            try:
                code, _ = node.run(["test", "-x", f"{NODE_VENV}/bin/trainstack-train"])
            except TransportError as exc:
                why.append(f"{node.name}: cannot run a command ({_reason(exc)})")
                continue
            if code != 0:
                why.append(
                    f"{node.name}: {NODE_VENV}/bin/trainstack-train is missing (not provisioned)"
                )
                continue
        if why:
            print(f"submitting from {node.name}; skipped {'; '.join(why)}", file=sys.stderr)
        return node
    remedies = list(dict.fromkeys(node.remedy for node in nodes)) or ["start one"]
    raise RemoteError(
        "training job: no node can submit the job ("
        + "; ".join(why)
        + "); "
        + " or ".join(remedies)
        + " and run `pulumi up` again"
    )


def ship(node: Transport, packed: Packed) -> str:
    """Put packed code on the cluster's shared storage at JOBS_DIR/<sha> (once per sha: the
    same code is never shipped again); returns that directory."""
    dest = f"{JOBS_DIR}/{packed.sha}"
    try:
        code, _ = node.run(["test", "-f", f"{dest}/trainstack.toml"], user=JOB_USER)
        if code == 0:
            return dest
        archive = f"{JOBS_DIR}/.{packed.sha}.tar.gz"
        node.run(["mkdir", "-p", JOBS_DIR], user=JOB_USER)
        node.put(archive, packed.data, mode=0o644, user=JOB_USER)
        code, out = node.run(unpack_command(archive, dest), user=JOB_USER)
    except TransportError as exc:
        raise RemoteError(f"cannot ship the job's code: {exc}") from None
    if code != 0:
        said = out.decode(errors="replace").strip()[-300:]
        raise RemoteError(f"cannot unpack the job's code into {dest}: {said}")
    print(
        f"job code {packed.short} shipped to {dest} ({len(packed.files)} files, "
        f"{packed.size / 1e6:.2f} MB)",
        file=sys.stderr,
    )
    return dest


def ship_directory(node: Transport, source: str, sha: str) -> str:
    """Pack `source` again and ship it; refuses a directory that no longer packs to `sha`
    (it changed since the program read it: it is not run unseen)."""
    dest = f"{JOBS_DIR}/{sha}"
    try:
        code, _ = node.run(["test", "-f", f"{dest}/trainstack.toml"], user=JOB_USER)
    except TransportError as exc:
        raise RemoteError(f"cannot ship the job's code: {exc}") from None
    if code == 0:
        print(f"job code {sha[:12]} is on the cluster already", file=sys.stderr)
        return dest
    try:
        packed = pack(Path(source))
    except JobDirError as exc:
        raise RemoteError(str(exc)) from None
    if packed.sha != sha:
        raise RemoteError(
            f"{source} changed while `pulumi up` ran (code {packed.short}, expected "
            f"{sha[:12]}); run `pulumi up` again"
        )
    return ship(node, packed)


def sync_tracking(setup: dict[str, Any], stack: str, job: str = "") -> dict[str, Any]:
    """Sync a job's MLflow run (every job's without `job`) now, on the tracking node, as the
    daemons' user: the JSON line of `python -m trainstack_training.tracking sync` (its `synced`
    list). `setup` is the stack's `tracking` output (infra.program). The sync daemon on that
    node does the same every few seconds; both take the run's lock (tracking/sync.py)."""
    if not setup.get("node"):
        raise RemoteError("tracking is off on this stack (trainstack:tracking)")
    node = transports_for([setup["node"]])[0]
    command = [
        f"{MLFLOW_VENV}/bin/python", "-m", "trainstack_training.tracking", "sync",
        "--models-dir", MODELS_DIR, "--tracking-uri", str(setup.get("tracking_uri", "")),
        "--auth-file", str(setup.get("auth_file", "")), "--ui-url", str(setup.get("ui_url", "")),
        "--stack", stack, *(["--job", job] if job else []),
    ]  # fmt: skip
    try:
        code, out = node.run(command, user=JOB_USER)
    except TransportError as exc:
        raise RemoteError(f"sync on {node.name}: {_reason(exc)}") from None
    lines = out.decode(errors="replace").strip().splitlines()
    found = [line for line in lines if line.startswith("{")]
    # Exit 1 with a JSON line: some run had an error, which its entry names.
    if code not in (0, 1) or not found:
        raise RemoteError(f"sync on {node.name}: {lines[-1] if lines else f'exit {code}'}")
    return dict(json.loads(found[-1]))
