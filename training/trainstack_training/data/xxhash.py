"""Spark SQL's xxhash64 in NumPy, bit for bit: the "arrow" path splits a small set with the
same hash the Spark paths compute, so every path gives the same split and shards."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

_U64 = np.uint64
_P1 = _U64(0x9E3779B185EBCA87)
_P2 = _U64(0xC2B2AE3D27D4EB4F)
_P3 = _U64(0x165667B19E3779F9)
_P4 = _U64(0x85EBCA77C2B2AE63)
_P5 = _U64(0x27D4EB2F165667C5)
_SPARK_HASH_SEED = 42  # the seed of Spark SQL's xxhash64()
# Arrow types whose Spark type (as Spark reads Parquet) and hash are reproduced here: Spark's
# ByteType, ShortType and IntegerType hash as 4-byte ints, LongType as 8-byte longs, FloatType
# and DoubleType as their IEEE bits (-0.0 as 0.0, NaN canonical).
_INT32_TYPES = ("int8", "int16", "int32")
_HASHED_TYPES = (*_INT32_TYPES, "int64", "float", "double")


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U64(r)) | (x >> _U64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U64(33))
    h = h * _P2
    h = h ^ (h >> _U64(29))
    h = h * _P3
    return h ^ (h >> _U64(32))


def _hash_int(bits: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark's XXH64.hashInt: `bits` are the int's 32 bits, zero-extended to uint64."""
    h = seed + _P5 + _U64(4)
    h = h ^ (bits * _P1)
    return _fmix(_rotl(h, 23) * _P2 + _P3)


def _hash_long(bits: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark's XXH64.hashLong: `bits` are the long's 64 bits."""
    h = seed + _P5 + _U64(8)
    h = h ^ (_rotl(bits * _P2, 31) * _P1)
    return _fmix(_rotl(h, 27) * _P1 + _P4)


def spark_xxhash64(seed: int, columns: list[pa.ChunkedArray | pa.Array], rows: int) -> np.ndarray:
    """Spark SQL's `xxhash64(lit(seed), *columns)` for every row, bit for bit (int64).

    Columns are Arrow integer or float columns (`_HASHED_TYPES`); a null leaves the hash as
    it is, as in Spark. `lit(seed)` is an int literal when the seed fits 32 bits, as PySpark
    makes it. The test suite checks this against Spark itself.
    """
    with np.errstate(over="ignore"):
        h = np.full(rows, _SPARK_HASH_SEED, dtype=_U64)
        if -(2**31) <= seed < 2**31:
            h = _hash_int(np.full(rows, seed & 0xFFFFFFFF, dtype=_U64), h)
        else:
            h = _hash_long(np.full(rows, seed & 0xFFFFFFFFFFFFFFFF, dtype=_U64), h)
        for column in columns:
            kind = str(column.type)
            if kind not in _HASHED_TYPES:
                raise TypeError(f"no Spark hash for Arrow type {kind}")
            valid = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            if kind in ("float", "double"):
                wide = kind == "double"
                values = np.asarray(
                    column.to_numpy(zero_copy_only=False), np.float64 if wide else np.float32
                )
                values = np.where(values == 0, values.dtype.type(0), values)  # -0.0 -> 0.0
                values = np.where(np.isnan(values), values.dtype.type(np.nan), values)
                bits = values.view(np.uint64 if wide else np.uint32).astype(_U64)
                new = _hash_long(bits, h) if wide else _hash_int(bits, h)
            else:
                values = np.asarray(column.fill_null(0).to_numpy(zero_copy_only=False))
                if kind in _INT32_TYPES:
                    new = _hash_int(values.astype(np.int32).view(np.uint32).astype(_U64), h)
                else:
                    new = _hash_long(values.astype(np.int64).view(_U64), h)
            h = np.where(valid, new, h)
    return h.view(np.int64)
