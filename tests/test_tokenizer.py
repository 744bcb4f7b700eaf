"""FlintTokenizer: encode/decode, special tokens, HF directory and GGUF metadata round trips, the built-in tokenizer."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import gguf
import pytest
from tokenizers import pre_tokenizers

from flint_engine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplateError
from flint_engine.tokenizer import (
    END_OF_TURN_TOKENS,
    K_HF_JSON,
    SPECIAL_TOKENS,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    FlintTokenizer,
    TokenizerError,
    build_default_tokenizer,
)

TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  \n\n\ttabs\r\nCRLF",
    "Emoji: 😀👍🏽🎉 family 👨‍👩‍👧 flags 🇳🇴",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트.",
    "naïve façade Ελληνικά Привет עברית العربية",
    'def f(x: int) -> int:\n    return x ** 2  # 12345678 3.14159e-10 {"k": [1, 2]}',
    "<|user|>hi<|assistant|><think>hmm</think>ok<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
    "partial specials: <|user| <think <|endoftext|",
    "I'M HERE, you're there; it'S fine",
]


@pytest.fixture(scope="module")
def tok() -> FlintTokenizer:
    return build_default_tokenizer(2048)


@pytest.fixture(scope="module")
def big() -> FlintTokenizer:
    return build_default_tokenizer(150144)


def _same_tokenizer(a: FlintTokenizer, b: FlintTokenizer) -> None:
    for text in TEXTS:
        assert a.encode(text) == b.encode(text), text
        ids = a.encode(text)
        assert b.decode(ids) == a.decode(ids)
        assert b.decode(ids, skip_special_tokens=True) == a.decode(ids, skip_special_tokens=True)
    assert a.vocab_size == b.vocab_size
    assert a.special_token_ids == b.special_token_ids
    assert a.eos_token_ids == b.eos_token_ids
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id)
    assert a.chat_template == b.chat_template


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(tok: FlintTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_decode_drops_ids_outside_the_vocabulary(tok: FlintTokenizer) -> None:
    """Negative and huge ids (past the Rust decoder's u32) are dropped, as ids past the vocabulary are."""
    ids = tok.encode("hello world")
    assert tok.decode([-1, *ids, tok.vocab_size, 2**40]) == tok.decode(ids) == "hello world"


def test_special_tokens_are_single_ids(tok: FlintTokenizer) -> None:
    for t in SPECIAL_TOKENS:
        i = tok.token_to_id(t)
        assert i is not None
        assert tok.encode(t) == [i]
        embedded = tok.encode(f"a{t}b {t}")
        assert embedded.count(i) == 2 and tok.decode(embedded) == f"a{t}b {t}"
        assert tok.id_to_token(i) == t
        assert i in tok.special_token_ids
    ids = tok.encode("x<|user|>y")
    assert tok.token_to_id("<|user|>") in ids
    assert tok.decode(ids, skip_special_tokens=True) == "xy"
    assert tok.decode(ids) == "x<|user|>y"


def test_special_token_facts(tok: FlintTokenizer) -> None:
    eot = tuple(tok.token_to_id(t) for t in END_OF_TURN_TOKENS)
    assert tok.eos_token_ids == eot
    assert tok.eos_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.bos_token_id == tok.token_to_id("[gMASK]")
    assert tok.pad_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.chat_template == DEFAULT_CHAT_TEMPLATE
    assert tok.token_to_id("definitely-not-a-token") is None
    assert tok.id_to_token(tok.vocab_size) is None
    assert tok.id_to_token(-1) is None


def test_byte_tokens_all_present(tok: FlintTokenizer) -> None:
    for ch in pre_tokenizers.ByteLevel.alphabet():
        assert tok.token_to_id(ch) is not None
    # Any byte sequence, valid UTF-8 or not, encodes.
    assert tok.decode(tok.encode("\x00\x01\x7f\u0080\uffff")) == "\x00\x01\x7f\u0080\uffff"


def test_chat_helpers(tok: FlintTokenizer) -> None:
    msgs = [{"role": "user", "content": "Hi 👋"}]
    prompt = tok.apply_chat_template(msgs)
    assert prompt == "[gMASK]<sop><|user|>Hi 👋<|assistant|><think>"
    ids = tok.encode_chat(msgs, enable_thinking=False)
    assert ids[:3] == [tok.token_to_id("[gMASK]"), tok.token_to_id("<sop>"), tok.token_to_id("<|user|>")]
    assert ids[-2:] == [tok.token_to_id("<|assistant|>"), tok.token_to_id("</think>")]
    assert tok.decode(ids) == "[gMASK]<sop><|user|>Hi 👋<|assistant|></think>"


@pytest.mark.parametrize("vocab_size", [384, 2048])
def test_default_tokenizer_exact_size_and_deterministic(vocab_size: int) -> None:
    a = build_default_tokenizer(vocab_size)
    b = build_default_tokenizer(vocab_size)
    assert a.vocab_size == vocab_size
    assert a.backend.get_vocab_size(with_added_tokens=True) == vocab_size
    assert a.backend.to_str() == b.backend.to_str()
    ids = set(a.backend.get_vocab(with_added_tokens=True).values())
    assert ids == set(range(vocab_size))  # dense ids, no holes


def test_default_tokenizer_150144(big: FlintTokenizer) -> None:
    assert big.vocab_size == 150144
    assert big.backend.get_vocab_size(with_added_tokens=True) == 150144
    assert big.id_to_token(150143) is not None and big.id_to_token(150144) is None
    last = big.id_to_token(150143)
    assert last.startswith("<|reserved_") and 150143 in big.special_token_ids
    for text in TEXTS:
        assert big.decode(big.encode(text)) == text
    again = build_default_tokenizer(150144)
    assert again.backend.to_str() == big.backend.to_str()


def test_extra_corpus_changes_merges_but_not_size() -> None:
    base = build_default_tokenizer(2048)
    more = build_default_tokenizer(2048, extra_corpus=["zyzzyva quokka " * 50])
    assert more.vocab_size == 2048
    assert len(more.encode("zyzzyva quokka")) < len(base.encode("zyzzyva quokka"))


def test_vocab_too_small_is_an_error() -> None:
    with pytest.raises(ValueError, match="too small"):
        build_default_tokenizer(256 + len(SPECIAL_TOKENS) - 1)
    assert build_default_tokenizer(256 + len(SPECIAL_TOKENS)).vocab_size == 256 + len(SPECIAL_TOKENS)


def test_gguf_metadata_contents(tok: FlintTokenizer) -> None:
    meta = tok.to_gguf_metadata()
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == "glm4"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    merges = meta["tokenizer.ggml.merges"]
    assert len(tokens) == len(types) == tok.vocab_size
    assert all(isinstance(t, str) for t in tokens) and all(isinstance(t, int) for t in types)
    assert tokens[tok.token_to_id("<|user|>")] == "<|user|>"
    assert types[tok.token_to_id("<|user|>")] == TOKEN_CONTROL
    assert types[tok.token_to_id("Ġ")] == TOKEN_NORMAL
    assert tokens[tok.token_to_id("Ġ")] == "Ġ"  # byte-level unicode form, as in tokenizer.json
    assert merges and all(isinstance(m, str) and len(m.split(" ")) == 2 for m in merges)
    assert meta["tokenizer.ggml.eos_token_id"] == tok.token_to_id("<|endoftext|>")
    assert meta["tokenizer.ggml.eot_token_id"] == tok.token_to_id("<|user|>")
    assert meta["tokenizer.ggml.bos_token_id"] == tok.bos_token_id
    assert meta["tokenizer.ggml.padding_token_id"] == tok.pad_token_id
    assert meta["tokenizer.chat_template"] == DEFAULT_CHAT_TEMPLATE
    assert json.loads(meta[K_HF_JSON])["model"]["type"] == "BPE"


def test_gguf_round_trip_with_hf_json(tok: FlintTokenizer) -> None:
    back = FlintTokenizer.from_gguf_metadata(tok.to_gguf_metadata())
    _same_tokenizer(tok, back)
    assert back.backend.to_str() == tok.backend.to_str()


def test_gguf_round_trip_without_hf_json(tok: FlintTokenizer) -> None:
    meta = tok.to_gguf_metadata()
    del meta[K_HF_JSON]
    back = FlintTokenizer.from_gguf_metadata(meta)
    _same_tokenizer(tok, back)
    # Written again, the rebuilt tokenizer gives the same llama.cpp keys.
    again = back.to_gguf_metadata()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.pre"):
        assert again[key] == meta[key]


def test_gguf_round_trip_through_a_file(tok: FlintTokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tok.gguf"
    w = gguf.GGUFWriter(str(path), arch="flint")
    for key, value in tok.to_gguf_metadata().items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = {f.name: f.contents() for f in gguf.GGUFReader(str(path)).fields.values()}
    _same_tokenizer(tok, FlintTokenizer.from_gguf_metadata(meta))
    del meta[K_HF_JSON]
    _same_tokenizer(tok, FlintTokenizer.from_gguf_metadata(meta))


def test_gguf_pre_selects_regex(tok: FlintTokenizer, caplog: pytest.LogCaptureFixture) -> None:
    meta = tok.to_gguf_metadata()
    del meta[K_HF_JSON]
    # GLM-4 groups up to three digits, Qwen2 splits every digit, GPT-2 keeps digit runs whole.
    glm = FlintTokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "chatglm-bpe"})
    qwen = FlintTokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "qwen2"})
    gpt2 = FlintTokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "gpt2"})
    digits = "1234567"
    assert len(qwen.encode(digits)) == 7
    assert glm.encode(digits) == tok.encode(digits)
    for t in (glm, qwen, gpt2):
        assert t.decode(t.encode(TEXTS[6])) == TEXTS[6]
    with caplog.at_level(logging.WARNING, logger="flint_engine.tokenizer"):
        odd = FlintTokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "mystery-pre"})
    assert "mystery-pre" in caplog.text
    assert odd.encode(TEXTS[6]) == tok.encode(TEXTS[6])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.token_type": None}, "tokenizer.ggml.token_type"),
        ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type"),
        ({"tokenizer.ggml.merges": ["abc"]}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.eos_token_id": 10**7}, "tokenizer.ggml.eos_token_id"),
        ({"tokenizer.ggml.bos_token_id": "x"}, "tokenizer.ggml.bos_token_id"),
        ({"tokenizer.chat_template": 5}, "tokenizer.chat_template"),
    ],
)
def test_gguf_bad_metadata_names_the_key(tok: FlintTokenizer, change: dict, needle: str) -> None:
    meta = tok.to_gguf_metadata()
    del meta[K_HF_JSON]
    for k, v in change.items():
        if v is None:
            del meta[k]
        else:
            meta[k] = v
    with pytest.raises(TokenizerError, match=needle.replace(".", r"\.")):
        FlintTokenizer.from_gguf_metadata(meta)


