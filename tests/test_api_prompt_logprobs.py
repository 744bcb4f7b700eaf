"""Log-probabilities of the prompt's own tokens (`SamplingParams.prompt_logprobs`; OpenAI's `echo` with `logprobs`
on /v1/completions, which lm-evaluation-harness's `local-completions` reads to score answers, and vLLM's
`prompt_logprobs`): equal to one whole forward's FP32 log-softmax, whether the prompt is prefilled in one step or in
chunks, after a prefix-cache hit would have skipped it, and beside requests that ask for nothing; through the API.
The GPU's fused path against the reference: tests/test_prompt_logprobs_gpu.py."""

from __future__ import annotations

import httpx
import pytest
import torch
from api_fixtures import module_server, tiny_checkpoint, tiny_engine, tiny_server

from flint_engine import prompt_logprobs
from flint_engine.sampling_params import SamplingParams

PROMPT = [(7 * i + 3) % 384 for i in range(45)]


def expected(engine, prompt: list[int], top_k: int) -> list[tuple[int, float, list[tuple[int, float]]] | None]:
    [logits] = engine.model.forward_sequences([prompt])
    logp = torch.log_softmax(logits.float(), dim=-1)
    out: list = [None]
    for pos in range(1, len(prompt)):
        vals, ids = torch.topk(logp[pos - 1], top_k)
        out.append((prompt[pos], logp[pos - 1, prompt[pos]].item(), list(zip(ids.tolist(), vals.tolist()))))
    return out


def assert_close(got: list, want: list) -> None:
    assert len(got) == len(want) and got[0] is None
    for g, w in zip(got[1:], want[1:]):
        assert g[0] == w[0] and g[1] == pytest.approx(w[1], abs=1e-4)
        assert [t for t, _ in g[2]] == [t for t, _ in w[2]]
        assert [v for _, v in g[2]] == pytest.approx([v for _, v in w[2]], abs=1e-4)


@pytest.mark.parametrize(("chunk", "rows_a_pass"), [(2048, 256), (2048, 8), (16, 5), (7, 256)])
def test_prompt_logprobs_equal_a_whole_forward(tmp_path, monkeypatch, chunk: int, rows_a_pass: int) -> None:
    """In one step or in chunks, the lm_head rows in one pass or several (a pass boundary inside a chunk)."""
    monkeypatch.setattr(prompt_logprobs, "ROWS_A_PASS", rows_a_pass)
    engine = tiny_engine(tiny_checkpoint(tmp_path), max_num_batched_tokens=chunk)
    want = expected(engine, PROMPT, 3)
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)
    first, plain = engine.generate([PROMPT, PROMPT[:20]], [params, SamplingParams(max_tokens=2)])
    assert_close(first.prompt_logprobs, want)
    assert plain.prompt_logprobs is None
    # The same prompt again: a plain request takes its prefix from the cache, one asking for logprobs computes it.
    hit, again = engine.generate([PROMPT, PROMPT], [SamplingParams(max_tokens=2, temperature=0), params])
    assert hit.cached_prompt_tokens > 0 and again.cached_prompt_tokens == 0
    assert_close(again.prompt_logprobs, want)
    assert first.output_token_ids == again.output_token_ids == hit.output_token_ids


def test_the_first_output_carries_them(tmp_path) -> None:
    engine = tiny_engine(tiny_checkpoint(tmp_path))
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=0))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert [o.prompt_logprobs is not None for o in outputs] == [True, False, False]
    assert all(entry[2] == [] for entry in outputs[0].prompt_logprobs[1:])  # 0: the prompt tokens' own only


server = module_server("prompt-lp")


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(server) -> None:
    """lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens 1, temperature 0; it
    sums token_logprobs[ctxlen:-1] and checks each against max(top_logprobs) for greediness."""
    body = {"model": "flint", "prompt": PROMPT, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(PROMPT) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    want = expected(server.engine.engine, PROMPT, 1)
    assert lp["token_logprobs"][1:-1] == pytest.approx([w[1] for w in want[1:]], abs=1e-4)
    greedy = [w[2][0][0] == w[0] for w in want[1:]]
    assert [tok == max(top.values()) for tok, top in zip(lp["token_logprobs"][1:-1], lp["top_logprobs"][1:-1])] == [
        g or abs(w[1] - w[2][0][1]) < 1e-6 for g, w in zip(greedy, want[1:])
    ]
    assert lp["text_offset"][0] == 0 and "".join(lp["tokens"]) == r.json()["choices"][0]["text"]
    # Streamed: the first chunk carries the prompt's entries with the echoed text.
    body["stream"] = True
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as s:
        import json

        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    streamed = [x for c in chunks for ch in c["choices"] if ch["logprobs"] for x in ch["logprobs"]["token_logprobs"]]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-6)


