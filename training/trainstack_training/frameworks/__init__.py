"""The frameworks a job may train with, each behind one backend (frameworks.base.Backend).

The manifest's `framework` decides (manifest.py, default "tensorflow"); nothing here imports a
framework until a rank runs.
"""

from __future__ import annotations

from trainstack_training.frameworks.base import Backend
from trainstack_training.manifest import FRAMEWORKS, TORCH

__all__ = ["FRAMEWORKS", "Backend", "backend_for", "model_file"]


def model_file(framework: str) -> str:
    """The model file a run of `framework` leaves in its run directory (its backend's)."""
    return backend_for(framework).model_file


def backend_for(framework: str) -> Backend:
    """The backend of `framework` (one of FRAMEWORKS; the manifest was checked on load)."""
    if framework == TORCH:
        from trainstack_training.frameworks.torch import TorchBackend

        return TorchBackend()
    from trainstack_training.frameworks.tensorflow import TensorFlowBackend

    return TensorFlowBackend()
