"""Per-model token counting: every token count of the paper is under the serving model's tokenizer.

The paper's five models use three tokenizers (``docs/model.md`` §2): the Gemma-3 SentencePiece model
for Gemma-3-1B and Gemma-3-4B, the Llama-3 tiktoken BPE for Llama-3.2-3B and Llama-3.1-70B, and the
Mistral v1 SentencePiece model for Mistral-7B-v0.2. The tokenizer files come from the data layer
(:func:`carbonrouter_lib.datasets.fetch`, hash-verified) and never from the network at load time.

Counts are of the raw text only: no BOS/EOS token and no chat template (``docs/model.md`` §8a), so
``count_tokens([""], f)`` is 0 for every family. Counting is batched and multi-threaded
(tiktoken's ``encode_ordinary_batch``, SentencePiece's list ``encode``) and processes long inputs
in chunks so that memory stays bounded (only the counts are kept, never the token ids).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from carbonrouter_lib.datasets import fetch
from carbonrouter_lib.profiles import MODELS  # the model catalog lives in profiles

__all__ = [
    "MODELS",
    "TOKENIZER_FAMILIES",
    "TOKENIZER_OF_MODEL",
    "TOKENIZER_FILES",
    "LLAMA3_PAT_STR",
    "family_of",
    "get_tokenizer",
    "encode",
    "decode",
    "count_tokens",
]


#: Tokenizer families; one table column per family (``new_tokens_<family>`` etc.).
TOKENIZER_FAMILIES: tuple[str, ...] = ("gemma3", "llama3", "mistral")

#: Which tokenizer each model uses (docs/model.md §2).
TOKENIZER_OF_MODEL: dict[str, str] = {
    "Gemma-3-1B": "gemma3",
    "Llama-3.2-3B": "llama3",
    "Gemma-3-4B": "gemma3",
    "Mistral-7B-v0.2": "mistral",
    "Llama-3.1-70B": "llama3",
}

#: Data-registry name of each family's tokenizer file.
TOKENIZER_FILES: dict[str, str] = {
    "gemma3": "tokenizers/tokenizer.gemma3",
    "llama3": "tokenizers/tokenizer_llama3.tiktoken",
    "mistral": "tokenizers/tokenizer.mistral-v1",
}

#: Llama 3's pre-tokenizer split pattern (from Meta's ``llama_models`` tokenizer; data README).
LLAMA3_PAT_STR = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Texts per batch handed to the tokenizer: large enough for the thread pool to pay off, small
# enough that the token-id lists of one batch (Python ints, ~36 bytes each) stay in the MBs.
_BATCH_TEXTS = 2048


def family_of(model_or_family: str) -> str:
    """Tokenizer family of a model name (``"Llama-3.1-70B"``) or of a family name (``"llama3"``).

    Raises
    ------
    ValueError
        The name is neither one of :data:`MODELS` nor one of :data:`TOKENIZER_FAMILIES`.
    """
    if model_or_family in TOKENIZER_FAMILIES:
        return model_or_family
    try:
        return TOKENIZER_OF_MODEL[model_or_family]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown model or tokenizer family {model_or_family!r}; models: {list(MODELS)}, "
            f"families: {list(TOKENIZER_FAMILIES)}"
        ) from None


def get_tokenizer(family: str) -> Any:
    """The loaded tokenizer of ``family`` (model names accepted), cached per process.

    Returns a :class:`tiktoken.Encoding` for ``"llama3"`` and a
    :class:`sentencepiece.SentencePieceProcessor` for ``"gemma3"`` and ``"mistral"``.
    """
    return _load(family_of(family))


@functools.cache
def _load(family: str) -> Any:
    path = str(fetch(TOKENIZER_FILES[family]))
    if family == "llama3":
        import tiktoken
        import tiktoken.load

        # special_tokens={}: chat/BOS tokens are never counted (docs/model.md §8a), and
        # encode_ordinary
        # treats text like "<|eot_id|>" as plain text anyway.
        return tiktoken.Encoding(
            name="llama3",
            pat_str=LLAMA3_PAT_STR,
            mergeable_ranks=tiktoken.load.load_tiktoken_bpe(path),
            special_tokens={},
        )
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path)


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def encode(text: str, family: str) -> list[int]:
    """Token ids of ``text`` under ``family`` (or a model name): no BOS/EOS, no template."""
    if not isinstance(text, str):
        raise TypeError(f"encode expects a str, got {type(text).__name__}")
    family = family_of(family)
    tok = get_tokenizer(family)
    if family == "llama3":
        return tok.encode_ordinary(text)
    return tok.encode(text)


def decode(ids: Sequence[int], family: str) -> str:
    """Text of the token ids ``ids`` under ``family`` (or a model name)."""
    family = family_of(family)
    return get_tokenizer(family).decode(list(ids))


def count_tokens(
    texts: Sequence[str],
    family: str,
    *,
    num_threads: int | None = None,
    progress: bool | str = False,
) -> np.ndarray:
    """Number of tokens of each text under one tokenizer, batched and multi-threaded.

    Parameters
    ----------
    texts
        The texts (a sequence of ``str``; a bare ``str`` is refused, since iterating it would
        count characters).
    family
        Tokenizer family (``"gemma3"``, ``"llama3"``, ``"mistral"``) or a model name of
        :data:`MODELS`.
    num_threads
        Tokenizer threads; default: the CPUs this process may use.
    progress
        Show a tqdm bar over the texts; a string is used as the bar's description.

    Returns
    -------
    numpy.ndarray
        ``int64`` array of ``len(texts)`` token counts (tokens), without BOS/EOS or chat
        template tokens.

    Raises
    ------
    ValueError
        Unknown family or model.
    TypeError
        ``texts`` is a ``str`` or holds a non-``str`` element (the message names its index).
    """
    family = family_of(family)
    if isinstance(texts, str | bytes):
        raise TypeError("count_tokens expects a sequence of str, not a single str; wrap it in "
                        "a list")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"count_tokens: texts[{i}] is {type(t).__name__}, expected str")
    threads = num_threads or _default_threads()
    tok = get_tokenizer(family)
    out = np.zeros(len(texts), dtype=np.int64)

    bar = None
    if progress:
        from tqdm import tqdm

        desc = progress if isinstance(progress, str) else f"tokenize ({family})"
        bar = tqdm(total=len(texts), desc=desc, unit="text")
    try:
        for start in range(0, len(texts), _BATCH_TEXTS):
            batch = texts[start : start + _BATCH_TEXTS]
            if family == "llama3":
                ids = tok.encode_ordinary_batch(batch, num_threads=threads)
            else:
                ids = tok.encode(batch, num_threads=threads)
            out[start : start + len(batch)] = [len(x) for x in ids]
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    return out
