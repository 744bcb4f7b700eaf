"""Tokens sampled on the device on their way to the host, with what is read beside them (their logprobs).

The copy is queued as soon as the tokens are drawn, into pinned memory, and reading waits for that copy only. A
plain `.tolist()` of the device tensor would queue its copy behind everything launched since, so with a decode step
launched ahead it would wait for that next step too, and the host work it was meant to hide would run serially."""

from __future__ import annotations

import torch

from .staging_buffer import to_device


class TokenReadback:
    """A step's tokens, and any tensors read with them (their logprobs), copied to pinned memory as they are made."""

    def __init__(self, tokens: torch.Tensor, extras: tuple[torch.Tensor, ...] = ()) -> None:
        self.device = tokens  # what a step launched ahead reads as its input ids
        self._ready: torch.cuda.Event | None = None
        if tokens.is_cuda:
            self._host, *self._extras = (self._pinned(t) for t in (tokens, *extras))
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host, self._extras = tokens, list(extras)

    @staticmethod
    def _pinned(t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host

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

    def extras(self) -> list[list]:
        """The tensors read with the tokens, as lists (after `tolist`, which waits for them)."""
        return [t.tolist() for t in self._extras]
