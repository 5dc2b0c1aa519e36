"""Tests of carbonrouter_lib.tokenizers: model map, known counts, round trips, batching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib.tokenizers import (
    MODELS,
    TOKENIZER_FAMILIES,
    TOKENIZER_OF_MODEL,
    count_tokens,
    decode,
    encode,
    family_of,
    get_tokenizer,
)

ROUND_TRIP = [
    "Hello world",
    "naïve café — Grüße, 日本語のテキスト, emoji 😀🚀",
    "code:\n\tdef f(x):\n        return x**2  # square\n",
    "  leading and trailing  ",
    "multiple\n\n\nnewlines and \r\n windows line ends",
    "ﬁ ligature ① ＡＢＣ and a\u00a0non-breaking space",
    'quotes "x" and braces {"a": [1, 2]} and a backslash \\',
]


def test_model_names_and_families_match_the_paper():
    assert MODELS == ("Gemma-3-1B", "Llama-3.2-3B", "Gemma-3-4B", "Mistral-7B-v0.2",
                      "Llama-3.1-70B")
    assert TOKENIZER_FAMILIES == ("gemma3", "llama3", "mistral")
    assert set(TOKENIZER_OF_MODEL) == set(MODELS)
    # docs/model.md §2: Gemma-3 tokenizer for both Gemmas, Llama-3 for both Llamas, Mistral v1
    # for Mistral.
    for model, fam in TOKENIZER_OF_MODEL.items():
        expected = {"Gemma": "gemma3", "Llama": "llama3", "Mistral": "mistral"}[model.split("-")[0]]
        assert fam == expected
    assert family_of("Llama-3.1-70B") == "llama3"
    assert family_of("mistral") == "mistral"


@pytest.mark.parametrize("bad", ["gpt2", "Llama-3-70B", "", "GEMMA3"])
def test_unknown_family_or_model_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="unknown model or tokenizer family"):
        count_tokens(["hello"], bad)
    with pytest.raises(ValueError, match=repr(bad)):
        family_of(bad)


def test_count_tokens_refuses_a_bare_string_and_non_strings():
    with pytest.raises(TypeError, match="single str"):
        count_tokens("hello", "llama3")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        count_tokens(["a", 3], "gemma3")


def test_llama3_known_ids():
    # Llama 3's first 100,000 ranks are OpenAI's cl100k_base, where "Hello" is 9906 and
    # " world" is 1917: two tokens, no BOS.
    assert encode("Hello world", "llama3") == [9906, 1917]
    assert count_tokens(["Hello world"], "Llama-3.2-3B").tolist() == [2]


@pytest.mark.parametrize("family", TOKENIZER_FAMILIES)
def test_hand_checked_counts(family):
    # "" has no token (no BOS/EOS, docs/model.md §8a); "the" is one piece of every vocabulary
    # (Mistral: "▁the" with the dummy prefix; Gemma-3 and Llama-3: "the").
    counts = count_tokens(["", "the", "Hello"], family)
    assert counts.dtype == np.int64
    assert counts.tolist() == [0, 1, 1]


def test_sentencepiece_pieces_behind_the_hand_checked_counts():
    mistral = get_tokenizer("mistral")
    assert mistral.id_to_piece(encode("the", "mistral")[0]) == "▁the"
    gemma = get_tokenizer("gemma3")
    assert [gemma.id_to_piece(i) for i in encode("Hello world", "gemma3")] == ["Hello", "▁world"]
    # Mistral has no "\n" piece: each newline is one byte-fallback token.
    assert [mistral.id_to_piece(i) for i in encode("a\n\nb", "mistral")][-3:] == [
        "<0x0A>", "<0x0A>", "b"]


@pytest.mark.parametrize("family", TOKENIZER_FAMILIES)
def test_round_trip_and_counts_equal_encode_lengths(family):
    for s in ROUND_TRIP:
        assert decode(encode(s, family), family) == s
    assert count_tokens(ROUND_TRIP, family).tolist() == [len(encode(s, family)) for s in ROUND_TRIP]


@pytest.mark.parametrize("family", TOKENIZER_FAMILIES)
def test_batching_and_threads_do_not_change_counts(family):
    # More texts than one internal batch (2,048), of varied length.
    texts = [("word " * (i % 17)) + str(i) + "é" * (i % 3) for i in range(4500)]
    one = count_tokens(texts, family, num_threads=1)
    two = count_tokens(texts, family, num_threads=2)
    assert one.shape == (4500,)
    np.testing.assert_array_equal(one, two)
    sample = range(0, 4500, 97)
    assert [one[i] for i in sample] == [len(encode(texts[i], family)) for i in sample]


def test_model_name_counts_like_its_family_and_tokenizers_are_cached():
    texts = ["one conversation turn", "another, longer one with 12345 digits"]
    np.testing.assert_array_equal(count_tokens(texts, "Gemma-3-4B"), count_tokens(texts, "gemma3"))
    assert get_tokenizer("llama3") is get_tokenizer("Llama-3.1-70B")


# Tokens the "\n\n" separator adds in the middle of a text: Gemma-3 and Llama-3 have a "\n\n"
# token, Mistral v1 spells each newline as a byte token.
SEPARATOR_TOKENS = {"gemma3": 1, "llama3": 1, "mistral": 2}
ALPHABET = st.sampled_from(list(" \n\t.,!?aAbz09é日😀\\'\"-_<>"))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    a=st.one_of(st.text(max_size=40), st.text(alphabet=ALPHABET, max_size=40)),
    b=st.one_of(st.text(max_size=40), st.text(alphabet=ALPHABET, max_size=40)),
    family=st.sampled_from(TOKENIZER_FAMILIES),
)
def test_joining_two_texts_costs_about_the_separator(a, b, family):
    # Tokenization is local: joining two texts changes only the tokens at the seam (checked on
    # 20,000 random pairs and on real ShareGPT messages: the deviation stays within ±2).
    ab, na, nb = count_tokens([a + "\n\n" + b, a, b], family)
    assert abs(ab - na - nb - SEPARATOR_TOKENS[family]) <= 2
