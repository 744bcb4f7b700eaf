"""Decode "graphs" for CPU tests: capture remembers the static buffers, replay reruns the reference model on what
they hold, so everything the engine does around a CUDA graph (buckets, padding rows, the per-step copies, the
tables copied only when they change, async decode's on-device inputs) runs for real without a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from flint_kernels.attention import AttnMeta

from flint_engine.cuda_graphs import DecodeGraphs, _Graph
from flint_engine.forward_batch import ForwardBatch


class HostReplay(DecodeGraphs):
    """Replay reads only the static device buffers, as a CUDA graph does: the host-side lengths the reference
    attention needs are rebuilt from them, and padding rows' stale or released table entries (never read by the
    fused kernels, whose tiles mask them) point at the scratch block instead."""

    def capture(self) -> None:
        vocab = self.model.config.vocab_size
        for ctx in self.context_buckets:
            for b in self.batch_buckets:
                inputs = self.static_inputs(b)
                batch = self._static_batch(b, ctx, inputs)
                logits = torch.zeros(b, vocab)

                def replay(s: ForwardBatch = batch, out: torch.Tensor = logits) -> None:
                    lens = s.attn.seq_lens_t.tolist()
                    now = ForwardBatch(
                        input_ids=s.input_ids, positions=s.positions, query_start=s.query_start, seq_lens=lens,
                        full_block_tables=s.full_block_tables.clamp(min=self.scratch_block),
                        sliding_block_tables=s.sliding_block_tables.clamp(min=self.scratch_block),
                        full_slots=s.full_slots, sliding_slots=s.sliding_slots, logits_indices=s.logits_indices,
                    )  # fmt: skip
                    now.attn = AttnMeta.build(now.query_start, lens, "cpu")
                    out.copy_(self.model.compute_logits(self.model.forward(now, self.cache)))

                graph = SimpleNamespace(replay=replay)
                self.graphs[(b, ctx)] = _Graph(graph, batch, logits, inputs)  # type: ignore[arg-type]
