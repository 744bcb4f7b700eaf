"""`flint-serve`: start a local Ray cluster (or join one) and serve Flint's OpenAI API through Ray Serve.

flint-serve                                   # the embedded default model, http://127.0.0.1:8000/v1
flint-serve --model flint-nvfp4.gguf --replicas 2
flint-serve --config my-settings.yaml --host 0.0.0.0 --api-key-file /etc/flint/keys
"""

from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from flint_engine.api.errors import validation_problem
from flint_engine.api.server import warn_if_open
from flint_engine.byte_size import parse_byte_size
from flint_engine.random_model import is_random_spec, parse_random_spec

from .settings import ServeSettings

log = logging.getLogger("flint_serve")


class StartupError(RuntimeError):
    pass


def load_settings_file(path: str) -> dict[str, Any]:
    """A flat settings YAML, or a Serve config YAML (the first application's `args`)."""
    p = Path(path)
    if not p.is_file():
        raise StartupError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise StartupError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise StartupError(f"config file {path} must hold a mapping")
    if "applications" in data:
        apps = data["applications"] or []
        if not apps:
            raise StartupError(f"config file {path} has no applications")
        return dict(apps[0].get("args") or {})
    return data


def _setting_problem(error: Any) -> str:
    """One pydantic error as a short phrase (our validators' own messages without pydantic's "Value error, ")."""
    if error["type"] == "extra_forbidden":
        return "no such setting"
    if error["type"] == "value_error":
        return validation_problem(error)
    return f"{error['msg']} (got {error.get('input')!r})"


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    values: dict[str, Any] = load_settings_file(args.config) if args.config else {}
    api = dict(values.pop("api", {}) or {})
    for name in ("model", "model_name", "device", "max_num_seqs", "kv_cache_memory", "max_model_len", "dtype"):
        v = getattr(args, name)
        if v is not None:
            values[name] = v
    if args.replicas is not None:
        values["num_replicas"] = args.replicas
    if args.api_key_file:
        api["api_key_file"] = args.api_key_file
    for item in args.set or []:
        key, _, raw = item.partition("=")
        value = yaml.safe_load(raw)
        if key.startswith("api."):
            api[key[4:]] = value
        else:
            values[key] = value
    values["api"] = api
    try:
        return ServeSettings(**values)
    except ValidationError as exc:
        # One line a field ("api.max_n: Input should be ... (got 0)"), not pydantic's multi-line report with links.
        lines = [f"{'.'.join(map(str, e['loc'])) or 'settings'}: {_setting_problem(e)}" for e in exc.errors()]
        raise StartupError("invalid settings: " + "; ".join(lines)) from None
    except Exception as exc:
        raise StartupError(f"invalid settings: {exc}") from exc


def port_number(text: str) -> int:
    """A TCP port for argparse: 1-65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 1-65535")
    return port


def byte_size(text: str) -> int:
    """A byte count for argparse: `parse_byte_size`'s forms."""
    try:
        return parse_byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def preflight(settings: ServeSettings, host: str, port: int) -> None:
    """The clear start-up errors: missing model, no GPU when one is asked for, port in use."""
    if is_random_spec(settings.model):
        try:
            parse_random_spec(settings.model)  # type: ignore[arg-type]
        except ValueError as exc:
            raise StartupError(str(exc)) from None
    elif settings.model is not None and not Path(settings.model).exists():
        raise StartupError(f"model file {settings.model} does not exist")
    if settings.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise StartupError("--device cuda was asked for but this machine has no usable CUDA GPU")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("0.0.0.0", "") else "0.0.0.0", port))
        except socket.gaierror as exc:
            raise StartupError(f"--host {host} cannot be resolved ({exc.strerror})") from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(f"port {port} on {host} is in use; pick another with --port") from None
            raise StartupError(f"cannot listen on {host}:{port} ({exc.strerror}); check --host and --port") from None


def start(
    settings: ServeSettings,
    host: str,
    port: int,
    address: str | None,
    metrics_port: int | None,
    app_name: str = "flint",
) -> None:
    import ray
    from ray import serve

    from .app import build_app

    if settings.model is None:
        from flint_engine.default_model import default_checkpoint_path

        path = default_checkpoint_path()  # made once, before replicas race for it
        log.info("serving the embedded default model %s", path)
    if not ray.is_initialized():
        init: dict[str, Any] = {
            "include_dashboard": False,
            "ignore_reinit_error": True,
            "logging_level": logging.WARNING,
        }
        if address:
            init["address"] = address
        else:
            replicas = settings.num_replicas or settings.max_replicas or 1
            need = settings.router_num_cpus * settings.router_replicas + replicas * (settings.replica_num_cpus or 1)
            init["num_cpus"] = max(os.cpu_count() or 1, math.ceil(need + 0.5))
            if metrics_port:
                init["_metrics_export_port"] = metrics_port
        ray.init(**init)
    if settings.device == "cuda" and ray.cluster_resources().get("GPU", 0) < 1:
        raise StartupError("--device cuda was asked for but the Ray cluster has no GPUs")
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(build_app(settings), name=app_name, route_prefix="/", blocking=False)
    except Exception as exc:
        raise StartupError(f"the application failed to start: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flint-serve", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        help="GGUF file, HF checkpoint directory, or random:<preset>[:nvfp4] (random weights built on the device; "
        "for benchmarks) (default: the embedded demo Flint)",
    )
    p.add_argument("--model-name", help="name clients pass as `model` (default: flint)")
    p.add_argument("--replicas", type=int, help="fixed number of replicas (default: autoscale 1..#GPUs)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument(
        "--kv-cache-memory", type=byte_size, help="KV cache per replica: bytes, or a size such as 8GiB or 512MiB"
    )
    p.add_argument("--config", help="settings YAML (flat, or a Serve config whose first application's args are used)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override any setting (api.* for the API)")
    p.add_argument("--api-key-file", help="file of API keys, one per line, re-read on change")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--address", help="join an existing Ray cluster instead of starting one")
    p.add_argument(
        "--metrics-export-port", type=port_number, default=8080, help="Ray's Prometheus port (local cluster)"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from_args(args)
        preflight(settings, args.host, args.port)
        warn_if_open(args.host, settings.api)
        start(settings, args.host, args.port, args.address, args.metrics_export_port)
    except StartupError as exc:
        print(f"flint-serve: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"Flint is serving '{settings.model_name}' at http://{args.host}:{args.port}/v1  (Ctrl-C to stop)", flush=True
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    import ray
    from ray import serve

    log.info("shutting down: draining in-flight requests")
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
