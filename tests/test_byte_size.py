"""Byte sizes in settings and flags (`flint_engine.byte_size`)."""

from __future__ import annotations

import pytest

from flint_engine.byte_size import parse_byte_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("268435456", 268435456),
        ("256MiB", 256 * 2**20),
        ("256Mi", 256 * 2**20),
        ("8 GiB", 8 * 2**30),
        ("8gib", 8 * 2**30),
        ("1.5GiB", 3 * 2**29),
        ("2GB", 2 * 10**9),
        ("2G", 2 * 10**9),
        ("512k", 512_000),
        ("1TiB", 2**40),
        (" 64 B ", 64),
        (4096, 4096),
        (4096.0, 4096),
    ],
)
def test_sizes(text: str | int | float, size: int) -> None:
    assert parse_byte_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "8 GiBs", "eight", "-1GiB", "1e9", "0.3B", True, 1.5])
def test_refusals_name_the_value(text: object) -> None:
    with pytest.raises(ValueError, match="byte"):
        parse_byte_size(text)  # type: ignore[arg-type]
