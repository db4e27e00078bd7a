"""Bake the node image: the same roles, through the same ansible-runner path, then `docker commit`.

Mechanism (as Packer's docker builder with its Ansible provisioner): start a builder container
from the base image, run ``playbooks/image.yml`` on it through
``infra.provisioning.runner.run_playbook`` over the ``docker`` connection (the
roles' install parts only: ``trainstack_bake=true`` skips every per-node configure part), then
commit the container as ``<repository>:<digest>`` with supervisord as its main process. Why not
a Dockerfile: it would be a second copy of the install steps that drifts from the roles, which
must still install everything on a bare SSH server; and a commit needs no registry and no
build context (the wheelhouse is bind-mounted read-only, so no wheel lands in an image layer).

The tag is a digest of everything that goes in (``image_digest``): the roles, the image
playbook, ansible.cfg, the pins, the training package's sources, the base image's name and id.
A tag that exists is reused as it is; ``force=True`` bakes again.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from infra.digest import tree_digest
from infra.engine import EngineError, docker_client
from infra.nodes import NODE_PATHS, WHEELHOUSE_MOUNT
from infra.provisioning.runner import TaskEvent, run_playbook
from infra.provisioning.wheelhouse import WheelhouseError, build_node_wheelhouse

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BASE_IMAGE = "debian:bookworm"
DEFAULT_REPOSITORY = "trainstack-node"
DEFAULT_WHEELHOUSE = Path.home() / ".cache" / "trainstack" / "wheelhouse"
DEFAULT_LOG_DIR = REPO_ROOT / ".provisioning" / "images"
# supervisord is the main process of every container from the image: it keeps the daemons up,
# and the supervisor role finds it running instead of starting a second one.
NODE_CMD = ["/usr/bin/supervisord", "-n", "-c", "/etc/supervisor/supervisord.conf"]
LABEL_IMAGE = "org.trainstack.image"
LABEL_DIGEST = "org.trainstack.digest"
LABEL_BUILDER = "org.trainstack.builder"
# Bump when the bake procedure itself (not its inputs) changes what ends up in the image.
BAKE_FORMAT = "2"
# Run in the builder before the commit: no apt archives, no pid file or socket of a supervisord
# that a package script may have started, no Ansible or pip leftovers. /var/lib/apt/lists stays,
# so the roles' package task (cache_valid_time) finds a fresh index on a new node.
CLEANUP = (
    "if [ -x /etc/init.d/supervisor ]; then /etc/init.d/supervisor stop >/dev/null 2>&1; fi; "
    "apt-get clean; "
    "rm -rf /var/run/supervisord.pid /var/run/supervisor.sock /root/.ansible /root/.cache/pip "
    "/tmp/* /var/tmp/*; true"
)

# What the digest covers (relative to the repository root).
_DIGEST_TREES = ("roles", "training")
_DIGEST_FILES = (
    "playbooks/image.yml",
    "playbooks/bootstrap.yml",
    "playbooks/group_vars/all.yml",
    "ansible.cfg",
    "constraints.txt",
)
_PINS_FILE = "infra/provisioning/wheelhouse.py"
_LAYOUT = "infra/nodes.py#layout"
_PIN_LINE = re.compile(r'^[A-Z][A-Z0-9_]* = "[^"]*"', re.MULTILINE)


class BakeError(RuntimeError):
    """The image could not be baked; the message is one sentence naming what and where."""


@dataclass(frozen=True)
class BakeResult:
    tag: str  # <repository>:<digest>
    image_id: str  # sha256:...
    size_bytes: int
    duration_s: float
    baked: bool  # False: the tag existed and was reused

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["duration_s"] = round(self.duration_s, 1)
        return data


def image_digest(base_image: str, base_image_id: str, *, root: Path = REPO_ROOT) -> str:
    """The digest of everything that goes into the image (`infra.digest.tree_digest`).

    The base image counts by name and by id (a re-pulled tag is another base); of the pins
    file only its pin lines count; the node layout counts by its values (``NODE_PATHS``: it
    reaches the roles through the inventory, not through a file above, so the values of the
    running program count, whatever `root`).
    """
    pins = root / _PINS_FILE
    text = pins.read_text() if pins.is_file() else ""
    return tree_digest(
        root,
        (*_DIGEST_TREES, *_DIGEST_FILES),
        header=f"format={BAKE_FORMAT}\0cmd={NODE_CMD}\0base={base_image}\0id={base_image_id}\0",
        extra=[
            (_PINS_FILE + "#pins", "\n".join(_PIN_LINE.findall(text)).encode()),
            (_LAYOUT, json.dumps(NODE_PATHS.inventory_vars(), sort_keys=True).encode()),
        ],
    )


def image_tag(repository: str = DEFAULT_REPOSITORY, digest: str = "") -> str:
    """``<repository>:<digest>``, e.g. ``trainstack-node:0123456789abcdef``."""
    if not digest:
        raise ValueError("image_tag needs a digest (see image_digest)")
    return f"{repository}:{digest}"


def _client() -> docker.DockerClient:
    """The program's engine client (`infra.engine.docker_client`), its error as a BakeError."""
    try:
        return docker_client()
    except EngineError as exc:
        raise BakeError(str(exc)) from None


