"""Measure energy and speed of the paper's five model architectures on a GPU (a measurement).

Random weights: speed and energy depend on the shapes, not on the values, so the models are built
from their published hyperparameters (``CONFIGS``, no downloads) with ``transformers``. On an
NVIDIA GPU, energy comes from NVML's total-energy counter (whole board, millijoules); on a CPU
(``--device cpu``, e.g. with ``--tiny``) there is no counter: times are measured and energies are
NaN — a dry run of the whole procedure that writes the same files.

Per model:

- **prefill**: ``--prefill-batch`` sequences of ``--prefill-tokens`` uncached tokens, logits for
  the last position only → J per token, tokens/s, mean power;
- **cached**: ``--cached-batch`` queries of ``--new-tokens`` new tokens on top of a cached history
  of each length in ``--histories`` → J per query and s per batch (the cost of copying the cache,
  needed to reuse it, is measured alone and subtracted);
- **decode**: token-by-token generation at each batch size of ``--batches`` over a context of
  ``--context`` tokens → J per generated token and tokens/s per sequence.

The 70B does not fit one card: ``--layers-70b`` of its 80 layers are measured and the results are
marked with ``layer_scale`` = 80 / layers (``carbonrouter_lib.measured`` scales them back).

Writes ``<out>/gpu_profile.json`` (the raw measurement, the format of the data mirror's
``profiles/h200_hf_random_weights.json``) and ``<out>/gpu_profile_table.csv`` (the
``analytical_profiles()`` schema, via ``carbonrouter_lib.measured.profile_table``; NaN energies on a
CPU). Needs the ``profile`` extra (torch, transformers, nvidia-ml-py):
``.venv/bin/python benchmarks/gpu_profile.py --out results/gpu_profile``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Published hyperparameters of the five architectures (the models' config.json files).
CONFIGS: dict[str, dict[str, Any]] = {
    "gemma-3-1b": {"arch": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                   "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "head_dim": 256, "vocab_size": 262144, "sliding_window": 512,
                   "max_position_embeddings": 32768},
    "llama-3.2-3b": {"arch": "llama", "hidden_size": 3072, "intermediate_size": 8192,
                     "num_hidden_layers": 28, "num_attention_heads": 24,
                     "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                     "rope_theta": 500000.0, "tie_word_embeddings": True,
                     "max_position_embeddings": 131072},
    "gemma-3-4b": {"arch": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                   "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                   "head_dim": 256, "vocab_size": 262208, "sliding_window": 1024,
                   "max_position_embeddings": 131072},
    "mistral-7b-v0.2": {"arch": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                        "num_hidden_layers": 32, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 32000,
                        "rope_theta": 1000000.0, "sliding_window": None,
                        "max_position_embeddings": 32768},
    "llama-3.1-70b": {"arch": "llama", "hidden_size": 8192, "intermediate_size": 28672,
                      "num_hidden_layers": 80, "num_attention_heads": 64,
                      "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                      "rope_theta": 500000.0, "max_position_embeddings": 131072},
}

#: ``--tiny``: every architecture shrunk to a few thousand parameters (a CPU dry run).
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}


@dataclasses.dataclass
class Settings:
    """What one run measures (the defaults: the data mirror's H200 measurement)."""

    prefill_batch: int = 4
    prefill_tokens: int = 2048
    cached_batch: int = 8
    new_tokens: int = 128
    histories: tuple[int, ...] = (0, 1024, 4096, 8192)
    batches: tuple[int, ...] = (1, 16, 64)
    context: int = 1024
    decode_steps: int = 32
    repeats: int = 5
    layers_70b: int = 20


TINY_SETTINGS = Settings(prefill_batch=2, prefill_tokens=32, cached_batch=2, new_tokens=8,
                         histories=(0, 16, 48), batches=(1, 4), context=16, decode_steps=4,
                         repeats=2, layers_70b=1)


class Meter:
    """Wall time and, on an NVIDIA GPU, NVML's total board energy (J); NaN energy elsewhere."""

    def __init__(self, device) -> None:
        import torch

        self.device, self.torch, self.handle = device, torch, None
        self.name, self.driver = platform.processor() or "cpu", ""
        if device.type == "cuda":
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            self.name = pynvml.nvmlDeviceGetName(self.handle)
            self.driver = pynvml.nvmlSystemGetDriverVersion()

    def read(self) -> tuple[float, float]:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
            return (time.perf_counter(),
                    self.pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3)
        return time.perf_counter(), math.nan

    def measure(self, fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
        """Seconds and joules per call of ``fn``, after one warm-up call."""
        fn()
        t0, e0 = self.read()
        for _ in range(repeats):
            fn()
        t1, e1 = self.read()
        return (t1 - t0) / repeats, (e1 - e0) / repeats

    def idle_watts(self, seconds: float = 2.0) -> float:
        t0, e0 = self.read()
        time.sleep(seconds)
        t1, e1 = self.read()
        return (e1 - e0) / (t1 - t0)


def build_model(name: str, tiny: bool, layers: int | None, device, dtype):
    """A randomly initialized causal LM of architecture ``name`` (``layers``: fewer layers)."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig

    cfg = {k: v for k, v in CONFIGS[name].items() if k != "arch"}
    if tiny:
        cfg.update(TINY)
        if cfg.get("sliding_window"):
            cfg["sliding_window"] = 8
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    cls = {"llama": LlamaConfig, "mistral": MistralConfig,
           "gemma3_text": Gemma3TextConfig}[CONFIGS[name]["arch"]]
    config = cls(**cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    return model, sum(p.numel() for p in model.parameters())


def profile_model(name: str, model, meter: Meter, st: Settings, vocab: int) -> dict[str, Any]:
    """The measurements of one model (module docstring)."""
    import torch
    from transformers import DynamicCache

    dev = meter.device
    gen = torch.Generator(device="cpu").manual_seed(1)

    def tokens(batch: int, n: int):
        return torch.randint(0, vocab, (batch, n), generator=gen).to(dev)

    out: dict[str, Any] = {}
    with torch.inference_mode():
        ids = tokens(st.prefill_batch, st.prefill_tokens)
        sec, joules = meter.measure(lambda: model(ids, logits_to_keep=1), st.repeats)
        n_tok = st.prefill_batch * st.prefill_tokens
        out.update(prefill_J_per_tok=joules / n_tok, prefill_tok_per_s=n_tok / sec,
                   prefill_avg_W=joules / sec)

        out["cached"] = []
        new = tokens(st.cached_batch, st.new_tokens)
        for hist in st.histories:
            cache = DynamicCache(config=model.config)
            if hist:
                model(tokens(st.cached_batch, hist), cache=cache, logits_to_keep=1)
            # Each call appends to the cache it gets: it runs on a copy, whose cost is
            # measured alone and subtracted.
            sec_c, j_c = meter.measure(lambda c=cache: copy.deepcopy(c), st.repeats)
            sec_q, j_q = meter.measure(
                lambda c=cache: model(new, cache=copy.deepcopy(c), logits_to_keep=1),
                st.repeats)
            out["cached"].append({"history": hist,
                                  "J_per_query": (j_q - j_c) / st.cached_batch,
                                  "s_per_batch": sec_q - sec_c})

        out["decode"] = []
        for batch in st.batches:
            cache = DynamicCache(config=model.config)
            model(tokens(batch, st.context), cache=cache, logits_to_keep=1)
            step = tokens(batch, 1)

            def run(c=cache, s=step, b=batch):
                c2 = copy.deepcopy(c)
                for _ in range(st.decode_steps):
                    model(s, cache=c2, logits_to_keep=1)

            sec_c, j_c = meter.measure(lambda c=cache: copy.deepcopy(c), st.repeats)
            sec, joules = meter.measure(run, st.repeats)
            sec, joules = sec - sec_c, joules - j_c
            out["decode"].append({"batch": batch,
                                  "J_per_tok": joules / (st.decode_steps * batch),
                                  "seq_tok_per_s": st.decode_steps / sec})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch
    import transformers

    from carbonrouter_lib import measured
    from carbonrouter_lib.outputs import atomic_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/gpu_profile")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (CPU dry run)")
    parser.add_argument("--models", nargs="+", default=list(CONFIGS))
    parser.add_argument("--gpu-name", default=None, help="GPU type in the profile table")
    parser.add_argument("--decode-batch", type=int, default=None,
                        help="batch whose decode energy is e_out in the table (default: largest)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    if args.device == "cpu" and not args.tiny:
        parser.error("full-size models need a GPU (the 70B alone has billions of parameters); "
                     "use --tiny for a CPU dry run")
    st = dataclasses.replace(TINY_SETTINGS if args.tiny else Settings())
    if args.repeats:
        st.repeats = args.repeats
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    meter = Meter(device)
    meta = {"device": meter.name, "driver": meter.driver, "torch": torch.__version__,
            "transformers": transformers.__version__, "dtype": str(dtype).split(".")[-1],
            "nvml_counter": meter.handle is not None, "tiny": args.tiny,
            "settings": dataclasses.asdict(st),
            "idle_W": meter.idle_watts() if meter.handle is not None else math.nan}
    results = []
    for name in args.models:
        full = CONFIGS[name]["num_hidden_layers"]
        layers = st.layers_70b if name == "llama-3.1-70b" else None
        model, n_params = build_model(name, args.tiny, layers, device, dtype)
        used = layers or (TINY["num_hidden_layers"] if args.tiny else full)
        res = {"model": name, "layers_measured": used,
               "layer_scale": (full / used) if layers else 1.0, "params_measured": n_params}
        res.update(profile_model(name, model, meter, st, model.config.vocab_size))
        results.append(res)
        print(f"{name}: {res['prefill_tok_per_s']:,.0f} prefill tok/s, "
              f"{res['prefill_J_per_tok']:.3g} J/tok", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    doc = {"meta": meta, "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "gpu_profile.json") as tmp:
        tmp.write_text(json.dumps(doc, indent=1, allow_nan=True))
    doc["meta"]["source"] = str(out / "gpu_profile.json")
    table = measured.profile_table(doc, gpu=args.gpu_name or meter.name,
                                   decode_batch=args.decode_batch or max(st.batches),
                                   require_energy=meter.handle is not None)
    with atomic_path(out / "gpu_profile_table.csv") as tmp:
        table.to_csv(tmp, index=False)
    print(f"written {out / 'gpu_profile.json'} and {out / 'gpu_profile_table.csv'}")
    return doc


if __name__ == "__main__":
    main()
