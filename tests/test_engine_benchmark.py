"""benchmarks/engine_gpu.py on CPU: the long-prompt row and the serving-like churn run through the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_long_prompt_and_churn_rows(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "engine_gpu.py"), "--model", "random:tiny", "--max-model-len",
        "512", "--max-num-seqs", "4", "--max-num-batched-tokens", "32", "--idle-prefill-tokens", "128",
        "--long-prompt", "150", "--churn", "12", "--no-sampling-rows", "--host-profile", "2", "--host-profile-prompt",
        "8", "--host-profile-steps", "5", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    long = data["long_prompt"]
    # Alone: 150 tokens in prefill-only steps of 128 -> two steps; beside a decoding request: steps of 32 less one.
    assert len(long["alone_step_ms"]) == 2 and long["prefill_tokens"] == 128
    assert len(long["beside_step_ms"]) == 5 and long["decoding_gap_max_ms"] > 0
    assert long["ttft_alone_ms"] >= long["alone_step_ms"][-1]  # stamped after the last step's tokens
    churn = data["churn"]
    assert churn["requests"] == 12 and churn["steps"] > 12 and churn["step_ms_max"] >= churn["step_ms_median"] > 0
    ttft, itl = churn["ttft_ms_p50_p99"], churn["itl_ms_p50_p99"]
    assert 0 < ttft[0] <= ttft[1] and 0 < itl[0] <= itl[1]  # request-level times, from the tokens' arrival
    assert churn["late_compiles"] == [] and data["late_compiles"] == []  # CPU: the reference path, no Triton
    assert data["command"].startswith("python benchmarks/engine_gpu.py --model random:tiny")
    assert "--churn 12" in data["command"] and "None" not in data["command"] and "False" not in data["command"]
    assert "churn: 12 requests" in proc.stdout
    greedy, _ = data["host_profile"]  # two requests of 8 prompt tokens, 5 steps timed, greedy then sampled
    assert [h["temperature"] for h in data["host_profile"]] == [0.0, 1.0]
    assert greedy["steps"] == 5 and greedy["wall_ms_per_step_median"] > 0 and greedy["top_self"]
    assert greedy["steps_launched_ahead"] == 0 and greedy["graph_replay_gpu_ms"] is None  # CPU: no graphs
    assert proc.stdout.count("host profile, 2 requests of 8 prompt tokens") == 4  # as each case ends, and at the end
