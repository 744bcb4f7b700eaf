"""The one error type checkpoint code raises: it names the file and, where there is one, the tensor."""

from __future__ import annotations


class CheckpointError(ValueError):
    def __init__(self, message: str, tensor: str | None = None, path: str | None = None) -> None:
        where = []
        if tensor:
            where.append(f"tensor '{tensor}'")
        if path:
            where.append(f"in {path}")
        super().__init__(f"{message}" + (f" ({', '.join(where)})" if where else ""))
        self.tensor = tensor
        self.path = path
