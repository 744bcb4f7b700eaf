"""OpenAI's Files and Batch APIs through the `openai` client: a batch answered as the chat endpoint answers, refused
lines in the error file, cancel, a stopped server's batches resumed (or expired), each key seeing only its own."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from flint_engine.api.batch_jobs import BatchCreate, new_batch
from flint_engine.api.batch_store import BatchStore
from flint_engine.api.server import start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"


def question(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} + 2?"}], "temperature": 0, "max_tokens": 64}


def batch_file(bodies: dict[str, dict], url: str = "/v1/chat/completions") -> bytes:
    lines = [{"custom_id": cid, "method": "POST", "url": url, "body": body} for cid, body in bodies.items()]
    return "\n".join(json.dumps(line) for line in lines).encode()


def start(batch_dir: Path, **settings):
    engine = LLMEngine.from_checkpoint(EngineConfig(device="cpu"), progress=False)
    return start_local_server(engine, APISettings(batch_dir=str(batch_dir), **settings))


def client(server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)


def settle(c: openai.OpenAI, batch_id: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = c.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {seconds} s")


def records(c: openai.OpenAI, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    found = [json.loads(line) for line in c.files.content(file_id).text.splitlines()]
    by_id = {r["custom_id"]: r for r in found}
    assert len(by_id) == len(found)
    return by_id


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    s = start(tmp_path_factory.mktemp("batches"), api_keys=[KEY_A, KEY_B])
    yield s
    s.stop()


def test_a_batch_is_answered_as_the_chat_endpoint_answers(server) -> None:
    c = client(server, KEY_A)
    bodies = {f"q{i}": question(i) for i in range(4)}
    bodies["empty"] = {"messages": [], "max_tokens": 5}
    uploaded = c.files.create(file=("in.jsonl", io.BytesIO(batch_file(bodies))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(batch_file(bodies))
    assert c.files.retrieve(uploaded.id).filename == "in.jsonl"
    batch = c.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "t1"}
    )
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "t1"}
    batch = settle(c, batch.id)
    assert batch.status == "completed" and batch.completed_at and batch.in_progress_at
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (5, 4, 1)
    out, errors = records(c, batch.output_file_id), records(c, batch.error_file_id)
    assert set(out) == {"q0", "q1", "q2", "q3"} and set(errors) == {"empty"}
    for cid, rec in out.items():
        direct = c.chat.completions.create(model="flint", **bodies[cid])
        assert rec["response"]["status_code"] == 200 and rec["error"] is None
        assert rec["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
    assert errors["empty"]["response"]["status_code"] == 400
    assert errors["empty"]["response"]["body"]["error"]["param"] == "messages"
    assert c.files.retrieve(batch.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in c.batches.list()]
    assert {uploaded.id, batch.output_file_id} <= {f.id for f in c.files.list()}
    inputs = {f.id for f in c.files.list(purpose="batch")}
    assert uploaded.id in inputs and batch.output_file_id not in inputs
    with pytest.raises(openai.BadRequestError, match="only a running batch"):
        c.batches.cancel(batch.id)


def test_each_key_sees_only_its_own(server) -> None:
    a, b = client(server, KEY_A), client(server, KEY_B)
    mine = a.files.create(file=("x.jsonl", io.BytesIO(batch_file({"q": question(1)}))), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        b.files.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        b.files.content(mine.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.create(input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert mine.id not in {f.id for f in b.files.list()}
    batch = a.batches.create(input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(batch.id)
    with pytest.raises(openai.AuthenticationError):
        client(server, "wrong").batches.list()
    assert settle(a, batch.id).status == "completed"  # its requests got past the gate without the caller's key
    assert a.files.delete(mine.id).deleted
    with pytest.raises(openai.NotFoundError):
        a.files.retrieve(mine.id)


def test_bad_uploads_and_batches_are_refused(server) -> None:
    c = client(server, KEY_A)
    headers = {"Authorization": f"Bearer {KEY_A}"}
    url = f"{server.base_url}/v1/files"
    r = httpx.post(url, files={"file": ("a.jsonl", b"{}")}, data={"purpose": "fine-tune"}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    r = httpx.post(url, data={"purpose": "batch"}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        c.batches.create(input_file_id="file-x", endpoint="/v1/embeddings", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        c.batches.create(input_file_id="file-x", endpoint="/v1/completions", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        c.batches.create(input_file_id="file-x", endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve("../batches")
    # A file whose lines are not requests for the batch's endpoint: the batch fails, each line named.
    text = batch_file({"a": {"prompt": "hi"}}, "/v1/completions") + b"\n{oops\n"
    bad = c.files.create(file=("bad.jsonl", io.BytesIO(text)), purpose="batch")
    failed = settle(
        c, c.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h").id
    )
    assert failed.status == "failed" and failed.failed_at
    problems = [(e.line, e.code) for e in failed.errors.data]
    assert problems == [(1, "invalid_request"), (2, "invalid_request")]
    assert "not the batch's endpoint" in failed.errors.data[0].message
    empty = c.files.create(file=("empty.jsonl", io.BytesIO(b"\n")), purpose="batch")
    failed = settle(c, c.batches.create(input_file_id=empty.id, endpoint="/v1/completions", completion_window="24h").id)
    assert failed.status == "failed" and failed.errors.data[0].code == "empty_file"


def test_uploads_without_python_multipart_say_so(server, monkeypatch: pytest.MonkeyPatch) -> None:
    import starlette.requests

    monkeypatch.setattr(starlette.requests, "parse_options_header", None)  # as when python-multipart is missing
    headers = {"Authorization": f"Bearer {KEY_A}"}
    r = httpx.post(f"{server.base_url}/v1/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "batch"},
                   headers=headers)  # fmt: skip
    assert r.status_code == 501 and "python-multipart" in r.json()["error"]["message"]


def test_lists_page(tmp_path: Path) -> None:
    server = start(tmp_path / "store")
    try:
        c = client(server)
        made = []
        for i in range(3):
            made.append(c.files.create(file=(f"{i}.jsonl", io.BytesIO(b"{}")), purpose="batch").id)
        page = c.files.list(limit=2)
        assert [f.id for f in page.data] == made[::-1][:2] and page.has_more
        assert [f.id for f in c.files.list(limit=2, after=page.data[-1].id).data] == [made[0]]
        assert [f.id for f in c.files.list(order="asc")] == made
        with pytest.raises(openai.BadRequestError, match="limit"):
            c.batches.list(limit=0)
        with pytest.raises(openai.BadRequestError, match="order"):
            c.files.list(order="sideways")  # type: ignore[arg-type]
    finally:
        server.stop()


def test_upload_caps(tmp_path: Path) -> None:
    server = start(tmp_path / "store", max_file_bytes=2048, max_stored_bytes=3000)
    try:
        c = client(server)
        big = b"x" * 2049
        with pytest.raises(openai.APIStatusError) as err:
            c.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch")
        assert err.value.status_code == 413
        c.files.create(file=("a.jsonl", io.BytesIO(b"y" * 2000)), purpose="batch")
        with pytest.raises(openai.APIStatusError, match="storage") as err:
            c.files.create(file=("b.jsonl", io.BytesIO(b"z" * 1500)), purpose="batch")
        assert err.value.status_code == 413
        # A chunked upload (no Content-Length) is cut at the cap (the file's and the form's room) as it arrives.
        head = b'--xx\r\nContent-Disposition: form-data; name="file"; filename="c.jsonl"\r\n\r\n'
        chunks = (part for part in [head, *(b"w" * 1024 for _ in range(80))])
        r = httpx.post(
            f"{server.base_url}/v1/files",
            content=chunks,
            headers={"content-type": "multipart/form-data; boundary=xx"},
        )
        assert r.status_code == 413
        assert len(list((tmp_path / "store" / "files").glob("*.data"))) == 1
    finally:
        server.stop()


def test_cancel_stops_a_running_batch(tmp_path: Path) -> None:
    server = start(tmp_path / "store", batch_concurrency=1)
    try:
        c = client(server)
        bodies = {f"q{i}": question(i % 10) for i in range(40)}
        uploaded = c.files.create(file=("in.jsonl", io.BytesIO(batch_file(bodies))), purpose="batch")
        batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        while c.batches.retrieve(batch.id).request_counts.completed < 1:
            time.sleep(0.05)
        assert c.batches.cancel(batch.id).status == "cancelling"
        done = settle(c, batch.id)
        assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
        answered = records(c, done.output_file_id)
        assert 1 <= len(answered) < 40 and done.request_counts.completed == len(answered)
    finally:
        server.stop()


def test_batch_concurrency_bounds_all_batches_together(tmp_path: Path) -> None:
    server = start(tmp_path / "store", batch_concurrency=1)
    try:
        busy: list[int] = []
        add = server.engine.engine.add_request

        def recording(rid, prompt, params):  # how many other requests the engine holds as each one arrives
            busy.append(len(server.engine.engine.requests))
            return add(rid, prompt, params)

        server.engine.engine.add_request = recording  # type: ignore[method-assign]
        c = client(server)
        ids = []
        for k in range(2):
            bodies = {f"q{k}{i}": question(i) for i in range(3)}
            uploaded = c.files.create(file=("in.jsonl", io.BytesIO(batch_file(bodies))), purpose="batch")
            ids.append(c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                        completion_window="24h").id)  # fmt: skip
        assert all(settle(c, i).status == "completed" for i in ids)
        assert len(busy) == 6 and max(busy) == 0  # one batch request at a time across both batches
    finally:
        server.stop()


def _stopped_batch(root: Path, bodies: dict[str, dict], answered: list[str], expires_at: int) -> str:
    """A batch as a server that stopped mid-run left it: in progress, its output holding `answered`'s records."""
    store = BatchStore(root, 2**20, 2**30)
    source = store.save_upload(io.BytesIO(batch_file(bodies)), "in.jsonl", "batch", "")
    out_id, err_id = store.new_output_file(), store.new_output_file()
    with store.data_path(out_id).open("w") as f:
        for cid in answered:
            body = {"choices": [{"message": {"content": f"earlier {cid}"}}]}
            rec = {
                "id": "batch_req_x",
                "custom_id": cid,
                "response": {"status_code": 200, "request_id": "r", "body": body},
            }
            f.write(json.dumps({**rec, "error": None}) + "\n")
        f.write('{"id": "batch_req_cut", "custom_')  # the record being written when it stopped
    now = int(time.time())
    req = BatchCreate(input_file_id=source["id"], endpoint="/v1/chat/completions", completion_window="24h")
    record = new_batch(req, "", now - 60)
    record.update(
        status="in_progress",
        output_file_id=out_id,
        error_file_id=err_id,
        in_progress_at=now - 59,
        expires_at=expires_at,
        request_counts={"total": len(bodies), "completed": len(answered), "failed": 0},
    )
    store.save_batch(record)
    return record["id"]


