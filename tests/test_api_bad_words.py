"""vLLM's `bad_words` through the `openai` client, on the demo model (whose greedy answers are words): a banned word
is not in the answer, which runs as before up to where the word was."""

from __future__ import annotations

import random

import httpx
import openai
import pytest

from flint_engine.api.server import start_local_server
from flint_engine.bad_words import bad_word_sequences, banned_by_bad_words, bans_before_reading
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.tokenizer import build_default_tokenizer

MSG = [{"role": "user", "content": "What is 7 + 8?"}]


@pytest.fixture(scope="module")
def server():
    s = start_local_server(LLMEngine.from_checkpoint(EngineConfig(device="cpu"), progress=False))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def raw_post(server, path: str, body: object) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60)


def test_bad_words(server, client) -> None:
    """vLLM's bad_words: a word the greedy answer holds (in its thinking or its content) is not in the answer when
    banned, and the answer runs as before up to where the word was; on both endpoints."""
    ask = {"model": "flint", "max_tokens": 48, "temperature": 0}

    def said(message) -> str:
        return f"{message.reasoning_content or ''} {message.content or ''}"

    plain = said(client.chat.completions.create(messages=MSG, **ask).choices[0].message)
    words = list(dict.fromkeys(w.strip(".") for w in plain.split() if w.strip(".").isalnum()))
    assert len(words) >= 3, plain
    for word in words[1:4]:
        banned = said(
            client.chat.completions.create(messages=MSG, extra_body={"bad_words": [word]}, **ask).choices[0].message
        )
        assert word not in [w.strip(".") for w in banned.split()], (word, banned)
        assert banned.startswith(plain[: plain.index(word)].rstrip()), (word, banned)
    prompt = raw_post(server, "/tokenize", {"model": "flint", "messages": MSG}).json()["tokens"]
    text = client.completions.create(prompt=prompt, **ask).choices[0].text
    word = next(w for w in text.split() if w.isalpha() and len(w) > 2)
    again = client.completions.create(prompt=prompt, extra_body={"bad_words": [word]}, **ask).choices[0].text
    assert word not in again.split() and again != text


def test_the_banned_token_completes_a_word() -> None:
    """A word's last token is banned only where the output ends with the rest of it; a one-token word always. Its
    spelling with a leading space counts too, where that is more than a space token before the same tokens."""
    tok = build_default_tokenizer(4096)
    [plain, spaced] = bad_word_sequences(tok, ["answers"])
    assert plain == tuple(tok.encode("answers")) and spaced == tuple(tok.encode(" answers")) and plain != spaced
    assert len(plain) >= 2  # (a word of several tokens)
    head, last = list(plain[:-1]), plain[-1]
    assert last in banned_by_bad_words([plain], [7, *head])
    assert last not in banned_by_bad_words([plain], [7, *head[:-1]])
    assert banned_by_bad_words([(5,)], []) == {5}
    assert banned_by_bad_words([(5, 6)], [1, 2]) == set() and banned_by_bad_words([(5, 6)], [1, 5]) == {6}


def test_bans_before_the_latest_token_is_read_equal_the_bans_after() -> None:
    """For a step launched before its latest token is read: the bans that hold whatever that token is, plus those
    it sets off, are exactly the bans once it is known, for every token it may be (random words and outputs)."""
    rng = random.Random(4)
    for _ in range(200):
        words = [tuple(rng.randrange(6) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 5))]
        output = [rng.randrange(6) for _ in range(rng.randint(0, 6))]
        always, pairs = bans_before_reading(words, output)
        for x in range(6):
            assert always | {ban for after, ban in pairs if after == x} == banned_by_bad_words(words, [*output, x])