def _first_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _base_image_id(client: docker.DockerClient, base_image: str) -> str:
    try:
        return str(client.images.get(base_image).id)
    except docker.errors.ImageNotFound as exc:
        raise BakeError(
            f"base image {base_image} is not on this engine (no registry is reachable here: "
            "run `scripts/setup.sh base_image`)"
        ) from exc


def current_digest(base_image: str = DEFAULT_BASE_IMAGE) -> str:
    """The digest of the image the current sources would bake from ``base_image``."""
    client = _client()
    return image_digest(base_image, _base_image_id(client, base_image))


def _existing(client: docker.DockerClient, tag: str) -> Any | None:
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _build_wheelhouse(wheelhouse: Path) -> Path:
    try:
        return build_node_wheelhouse(wheelhouse)
    except WheelhouseError as exc:
        lines = [x.strip() for x in str(exc).strip().splitlines() if x.strip()]
        cause = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
        raise BakeError(f"cannot fill the wheelhouse at {wheelhouse}: {cause}") from exc
    except OSError as exc:
        raise BakeError(
            f"cannot create the wheelhouse at {wheelhouse}: {exc.strerror or exc}"
        ) from exc


def _container_name(repository: str, digest: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", repository)
    return f"{safe}-builder-{digest}-{uuid.uuid4().hex[:4]}"


# A baked node image is about 3.5 GB, and the builder container's layer as much again while
# it is committed; below this, baking would fill the disk half-way through and fail obscurely.
MIN_FREE_BYTES_TO_BAKE = 8 * 1024**3


def free_bytes(client: Any) -> tuple[str, int] | None:
    """The engine's data root and its free bytes, or None when it is not on this machine."""
    try:
        root = str(client.info().get("DockerRootDir") or "")
        return root, shutil.disk_usage(root).free
    except (OSError, docker.errors.DockerException):
        return None


def _check_free_space(client: Any) -> None:
    found = free_bytes(client)
    if found is None:
        return  # a remote engine: its disk is not ours to measure
    root, free = found
    if free < MIN_FREE_BYTES_TO_BAKE:
        raise BakeError(
            f"only {free / 1024**3:.1f} GB are free under the engine's data root {root}; baking "
            f"needs {MIN_FREE_BYTES_TO_BAKE / 1024**3:.0f} GB: remove node images of other "
            "digests with `make clean-images` (or `docker image prune`) and try again"
        )


def bake(
    base_image: str = DEFAULT_BASE_IMAGE,
    repository: str = DEFAULT_REPOSITORY,
    wheelhouse: Path = DEFAULT_WHEELHOUSE,
    log_path: Path | None = None,
    force: bool = False,
    *,
    progress: Callable[[str], None] | None = _stderr,
) -> BakeResult:
    """Bake ``<repository>:<digest>`` from ``base_image`` (or reuse it when it exists).

    ``wheelhouse`` is the control machine's wheelhouse root (built first, cached);
    ``log_path`` receives the full Ansible output (default
    ``.provisioning/images/<repository>-<digest>.log``). ``progress`` gets one line per step
    and per task result (default: stderr). Raises ``BakeError`` with one sentence.
    """
    started = time.monotonic()
    client = _client()
    digest = image_digest(base_image, _base_image_id(client, base_image))
    tag = image_tag(repository, digest)
    image = _existing(client, tag)
    if image is not None and not force:
        _say(progress, f"image {tag} exists (use --force to bake it again)")
        return BakeResult(
            tag, str(image.id), int(image.attrs.get("Size", 0)), time.monotonic() - started, False
        )

    _check_free_space(client)
    wheelhouse = Path(wheelhouse).expanduser()
    _say(progress, f"wheelhouse {wheelhouse} (downloads only what is missing)")
    _build_wheelhouse(wheelhouse)

    log_path = Path(log_path) if log_path else DEFAULT_LOG_DIR / f"{tag.replace(':', '-')}.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("w")
    except OSError as exc:
        raise BakeError(f"cannot write the bake log {log_path}: {exc.strerror or exc}") from exc

    name = _container_name(repository, digest)
    container = None
    try:
        with log:
            log.write(f"baking {tag} from {base_image} in builder container {name}\n")
            _say(progress, f"builder container {name} from {base_image}")
            try:
                container = client.containers.run(
                    base_image,
                    command=["sleep", "infinity"],
                    name=name,
                    hostname="trainstack-builder",
                    detach=True,
                    init=True,
                    labels={LABEL_BUILDER: "true"},
                    # A mount, not `volumes=`: the SDK would also declare VOLUME in the
                    # container's config, which the committed image would inherit.
                    mounts=[
                        docker.types.Mount(
                            WHEELHOUSE_MOUNT, str(wheelhouse), type="bind", read_only=True
                        )
                    ],
                )
            except docker.errors.DockerException as exc:
                raise BakeError(
                    f"cannot start the builder container from {base_image}: {_first_line(exc)}"
                ) from exc
            _run_image_playbook(name, wheelhouse, log, log_path, tag, progress)
            _say(progress, "cleaning apt archives and leftovers, committing")
            code, out = container.exec_run(["sh", "-c", CLEANUP])
            log.write(f"cleanup (exit {code}): {out.decode(errors='replace')}\n")
            image = container.commit(
                repository=repository,
                tag=digest,
                changes=[
                    "CMD " + _json_list(NODE_CMD),
                    f"LABEL {LABEL_IMAGE}=node {LABEL_DIGEST}={digest} {LABEL_BUILDER}=false",
                ],
            )
            image.reload()
            result = BakeResult(
                tag,
                str(image.id),
                int(image.attrs.get("Size", 0)),
                time.monotonic() - started,
                True,
            )
            log.write(f"baked {tag} ({result.image_id}, {result.size_bytes} bytes)\n")
            return result
    finally:
        if container is not None:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)