def test_a_stopped_servers_batch_is_resumed(tmp_path: Path) -> None:
    bodies = {f"q{i}": question(i) for i in range(4)}
    batch_id = _stopped_batch(tmp_path / "store", bodies, ["q0", "q2"], int(time.time()) + 3600)
    server = start(tmp_path / "store")
    try:
        # Taken up at the server's start: it completes before any Batch API call is made.
        store = BatchStore(tmp_path / "store", 2**20, 2**30)
        deadline = time.monotonic() + 60
        while store.batch_record(batch_id)["status"] != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.batch_record(batch_id)["status"] == "completed"
        c = client(server)
        done = settle(c, batch_id)
        assert done.status == "completed" and done.request_counts.completed == 4
        out = records(c, done.output_file_id)
        assert set(out) == set(bodies) and done.error_file_id is None
        assert out["q0"]["response"]["body"]["choices"][0]["message"]["content"] == "earlier q0"  # kept as it was
        assert "3" in out["q1"]["response"]["body"]["choices"][0]["message"]["content"]  # 1 + 2, answered now
    finally:
        server.stop()


def test_a_batch_past_its_window_expires(tmp_path: Path) -> None:
    bodies = {f"q{i}": question(i) for i in range(3)}
    batch_id = _stopped_batch(tmp_path / "store", bodies, ["q1"], int(time.time()) - 1)
    server = start(tmp_path / "store")
    try:
        c = client(server)
        done = settle(c, batch_id)
        assert done.status == "expired" and done.expired_at
        assert set(records(c, done.output_file_id)) == {"q1"}
        errors = records(c, done.error_file_id)
        assert set(errors) == {"q0", "q2"}
        assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors.values())
        assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    finally:
        server.stop()


