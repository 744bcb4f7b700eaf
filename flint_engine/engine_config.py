"""Engine settings (what `flint-serve` and the Python API accept), with the checks that keep them sane."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Prefill-only steps on the fused GPU path. H200, BF16, an 8K prompt: 127.9 ms in one chunk against 206.4 ms in
# 2048-token chunks (docs/performance.md, ninth session): at 48 pairs an expert the grouped MoE runs at ~125 TFLOP/s,
# at 192 at ~280. The plain PyTorch path stays at max_num_batched_tokens (its attention materialises the scores).
IDLE_PREFILL_TOKENS_GPU = 8192


@dataclass
class EngineConfig:
    model: str | None = None  # checkpoint path (GGUF file or HF directory); None: the embedded default
    dtype: str = "auto"  # auto | bfloat16 | float32 (auto: bfloat16 on CUDA, float32 on CPU)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # Token budget of a step in which no running request has generated a token yet (prefill-only steps): a long
    # prompt alone runs in fewer, larger chunks, while requests that are decoding keep max_num_batched_tokens'
    # shorter steps (their inter-token latency). None: IDLE_PREFILL_TOKENS_GPU on the fused GPU path, else
    # max_num_batched_tokens; never below max_num_batched_tokens.
    idle_prefill_tokens: int | None = None
    max_model_len: int | None = None  # default: the checkpoint's context length
    kv_cache_memory: int | None = None  # bytes; default: a share of free GPU memory, or 512 MiB on CPU
    gpu_memory_utilization: float = 0.90
    enable_prefix_caching: bool = True
    max_waiting_requests: int = 256
    kernels: str = "auto"  # auto | reference | fast
    cuda_graphs: bool = True
    # With cuda_graphs on the fused GPU path: prefill and mixed steps of up to 4,096 tokens (or the prefill-only
    # step budget below that) on CUDA graphs too, every op but attention captured per token bucket
    # (flint_engine.step_graphs): an eager step's launches cost the host up to 15x its kernels' GPU time.
    step_graphs: bool = True
    prefill_warmup: bool = True  # on the fused GPU path: compile prefill kernels at start, not in the first requests
    # On the fused GPU path: compile the kernels the shipped manifest lists for this GPU and model in parallel
    # before the warm-up (flint_kernels.precompile); off: the warm-up compiles them one by one.
    precompile_kernels: bool = True
    # Decode on CUDA graphs: launch the next step before reading this one's tokens (they feed it on the device), so
    # the host's work between steps overlaps the GPU's (LLMEngine.step; 12-14% less wall time a step on the H200).
    async_decode: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_waiting_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.idle_prefill_tokens is not None and self.idle_prefill_tokens < 1:
            raise ValueError(f"idle_prefill_tokens must be >= 1, got {self.idle_prefill_tokens}")
        if not 0.05 <= self.gpu_memory_utilization <= 0.99:
            raise ValueError(f"gpu_memory_utilization must be in [0.05, 0.99], got {self.gpu_memory_utilization}")
        if self.dtype not in ("auto", "bfloat16", "bf16", "float32", "fp32"):
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {self.dtype!r}")
        if self.kernels not in ("auto", "reference", "fast"):
            raise ValueError(f"kernels must be auto, reference or fast, got {self.kernels!r}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError("kv_cache_memory must be positive")

    def prefill_tokens(self, fused_gpu: bool) -> int:
        """The token budget of prefill-only steps (`idle_prefill_tokens` resolved for the model's path)."""
        want = self.idle_prefill_tokens
        if want is None:
            want = IDLE_PREFILL_TOKENS_GPU if fused_gpu else 0
        return max(self.max_num_batched_tokens, want)

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dev = torch.device(self.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {self.device!r} was asked for but no CUDA GPU is available")
        return dev

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype in ("bfloat16", "bf16"):
            return torch.bfloat16
        if self.dtype in ("float32", "fp32"):
            return torch.float32
        # CPUs without BF16 matrix units run small models faster in FP32; numerics still follow the reference.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
