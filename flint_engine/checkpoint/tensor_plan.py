"""Every tensor a Flint checkpoint holds: its engine key, HF and GGUF names, shape (torch order) and role.

Engine keys are format-neutral ("layers.3.q", "layers.5.experts.gate"); stacked experts have a leading expert
dimension in the engine and GGUF, and are split per expert in the HF checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import FlintConfig

# Roles decide storage: linears may be NVFP4; norms/sinks/router stay float; the embedding stays BF16/F32.
LINEAR, EXPERTS, NORM, SINKS, ROUTER, EMBED = "linear", "experts", "norm", "sinks", "router", "embed"


@dataclass(frozen=True)
class TensorSpec:
    key: str
    hf: str  # for EXPERTS a format string with {e}
    gguf: str
    shape: tuple[int, ...]
    role: str
    hf_alt: tuple[str, ...] = ()  # other names the HF checkpoint may use (save_pretrained's fused forms)


def layer_specs(config: FlintConfig, i: int) -> list[TensorSpec]:
    c = config
    h, d = c.hidden_size, c.head_dim
    hf, gg = f"model.layers.{i}.", f"blk.{i}."
    specs = [
        TensorSpec(f"layers.{i}.input_norm", hf + "input_layernorm.weight", gg + "attn_norm.weight", (h,), NORM),
        TensorSpec(f"layers.{i}.post_norm", hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", (h,), NORM),
        TensorSpec(f"layers.{i}.q", hf + "self_attn.q_proj.weight", gg + "attn_q.weight", (c.q_size, h), LINEAR),
        TensorSpec(f"layers.{i}.k", hf + "self_attn.k_proj.weight", gg + "attn_k.weight", (c.kv_size, h), LINEAR),
        TensorSpec(f"layers.{i}.v", hf + "self_attn.v_proj.weight", gg + "attn_v.weight", (c.kv_size, h), LINEAR),
        TensorSpec(f"layers.{i}.o", hf + "self_attn.o_proj.weight", gg + "attn_output.weight", (h, c.q_size), LINEAR),
        TensorSpec(f"layers.{i}.q_norm", hf + "self_attn.q_norm.weight", gg + "attn_q_norm.weight", (d,), NORM),
        TensorSpec(f"layers.{i}.k_norm", hf + "self_attn.k_norm.weight", gg + "attn_k_norm.weight", (d,), NORM),
        TensorSpec(
            f"layers.{i}.sinks",
            hf + "self_attn.softmax_offset",
            gg + "attn_sinks.weight",
            (c.num_attention_heads,),
            SINKS,
            hf_alt=(hf + "self_attn.sinks",),
        ),
    ]
    if not c.is_moe(i):
        w = c.intermediate_size
        specs += [
            TensorSpec(f"layers.{i}.gate", hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", (w, h), LINEAR),
            TensorSpec(f"layers.{i}.up", hf + "mlp.up_proj.weight", gg + "ffn_up.weight", (w, h), LINEAR),
            TensorSpec(f"layers.{i}.down", hf + "mlp.down_proj.weight", gg + "ffn_down.weight", (h, w), LINEAR),
        ]
        return specs
    e, w, s = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
    specs += [
        TensorSpec(f"layers.{i}.router", hf + "mlp.gate.weight", gg + "ffn_gate_inp.weight", (e, h), ROUTER),
        TensorSpec(
            f"layers.{i}.experts.gate",
            hf + "mlp.experts.{e}.gate_proj.weight",
            gg + "ffn_gate_exps.weight",
            (e, w, h),
            EXPERTS,
            hf_alt=(hf + "mlp.experts.gate_up_proj",),
        ),
        TensorSpec(
            f"layers.{i}.experts.up",
            hf + "mlp.experts.{e}.up_proj.weight",
            gg + "ffn_up_exps.weight",
            (e, w, h),
            EXPERTS,
            hf_alt=(hf + "mlp.experts.gate_up_proj",),
        ),
        TensorSpec(
            f"layers.{i}.experts.down",
            hf + "mlp.experts.{e}.down_proj.weight",
            gg + "ffn_down_exps.weight",
            (e, h, w),
            EXPERTS,
            hf_alt=(hf + "mlp.experts.down_proj",),
        ),
    ]
    if s:
        specs += [
            TensorSpec(
                f"layers.{i}.shared.gate",
                hf + "mlp.shared_expert.gate_proj.weight",
                gg + "ffn_gate_shexp.weight",
                (s, h),
                LINEAR,
            ),
            TensorSpec(
                f"layers.{i}.shared.up",
                hf + "mlp.shared_expert.up_proj.weight",
                gg + "ffn_up_shexp.weight",
                (s, h),
                LINEAR,
            ),
            TensorSpec(
                f"layers.{i}.shared.down",
                hf + "mlp.shared_expert.down_proj.weight",
                gg + "ffn_down_shexp.weight",
                (h, s),
                LINEAR,
            ),
        ]
    return specs


def checkpoint_plan(config: FlintConfig) -> list[TensorSpec]:
    """All tensors in file order: embedding, layers, final norm, lm_head."""
    c = config
    plan = [TensorSpec("embed", "model.embed_tokens.weight", "token_embd.weight", (c.vocab_size, c.hidden_size), EMBED)]
    for i in range(c.num_hidden_layers):
        plan += layer_specs(c, i)
    plan += [
        TensorSpec("final_norm", "model.norm.weight", "output_norm.weight", (c.hidden_size,), NORM),
        TensorSpec("lm_head", "lm_head.weight", "output.weight", (c.vocab_size, c.hidden_size), LINEAR),
    ]
    return plan


def fan_in(spec: TensorSpec) -> int:
    return spec.shape[-1]
