"""How the default router moves with its two smoothing weights, settings nobody chose (docs/model.md
§11.4a): ``smoothing`` = 0.05, the weight of a new observation in its online averages (the cache
survival p_a per KV pool, its continuation ρ, the pools' room φ; the TTFT price's step η, also
0.05, is a parameter of its own, tried once at 0.01, §11.4b), and ``slot_smoothing`` = 0.01, the
weight of a new first turn in the slot price's averages (m_p, ḡ_p, Λ). Both were fixed before the
runs that used them and never varied: a headline that hinges on a setting nobody chose should show
how it moves with it.

The runs: the default router (its parameters given explicitly, :data:`slot16.SLOT16_ROUTER`) and
the same router with ``smoothing`` = 0.01 and 0.2 and with ``slot_smoothing`` = 0.002 and 0.05
(each five times slower or four to five times faster than the default; one at a time), every online
policy beside them, on notebook 09's full grid or fresh weeks in notebook 09's two phases (each
router given CarbonRouter's P95 TTFT in the setting as its SLO; :func:`slot_turns.tables`). Nothing
here is tuned: every value is reported; only the fresh weeks would be held-out for a choice made
from these tables.

``full|fresh`` → ``horizon_smoothing_{grid}_{table,bound,verdicts}.csv`` (as
``slot_turns.py``'s: the default's saving over each variant with its paired 95% CI over
conversations, each run's share of the committed bound's possible saving over Session-Affinity,
per variant the targets of notebook 09's verdicts with it as the router). About 15 minutes a grid
on two cores with the online policies' runs cached. Run from the repository root:
``.venv/bin/python docs/evidence/smoothing.py full|fresh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from slot_turns import tables  # noqa: E402  (the default router's runs beside variants)

#: The values beside the default's (smoothing 0.05, slot_smoothing 0.01): label → HorizonRouter
#: parameters over the default's.
SMOOTHING: dict[str, dict[str, float]] = {
    **{f"smoothing {x}": {"smoothing": x} for x in (0.01, 0.2)},
    **{f"slot smoothing {x}": {"slot_smoothing": x} for x in (0.002, 0.05)}}


if __name__ == "__main__":
    tables(sys.argv[1] if len(sys.argv) > 1 else "full", SMOOTHING, "horizon_smoothing")
