"""Jobs: the user's training code, packed for shipping to a cluster (see ``package.py``)."""

from .package import (
    DEFAULT_CAP_BYTES,
    IGNORE_FILE,
    JobDirError,
    Packed,
    list_files,
    pack,
    unpack_command,
)

__all__ = [
    "DEFAULT_CAP_BYTES",
    "IGNORE_FILE",
    "JobDirError",
    "Packed",
    "list_files",
    "pack",
    "unpack_command",
]
