"""Bearer-token authentication: keys from settings, `FLINT_API_KEYS` or a key file re-read when it changes."""

from __future__ import annotations

import hmac
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

ENV_KEYS = "FLINT_API_KEYS"
ENV_KEY_FILE = "FLINT_API_KEY_FILE"


class APIKeys:
    """The set of valid keys. Comparison is constant-time per key and always walks every key."""

    def __init__(self, keys: list[str] | None = None, key_file: str | None = None) -> None:
        self._static = [k for k in (keys or []) if k]
        env = os.environ.get(ENV_KEYS, "")
        self._static += [k.strip() for k in env.split(",") if k.strip()]
        self.key_file = key_file or os.environ.get(ENV_KEY_FILE) or None
        self._file_keys: list[str] = []
        self._mtime: float | None = None
        self._lock = threading.Lock()
        self._reload()

    def _reload(self) -> None:
        """Re-read the key file if it changed (rotation without restart)."""
        if not self.key_file:
            return
        try:
            mtime = Path(self.key_file).stat().st_mtime
        except OSError:
            log.error("API key file %s cannot be read: every request will be refused", self.key_file)
            self._file_keys, self._mtime = [], None
            return
        if mtime == self._mtime:
            return
        with self._lock:
            lines = Path(self.key_file).read_text().splitlines()
            self._file_keys = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
            self._mtime = mtime
        log.info("loaded %d API keys from %s", len(self._file_keys), self.key_file)

    @property
    def enabled(self) -> bool:
        return bool(self._static or self.key_file)

    def check(self, presented: str) -> str | None:
        """The matching key (used as the per-key identity), or None."""
        self._reload()
        match = None
        given = presented.encode()
        for key in [*self._static, *self._file_keys]:
            if hmac.compare_digest(given, key.encode()) and match is None:
                match = key
        return match
