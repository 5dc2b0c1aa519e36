"""Atomic writing of results: tidy tables and figures.

A reader of ``results/`` or ``figures/`` must never find a half-written file that looks complete,
so every writer goes to a temporary file in the target folder and renames it into place.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

__all__ = ["atomic_path", "save_table", "save_figure"]


@contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it onto ``target`` only on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _write(target: Path, writer: Callable[[Path], None]) -> Path:
    with atomic_path(target) as tmp:
        writer(tmp)
    return target


def save_table(
    df: pd.DataFrame, name: str, results_dir: str | os.PathLike, csv: bool = True,
    parquet: bool = True,
) -> list[Path]:
    """Write ``df`` as ``<results_dir>/<name>.parquet`` and ``.csv`` (each unless switched off),
    atomically.

    Returns the paths written. The index is written only if it is named (tidy tables keep their
    keys as columns).
    """
    results_dir = Path(results_dir)
    keep_index = any(n is not None for n in df.index.names)
    paths = []
    if parquet:
        paths.append(_write(results_dir / f"{name}.parquet",
                            lambda p: df.to_parquet(p, index=keep_index)))
    if csv:
        paths.append(_write(results_dir / f"{name}.csv", lambda p: df.to_csv(p, index=keep_index)))
    return paths


def save_figure(fig, name: str, figures_dir: str | os.PathLike) -> list[Path]:
    """Save a matplotlib figure as ``<figures_dir>/<name>.png`` and ``.pdf``, atomically."""
    figures_dir = Path(figures_dir)
    paths = []
    for ext in ("png", "pdf"):
        paths.append(
            _write(
                figures_dir / f"{name}.{ext}",
                lambda p, ext=ext: fig.savefig(p, format=ext, dpi=150, bbox_inches="tight"),
            )
        )
    return paths
