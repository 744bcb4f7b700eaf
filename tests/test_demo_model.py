"""The shipped demo model (flint_engine/assets): the trainer's module computes what the engine computes, the BF16
file answers a reduced held-out eval through the official `openai` client, and the NVFP4 file agrees with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch

from flint_engine.api.server import start_local_server
from flint_engine.api.settings import APISettings
from flint_engine.chat_template import DEFAULT_CHAT_TEMPLATE
from flint_engine.checkpoint import load_checkpoint
from flint_engine.checkpoint.gguf_writer import write_gguf
from flint_engine.config import preset
from flint_engine.default_model import default_checkpoint_path, shipped_checkpoint
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.model import FlintModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from demo_arch import TrainableFlint  # noqa: E402
from demo_corpus import samples  # noqa: E402
from eval_demo import ask, categories  # noqa: E402
from train_demo import engine_greedy  # noqa: E402

BF16 = ROOT / "flint_engine" / "assets" / "flint-demo.gguf"
NVFP4 = ROOT / "flint_engine" / "assets" / "flint-demo-nvfp4.gguf"
CI_SEED = 31_337  # held out from training (batches use seed * 1_000_003 + step) and from tools/eval_demo.py


# ---------------------------------------------------------------------------------------------- module == engine
def _random_module(seed: int = 3) -> TrainableFlint:
    """A tiny Flint (window 7, so sequences cross it) with random sinks and norm weights, so every op shows."""
    return TrainableFlint(preset("tiny")).init_weights(seed, sink_std=1.0, norm_std=0.1)


def _padded(seqs: list[list[int]]) -> torch.Tensor:
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids


@pytest.mark.parametrize("fmt", ["f32", "bf16"])
def test_training_module_matches_engine(tmp_path: Path, fmt: str) -> None:
    """Random init -> write_gguf -> load_checkpoint -> FlintModel.forward_sequences: the same FP32 logits."""
    model = _random_module()
    if fmt == "bf16":
        model.round_to_bf16_()  # what the BF16 file stores; norms, sinks and router are F32 in the file anyway
    path = tmp_path / f"module-{fmt}.gguf"
    write_gguf(path, model.config, model.provider(), fmt=fmt, progress=False)
    engine = FlintModel(load_checkpoint(path, torch.float32, progress=False).weights)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 23, 40)]
    want = engine.forward_sequences(seqs)
    with torch.no_grad():
        got, _ = model(_padded(seqs))
    for i, s in enumerate(seqs):
        rel = float((got[i, : len(s)] - want[i]).norm() / want[i].norm())
        assert rel < 1e-5, (fmt, len(s), rel)


def test_packed_rows_equal_separate_sequences() -> None:
    """Training packs several conversations in a row; positions and segments keep each one exact."""
    model = _random_module(5)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (9, 17, 4)]
    ids = torch.zeros(1, 32, dtype=torch.long)
    positions = torch.zeros(1, 32, dtype=torch.long)
    segments = torch.full((1, 32), -1, dtype=torch.long)
    at = 0
    for k, s in enumerate(seqs):
        ids[0, at : at + len(s)] = torch.tensor(s)
        positions[0, at : at + len(s)] = torch.arange(len(s))
        segments[0, at : at + len(s)] = k
        at += len(s)
    with torch.no_grad():
        packed, _ = model(ids, positions, segments)
        alone = [model(torch.tensor([s]))[0][0] for s in seqs]
    at = 0
    for s, ref in zip(seqs, alone):
        torch.testing.assert_close(packed[0, at : at + len(s)], ref, rtol=1e-5, atol=1e-5)
        at += len(s)


def test_parameters_are_the_checkpoint_plan() -> None:
    model = _random_module()
    model.check_plan()
    provide = model.provider()
    for spec in model.plan():
        assert tuple(provide(spec).shape) == spec.shape, spec.key


# ---------------------------------------------------------------------------------------------- the shipped files
def test_shipped_demo_is_the_default_model() -> None:
    assert shipped_checkpoint() == BF16 and BF16.is_file() and NVFP4.is_file()
    assert default_checkpoint_path() == BF16
    for path in (BF16, NVFP4):
        assert path.stat().st_size < 8 * 2**20, f"{path.name} is {path.stat().st_size} bytes"
    ck = load_checkpoint(BF16, torch.float32, progress=False)
    assert ck.tokenizer is not None and ck.tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE
    assert ck.generation_defaults["temperature"] == 1.0 and ck.generation_defaults["top_k"] == 20
    assert abs(ck.generation_defaults["top_p"] - 0.95) < 1e-6
    c = ck.config
    assert c.full_layers and c.sliding_layers and c.mlp_only_layers == (0, 1) and c.shared_expert_intermediate_size
    assert c.num_key_value_heads < c.num_attention_heads
    nv = load_checkpoint(NVFP4, torch.float32, progress=False)
    assert nv.weights.is_nvfp4() and nv.config == c


def ci_prompts() -> list:
    """10 arithmetic, 10 tool-call and 5 thinking-off prompts."""
    off = (
        samples(CI_SEED + 3, 2, kind="arith", thinking=False)
        + samples(CI_SEED + 4, 2, kind="tool", thinking=False)
        + samples(CI_SEED + 5, 1, kind="greet", thinking=False)
    )
    return (
        samples(CI_SEED + 1, 10, kind="arith", thinking=True)
        + samples(CI_SEED + 2, 10, kind="tool", thinking=True)
        + off
    )


@pytest.fixture(scope="module")
def demo_client():
    config = EngineConfig(model=str(BF16), device="cpu", dtype="float32", kv_cache_memory=32 * 2**20)
    engine = LLMEngine.from_checkpoint(config, progress=False)
    server = start_local_server(engine, APISettings())
    yield openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def test_demo_model_ci_eval(demo_client: openai.OpenAI) -> None:
    """Each prompt non-streamed and streamed at temperature 0 through the openai client."""
    results = [ask(demo_client, s, max_tokens=96) for s in ci_prompts()]
    cats = categories(results)
    failures = [
        {k: r[k] for k in ("kind", "thinking", "prompt", "expect", "whole")}
        for r in results
        if not (r["ok"] and r["stream_equal"])
    ]
    detail = json.dumps({"categories": cats, "failures": failures}, indent=1, ensure_ascii=False)
    assert cats["arith"]["accuracy"] >= 0.9, detail
    assert cats["tool"]["accuracy"] >= 0.9, detail
    assert cats["no-think: no reasoning"]["accuracy"] == 1.0, detail
    assert cats["stream == non-stream"]["accuracy"] == 1.0, detail
    # reasoning_content carries the thinking of every thinking-on answer
    assert all(r["whole"]["reasoning"] for r in results if r["thinking"]), detail


def test_nvfp4_demo_answers_like_bf16() -> None:
    """Greedy answers of the NVFP4 file against the BF16 file on a few prompts (parsed as the API parses)."""
    items = samples(CI_SEED + 10, 4, kind="arith", thinking=True) + samples(CI_SEED + 11, 4, kind="tool", thinking=True)
    bf16 = engine_greedy(str(BF16), items, max_tokens=96)
    nvfp4 = engine_greedy(str(NVFP4), items, max_tokens=96)
    assert sum(r["ok"] for r in nvfp4) >= len(items) - 1, json.dumps(nvfp4, indent=1)
    same = sum(
        (a["content"], a["tool_calls"] and [c["function"] for c in a["tool_calls"]])
        == (b["content"], b["tool_calls"] and [c["function"] for c in b["tool_calls"]])
        for a, b in zip(bf16, nvfp4)
    )
    assert same >= len(items) - 1, json.dumps({"bf16": bf16, "nvfp4": nvfp4}, indent=1)


def test_training_script_runs_end_to_end(tmp_path: Path) -> None:
    """A few steps of tools/train_demo.py on a shrunk model: both GGUF files load and the report records the run.
    Run as a process, as users run it (it sets process-wide torch and logging state)."""
    out, out4 = tmp_path / "d.gguf", tmp_path / "d4.gguf"
    argv = ["--out", str(out), "--out-nvfp4", str(out4), "--steps", "3", "--layers", "3", "--hidden", "32"]
    argv += ["--rows", "1", "--row-len", "1024", "--vocab", "600", "--no-compile", "--eval-every", "0"]
    argv += ["--eval-per-kind", "1", "--ckpt-dir", str(tmp_path / "ck"), "--threads", "1"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "train_demo.py"), *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "ck" / "report.json").read_text())
    assert report["steps"] == 3 and all(h["loss"] > 0 for h in report["history"] if "loss" in h)
    bf16, nv = load_checkpoint(out, torch.float32, progress=False), load_checkpoint(out4, torch.float32, progress=False)
    assert bf16.config.hidden_size == 32 and nv.weights.is_nvfp4() and bf16.tokenizer is not None
