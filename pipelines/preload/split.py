"""The held-out split: a row is held out when a seeded hash of its key falls below the fraction."""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["holdout_mask", "position_keys"]

_MASK64 = (1 << 64) - 1


def _mix64(x: Any) -> Any:
    """splitmix64's finaliser on a numpy uint64 array (wrapping arithmetic)."""
    import numpy as np

    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def holdout_mask(keys: Any, seed: int, fraction: float) -> Any:
    """True for the rows held out: a seeded hash of each integer key, uniform in [0, 1), below ``fraction``.

    The same key and seed always give the same answer, whatever the file layout or batch size.
    """
    import numpy as np

    salt = np.uint64(int.from_bytes(hashlib.sha256(str(seed).encode()).digest()[:8], "little"))
    with np.errstate(over="ignore"):
        h = _mix64(np.asarray(keys).astype(np.int64).view(np.uint64) ^ salt)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < fraction


def position_keys(relative: str, first_row: int, n: int) -> Any:
    """Keys for datasets without an ``id`` column: the file's relative path and the row index."""
    import numpy as np

    base = int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "little") & _MASK64
    with np.errstate(over="ignore"):
        return (np.uint64(base) + np.arange(first_row, first_row + n, dtype=np.uint64)).view(np.int64)
