"""IncrementalDetokenizer: streamed text equals a full decode, never splits a UTF-8 character, stays O(1) per token."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from flint_engine.detokenizer import MAX_WINDOW_TOKENS, IncrementalDetokenizer
from flint_engine.tokenizer import FlintTokenizer, build_default_tokenizer

REPLACEMENT = "\ufffd"


def byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHAR = byte_to_char()


def byte_tokens(tok: FlintTokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte, so every multi-byte character spans several tokens."""
    ids = [tok.token_to_id(BYTE_CHAR[b]) for b in text.encode("utf-8")]
    assert None not in ids
    return ids  # type: ignore[return-value]


def stream(tok: FlintTokenizer, ids: list[int], **kwargs) -> tuple[list[str], str]:
    d = IncrementalDetokenizer(tok, **kwargs)
    pieces = [d.add(i) for i in ids]
    tail = d.flush()
    assert d.text == "".join(pieces) + tail
    return pieces, tail


@pytest.fixture(scope="module")
def tok() -> FlintTokenizer:
    return build_default_tokenizer(2048)


@pytest.fixture(scope="module")
def cross_tok() -> FlintTokenizer:
    """Byte tokens plus tokens that end or start in the middle of a character ("中文" = e4b8ad e69687)."""
    vocab = {c: b for b, c in BYTE_CHAR.items()}
    pieces = [b"\xb8\xad\xe6", b"\x96\x87\xe4", b"a\xf0\x9f", b"\x98\x80b", b"\xe4\xb8\xad\xe6\x96"]
    for p in pieces:
        vocab["".join(BYTE_CHAR[b] for b in p)] = len(vocab)
    t = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens(["<|user|>"])
    return FlintTokenizer(t)


TEXTS = [
    "plain ascii text, nothing special.",
    "中文测试：你好，世界！日本語のテキスト。한국어",
    "emoji 😀👍🏽🎉👨‍👩‍👧 and flags 🇳🇴🇯🇵",
    "mixed: naïve café — “quotes” ‘x’ € ₿ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u200b zero-width",
    "a literal replacement char \ufffd inside valid text \ufffd",
]


@pytest.mark.parametrize("text", TEXTS)
def test_valid_text_streams_exactly(tok: FlintTokenizer, text: str) -> None:
    for ids in (tok.encode(text), byte_tokens(tok, text)):
        pieces, tail = stream(tok, ids)
        assert "".join(pieces) + tail == text
        # Only the real U+FFFD characters of the text may appear, never a broken character.
        assert "".join(pieces).count(REPLACEMENT) + tail.count(REPLACEMENT) == text.count(REPLACEMENT)


def test_partial_character_is_held_back(tok: FlintTokenizer) -> None:
    ids = byte_tokens(tok, "a😀b")  # 61 | f0 9f 98 80 | 62
    d = IncrementalDetokenizer(tok)
    assert [d.add(i) for i in ids] == ["a", "", "", "", "😀", "b"]
    assert d.flush() == ""
    assert d.text == "a😀b"


def test_chain_of_tokens_ending_mid_character(cross_tok: FlintTokenizer) -> None:
    t = cross_tok
    e4 = t.token_to_id(BYTE_CHAR[0xE4])
    ids = [
        e4,
        t.token_to_id("¸Ń" + BYTE_CHAR[0xE6]),
        t.token_to_id(BYTE_CHAR[0x96] + BYTE_CHAR[0x87] + "ä"),
        t.token_to_id("¸Ń" + BYTE_CHAR[0xE6]),
        t.token_to_id(BYTE_CHAR[0x96] + BYTE_CHAR[0x87] + "ä"),
    ]
    assert None not in ids
    d = IncrementalDetokenizer(t)
    # Every token but the first completes one character while starting another; each is emitted at once.
    assert [d.add(i) for i in ids] == ["", "中", "文", "中", "文"]
    assert d.flush() == REPLACEMENT  # the trailing lone e4 was never completed
    assert d.text == t.decode(ids)


def test_random_sequences_match_full_decode(tok: FlintTokenizer, cross_tok: FlintTokenizer) -> None:
    rng = random.Random(1234)
    for trial in range(400):
        t = cross_tok if trial % 4 == 3 else tok
        # Mostly small ids (bytes and merges, where partial characters live), sometimes the whole vocabulary.
        hi = t.vocab_size if trial % 5 == 0 else min(t.vocab_size, 700)
        ids = [rng.randrange(hi) for _ in range(rng.randrange(1, 120))]
        for skip in (False, True):
            pieces, tail = stream(t, ids, skip_special_tokens=skip)
            assert "".join(pieces) + tail == t.decode(ids, skip_special_tokens=skip), (trial, skip, ids)


