"""Programmatic dependent launch (PDL, Hopper and later): a decode kernel starts while its predecessor drains.

A batch-1 decode step is hundreds of small dependent kernels; without PDL each one is launched only after the
previous one has fully retired, so every boundary costs the launch and the CTA ramp-up. With PDL a kernel
launched with `launch_pdl=True` may start as soon as every program of the previous kernel has called
`gdc_launch_dependents` (or exited). Our kernels call `pdl_entry`: first `gdc_wait`, which blocks until the
previous grid has completed and its memory is visible, then `gdc_launch_dependents`, which lets the next kernel get
scheduled early.

What may run before `pdl_entry`: no writes to global memory, and reads only of what the immediately previous
kernel does not write. Because every kernel lets its successor launch only after its own wait, a kernel that has
started knows that all kernels before its predecessor have completed. So weights (never written), the KV cache of
earlier tokens, batch metadata copied before the step, and outputs of kernels two or more launches back (the
router's expert ids in the MoE down kernel) are read early: their memory latency overlaps the previous kernel.
Where nothing is read early, `pdl_entry` is the first statement. Kernels launched without PDL (PyTorch's) wait for full
completion as usual, so mixing them is safe, and CUDA-graph capture keeps the programmatic edges.

On by default on CUDA devices of compute capability 9.0 and above with a Triton that has the GDC ops;
`FLINT_PDL=0` turns it off (read per launch, so benchmarks can compare both in one process).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except ImportError:  # an older Triton: no PDL
    HAVE_GDC = False

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` are launched with PDL now."""
    if _INTERPRET or not HAVE_GDC or device.type != "cuda" or os.environ.get("FLINT_PDL", "1") == "0":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a kernel launch: the kernel's PDL constexpr and, when on, Triton's launch flag."""
    if enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def pdl_entry(PDL: tl.constexpr):
    """First statement of a PDL-launched kernel: wait for the previous grid, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
