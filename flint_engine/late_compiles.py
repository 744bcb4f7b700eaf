"""Triton kernel specialisations first met after the warm-up, while serving.

Each one stalls the step that meets it: a compile (seconds) or at best a load from Triton's disk cache. The warm-up
(`prefill_warmup`, CUDA-graph capture) is meant to leave none, so every one is logged as a warning that names the
kernel and its specialisation, and counted (`flint:late_kernel_compiles` in /metrics). Triton calls its JIT cache
hook on every in-process cache miss, before compiling; the hook is process-wide, so the watch is too.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from flint_kernels.jit_cache_hook import runtime_knobs

log = logging.getLogger(__name__)


def describe(specialization_data: str) -> str:
    """One line naming what makes a kernel variant: its constexpr values, the arguments Triton specialised (divisible
    by 16, equal to 1) and the launch options. Triton's own `repr` does not show them (3.6 and 3.9 print the first
    argument with an empty type)."""
    try:
        d = json.loads(specialization_data)
        names = list(d["signature"])
        consts = ", ".join(f"{names[k[0]]}={v}" for k, v in zip(d["constant_keys"], d["constant_vals"]) if len(k) == 1)
        attrs = ", ".join(
            f"{names[k[0]]}:{'/'.join(f'{a}={v}' for a, v in vals)}"
            for k, vals in zip(d["attrs_keys"], d["attrs_vals"])
            if len(k) == 1 and vals
        )
        opts = d.get("options", {})
        launch = ", ".join(f"{o}={opts[o]}" for o in ("num_warps", "num_stages", "launch_pdl") if o in opts)
        return f"{consts}; specialised {attrs or 'nothing'}; {launch}"
    except (ValueError, KeyError, IndexError, TypeError):  # another Triton's record: show it as it is
        return " ".join(str(specialization_data).split())[:2000]


@dataclass
class LateCompile:
    kernel: str
    specialisation: str  # constexprs, specialised arguments and launch options (`describe`)
    key: str  # Triton's cache key: each argument's type and specialisation (alignment, == 1), the constexprs


@dataclass
class LateCompileWatch:
    events: list[LateCompile] = field(default_factory=list)
    armed: bool = False
    _previous: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return len(self.events)

    def since(self, count: int) -> list[LateCompile]:
        """The events after the first `count` (take `count` before a phase, read the phase's compiles after it)."""
        return self.events[count:]

    def hook(self, **kwargs: Any) -> bool | None:
        """Triton's `jit_cache_hook`: record the miss, then defer to any hook installed before ours."""
        if not kwargs.get("is_manual_warmup", False):
            fn = kwargs.get("fn")
            name = getattr(fn, "name", None) or str(fn)
            data = (kwargs.get("compile") or {}).get("specialization_data")
            spec = describe(data) if data else str(kwargs.get("repr", ""))
            with self._lock:
                self.events.append(LateCompile(name.rsplit(".", 1)[-1], spec, str(kwargs.get("key", ""))))
            log.warning(
                "Triton compiles %s after the warm-up (this step stalls; the warm-up misses this shape): %s", name, spec
            )
            log.debug("Triton cache key of %s: %s", name, kwargs.get("key"))
        return self._previous(**kwargs) if self._previous is not None else None

    def arm(self) -> bool:
        """Start watching (idempotent); False when this Triton has no JIT cache hook (before 3.4)."""
        knobs = runtime_knobs()
        if knobs is None:
            return False
        if not self.armed:
            self._previous = knobs.jit_cache_hook
            knobs.jit_cache_hook = self.hook
            self.armed = True
        return True

    def disarm(self) -> None:
        knobs = runtime_knobs()
        if self.armed and knobs is not None:
            knobs.jit_cache_hook = self._previous
        self.armed = False
        self._previous = None


# One per process: Triton's hook is process-wide.
WATCH = LateCompileWatch()