def _json_list(items: list[str]) -> str:
    return "[" + ",".join(f'"{x}"' for x in items) + "]"


def _run_image_playbook(
    container_name: str,
    wheelhouse: Path,
    log: Any,
    log_path: Path,
    tag: str,
    progress: Callable[[str], None] | None,
) -> None:
    inventory = {
        "all": {
            "hosts": {
                "builder": {
                    "ansible_connection": "docker",
                    "ansible_host": container_name,
                    "ansible_python_interpreter": "/usr/bin/python3",
                }
            },
            "vars": {
                # The node layout, as in a stack's inventory (infra.topology.inventory).
                **NODE_PATHS.inventory_vars(),
                "trainstack_wheelhouse_dir": str(wheelhouse),
                "trainstack_wheelhouse_mount": WHEELHOUSE_MOUNT,
                "trainstack_image_digest": tag.rsplit(":", 1)[1],
            },
        }
    }

    def on_event(event: TaskEvent) -> None:
        if event.status != "skipped":
            _say(progress, str(event))

    artifacts = log_path.parent / "runner"
    try:
        result = run_playbook(
            inventory,
            "image.yml",
            on_event=on_event,
            artifacts_dir=artifacts,
            forks=1,  # one builder host
            envvars={"ANSIBLE_PIPELINING": "True"},
        )
    except Exception as exc:  # ansible-runner could not start ansible-playbook at all
        log.write(f"ansible-runner failed to start: {exc}\n")
        raise BakeError(
            f"baking {tag} failed: ansible-runner did not run ({_first_line(exc)}); "
            f"full log: {log_path}"
        ) from exc
    stdout = result.artifacts_dir / "stdout" if result.artifacts_dir else None
    if stdout is not None and stdout.is_file():
        with stdout.open() as fh:
            shutil.copyfileobj(fh, log)
    log.write("\n" + result.summary() + "\n")
    log.flush()
    _say(progress, f"image playbook {result.status} in {result.duration_s:.0f}s")
    if not result.ok:
        failure = result.failures[0] if result.failures else None
        what = f"task '{failure.task}' failed" if failure else f"ansible-runner {result.status}"
        cause = _first_line(failure.message) if failure and failure.message else ""
        cause = cause[:200] + ("..." if len(cause) > 200 else "")
        raise BakeError(
            f"baking {tag} failed: {what}{': ' + cause if cause else ''}; full log: {log_path}"
        )


def _clean(
    client: docker.DockerClient, repository: str, keep_digest: str
) -> tuple[list[str], list[str]]:
    in_use: dict[str, str] = {}
    for c in client.containers.list(all=True):
        in_use.setdefault(str(c.attrs.get("Image", "")), c.name)
    removed: list[str] = []
    skipped: list[str] = []
    for image in client.images.list(name=repository):
        for tag in image.tags:
            repo, _, digest = tag.rpartition(":")
            if repo != repository or digest == keep_digest:
                continue
            user = in_use.get(str(image.id))
            if user is not None:
                skipped.append(f"{tag} (used by container {user})")
                continue
            try:
                client.images.remove(tag)
            except docker.errors.APIError as exc:
                skipped.append(f"{tag} ({_first_line(exc.explanation or exc)})")
                continue
            removed.append(tag)
    return removed, skipped


@dataclass(frozen=True)
class CleanResult:
    kept: str  # the tag kept: <repository>:<keep digest>
    removed: list[str]
    skipped: list[str]  # "<tag> (<why>)": in use by a container, or the engine refused

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def clean(
    repository: str = DEFAULT_REPOSITORY,
    keep_digest: str | None = None,
    *,
    base_image: str = DEFAULT_BASE_IMAGE,
    progress: Callable[[str], None] | None = _stderr,
) -> CleanResult:
    """Remove the ``<repository>:*`` tags other than ``keep_digest`` (default: the digest the
    current sources give on ``base_image``). Images that a container (running or stopped)
    uses are kept and reported through ``progress``."""
    client = _client()
    keep = keep_digest if keep_digest is not None else current_digest(base_image)
    removed, skipped = _clean(client, repository, keep)
    for item in skipped:
        _say(progress, f"kept {item}")
    return CleanResult(image_tag(repository, keep), removed, skipped)
