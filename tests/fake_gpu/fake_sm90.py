"""Tell Triton the current device is an sm_90 GPU, so kernels compile (and precompile) on a machine without one.

Nothing can launch: the driver answers only what compiling asks (the target, device 0, a stream)."""

from __future__ import annotations

from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class FakeSm90Driver:
    """The part of Triton's driver interface that compiling and `JITFunction.preload` use."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


driver.set_active(FakeSm90Driver())
