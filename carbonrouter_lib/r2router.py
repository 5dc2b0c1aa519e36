"""The paper's quality predictor: R2-Router's released Ridge heads on a Qwen3-0.6B embedding.

The paper scores each query with these heads (``docs/model.md`` §8, Quality). Their input is a
Qwen3-0.6B embedding that cannot be computed offline here, so :class:`R2RouterPredictor` needs an
embedding function from its caller; without one the heads load but predicting raises. The
default predictor of the replays is :class:`carbonrouter_lib.quality.OfflineQualityPredictor`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np

from carbonrouter_lib.datasets import fetch
from carbonrouter_lib.quality import QualityPredictor, _as_texts

__all__ = ["R2ROUTER_NAMES", "R2RouterPredictor"]

#: Our model -> R2-Router's model key in ``quality/r2router/config.json``.
R2ROUTER_NAMES: dict[str, str] = {
    "Gemma-3-1B": "gemma-3-1b-it",
    "Llama-3.2-3B": "Llama-3.2-3B-Instruct",
    "Gemma-3-4B": "gemma-3-4b-it",
    "Mistral-7B-v0.2": "Mistral-7B-Instruct-v0.2",
    "Llama-3.1-70B": "Llama-3.1-70B-Instruct",
}


class R2RouterPredictor(QualityPredictor):
    """The paper's predictor: R2-Router's released Ridge heads on a Qwen3-0.6B embedding.

    Parameters
    ----------
    embed_fn
        Maps n texts to an (n, 1024) array: the embedding R2-Router was trained on
        (``Qwen/Qwen3-0.6B``). Any other embedding gives meaningless scores. None is allowed at
        construction (the heads load), but predicting then raises.

    Notes
    -----
    The text embedded for a query with context is ``context + "\\n\\n" + query`` (the paper scores
    "from the current query and recent context"); without context, the query alone.
    """

    def __init__(self, embed_fn: Callable[[Sequence[str]], np.ndarray] | None = None) -> None:
        import joblib

        self.embed_fn = embed_fn
        config = json.loads(fetch("quality/r2router/config.json").read_text(encoding="utf-8"))
        self.embedding_model = config.get("embedding_model", "Qwen/Qwen3-0.6B")
        self.embedding_dim = int(config.get("embedding_dim", 1024))
        self.score_heads, self.token_heads, self.dirs = [], [], []
        for ours in self.models:
            key = R2ROUTER_NAMES[ours]
            entry = config.get("models", {}).get(key)
            if entry is None or "checkpoint_dir" not in entry:
                raise ValueError(f"quality/r2router/config.json has no checkpoint_dir for {key!r}"
                                 f" ({ours})")
            d = entry["checkpoint_dir"]
            self.dirs.append(d)
            for kind, heads in (("score", self.score_heads), ("token", self.token_heads)):
                head = joblib.load(fetch(f"quality/r2router/{d}/unlimited_{kind}_predictor.joblib"))
                if getattr(head, "n_features_in_", None) != self.embedding_dim:
                    raise ValueError(f"R2-Router {kind} head of {key} expects "
                                     f"{getattr(head, 'n_features_in_', None)} inputs, config "
                                     f"says {self.embedding_dim}")
                heads.append(head)

    def _embed(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None
    ) -> np.ndarray:
        q = _as_texts(queries, None, "queries")
        c = _as_texts(contexts, len(q), "contexts") if contexts is not None else [""] * len(q)
        if self.embed_fn is None:
            raise RuntimeError(
                f"R2RouterPredictor needs an embedding function for {self.embedding_model}, "
                f"which is not available offline; pass embed_fn=... (texts -> "
                f"(n, {self.embedding_dim}) array)"
            )
        texts = [f"{ci}\n\n{qi}" if ci else qi for qi, ci in zip(q, c, strict=True)]
        emb = np.asarray(self.embed_fn(texts), dtype=np.float64)
        if emb.shape != (len(texts), self.embedding_dim):
            raise ValueError(
                f"embed_fn returned shape {emb.shape}; R2-Router's heads need "
                f"({len(texts)}, {self.embedding_dim}) ({self.embedding_model} embeddings)"
            )
        if not np.all(np.isfinite(emb)):
            raise ValueError("embed_fn returned non-finite values")
        return emb

    def predict(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> np.ndarray:
        """R2-Router's predicted quality, clipped to [0, 1], shape (n, 5), MODELS order."""
        emb = self._embed(queries, contexts)
        return np.column_stack([np.clip(h.predict(emb), 0.0, 1.0) for h in self.score_heads])

    def predict_output_tokens(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> np.ndarray:
        """R2-Router's predicted output length (tokens, unlimited budget), shape (n, 5).

        Negative predictions of the linear heads are clipped to 0 tokens.
        """
        emb = self._embed(queries, contexts)
        return np.column_stack([np.maximum(h.predict(emb), 0.0) for h in self.token_heads])
