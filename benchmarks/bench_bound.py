"""Speed of the clairvoyant bound (a measurement, not a test).

Times :func:`carbonrouter_lib.bound.clairvoyant_bound` over every session of the tuned setting
(ShareGPT) and of the Mooncake trace in winter at the default scale, and one evaluation of the
capacity-priced bound's DP at the tuned setting (random prices on every pool: every deployment a
candidate; :func:`carbonrouter_lib.bound.capacity_priced_bound` makes one per iteration), and
:func:`~carbonrouter_lib.bound.capacity_priced_bound` itself with two iterations (the plain bound,
three evaluations of the DP, the weights, prices and use around them; its default runs 24). Each
is timed after a warm-up call that compiles the loop, best of ``--repeats``. Run with
``.venv/bin/python benchmarks/bench_bound.py`` (``make benchmarks``); prints a table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from carbonrouter_lib import bound, prepared
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.setting import backend_config


def _best(fn, repeats: int) -> float:
    """Smallest wall time of ``repeats`` calls, s."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print(f"{'bound':44s} {'queries':>9s} {'s':>7s} {'µs/query':>9s}")
    for label, st in (("plain, ShareGPT (tuned setting)", he.TUNED),
                      ("plain, Mooncake, winter", {**he.TUNED, "dataset": "mooncake"})):
        wcfg, scfg = he.setting(st)
        table = prepared.prepare_workload(wcfg)
        bound.clairvoyant_bound(table.iloc[:2000], scfg)  # compile
        s = _best(lambda t=table, c=scfg: bound.clairvoyant_bound(t, c), args.repeats)
        print(f"{label:44s} {len(table):9,d} {s:7.2f} {1e6 * s / len(table):9.2f}")
        if st is he.TUNED:
            backend = backend_config(table, scfg)
            deps = scfg.deployments()
            kv_pool, _ = bound._kv_pools(deps, backend)
            rng = np.random.default_rng(0)
            price = rng.uniform(0.0, 0.05, (len(table), deps.n_pools))
            hold = rng.uniform(0.0, 1e-6, (len(table), int(kv_pool.max()) + 1))

            def priced(t=table, c=scfg, p=price, h=hold, k=kv_pool, ttl=backend.ttl_s):
                return bound.clairvoyant_bound(t, c, price=p, hold=h, kv_pool=k, ttl_s=ttl)

            priced()
            s = _best(priced, args.repeats)
            print(f"{'priced (one evaluation), ShareGPT (tuned)':44s} {len(table):9,d} "
                  f"{s:7.2f} {1e6 * s / len(table):9.2f}")
            # the step target, g: about the router's carbon here (the time hardly depends on it)
            s = _best(lambda t=table, c=scfg, b=backend: bound.capacity_priced_bound(
                t, c, backend=b, upper_g=2.23e4, iterations=2), args.repeats)
            print(f"{'priced bound, 2 iterations, ShareGPT (tuned)':44s} {len(table):9,d} "
                  f"{s:7.2f} {1e6 * s / len(table):9.2f}")


if __name__ == "__main__":
    main()
