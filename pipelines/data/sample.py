"""The sample dataset: 10 classes of procedurally drawn shapes at 28x28, day-partitioned Parquet.

Each image is one shape drawn at a random position and scale, with random stroke width,
brightness and Gaussian noise, so the task is learnable but not trivial.  Rows have an ``id``
(a stable key for the held-out split), ``image`` (784 float32 in [0, 1]) and ``label`` (0..9).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pipelines.stores.rundir import atomic_path

CLASSES = (
    "horizontal_bar",
    "vertical_bar",
    "diagonal_down",
    "diagonal_up",
    "square_outline",
    "filled_square",
    "circle_outline",
    "filled_disk",
    "plus",
    "cross",
)
SIZE = 28


def draw(labels, rng):
    """Draw one image per label; returns float32 array (n, 28, 28)."""
    import numpy as np

    n = len(labels)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    yy, xx = yy[None], xx[None]
    half = rng.uniform(5.0, 10.0, n).astype(np.float32)[:, None, None]  # half size of the shape
    cy = rng.uniform(4.0, SIZE - 4.0, n).astype(np.float32)[:, None, None]
    cx = rng.uniform(4.0, SIZE - 4.0, n).astype(np.float32)[:, None, None]
    cy = np.clip(cy, half, SIZE - 1 - half)
    cx = np.clip(cx, half, SIZE - 1 - half)
    width = rng.uniform(1.0, 2.2, n).astype(np.float32)[:, None, None]
    dy, dx = yy - cy, xx - cx
    r = np.sqrt(dy**2 + dx**2)
    inside_box = (np.abs(dy) <= half) & (np.abs(dx) <= half)
    masks = {
        0: (np.abs(dy) <= width / 2 + 0.5) & (np.abs(dx) <= half),
        1: (np.abs(dx) <= width / 2 + 0.5) & (np.abs(dy) <= half),
        2: (np.abs(dy - dx) <= width) & inside_box,
        3: (np.abs(dy + dx) <= width) & inside_box,
        4: inside_box & ((half - np.abs(dy) <= width) | (half - np.abs(dx) <= width)),
        5: inside_box,
        6: np.abs(r - half) <= width / 2 + 0.4,
        7: r <= half,
        8: ((np.abs(dy) <= width / 2 + 0.5) | (np.abs(dx) <= width / 2 + 0.5)) & inside_box,
        9: ((np.abs(dy - dx) <= width) | (np.abs(dy + dx) <= width)) & inside_box,
    }
    labels = np.asarray(labels)
    img = np.zeros((n, SIZE, SIZE), dtype=np.float32)
    for cls, mask in masks.items():
        sel = labels == cls
        if sel.any():
            img[sel] = mask[sel] if mask.shape[0] == n else mask
    brightness = rng.uniform(0.6, 1.0, n).astype(np.float32)[:, None, None]
    img = img * brightness + rng.normal(0.0, 0.12, img.shape).astype(np.float32)
    return np.clip(img, 0.0, 1.0)


def make_table(rows: int, seed: int, id_offset: int = 0):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CLASSES), rows)
    images = draw(labels, rng).reshape(rows, SIZE * SIZE)
    flat = pa.array(images.ravel(), type=pa.float32())
    return pa.table(
        {
            "id": pa.array(np.arange(id_offset, id_offset + rows, dtype=np.int64)),
            "image": pa.FixedSizeListArray.from_arrays(flat, SIZE * SIZE),
            "label": pa.array(labels.astype(np.int64)),
        }
    )


def generate(out: str, rows_per_day: int = 2000, days: int = 3, start: str = "2026-01-01", seed: int = 0) -> dict:
    """Write ``out/dt=YYYY-MM-DD/part-0.parquet`` for ``days`` consecutive days."""
    import pyarrow.parquet as pq

    if rows_per_day < 1 or days < 1:
        raise ValueError(f"rows_per_day ({rows_per_day}) and days ({days}) must be >= 1")
    first = dt.date.fromisoformat(start)
    root = Path(out)
    written = []
    for d in range(days):
        day = first + dt.timedelta(days=d)
        table = make_table(rows_per_day, seed=seed * 100_003 + d, id_offset=d * rows_per_day)
        target = root / f"dt={day.isoformat()}" / "part-0.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp:
            pq.write_table(table, tmp, row_group_size=4096)
        written.append(str(target))
    return {"out": str(root), "files": written, "rows": rows_per_day * days, "classes": list(CLASSES)}