def test_files_expire_as_openai_says(tmp_path: Path) -> None:
    """Uploads and a batch's output expire after `expires_after` / `output_expires_after` (30 days unless told);
    past that a file answers 404, leaves the list and its bytes go; bad policies are 400s naming the field."""
    server = start(tmp_path / "store")
    try:
        c = client(server)
        data = batch_file({"q1": question(1)})
        plain = c.files.create(file=("a.jsonl", io.BytesIO(data)), purpose="batch")
        assert plain.expires_at == plain.created_at + 30 * 24 * 3600  # OpenAI's default for batch files
        hour = c.files.create(
            file=("b.jsonl", io.BytesIO(data)), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
        )
        assert hour.expires_at == hour.created_at + 3600 and c.files.retrieve(hour.id).expires_at == hour.expires_at
        for policy in ({"anchor": "created_at", "seconds": 60}, {"anchor": "last_active_at", "seconds": 3600}):
            with pytest.raises(openai.BadRequestError) as err:
                c.files.create(file=("c.jsonl", io.BytesIO(data)), purpose="batch", expires_after=policy)  # type: ignore[arg-type]
            assert err.value.body["param"] == "expires_after"
        batch = c.batches.create(
            input_file_id=plain.id, endpoint="/v1/chat/completions", completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 7200},
        )  # fmt: skip
        out = c.files.retrieve(settle(c, batch.id).output_file_id)
        assert out.expires_at == out.created_at + 7200
        with pytest.raises(openai.BadRequestError):
            c.batches.create(
                input_file_id=plain.id, endpoint="/v1/chat/completions", completion_window="24h",
                output_expires_after={"anchor": "created_at", "seconds": 10**9},
            )  # fmt: skip
        # Two hours on: the hour's upload and the batch's output are gone, the default upload stays.
        store = server.server.config.app.state.batch_jobs.store
        store.clock = lambda: time.time() + 2 * 3600 + 5
        with pytest.raises(openai.NotFoundError):
            c.files.retrieve(hour.id)
        with pytest.raises(openai.NotFoundError):
            c.files.content(out.id)
        assert [f.id for f in c.files.list()] == [plain.id]
        assert not store.data_path(hour.id).exists() and not store.data_path(out.id).exists()
    finally:
        server.stop()


