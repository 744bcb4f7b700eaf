"""Flint's tokenizer: a byte-level BPE `tokenizers.Tokenizer` plus special-token facts and the chat template.

Loads from a Hugging Face directory, a `tokenizer.json`, or GGUF metadata (llama.cpp's `tokenizer.ggml.*` keys),
writes both forms back, and can build a small deterministic stand-in tokenizer for tests and random checkpoints.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from flint_engine.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat_template

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet inverted: printable stand-in character -> the raw byte it encodes."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenizerError(ValueError):
    """A tokenizer source that is missing, malformed or unsupported; the message names the file or key."""


# GLM-4.7 special tokens, in GLM's id order. All are single added "special" tokens.
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
# The model ends its turn by starting the next speaker's turn, so these all stop generation.
END_OF_TURN_TOKENS: tuple[str, ...] = (ENDOFTEXT, "<|user|>", "<|observation|>")
RESERVED_TOKEN = "<|reserved_{}|>"

# llama.cpp token types (gguf.TokenType).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer split patterns, keyed by llama.cpp's `tokenizer.ggml.pre` names. "gpt2" and "default" use the
# GPT-2 pattern built into the ByteLevel pre-tokenizer.
GLM4_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
# Qwen2 differs from GLM-4 only in splitting digits one by one.
QWEN2_PATTERN = GLM4_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
_PRE_PATTERNS: dict[str, str] = {
    "qwen2": QWEN2_PATTERN,
    "glm4": GLM4_PATTERN,
    "chatglm-bpe": GLM4_PATTERN,
    "flint": GLM4_PATTERN,
}
DEFAULT_PRE = "glm4"

# GGUF keys (llama.cpp's names).
K_MODEL = "tokenizer.ggml.model"
K_PRE = "tokenizer.ggml.pre"
K_TOKENS = "tokenizer.ggml.tokens"
K_TOKEN_TYPE = "tokenizer.ggml.token_type"
K_MERGES = "tokenizer.ggml.merges"
K_BOS = "tokenizer.ggml.bos_token_id"
K_EOS = "tokenizer.ggml.eos_token_id"
K_EOT = "tokenizer.ggml.eot_token_id"
K_PAD = "tokenizer.ggml.padding_token_id"
K_ADD_BOS = "tokenizer.ggml.add_bos_token"
K_ADD_EOS = "tokenizer.ggml.add_eos_token"
K_TEMPLATE = "tokenizer.chat_template"
K_HF_JSON = "tokenizer.huggingface.json"


def make_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The byte-level pre-tokenizer for a `tokenizer.ggml.pre` name (unknown names get GLM-4's with a warning)."""
    if pre in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pattern = _PRE_PATTERNS.get(pre)
    if pattern is None:
        log.warning("unknown tokenizer.ggml.pre %r: using the GLM-4 split pattern", pre)
        pattern = GLM4_PATTERN
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _pre_tokenizer_json(pre: pre_tokenizers.PreTokenizer) -> Any:
    probe = Tokenizer(models.BPE())
    probe.pre_tokenizer = pre
    return json.loads(probe.to_str())["pre_tokenizer"]


def _infer_pre(tokenizer_json: Mapping[str, Any]) -> str | None:
    """The `tokenizer.ggml.pre` name whose pre-tokenizer equals this tokenizer's, if any."""
    have = tokenizer_json.get("pre_tokenizer")
    for name in ("glm4", "qwen2", "gpt2"):
        if have == _pre_tokenizer_json(make_pre_tokenizer(name)):
            return name
    return None


def _token_content(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string, or an AddedToken dict with `content`."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"special token entry {value!r} is neither a string nor an object with 'content'")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} does not hold a JSON object")
    return data


