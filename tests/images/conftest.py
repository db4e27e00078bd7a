"""Fixtures for the node image tests: one image baked per module into a test repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Test images live in their own repository, removed at the end; `make images` is not touched.
TEST_REPOSITORY = os.environ.get("TRAINSTACK_TEST_IMAGE_REPOSITORY", "tsit-node")
