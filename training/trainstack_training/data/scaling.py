"""The features' scaling to [0, 1], in one place: the data stage finds each feature's range
over the training rows (`feature_scale`, from its statistics) and writes the features as
read; a rank scales each batch it reads (`apply_scale`). The arithmetic is Spark's
`((cast(x as double) - low) / span).cast("float")`: float64, then rounded to float32.

`feature_scale` runs in the training driver (the data stage, stage.py); `apply_scale` in a
rank's process (data/stream.py, data/shards.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# Rows scaled at a time: bounds the float64 temporary of a whole shard read into memory.
SCALE_ROWS = 65536


def feature_scale(stats: dict[str, Any], n_features: int) -> list[list[float]]:
    """Each feature's [low, span] from the data stage's statistics (`lo<i>`, `hi<i>`: its
    min and max over the training rows): a scaled value is (x - low) / span. A constant
    feature's span is 1.0 (0, not a division by zero)."""
    scale = []
    for i in range(n_features):
        lo, hi = float(stats[f"lo{i}"] or 0.0), float(stats[f"hi{i}"] or 0.0)
        scale.append([lo, hi - lo if hi > lo else 1.0])
    return scale


def apply_scale(x: np.ndarray, scale: Sequence[Sequence[float]] | None) -> np.ndarray:
    """The features `x` [n, d] (as read: float32 or float64) scaled by `scale` (one [low,
    span] per column) into a new float32 array; `x` as float32 when `scale` is None (a shard
    written scaled)."""
    if scale is None:
        return x.astype(np.float32, copy=False)
    lo = np.array([s[0] for s in scale], np.float64)
    span = np.array([s[1] for s in scale], np.float64)
    if x.shape[1] != len(lo):
        raise ValueError(f"{x.shape[1]} feature columns, but a scale for {len(lo)}")
    out = np.empty(x.shape, np.float32)
    for start in range(0, len(x), SCALE_ROWS):
        part = np.subtract(x[start : start + SCALE_ROWS], lo, dtype=np.float64)
        np.divide(part, span, out=part)
        out[start : start + SCALE_ROWS] = part  # rounded to nearest, as Java's (float) cast
    return out
