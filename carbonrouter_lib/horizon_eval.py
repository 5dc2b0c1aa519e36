"""The horizon router against every policy (notebook 09): the grid of runs, the table, the
verdicts on its targets (beyond the paper).

The router (:mod:`carbonrouter_lib.policies.horizon`) is compared at the results notebooks'
default scale (:data:`carbonrouter_lib.scale.DEFAULT_PEAK`) with the five policies of Table 1
and CarbonRouter with its learned gate (and, as a reference that is not online, its oracle gate:
:data:`REFERENCE`), per setting = dataset × region set × KV-memory rule ×
season (the 7-day window starting on :data:`carbonrouter_lib.replays.SEASONS`' Monday). Its
parts are ablated and its forecast perturbed (:data:`VARIANTS`, :data:`NOISE`) in the settings
asked for. Savings are paired bootstrap CIs over conversations (:func:`carbonrouter_lib.scale.
scale_table`); every run is a compact summary (``output="summary"``), cached by the sweep.

**Tuned on.** The router's design and defaults (J = 16 future turns, the blend forecast,
smoothing 0.05, the online continuation) were developed while looking at one setting,
:data:`TUNED`; the tables mark it, and every other setting is held-out. The slot price (on by
default) was not tuned; it was made the default after the full grid of 32 settings was run with
and without it (docs/evidence/horizon_slot_price_full_*.csv), so the choice to turn it on was
taken on all of them — its parameters were not. The fallback exit and the option to move (the
defaults since 2026-12-05; docs/model.md §11.4a) were designed while looking at the tuned setting
and at ShareGPT with ample KV memory in winter (:data:`DESIGNED_ON`, both marked not held-out);
they add no parameter. The fresh weeks (:data:`FRESH_WEEKS`, grid ``"fresh"``) had never been
replayed when they were designed: all 32 of their settings are held-out. The horizon the
router has had since 2026-12-07 (J = 1, the slot price's remaining time over 16 turns; before,
J = 16 for both) was chosen on the full grid: the fresh weeks and the scale sweep are held-out
for that choice (docs/evidence/horizon_length.py, slot16.py). The pair's two prices were designed
after both grids had been seen. The seasons' weeks of 2021 (:data:`YEAR_2021_WEEKS`, grid
``"year2021"``, with 2021's carbon signal) were replayed first after all of it (2026-12-07): all 32
of their settings are held-out for every part of the router as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib import bound, prepared, replays, scale
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.policies import Policy
from carbonrouter_lib.replays import SEASONS
from carbonrouter_lib.sweep import RunSpec

__all__ = ["TARGET", "ONLINE", "REFERENCE", "FORMER", "VARIANTS", "NOISE", "TUNED", "FRESH_WEEKS",
           "WINDOWS", "YEAR_2021_WEEKS", "DESIGNED_ON", "SETTING", "GRIDS", "WITHOUT_REFERENCE",
           "SCALE_GRIDS", "SCALE_BY", "setting",
           "grid", "grid_settings", "scale_grid", "table", "scale_table", "verdicts",
           "variants_table", "bound_shares", "scale_bound_shares", "first_turn_split",
           "held_out", "with_ttft_slo",
           "TTFT_SLO_FROM", "NO_TTFT_SLO", "TTFT_SLO_DESIGNED_ON", "TOLD", "GAP_PARTS",
           "gap_to_bound", "TURN_KINDS", "turn_kinds", "by_turn_kind", "caching_ceiling",
           "previous_served", "gap_by_turn_kind", "FollowPath", "BEFORE_PAIR", "PAIR_J16",
           "VARIANTS_BEFORE_PAIR", "ttft_slos", "table_slos", "slo_runs", "DESIGNED_ON_PAIR"]

#: The router evaluated (registry name; its defaults, and as its SLO CarbonRouter's P95 TTFT in
#: the setting: :func:`ttft_slos`).
TARGET = "carbonrouter-horizon"
#: The online policies it must beat: Table 1's and CarbonRouter with its learned gate.
ONLINE: tuple[str, ...] = ("session-affinity", "carbon-affinity", "gar", "faircarbon",
                           "carbonrouter-no-gate", "carbonrouter")
#: Not online, so not in the verdicts: CarbonRouter with the oracle gate, which stays exactly when
#: the two-branch label of the live state says staying saves carbon (``carbonrouter-oracle-gate``,
#: docs/model.md §7.7: the ceiling of any gate of that form). At the default scale only, not in
#: the scale sweep (2–4 minutes a run at P = 350, two to a machine of two cores).
REFERENCE: tuple[str, ...] = ("carbonrouter-oracle-gate",)
#: The router's parameters before 2026-12-05 (the fallback exit and the option to move off): the
#: evidence scripts of that router (docs/evidence/slot_price.py, plain.py, first_turns.py,
#: priced_bound.py, option_to_move.py) pin them, so their tables stay that router's.
FORMER: dict[str, Any] = {"exit": "cheapest", "option": False}
#: The pair as it was the default from 2026-12-06 to 2026-12-07: J = 16, the slot price over J
#: (the defaults since are J = 1, the slot price over 16 turns). The evidence scripts of its
#: tables (``*_pair_*``) pin it, so their tables stay its.
PAIR_J16: dict[str, Any] = {"horizon": 16, "slot_turns": None}
#: The router before the pair became its default (2026-12-06; docs/model.md §11.4a): no KV price
#: (and no SLO), with the pair's horizon until 2026-12-07 (:data:`PAIR_J16`). The evidence
#: scripts of that router pin it, so their tables stay its.
BEFORE_PAIR: dict[str, Any] = {"kv_price": False} | PAIR_J16
#: That router's ablations and its release variant: label → HorizonRouter parameters.
VARIANTS_BEFORE_PAIR: dict[str, dict[str, Any]] = {
    "w/o horizon pricing (J = 0)": {"horizon": 0},
    "w/o forecast (persistence)": {"forecast": "persistence"},
    "w/o cache survival": {"cache_survival": False},
    "w/o model stickiness": {"model_stickiness": False},
    "+ cache release": {"release": True},
    "w/o slot price": {"slot_price": False},
    "w/o slot credit": {"slot_credit": False},
    "w/o option to move": {"option": False},
    "w/o fallback exit (cheapest other model)": {"exit": "cheapest"},
    "the former router (neither)": FORMER,
}
#: The router's ablations and its release variant: label → HorizonRouter parameters over its
#: own (with its SLO). :data:`VARIANTS_BEFORE_PAIR`'s, J = 0 without the TTFT price (both prices
#: need J ≥ 1: it is the one-turn proposal), and the router without each of its two prices.
VARIANTS: dict[str, dict[str, Any]] = {
    label: dict(params) | ({"ttft_slo_s": None} if params.get("horizon") == 0 else {})
    for label, params in VARIANTS_BEFORE_PAIR.items()} | {
    "w/o KV price (the TTFT price alone)": {"kv_price": False},
    "w/o TTFT price (the KV price within the TTL alone)": {"ttft_slo_s": None},
}
#: References told the future (not online policies; docs/evidence/told.py): label → HorizonRouter
#: parameters. How much of the bound's possible saving is the information the router lacks.
TOLD: dict[str, dict[str, Any]] = {
    "told the intensities": {"forecast": "clairvoyant"},
    "told the session length": {"session_length": "told"},
    "told both": {"forecast": "clairvoyant", "session_length": "told"},
    "told the models": {"future_models": "told"},
    "told all three": {"forecast": "clairvoyant", "session_length": "told",
                       "future_models": "told"},
}
#: Forecast-error sensitivity: σ of the log-normal error on every forecast value.
NOISE: tuple[float, ...] = (0.1, 0.3, 0.6)
#: Weeks never replayed before the router's fallback exit and option to move were designed: a
#: held-out set beside the seasons (the Monday, 00:00 UTC, that starts each 7-day window; the
#: "season" of a setting may name one of them).
FRESH_WEEKS: dict[str, str] = {"february": "2022-02-07", "may": "2022-05-09",
                               "august": "2022-08-08", "november": "2022-11-07"}
#: The seasons' weeks a year earlier (the first Monday of January, April, July and October
#: 2021), replayed with 2021's carbon signal (:func:`carbonrouter_lib.replays.setting` takes the
#: carbon year from the window): a year no run looked at before every part of the router was
#: designed, so held-out for all of it, the pair's prices and its horizon included (grid
#: ``"year2021"``).
YEAR_2021_WEEKS: dict[str, str] = {"winter 2021": "2021-01-04", "spring 2021": "2021-04-05",
                                   "summer 2021": "2021-07-05", "autumn 2021": "2021-10-04"}
#: Every replay window a setting may name: the seasons, the fresh weeks and 2021's weeks.
WINDOWS: dict[str, str] = dict(SEASONS) | FRESH_WEEKS | YEAR_2021_WEEKS
#: The setting the router was developed on (the only one not held-out).
TUNED: dict[str, str] = {"dataset": "sharegpt", "region_set": "paper", "memory": "paper",
                         "season": "winter"}
#: The settings looked at while the router was designed, so not held-out: the tuned one, and
#: ShareGPT with ample KV memory in winter, whose loss to CarbonRouter's one-turn proposal the
#: fallback exit and the option to move (2026-12-05) were designed against. Every other
#: setting, and every fresh week (:data:`FRESH_WEEKS`), is held-out.
DESIGNED_ON: tuple[dict[str, str], ...] = (TUNED, {**TUNED, "memory": "paper x10"})
#: The policy whose P95 TTFT is the SLO of the router with the TTFT price (``ttft_slo_s``,
#: docs/model.md §11.4b) in each setting of :func:`with_ttft_slo`'s runs.
TTFT_SLO_FROM = "carbonrouter"
#: The router without the TTFT price (its defaults) in :func:`with_ttft_slo`'s runs.
NO_TTFT_SLO = "carbonrouter-horizon (no TTFT price)"
#: The settings looked at while the TTFT price was designed (prototypes, 2026-12-05): the
#: router's :data:`DESIGNED_ON` and the Mooncake trace in winter (paper regions and memory
#: rule), where the router's P95 TTFT was 2 ms above CarbonRouter's.
TTFT_SLO_DESIGNED_ON: tuple[dict[str, str], ...] = (
    *DESIGNED_ON, {**TUNED, "dataset": "mooncake"})
#: The columns that tell settings apart.
SETTING: tuple[str, ...] = ("dataset", "region_set", "memory", "season")


def _settings(datasets, region_sets, memories, seasons) -> list[dict[str, str]]:
    return [{"dataset": d, "region_set": r, "memory": m, "season": s}
            for d in datasets for r in region_sets for m in memories for s in seasons]


#: The grids of notebook 09: (settings, settings with the ablations and forecast errors).
#: "reproduce" (`make reproduce`'s budget): ShareGPT in the paper's regions under the paper's
#: memory rule in winter and summer, with ample memory, in the other region set, and the
#: Mooncake trace (winter), the ablations in the tuned setting; "extended" (the README's
#: table): the four seasons, the ablations also with ample memory; "full": both datasets ×
#: both region sets × both memory rules × the four seasons, the ablations in the four winter
#: settings of the paper's regions; "smoke": the tuned setting (the notebook's tests); "fresh": the
#: full grid's 32 settings in the fresh weeks (:data:`FRESH_WEEKS`), no ablations; "year2021": the
#: full grid's 32 settings in the seasons' weeks of 2021 (:data:`YEAR_2021_WEEKS`), no ablations.
GRIDS: dict[str, tuple[list[dict[str, str]], list[dict[str, str]]]] = {
    "reproduce": (
        _settings(["sharegpt"], ["paper"], ["paper"], ["winter", "summer"])
        + _settings(["sharegpt"], ["paper"], ["paper x10"], ["winter"])
        + _settings(["sharegpt"], ["em-only"], ["paper"], ["winter"])
        + _settings(["mooncake"], ["paper"], ["paper"], ["winter"]),
        [dict(TUNED)],
    ),
    "extended": (
        _settings(["sharegpt"], ["paper"], ["paper"], list(SEASONS))
        + _settings(["sharegpt"], ["paper"], ["paper x10"], ["winter"])
        + _settings(["sharegpt"], ["em-only"], ["paper"], ["winter"])
        + _settings(["mooncake"], ["paper"], ["paper"], ["winter"]),
        _settings(["sharegpt"], ["paper"], ["paper", "paper x10"], ["winter"]),
    ),
    "full": (
        _settings(["sharegpt", "mooncake"], ["paper", "em-only"], ["paper", "paper x10"],
                  list(SEASONS)),
        _settings(["sharegpt", "mooncake"], ["paper"], ["paper", "paper x10"], ["winter"]),
    ),
    "smoke": ([dict(TUNED)], [dict(TUNED)]),
    "fresh": (_settings(["sharegpt", "mooncake"], ["paper", "em-only"], ["paper", "paper x10"],
                        list(FRESH_WEEKS)), []),
    "year2021": (_settings(["sharegpt", "mooncake"], ["paper", "em-only"], ["paper", "paper x10"],
                       list(YEAR_2021_WEEKS)), []),
}
#: The grids of notebook 09 without the oracle gate's reference runs (2–4 minutes each): make
#: reproduce's (its budget) and the held-out weeks' (2022's fresh weeks, 2021's seasons), whose
#: verdicts compare online policies only.
WITHOUT_REFERENCE: tuple[str, ...] = ("reproduce", "fresh", "year2021")


#: The settings looked at while the router as it now is (the pair, the default since 2026-12-06)
#: was designed: its KV price's rule within the TTL and the pair were designed after the full grid
#: and the fresh weeks had been seen, so no setting of either is held-out for it (its
#: :func:`table`'s ``designed_on`` in notebook 09); the scale sweep is held-out for it.
DESIGNED_ON_PAIR: tuple[dict[str, str], ...] = tuple(GRIDS["full"][0] + GRIDS["fresh"][0])


#: The scale sweeps of notebook 09: per grid, (dataset, copies, KV-memory rules) blocks, every
#: online policy and the router in each, in the paper's regions over the tuned setting's window
#: (winter; :func:`carbonrouter_lib.scale.scale_specs`, copies as notebook 04b's ladder: ShareGPT
#: P = 40 at 1 copy, 126 at 4, 407 at 16, 1,481 at 64, 3,066 at 136; the Mooncake trace P = 10
#: at 1, 150 at 64, 277 at 128). Not tuned on, but the tuned setting's workload, regions and
#: window at other scales: the memory rule and the scale are what changes.
SCALE_GRIDS: dict[str, tuple[tuple[str, tuple[float, ...], tuple[str, ...]], ...]] = {
    "reproduce": (("sharegpt", (1, 8), ("paper", "paper x10")),),
    "extended": (("sharegpt", (1, 4, 16, 64), ("paper", "paper x10")),),
    "full": (("sharegpt", (1, 4, 16, 64, 136), ("paper", "paper x10")),
             ("mooncake", (1, 64, 128), ("paper", "paper x10"))),
    "smoke": (("sharegpt", (1,), ("paper",)),),
}
#: The columns that tell the scale sweep's settings apart.
SCALE_BY: tuple[str, ...] = ("dataset", "region_set", "memory", "copies")


def grid_settings(name: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The settings of :data:`GRIDS` entry ``name`` (KeyError naming the grids otherwise)."""
    if name not in GRIDS:
        raise KeyError(f"unknown grid {name!r}; one of {list(GRIDS)}")
    return GRIDS[name]


