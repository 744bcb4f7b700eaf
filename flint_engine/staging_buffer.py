"""A host buffer refilled every step and copied to the device without blocking the host.

Pinned on a GPU, so the copy is a true asynchronous transfer; refilling waits (normally not at all) until the last
copy out of it has run, since that copy reads the host memory when the GPU gets to it, not when it is queued."""

from __future__ import annotations

import numpy as np
import torch


class StagingBuffer:
    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=cuda)
        self._copied = torch.cuda.Event() if cuda else None

    def values(self) -> np.ndarray:
        """The host memory to fill, once the last copy out of it has run."""
        if self._copied is not None:
            self._copied.synchronize()
        return self.host.numpy()

    def copy_to(self, dst: torch.Tensor) -> torch.Tensor:
        """Queue the copy of the buffer into `dst` (same shape) on the current stream."""
        dst.copy_(self.host, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return dst