def _pick_template(value: Any, source: str) -> str | None:
    """`chat_template` may be a string or a list of {name, template}; take the one named 'default'."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        chosen = named.get("default") or next((t for t in named.values() if isinstance(t, str)), None)
        if isinstance(chosen, str):
            return chosen
    raise TokenizerError(f"{source}: chat_template is neither a string nor a list of named templates")


def _as_id_list(value: Any, source: str) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError) as e:
        raise TokenizerError(f"{source}: eos_token_id {value!r} is not an id or a list of ids") from e


class FlintTokenizer:
    """A byte-level BPE tokenizer with Flint's special tokens, end-of-turn ids and chat template."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        eos_token_ids: Iterable[int] = (),
        pre: str | None = None,
    ) -> None:
        self._tok = tokenizer
        self._chat_template = chat_template or DEFAULT_CHAT_TEMPLATE
        self._has_own_template = bool(chat_template)
        self._pre = pre
        added = tokenizer.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        self._vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._pad_token = pad_token
        self._bos_id = self._lookup(bos_token, "bos_token")
        self._eos_id = self._lookup(eos_token, "eos_token")
        self._pad_id = self._lookup(pad_token, "pad_token")
        ids: list[int] = []
        for i in [*eos_token_ids, self._eos_id, *(self.token_to_id(t) for t in END_OF_TURN_TOKENS)]:
            if i is None or i in ids:
                continue
            if not 0 <= i < self._vocab_size:
                raise TokenizerError(f"eos token id {i} is outside the vocabulary of {self._vocab_size}")
            ids.append(i)
        self._eos_ids = tuple(ids)

    def _lookup(self, token: str | None, what: str) -> int | None:
        if token is None:
            return None
        i = self._tok.token_to_id(token)
        if i is None:
            log.warning("%s %r is not in the vocabulary; ignoring it", what, token)
        return i

    # ----- construction -------------------------------------------------------------------------------------

    @classmethod
    def from_tokenizer_json(cls, path_or_json_str: str | os.PathLike[str], **kwargs: Any) -> FlintTokenizer:
        """From a tokenizer.json file path or its JSON text; `kwargs` go to the constructor."""
        if isinstance(path_or_json_str, str) and path_or_json_str.lstrip().startswith("{"):
            try:
                tok = Tokenizer.from_str(path_or_json_str)
            except Exception as e:  # tokenizers raises plain Exception for bad JSON
                raise TokenizerError(f"invalid tokenizer.json text: {e}") from e
        else:
            path = Path(path_or_json_str)
            if not path.is_file():
                raise TokenizerError(f"tokenizer.json not found: {path}")
            try:
                tok = Tokenizer.from_file(str(path))
            except Exception as e:
                raise TokenizerError(f"invalid tokenizer.json {path}: {e}") from e
        return cls(tok, **kwargs)

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> FlintTokenizer:
        """From a Hugging Face model directory.

        Reads tokenizer.json, and when present tokenizer_config.json (bos/eos/pad, chat_template),
        chat_template.jinja (preferred over the config's template, as transformers does) and
        generation_config.json (`eos_token_id`, the stop ids).
        """
        d = Path(path)
        if not (d / "tokenizer.json").is_file():
            raise TokenizerError(f"{d} has no tokenizer.json")
        cfg = _read_json(d / "tokenizer_config.json") or {}
        template: str | None = None
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text(encoding="utf-8")
        elif (legacy := _read_json(d / "chat_template.json")) is not None:
            template = _pick_template(legacy.get("chat_template"), "chat_template.json")
        else:
            template = _pick_template(cfg.get("chat_template"), "tokenizer_config.json")
        gen = _read_json(d / "generation_config.json") or {}
        eos_ids = _as_id_list(gen.get("eos_token_id"), "generation_config.json")
        return cls.from_tokenizer_json(
            d / "tokenizer.json",
            chat_template=template,
            bos_token=_token_content(cfg.get("bos_token")),
            eos_token=_token_content(cfg.get("eos_token")),
            pad_token=_token_content(cfg.get("pad_token")),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> FlintTokenizer:
        """From llama.cpp GGUF metadata; uses the embedded `tokenizer.huggingface.json` when present."""
        hf_json = meta.get(K_HF_JSON)
        pre = _meta_str(meta, K_PRE, required=False)
        if hf_json is not None:
            text = _as_str(hf_json, K_HF_JSON)
            try:
                tok = Tokenizer.from_str(text)
            except Exception as e:
                raise TokenizerError(f"GGUF key {K_HF_JSON} is not a valid tokenizer.json: {e}") from e
        else:
            tok = _tokenizer_from_gguf_vocab(meta, pre)
        n = tok.get_vocab_size(with_added_tokens=True)

        def token_at(key: str) -> int | None:
            value = meta.get(key)
            if value is None:
                return None
            try:
                i = int(value)
            except (TypeError, ValueError) as e:
                raise TokenizerError(f"GGUF key {key} = {value!r} is not a token id") from e
            if not 0 <= i < n or tok.id_to_token(i) is None:
                raise TokenizerError(f"GGUF key {key} = {i} is outside the vocabulary of {n} tokens")
            return i

        bos, eos, eot, pad = token_at(K_BOS), token_at(K_EOS), token_at(K_EOT), token_at(K_PAD)
        template = meta.get(K_TEMPLATE)
        return cls(
            tok,
            chat_template=_as_str(template, K_TEMPLATE) if template is not None else None,
            bos_token=tok.id_to_token(bos) if bos is not None else None,
            eos_token=tok.id_to_token(eos) if eos is not None else None,
            pad_token=tok.id_to_token(pad) if pad is not None else None,
            eos_token_ids=[i for i in (eos, eot) if i is not None],
            pre=pre,
        )

    # ----- writing ------------------------------------------------------------------------------------------

    def save_hf(self, directory: str | os.PathLike[str]) -> Path:
        """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `directory`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "tokenizer.json").write_text(self._tok.to_str(pretty=True), encoding="utf-8")
        cfg: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self._bos_token,
            "eos_token": self._eos_token,
            "pad_token": self._pad_token,
            # The chat template writes [gMASK]<sop> itself.
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 262144,
        }
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (d / "chat_template.jinja").write_text(self._chat_template, encoding="utf-8")
        return d

    def to_gguf_metadata(self) -> dict[str, Any]:
        """llama.cpp's tokenizer keys, plus the full tokenizer.json under `tokenizer.huggingface.json`."""
        text = self._tok.to_str()
        data = json.loads(text)
        model = data.get("model") or {}
        if model.get("type") != "BPE":
            raise TokenizerError(f"only BPE tokenizers can be written to GGUF, this one is {model.get('type')!r}")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        added = self._tok.get_added_tokens_decoder()
        tokens: list[str] = []
        types: list[int] = []
        for i in range(self._vocab_size):
            tok = self._tok.id_to_token(i)
            if tok is None:
                # llama.cpp needs a dense id range; a hole gets a placeholder that no text can produce.
                tokens.append(f"[PAD{i}]")
                types.append(TOKEN_UNUSED)
            elif i in added:
                tokens.append(tok)
                types.append(TOKEN_CONTROL if added[i].special else TOKEN_USER_DEFINED)
            else:
                tokens.append(tok)
                types.append(TOKEN_NORMAL)
        pre = self._pre or _infer_pre(data)
        if pre is None:
            log.warning("pre-tokenizer matches no known tokenizer.ggml.pre; readers without %s will differ", K_HF_JSON)
            pre = "default"
        meta: dict[str, Any] = {
            K_MODEL: "gpt2",
            K_PRE: pre,
            K_TOKENS: tokens,
            K_TOKEN_TYPE: types,
            K_MERGES: merges,
            K_ADD_BOS: False,
            K_ADD_EOS: False,
        }
        if self._bos_id is not None:
            meta[K_BOS] = self._bos_id
        if self.eos_token_id is not None:
            meta[K_EOS] = self.eos_token_id
        eot = self.token_to_id("<|user|>")
        if eot is None:
            eot = next((i for i in self._eos_ids if i != self.eos_token_id), None)
        if eot is not None:
            meta[K_EOT] = eot
        if self._pad_id is not None:
            meta[K_PAD] = self._pad_id
        meta[K_TEMPLATE] = self._chat_template
        meta[K_HF_JSON] = text
        return meta

    # ----- encoding -----------------------------------------------------------------------------------------

    @property
    def backend(self) -> Tokenizer:
        """The wrapped `tokenizers.Tokenizer`."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_id

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-sequence id (the configured eos token, else the first stop id)."""
        if self._eos_id is not None:
            return self._eos_id
        return self._eos_ids[0] if self._eos_ids else None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: configured eos ids and the end-of-turn tokens present."""
        return self._eos_ids

    @property
    def pad_token_id(self) -> int | None:
        return self._pad_id

    @property
    def bos_token(self) -> str | None:
        return self._bos_token

    @property
    def eos_token(self) -> str | None:
        return self._eos_token

    @property
    def pad_token(self) -> str | None:
        return self._pad_token

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    @property
    def chat_template(self) -> str:
        """The source's chat template, or DEFAULT_CHAT_TEMPLATE when it has none."""
        return self._chat_template

    @property
    def has_own_chat_template(self) -> bool:
        """Whether the chat template came from the source rather than the built-in default."""
        return self._has_own_template

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token strings in it become their single ids."""
        # The batch call without offsets: it lets go of the GIL while it runs (`encode` holds it: ~1.5 s for 2 MB of
        # text) and is faster; the ids are the same.
        return self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids` (numpy/torch integer items are accepted); ids outside the vocabulary are dropped."""
        # The Rust decoder takes u32 ids: a negative or huge id would raise OverflowError instead of being dropped.
        vocab = self._vocab_size
        kept = [k for k in (int(i) for i in ids) if 0 <= k < vocab]
        return self._tok.decode(kept, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of an id (byte-level form for BPE tokens), or None."""
        if token_id < 0:
            return None
        return self._tok.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token stands for (a byte-level BPE token may hold part of a UTF-8 character)."""
        cache = self.__dict__.setdefault("_bytes_cache", {})
        hit = cache.get(token_id)
        if hit is None:
            piece = self.id_to_token(token_id) or ""
            table = byte_level_decoder()
            if token_id in self._special_ids or not all(ch in table for ch in piece):
                hit = piece.encode("utf-8")
            else:
                hit = bytes(table[ch] for ch in piece)
            cache[token_id] = hit
        return hit

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Render the conversation with this tokenizer's template, or `template` (special-token strings are
        template variables); with `continue_final_message` the prompt ends inside the final message, for the model to
        go on with it."""
        context: dict[str, Any] = {"bos_token": self._bos_token or "", "eos_token": self._eos_token or ""}
        if self._pad_token is not None:
            context["pad_token"] = self._pad_token
        context.update(kwargs)
        return render_chat_template(
            template or self._chat_template, messages, tools, add_generation_prompt, continue_final_message, **context
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Token ids of the rendered conversation."""
        return self.encode(self.apply_chat_template(messages, tools, add_generation_prompt, **kwargs))

    def __repr__(self) -> str:
        return f"FlintTokenizer(vocab_size={self._vocab_size}, eos_token_ids={self._eos_ids}, bos={self._bos_id})"


# ----- GGUF helpers -------------------------------------------------------------------------------------------


def _as_str(value: Any, key: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TokenizerError(f"GGUF key {key} is not valid UTF-8") from e
    if not isinstance(value, str):
        raise TokenizerError(f"GGUF key {key} should be a string, got {type(value).__name__}")
    return value


def _meta_str(meta: Mapping[str, Any], key: str, required: bool) -> str | None:
    value = meta.get(key)
    if value is None:
        if required:
            raise TokenizerError(f"GGUF metadata has no {key}")
        return None
    return _as_str(value, key)


def _meta_list(meta: Mapping[str, Any], key: str) -> list[Any]:
    value = meta.get(key)
    if value is None:
        raise TokenizerError(f"GGUF metadata has no {key}")
    if isinstance(value, (str, bytes, Mapping)):
        raise TokenizerError(f"GGUF key {key} should be an array, got {type(value).__name__}")
    try:
        return list(value)
    except TypeError as e:
        raise TokenizerError(f"GGUF key {key} should be an array, got {type(value).__name__}") from e


def _tokenizer_from_gguf_vocab(meta: Mapping[str, Any], pre: str | None) -> Tokenizer:
    """Rebuild a byte-level BPE tokenizer from tokens, merges and token types."""
    model = _meta_str(meta, K_MODEL, required=True)
    if model != "gpt2":
        raise TokenizerError(f"GGUF key {K_MODEL} = {model!r}: only byte-level BPE ('gpt2') tokenizers are supported")
    tokens = [_as_str(t, K_TOKENS) for t in _meta_list(meta, K_TOKENS)]
    types = _meta_list(meta, K_TOKEN_TYPE)
    if len(types) != len(tokens):
        raise TokenizerError(f"GGUF key {K_TOKEN_TYPE} has {len(types)} entries for {len(tokens)} tokens")
    merges: list[tuple[str, str]] = []
    for m in _meta_list(meta, K_MERGES):
        parts = _as_str(m, K_MERGES).split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"GGUF key {K_MERGES} has a malformed entry {m!r} (expected 'a b')")
        merges.append((parts[0], parts[1]))
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise TokenizerError(f"GGUF key {K_TOKENS} lists {t!r} twice (ids {vocab[t]} and {i})")
        vocab[t] = i
    try:
        bpe = models.BPE(vocab=vocab, merges=merges)
    except Exception as e:
        raise TokenizerError(f"GGUF keys {K_TOKENS}/{K_MERGES} do not form a BPE model: {e}") from e
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = make_pre_tokenizer(pre or "default")
    tok.decoder = decoders.ByteLevel()
    special: list[AddedToken] = []
    user_defined: list[AddedToken] = []
    for t, ty in zip(tokens, types):
        try:
            ty = int(ty)
        except (TypeError, ValueError) as e:
            raise TokenizerError(f"GGUF key {K_TOKEN_TYPE} has a non-integer entry {ty!r}") from e
        # Control and unused tokens are special; user-defined ones match as whole strings but stay visible text,
        # as llama.cpp treats them. Every one is already in the BPE vocab, so it keeps its id.
        if ty in (TOKEN_CONTROL, TOKEN_UNUSED):
            special.append(AddedToken(t, special=True, normalized=False))
        elif ty == TOKEN_USER_DEFINED:
            user_defined.append(AddedToken(t, special=False, normalized=False))
    if special:
        tok.add_special_tokens(special)
    if user_defined:
        tok.add_tokens(user_defined)
    return tok


# ----- built-in stand-in tokenizer ----------------------------------------------------------------------------

# Written for this module; small and varied so merges cover prose, code, numbers, JSON and the chat format.
_DEFAULT_CORPUS: tuple[str, ...] = (
    """The morning train to the coast was late again, so Mira opened her notebook and started sketching the harbour
from memory: the red crane, the fish market with its blue awnings, the narrow street that climbs toward the old
lighthouse. She had lived there for eleven years before moving inland, and she still remembered which bakery
sold the best bread on Saturdays. When the conductor finally announced the delay, nobody was surprised.""",
    """A good experiment starts with a question that can be answered. Write down what you expect to see before you
measure anything, and keep the raw numbers, not only the averages. If two runs disagree, do not pick the one you
like; run it a third time and find out why. Most surprises are bugs, but some of them are discoveries.""",
    """Mixture-of-experts models route every token to a few small feed-forward networks chosen by a router. The
router scores all experts, keeps the top six, and normalises their weights so they sum to one. Attention layers
alternate between a sliding window of recent keys and full attention over the whole context.""",
    """def moving_average(values: list[float], window: int = 3) -> list[float]:
    \"\"\"Return the simple moving average of `values`.\"\"\"
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
""",
    """function debounce(fn, delayMs) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), delayMs);
  };
}
const total = [3, 1, 4, 1, 5, 9, 2, 6].reduce((a, b) => a + b, 0);
console.log(`total = ${total}`);""",
    """#!/usr/bin/env bash
set -euo pipefail
for f in logs/*.txt; do
  grep -c "ERROR" "$f" || true
done
SELECT name, COUNT(*) AS n FROM orders WHERE created_at >= '2024-01-01' GROUP BY name ORDER BY n DESC;""",
    """{"id": "req-42", "model": "flint", "temperature": 1.0, "top_p": 0.95, "top_k": 20, "stream": true,
 "messages": [{"role": "user", "content": "What is 17 * 23?"}], "max_tokens": 256, "stop": null}
{"name": "get_weather", "description": "Get the current weather for a city", "parameters": {"type": "object",
 "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
 "required": ["city"]}}""",
    """Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 512 1024 2048 4096 65536 3.14159 2.71828 -0.5 1e-6 6.02e23
Dates and times: 2023-11-29, 14:05:33, 07/04/1999, Q3 2025, version 1.21.4, HTTP/1.1 200 OK, 192.168.0.1:8080
Prices: $12.99, EUR 7,50, 1,234,567 units, 99.9% uptime, 3/4 cup, 15 km/h.""",
    """# Release notes

- Faster start-up: the weights are memory-mapped instead of copied.
- **Fixed** a crash when a request was cancelled during prefill.
- New `--max-batch` flag (default: 64).

| metric | before | after |
|--------|--------|-------|
| TTFT   | 210 ms | 95 ms |""",
    """[gMASK]<sop><|system|>You are a helpful assistant.<|user|>How many legs does a spider have?<|assistant|><think>
Spiders are arachnids; arachnids have eight legs.</think>A spider has eight legs.<|user|>And an ant?<|assistant|>
</think>An ant has six legs.<|endoftext|>""",
    """<|user|>What's the weather in Lisbon?<|assistant|><think>I should call the weather tool.</think><tool_call>
get_weather<arg_key>city</arg_key><arg_value>Lisbon</arg_value><arg_key>days</arg_key><arg_value>2</arg_value>
</tool_call><|observation|><tool_response>{"temp_c": 21, "sky": "clear"}</tool_response><|assistant|><think>
</think>It is 21 °C and clear in Lisbon.""",
    """server:
  host: 0.0.0.0
  port: 8000
  max_num_seqs: 128
  log_level: info
replicas:
  min: 1
  max: 8
  target_ongoing_requests: 16""",
    """#include <stdio.h>

int main(int argc, char **argv) {
    for (int i = 0; i < argc; ++i) {
        printf("%d: %s\\n", i, argv[i]);
    }
    return 0;
}""",
    """"Can you check the logs?" she asked. "I already did," he said, "and there's nothing there. It isn't the
network, it's the disk: it filled up at 3 a.m. and the writer stopped without a word." They'd seen this before;
you'll see it again. Don't trust a quiet log.
Q: Why is the sky blue? A: Shorter wavelengths scatter more strongly off air molecules (Rayleigh scattering).
If x = 3 and y = x^2 + 2x - 1, then y = 14; the sum of the first n odd numbers is n^2.""",
    """Le café est très chaud ; fais attention. Über den Wolken muss die Freiheit wohl grenzenlos sein.
El niño comió una manzana. Привет, как дела? 你好，世界！今天天气很好。 東京は雨です。 안녕하세요.
Emoji: 🙂 🚀 ✅ 🎉 👍🏽 — naïve façade, coöperate, smörgåsbord, œuvre, ß, ø, ł, ğ.""",
)

_SPECIAL_SPLIT = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))


