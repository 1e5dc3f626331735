"""The EAGLE-3 drafter, as vLLM (`llama_eagle3`) and SGLang (`LlamaForCausalLMEagle3`) serve it.

    aux [.., n_aux*H_t] --fc--> h [.., H]                     (only for the target's states)
      norm_before_fc: aux -> input_norm(aux) first            (one RMSNorm over all n_aux*H_t)
      fc_norm:        aux -> cat(fc_norm[i](aux_i)) first     (EAGLE-3.1: one RMSNorm per aux layer)
    layer 0 (`midlayer`):
      x = cat(input_layernorm(embed(tok)), hidden_norm(h))    [.., 2H]
      h1 = h + o_proj(attn(x))                                residual is the un-normalised h
      out = h1 + mlp(post_attention_layernorm(h1))
    layers 1.. (`extra_layers`, num_layers > 1): plain Llama decoder layers on the hidden stream
      h1 = out + o_proj(attn(input_layernorm(out)))           [.., H]; no embedding
      out = h1 + mlp(post_attention_layernorm(h1))
    logits = lm_head(norm(out))                               [.., draft_vocab]
    next h = out, or norm(out) with norm_output               fed back as h for the next draft step

At position t the drafter sees the target's hidden state at t and the embedding of token t+1,
and predicts token t+2. Draft id i maps to target id i + d2t[i]; t2d marks the target ids that
the draft vocab covers. Attention is a callback (`attend`, one per layer: each keeps its own
keys), so training (TTT masks), eval (KV cache) and the plain causal default share one module.
The layers 1.. are what vLLM's `llama_eagle3` builds for `num_hidden_layers` > 1 (its
`layers.1..`) and speculators' drafter for `transformer_layer_config.num_hidden_layers`. A P-EAGLE
drafter (`method` "peagle", draft/peagle.py) is the same module plus `mask_hidden`, the learned
aux-state placeholder of its parallel draft slots. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

# attend(q [B, nh, T, hd], k [B, nkv, T, hd], v [B, nkv, T, hd]) -> o [B, nh, T, hd]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# one attend per drafter layer, or one for all of them when it keeps no keys (causal_attend)
Attends = Attend | Sequence[Attend]


def layer_shape(tc: Any) -> dict[str, Any]:
    """The fields of a drafter config that copy a decoder layer of the target (its HF text config)."""
    heads = int(tc.num_attention_heads)
    return {
        "hidden_size": int(tc.hidden_size),
        "intermediate_size": int(tc.intermediate_size),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(tc, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(tc, "head_dim", None) or tc.hidden_size // heads),
        "vocab_size": int(tc.vocab_size),
        "target_hidden_size": int(tc.hidden_size),
        "rms_norm_eps": float(getattr(tc, "rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta(tc),
        "max_position_embeddings": int(getattr(tc, "max_position_embeddings", 4096)),
    }


Shaped = TypeVar("Shaped", bound="LayerShape")


@dataclass
class LayerShape:
    """What every drafter method's config holds (draft/methods.py): its decoder layers' shape (a
    copy of one of the target's, `layer_shape`), the two vocabularies and the aux layers it reads."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocab
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int] = field(default_factory=list)  # draftsmith convention
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"
    num_layers: int = 1  # decoder layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls: type[Shaped], d: dict[str, Any]) -> Shaped:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class DrafterConfig(LayerShape):
    """EAGLE-3's (and P-EAGLE's): num_layers is the EAGLE-3 layer, then num_layers-1 plain ones."""

    norm_before_residual: bool = False  # True: the residual is hidden_norm(h), not h
    norm_before_fc: bool = False  # True: RMSNorm (`input_norm`) over the concatenated aux states before fc
    fc_norm: bool = False  # True: EAGLE-3.1's RMSNorm per aux layer (`fc_norm.{i}`) before fc
    norm_output: bool = False  # True: the next draft step reads norm(out) instead of out
    method: str = "eagle3"  # "eagle3": one forward per draft; "peagle": one forward proposes all K (draft/peagle.py)
    ptd_token_id: int = 0  # peagle: the placeholder token id of the draft slots after the first (a target id)

    @classmethod
    def from_target(cls, target_config: Any, draft_vocab_size: int, aux_layer_ids: list[int]) -> DrafterConfig:
        """A drafter shaped like one decoder layer of the target (its HF text config)."""
        return cls(
            **layer_shape(target_config), draft_vocab_size=int(draft_vocab_size), aux_layer_ids=list(aux_layer_ids)
        )


