"""Provisioning as a resource: Ansible (through ansible-runner) configures the servers.

It runs after the servers exist, and again only when what it applies changes: the
inventory, the roles, the playbooks, the pinned packages, the training package's source
or the variables (a content hash says which). Task progress is printed as it happens; the
Pulumi CLI shows it under the stack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from infra import digest
from infra.errors import UserFacingError, short_provider_errors, write_details
from infra.provisioning.inventory import S3_SECRET_ENV, SECRET_ENV

ROOT = Path(__file__).resolve().parents[2]
# What provisioning applies; a change in any of these re-runs it.
SOURCES = (
    "roles",
    "playbooks",
    "ansible.cfg",
    "constraints.txt",
    "training",
    "infra/provisioning",
    "infra/components/provisioning.py",
)
short_provider_errors()


def tree_digest(root: Path = ROOT, sources: tuple[str, ...] = SOURCES) -> str:
    """A digest of the files under `sources` (names and bytes), stable across machines."""
    return digest.tree_digest(root, sources)


def integral(value: Any) -> Any:
    """Whole floats back to ints, everywhere in `value`.

    Numbers cross the engine as protobuf doubles, so an inventory read back from Pulumi
    has `trainstack_zookeeper_id: 1.0`, which ZooKeeper's config rejects.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(v) for v in value]
    return value


def _run_child(
    playbook: str,
    wheelhouse: str,
    artifacts: Path,
    env: dict[str, str],
    *,
    mitogen: bool = True,
    cpu_boost: bool = False,
) -> tuple[int, list[str]]:
    """`python -m infra.provisioning` in a child process: its exit code and stdout lines.

    A child, not a call: ansible-runner forks, and forking this gRPC-serving process can
    crash the child (see infra/provisioning/__main__.py). Progress goes to stderr, live.
    The child lifts and restores the CPU limits itself and stops its run (Ansible killed,
    limits restored) when this provider dies, as on a second Ctrl-C to `pulumi up`.
    """
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infra.provisioning",
            "--inventory",
            str(artifacts / "stack-inventory.json"),
            "--playbook",
            playbook,
            "--wheelhouse",
            wheelhouse,
            "--artifacts-dir",
            str(artifacts),
            *([] if mitogen else ["--no-mitogen"]),
            *(["--cpu-boost"] if cpu_boost else []),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = child.stdout.read().splitlines()
    return child.wait(), lines


class _PlaybookProvider(ResourceProvider):
    serialize_as_secret_always = False

    def _run(self, props: dict[str, Any]) -> dict[str, Any]:
        artifacts = Path(props["artifacts_dir"])
        artifacts.mkdir(parents=True, exist_ok=True)
        inventory_file = artifacts / "stack-inventory.json"
        inventory_file.write_text(json.dumps(integral(props["inventory"]), indent=1))
        env = {
            **os.environ,
            SECRET_ENV: props["spark_auth_secret"],
            S3_SECRET_ENV: props.get("s3_secret_key") or "",
            "PYTHONUNBUFFERED": "1",
        }
        code, lines = _run_child(
            props["playbook"],
            props["wheelhouse"],
            artifacts,
            env,
            mitogen=props.get("mitogen", True) is not False,
            cpu_boost=bool(props.get("cpu_boost")),
        )
        log = artifacts / "provisioning.log"
        try:
            result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            write_details(log, f"provisioning exited {code} without a result:\n" + "\n".join(lines))
            raise UserFacingError(
                f"provisioning ({props['playbook']}) stopped without a result (exit {code}); "
                f"details: {log}"
            ) from None
        if not result["ok"]:
            write_details(log, "\n".join(result["failures"]))
            raise UserFacingError(
                f"provisioning ({props['playbook']}) failed:\n  "
                + "\n  ".join(result["failures"])
                + f"\nrunner artifacts: {result['artifacts_dir']}"
            )
        return {
            "playbook": props["playbook"],
            "inventory": props["inventory"],
            "content_hash": props["content_hash"],
            "secret_id": props.get("secret_id", ""),
            # Kept (a secret output) so that a changed key re-runs the playbook.
            "s3_secret_key": props.get("s3_secret_key") or "",
            "wheelhouse": props["wheelhouse"],
            "artifacts_dir": props["artifacts_dir"],
            "cpu_boost": bool(props.get("cpu_boost")),
            "mitogen": props.get("mitogen", True) is not False,
            "stats": result["stats"],
            "duration_s": result["duration_s"],
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._run(props)
        return CreateResult(f"provisioning-{props['content_hash']}", outs)

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # secret_id: the cluster secret's resource id, new on rotation (never the value).
        # s3_secret_key: an external S3 endpoint's key (trainstack:s3SecretKey); a stack from
        # before it has none, which equals "".
        keys = ["playbook", "inventory", "content_hash", "secret_id", "wheelhouse"]
        changed = [k for k in keys if olds.get(k) != news.get(k)]
        if (olds.get("s3_secret_key") or "") != (news.get("s3_secret_key") or ""):
            changed.append("s3_secret_key")
        return DiffResult(changes=bool(changed), replaces=[], stables=[])

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self._run(news))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        """Nothing to undo: the servers it configured are removed by their own resources."""


class _PlaybookRun(Resource, module="ansible", name="PlaybookRun"):
    stats: pulumi.Output[dict]
    duration_s: pulumi.Output[float]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["s3_secret_key"])
        )
        super().__init__(
            _PlaybookProvider(), name, {**props, "stats": None, "duration_s": None}, opts
        )


@dataclass
class ProvisioningArgs:
    inventory: pulumi.Input[dict]
    spark_auth_secret: pulumi.Input[str]
    wheelhouse: str
    artifacts_dir: str
    playbook: str = "site.yml"
    # Lift the CPU limits of Docker nodes while the playbook runs (trainstack:provisionCpuBoost).
    cpu_boost: bool = False
    # Run the playbook with Mitogen for Ansible (trainstack:provisionMitogen).
    mitogen: bool = True
    # The secret's resource id: a rotated secret re-runs the playbook.
    secret_id: pulumi.Input[str] = ""
    # An external S3 endpoint's secret key (trainstack:s3SecretKey); "": none.
    s3_secret_key: pulumi.Input[str] = ""


class Provisioning(pulumi.ComponentResource):
    """Runs the site playbook against the cluster's inventory when its inputs change."""

    stats: pulumi.Output[dict]
    duration_s: pulumi.Output[float]

    def __init__(
        self, name: str, args: ProvisioningArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:cluster:Provisioning", name, None, opts)
        content_hash = tree_digest()
        run = _PlaybookRun(
            f"{name}-site",
            {
                "inventory": args.inventory,
                "spark_auth_secret": pulumi.Output.secret(args.spark_auth_secret),
                "wheelhouse": args.wheelhouse,
                "artifacts_dir": args.artifacts_dir,
                "playbook": args.playbook,
                "content_hash": content_hash,
                "secret_id": args.secret_id,
                "s3_secret_key": pulumi.Output.secret(args.s3_secret_key),
                "cpu_boost": args.cpu_boost,
                "mitogen": args.mitogen,
            },
            pulumi.ResourceOptions(
                parent=self, custom_timeouts=pulumi.CustomTimeouts(create="60m")
            ),
        )
        self.stats = run.stats
        self.duration_s = run.duration_s
        self.content_hash = content_hash
        self.register_outputs({"stats": self.stats, "content_hash": content_hash})
