"""The frameworks a job may train with, each behind one backend (frameworks.base.Backend).

The manifest's `framework` decides (job.py, default "tensorflow"); nothing here imports a
framework until a rank runs.
"""

from __future__ import annotations

from trainstack_training.frameworks.base import Backend
from trainstack_training.job import FRAMEWORKS, TENSORFLOW, TORCH

__all__ = ["FRAMEWORKS", "Backend", "backend_for", "model_file"]

# The file the chief saves the model to, in the run directory, per framework.
MODEL_FILES = {TENSORFLOW: "model.keras", TORCH: "model.pt"}


def model_file(framework: str) -> str:
    """The model file a run of `framework` leaves in its run directory."""
    return MODEL_FILES[framework]


def backend_for(framework: str) -> Backend:
    """The backend of `framework` (one of FRAMEWORKS; the manifest was checked on load)."""
    if framework == TORCH:
        from trainstack_training.frameworks.torch import TorchBackend

        return TorchBackend()
    from trainstack_training.frameworks.tensorflow import TensorFlowBackend

    return TensorFlowBackend()
