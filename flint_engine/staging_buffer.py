"""A host buffer refilled every step and copied to the device without blocking the host.

Pinned on a GPU, so the copy is a true asynchronous transfer. A copy reads the host memory when the GPU gets to it,
not when it is queued, so a refill must wait until the last copy out of the same memory has run. Two buffers take
turns: the copy of the step before last has run by the time the host fills the next one even when a step is
launched ahead (the last copy, queued behind the step in flight, may not have)."""

from __future__ import annotations

import numpy as np
import torch


class StagingBuffer:
    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, depth: int = 2) -> None:
        cuda = device.type == "cuda"
        self._hosts = [torch.zeros(shape, dtype=dtype, pin_memory=cuda) for _ in range(depth if cuda else 1)]
        self._copied = [torch.cuda.Event() if cuda else None for _ in self._hosts]
        self._turn = 0

    def values(self) -> np.ndarray:
        """The host memory to fill next (the other buffer than last time), once the last copy out of it has run."""
        self._turn = (self._turn + 1) % len(self._hosts)
        event = self._copied[self._turn]
        if event is not None:
            event.synchronize()
        return self._hosts[self._turn].numpy()

    def copy_to(self, dst: torch.Tensor) -> torch.Tensor:
        """Queue the copy of the buffer last returned by `values` into `dst` (same shape) on the current stream."""
        dst.copy_(self._hosts[self._turn], non_blocking=True)
        event = self._copied[self._turn]
        if event is not None:
            event.record()
        return dst


def host_for(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor `t` ready for a copy to `device` that does not wait for the stream: pinned for a GPU (PyTorch's
    caching host allocator keeps the memory until the copy out of it has run)."""
    return t.pin_memory() if device.type == "cuda" else t


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device`, through pinned memory to a GPU (a copy from pageable memory would wait for
    every step queued before it)."""
    return host_for(t, device).to(device, non_blocking=True)
