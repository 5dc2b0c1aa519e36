"""What a machine derives from the data, column by column: ``derived_fingerprint.csv``.

Replays of the same code, data and pins differ between machines by up to 1.5% in CO2, and their
clairvoyant bounds by up to 6e-5 (README, "The same numbers on another machine"), so some derived
input still differs. This writes, for the tuned setting (:data:`carbonrouter_lib.horizon_eval.
TUNED`) and the Mooncake trace at the paper's regions, one row per column of the prepared
workload and of the carbon signal: its SHA-256 (of the column's bytes), its sum and its largest
absolute value (NaN left out and counted), and this machine's CPU (NumPy's widest enabled
feature). With ``--compare`` it prints, instead of writing, the rows where this machine differs
from the committed file, with both sums, which points at the stage that still depends on the
machine (the quality scores' hashes differ by rounding, 4e-9, between NumPy's kernels: read
the sums). A diagnostic, not a test: on another machine it is expected to differ until the cause is
found. Run from the repository root: ``.venv/bin/python docs/evidence/fingerprint.py
[--compare]`` (half a minute from a warm cache).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import prepared
from carbonrouter_lib.outputs import atomic_path

HERE = Path(__file__).resolve().parent
FILE = HERE / "derived_fingerprint.csv"
SETTINGS = {"tuned": dict(he.TUNED), "mooncake": dict(he.TUNED, dataset="mooncake")}


def _cpu() -> str:
    """The widest of NumPy's dispatch targets enabled here (``X86_V4``, ``AVX512_SPR``, …; NumPy
    ≥ 2.4's names, which ``NPY_DISABLE_CPU_FEATURES`` takes), else its baseline."""
    from numpy._core import _multiarray_umath as umath

    enabled = [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)]
    return (enabled or umath.__cpu_baseline__ or ["baseline"])[-1]


def _column_rows(label: str, part: str, frame: pd.DataFrame) -> list[dict]:
    rows = []
    for col in frame.columns:
        x = frame[col]
        if x.dtype.kind in "fiub":
            values = x.to_numpy()
            digest = hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
            as_float = values.astype(np.float64)
            missing = int(np.isnan(as_float).sum())
            total = float(np.nansum(as_float))
            peak = float(np.nanmax(np.abs(as_float))) if missing < len(values) else 0.0
        else:
            digest = hashlib.sha256("\x1f".join(x.astype(str)).encode()).hexdigest()
            total = peak = float("nan")
            missing = int(x.isna().sum())
        rows.append({"setting": label, "part": part, "column": str(col), "rows": len(x),
                     "missing": missing, "sha256": digest, "sum": total, "max_abs": peak})
    return rows


def fingerprint() -> pd.DataFrame:
    """One row per (setting, part, column): its hash, sum and largest magnitude, and the CPU."""
    rows = []
    for label, st in SETTINGS.items():
        workload, sim = he.setting(st)
        table = prepared.prepare_workload(workload)
        rows += _column_rows(label, "workload", table)
        signal = sim.signal()
        rows += _column_rows(label, "carbon", signal.frame)
    out = pd.DataFrame(rows)
    out["cpu"] = _cpu()
    return out


def compare(here: pd.DataFrame, committed: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``here`` whose hash differs from ``committed``'s, with both sums."""
    key = ["setting", "part", "column"]
    m = here.merge(committed, on=key, how="outer", suffixes=("", "_committed"), indicator=True)
    differ = (m["_merge"] != "both") | (m["sha256"] != m["sha256_committed"])
    m["sum_diff"] = m["sum"] - m["sum_committed"]
    return m.loc[differ, [*key, "rows", "rows_committed", "sum", "sum_committed", "sum_diff",
                          "cpu", "cpu_committed"]]


def main(argv: list[str]) -> None:
    here = fingerprint()
    if "--compare" in argv:
        diff = compare(here, pd.read_csv(FILE))
        print("identical to the committed fingerprint" if diff.empty else diff.to_string())
        return
    with atomic_path(FILE) as tmp:
        here.to_csv(tmp, index=False)
    print(f"{len(here)} columns → {FILE}")


if __name__ == "__main__":
    main(sys.argv[1:])