def test_random_valid_text_never_yields_replacement(tok: FlintTokenizer) -> None:
    rng = random.Random(99)
    alphabet = "abc xyz.,\n€ßé中文字😀🎉👍🏽한ü\u0301"
    for _ in range(150):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        ids = tok.encode(text)
        if rng.random() < 0.5:
            ids = byte_tokens(tok, text)
        pieces, tail = stream(tok, ids)
        assert all(REPLACEMENT not in p for p in pieces) and REPLACEMENT not in tail
        assert "".join(pieces) + tail == text


def test_special_tokens_with_and_without_skipping(tok: FlintTokenizer) -> None:
    text = (
        "<think>Reasoning 中文</think>Answer"
        "<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call><|user|>"
    )
    ids = tok.encode(text)
    assert ids.count(tok.token_to_id("<think>")) == 1
    pieces, tail = stream(tok, ids)
    assert "".join(pieces) + tail == text
    assert "<think>" in pieces  # the special token comes out as its own piece
    pieces, tail = stream(tok, ids, skip_special_tokens=True)
    assert "".join(pieces) + tail == "Reasoning 中文Answerfkv"
    # A special token between the bytes of a character is skipped without breaking it.
    split = byte_tokens(tok, "€")
    ids = [split[0], tok.token_to_id("<|user|>"), *split[1:]]
    d = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert [d.add(i) for i in ids] == ["", "", "", "€"]


def test_prompt_context(tok: FlintTokenizer) -> None:
    prompt = tok.encode("[gMASK]<sop><|user|>Say hi in Chinese<|assistant|></think>")
    out_text = "你好 there, 😀!"
    out = byte_tokens(tok, out_text)
    for skip in (False, True):
        d = IncrementalDetokenizer(tok, prompt_ids=prompt, skip_special_tokens=skip)
        assert "".join(d.add(i) for i in out) + d.flush() == out_text
    # A prompt that ends mid-character: the output completes it and the whole character is emitted once.
    euro = byte_tokens(tok, "€")
    d = IncrementalDetokenizer(tok, prompt_ids=tok.encode("x") + euro[:2])
    assert d.add(euro[2]) == "€"
    assert d.add(tok.encode("y")[0]) == "y"


def test_window_stays_bounded(tok: FlintTokenizer) -> None:
    class Counting:
        def __init__(self, inner: FlintTokenizer) -> None:
            self.inner = inner
            self.max_len = 0
            self.calls = 0
            self.special_token_ids = inner.special_token_ids
            self.vocab_size = inner.vocab_size

        def decode(self, ids, skip_special_tokens=False):
            self.calls += 1
            self.max_len = max(self.max_len, len(ids))
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    text = "Streaming 中文 and emoji 😀 for a long while. " * 200
    ids = tok.encode(text) + byte_tokens(tok, "字" * 300)
    counting = Counting(tok)
    prompt = tok.encode("A long prompt. " * 100)
    d = IncrementalDetokenizer(counting, prompt_ids=prompt)  # type: ignore[arg-type]
    out = "".join(d.add(i) for i in ids) + d.flush()
    assert out == text + "字" * 300
    assert counting.max_len <= MAX_WINDOW_TOKENS
    assert counting.calls <= 1.2 * len(ids) + 10


def test_truncated_output_flushes_replacement(tok: FlintTokenizer) -> None:
    ids = tok.encode("ok ") + byte_tokens(tok, "😀")[:3]
    d = IncrementalDetokenizer(tok)
    assert "".join(d.add(i) for i in ids) == "ok "
    assert d.flush() == REPLACEMENT
    assert d.text == tok.decode(ids) == "ok " + REPLACEMENT
    assert d.num_tokens == len(ids)
    assert d.flush() == ""


def test_unknown_ids_are_ignored_like_full_decode(tok: FlintTokenizer) -> None:
    ids = [*tok.encode("ab"), tok.vocab_size + 5, -1, *tok.encode("c")]
    pieces, tail = stream(tok, ids)
    assert "".join(pieces) + tail == "abc" == tok.decode([i for i in ids if 0 <= i < tok.vocab_size])
