"""The clairvoyant bound with the replay's capacity put back, beside the plain bound, in settings
of notebook 09's grids: ``horizon_priced_bound.csv``.

Per setting: every online policy and the horizon router (its defaults) replayed at the
default scale (the sweep cache; ``output="summary"``), the plain bound
(:func:`carbonrouter_lib.bound.ensure_bound`) and the capacity-priced one
(:func:`carbonrouter_lib.bound.ensure_priced_bound`: slots and KV memory per pool priced, the
TTL exact; its defaults, 24 iterations of 60-minute buckets; its step target the best policy's
CO2), and each policy's share of the saving each bound says is possible over Session-Affinity
(:func:`carbonrouter_lib.horizon_eval.bound_shares` with ``priced=True``). About ten minutes per
setting on two cores (the priced bound evaluates the DP 25 times).
Run from the repository root: ``.venv/bin/python docs/evidence/priced_bound.py [grid]`` (default
``extended``: the README's seven settings); without the oracle gate's reference runs."""

from __future__ import annotations

import sys
from pathlib import Path

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import atomic_path

HERE = Path(__file__).resolve().parent


def main(grid: str) -> None:
    settings, _ = he.grid_settings(grid)
    runs = he.grid(settings, reference_in=[], target_params=he.BEFORE_PAIR)
    results = sweep.run_sweep(list(runs["spec"]))
    shares = he.bound_shares(results, runs, priced=True)
    with atomic_path(HERE / "horizon_priced_bound.csv") as tmp:
        shares.to_csv(tmp, index=False)
    view = shares.pivot_table(index=list(he.SETTING), columns="policy", sort=False,
                              values=["share_of_possible_saving", "share_of_priced_saving"])
    print(shares.groupby(list(he.SETTING), sort=False)[
        ["bound_kg", "ttl_bound_kg", "priced_bound_kg", "session_affinity_kg"]].first().round(3))
    print(view.round(3).to_string())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "extended")
