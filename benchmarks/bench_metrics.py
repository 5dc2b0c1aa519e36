"""Speed of the paired session bootstrap on records of a service-scale replay (a measurement, not
a test).

Synthetic records shaped like the default Mooncake replay (P = 350): 2M queries in 1.3M sessions,
copies of 8,000 conversations (the resampling unit), lognormal carbon and TTFT. Measures the paired
CIs that Tables 1–2 and Figure 5 compute (2,000 draws): the CO2 saving (a sum), the P95-TTFT change
(a quantile) over all sessions and over the sessions of more than one turn. Run with
``.venv/bin/python benchmarks/bench_metrics.py`` (``make benchmarks``); prints a table.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from carbonrouter_lib import metrics

N_SESSIONS = 1_300_000
N_CONVERSATIONS = 8_000
N_BOOT = 2000


def records(seed: int) -> pd.DataFrame:
    """Records of one policy; the same sessions, turns and conversations for every seed."""
    layout = np.random.default_rng(0)
    turns = np.minimum(layout.geometric(0.65, N_SESSIONS), 40)
    conversation = layout.integers(0, N_CONVERSATIONS, N_SESSIONS)
    n = int(turns.sum())
    rng = np.random.default_rng(seed)
    columns = {c: (np.zeros(n, bool) if kind == "bool" else np.zeros(n, np.int64) if kind == "int"
                   else np.full(n, "x") if kind == "str" else np.zeros(n))
               for c, kind in metrics.RECORD_COLUMNS.items()}
    carbon = rng.lognormal(0.0, 1.0, n)
    columns.update(
        session=np.repeat(np.arange(N_SESSIONS), turns),
        turn=_turn_index(turns),
        n_turns=np.repeat(turns, turns),
        conversation=np.repeat(conversation, turns),
        carbon_g=carbon, est_carbon_g=carbon, energy_kwh=carbon / 200.0,
        ttft_s=rng.lognormal(-1.0, 0.8, n), quality=np.full(n, 0.8),
    )
    return pd.DataFrame(columns)


def _turn_index(turns: np.ndarray) -> np.ndarray:
    starts = np.repeat(np.cumsum(turns) - turns, turns)
    return np.arange(int(turns.sum())) - starts


def main() -> None:
    a, b = records(1), records(2)
    longer = metrics.sessions_longer_than(a, 1)
    cases = [
        ("CO2 saving (sum), all sessions", dict(kind="saving", metric="carbon_g"), None),
        ("P95 TTFT change (quantile), all sessions",
         dict(kind="change", metric="ttft_s", statistic="p95"), None),
        ("P95 TTFT change (quantile), sessions > 1 turn",
         dict(kind="change", metric="ttft_s", statistic="p95"), longer),
    ]
    print(f"{len(a):,} queries, {N_SESSIONS:,} sessions, {N_CONVERSATIONS:,} conversations "
          f"(resampling units), {N_BOOT:,} draws; {len(longer):,} sessions > 1 turn")
    print(f"{'paired CI':52s} {'s':>7s}")
    for label, kw, sessions in cases:
        t0 = time.perf_counter()
        metrics.paired_table({"a": a, "b": b}, target="a", n_boot=N_BOOT, seed=0,
                             sessions=sessions, **kw)
        print(f"{label:52s} {time.perf_counter() - t0:7.2f}")


if __name__ == "__main__":
    main()
