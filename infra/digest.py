"""One digest of a set of source trees: what the node image and provisioning are made from.

Both the image's tag (`infra.images.bake.image_digest`) and provisioning's trigger
(`infra.components.provisioning`) ask "did anything that goes onto a node change?". They read
the same files the same way here: relative paths in sorted order (the same digest in any clone
on any machine), build output and caches left out, and docs (`*.md`, a role's README) left out,
since they change nothing on a node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

SKIP_PARTS = frozenset(
    {"build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
)
SKIP_SUFFIXES = frozenset({".pyc", ".pyo", ".md"})
MISSING = b"<missing>"


def skipped(rel: Path) -> bool:
    """Build output, caches and docs: nothing of them reaches a node."""
    return rel.suffix in SKIP_SUFFIXES or any(
        p in SKIP_PARTS or p.endswith(".egg-info") for p in rel.parts
    )


def tree_files(root: Path, sources: Iterable[str]) -> Iterator[tuple[str, bytes]]:
    """(relative path, bytes) of every file under `sources` (directories or files, relative to
    `root`), in the order given and sorted within a directory. A missing source counts as
    `MISSING`, so removing a file changes the digest."""
    for source in sources:
        base = root / source
        if base.is_file():
            yield source, base.read_bytes()
        elif base.is_dir():
            for path in sorted(base.rglob("*")):
                rel = path.relative_to(root)
                if path.is_file() and not skipped(rel):
                    yield rel.as_posix(), path.read_bytes()
        else:
            yield source, MISSING


def tree_digest(
    root: Path,
    sources: Iterable[str],
    *,
    header: str = "",
    extra: Iterable[tuple[str, bytes]] = (),
) -> str:
    """SHA-256 (first 16 hex digits) of `header`, then each file's path and content digest,
    then the `extra` (name, bytes) entries."""
    h = hashlib.sha256(header.encode())
    for rel, content in (*tree_files(Path(root), sources), *extra):
        h.update(rel.encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()[:16]
