"""The horizon router with a P95 TTFT objective (``ttft_slo_s``: the TTFT price, docs/model.md
§11.4b) against every online policy and against the router without it, on notebook 09's full grid
and fresh weeks: ``horizon_ttft_slo_{grid}_table.csv`` (:func:`carbonrouter_lib.horizon_eval.table`:
every policy's CO2 and P95 TTFT, and the variant's saving over it, paired 95% CIs over
conversations), ``horizon_ttft_slo_{grid}_verdicts.csv`` (:func:`~carbonrouter_lib.horizon_eval.
verdicts` of the variant) and ``horizon_ttft_slo_{grid}_bound.csv`` (each policy's share of the
clairvoyant bound's possible saving).

Why. The default router's P95 TTFT is above CarbonRouter's in 9 of the full grid's 32 settings
(all eight ShareGPT settings with ample KV memory, and the Mooncake trace in winter in the paper's
regions under the paper's memory rule, by 2 ms) and in 8 of the fresh weeks' 32. The simulator's
TTFT has no queueing: the excess is the prefill of histories the router recomputes after a move.
The TTFT price charges a candidate whose TTFT would exceed an SLO ν times this turn's least
carbon, with ν raised by dual ascent while more than 5% of the served queries exceed the SLO.

The SLO is an input. Here it is CarbonRouter's (learned gate) P95 TTFT in the same setting: the
target of the issue, given to the router as the one number an operator would set from the
incumbent router's measurements. The evaluation is therefore in two phases: every online policy
is run first (they are the committed tables' runs), then the variant with its setting's SLO. The
router learns nothing else from those runs.

What was looked at before these tables were made: the two settings the router was designed on
(``horizon_eval.DESIGNED_ON``) and the Mooncake trace in winter (paper regions, paper memory), in
prototypes (2026-12-05). There a first rule took as the SLO the online 95th percentile of the TTFT
of CarbonRouter's one-turn proposal in the router's own states, with no input: with ample memory
it settled at 0.94 s (CarbonRouter's realized P95 was 0.203 s), because the router keeps sessions
where the one-turn proposal would move them, and its P95 stayed above CarbonRouter's (0.219 s);
it was dropped. With CarbonRouter's P95 as the SLO and a 5% share, ample memory: 18.208 kg and
0.196 s (the router without it 18.093 kg / 0.257 s, CarbonRouter 18.244 kg / 0.203 s); a 4.5% share
gave 18.236 kg / 0.187 s, so the share stayed at the P95's 5%. Every other setting of the full
grid and every fresh week was first seen in these tables: all are held-out for the TTFT price.

The bound: its values in the committed ``horizon_full_bound.csv`` / ``horizon_fresh_bound.csv``
(the bound does not depend on the router). Without the oracle gate's reference runs (not online:
the verdicts ignore them). About 20 minutes a grid on two cores. Run from the repository root:
``.venv/bin/python docs/evidence/ttft_slo.py full|fresh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slot_credit import write_variant_grid  # noqa: E402  (the same tables, another label)


def main(grid_name: str) -> None:
    if grid_name not in ("full", "fresh"):
        raise SystemExit(f"ttft_slo.py: grid must be 'full' or 'fresh', got {grid_name!r}")
    settings = he.grid_settings(grid_name)[0]
    first = he.grid(settings, reference_in=[], target_params=he.BEFORE_PAIR)
    results = sweep.run_sweep(list(first["spec"]))
    runs = he.with_ttft_slo(first, he.table(results, first, n_boot=10))
    results = sweep.run_sweep(list(runs["spec"]))
    write_variant_grid(he.table(results, runs, designed_on=he.TTFT_SLO_DESIGNED_ON), "ttft_slo",
                       grid_name, he.NO_TTFT_SLO, he.TTFT_SLO_DESIGNED_ON)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
