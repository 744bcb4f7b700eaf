"""Launch parameters of the Triton kernels: the dataclasses that the kernels take and tuning tables fill in.

The kernel modules compute a portable default for each call (correct on any GPU) and `tuning.tuned` replaces the
fields a device's table sets. Fields marked POW2 must be powers of two (Triton's block shapes and warp counts); a
table that breaks that is refused when it loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

POW2 = {"power_of_two": True}
# Portable default of `MoEPaths.dequant_min_tokens` (the engine's activation reserve reads it too).
DEQUANT_MIN_TOKENS = 4096


@dataclass(frozen=True)
class TileConfig:
    """One launch configuration of the linear kernel (`gemv_triton`)."""

    block_n: int = field(metadata=POW2)
    block_m: int = field(metadata=POW2)
    block_k: int = field(metadata=POW2)
    use_dot: bool
    num_warps: int = field(metadata=POW2)
    num_stages: int
    words: bool = False  # tensor-core NVFP4 from int32 nibble planes: fewer ops, but Triton 3.6 fails to compile it
    packed: bool = False  # tensor-core NVFP4 as packed BF16 pairs scaled by FMA.BF16X2 (BF16 x; PTX, sm_80+)
    # NVFP4, BF16 x of at most 64 rows, no fused norm: `nvfp4_mma_triton.linear` instead (mma.sync on weights decoded
    # in PTX; 9-64 rows on its rows kernel, four or eight groups of 8 rows a launch; num_warps from here, its own
    # split-K; BF16 or FP32 out).
    mma: bool = False
    # With mma: its 16-byte loads (`nvfp4_mma_triton`'s VEC kernels, built after Nsight Compute found the MMA kernels
    # L1-bound; on the H200 the lm_head at 8 rows 128 -> 76 us, whole step b8 -5.8%, 2026-12-02).
    mma_vec: bool = False
    # With mma: the K splits of its launch (0: its own choice, ~4 programs an SM). At 33-64 rows that choice splits
    # the o projection 16 ways (19.7 -> 22.1 us at 64 rows against the tensor-core tiles); 8 splits win alone (16.4
    # us) but in the whole step 2 and 4 lost and 8 was even (H200, twenty-second session), so no table sets it.
    mma_split_k: int = 0
    # With mma at 9-32 rows: 32 weight rows a warp whose two tiles share each K step's x loads
    # (`nvfp4_mma_triton._nvfp4_mma_wide_kernel`): there a warp's x loads are ~7x its weight bytes. H200 (thirty-second
    # session): the lm_head at 32 rows 218 -> 138 us, o_proj 13.9 -> 11.4, qkv 13.6 -> 12.4; whole step b32 10.83 ->
    # 10.68 ms, b16 7.79 -> 7.82; installed at 17-32 rows in the thirty-third (b24 -0.8%, b32 -1.6%).
    mma_wide: bool = False
    # With mma: read the weight's ready scale bytes where it has them (`nvfp4_mma_scales`, made at load where the
    # device's table sets this): each scale pair in one multiply-add instead of the E4M3 decode, 11-14% fewer
    # instructions in the K loops (sm_90 SASS, thirty-third session). H200 whole step with every MMA entry reading
    # them (thirty-fourth session): NVFP4 b32 9.87 -> 9.35 ms, b64 14.61 -> 13.97, b1-b16 within 0.5%.
    mma_ready: bool = False
    # With mma: read the weight's ready codes where it has them (`nvfp4_mma_codes`, made at load where the device's
    # table sets this; ~20 GB beside the codes on the full NVFP4 model): each word of 8 codes decoded in 8 integer
    # instructions instead of 13, 15-22% fewer instructions in the K loops, 31% in the MoE gate_up's (whose ready loop
    # also takes two steps an iteration; sm_90 SASS, thirty-eighth session). Not yet measured on a GPU. The weights
    # asked into L2 ahead (`weights_ahead`) are the engine's codes: an entry for a batch whose projections run here
    # would ask for bytes no kernel then reads (today's H200 entry is for 1 token, where the FMA path runs them).
    mma_ready_codes: bool = False
    # At M == 1 (FMA tiles), when the op table has `add_rms_norm_linear`: the input add + RMSNorm as this GEMV's
    # prologue, every program normalising the row itself (one launch fewer a layer). H100 (forty-fifth session),
    # whole step at 1K context: BF16 b1 -1.7% (2.826 -> 2.778 ms), NVFP4 b1 +12%: 110 registers instead of 96 put its
    # 640 programs in two waves, and capped at 96 (one wave) it still lost 6.7% (forty-sixth session), the row's
    # reduction sitting before weights that NVFP4 reads 3.6x faster. So the table sets it for BF16's q|k|v only.
    norm_prologue: bool = False


@dataclass(frozen=True)
class MoEConfig:
    """Tiles of one MoE path (gate_up: BLOCK_I columns of gate and of up; down: BLOCK_N output columns)."""

    block_m: int = field(metadata=POW2)
    gu_block_i: int = field(metadata=POW2)
    gu_block_k: int = field(metadata=POW2)
    dn_block_n: int = field(metadata=POW2)
    dn_block_k: int = field(metadata=POW2)
    use_dot: bool
    num_warps: int = field(metadata=POW2)
    num_stages: int
    words: bool = False  # tensor-core NVFP4 from int32 nibble planes (Triton 3.6 fails to compile it)
    packed: bool = False  # tensor-core NVFP4 as packed BF16 pairs scaled by FMA.BF16X2 (BF16 x; PTX, sm_80+)
    # Decode path, shared expert apart. FMA tiles (NVFP4): gate_up expert-major, one program per (I-tile, expert),
    # each weight decoded once for two of the expert's pairs at a time. Tensor-core tiles (BF16 or NVFP4): both
    # launches grouped by expert without sorting (blocks of BLOCK_M pairs found in the ids), then the slot reduce.
    expert_major: bool = False
    # With expert_major on tensor cores: the down launch also sums each token's slots (a counter per token and
    # output tile, the last arrival adds), so the separate slot-reduce launch goes, and the shared expert folds in.
    # Slower on the H200 (BF16 b32 16.0 vs 13.7 ms, 2026-11-30): kept opt-in for other GPUs' tables.
    slots_in_down: bool = False
    # With expert_major on the FMA path (NVFP4, BF16 x, on a GPU): the gate_up launch on `nvfp4_mma_moe_triton`'s
    # mma.sync kernel (the weights decoded in PTX into each thread's own fragments, 8 of the expert's pairs an MMA)
    # instead of two pairs a decode.
    mma: bool = False
    # With mma: that gate_up kernel loads each K step while the previous one's MMAs run (`nvfp4_mma_triton`'s
    # PREFETCH; on the H200 faster at 1-2 and 64 tokens, slower for the down and the linear, 2026-12-02).
    mma_prefetch: bool = False
    # On the FMA decode path with the shared expert apart (NVFP4, BF16 h, on a GPU, no fused add+RMSNorm): the down
    # launch on the MMA kernel, expert-major (y per pair, then the slot-reduce launch), whichever gate_up ran.
    mma_down: bool = False
    # The MMA gate_up and down with 16-byte loads (as TileConfig.mma_vec; on the H200 whole step b64 -8%, and the
    # gate_up in 8 warps ahead of the FMA one from 25 tokens, 2026-12-02).
    mma_vec: bool = False
    # With mma and mma_vec: the gate_up also asks L2 for its codes this many K steps ahead (even; 0: off). On the
    # H200 2 steps from 25 tokens: b32 -3.8%, b64 -3.5% (twenty-second session).
    mma_l2_ahead: int = 0
    # With mma_down and mma_vec: the down also asks L2 for its codes, 1: two K steps ahead in the K loop, 2: all of
    # a tile's before the PDL wait, for experts with pairs (0: off). On the H200 2 from 9 tokens: b16 -1.1%, b64
    # -3.2%; 1 even to -1.3% (twenty-second session).
    mma_down_l2: int = 0
    # With mma and mma_vec: the gate_up's warps split K in this many parts as well as the columns (a power of two
    # dividing num_warps; 1: off), so each warp's chain of dependent K steps is that many times shorter; the parts
    # are summed across warps in order. Built in the twenty-third session, not yet measured.
    mma_warp_k: int = 1
    # With mma and mma_vec (not with mma_warp_k): the gate_up with 16 columns a warp, two weight tiles whose MMAs
    # share each K step's x loads (`nvfp4_mma_moe_triton._moe_gate_up_mma_wide_kernel`): Nsight Compute put the MMA MoE
    # kernels at 75-90% of the L1's throughput, their x loads first (thirty-second session), and the linear's wide
    # tiles took lm_head at 32 rows 218 -> 138 us. On the H200 with mma_down_wide (thirty-third session): b24 -3.8%,
    # b32 -4.5%, b64 -6.8%; from 9 tokens (the wide MMA gate_up instead of the FMA one at 9-16) b12 +2.3%.
    mma_wide: bool = False
    # With mma_down and mma_vec: the down with 32 rows a warp, two tiles sharing each K step's h loads (alone on the
    # H200: b16 -1.1%, b32 -2.2%, b64 -6.0%; kernel at 64 tokens 81.9 -> 62.1 us).
    mma_down_wide: bool = False
    # With mma / mma_down: read the experts' ready scale bytes where they have them (TileConfig.mma_ready).
    mma_ready: bool = False
    # With mma / mma_down: read the experts' (and with mma_shared the shared expert's) ready codes where they have
    # them (TileConfig.mma_ready_codes).
    mma_ready_codes: bool = False
    # With mma, mma_down, mma_vec, mma_wide and mma_down_wide: the shared expert runs inside those two launches, in
    # programs of its own (`nvfp4_mma_moe_triton`'s shared twins), instead of as two linears and a SiLU-and-mul beside
    # them: at NVFP4 batch 32 on the H200 those took ~0.85 of the step's 9.2 ms, 94 launches of ~9 us for 6 MB each
    # (thirty-fourth session's profile). On the H200 with mma_perm_h from 9 tokens (thirty-fifth session): b16 -4.7%,
    # b32 -3.3%, b64 -3.5%.
    mma_shared: bool = False
    # With mma_shared: h (and the shared expert's) kept in the MMA's order (`nvfp4_mma_triton.perm_columns`), so the
    # down's K loop takes its words as they are: no PRMT, 16 of a K step's 371 instructions for 128 weight values a
    # thread (the two tiles already share them; sm_90 SASS with ready scales, Triton 3.9). On the H200 (thirty-fifth
    # session) b32 8.975 -> 8.906 ms, b64 13.695 -> 13.431 on top of mma_shared; the same bits.
    mma_perm_h: bool = False
    # With mma_shared: the shared expert's programs first in both launches' grids (else last). With them the b32
    # gate_up went 70.2 -> 74.7 us a layer and the down 40.6 -> 44.7 for ~3.5 MB more (thirty-fifth session's
    # profile): the down's shared programs take K_S = 2K and ran as the launch's last. On the H200 (thirty-sixth
    # session) b9 5.823 -> 5.678 ms, b16 7.160 -> 7.022, b32 8.845 -> 8.751, b64 13.225 -> 12.990; the same bits.
    mma_shared_first: bool = False
    # On the FMA decode path (not use_dot, block_m 1, no fused add+RMSNorm): the down launch runs a program per
    # (output tile, token) that reads all of the token's experts' rows (and the folded shared expert's) before the
    # PDL wait and adds the slots in registers in slot order (`moe_down_slots_triton`), instead of a program per
    # (tile, pair) meeting on a counter whose last arrival adds them. Built for batch 1-2 (forty-first session),
    # where the down took 9.1 (NVFP4) and 11.4 us (BF16) a layer for ~1 us of weights.
    dn_token_slots: bool = False
    # With dn_token_slots: the shared expert's INTER-wide K parts in the slot rows that pad TOPK to a power of two
    # (Flint: 6 slots + 2 parts = 8), so the padding rows, decoded for nothing before, do the shared expert's work
    # in the routed tiles (forty-seventh session, built without a GPU).
    dn_shared_slots: bool = False


@dataclass(frozen=True)
class MoEPaths:
    """Which MoE path a batch of T tokens takes (`moe_triton`)."""

    # Up to this many tokens the per-pair decode kernels run; above it the sorted grouped GEMM.
    decode_max_tokens: int
    # Up to this many tokens the shared expert runs inside the decode launches (each token then reads the shared
    # weights on its own, so from some batch three separate launches that read them once win).
    shared_fold_max_tokens: int
    # From this many tokens the grouped path runs NVFP4 experts from BF16 copies made for the call (one exact
    # dequantising pass over all experts, then the BF16 grouped GEMM) instead of decoding NVFP4 in registers beside
    # the MMAs. H200, T = 8192: 2.84 ms in registers vs ~0.55 + 1.17 ms. Costs a transient copy of one layer's
    # experts (1.6 GB for Flint), which the engine's activation reserve counts.
    dequant_min_tokens: int = DEQUANT_MIN_TOKENS
    # From this many tokens (0: never) the grouped path runs BF16 experts on torch's grouped GEMM instead
    # (`moe_grouped_gemm`; CUTLASS beats our grouped kernels at long prefills on the H200, not at 2K tokens).
    grouped_gemm_min_tokens: int = 0
    # From this many tokens (0: never) the grouped path runs on our TMA-fed tensor-core launches
    # (`moe_grouped_tma_triton`: BF16 experts, or NVFP4's copies) where torch's grouped GEMM does not take the batch.
    tma_min_tokens: int = 0
    # From this many tokens (0: never) up to `tma_nvfp4_max_tokens` (0: any) NVFP4 experts run on those launches'
    # twins that decode NVFP4 in registers, with no BF16 copy made (ahead of `dequant_min_tokens`). The decode slows
    # the main loop, so at long prefills the copies win again (H200: 0.81 against 0.99 ms a layer at 2,048 tokens,
    # 2.08 against 1.48 at 8,192).
    tma_nvfp4_min_tokens: int = 0
    tma_nvfp4_max_tokens: int = 0
    # On the decode path, a shared expert that runs apart (above `shared_fold_max_tokens`) runs on a side stream
    # beside the routed launches (CUDA only), joined before its output is added: its small GEMMs' latency leaves the
    # step's chain of launches.
    shared_beside: bool = False


@dataclass(frozen=True)
class MoETmaConfig:
    """Tiles of the TMA-fed grouped MoE launches (`moe_grouped_tma_triton`); both take one block table of at most
    BLOCK_M sorted rows of one expert a block."""

    block_m: int = field(default=64, metadata=POW2)
    gate_up_block_n: int = field(default=128, metadata=POW2)  # columns of gate and as many of up
    gate_up_block_k: int = field(default=64, metadata=POW2)
    gate_up_warps: int = field(default=4, metadata=POW2)
    gate_up_stages: int = 4
    # x's rows loaded by pointer from the unsorted activations through each row's token (no sorted copy of x made);
    # otherwise from that copy through a TMA descriptor.
    gather: bool = True
    down_block_n: int = field(default=128, metadata=POW2)
    down_block_k: int = field(default=64, metadata=POW2)
    down_warps: int = field(default=4, metadata=POW2)
    down_stages: int = 4
    # NVFP4 decoded in the launches two values at a time (one FMA.BF16X2 a pair, `gemv_triton.nvfp4_packed_weights`
    # in K order) instead of byte planes.
    packed_decode: bool = False


@dataclass(frozen=True)
class AttentionDecodeConfig:
    """Launch parameters of the split-KV decode attention kernel (`attention_triton`)."""

    block_n: int = field(default=128, metadata=POW2)  # keys per tile
    num_warps: int = field(default=4, metadata=POW2)
    num_stages: int | None = 2  # pipeline depth; None: Triton's default
    min_keys_per_split: int = 256  # fewest keys worth a split of their own
    max_splits: int = field(default=64, metadata=POW2)
    # Elements of the [heads, splits, D] FP32 chunk the last-arriving split loads per merge step: more loads in
    # flight, more registers (32K spilled on the H200).
    merge_elems: int = field(default=16384, metadata=POW2)
    # Key tiles of each split requested into L2 before waiting for the previous kernel (PDL); 0: none.
    prefetch: int = 0
    # Merge the splits in a launch of their own (`_decode_merge_kernel`, one program a sequence and KV head) rather
    # than in the last split to arrive on a counter: a PDL boundary in place of the barrier and acq_rel atomic.
    combine_launch: bool = False


@dataclass(frozen=True)
class AttentionPrefillConfig:
    """Launch parameters of the varlen prefill attention kernel (`attention_triton`)."""

    block_n: int = field(default=64, metadata=POW2)  # keys per tile
    max_block_m: int = field(default=64, metadata=POW2)  # the largest row tile (queries x heads)
    num_warps: int = field(default=8, metadata=POW2)  # for row tiles of 128 or more; smaller tiles take 4
    num_stages: int | None = 3  # pipeline depth; None: Triton's default
    # Launch the query tiles last-first: in a causal chunk the last tiles see the most keys, so the grid's tail is
    # then the short tiles instead of the longest ones.
    longest_first: bool = False
    # Full layers only: a prompt of this many tokens or more with no cached prefix runs on torch's cuDNN attention
    # (`attention_cudnn`) instead of this kernel; 0: never.
    cudnn_min_tokens: int = 0


@dataclass(frozen=True)
class WeightsAheadConfig:
    """Which of a layer's static weights (never the routed experts) a decode graph asks L2 for on a side stream, and
    when (`l2_prefetch.prefetch_chunks`, `flint_engine.weights_ahead`); everything off by default."""

    # When layer i's MLP is next (its attention block and router queued): layer i+1's q|k|v projection with its
    # norms and sinks; its o projection; its MLP's static parts (the router and shared expert, or the dense MLP).
    next_qkv: bool = False
    next_o: bool = False
    next_mlp: bool = False
    # When layer i's q|k|v projection is queued: layer i's o projection; its MLP's static parts.
    own_o: bool = False
    own_mlp: bool = False
    # 128-byte lines a side-stream program asks for: fewer, longer programs hold fewer of the SMs' slots that the
    # step's kernels want (`flint_engine.weights_ahead.CHUNKS` lists the sizes it prepares tables for).
    chunk_lines: int = field(default=256, metadata=POW2)

    @property
    def parts(self) -> tuple[str, ...]:
        """The names of the parts it asks for (the boolean fields set)."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is True)

    @property
    def parts_on(self) -> bool:
        """Whether it asks for anything."""
        return bool(self.parts)


@dataclass(frozen=True)
class RouterSmallConfig:
    """How the small-batch router (`router_triton`, up to its SMALL_BATCH tokens) ends."""

    # False: its programs meet on an arrival counter and the last one runs the top-k (one launch). True: the
    # programs store their logits and end, and a one-program launch of its own runs the top-k after its PDL wait
    # (a kernel boundary in place of the barrier, the acq_rel atomic and the last arrival's wait on them).
    tail_launch: bool = False


@dataclass(frozen=True)
class RouterTilesConfig:
    """Launch parameters of the many-token router kernel (`router_triton`, above its small-batch limit)."""

    block_t: int = field(metadata=POW2)  # tokens per tile (>= 16: tensor cores)
    # Experts per tile; below the padded expert count the top-k runs in the token block's last tile to arrive.
    block_e: int = field(metadata=POW2)
    block_k: int = field(metadata=POW2)
    num_warps: int = field(metadata=POW2)
    num_stages: int
    # K splits (each a program of its own, the last arrival adds the partial logits); 0: as many as fill the GPU
    # for one token block (`split_k_triton.choose_split_k`), none for several.
    split_k: int = 0
