"""Bake, list or clean the node image: `python -m infra.images {bake,clean,digest} --help`.

Progress goes to stderr; the last line on stdout is the result as JSON. Errors are one
sentence on stderr (exit 1, no traceback) and ``{"error": "<sentence>"}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from infra.provisioning.wheelhouse import WheelhouseError

from .bake import (
    DEFAULT_BASE_IMAGE,
    DEFAULT_REPOSITORY,
    DEFAULT_WHEELHOUSE,
    BakeError,
    bake,
    clean,
    current_digest,
    image_tag,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m infra.images", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--base-image", default=DEFAULT_BASE_IMAGE, help="base image (local)")
        p.add_argument("--repository", default=DEFAULT_REPOSITORY, help="image repository")

    p_bake = sub.add_parser("bake", help="bake <repository>:<digest> unless it exists")
    common(p_bake)
    p_bake.add_argument("--force", action="store_true", help="bake even if the tag exists")
    p_bake.add_argument(
        "--wheelhouse", type=Path, default=DEFAULT_WHEELHOUSE, help="wheelhouse root"
    )
    p_bake.add_argument("--log", type=Path, default=None, help="full Ansible output (a file)")
    p_clean = sub.add_parser("clean", help="remove <repository> tags of other digests")
    common(p_clean)
    p_digest = sub.add_parser("digest", help="print the digest and tag of the current sources")
    common(p_digest)
    return parser


def _fail(message: str, code: int) -> int:
    """The error as one sentence on stderr, and as JSON on stdout's last line for callers."""
    print(f"error: {message}", file=sys.stderr)
    print(json.dumps({"error": message}), flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "bake":
            result = bake(args.base_image, args.repository, args.wheelhouse, args.log, args.force)
            out: dict = result.to_json()
        elif args.command == "clean":
            out = clean(args.repository, base_image=args.base_image).to_json()
        else:
            digest = current_digest(args.base_image)
            out = {"digest": digest, "tag": image_tag(args.repository, digest)}
    except (BakeError, WheelhouseError) as exc:
        return _fail(str(exc).strip().splitlines()[0], 1)
    except KeyboardInterrupt:
        return _fail("interrupted (the builder container was removed).", 130)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
