"""`flint-serve` start-up errors are clear and immediate (before any Ray work)."""

from __future__ import annotations

import socket
import subprocess
import sys

import torch


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flint_serve.cli", *args], capture_output=True, text=True, timeout=120)


def test_missing_model_file() -> None:
    r = run("--model", "/nonexistent/flint.gguf")
    assert r.returncode == 2 and "model file /nonexistent/flint.gguf does not exist" in r.stderr


def test_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("--port", str(port))
    assert r.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in r.stderr


def test_gpu_asked_for_without_one() -> None:
    if torch.cuda.is_available():
        return  # this machine has a GPU: nothing to refuse
    r = run("--device", "cuda")
    assert r.returncode == 2 and "no usable CUDA GPU" in r.stderr


def test_bad_settings_and_config(tmp_path) -> None:
    r = run("--set", "max_queued_requests=-5")
    assert r.returncode == 2 and "max_queued_requests" in r.stderr
    r = run("--config", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [")
    r = run("--config", str(bad))
    assert r.returncode == 2 and "not valid YAML" in r.stderr


def test_serve_config_yaml_is_valid() -> None:
    from pathlib import Path

    from flint_serve.cli import load_settings_file
    from flint_serve.settings import ServeSettings

    cfg = Path(__file__).resolve().parents[1] / "deployments" / "serve_config.yaml"
    settings = ServeSettings(**load_settings_file(str(cfg)))
    assert settings.model_name == "flint" and settings.routing == "prefix_affinity"
    tuned = ServeSettings(max_num_batched_tokens=512, idle_prefill_tokens=4096)
    ec = tuned.engine_config(gpu=False)
    assert (ec.max_num_batched_tokens, ec.idle_prefill_tokens, ec.prefill_tokens(False)) == (512, 4096, 4096)


def test_bad_random_model_spec() -> None:
    r = run("--model", "random:huge")
    assert r.returncode == 2 and "unknown preset 'huge'" in r.stderr
    r = run("--model", "random:tiny:fp8")
    assert r.returncode == 2 and "unknown option 'fp8'" in r.stderr
