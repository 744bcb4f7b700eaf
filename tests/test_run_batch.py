"""`flint run-batch`: a batch file answered in-process as the HTTP API answers the same bodies; resuming a stopped
run; overload waited out, never recorded."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import httpx
import pytest
from api_fixtures import tiny_checkpoint, tiny_engine

from flint_engine.api.app import build_app
from flint_engine.api.backend import LocalBackend
from flint_engine.api.batch_lines import BatchLine
from flint_engine.api.batch_runner import run_batch
from flint_engine.api.server import start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.async_engine import AsyncEngine
from flint_engine.cli import main
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from demo_corpus import TOOL_WEATHER  # the tool the demo model was trained to call

ASK = [{"role": "user", "content": "What is 7 + 8?"}]
REQUESTS = {
    "chat": ("/v1/chat/completions", {"messages": ASK, "temperature": 0, "max_tokens": 64}),
    "text": ("/v1/completions", {"model": "flint", "prompt": "Hello", "temperature": 0, "max_tokens": 6}),
    "resp": ("/v1/responses", {"input": "What is 2 + 3?", "temperature": 0, "max_output_tokens": 64}),
    "tool": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
            "tools": [TOOL_WEATHER],
            "temperature": 0,
            "max_tokens": 96,
        },
    ),
    "empty": ("/v1/chat/completions", {"messages": [], "max_tokens": 5}),
    "long": ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}),
}


def write_batch(path: Path, names: list[str]) -> Path:
    with path.open("w") as f:
        for name in names:
            url, body = REQUESTS[name]
            f.write(json.dumps({"custom_id": name, "method": "POST", "url": url, "body": body}) + "\n")
    return path


def records(path: Path) -> dict[str, dict]:
    found = [json.loads(text) for text in path.read_text().splitlines()]
    by_id = {r["custom_id"]: r for r in found}
    assert len(by_id) == len(found), "a custom_id answered twice"
    return by_id


def answer(body: dict) -> object:
    """What a response says, without its ids and times."""
    if "choices" in body:
        said = []
        for c in body["choices"]:
            message = dict(c.get("message") or {"text": c.get("text")})
            calls = [call["function"] for call in message.pop("tool_calls", None) or []]
            said.append((message, calls, c["finish_reason"]))
        return said
    return [(item["type"], item.get("content")) for item in body["output"]]


@pytest.fixture(scope="module")
def demo_server():
    server = start_local_server(LLMEngine.from_checkpoint(EngineConfig(device="cpu"), progress=False), APISettings())
    yield server
    server.stop()


def test_a_batch_is_answered_as_the_http_api_answers(tmp_path: Path, demo_server, capsys) -> None:
    batch = write_batch(tmp_path / "in.jsonl", list(REQUESTS))
    out = tmp_path / "out.jsonl"
    level = logging.getLogger("flint_engine.api").level
    assert main(["run-batch", "-i", str(batch), "-o", str(out), "--device", "cpu", "--no-progress"]) == 0
    assert logging.getLogger("flint_engine.api").level == level  # quiet during the run only
    err = capsys.readouterr().err
    assert "6 requests: 4 succeeded, 2 failed" in err
    got = records(out)
    assert set(got) == set(REQUESTS)
    for name, (url, body) in REQUESTS.items():
        rec = got[name]
        assert rec["id"].startswith("batch_req_") and rec["error"] is None
        assert rec["response"]["request_id"].startswith("batch-")
        http = httpx.post(f"{demo_server.base_url}{url}", json=body, timeout=120)
        assert rec["response"]["status_code"] == http.status_code, name
        if http.status_code == 200:
            assert answer(rec["response"]["body"]) == answer(http.json()), name
        else:
            assert rec["response"]["body"] == http.json(), name
    assert "15" in got["chat"]["response"]["body"]["choices"][0]["message"]["content"]
    assert (
        got["tool"]["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    assert got["empty"]["response"]["body"]["error"]["param"] == "messages"


def test_resume_answers_only_what_the_output_lacks(tmp_path: Path, capsys) -> None:
    batch = write_batch(tmp_path / "in.jsonl", ["chat", "text", "resp"])
    out = tmp_path / "out.jsonl"
    args = ["run-batch", "-i", str(batch), "-o", str(out), "--device", "cpu", "--no-progress"]
    assert main(args) == 0
    first = records(out)
    # A stopped run: one whole record, then one cut short mid-line.
    lines = out.read_text().splitlines()
    out.write_text(lines[0] + "\n" + lines[1][:40])
    assert main(args) == 2
    assert "exists: --resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    assert "1 of 3 requests already answered" in capsys.readouterr().err
    again = records(out)
    assert set(again) == {"chat", "text", "resp"}
    kept = json.loads(lines[0])["custom_id"]
    assert again[kept] == first[kept]  # the earlier record stays as it was
    for name in again:
        assert answer(again[name]["response"]["body"]) == answer(first[name]["response"]["body"])
    assert main([*args, "--resume"]) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert set(records(out)) == {"chat", "text", "resp"}


def test_a_bad_file_is_refused_before_the_model_loads(tmp_path: Path, capsys) -> None:
    batch = tmp_path / "in.jsonl"
    batch.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}) + "\n{\n")
    out = tmp_path / "out.jsonl"
    # A model path that does not exist: the file's problems are reported first, so loading is never tried.
    args = ["run-batch", "-i", str(batch), "-o", str(out), "--model", str(tmp_path / "missing.gguf")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "line 1: url must be one of" in err and "line 2: not valid JSON" in err
    assert not out.exists()
    assert main(["run-batch", "-i", str(tmp_path / "none.jsonl"), "-o", str(out)]) == 2
    assert "none.jsonl" in capsys.readouterr().err
    write_batch(batch, ["text"])
    assert main([*args[:5], "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err


def test_overload_is_waited_out_not_recorded(tmp_path: Path) -> None:
    """An engine that queues one request at a time sheds most of eight concurrent submissions (503): each is retried
    until it runs, and every record is the answer."""
    engine = AsyncEngine(tiny_engine(tiny_checkpoint(tmp_path), max_num_seqs=1, max_waiting_requests=1))
    engine.start()
    try:
        app = build_app(LocalBackend(engine), APISettings())
        lines = [
            BatchLine(i + 1, f"r{i}", "/v1/completions", {"prompt": [1, 2, 3 + i], "max_tokens": 4, "temperature": 0})
            for i in range(8)
        ]
        written: list[dict] = []
        summary = asyncio.run(run_batch(app, lines, written.append, concurrency=8, progress=False))
    finally:
        engine.shutdown()
    assert summary.retries > 0 and summary.succeeded == 8 and summary.failed == 0
    assert sorted(r["custom_id"] for r in written) == sorted(x.custom_id for x in lines)
    assert all(r["response"]["status_code"] == 200 for r in written)
    assert summary.completion_tokens == 32 and summary.prompt_tokens == 24