def test_gguf_duplicate_token_and_bad_hf_json(tok: FlintTokenizer) -> None:
    meta = tok.to_gguf_metadata()
    with pytest.raises(TokenizerError, match=K_HF_JSON.replace(".", r"\.")):
        FlintTokenizer.from_gguf_metadata({**meta, K_HF_JSON: "{not json"})
    del meta[K_HF_JSON]
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[5] = tokens[6]
    with pytest.raises(TokenizerError, match="twice"):
        FlintTokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.tokens": tokens})


def test_save_hf_round_trip(tok: FlintTokenizer, tmp_path: Path) -> None:
    tok.save_hf(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    back = FlintTokenizer.from_hf_dir(tmp_path)
    _same_tokenizer(tok, back)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|endoftext|>" and cfg["bos_token"] == "[gMASK]"
    assert (tmp_path / "chat_template.jinja").read_text() == DEFAULT_CHAT_TEMPLATE


def test_from_hf_dir_template_and_eos_sources(tok: FlintTokenizer, tmp_path: Path) -> None:
    tok.save_hf(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages[0].content }}"
    cfg["eos_token"] = {"content": "<|endoftext|>", "special": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    extra = tok.token_to_id("<think>")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_token_id, extra]}))
    t = FlintTokenizer.from_hf_dir(tmp_path)
    assert t.apply_chat_template([{"role": "user", "content": "raw"}]) == "raw"
    assert t.has_own_chat_template
    assert t.eos_token_ids[:2] == (tok.eos_token_id, extra)
    assert set(t.eos_token_ids) == {extra, *tok.eos_token_ids}
    # chat_template.jinja wins over the config's template.
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert FlintTokenizer.from_hf_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "J1"


