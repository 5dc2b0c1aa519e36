"""Where the horizon router's carbon goes, first turns against later turns, in the README's
seven settings (notebook 09's ``extended`` grid): ``horizon_first_turns.csv``.

Per setting: the records of Session-Affinity, Carbon-Affinity, CarbonRouter (with and without
its gate) and the horizon router without the slot price at the default scale (the sweep cache),
split by :func:`carbonrouter_lib.horizon_eval.first_turn_split`. A session's first turn has no
cache and goes to the candidate of least estimated carbon under Carbon-Affinity and
CarbonRouter's proposal alike, so a difference between them there is the capacity each policy's
earlier sessions left free (the horizon router also prices the turns a first turn may have).
About a minute per setting. Run from the repository root: ``.venv/bin/python
docs/evidence/first_turns.py [grid]`` (default ``extended``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import atomic_path

HERE = Path(__file__).resolve().parent
#: policy → parameters; the horizon router as this table was made: without the slot price (then
#: not yet its default), the fallback exit and the option to move (he.FORMER)
POLICIES = {"session-affinity": {}, "carbon-affinity": {}, "carbonrouter-no-gate": {},
            "carbonrouter": {}, he.TARGET: {"slot_price": False, **he.FORMER, **he.BEFORE_PAIR}}


def main(grid: str) -> None:
    settings, _ = he.grid_settings(grid)
    parts = []
    for st in settings:
        wcfg, scfg = he.setting(st)
        specs = {p: sweep.RunSpec.make(wcfg, scfg, p, params) for p, params in POLICIES.items()}
        split = he.first_turn_split(sweep.run_named(specs, progress=False))
        parts.append(split.assign(**st, held_out=st != he.TUNED))
        print(st, split.set_index("policy")[["co2_first_kg", "co2_later_kg"]].round(3).T)
    out = pd.concat(parts, ignore_index=True)
    out = out[[*he.SETTING, "held_out", *split.columns]]
    with atomic_path(HERE / "horizon_first_turns.csv") as tmp:
        out.to_csv(tmp, index=False)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "extended")
