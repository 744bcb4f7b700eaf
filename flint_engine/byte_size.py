"""Byte sizes as people write them in settings and flags: 268435456, "256MiB", "8 GiB", "8Gi", "2GB", "1.5G".

Binary units (KiB/Ki, MiB/Mi, GiB/Gi, TiB/Ti) are powers of 1024; decimal ones (KB/K, MB/M, GB/G, TB/T) powers of
1000, as Kubernetes reads its quantities.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "ki": 2**10,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mi": 2**20,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gi": 2**30,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "ti": 2**40,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_byte_size(value: int | float | str) -> int:
    """Bytes of `value` (an integer, or a number with a unit); ValueError naming the problem otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte size")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not a whole number of bytes")
        return int(value)
    match = _SIZE.fullmatch(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{value!r} is not a byte size (examples: 268435456, 256MiB, 8GiB, 2GB)")
    size = float(match.group(1)) * _UNITS[unit]
    if not size.is_integer():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(size)
