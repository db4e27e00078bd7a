"""The trainstack node image: the roles' install parts baked into a Docker image.

See ``bake.py`` and docs/provisioning.md ("Node image").
"""

from .bake import (
    DEFAULT_BASE_IMAGE,
    DEFAULT_REPOSITORY,
    DEFAULT_WHEELHOUSE,
    NODE_CMD,
    BakeError,
    BakeResult,
    CleanResult,
    bake,
    clean,
    current_digest,
    image_digest,
    image_tag,
)

__all__ = [
    "DEFAULT_BASE_IMAGE",
    "DEFAULT_REPOSITORY",
    "DEFAULT_WHEELHOUSE",
    "NODE_CMD",
    "BakeError",
    "BakeResult",
    "CleanResult",
    "bake",
    "clean",
    "current_digest",
    "image_digest",
    "image_tag",
]
