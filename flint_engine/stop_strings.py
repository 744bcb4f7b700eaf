"""Incremental text with stop strings: matched across token boundaries, never emitted, text that might start a
stop string held back until it is decided."""

from __future__ import annotations


class StopStringText:
    def __init__(self, stop: list[str], include_stop: bool = False) -> None:
        self.stop = [s for s in stop if s]
        self.include_stop = include_stop
        self.text = ""
        self.emitted = 0
        self.stopped: str | None = None

    def _holdback(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def add(self, delta: str) -> str:
        """Append decoded text; return what may be emitted now. After a stop string, `stopped` is set."""
        if self.stopped is not None:
            return ""
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0) + 1)
        self.text += delta
        if self.stop:
            hit, where = None, len(self.text) + 1
            for s in self.stop:
                i = self.text.find(s, start)
                if i != -1 and i < where:
                    hit, where = s, i
            if hit is not None:
                self.stopped = hit
                end = where + len(hit) if self.include_stop else where
                self.text = self.text[:end]
                return self.flush()
        end = len(self.text) - self._holdback()
        out = self.text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return out

    def flush(self) -> str:
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out
