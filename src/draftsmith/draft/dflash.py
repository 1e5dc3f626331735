"""The DFlash block drafter (arXiv 2602.06036), as vLLM's `qwen3_dflash` (`DFlashDraftModel`) serves it.

One forward drafts a whole block: the last verified token (the "bonus") and K mask tokens at
the next K+1 positions, attending to the target's context and to each other (non-causal inside
the block); the mask slots' outputs are the K drafts.

    context (the target's aux states at the positions before the block):
      ctx = hidden_norm(fc(aux))                              [.., C, H]   one per position, for every layer
      layer i's context keys/values: k = k_norm(k_proj_i(ctx)) with RoPE at the context positions,
                                      v = v_proj_i(ctx)       (vLLM: `precompute_and_store_context_kv`)
    block (queries): x = embed([bonus, mask, .., mask])       [.., K+1, H]
    layer i (a Qwen3 decoder layer):
      h = input_layernorm(x); q, k, v = q_proj(h), k_proj(h), v_proj(h); q, k = q_norm, k_norm per head
      x = x + o_proj(attn(q, [ctx keys ; block keys], [ctx values ; block values]))
      x = x + mlp(post_attention_layernorm(x))
    logits = lm_head(norm(x))                                 [.., K+1, draft_vocab]; slot j >= 1 drafts token n+j

Positions: context position s holds the target's state after token s; the bonus token sits at
the first position after the context (n), mask j at n+j. The embedding is the target's, frozen
(vLLM shares the target's when the export has none); the mask token is a target token id whose
(frozen) embedding marks the slots to fill. Draft id i maps to target id i + d2t[i], as in
EAGLE-3. Attention takes an explicit boolean mask over [context ; block] keys, so training
(many blocks over one packed row) and eval (a KV cache of the context) share one module. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.draft.model import MLP, LayerShape, RMSNorm, TargetVocab, layer_shape, rope

METHOD = "dflash"


@dataclass
class DFlashConfig(LayerShape):
    mask_token_id: int = 0  # a target token id: the embedding of the slots to fill
    block_size: int = 8  # the bonus token and block_size-1 mask slots: block_size-1 drafts per forward
    method: str = METHOD

    @property
    def drafts(self) -> int:
        """Draft tokens per block (the mask slots)."""
        return self.block_size - 1

    @classmethod
    def from_target(
        cls, target_config: Any, draft_vocab_size: int, aux_layer_ids: list[int], mask_token_id: int, block_size: int
    ) -> DFlashConfig:
        """Decoder layers shaped like the target's (its HF text config)."""
        return cls(
            **layer_shape(target_config),
            draft_vocab_size=int(draft_vocab_size),
            aux_layer_ids=list(aux_layer_ids),
            mask_token_id=int(mask_token_id),
            block_size=int(block_size),
        )


class DFlashAttention(nn.Module):
    """Qwen3 attention (per-head q/k RMSNorm) whose keys are the context's, then the block's own."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.nh, self.nkv, self.hd, self.theta = cfg.num_attention_heads, cfg.num_key_value_heads, hd, cfg.rope_theta
        self.q_proj = nn.Linear(h, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] (normed) -> k, v [B, nkv, T, hd], k normed and rotated."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.hd)).transpose(1, 2)  # [B, nkv, T, hd]
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        return rope(k, position_ids, self.theta), v

    def forward(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """x [B, T, H] (normed block); ctx_k, ctx_v [B, nkv, C, hd]; mask [B, T, C+T] bool (True: attend)."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.nh, self.hd)).transpose(1, 2)  # [B, nh, T, hd]
        q = rope(q, position_ids, self.theta)
        k, v = self.kv(x, position_ids)  # [B, nkv, T, hd]
        keys = torch.cat([ctx_k.to(k.dtype), k], dim=2)  # [B, nkv, C+T, hd]
        values = torch.cat([ctx_v.to(v.dtype), v], dim=2)  # [B, nkv, C+T, hd]
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], enable_gqa=True)  # [B, nh, T, hd]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))  # [B, T, H]


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), position_ids, ctx_k, ctx_v, mask)  # [B, T, H]
        return h + self.mlp(self.post_attention_layernorm(h))  # [B, T, H]


class DFlashDrafter(TargetVocab, nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.config = cfg
        n_aux = max(len(cfg.aux_layer_ids), 1)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # copied from the target, frozen
        self.fc = nn.Linear(n_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    @property
    def decoder_layers(self) -> list[nn.Module]:
        return list(self.layers)

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux states [B, C, n_aux*H_t] -> the normed context features [B, C, H]."""
        return self.hidden_norm(self.fc(aux))

    def context_kv(self, ctx: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """ctx [B, C, H] (`context`) at position_ids [B, C] -> per layer (k, v) [B, nkv, C, hd]."""
        return [layer.self_attn.kv(ctx, position_ids) for layer in self.layers]

    def block_ids(self, bonus: torch.Tensor) -> torch.Tensor:
        """bonus [..] target ids -> the block's input ids [.., block_size]: the bonus, then masks."""
        masks = torch.full((*bonus.shape, self.config.drafts), self.config.mask_token_id, device=bonus.device)
        return torch.cat([bonus[..., None], masks.to(bonus.dtype)], dim=-1)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """input_ids, position_ids [B, T] (blocks laid end to end), ctx_kv per layer [B, nkv, C, hd]
        (`context_kv`), mask [B, T, C+T] bool -> the last layer's output [B, T, H] (before `norm`)."""
        x = self.embed_tokens(input_ids).to(self.fc.weight.dtype)  # [B, T, H]
        for layer, (k, v) in zip(self.layers, ctx_kv, strict=True):
            x = layer(x, position_ids, k, v, mask)
        return x

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))  # [.., draft_vocab]


def block_mask(anchors: torch.Tensor, doc: torch.Tensor, block_size: int, context_len: int) -> torch.Tensor:
    """The training mask of blocks anchored at `anchors` [n] (positions of one packed row whose
    sample ids are doc [T]) -> [n*block_size, T + n*block_size] bool: block j's queries see the
    context positions s < anchors[j] of the same sample, and all of block j."""
    n = anchors.shape[0]
    s = torch.arange(context_len, device=doc.device)  # [T]
    ctx = (s[None, :] < anchors[:, None]) & (doc[None, :] == doc[anchors][:, None])  # [n, T]
    own = torch.eye(n, dtype=torch.bool, device=doc.device)  # [n, n]: block to block
    ctx = ctx.repeat_interleave(block_size, dim=0)  # [n*bs, T]
    own = own.repeat_interleave(block_size, dim=0).repeat_interleave(block_size, dim=1)  # [n*bs, n*bs]
    return torch.cat([ctx, own], dim=1)  # [n*bs, T + n*bs]


def default_mask_token(t2d: torch.Tensor, vocab_size: int) -> int:
    """The mask token when none is given: the highest target id outside the draft vocab (a token the
    drafter never drafts, and rare in the training data; a padded embedding row where the model
    has one), or the vocab's last id when the draft vocab holds every token."""
    outside = (~t2d.bool()).nonzero().flatten()
    return int(outside[-1]) if outside.numel() else vocab_size - 1
