"""What the batch-1 router's counter tail costs a decode step: an upper bound for any design that removes it.

    python benchmarks/router_tail_probe.py --formats nvfp4 bf16 --batches 1 --contexts 1024 --prefill 0 \
        --check-steps 0 --no-plain-timing --reserve-gib 2 --ab-tuning-file /tmp/skip_tail.json

runs `benchmarks/decode.py` with those arguments, where the variant's graphs (captured while FLINT_TUNING_FILE names
a file ending in skip_tail.json: give it a copy of the shipped table, so only the router differs) launch a router
without its tail. Its programs store their logits and end: no barrier, no acq_rel atomic, no last program
reloading the logits for the top-k; program 0 stores fixed, valid expert ids and weights instead. The routing is
then wrong, but the bytes a step reads are the same. The probe builds that router from `router_triton`'s source
in a file of its own (imported as `flint_kernels.router_tail_probe`), leaving the project's files untouched.
Both arms end the router on its counter whatever the table says (`RouterSmallConfig.tail_launch` off): the shipped
table has taken the top-k into a launch of its own since the forty-fourth session, and the probe measures the tail.
Forty-third session, H100: NVFP4 b1 2.163 -> 2.007 ms, BF16 3.110 -> 2.971 (`decode_h100_router_skip_tail_ab_s43`).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from flint_kernels import router_triton
from flint_kernels.configs import RouterSmallConfig

VARIANT_SUFFIX = "skip_tail.json"
# The start of `_router_program`'s tail, which FIXED_IDS goes before.
TAIL = (
    "    if TAIL:\n        # The barrier orders all of this CTA's stores before the release; the program that sees the"
    " last arrival\n"
)
# A constexpr `if` around the early return: the shape the forty-third session's probe ran on the GPU.
FIXED_IDS = """    if TOP_K > 0:  # (router_tail_probe) no tail: program 0 stores fixed, valid ids and weights
        if tl.program_id(0) == 0:
            for t0 in range(0, num_tokens):
                for j in tl.static_range(TOP_K):
                    tl.store(out_ids_ptr + t0 * TOP_K + j, ((t0 * TOP_K + j) * 37 % num_experts).to(tl.int64))
                    tl.store(out_w_ptr + t0 * TOP_K + j, 1.0 / TOP_K)
        return
"""


def tailless_router(folder: Path) -> ModuleType:
    """`router_triton` with FIXED_IDS and a return before the tail of `_router_program`, imported from a file in
    `folder`."""
    source = inspect.getsource(router_triton)
    if source.count(TAIL) != 1:
        raise RuntimeError("router_triton's tail is not where this probe expects it; update TAIL")
    path = folder / "router_tail_probe.py"
    path.write_text(source.replace(TAIL, FIXED_IDS + TAIL))
    name = "flint_kernels.router_tail_probe"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton's JIT resolves the kernels' globals through their module
    spec.loader.exec_module(module)
    return module


class _Switch:
    """Stands in for `router_triton`'s one-launch router kernel: the tailless one while the variant table is set."""

    def __init__(self, shipped: object, tailless: object) -> None:
        self.shipped, self.tailless = shipped, tailless

    def __getattr__(self, name: str) -> object:  # what else is asked of the kernel (the precompile's checks)
        return getattr(self.shipped, name)

    def __getitem__(self, grid: tuple) -> object:
        variant = os.environ.get("FLINT_TUNING_FILE", "").endswith(VARIANT_SUFFIX)
        return (self.tailless if variant else self.shipped)[grid]


def _counter_tail(*_: object, **__: object) -> RouterSmallConfig:
    return RouterSmallConfig(tail_launch=False)


def install(folder: Path) -> None:
    """Route `router_triton`'s batch-1 launches (with and without the add+RMSNorm) through `_Switch`, with the
    counter tail in both arms."""
    router_triton.small_config = _counter_tail
    probe = tailless_router(folder)
    for name in ("_router_kernel", "_router_norm_kernel"):
        setattr(router_triton, name, _Switch(getattr(router_triton, name), getattr(probe, name)))


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import decode

    with tempfile.TemporaryDirectory(prefix="flint-router-probe-") as tmp:
        install(Path(tmp))
        decode.main()


if __name__ == "__main__":
    main()
