"""OpenAI's `metadata` field (batches, conversations): up to 16 string pairs, keys of at most 64 characters, values
of at most 512."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field


def _checked(v: dict[str, str] | None) -> dict[str, str] | None:
    for key, value in (v or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise ValueError("metadata keys are at most 64 characters and values at most 512")
    return v


Metadata = Annotated[dict[str, str] | None, Field(max_length=16), AfterValidator(_checked)]
