"""Stored responses of the Responses API through the `openai` client: `previous_response_id` continues a conversation
as sending it whole does, `GET` / `DELETE /v1/responses/{id}` and `input_items`, each key seeing only its own, expiry
and the byte cap; and without `api.store_responses`, the refusals that say so."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import openai
import pytest
from stored_responses_fixtures import ASK, KEY_A, KEY_B, client, keyed_server, settled, start

from flint_engine.api.response_store import ResponseStore
from flint_engine.api.server import start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig

server = keyed_server("responses")


def test_a_conversation_continues_from_a_stored_response(server) -> None:
    a, b = client(server, KEY_A), client(server, KEY_B)
    first = a.responses.create(input="What is 7 + 8?", **ASK)
    assert first.store and first.previous_response_id is None
    assert a.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = a.responses.create(previous_response_id=first.id, input="And 2 + 2?", **ASK)
    assert second.previous_response_id == first.id
    # The same turn with the conversation sent whole (the first turn's output items sent back as input).
    sent_back = [item.model_dump(exclude_none=True) for item in first.output]
    whole = [
        {"role": "user", "content": "What is 7 + 8?"},
        *sent_back,
        {"role": "user", "content": "And 2 + 2?"},
    ]
    again = a.responses.create(input=whole, store=False, **ASK)
    assert second.output_text == again.output_text and "4" in second.output_text
    assert second.usage.input_tokens == again.usage.input_tokens > first.usage.input_tokens
    items = a.responses.input_items.list(second.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "And 2 + 2?")]
    assert items.data[0].id.startswith("msg_")
    assert not again.store
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(again.id)
    # Another key sees none of it.
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:  # OpenAI's status and code for it
        b.responses.create(previous_response_id=first.id, input="Hi", **ASK)
    assert err.value.body["code"] == "previous_response_not_found"
    # Deleted: gone, and so is every conversation continuing from it.
    a.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):
        a.responses.create(previous_response_id=second.id, input="And 3 + 3?", **ASK)


def test_a_streamed_response_is_stored_as_it_completed(server) -> None:
    a = client(server, KEY_A)
    with a.responses.stream(input="What is 3 + 4?", **ASK) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.store
    assert a.responses.retrieve(final.id).output_text == final.output_text
    nxt = a.responses.create(previous_response_id=final.id, input="And 1 + 1?", **ASK)
    assert nxt.status == "completed" and nxt.previous_response_id == final.id


def test_without_the_setting_nothing_is_stored(tmp_path: Path) -> None:
    server = start()
    try:
        c = client(server, "unused")
        r = c.responses.create(input="What is 7 + 8?", **ASK)
        assert r.store is False
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
        with pytest.raises(openai.BadRequestError) as err:
            c.responses.create(previous_response_id=r.id, input="And 2 + 2?", **ASK)
        assert "api.store_responses" in err.value.body["message"]
    finally:
        server.stop()


def test_stored_responses_expire_and_the_oldest_go_past_the_byte_cap(tmp_path: Path) -> None:
    now = [time.time()]
    store = ResponseStore(tmp_path, ttl_s=3600, max_bytes=10**9, clock=lambda: now[0], sweep_every_s=float("inf"))
    for i in range(3):
        store.save(
            {"id": f"resp_{i}", "status": "completed", "output": []},
            [{"id": f"msg_{i}", "role": "user", "content": "x" * 400}],
            None,
            "",
        )
    assert store.response("resp_0", "")["id"] == "resp_0"
    store.max_bytes = 2 * (tmp_path / "resp_2.json").stat().st_size  # room for two: the oldest goes
    assert store.sweep() == 1
    with pytest.raises(Exception, match="not found"):
        store.response("resp_0", "")
    assert store.input_items("resp_2", "")[0]["id"] == "msg_2"
    now[0] += 3601
    with pytest.raises(Exception, match="not found"):
        store.response("resp_2", "")  # expired: not found at once
    assert store.sweep() == 2 and not list(tmp_path.glob("*.json"))


def test_a_background_response_is_polled_to_the_same_answer(server) -> None:
    a = client(server, KEY_A)
    queued = a.responses.create(input="What is 6 + 7?", background=True, **ASK)
    assert queued.status == "queued" and queued.background and queued.output == []
    done = settled(a, queued.id)
    plain = a.responses.create(input="What is 6 + 7?", store=False, **ASK)
    assert done.status == "completed" and done.output_text == plain.output_text and "13" in done.output_text
    assert done.usage.output_tokens == plain.usage.output_tokens
    nxt = a.responses.create(previous_response_id=done.id, input="And 1 + 1?", **ASK)  # continues as any stored one
    assert nxt.status == "completed"
    with pytest.raises(openai.BadRequestError) as err:
        a.responses.cancel(nxt.id)  # only background responses can be
    assert err.value.body["param"] == "response_id"
    assert a.responses.cancel(done.id).status == "completed"  # a finished one stays as it was


def test_a_background_response_is_cancelled_here_or_by_another_router(server) -> None:
    a = client(server, KEY_A)
    long = {**ASK, "max_output_tokens": 4000, "extra_body": {"ignore_eos": True}}
    engine = server.engine.engine
    for how in ("call", "marker"):
        r = a.responses.create(input="Count to a thousand.", background=True, **long)
        deadline = time.monotonic() + 30
        while not engine.scheduler.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.scheduler.running  # generating
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        assert "flint:background_responses_running 1.0" in metrics
        if how == "call":
            assert a.responses.cancel(r.id).status == "cancelled"
        else:  # another router's cancel: the marker file its runner polls
            server.server.config.app.state.background.store.cancel_marker(r.id).touch()
        done = settled(a, r.id)
        assert done.status == "cancelled"
        deadline = time.monotonic() + 10
        while engine.scheduler.has_work() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine.scheduler.has_work()  # its generation was aborted, not left running


def test_background_needs_the_store(tmp_path: Path) -> None:
    server = start()
    try:
        with pytest.raises(openai.BadRequestError) as err:
            client(server, "unused").responses.create(input="Hi", background=True, **ASK)
        assert err.value.body["param"] == "background" and "api.store_responses" in err.value.body["message"]
    finally:
        server.stop()


def test_a_background_response_whose_runner_stopped_reads_as_failed(tmp_path: Path) -> None:
    now = [time.time()]
    store = ResponseStore(tmp_path, ttl_s=3600, max_bytes=10**9, clock=lambda: now[0], sweep_every_s=float("inf"))
    store.save({"id": "resp_1", "status": "in_progress", "output": [], "error": None, "background": True}, [], None, "")
    assert store.response("resp_1", "")["status"] == "in_progress"
    now[0] += 31  # no heartbeat since
    gone = store.response("resp_1", "")
    assert gone["status"] == "failed" and "stopped" in gone["error"]["message"]


def test_a_background_response_waits_out_the_engines_overload_queued(tmp_path: Path) -> None:
    """One seat, one waiting place, both taken: the background response stays queued (the engine sheds it, it
    retries) until they free, then completes."""
    engine = LLMEngine.from_checkpoint(
        EngineConfig(device="cpu", max_num_seqs=1, max_waiting_requests=1), progress=False
    )
    server = start_local_server(engine, APISettings(store_responses=True, responses_dir=str(tmp_path)))
    try:
        c = client(server, "unused")
        long = {**ASK, "max_output_tokens": 300, "extra_body": {"ignore_eos": True}}
        busy = [c.responses.create(input=f"Count to {n}.", background=True, **long) for n in (100, 200)]
        deadline = time.monotonic() + 30
        while len(engine.scheduler.running) + len(engine.scheduler.waiting) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        later = c.responses.create(input="What is 6 + 7?", background=True, **ASK)
        time.sleep(0.5)
        assert c.responses.retrieve(later.id).status == "queued"  # shed by the engine, waiting to be taken
        assert all(settled(c, r.id).status == "incomplete" for r in busy)  # cut at max_output_tokens
        done = settled(c, later.id)
        assert done.status == "completed" and "13" in done.output_text
    finally:
        server.stop()


def test_saving_sweeps_on_a_thread(tmp_path: Path) -> None:
    """A save past the sweep period starts the sweep on a thread (the event loop does not list the store)."""
    import os

    store = ResponseStore(tmp_path, ttl_s=60, max_bytes=10**9, sweep_every_s=0)
    stale = tmp_path / "resp_old.json"
    stale.write_text("{}")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    store.save({"id": "resp_new", "status": "completed", "output": []}, [], None, "")
    deadline = time.monotonic() + 10
    while stale.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not stale.exists() and (tmp_path / "resp_new.json").exists()


def _events(stream) -> list[dict]:
    return [event.model_dump() for event in stream]


def test_a_streamed_background_response_is_read_again_from_any_event(server) -> None:
    """`background` with `stream`: the create call streams it (queued first), a client that left reads it again from
    any sequence number, and leaving never stops the generation."""
    a, b = client(server, KEY_A), client(server, KEY_B)
    events = _events(a.responses.create(input="What is 6 + 7?", background=True, stream=True, **ASK))
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert events[0]["response"]["status"] == "queued" and events[0]["response"]["background"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    rid = events[0]["response"]["id"]
    final = a.responses.retrieve(rid)
    plain = a.responses.create(input="What is 6 + 7?", store=False, **ASK)
    assert final.status == "completed" and final.output_text == plain.output_text and "13" in final.output_text
    assert events[-1]["response"]["output"] == final.model_dump()["output"]
    # Read again: all of it, then from an event on.
    assert _events(a.responses.retrieve(rid, stream=True)) == events
    assert _events(a.responses.retrieve(rid, stream=True, starting_after=5)) == events[6:]
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(rid, stream=True)  # another key's
    # A client that leaves after a few events: the response still completes, and its stream reads whole later.
    long = {**ASK, "max_output_tokens": 40, "extra_body": {"ignore_eos": True}}
    with a.responses.create(input="Count to fifty.", background=True, stream=True, **long) as stream:
        first = [next(iter(stream)).model_dump() for _ in range(4)]
    rid = first[0]["response"]["id"]
    assert settled(a, rid).status == "incomplete"
    again = _events(a.responses.retrieve(rid, stream=True))
    assert again[:4] == first and again[-1]["type"] == "response.incomplete"
    assert again[-1]["response"]["usage"]["output_tokens"] == 40


def test_only_a_streamed_background_response_streams_again(server) -> None:
    a = client(server, KEY_A)
    polled = a.responses.create(input="What is 6 + 7?", background=True, **ASK)
    settled(a, polled.id)
    plain = a.responses.create(input="What is 6 + 7?", **ASK)
    for rid in (polled.id, plain.id):
        with pytest.raises(openai.BadRequestError) as err:
            a.responses.retrieve(rid, stream=True)
        assert err.value.body["param"] == "stream" and "stream: true" in err.value.body["message"]


def test_a_cancelled_streamed_background_response_ends_its_streams(server) -> None:
    a = client(server, KEY_A)
    long = {**ASK, "max_output_tokens": 4000, "extra_body": {"ignore_eos": True}}
    with a.responses.create(input="Count to a thousand.", background=True, stream=True, **long) as stream:
        seen = []
        for event in stream:
            seen.append(event.model_dump())
            if event.type == "response.output_text.delta" or len(seen) == 8:
                assert a.responses.cancel(seen[0]["response"]["id"]).status == "cancelled"
                break
        rest = [event.type for event in stream]  # the stream ends (no last event for a cancel)
    assert "response.completed" not in rest and "response.incomplete" not in rest
    assert a.responses.retrieve(seen[0]["response"]["id"]).status == "cancelled"


def test_a_stream_follows_a_background_response_run_by_another_process(tmp_path: Path) -> None:
    """The stream of a response whose runner is elsewhere polls the shared log: it reads the events as they come, and
    ends at the last one, or when the response ended without one (cancelled; its runner gone: failed)."""
    import asyncio

    from flint_engine.api.background_responses import BackgroundResponses

    store = ResponseStore(tmp_path, ttl_s=3600, max_bytes=10**9, sweep_every_s=float("inf"))
    follower = BackgroundResponses(handler=None, store=store, most=4, per_key=None)  # type: ignore[arg-type]

    def running(rid: str, status: str = "in_progress") -> dict:
        response = {"id": rid, "status": status, "output": [], "error": None, "background": True}
        store.save(response, [], None, "")
        return response

    def event(n: int, kind: str = "response.output_text.delta", **fields) -> dict:
        return {"type": kind, "sequence_number": n, **fields}

    async def scenario() -> None:
        running("resp_a")
        store.append_events("resp_a", [event(0, "response.created"), event(1)])
        got: list[str] = []

        async def read(rid: str, after: int = -1) -> None:
            async for line in follower.follow(rid, "", after):
                got.append(line)

        reader = asyncio.create_task(read("resp_a"))
        await asyncio.sleep(0.2)
        assert len(got) == 2
        store.append_events("resp_a", [event(2), event(3, "response.completed", response={"id": "resp_a"})])
        await asyncio.wait_for(reader, 5)
        assert [line.split("\n")[0] for line in got][-2:] == [
            "event: response.output_text.delta",
            "event: response.completed",
        ]
        # Cancelled with no last event: the stream ends when it reads the record.
        got.clear()
        response = running("resp_b")
        store.append_events("resp_b", [event(0, "response.created"), event(1)])
        reader = asyncio.create_task(read("resp_b", after=0))
        await asyncio.sleep(0.2)
        store.save({**response, "status": "cancelled"}, [], None, "")
        await asyncio.wait_for(reader, 5)
        assert len(got) == 1 and got[0].startswith("event: response.output_text.delta")

    asyncio.run(scenario())
    # A runner gone (no heartbeat for STALE_S): its stream ends with a response.failed numbered after the log's last.
    now = [time.time()]
    store.clock = lambda: now[0]
    running("resp_c")
    store.append_events("resp_c", [event(0, "response.created")])
    now[0] += 31

    async def stale() -> list[str]:
        return [line async for line in follower.follow("resp_c", "", 0)]

    [line] = asyncio.run(stale())
    assert line.startswith("event: response.failed") and '"sequence_number": 1' in line


def _aged(store_dir: Path, response_id: str, seconds: float = 60.0) -> None:
    """The record as its runner left it `seconds` ago (no heartbeat since)."""
    path = store_dir / f"{response_id}.json"
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_background_response_is_run_again_by_the_next_router(tmp_path: Path) -> None:
    """A router stops while a background response runs: the record is left as it was, and the next router on the
    same store, finding it stale in a poll, runs it again from its start to the same answer (sampled: with the seed
    chosen for it when it was created, kept with its request)."""
    long = {**ASK, "temperature": 1.0, "max_output_tokens": 400, "extra_body": {"ignore_eos": True}}
    first = start(store_responses=True, responses_dir=str(tmp_path))
    try:
        c = client(first, "unused")
        job = c.responses.create(input="Count to fifty.", background=True, **long)
        deadline = time.monotonic() + 30
        while c.responses.retrieve(job.id).status != "in_progress" and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        first.stop()  # in the middle of the background response
    left = json.loads((tmp_path / f"{job.id}.json").read_text())
    assert left["response"]["status"] == "in_progress" and (tmp_path / f"{job.id}.running").exists()
    seed = left["request"]["seed"]
    second = start(store_responses=True, responses_dir=str(tmp_path))
    try:
        c = client(second, "unused")
        _aged(tmp_path, job.id)
        again = c.responses.retrieve(job.id)  # stale: this router runs it again
        assert again.status in ("queued", "in_progress") and again.created_at == job.created_at
        done = settled(c, job.id)
        seeded = {**long, "extra_body": {**long["extra_body"], "seed": seed}}
        plain = c.responses.create(input="Count to fifty.", store=False, **seeded)
        other = c.responses.create(input="Count to fifty.", store=False, **long)  # (another seed: another sample)
        assert other.output_text != plain.output_text
        assert done.status == "incomplete" and done.output_text == plain.output_text
        assert done.usage.output_tokens == 400 and done.id == job.id
        assert json.loads((tmp_path / f"{job.id}.json").read_text())["attempt"] == 1
        assert not (tmp_path / f"{job.id}.running").exists()
    finally:
        second.stop()


def test_a_stale_response_fails_where_it_cannot_run_again(tmp_path: Path) -> None:
    """A stream that sent some of its output, or a response past its attempts, reads as failed when stale; one
    whose attempt another router claimed reads as it was (that router runs it)."""
    import asyncio

    from flint_engine.api.background_responses import BackgroundResponses
    from flint_engine.api.response_store import MAX_ATTEMPTS

    store = ResponseStore(tmp_path, ttl_s=3600, max_bytes=10**9, sweep_every_s=float("inf"))
    BackgroundResponses(handler=None, store=store, most=4, per_key=None)  # type: ignore[arg-type]  (sets on_stale)

    def left(rid: str, status: str, attempt: int = 0) -> None:
        response = {"id": rid, "status": status, "output": [], "error": None, "background": True, "created_at": 1}
        store.save(response, [], None, "", request={"input": "hi", "background": True}, attempt=attempt)
        store.running_marker(rid).touch()
        _aged(tmp_path, rid)

    async def read(rid: str) -> str:
        return store.response(rid, "")["status"]

    left("resp_streamed", "in_progress")
    store.append_events("resp_streamed", [{"type": "response.created", "sequence_number": 0}])
    left("resp_tried", "queued", attempt=MAX_ATTEMPTS)
    left("resp_claimed", "queued")
    assert store.claim("resp_claimed", 1)  # another router's
    assert asyncio.run(read("resp_streamed")) == "failed"
    assert asyncio.run(read("resp_tried")) == "failed"
    assert asyncio.run(read("resp_claimed")) == "queued"
    assert not store.running_marker("resp_streamed").exists() and store.running_marker("resp_claimed").exists()
    assert store.stale_running() == ["resp_claimed"]


def test_an_attempt_whose_router_stopped_after_claiming_it_passes_to_the_next(tmp_path: Path) -> None:
    """A router that claimed an attempt and stopped before saving the response as its own leaves a claim older than
    STALE_S: the next router takes the attempt after it, or fails the response past its attempts."""
    import asyncio

    from flint_engine.api.background_responses import BackgroundResponses
    from flint_engine.api.errors import APIError
    from flint_engine.api.response_store import MAX_ATTEMPTS

    class Refusing:
        def prepare(self, req: object, owner: str) -> None:
            raise APIError(400, "prepared again here", "input")

    store = ResponseStore(tmp_path, ttl_s=3600, max_bytes=10**9, sweep_every_s=float("inf"))
    BackgroundResponses(handler=Refusing(), store=store, most=4, per_key=None)  # type: ignore[arg-type]

    def abandoned(rid: str, attempt: int) -> None:
        response = {"id": rid, "status": "queued", "output": [], "error": None, "background": True, "created_at": 1}
        store.save(response, [], None, "", request={"input": "hi", "background": True}, attempt=attempt)
        store.running_marker(rid).touch()
        assert store.claim(rid, attempt + 1)
        _aged(tmp_path, rid)
        claim = tmp_path / f"{rid}.claim-{attempt + 1}"
        os.utime(claim, (time.time() - 60, time.time() - 60))

    async def read(rid: str) -> dict:
        return store.response(rid, "")

    abandoned("resp_next", 0)
    got = asyncio.run(read("resp_next"))  # attempt 1 abandoned: this router claims attempt 2 (and prepares it)
    assert (tmp_path / "resp_next.claim-2").exists()
    assert got["status"] == "failed" and got["error"]["message"] == "prepared again here"
    abandoned("resp_last", MAX_ATTEMPTS - 1)
    got = asyncio.run(read("resp_last"))
    assert got["status"] == "failed" and "stopped" in got["error"]["message"]
    assert not (tmp_path / f"resp_last.claim-{MAX_ATTEMPTS + 1}").exists()