def test_from_hf_dir_without_config_uses_defaults(tok: FlintTokenizer, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(tok.backend.to_str())
    t = FlintTokenizer.from_hf_dir(tmp_path)
    assert t.chat_template == DEFAULT_CHAT_TEMPLATE and not t.has_own_chat_template
    assert t.eos_token_ids == tok.eos_token_ids  # the end-of-turn tokens are found by name
    assert t.bos_token_id is None


def test_missing_or_bad_files(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        FlintTokenizer.from_hf_dir(tmp_path)
    with pytest.raises(TokenizerError, match="not found"):
        FlintTokenizer.from_tokenizer_json(tmp_path / "nope.json")
    with pytest.raises(TokenizerError, match=r"invalid tokenizer\.json"):
        FlintTokenizer.from_tokenizer_json('{"version": "1.0"}')
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json"):
        FlintTokenizer.from_hf_dir(tmp_path)


def test_from_tokenizer_json_path_and_text(tok: FlintTokenizer, tmp_path: Path) -> None:
    text = tok.backend.to_str()
    (tmp_path / "tokenizer.json").write_text(text)
    names = {"eos_token": "<|endoftext|>", "bos_token": "[gMASK]", "pad_token": "<|endoftext|>"}
    a = FlintTokenizer.from_tokenizer_json(text, **names)
    b = FlintTokenizer.from_tokenizer_json(str(tmp_path / "tokenizer.json"), **names)
    _same_tokenizer(tok, a)
    _same_tokenizer(tok, b)


def test_transformers_loads_saved_dir_identically(tok: FlintTokenizer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok.save_hf(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in [*TEXTS, "\n".join(TEXTS) * 300]:  # the last ~100K characters
        assert hf.encode(text, add_special_tokens=True) == tok.encode(text)
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "use tool",
            "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"city": "Oslo", "n": 2}}}],
        },
        {"role": "tool", "content": "cold"},
    ]
    tools = [{"type": "function", "function": {"name": "w", "description": "weather", "parameters": {}}}]
    for kwargs in ({}, {"enable_thinking": False}, {"clear_thinking": False}):
        ours = tok.apply_chat_template(msgs, tools=tools, **kwargs)
        theirs = hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
        assert ours == theirs


@pytest.mark.parametrize(
    "final",
    [
        {"role": "assistant", "content": "The answer is"},
        {"role": "assistant", "content": "The answer is "},  # the template strips the blank: it stays off
        {"role": "assistant", "content": [{"type": "text", "text": "Part one, "}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": "Thinking done.", "reasoning_content": "a plan"},
        {"role": "user", "content": "and then"},
    ],
)
def test_continue_final_message_cuts_as_transformers_does(tok: FlintTokenizer, tmp_path: Path, final: dict) -> None:
    """`continue_final_message`: the prompt ends inside the final message, exactly where transformers' cut puts it."""
    from transformers import AutoTokenizer

    tok.save_hf(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = [{"role": "user", "content": "What is 2 + 2?"}, final]
    ours = tok.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True)
    theirs = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    assert ours == theirs
    assert ours.endswith("two" if isinstance(final["content"], list) else final["content"].rstrip())
    with pytest.raises(ChatTemplateError, match="cannot both be set"):
        tok.apply_chat_template(msgs, add_generation_prompt=True, continue_final_message=True)
