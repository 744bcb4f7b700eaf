"""`flint-serve` start-up errors are clear and immediate (before any Ray work)."""

from __future__ import annotations

import contextlib
import io
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from flint_serve import cli


def run(*args: str) -> SimpleNamespace:
    """`flint-serve ARGS` in this process (its refusals come before any Ray work; a run that got as far as starting
    Ray fails the test instead), with its exit status and stderr."""
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        mp.setattr(cli, "start", lambda *a, **k: pytest.fail(f"flint-serve {' '.join(args)} got as far as starting"))
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse's refusals
            code = exc.code
    return SimpleNamespace(returncode=code, stderr=err.getvalue())


def test_missing_model_file() -> None:
    """Through the real entry point once: a new process, its exit status and stderr."""
    r = subprocess.run(
        [sys.executable, "-m", "flint_serve.cli", "--model", "/nonexistent/flint.gguf"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "model file /nonexistent/flint.gguf does not exist" in r.stderr
    assert run("--model", "/nonexistent/flint.gguf").stderr == r.stderr


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
    # one line a field, without pydantic's report and links
    r = run("--replicas", "0", "--set", "api.max_n=0", "--set", "nope=1")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "errors.pydantic.dev" not in r.stderr
    assert "num_replicas: Input should be greater than or equal to 1 (got 0)" in last
    assert "api.max_n: Input should be greater than or equal to 1 (got 0)" in last and "nope: no such setting" in last
    r = run("--config", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [")
    r = run("--config", str(bad))
    assert r.returncode == 2 and "not valid YAML" in r.stderr


def test_kv_cache_memory_takes_sizes(tmp_path) -> None:
    from flint_serve.cli import build_parser, settings_from_args

    args = build_parser().parse_args(["--kv-cache-memory", "512MiB"])
    assert settings_from_args(args).kv_cache_memory == 512 * 2**20
    args = build_parser().parse_args(["--set", "kv_cache_memory=8GiB"])
    assert settings_from_args(args).kv_cache_memory == 8 * 2**30
    cfg = tmp_path / "s.yaml"
    cfg.write_text("kv_cache_memory: 2GB\n")
    assert settings_from_args(build_parser().parse_args(["--config", str(cfg)])).kv_cache_memory == 2 * 10**9
    r = run("--kv-cache-memory", "lots")
    assert r.returncode == 2 and "'lots' is not a byte size" in r.stderr
    r = run("--set", "kv_cache_memory=8 GiBs")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "kv_cache_memory: '8 GiBs' is not a byte size" in last and "Value error" not in last


def test_thinking_budget_settings_from_the_command_line() -> None:
    from flint_serve.cli import StartupError, build_parser, settings_from_args

    argv = ["--set", "api.reasoning_effort_budgets={low: 512, medium: 2048}", "--set", "api.thinking_token_budget=8192"]
    api = settings_from_args(build_parser().parse_args(argv)).api
    assert api.reasoning_effort_budgets == {"low": 512, "medium": 2048} and api.thinking_token_budget == 8192
    with pytest.raises(StartupError, match="reasoning_effort_budgets"):
        settings_from_args(build_parser().parse_args(["--set", "api.reasoning_effort_budgets={low: -1}"]))


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


def test_bad_host_and_port() -> None:
    for args, says in (
        (("--port", "99999"), "argument --port: port 99999 is outside 1-65535"),
        (("--port", "http"), "argument --port: 'http' is not a port number"),
        (("--metrics-export-port", "0"), "argument --metrics-export-port: port 0 is outside 1-65535"),
        (("--host", "no-such-host.invalid"), "--host no-such-host.invalid cannot be resolved"),
        (("--host", "203.0.113.123"), "cannot listen on 203.0.113.123:8000"),  # TEST-NET-3: no host of ours
    ):
        r = run(*args)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_several_routers_without_shared_directories_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from flint_serve.app import build_app

    with caplog.at_level("WARNING", logger="flint_serve"):
        build_app({"router_replicas": 2, "device": "cpu"})
    assert "api.batch_dir is unset" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="flint_serve"):
        build_app({"router_replicas": 2, "device": "cpu", "api": {"batch_dir": "/data/batches"}})
        build_app({"device": "cpu"})
    assert "batch_dir" not in caplog.text
    with caplog.at_level("WARNING", logger="flint_serve"):
        build_app({"router_replicas": 2, "device": "cpu", "api": {"store_responses": True}})
    assert "api.responses_dir is unset" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="flint_serve"):
        build_app({"router_replicas": 2, "device": "cpu", "api": {"store_responses": True, "responses_dir": "/r"}})
        build_app({"router_replicas": 2, "device": "cpu"})  # nothing stored
    assert "responses_dir" not in caplog.text
