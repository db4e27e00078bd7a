"""The node image as a resource: baked by the roles when its digest is missing, then reused.

The digest covers everything that goes into the image (roles, the image playbook, the pins,
the training package, the base image's id), so the tag `trainstack-node:<digest>` names one
exact content. `pulumi up` bakes it (infra/images) only when the engine lacks that tag; other
stacks and other clones with the same files reuse it. `pulumi destroy` keeps it:
`make clean-images` removes old digests.
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
import pulumi_docker as docker
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from infra.errors import UserFacingError, short_provider_errors, write_details

ROOT = Path(__file__).resolve().parents[2]

short_provider_errors()


def _tag_present(tag: str) -> bool:
    from infra.engine import docker_client, image_id

    return image_id(docker_client(), tag) is not None


class _BakeProvider(ResourceProvider):
    serialize_as_secret_always = False

    def _bake(self, props: dict[str, Any]) -> dict[str, Any]:
        log = Path(props["log_path"])
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "infra.images",
            "bake",
            "--base-image",
            props["base_image"],
            "--repository",
            props["repository"],
            "--wheelhouse",
            props["wheelhouse"],
            "--log",
            str(log),
        ]
        # A child process: ansible-runner forks, which a gRPC-serving process must not do.
        child = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        lines = child.stdout.strip().splitlines()
        try:
            result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            result = {}
        if child.returncode != 0 or result.get("tag") != props["tag"]:
            write_details(log, f"bake exited {child.returncode}; stdout:\n{child.stdout}")
            raise UserFacingError(
                f"node image {props['tag']}: baking failed "
                f"({result.get('error') or f'exit {child.returncode}'}); details: {log}"
            )
        return {
            **props,
            "image_id": result.get("image_id", ""),
            "size_bytes": result.get("size_bytes", 0),
            "bake_s": result.get("duration_s", 0.0),
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(props["tag"], self._bake(props))

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A new digest, or the tag gone from the engine (docker rmi): bake (again).
        changed = olds.get("tag") != news.get("tag") or not _tag_present(news["tag"])
        return DiffResult(changes=changed, replaces=[], stables=[])

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self._bake(news))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        """The image stays for other stacks and the next `up`: `make clean-images` prunes."""


class _ImageBake(Resource, module="image", name="Bake"):
    image_id: pulumi.Output[str]
    size_bytes: pulumi.Output[int]
    bake_s: pulumi.Output[float]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        super().__init__(
            _BakeProvider(),
            name,
            {**props, "image_id": None, "size_bytes": None, "bake_s": None},
            opts,
        )


@dataclass
class NodeImageArgs:
    tag: str  # repository:digest, computed by infra.images from the sources
    base_image: str
    repository: str
    wheelhouse: str
    log_path: str


class NodeImage(pulumi.ComponentResource):
    """The image every local node starts from, baked by the same roles as servers get."""

    image_id: pulumi.Output[str]
    tag: pulumi.Output[str]

    def __init__(
        self, name: str, args: NodeImageArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:image:NodeImage", name, None, opts)
        bake = _ImageBake(
            f"{name}-bake",
            {
                "tag": args.tag,
                "base_image": args.base_image,
                "repository": args.repository,
                "wheelhouse": args.wheelhouse,
                "log_path": args.log_path,
            },
            pulumi.ResourceOptions(
                parent=self, custom_timeouts=pulumi.CustomTimeouts(create="60m", update="60m")
            ),
        )
        # The stock resource for a local image: present after the bake, never pulled, and
        # kept on destroy.
        image = docker.RemoteImage(
            name,
            name=args.tag,
            keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[bake]),
        )
        self.tag = image.name
        self.image_id = image.image_id
        # What the bake that made the image took (0 when the engine already had it).
        self.summary = pulumi.Output.all(image.name, bake.size_bytes, bake.bake_s).apply(
            lambda v: {"tag": v[0], "size_bytes": int(v[1] or 0), "bake_s": float(v[2] or 0)}
        )
        self.register_outputs({"tag": self.tag, "image_id": self.image_id})
