"""`jit_cache_keys.settle`: Triton cache keys that do not depend on the order a process first hashed its kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# In a fresh process each (hashing state is per process), outside Triton's interpreter, where @triton.jit gives
# JITFunctions: hash some kernels first in the order given, settle, print every kernel's key.
PROBE = """
import json, sys
from flint_kernels import jit_cache_keys, sampling_triton, moe_triton, nvfp4_mma_triton
first = sys.argv[1]
if first == "callers":  # kernels before the helpers they call (what left Triton 3.6's keys incomplete)
    for fn in (sampling_triton._draw_kernel, sampling_triton._chunk_top_kernel, nvfp4_mma_triton._nvfp4_mma_kernel):
        fn.cache_key
elif first == "all":
    for fn in jit_cache_keys.jit_functions():
        fn.cache_key
passes = jit_cache_keys.settle()
keys = {fn._fn_name: fn.cache_key for fn in jit_cache_keys.jit_functions()}
print(json.dumps({"passes": passes, "keys": keys}))
"""


def _keys(first: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", PROBE, first], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_settled_keys_do_not_depend_on_what_was_hashed_first() -> None:
    """Callers hashed before their helpers, every function hashed in name order, nothing hashed: after `settle` every
    kernel has the same key in all three processes (the precompile workers and the engine meet the kernels in
    different orders and must agree, or the engine compiles again what the workers left in the cache)."""
    runs = {first: _keys(first) for first in ("callers", "all", "none")}
    keys = {first: run["keys"] for first, run in runs.items()}
    assert len(keys["none"]) > 50, "jit_functions found too few kernels"
    assert "flint_kernels.sampling_triton._draw_kernel" in keys["none"]
    assert keys["callers"] == keys["all"] == keys["none"]
    assert all(1 <= run["passes"] <= 8 for run in runs.values())
