"""Anthropic's Message Batches API through Anthropic's own SDK: results as /v1/messages answers, refusals as errored
results, cancel, expiry, delete, each key's batches its own, and OpenAI's Batch API kept apart."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import anthropic
import openai
import pytest

from flint_engine.api.batch_jobs import BatchCreate, new_batch
from flint_engine.api.batch_store import ANTHROPIC, MESSAGE_BATCH_PURPOSE, BatchStore
from flint_engine.api.server import start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"


def start(batch_dir: Path, **settings):
    engine = LLMEngine.from_checkpoint(EngineConfig(device="cpu"), progress=False)
    return start_local_server(engine, APISettings(batch_dir=str(batch_dir), **settings))


def client(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0)


def ended(c: anthropic.Anthropic, batch_id: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = c.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} still {batch.processing_status} after {seconds} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    s = start(tmp_path_factory.mktemp("msgbatches"), api_keys=[KEY_A, KEY_B])
    yield s
    s.stop()


def request(i: int, **extra) -> dict:
    body = {"max_tokens": 64, "temperature": 0, "messages": [{"role": "user", "content": f"What is {i} + 2?"}]}
    return {**body, **extra}


def test_results_are_the_messages_api_answers(server) -> None:
    c = client(server, KEY_A)
    requests = [{"custom_id": f"q{i}", "params": request(i)} for i in range(3)]
    requests.append({"custom_id": "empty", "params": {"max_tokens": 5, "messages": []}})
    batch = c.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert batch.id.startswith("msgbatch_") and batch.processing_status == "in_progress"
    assert batch.results_url is None and batch.request_counts.processing == 4
    batch = ended(c, batch.id)
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 3, 1, 0, 0)
    assert batch.ended_at is not None and batch.results_url.endswith(f"/v1/messages/batches/{batch.id}/results")
    results = {r.custom_id: r.result for r in c.messages.batches.results(batch.id)}
    assert set(results) == {"q0", "q1", "q2", "empty"}
    for i in range(3):
        body = request(i)
        temperature = body.pop("temperature")  # SDK 2.17 has no temperature argument
        direct = c.messages.create(model="flint", **body, extra_body={"temperature": temperature})
        got = results[f"q{i}"]
        assert got.type == "succeeded"
        assert [b.model_dump() for b in got.message.content] == [b.model_dump() for b in direct.content]
        assert got.message.stop_reason == direct.stop_reason
    assert results["empty"].type == "errored"
    assert results["empty"].error.error.type == "invalid_request_error"
    assert batch.id in [b.id for b in c.messages.batches.list()]
    # OpenAI's Batch API keeps to its own batches, and its file lists leave out the batch's requests file.
    oai = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY_A, max_retries=0)
    assert batch.id not in [b.id for b in oai.batches.list()]
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve(batch.id)
    assert all(f.purpose != MESSAGE_BATCH_PURPOSE for f in oai.files.list())
    with pytest.raises(anthropic.BadRequestError, match="only a running batch"):
        c.messages.batches.cancel(batch.id)
    assert c.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        c.messages.batches.retrieve(batch.id)


def test_bad_batches_are_refused_in_anthropics_shape(server) -> None:
    c = client(server, KEY_A)
    twice = [{"custom_id": "a", "params": request(1)}, {"custom_id": "a", "params": request(2)}]
    cases = [
        ([], "requests"),
        (twice, "used twice"),
        ([{"custom_id": "a b", "params": request(1)}], "custom_id"),
        ([{"custom_id": "s", "params": request(1, stream=True)}], "not streamed"),
        ([{"custom_id": "m", "params": request(1, model="claude-x")}], "model"),
    ]
    for requests, words in cases:
        with pytest.raises(anthropic.BadRequestError, match=words):
            c.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        c.messages.batches.retrieve("msgbatch_nope")
    mine = c.messages.batches.create(requests=[{"custom_id": "x", "params": request(1)}])  # type: ignore[list-item]
    with pytest.raises(anthropic.NotFoundError):
        client(server, KEY_B).messages.batches.retrieve(mine.id)
    with pytest.raises(anthropic.AuthenticationError):
        client(server, "wrong").messages.batches.list()
    assert ended(c, mine.id).request_counts.succeeded == 1


def test_cancel_and_expiry(tmp_path: Path) -> None:
    server = start(tmp_path / "store", batch_concurrency=1)
    try:
        c = client(server)
        batch = c.messages.batches.create(
            requests=[{"custom_id": f"q{i}", "params": request(i % 10)} for i in range(30)]  # type: ignore[misc]
        )
        while c.messages.batches.retrieve(batch.id).request_counts.succeeded < 1:
            time.sleep(0.05)
        assert c.messages.batches.cancel(batch.id).processing_status == "canceling"
        done = ended(c, batch.id)
        assert done.cancel_initiated_at is not None and 1 <= done.request_counts.succeeded < 30
        assert done.request_counts.succeeded + done.request_counts.canceled == 30
        kinds = [r.result.type for r in c.messages.batches.results(done.id)]
        assert len(kinds) == 30 and kinds.count("canceled") == done.request_counts.canceled
    finally:
        server.stop()
    # A batch left in progress past its window, taken up by the next server: its requests expire.
    store = BatchStore(tmp_path / "store", 2**20, 2**30)
    text = "".join(
        json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/messages", "body": request(i)}) + "\n"
        for i in range(2)
    ).encode()
    source = store.save_file(io.BytesIO(text), "r.jsonl", MESSAGE_BATCH_PURPOSE, "")
    spec = BatchCreate.model_construct(input_file_id=source["id"], endpoint="/v1/messages", completion_window="24h")
    record = new_batch(spec, "", int(time.time()) - 90_000, ANTHROPIC)
    store.save_batch(record)
    server = start(tmp_path / "store")
    try:
        c = client(server)
        done = ended(c, record["id"])
        assert (done.request_counts.expired, done.request_counts.succeeded) == (2, 0)
        assert [r.result.type for r in c.messages.batches.results(done.id)] == ["expired", "expired"]
        listed = next(b for b in c.messages.batches.list() if b.id == done.id)
        assert listed.request_counts == done.request_counts  # lists show what retrieve shows
    finally:
        server.stop()


def test_a_batch_body_is_capped_as_an_upload(tmp_path: Path) -> None:
    """A message batch carries a whole batch: its body may pass max_request_bytes (up to max_file_bytes), which a
    single message's may not; each of its requests is still the message it would be over HTTP, refused alike."""
    server = start(tmp_path / "store", max_request_bytes=1024, max_file_bytes=4096)
    try:
        c = client(server)
        long = request(1) | {"system": "x" * 1500}
        with pytest.raises(anthropic.APIStatusError) as err:
            c.messages.create(model="flint", **{k: v for k, v in long.items() if k != "temperature"})
        assert err.value.status_code == 413
        small = request(2)
        batch = c.messages.batches.create(
            requests=[{"custom_id": "a", "params": long}, {"custom_id": "b", "params": small}]  # type: ignore[list-item]
        )
        counts = ended(c, batch.id).request_counts
        assert (counts.succeeded, counts.errored) == (1, 1)
        results = {r.custom_id: r.result for r in c.messages.batches.results(batch.id)}
        assert results["b"].type == "succeeded" and results["a"].type == "errored"
        assert results["a"].error.error.type == "request_too_large"
        with pytest.raises(anthropic.APIStatusError) as err:
            c.messages.batches.create(requests=[{"custom_id": "b", "params": request(1) | {"system": "y" * 70_000}}])
        assert err.value.status_code == 413
    finally:
        server.stop()