def test_an_expired_file_stays_while_a_running_batch_uses_it(tmp_path: Path) -> None:
    now = [time.time()]
    store = BatchStore(tmp_path, 2**20, 2**30, clock=lambda: now[0])
    used = store.save_upload(io.BytesIO(batch_file({"q": question(1)})), "in.jsonl", "batch", "", 3600)
    idle = store.save_upload(io.BytesIO(batch_file({"q": question(2)})), "in.jsonl", "batch", "", 3600)
    req = BatchCreate(input_file_id=used["id"], endpoint="/v1/chat/completions", completion_window="24h")
    record = new_batch(req, "")
    record["status"] = "in_progress"
    store.save_batch(record)
    now[0] += 3601
    assert store.sweep() == 1 and not store.data_path(idle["id"]).exists()
    assert store.data_path(used["id"]).exists() and store.files("") == []  # kept for its batch, not listed
    record["status"] = "completed"
    store.save_batch(record)
    assert store.sweep() == 1 and not store.data_path(used["id"]).exists()


def _gauges(server) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_count_batches_by_status_and_the_requests_left(tmp_path: Path) -> None:
    server = start(tmp_path / "store")
    try:
        before = _gauges(server)
        assert before[("flint:batches", (("status", "completed"),))] == 0  # every status there from the start
        assert before[("flint:batch_requests_remaining", ())] == 0
        c = client(server)
        uploaded = c.files.create(file=("in.jsonl", io.BytesIO(batch_file({"a": question(1)}))), purpose="batch")
        done = settle(c, c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                          completion_window="24h").id)  # fmt: skip
        after = _gauges(server)
        assert done.status == "completed" and after[("flint:batches", (("status", "completed"),))] == 1
        assert after[("flint:batch_requests_remaining", ())] == 0
    finally:
        server.stop()
    # A stopped server's batch with one of four requests answered: three remain.
    _stopped_batch(tmp_path / "other", {f"q{i}": question(i) for i in range(4)}, ["q0"], 10**10)
    assert BatchStore(tmp_path / "other", 2**20, 2**30).status_counts() == ({"in_progress": 1}, 3)