def _training_pieces(texts: Iterable[str]) -> Iterator[str]:
    """Corpus text with special-token strings cut out, so no merge ever spans or imitates one."""
    for text in texts:
        for piece in _SPECIAL_SPLIT.split(text):
            if piece:
                yield piece


def build_default_tokenizer(vocab_size: int, extra_corpus: Iterable[str] = ()) -> FlintTokenizer:
    """A deterministic byte-level BPE with Flint's special tokens and exactly `vocab_size` ids.

    Ids: the 256 byte tokens and learned merges first, then SPECIAL_TOKENS, then `<|reserved_N|>` special
    tokens up to `vocab_size` (a small corpus cannot fill a large vocabulary with merges).
    """
    n_fixed = 256 + len(SPECIAL_TOKENS)
    if vocab_size < n_fixed:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: it needs at least {n_fixed} "
            f"(256 byte tokens + {len(SPECIAL_TOKENS)} special tokens)"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = make_pre_tokenizer(DEFAULT_PRE)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(_training_pieces([*_DEFAULT_CORPUS, *extra_corpus])), trainer=trainer)
    n_model = tok.get_vocab_size(with_added_tokens=False)
    if n_model < 256:
        raise RuntimeError(f"BPE training produced {n_model} tokens, fewer than the 256 byte tokens")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    next_reserved = 0
    while (missing := vocab_size - tok.get_vocab_size(with_added_tokens=True)) > 0:
        reserved = [RESERVED_TOKEN.format(next_reserved + k) for k in range(missing)]
        next_reserved += missing
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"built {tok.get_vocab_size(with_added_tokens=True)} tokens instead of {vocab_size}")
    return FlintTokenizer(
        tok,
        chat_template=None,
        bos_token="[gMASK]",
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        pre=DEFAULT_PRE,
    )