def noise_label(sigma: float) -> str:
    return f"forecast error σ = {sigma:g}"


def setting(st: Mapping[str, str], peak: int | str | None = None, seed: int = 0,
            max_conversations: int | None = None) -> replays.Setting:
    """The workload and simulation configs of a setting (a mapping with the :data:`SETTING`
    keys): :func:`carbonrouter_lib.replays.setting` with the season's window."""
    if st["season"] not in WINDOWS:
        raise ValueError(f"horizon_eval: unknown season {st['season']!r}; one of "
                         f"{list(WINDOWS)}")
    return replays.setting(st["dataset"], st["region_set"], peak, st["memory"],
                           window_start=WINDOWS[st["season"]], seed=seed,
                           max_conversations=max_conversations)


def grid(settings: Sequence[Mapping[str, str]], variants_in: Sequence[Mapping[str, str]] = (),
         noise: Sequence[float] = NOISE, peak: int | str | None = None, seed: int = 0,
         max_conversations: int | None = None,
         target_params: Mapping[str, Any] | None = None,
         reference: Sequence[str] = REFERENCE,
         reference_in: Sequence[Mapping[str, str]] | None = None,
         variants: Mapping[str, Mapping[str, Any]] | None = None,
         ttft_slo: Mapping[tuple[str, ...], float] | None = None) -> pd.DataFrame:
    """The runs: every setting (a mapping with the :data:`SETTING` keys) × (:data:`ONLINE`,
    ``reference`` (default :data:`REFERENCE`; ``()``: none; only in the settings of
    ``reference_in``, None: in all) and :data:`TARGET`); in the settings of ``variants_in``
    also every entry of ``variants`` (label → HorizonRouter parameters; None:
    :data:`VARIANTS`, e.g. :data:`TOLD`) and the forecast errors ``noise``. ``target_params``:
    HorizonRouter parameters of the router's runs, its variants' included (e.g.
    ``{"slot_price": False}``; None: its defaults). ``ttft_slo``: per setting (its
    :data:`SETTING` values) the router's SLO, s (:func:`ttft_slos`: CarbonRouter's P95 TTFT
    there), given to the router and its variants (a variant may drop it); None: no SLO. One row
    per run: the setting, ``policy`` (a label), ``key`` and ``spec`` (a summary run)."""
    rows = []
    for st in list(settings) + [v for v in variants_in if v not in settings]:
        missing = set(SETTING) - set(st)
        if missing:
            raise ValueError(f"horizon_eval.grid: setting {dict(st)} lacks {sorted(missing)}")
        base = dict(target_params or {}) | _slo_params(ttft_slo, st, SETTING, "grid")
        wcfg, scfg = setting(st, peak, seed, max_conversations)
        refs = reference if reference_in is None or st in reference_in else ()
        runs: dict[str, tuple[str, dict[str, Any]]] = {p: (p, {}) for p in (*ONLINE, *refs)}
        runs[TARGET] = (TARGET, base)
        if st in variants_in:
            runs |= {label: (TARGET, base | dict(params))
                     for label, params in (VARIANTS if variants is None else variants).items()}
            runs |= {noise_label(s): (TARGET, base | {"forecast_noise": float(s)})
                     for s in noise}
        for label, (policy, params) in runs.items():
            spec = RunSpec.make(wcfg, scfg, policy, params, output="summary")
            rows.append({k: st[k] for k in SETTING} | {"policy": label, "key": spec.key(),
                                                       "spec": spec})
    return pd.DataFrame(rows)


