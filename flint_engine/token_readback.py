"""Tokens sampled on the device on their way to the host.

The copy is queued as soon as the tokens are drawn, into pinned memory, and reading waits for that copy only. A
plain `.tolist()` of the device tensor would queue its copy behind everything launched since, so with a decode step
launched ahead it would wait for that next step too, and the host work it was meant to hide would run serially."""

from __future__ import annotations

import torch

from .staging_buffer import to_device


class TokenReadback:
    def __init__(self, tokens: torch.Tensor) -> None:
        self.device = tokens  # what a step launched ahead reads as its input ids
        self._ready: torch.cuda.Event | None = None
        if tokens.is_cuda:
            self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._host.copy_(tokens, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = tokens

    def device_rows(self, rows: list[int]) -> torch.Tensor:
        """The device tokens of `rows` (ascending), without waiting for the device (the index goes over pinned)."""
        if len(rows) == self.device.shape[0]:
            return self.device
        return self.device.index_select(0, to_device(torch.tensor(rows, dtype=torch.int64), self.device.device))

    def tolist(self) -> list[int]:
        """The tokens, once their step has run (waits for it, not for steps queued after it)."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()
