"""OpenAI's batch file format: every bad line named before a request runs; an earlier output's whole records kept."""

from __future__ import annotations

import json

import pytest

from flint_engine.api.batch_lines import BatchFileError, output_record, read_batch_lines, recorded_ids


def line(cid: str = "r1", url: str = "/v1/chat/completions", **body) -> str:
    body = body or {"messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def test_valid_lines_in_order_with_their_numbers() -> None:
    text = [line("a"), "\n", line("b", "/v1/completions", prompt="x", model="flint"), line("c", "/v1/responses")]
    found = read_batch_lines(text, "flint")
    assert [(x.number, x.custom_id, x.url) for x in found] == [
        (1, "a", "/v1/chat/completions"),
        (3, "b", "/v1/completions"),
        (4, "c", "/v1/responses"),
    ]
    assert found[1].body == {"prompt": "x", "model": "flint"}


def test_every_problem_is_named_with_its_line() -> None:
    bad = [
        line("ok"),
        "{not json",
        json.dumps(["a list"]),
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
        json.dumps({"custom_id": "m", "method": "GET", "url": "/v1/completions", "body": {}}),
        line("u", "/v1/embeddings"),
        json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": "text"}),
        line("s", stream=True, messages=[]),
        line("g", model="gpt-4o", messages=[]),
        line("ok"),
        line("bg", "/v1/responses", background=True, input="hi"),
    ]
    with pytest.raises(BatchFileError) as err:
        read_batch_lines(bad, "flint")
    problems = err.value.problems
    assert len(problems) == 10
    expected = [
        "line 2: not valid JSON",
        "line 3: a line must be a JSON object",
        "line 4: custom_id",
        "line 5: method must be",
        "line 6: url must be one of",
        "line 7: body must be a JSON object",
        "line 8: stream is not supported",
        "line 9: body.model is 'gpt-4o', but the model served here is 'flint'",
        "line 10: custom_id 'ok' is also on line 1",
        "line 11: background is not supported",
    ]
    for problem, start in zip(problems, expected):
        assert problem.startswith(start), problem
    assert str(err.value).startswith("10 problem(s) in the batch file:")


def test_a_long_list_of_problems_is_cut_in_the_message() -> None:
    with pytest.raises(BatchFileError) as err:
        read_batch_lines(["{"] * 25, "flint")
    assert len(err.value.problems) == 25 and str(err.value).endswith("... and 5 more")


def test_output_records_and_resuming_from_a_cut_file() -> None:
    rec = output_record("a", 400, {"error": {"message": "bad"}}, "rid-1")
    assert rec["custom_id"] == "a" and rec["id"].startswith("batch_req_") and rec["error"] is None
    assert rec["response"] == {"status_code": 400, "request_id": "rid-1", "body": {"error": {"message": "bad"}}}
    whole = json.dumps(output_record("b", 200, {"x": 1}, "rid-2"))
    cut = json.dumps(output_record("c", 200, {"x": 2}, "rid-3"))[:-7]
    kept, ids = recorded_ids([json.dumps(rec) + "\n", whole, cut, json.dumps({"custom_id": "d"}) + "\n"])
    assert ids == {"a", "b"} and kept == [json.dumps(rec) + "\n", whole + "\n"]
