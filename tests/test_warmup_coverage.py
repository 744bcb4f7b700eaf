"""The start-up warm-up covers what serving launches: no Triton kernel specialisation is first met while serving.

On a GPU such a first meeting is a compile inside a request's step (seconds; flint_engine/late_compiles.py counts
them). Here, on CPU, Triton's interpreter runs the fused kernels, and each launch's specialisation is computed with
Triton's rules (pointer alignment to 16 bytes; an integer equal to 1 or a multiple of 16, unless the kernel says
`do_not_specialize`; constexpr values; launch options). The warm-up's set must contain every launch of a mixed
serving workload, except the kernels of decode batches, which the CUDA-graph capture compiles on a GPU (the sampler
runs outside the graphs, so its launches count in every step).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from flint_kernels import fast
from flint_kernels.dispatch import REFERENCE
from triton.runtime.interpreter import InterpretedFunction

from flint_engine.config import FULL, SLIDING, preset
from flint_engine.engine import LLMEngine
from flint_engine.engine_config import EngineConfig
from flint_engine.kv_cache_plan import plan_kv_cache
from flint_engine.model import FlintModel
from flint_engine.prefill_warmup import warm_up_prefill
from flint_engine.sampling_params import SamplingParams
from flint_engine.weights import random_weights

Signature = tuple[str, tuple[Any, ...], tuple[Any, ...]]


def specialisation(fn: InterpretedFunction, args: tuple, kwargs: dict) -> Signature:
    """What Triton would compile this launch as (kernel, per-argument key, launch options)."""
    names = fn.arg_names
    plain = set(fn.kwargs.get("do_not_specialize") or ())
    annotations = {k: str(v) for k, v in inspect.get_annotations(fn.fn).items()}
    values = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
    key: list[Any] = []
    for name in names:
        v = values.get(name)
        if "constexpr" in annotations.get(name, ""):
            key.append((name, v))
        elif isinstance(v, torch.Tensor):
            key.append((name, v.dtype, v.data_ptr() % 16 == 0))
        elif isinstance(v, int) and not isinstance(v, bool) and name not in plain:
            key.append((name, "== 1" if v == 1 else "% 16" if v % 16 == 0 else "", v >= 2**31))
        else:
            key.append((name, type(v).__name__))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
    return fn.fn.__name__, tuple(key), options


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Every interpreted launch's specialisation, tagged with the phase it first appeared in."""
    state: dict[str, Any] = {"phase": "warm-up", "seen": {}, "decode": False}
    real = InterpretedFunction.run

    def run(self: InterpretedFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if not state["decode"]:
            state["seen"].setdefault(specialisation(self, args, kwargs), state["phase"])
        return real(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", run)
    yield state


def test_serving_meets_no_kernel_variant_the_warm_up_did_not_run(launches: dict[str, Any]) -> None:
    cfg = preset("tiny").replace(
        num_hidden_layers=2, layer_types=(FULL, SLIDING), mlp_only_layers=(0,), sliding_window=7
    )
    model = FlintModel(random_weights(cfg, torch.float32, seed=3), fast.fast_kernels(REFERENCE))
    ec = EngineConfig(kv_cache_memory=8 * 2**20, max_num_batched_tokens=16, max_num_seqs=6, max_model_len=96)
    plan = plan_kv_cache(cfg, ec.kv_cache_memory, ec.block_size, ec.max_num_seqs, ec.prefill_tokens(False))
    engine = LLMEngine(model, None, ec, kv_plan=plan)
    # What the engine runs at start on a GPU (on CPU it skips the warm-up).
    warm_up_prefill(model, engine.cache, engine.prefill_tokens, ec.max_num_seqs, (ec.max_num_batched_tokens,))
    assert launches["seen"], "the fused kernels did not run in the interpreter"

    real_execute = engine.runner.execute

    def execute(chunks):  # decode batches replay CUDA graphs on a GPU: compiled at capture, not while serving
        batch, _ = engine.runner.build_batch(chunks)
        launches["decode"] = batch.is_decode
        q = [b - a for a, b in zip(batch.query_start, batch.query_start[1:])]
        kinds.add("decode" if batch.is_decode else "mixed" if 1 in q else "prefill")
        try:
            return real_execute(chunks)
        finally:
            launches["decode"] = False

    kinds: set[str] = set()
    engine.runner.execute = execute
    launches["phase"] = "serving"
    rng = random.Random(7)
    added = steps = 0
    while added < 6 or engine.has_unfinished():
        if added < 6 and len(engine.scheduler.running) + len(engine.scheduler.waiting) < ec.max_num_seqs:
            for _ in range(rng.choice((0, 1, 1, 3))):
                plen = rng.randint(1, 10) if rng.random() < 0.6 else rng.randint(11, 40)
                params = SamplingParams(
                    max_tokens=rng.randint(1, 5), temperature=rng.choice((0.0, 1.0)), top_k=20, ignore_eos=True
                )
                engine.add_request(f"r{added}", [rng.randrange(cfg.vocab_size) for _ in range(plen)], params)
                added += 1
        engine.step()
        steps += 1
    # A lone sampled request: batch size 1, where a column of per-row parameters is a contiguous view.
    engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=1.0, top_k=20, ignore_eos=True))
    late = sorted({sig[0] for sig, phase in launches["seen"].items() if phase == "serving"})
    assert kinds == {"decode", "mixed", "prefill"} and steps >= 8
    assert not late, f"kernels first launched while serving, with a shape the warm-up missed: {late}"