def rope_theta(config: Any) -> float:
    """The RoPE base of an HF text config (newer transformers keep it in `rope_parameters`)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(x: torch.Tensor, position_ids: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama rotary embedding. x: [B, n, T, hd], position_ids: [B, T]."""
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))  # [hd/2]
    freqs = position_ids.float()[..., None] * inv_freq  # [B, T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, hd]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def causal_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal self-attention (GQA)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig, in_features: int) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.hd, self.theta = cfg.num_attention_heads, cfg.num_key_value_heads, hd, cfg.rope_theta
        self.q_proj = nn.Linear(in_features, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(in_features, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(in_features, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, h, bias=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        b, t, _ = x.shape  # x: [B, T, in_features] (2H in layer 0, H after)
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        q, k = rope(q, position_ids, self.theta), rope(k, position_ids, self.theta)
        o = attend(q, k, v)  # [B, nh, T, hd]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))  # [B, T, H]


class MLP(nn.Module):
    def __init__(self, cfg: LayerShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """The drafter's first decoder layer (`midlayer`): attention over the token's embedding and
    the hidden state together."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 2 * cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        normed = self.hidden_norm(hidden)  # [B, T, H]
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        h = residual + self.self_attn(x, position_ids, attend)
        return h + self.mlp(self.post_attention_layernorm(h))  # [B, T, H]


class DecoderLayer(nn.Module):
    """A drafter layer after the first (`extra_layers`): a plain pre-norm Llama decoder layer
    over the hidden stream."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        h = hidden + self.self_attn(self.input_layernorm(hidden), position_ids, attend)  # [B, T, H]
        return h + self.mlp(self.post_attention_layernorm(h))  # [B, T, H]


class TargetVocab:
    """What every drafter kind shares with its target: the draft vocab's map to target ids
    (buffers d2t [Vd], t2d [V]) and the target's embedding (`embed_tokens`)."""

    d2t: torch.Tensor
    t2d: torch.Tensor
    embed_tokens: nn.Embedding

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocab ids -> target vocab ids (target = draft + d2t[draft])."""
        return draft_ids + self.d2t[draft_ids]

    def load_target_embeddings(self, weight: torch.Tensor) -> None:
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight)

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        assert d2t.shape == self.d2t.shape and t2d.shape == self.t2d.shape, (d2t.shape, t2d.shape)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)


class Eagle3Drafter(TargetVocab, nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg
        n_aux = max(len(cfg.aux_layer_ids), 1)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # copied from the target, frozen
        self.input_norm = RMSNorm(n_aux * cfg.target_hidden_size, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(n_aux))
            if cfg.fc_norm
            else None
        )
        self.fc = nn.Linear(n_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.extra_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers - 1))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        # P-EAGLE: the learned aux-state placeholder of the parallel draft slots, projected like the
        # target's aux states (vLLM's `mask_hidden`, [n_aux*H_t]; draft/peagle.py)
        self.mask_hidden = (
            nn.Parameter(0.02 * torch.randn(n_aux * cfg.target_hidden_size)) if cfg.method == "peagle" else None
        )

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux states [.., n_aux*H_t] -> drafter hidden [.., H]."""
        if self.fc_norm is not None:
            parts = aux.chunk(len(self.fc_norm), dim=-1)  # n_aux x [.., H_t]
            aux = torch.cat([norm(x) for norm, x in zip(self.fc_norm, parts, strict=True)], dim=-1)  # [.., n_aux*H_t]
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        return self.fc(aux)

    def next_hidden(self, out: torch.Tensor) -> torch.Tensor:
        """The hidden state the next draft step reads, from this step's layer output [.., H]."""
        return self.norm(out) if self.config.norm_output else out

    @property
    def decoder_layers(self) -> list[nn.Module]:
        """The layers in order: `midlayer`, then `extra_layers` (the engines' layers.0, 1, ..)."""
        return [self.midlayer, *self.extra_layers]

    def layers_forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor, attend: Attends
    ) -> torch.Tensor:
        """embeds, hidden [B, T, H] -> the last layer's output [B, T, H] (before `norm`). `attend`:
        one callback per layer, or one for all layers when it keeps no keys."""
        if callable(attend):  # one for all layers: only one that keeps no keys, or the layers would share them
            assert attend is causal_attend or self.config.num_layers == 1, "give a stateful attend per layer"
            attends = [attend] * self.config.num_layers
        else:
            attends = list(attend)
        assert len(attends) == self.config.num_layers, (len(attends), self.config.num_layers)
        out = self.midlayer(embeds, hidden, position_ids, attends[0])  # [B, T, H]
        for layer, layer_attend in zip(self.extra_layers, attends[1:], strict=True):
            out = layer(out, position_ids, layer_attend)  # [B, T, H]
        return out

    def forward(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attend: Attends = causal_attend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, T, H] (projected target states, or the previous step's output),
        input_ids [B, T] (token t+1 for hidden at t), position_ids [B, T]; `attend` as in
        `layers_forward`. Returns logits [B, T, draft_vocab] and the hidden state for the next
        step [B, T, H] (`next_hidden` of the last layer's output)."""
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        out = self.layers_forward(embeds, hidden, position_ids, attend)  # [B, T, H]
        return self.lm_head(self.norm(out)), self.next_hidden(out)
