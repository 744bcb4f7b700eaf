"""L2 prefetch of the routed experts' weights by the router's top-k program (`flint_kernels.l2_prefetch`).

The prefetch is a PTX hint the CPU interpreter cannot run: here the regions it covers and when the router asks for
it; the `gpu` tests check that the router's and the MoE's results do not change with it on.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
from flint_kernels import l2_prefetch
from flint_kernels import moe_triton as mt
from flint_kernels import router_triton as rt
from flint_kernels.configs import MoEPaths
from flint_kernels.linear import NVFP4Weight
from flint_kernels.router import sigmoid_topk_ref

HAS_CUDA = torch.cuda.is_available()


def nvfp4_stack(e: int, n: int, k: int, device: str = "cpu") -> NVFP4Weight:
    q = torch.randint(0, 256, (e, n, k // 2), dtype=torch.int32).to(device=device, dtype=torch.uint8)
    s = torch.randint(0x30, 0x40, (e, n, k // 16), dtype=torch.int32).to(device=device, dtype=torch.uint8)
    return NVFP4Weight(q, s, torch.ones(e, 1, device=device), (n,))


def test_regions_of_bf16_experts() -> None:
    """Flint's shapes: an expert's gate|up is 4 MB (64 requests of 64 KB), its down 2 MB."""
    w13 = torch.empty(4, 1024, 2048, dtype=torch.bfloat16)
    w2 = torch.empty(4, 2048, 512, dtype=torch.bfloat16)
    got = l2_prefetch.expert_regions(w13, w2, cuda_only=False)
    assert got is not None and got.regions == 2 and got.chunks == 64
    base, stride, size = got.table.tolist()
    assert base == [w13.data_ptr(), w2.data_ptr()]
    assert stride == size == [1024 * 2048 * 2, 2048 * 512 * 2]
    assert l2_prefetch.expert_regions(w13, w2) is None  # not on a GPU


def test_regions_of_nvfp4_experts() -> None:
    """Codes and block scales of both stacks: four regions, 1 MB of gate|up codes an expert the largest."""
    w13, w2 = nvfp4_stack(3, 1024, 2048), nvfp4_stack(3, 2048, 512)
    got = l2_prefetch.expert_regions(w13, w2, cuda_only=False)
    assert got is not None and got.regions == 4 and got.chunks == 16
    _, stride, size = got.table.tolist()
    assert size == [1024 * 1024, 1024 * 128, 2048 * 256, 2048 * 32] == stride


def test_regions_refuse_what_a_bulk_request_cannot_cover() -> None:
    w = torch.empty(4, 8, 8, dtype=torch.bfloat16)  # 128 bytes an expert: fine
    assert l2_prefetch.expert_regions(w, cuda_only=False) is not None
    assert l2_prefetch.expert_regions(torch.empty(4, 3, 3, dtype=torch.bfloat16), cuda_only=False) is None  # 18 B
    assert l2_prefetch.expert_regions(w.transpose(1, 2), cuda_only=False) is None  # an expert not contiguous
    assert l2_prefetch.expert_regions(cuda_only=False) is None


def test_the_router_prefetches_only_where_the_table_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prepare` registers the experts while the router weight lives; batches up to the table's
    `l2_prefetch_max_tokens` get the regions, read per call (0, the default: none)."""
    fake = l2_prefetch.ExpertRegions(torch.zeros(3, 2, dtype=torch.int64), 4)
    monkeypatch.setattr(rt, "expert_regions", lambda *w: fake)
    experts = (torch.empty(2, 4, 8), torch.empty(2, 8, 2))
    w = torch.randn(8, 16)
    rt.prepare(w, experts)
    assert rt.prefetch_for(w, 1) is None  # the default: off
    monkeypatch.setattr(mt, "paths_config", lambda nvfp4, device=None: MoEPaths(64, 8, l2_prefetch_max_tokens=2))
    assert rt.prefetch_for(w, 1) is fake and rt.prefetch_for(w, 2) is fake and rt.prefetch_for(w, 3) is None
    assert rt.prefetch_for(torch.randn(8, 16), 1) is None  # another weight
    key = id(w)
    del w
    gc.collect()
    assert key not in rt._prefetch


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
@pytest.mark.parametrize("t", [1, 4])
def test_gpu_router_and_moe_unchanged_by_the_prefetch(monkeypatch: pytest.MonkeyPatch, fmt: str, t: int) -> None:
    """Flint's shapes: the one-launch add+RMSNorm+router with the experts' prefetch gives the same bits as without,
    and so does the MoE that reads the prefetched weights."""
    g = torch.Generator(device="cuda").manual_seed(t)
    x = torch.randn(t, 2048, generator=g, device="cuda").bfloat16()
    res = torch.randn(t, 2048, generator=g, device="cuda").bfloat16()
    norm_w = torch.rand(2048, generator=g, device="cuda") + 0.5
    router = torch.randn(256, 2048, generator=g, device="cuda") / 45.0
    if fmt == "bf16":
        w13 = (torch.randn(256, 1024, 2048, generator=g, device="cuda") / 45.0).bfloat16()
        w2 = (torch.randn(256, 2048, 512, generator=g, device="cuda") / 22.6).bfloat16()
    else:
        w13, w2 = nvfp4_stack(256, 1024, 2048, "cuda"), nvfp4_stack(256, 2048, 512, "cuda")
    plain = rt.add_rms_norm_sigmoid_topk(x, res, norm_w, 1e-6, router, 6)
    moe_plain = mt.moe(plain[0], plain[2], plain[3], w13, w2)
    real = mt.paths_config

    def paths_with_prefetch(nvfp4: bool, device: torch.device | None = None) -> MoEPaths:
        return dataclasses.replace(real(nvfp4, device), l2_prefetch_max_tokens=4)

    monkeypatch.setattr(mt, "paths_config", paths_with_prefetch)
    rt.prepare(router, (w13, w2))
    assert rt.prefetch_for(router, t) is not None
    early = rt.add_rms_norm_sigmoid_topk(x, res, norm_w, 1e-6, router, 6)
    moe_early = mt.moe(early[0], early[2], early[3], w13, w2)
    for a, b in zip(plain, early, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(moe_plain, moe_early)
    ref_w, _ = sigmoid_topk_ref(early[0], router, 6)
    assert (early[2] - ref_w).abs().max().item() < 1e-5
