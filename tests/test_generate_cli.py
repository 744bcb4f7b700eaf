"""`flint generate`: prompts answered in-process by the embedded demo model, as the API would answer them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flint_engine.cli import main


def test_chat_prompts_in_one_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "What is 7 + 8?", "What is 2 + 3?", "--temperature", "0", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in records] == ["What is 7 + 8?", "What is 2 + 3?"]
    assert "15" in records[0]["content"] and "7 + 8" in records[0]["reasoning"]
    assert "5" in records[1]["content"] and records[1]["finish_reason"] == "stop"


def test_text_output_and_no_thinking(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "What is 7 + 8?", "--temperature", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[thinking] ") and "7 + 8" in lines[0] and "15" in lines[1]
    assert main(["generate", "What is 7 + 8?", "--temperature", "0", "--no-thinking", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["reasoning"] is None and "15" in record["content"]


def test_raw_completion_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "7 + 8 =", "--raw", "--max-tokens", "3", "--temperature", "0", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["reasoning"] is None and record["completion_tokens"] <= 3 and record["content"].strip()
    assert main(["generate", "hi", "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", "/nonexistent/flint.gguf"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_constraints_and_thinking_budget(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["generate", "What is 7 + 8?", "--temperature", "0", "--json"]
    assert main([*args, "--choice", "fifteen", "--choice", "15"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["content"] in ("fifteen", "15") and record["finish_reason"] == "stop" and record["reasoning"]
    assert main([*args, "--regex", "[0-9]{2}!"]) == 0
    assert json.loads(capsys.readouterr().out)["content"] == "15!"
    assert main([*args, "--thinking-budget", "2"]) == 0
    assert len(json.loads(capsys.readouterr().out)["reasoning"]) < len("The user asks for 7 + 8.")
    assert main([*args, "--regex", "(a"]) == 2
    assert "regex" in capsys.readouterr().err
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= "It is " [0-9]+ "."  # a number in a sentence\n')
    assert main([*args, "--grammar", str(grammar)]) == 0
    assert json.loads(capsys.readouterr().out)["content"] == "It is 15."
    grammar.write_text("root ::= missing\n")
    assert main([*args, "--grammar", str(grammar)]) == 2
    assert "missing" in capsys.readouterr().err
    assert main([*args, "--grammar", str(tmp_path / "none.gbnf")]) == 2
    assert "cannot read the grammar" in capsys.readouterr().err
