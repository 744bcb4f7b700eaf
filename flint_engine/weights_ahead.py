"""A decode step's weights asked into L2 ahead of the kernels that read them, on a side stream of the CUDA graph.

At batch 1 each decode kernel is a latency chain: its programs request their weights only once they are resident,
which is after the kernel before them retires, so every launch pays DRAM's latency on its critical path (6-11 us a
kernel for 1-10 MB whose bytes take 1-3 us). Here small kernels on a second stream (op `l2_ahead`,
`l2_prefetch.prefetch_chunks`) ask L2 for a layer's static weights (q|k|v and o projections with the norms, the
router and the shared expert or dense MLP; never the routed experts, which the router picks just before they are
read) while the kernels before them run, so those kernels then read L2. Nothing in the step waits for the side
stream until the end of the forward pass.

Which parts, and from which point, is the tuning table's `weights_ahead` entry for the step's token count and
weight format (`WeightsAheadConfig`; no entry: nothing). `next_*` parts are asked for when a layer's MLP is next,
for the layer after it; `own_*` when a layer's q|k|v projection is queued, for that layer. Only while a CUDA graph is
captured (the decode graphs): an eager step would pay the side launches on the host.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

import torch
from flint_kernels import tuning
from flint_kernels.configs import WeightsAheadConfig
from flint_kernels.l2_prefetch import chunk_table
from flint_kernels.linear import NVFP4Weight

from .weights import DenseMLPWeights, FlintWeights, LayerWeights, MoEWeights, Projection

log = logging.getLogger(__name__)

PARTS = ("qkv", "o", "mlp")
# Lines a side-stream program asks for, the sizes tables are made for (`WeightsAheadConfig.chunk_lines` picks).
CHUNKS = (256, 512, 1024, 2048, 4096)


def _projection_tensors(w: Projection | None) -> list[torch.Tensor]:
    if w is None:
        return []
    if isinstance(w, tuple):
        return [t for part in w for t in _projection_tensors(part)]
    if isinstance(w, NVFP4Weight):
        return [w.qweight, w.scales, w.global_scale]
    return [w]


def layer_tensors(lw: LayerWeights, part: str) -> list[torch.Tensor]:
    """The tensors of one part (`PARTS`) of `lw` that every decode step reads, whatever the routing: "qkv" the q|k|v
    projection with the layer's norms and sinks, "o" the o projection, "mlp" the router and the shared expert, or
    the dense MLP."""
    if part == "qkv":
        return [*_projection_tensors(lw.qkv), lw.input_norm, lw.post_norm, lw.q_norm, lw.k_norm, lw.sinks]
    if part == "o":
        return _projection_tensors(lw.o)
    if part != "mlp":
        raise ValueError(f"unknown part {part!r}; known: {', '.join(PARTS)}")
    mlp = lw.mlp
    dense: DenseMLPWeights | None = mlp.shared if isinstance(mlp, MoEWeights) else mlp
    found = [mlp.router] if isinstance(mlp, MoEWeights) else []
    if dense is not None:
        found += _projection_tensors(dense.gate_up) + _projection_tensors(dense.down)
    return found


class WeightsAhead:
    """Per set of parts and chunk size, one chunk table of every layer's lines with each layer's rows in it (built
    once, before any capture: a graph cannot copy from the host; a fork launches on a slice of it), and the side
    stream that asks L2 for them: one launch a fork point a layer."""

    def __init__(self, weights: FlintWeights, launch: Callable[[torch.Tensor], None]) -> None:
        self.device = weights.device
        self.nvfp4 = any(isinstance(lw.qkv, NVFP4Weight) for lw in weights.layers)
        self._launch = launch
        subsets = [frozenset(c) for n in range(1, len(PARTS) + 1) for c in itertools.combinations(PARTS, n)]
        # (parts, lines) -> (table, row offsets of each layer and the end)
        self._tables: dict[tuple[frozenset[str], int], tuple[torch.Tensor, list[int]]] = {}
        for parts in subsets:
            tensors = [[t for p in PARTS if p in parts for t in layer_tensors(lw, p)] for lw in weights.layers]
            for lines in CHUNKS:
                per_layer = [chunk_table(ts, torch.device("cpu"), lines) for ts in tensors]
                offsets = list(itertools.accumulate((len(t) for t in per_layer), initial=0))
                self._tables[parts, lines] = (torch.cat(per_layer).to(self.device), offsets)
        self._side = torch.cuda.Stream(self.device)
        self._config = WeightsAheadConfig()
        self._chunk = CHUNKS[0]
        self._logged: set[tuple[int, WeightsAheadConfig]] = set()
        self._forked = False
        self.last_forks = 0  # side launches the last captured forward pass made

    def _layer_table(self, parts: frozenset[str], lines: int, layer: int) -> torch.Tensor:
        table, offsets = self._tables[parts, lines]
        return table[offsets[layer] : offsets[layer + 1]]

    def layer_bytes(self, *parts: str) -> list[int]:
        """Bytes each layer's `parts` ask for (whole 128-byte lines)."""
        _, offsets = self._tables[frozenset(parts), CHUNKS[0]]
        return [
            int(self._layer_table(frozenset(parts), CHUNKS[0], i)[:, 1].sum()) * 128 for i in range(len(offsets) - 1)
        ]

    def begin(self, tokens: int) -> bool:
        """Take the table's config for a forward pass of `tokens` tokens; whether it asks for anything now (only
        while a CUDA graph is captured)."""
        if not torch.cuda.is_current_stream_capturing():
            return False
        self.last_forks = 0
        self._config = tuning.tuned("weights_ahead", WeightsAheadConfig(), self.device, tokens=tokens, nvfp4=self.nvfp4)
        # The largest prepared chunk size not above the table's.
        self._chunk = max([c for c in CHUNKS if c <= self._config.chunk_lines], default=CHUNKS[0])
        if self._config.parts_on and (tokens, self._config) not in self._logged:
            self._logged.add((tokens, self._config))
            log.info("decode graph of %d tokens asks L2 ahead for %s, %d lines a side program (tuning table's "
                     "weights_ahead)", tokens, ", ".join(self._config.parts), self._chunk)  # fmt: skip
        return self._config.parts_on

    def _fork(self, layer: int, parts: frozenset[str]) -> None:
        if not parts or layer >= len(self._tables[parts, self._chunk][1]) - 1:
            return
        table = self._layer_table(parts, self._chunk, layer)
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            self._launch(table)
        self._forked = True
        self.last_forks += 1

    def after_qkv(self, layer: int) -> None:
        """`layer`'s q|k|v projection is queued."""
        cfg = self._config
        self._fork(layer, frozenset(p for p, on in (("o", cfg.own_o), ("mlp", cfg.own_mlp)) if on))

    def before_mlp(self, layer: int) -> None:
        """`layer`'s attention block is queued, its MLP is next."""
        cfg = self._config
        on = (("qkv", cfg.next_qkv), ("o", cfg.next_o), ("mlp", cfg.next_mlp))
        self._fork(layer + 1, frozenset(p for p, o in on if o))

    def join(self) -> None:
        """The main stream waits for the side stream (a captured graph must end with every stream joined)."""
        if self._forked:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            self._forked = False