def test_tokenizer_info_for_remote_tokenizers(server) -> None:
    """lm-evaluation-harness's remote tokenizer: GET /tokenizer_info (a dict with eos_token), then /tokenize and
    /detokenize round-trip its prompts."""
    info = httpx.get(f"{server.base_url}/tokenizer_info", timeout=10).json()
    tok = server.engine.engine.tokenizer
    assert info["eos_token"] == tok.eos_token and info["eos_token_id"] == tok.eos_token_id
    assert info["chat_template"] == tok.chat_template and info["vocab_size"] == tok.vocab_size
    ids = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "2 + 2 = 4", "add_special_tokens": False}).json()
    text = httpx.post(f"{server.base_url}/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
    assert text == "2 + 2 = 4"


def test_vllm_prompt_logprobs_on_completions_and_chat(server) -> None:
    """vLLM's `prompt_logprobs: k`: per prompt position (None first) the prompt token and the top k by token id,
    each with logprob, rank and text; on each completions choice, and on the chat response (the templated prompt)."""
    body = {"model": "flint", "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    [choice] = r.json()["choices"]
    got = choice["prompt_logprobs"]
    want = expected(server.engine.engine, PROMPT, 2)
    assert len(got) == len(PROMPT) and got[0] is None and choice["logprobs"] is None
    tok = server.engine.engine.tokenizer
    for pos in range(1, len(PROMPT)):
        row, (token, lp, top) = got[pos], want[pos]
        assert row[str(token)]["logprob"] == pytest.approx(lp, abs=1e-4)
        assert row[str(token)]["decoded_token"] == tok.token_bytes(token).decode("utf-8", errors="replace")
        ranks = {t: row[str(t)]["rank"] for t, _ in top}
        assert ranks[top[0][0]] == 1 and set(ranks.values()) <= {1, 2}
        above = sum(v > lp + 1e-6 for _, v in top)  # the prompt token's rank counts the tokens above it
        assert row[str(token)]["rank"] == above + 1 or (row[str(token)]["rank"] > 2 and above == 2)
    chat = {"model": "flint", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "prompt_logprobs": 0}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={**chat, "n": 2}, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text  # the first choice computes them
    ids = httpx.post(f"{server.base_url}/tokenize", json={"messages": chat["messages"]}).json()["tokens"]
    scored = r.json()["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    assert all(list(row) == [str(t)] for row, t in zip(scored[1:], ids[1:]))  # k = 0: the prompt token alone
    for bad, says in (({"stream": True}, "stream"), ({"prompt_logprobs": 21}, "prompt_logprobs")):
        r = httpx.post(f"{server.base_url}/v1/completions", json={**body, **bad}, timeout=60)
        assert r.status_code == 400 and says in r.text
    forced = {
        **chat,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "required",
    }
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=forced, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_prompt_logprobs_have_a_prompt_length_cap(tmp_path) -> None:
    """Each prompt token's entry stays on the host until the answer: `api.max_prompt_logprobs_tokens` bounds it."""
    from flint_engine.api.settings import APISettings

    srv = tiny_server(tmp_path, APISettings(max_prompt_logprobs_tokens=20))
    try:
        url = f"{srv.base_url}/v1/completions"
        body = {"model": "flint", "prompt": PROMPT, "max_tokens": 1}
        for extra, param in (({"echo": True, "logprobs": 1}, "echo"), ({"prompt_logprobs": 0}, "prompt_logprobs")):
            r = httpx.post(url, json={**body, **extra}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == param and "up to 20" in r.text
        ok = httpx.post(url, json={**body, "prompt": PROMPT[:20], "echo": True, "logprobs": 1}, timeout=60)
        assert ok.status_code == 200 and len(ok.json()["choices"][0]["logprobs"]["tokens"]) == 21
        chat = {"model": "flint", "messages": [{"role": "user", "content": "x " * 30}], "prompt_logprobs": 0}
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", json=chat, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
        plain = httpx.post(url, json={**body, "echo": True}, timeout=60)  # echo alone keeps no entries
        assert plain.status_code == 200
    finally:
        srv.stop()