def scale_grid(name: str, seed: int = 0, max_conversations: int | None = None,
               ttft_slo: Mapping[tuple, float] | None = None,
               target_params: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The runs of :data:`SCALE_GRIDS` entry ``name``: every block's copies × memory rules ×
    (:data:`ONLINE` and :data:`TARGET`), in the paper's regions; one row per run as
    :func:`carbonrouter_lib.scale.scale_specs` (``SCALE_BY``, ``policy``, ``key``, ``spec``).
    ``ttft_slo``: per setting (its :data:`SCALE_BY` values) the router's SLO, s
    (:func:`ttft_slos` with ``by=SCALE_BY``); ``target_params``: HorizonRouter parameters of the
    router's runs (None: its defaults)."""
    if name not in SCALE_GRIDS:
        raise KeyError(f"unknown scale grid {name!r}; one of {list(SCALE_GRIDS)}")
    parts = [scale.scale_specs(
        {ds: prepared.WorkloadConfig(dataset=ds, seed=seed, max_conversations=max_conversations)},
        ["paper"], copies, memories, (*ONLINE, TARGET))
        for ds, copies, memories in SCALE_GRIDS[name]]
    runs = pd.concat(parts, ignore_index=True)
    if ttft_slo is None and not target_params:
        return runs
    return _router_with(runs, lambda r: dict(target_params or {}) | _slo_params(
        ttft_slo, r, SCALE_BY, "scale_grid"))


def _slo_params(ttft_slo: Mapping[tuple, float] | None, st: Mapping[str, Any],
                by: Sequence[str], caller: str) -> dict[str, float]:
    """``{"ttft_slo_s": …}`` of setting ``st`` (its ``by`` values) in ``ttft_slo``; ``{}`` where
    there is no SLO; a ValueError naming ``caller`` and the setting where it has none."""
    if ttft_slo is None:
        return {}
    k = tuple(st[c] for c in by)
    if k not in ttft_slo:
        raise ValueError(f"horizon_eval.{caller}: no SLO for setting {k}")
    return {"ttft_slo_s": float(ttft_slo[k])}


def _router_with(runs: pd.DataFrame, extra) -> pd.DataFrame:
    """``runs`` with each of the router's (:data:`TARGET`'s) specs given the parameters
    ``extra(row)`` over its own, and its key renewed; the other runs as they were."""
    target = runs["policy"] == TARGET
    specs = [dataclasses.replace(r["spec"], policy_params=dict(r["spec"].policy_params)
                                 | extra(r)) for r in runs[target].to_dict("records")]
    runs = runs.copy()
    runs.loc[target, "spec"] = pd.Series(specs, index=runs.index[target], dtype=object)
    runs.loc[target, "key"] = [spec.key() for spec in specs]
    return runs


def slo_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Of :func:`grid`'s or :func:`scale_grid`'s ``runs``, those whose P95 TTFT is the router's
    SLO (:data:`TTFT_SLO_FROM`'s): the first phase of the router's evaluation."""
    return runs[runs["policy"] == TTFT_SLO_FROM]


def ttft_slos(results: Mapping[str, Any], runs: pd.DataFrame,
              by: Sequence[str] = SETTING) -> dict[tuple, float]:
    """The router's SLO per setting (the columns ``by``: :data:`SETTING`, or :data:`SCALE_BY`):
    the P95 TTFT (s) of :data:`TTFT_SLO_FROM`'s run there, of :func:`slo_runs`' ``runs`` replayed
    (``results``: key → summary result) — the SLO an operator would set from the incumbent's
    measurements; the router learns nothing else from those runs (docs/model.md §11.4b)."""
    out = {}
    for r in slo_runs(runs).to_dict("records"):
        out[tuple(r[c] for c in by)] = float(results[r["key"]].summary["p95_ttft_s"])
    return out


def table_slos(t: pd.DataFrame, slo_from: str = TTFT_SLO_FROM,
               by: Sequence[str] = SETTING) -> dict[tuple, float]:
    """The router's SLO per setting (the columns ``by``) from a :func:`table` or
    :func:`scale_table` ``t``: ``slo_from``'s P95 TTFT there, s (the summary's value, as
    :func:`ttft_slos` reads it from the runs' results)."""
    return {tuple(r[k] for k in by): float(r["p95_ttft_s"])
            for r in t[t["policy"] == slo_from].to_dict("records")}


def scale_table(results: Mapping[str, Any], runs: pd.DataFrame, n_boot: int = 2000,
                seed: int = 0) -> pd.DataFrame:
    """:func:`table` of a :func:`scale_grid`: per (dataset, region set, memory rule, copies),
    every policy's Table-1 quantities at that scale (``peak_sessions`` P) and the router's
    saving over it with its CI."""
    return scale.scale_table(results, runs, target=TARGET, n_boot=n_boot, seed=seed,
                             by=SCALE_BY)


def table(results: Mapping[str, Any], runs: pd.DataFrame, n_boot: int = 2000,
          seed: int = 0,
          designed_on: Sequence[Mapping[str, str]] = DESIGNED_ON) -> pd.DataFrame:
    """Table 1's quantities of every run (:func:`carbonrouter_lib.scale.scale_table` with the
    horizon router as the target: ``saving_pct`` and its CI are *its* saving over the row's
    policy or variant), plus ``held_out`` (False in the settings of ``designed_on``: default
    :data:`DESIGNED_ON`; :data:`TTFT_SLO_DESIGNED_ON` for :func:`with_ttft_slo`'s runs)."""
    t = scale.scale_table(results, runs, target=TARGET, n_boot=n_boot, seed=seed, by=SETTING)
    return t.assign(held_out=[held_out(st, designed_on)
                              for st in t[list(SETTING)].to_dict("records")])


def held_out(st: Mapping[str, str],
             designed_on: Sequence[Mapping[str, str]] = DESIGNED_ON) -> bool:
    """Whether setting ``st`` (the :data:`SETTING` keys) is held-out: not in ``designed_on``
    (default :data:`DESIGNED_ON`)."""
    return not any(all(st[k] == v for k, v in d.items()) for d in designed_on)


def with_ttft_slo(runs: pd.DataFrame, t: pd.DataFrame, slo_from: str = TTFT_SLO_FROM,
                  by: Sequence[str] = SETTING) -> pd.DataFrame:
    """The second phase of the TTFT price's evaluation: of :func:`grid`'s ``runs`` (run, with
    their :func:`table` ``t``), the online policies, the references and the router relabelled
    :data:`NO_TTFT_SLO`, and as :data:`TARGET` the router with ``ttft_slo_s`` = ``slo_from``'s
    P95 TTFT (s) in the same setting (the columns ``by``: :data:`SETTING`, or :data:`SCALE_BY`
    for a :func:`scale_grid` and its :func:`scale_table`) — the SLO an operator would set from
    the incumbent's measurements; the router learns nothing else from those runs."""
    by = list(by)
    slo = table_slos(t, slo_from, by)
    target = runs[runs["policy"] == TARGET]
    missing = [st for st in target[by].itertuples(index=False, name=None) if st not in slo]
    if missing:
        raise ValueError(f"horizon_eval.with_ttft_slo: no {slo_from!r} run in {missing}")
    variant = _router_with(target, lambda r: _slo_params(slo, r, by, "with_ttft_slo"))
    keep = runs["policy"].isin([*ONLINE, *REFERENCE])
    return pd.concat([runs[keep], target.assign(policy=NO_TTFT_SLO), variant],
                     ignore_index=True)


def verdicts(t: pd.DataFrame, by: Sequence[str] = SETTING) -> pd.DataFrame:
    """Per setting (the columns ``by``: :data:`SETTING`, or :data:`SCALE_BY` for a
    :func:`scale_table`), the targets: whether the router has the lowest CO2 of the online
    policies, the best other online policy and the router's saving over it with its CI
    (``holds`` when the CI is above 0, ``fails`` when below, ``tie`` otherwise), its P95 TTFT
    against CarbonRouter's, its quality against Session-Affinity's (``held_out``: from
    :func:`table`; True in a scale sweep)."""
    rows = []
    by = list(by)
    for setting, g in t.groupby(by, sort=False):
        g = g.set_index("policy")
        others = g.loc[[p for p in ONLINE if p in g.index]]
        best = others["co2_rel"].idxmin()
        me = g.loc[TARGET]
        b = g.loc[best]
        if b["ci_low_pct"] > 0:
            verdict = "holds"
        elif b["ci_high_pct"] < 0:
            verdict = "fails"
        else:
            verdict = "tie"
        rows.append(dict(zip(by, setting, strict=True)) | {
            "peak_sessions": me.get("peak_sessions", np.nan),
            "held_out": bool(me.get("held_out", True)), "co2_rel": me["co2_rel"],
            "best_other": best, "best_other_co2_rel": b["co2_rel"],
            "saving_vs_best_pct": b["saving_pct"], "ci_low_pct": b["ci_low_pct"],
            "ci_high_pct": b["ci_high_pct"], "lowest_co2": verdict,
            "p95_ttft_s": me["p95_ttft_s"],
            "p95_ttft_carbonrouter_s": g.loc["carbonrouter", "p95_ttft_s"]
            if "carbonrouter" in g.index else np.nan,
            "quality_rel": me["quality_rel"],
        })
    return pd.DataFrame(rows)


def bound_shares(results: Mapping[str, Any], runs: pd.DataFrame, peak: int | str | None = None,
                 seed: int = 0, max_conversations: int | None = None,
                 policies: Sequence[str] | None = None, priced: bool = False
                 ) -> pd.DataFrame:
    """Per setting of ``runs`` (:func:`grid`), the clairvoyant bound
    (:func:`carbonrouter_lib.bound.ensure_bound`, computed and cached per setting, ≈ 15–30 s each
    at P = 350) and each policy's share of the saving it says is possible over Session-Affinity:
    (SA − policy) / (SA − bound), from the runs' total CO2 (kg). ``policies``: None for
    :data:`ONLINE`, the :data:`REFERENCE` policies the setting has runs of and :data:`TARGET`.

    This is :func:`carbonrouter_lib.bound.bound_comparison`'s share when no policy of the
    setting rejected a query; that function leaves out the sessions with a capacity rejection
    (the bound serves every query), which needs the records. ``rejected_share`` is the largest
    share of rejected queries among the setting's policies, so a reader sees where the two
    could differ. Columns: the :data:`SETTING` keys, ``policy``, ``co2_kg``, ``bound_kg``,
    ``session_affinity_kg``, ``bound_rel`` (bound / SA), ``share_of_possible_saving``,
    ``rejected_share``, ``held_out``. With ``priced``, also the bound with the replay's slots,
    KV memory and TTL put back (:func:`carbonrouter_lib.bound.ensure_priced_bound`, its step
    target the best policy's CO2; a few minutes per setting): ``priced_bound_kg``,
    ``ttl_bound_kg`` (the TTL alone), ``share_of_priced_saving``, and ``slot_excess_unpriced``
    and ``kv_excess_unpriced``: the share of the unpriced paths' slot and KV memory use above
    the replay's capacity (session-seconds, token-seconds; what the pricing has to undo)."""
    rows = []
    for st, g in runs.groupby(list(SETTING), sort=False):
        st = dict(zip(SETTING, st, strict=True))
        g = g.set_index("policy")
        mine = policies if policies is not None else (
            *ONLINE, *[p for p in REFERENCE if p in g.index], TARGET)
        rows += _share_rows(results, st, g, mine, setting(st, peak, seed, max_conversations),
                            priced, {"held_out": held_out(st)}, "bound_shares")
    return pd.DataFrame(rows)


def scale_bound_shares(results: Mapping[str, Any], runs: pd.DataFrame,
                       policies: Sequence[str] | None = None) -> pd.DataFrame:
    """:func:`bound_shares` of a :func:`scale_grid`: per setting of the scale sweep (its
    :data:`SCALE_BY` values), the clairvoyant bound of its workload at its copies
    (:func:`carbonrouter_lib.bound.ensure_bound` of the configs its runs were made with, cached
    per setting) and each policy's share of the saving it says is possible over
    Session-Affinity, (SA − policy) / (SA − bound). ``policies``: None for :data:`ONLINE` and
    :data:`TARGET`. Columns: the :data:`SCALE_BY` keys, ``peak_sessions`` (P), ``policy``,
    ``co2_kg``, ``bound_kg``, ``session_affinity_kg``, ``bound_rel``,
    ``share_of_possible_saving``, ``rejected_share``, ``queries``. How the share of the possible
    saving moves with the scale, which the issue's 70% target fixes at the default."""
    rows = []
    for st, g in runs.groupby(list(SCALE_BY), sort=False):
        st = dict(zip(SCALE_BY, st, strict=True))
        g = g.set_index("policy")
        if "session-affinity" not in g.index:
            raise KeyError(f"scale_bound_shares: setting {st} has no runs of "
                           f"['session-affinity']")
        sa = results[g.loc["session-affinity", "key"]].summary
        spec = g.loc["session-affinity", "spec"]
        rows += _share_rows(results, st, g, policies or (*ONLINE, TARGET),
                            (spec.workload_config(), spec.simulation_config()), False,
                            {"peak_sessions": float(sa["peak_sessions"]),
                             "queries": int(sa["n_queries"])}, "scale_bound_shares")
    return pd.DataFrame(rows)


def _share_rows(results: Mapping[str, Any], st: dict[str, Any], g: pd.DataFrame,
                mine: Sequence[str], configs: tuple, priced: bool,
                more: dict[str, Any], caller: str) -> list[dict[str, Any]]:
    """The rows of :func:`bound_shares` (and :func:`scale_bound_shares`) for one setting ``st``:
    its runs ``g`` (indexed by policy), the policies ``mine``, the bound of ``configs``
    (workload and simulation configs), ``more`` columns in every row; a KeyError naming
    ``caller`` and the setting where a policy (or Session-Affinity) has no run."""
    missing = [p for p in ("session-affinity", *mine) if p not in g.index]
    if missing:
        raise KeyError(f"{caller}: setting {st} has no runs of {missing}")
    co2 = {p: float(results[g.loc[p, "key"]].summary["total_co2_kg"]) for p in mine}
    sa = float(results[g.loc["session-affinity", "key"]].summary["total_co2_kg"])
    rejected = max(float(results[g.loc[p, "key"]].summary["share_rejected"])
                   for p in ("session-affinity", *mine))
    b_kg = float(bound.ensure_bound(*configs)["carbon_g"].sum()) / 1e3
    extra = {}
    if priced:
        pb = bound.ensure_priced_bound(*configs, upper_g=1e3 * min(sa, *co2.values()))
        zero = pb["history"].iloc[0]
        extra = {"priced_bound_kg": pb["bound_g"] / 1e3, "ttl_bound_kg": pb["ttl_g"] / 1e3,
                 "slot_excess_unpriced": float(zero["slot_excess"]),
                 "kv_excess_unpriced": float(zero["kv_excess"])}
    rows = []
    for p in mine:
        share = bound.share_of_possible_saving(sa, co2[p], b_kg)
        row = st | {"policy": p, "co2_kg": co2[p], "bound_kg": b_kg,
                    "session_affinity_kg": sa, "bound_rel": b_kg / sa,
                    "share_of_possible_saving": share, "rejected_share": rejected, **more,
                    **extra}
        if priced:
            row["share_of_priced_saving"] = bound.share_of_possible_saving(
                sa, co2[p], extra["priced_bound_kg"])
        rows.append(row)
    return rows


def variants_table(t: pd.DataFrame,
                   variants: Mapping[str, Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """The ablations and forecast errors: per setting where they ran, the router's saving over
    each variant with its CI (positive: the removed part saves carbon; for a forecast error:
    what the error costs) and the variant's CO2 and P95 TTFT. ``variants``: the labels' source
    (None: :data:`VARIANTS`)."""
    labels = [*(VARIANTS if variants is None else variants), *[noise_label(s) for s in NOISE]]
    sub = t[t["policy"].isin(labels) | (t["policy"] == TARGET)]
    keep = sub.groupby(list(SETTING))["policy"].transform(lambda p: p.isin(labels).any())
    cols = [*SETTING, "held_out", "policy", "co2_rel", "saving_pct", "ci_low_pct", "ci_high_pct",
            "p95_ttft_s", "kv_hit_rate_tokens", "switches_per_session"]
    return sub[keep][cols].reset_index(drop=True)


#: :func:`gap_to_bound`'s parts of a run's carbon above the bound.
GAP_PARTS: tuple[str, ...] = ("energy, the bound's model and GPU", "energy, another GPU",
                               "energy, another model", "intensity")


def gap_to_bound(records: pd.DataFrame, paths: pd.DataFrame, deployments: Deployments,
                 reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """Where a run's carbon above the clairvoyant bound goes, query by query.

    ``records``: the run's records; ``paths``: the bound's per-query paths
    (:func:`carbonrouter_lib.bound.clairvoyant_bound`); ``deployments``: the setting's (both
    number deployments alike); ``reference``: the records of a reference run (e.g.
    Session-Affinity's). On the sessions the bound applies to (no query of either run rejected for
    lack of capacity: :func:`carbonrouter_lib.bound.capacity_rejected_sessions`, left out and
    counted), each query's excess c − c* (gCO2e) is split exactly as

        c − c* = (E − E*)·I* + E·(I − I*)

    with E, E* its energy (kWh) in the run and on the bound's path and I = c / E, I* = c* / E*
    the intensities (gCO2e/kWh) they were charged (I* is the least over the dispatch times a
    policy can produce: relaxation 3 of the bound). The energy term counts where the run used more
    energy at the bound's intensity, by what the query ran on: the bound's model and GPU (the
    energy of histories recomputed where the bound's were cached), the bound's model on another GPU
    (recomputation and the GPU's efficiency), or another model (a bigger one; a smaller one is
    negative); the intensity term where it ran in a dirtier region or hour. Split between the
    sessions' first turns and their later turns. Columns: ``turns`` (``"first"``, ``"later"``),
    ``part`` (:data:`GAP_PARTS`), ``gap_kg``, ``share_of_gap``, with ``reference`` also
    ``share_of_possible_saving`` (the part over the reference's carbon minus the bound's on those
    sessions: with the run's share of the possible saving, :func:`carbonrouter_lib.bound.
    bound_comparison`'s, they sum to 1), and ``n_sessions_excluded``."""
    model, gpu = np.asarray(deployments.model), np.asarray(deployments.gpu)
    excluded = bound.capacity_rejected_sessions(records, paths)
    if reference is not None:
        excluded = np.union1d(excluded, bound.capacity_rejected_sessions(reference, paths))
    m = records[["session", "turn", "deployment", "energy_kwh", "carbon_g"]].merge(
        paths[["session", "turn", "deployment", "energy_kwh", "carbon_g"]],
        on=["session", "turn"], suffixes=("", "_b"), validate="one_to_one")
    m = m[~m["session"].isin(excluded)]
    e, c = m["energy_kwh"].to_numpy(), m["carbon_g"].to_numpy()
    e_b, c_b = m["energy_kwh_b"].to_numpy(), m["carbon_g_b"].to_numpy()
    # (the bound charges a few reused caches a slightly negative energy, relaxation 5 on a
    # history that shrank: its intensity is still c*/E*)
    with np.errstate(invalid="ignore", divide="ignore"):
        i, i_b = np.where(e != 0, c / e, 0.0), np.where(e_b != 0, c_b / e_b, 0.0)
    d, d_b = m["deployment"].to_numpy(), m["deployment_b"].to_numpy()
    a, a_b = np.maximum(d, 0), np.maximum(d_b, 0)
    same_model = (d >= 0) & (d_b >= 0) & (model[a] == model[a_b])
    same_gpu = same_model & (gpu[a] == gpu[a_b])
    energy = (e - e_b) * i_b
    parts = {GAP_PARTS[0]: np.where(same_gpu, energy, 0.0),
             GAP_PARTS[1]: np.where(same_model & ~same_gpu, energy, 0.0),
             GAP_PARTS[2]: np.where(same_model, 0.0, energy), GAP_PARTS[3]: e * (i - i_b)}
    first = m["turn"].to_numpy() == 0
    gap = float((c - c_b).sum())
    possible = None if reference is None else float(
        reference.loc[~reference["session"].isin(excluded), "carbon_g"].sum() - c_b.sum())
    rows = []
    for turns, sel in (("first", first), ("later", ~first)):
        for part, v in parts.items():
            g = float(v[sel].sum())
            row = {"turns": turns, "part": part, "gap_kg": g / 1e3,
                   "share_of_gap": g / gap if gap else np.nan}
            if possible is not None:
                row["share_of_possible_saving"] = g / possible if possible > 0 else np.nan
            rows.append(row | {"n_sessions_excluded": len(excluded)})
    return pd.DataFrame(rows)


#: :func:`turn_kinds`: what each served query of a path did with the session's deployments.
TURN_KINDS: tuple[str, ...] = ("first", "stay", "move", "return")


def _path_steps(records: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`turn_kinds`, :func:`previous_served`) of a path, from one sort of its rows."""
    session = records["session"].to_numpy(np.int64)
    turn = records["turn"].to_numpy(np.int64)
    dep = records["deployment"].to_numpy(np.int64)
    order = np.lexsort((turn, session))
    s, d = session[order], dep[order]
    # the index (in order) of the latest served row up to each row, carried forward
    last = np.maximum.accumulate(np.where(d >= 0, np.arange(len(d)), -1))
    before = np.append(-1, last[:-1])
    ok = before >= 0
    ok[ok] = s[before[ok]] == s[ok]
    prev = np.empty(len(d), np.int64)
    prev[order] = np.where(ok, d[np.maximum(before, 0)], -1)
    # served before: an earlier served row of the same session had this deployment
    served = np.flatnonzero(d >= 0)
    dup = np.zeros(len(d), bool)
    dup[served] = pd.DataFrame({"s": s[served], "d": d[served]}).duplicated().to_numpy()
    seen = np.empty(len(d), bool)
    seen[order] = dup
    kind = np.where(dep < 0, "rejected", np.where(turn == 0, "first", np.where(
        dep == prev, "stay", np.where(seen, "return", "move")))).astype(object)
    return kind, prev


def previous_served(records: pd.DataFrame) -> np.ndarray:
    """The deployment of each query's session's latest earlier served turn (−1: none), aligned
    with ``records``' rows (``session``, ``turn``, ``deployment``, any row order)."""
    return _path_steps(records)[1]


def turn_kinds(records: pd.DataFrame) -> np.ndarray:
    """What each query of a path (a run's records or the bound's paths: ``session``, ``turn``,
    ``deployment``, any row order) did, aligned with ``records``' rows: ``"first"`` (the
    session's turn 0), ``"stay"`` (the deployment of the session's previous served turn),
    ``"return"`` (a deployment that served an earlier turn of the session, not the previous served
    one: where the bound's relaxation 5 charges the most a cache left at turn k − 2 or before can
    give), ``"move"`` (a deployment the session had not used), ``"rejected"`` (deployment −1)."""
    return _path_steps(records)[0]


def by_turn_kind(records: pd.DataFrame) -> pd.DataFrame:
    """A run's queries by what each did (:func:`turn_kinds`: the kinds of :data:`TURN_KINDS` and
    ``"rejected"``, one row each in that order, zero where none): ``queries``, ``history_found``
    (the share of their history tokens found cached; NaN where they carry none), ``co2_kg``
    (their carbon, kg) and ``recompute_kg`` (the part of it that recomputed history not found
    cached: each query's carbon times its recomputation energy over its energy, both at the
    query's one intensity)."""
    energy = records["energy_kwh"].to_numpy(np.float64)
    part = np.divide(records["recompute_energy_kwh"].to_numpy(np.float64), energy,
                     out=np.zeros_like(energy), where=energy > 0)
    g = records.assign(kind=turn_kinds(records),
                       recompute_g=records["carbon_g"].to_numpy(np.float64) * part).groupby("kind")
    hist = g["history_tokens"].sum()
    index = pd.Index([*TURN_KINDS, "rejected"], name="kind")
    return pd.DataFrame({
        "queries": g.size().reindex(index, fill_value=0).astype(int),
        "history_found": (g["cached_tokens"].sum() / hist.where(hist > 0)).reindex(index),
        "co2_kg": (g["carbon_g"].sum() / 1e3).reindex(index, fill_value=0.0),
        "recompute_kg": (g["recompute_g"].sum() / 1e3).reindex(index, fill_value=0.0),
    }).reset_index()


def caching_ceiling(kinds: pd.DataFrame, session_affinity_kg: float,
                    bound_kg: float) -> dict[str, float]:
    """What keeping caches alone could give a run (docs/model.md §11.4c), from its
    :func:`by_turn_kind` table ``kinds`` and the setting's Session-Affinity CO2 and clairvoyant
    bound (kg): its CO2, the carbon it spent recomputing history on the turns that stayed,
    returned to an older cache and moved (kg), and three shares of the bound's possible saving
    (:func:`carbonrouter_lib.bound.share_of_possible_saving`): the run's (``share``), with the
    stays' and returns' recomputation taken off (``share_caches_kept``: the most any lever that
    only keeps caches alive can reach on the run's routing, a cache kept intact there holding
    the whole history) and with all of it (``share_nothing_recomputed``: as if even a move found
    the history cached)."""
    k = kinds.set_index("kind")
    co2 = float(k["co2_kg"].sum())
    rc = {kind: float(k.loc[kind, "recompute_kg"]) for kind in ("stay", "return", "move")}
    kept = co2 - (rc["stay"] + rc["return"])

    def share(co2_kg: float) -> float:
        return bound.share_of_possible_saving(session_affinity_kg, co2_kg, bound_kg)

    return {"co2_kg": co2, **{f"recompute_{kind}_kg": v for kind, v in rc.items()},
            "share": share(co2), "share_caches_kept": share(kept),
            "share_nothing_recomputed": share(kept - rc["move"])}


def gap_by_turn_kind(records: pd.DataFrame, paths: pd.DataFrame, reference: pd.DataFrame,
                     deployments: Deployments | None = None) -> pd.DataFrame:
    """A run's share of the bound's possible saving, and what it leaves, by what the bound's path
    did at each query (:func:`turn_kinds` of ``paths``, :func:`carbonrouter_lib.bound.
    clairvoyant_bound`'s).

    On the sessions the bound applies to (:func:`gap_to_bound`'s), per kind: ``queries``, the
    carbon of the bound (``bound_kg``), of the run (``run_kg``) and of the ``reference`` run
    (``reference_kg``) on those queries, and as shares of the possible saving (the reference's
    carbon minus the bound's on those sessions) the part the run achieved there
    (``achieved``: reference − run) and the part it left (``left``: run − bound). Over the kinds
    ``achieved`` sums to the run's share of the possible saving and ``achieved + left`` to 1.
    ``run_reused``: the share of those queries' history tokens the run found cached. With the
    setting's ``deployments``, also ``bound_other_model`` and ``bound_other_region``: the share of
    the kind's queries on which the bound's path ran another model (region) than at the
    session's previous served turn. Where the bound returns to an older cache, its relaxations 1
    and 5 charge the most a cache left at turn k − 2 or before can give (on ShareGPT the context up
    to turn k − 2) whatever the other sessions did; the replay keeps it only if no eviction or TTL
    took it meanwhile."""
    excluded = np.union1d(bound.capacity_rejected_sessions(records, paths),
                          bound.capacity_rejected_sessions(reference, paths))
    key = ["session", "turn"]
    kind, prev = _path_steps(paths)
    m = paths[[*key, "deployment", "carbon_g"]].assign(kind=kind, prev=prev).merge(
        records[[*key, "carbon_g", "cached_tokens", "history_tokens"]], on=key,
        suffixes=("_b", ""), validate="one_to_one").merge(
        reference[[*key, "carbon_g"]].rename(columns={"carbon_g": "carbon_g_ref"}), on=key,
        validate="one_to_one")
    m = m[~m["session"].isin(excluded)]
    possible = float(m["carbon_g_ref"].sum() - m["carbon_g_b"].sum())
    rows = []
    for kind in (*TURN_KINDS, "rejected"):
        g = m[m["kind"] == kind]
        b, r, ref = (float(g[c].sum()) for c in ("carbon_g_b", "carbon_g", "carbon_g_ref"))
        hist = float(g["history_tokens"].sum())
        rows.append({"kind": kind, "queries": len(g), "bound_kg": b / 1e3, "run_kg": r / 1e3,
                     "reference_kg": ref / 1e3,
                     "achieved": (ref - r) / possible if possible > 0 else np.nan,
                     "left": (r - b) / possible if possible > 0 else np.nan,
                     "run_reused": float(g["cached_tokens"].sum()) / hist if hist else np.nan,
                     "n_sessions_excluded": len(excluded)})
        if deployments is not None:
            d, p = g["deployment"].to_numpy(), g["prev"].to_numpy()
            has = (d >= 0) & (p >= 0)
            for col, of in (("bound_other_model", np.asarray(deployments.model)),
                            ("bound_other_region", np.asarray(deployments.region))):
                changed = of[d[has]] != of[p[has]]
                rows[-1][col] = float(changed.mean()) if has.any() else np.nan
    return pd.DataFrame(rows)


class FollowPath(Policy):
    """The bound's path replayed: not an online policy (it reads the whole future through the
    path), a reference for whether the bound's routing is one the replay can carry out.

    Each query goes to the deployment the path (:func:`carbonrouter_lib.bound.clairvoyant_bound`'s
    or :func:`~carbonrouter_lib.bound.capacity_priced_bound`'s ``records``, one row per query of
    the replayed table) gave it when that deployment is a candidate (available, feasible, within
    the TTFT bound); else the least-carbon candidate of the same (region, model), another GPU;
    else the least-carbon candidate. ``followed``, ``same_region_model`` and ``other`` count the
    queries each way went (the path's rejected queries, deployment −1, count as ``other``)."""

    name = "follow-path"

    def __init__(self, paths: pd.DataFrame) -> None:
        turn = paths["turn"].to_numpy(np.int64)
        first = np.flatnonzero(turn == 0)
        session = paths["session"].to_numpy(np.int64)[first]
        if len(np.unique(session)) != len(first) or not np.array_equal(
                np.diff(np.append(first, len(turn))), paths["n_turns"].to_numpy(np.int64)[first]):
            raise ValueError("FollowPath: paths must hold each session's turns 0 … K − 1 in order, "
                             "grouped by session (as clairvoyant_bound writes them)")
        self._row0 = dict(zip(session.tolist(), first.tolist(), strict=True))
        self._dep = paths["deployment"].to_numpy(np.int64)
        self.followed = self.same_region_model = self.other = 0

    def choose(self, ctx, cand) -> int:
        a = int(self._dep[self._row0[ctx.session] + ctx.turn])
        mask = cand.mask
        if a >= 0 and mask[a]:
            self.followed += 1
            return a
        if a >= 0:
            d = ctx.deployments
            same = np.flatnonzero(mask & (d.region == d.region[a]) & (d.model == d.model[a]))
            if same.size:
                self.same_region_model += 1
                return int(same[np.argmin(cand.carbon[same])])
        self.other += 1
        return cand.argmin(cand.carbon)


def first_turn_split(records_by_policy: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Each policy's carbon and energy split between the sessions' first turns and their later
    turns (records of the same sessions, one frame per policy).

    A first turn has no cache, and Carbon-Affinity and CarbonRouter's proposal both send it to
    the candidate of least estimated carbon, so their first turns differ only through the state
    the earlier sessions left: which pools had a free slot, so which candidates were left. Where
    CarbonRouter's first turns emit more than Carbon-Affinity's, it pays for the capacity its
    later turns took in the clean regions (they crowd out the new sessions). The horizon router
    also prices a first turn's expected successors, so its first turns differ by choice too.
    Columns: ``policy``, ``co2_kg``, ``co2_first_kg``, ``co2_later_kg``,
    ``energy_first_kwh``, ``energy_later_kwh``, ``recompute_energy_kwh``,
    ``share_in_cleanest_first`` and ``share_in_cleanest_later`` (of the served queries),
    ``switches_per_session``, ``first_turns`` (count)."""
    rows = []
    for name, r in records_by_policy.items():
        first = r["turn"].to_numpy() == 0
        served = ~r["rejected"].to_numpy()
        carbon, energy = r["carbon_g"].to_numpy(), r["energy_kwh"].to_numpy()
        clean = r["in_cleanest_region"].to_numpy()
        rows.append({
            "policy": name, "co2_kg": carbon.sum() / 1e3,
            "co2_first_kg": carbon[first].sum() / 1e3, "co2_later_kg": carbon[~first].sum() / 1e3,
            "energy_first_kwh": energy[first].sum(), "energy_later_kwh": energy[~first].sum(),
            "recompute_energy_kwh": float(r["recompute_energy_kwh"].sum()),
            "share_in_cleanest_first": clean[first & served].mean(),
            "share_in_cleanest_later": clean[~first & served].mean(),
            "switches_per_session": r["switched"].sum() / r["session"].nunique(),
            "first_turns": int(first.sum())})
    return pd.DataFrame(rows)
