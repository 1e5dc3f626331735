"""A gpt-fast-style forward of a Llama-family HF target with a static KV cache.

The forward runs the HF model's own modules (on CPU their linear layers over weights prepacked
once for oneDNN, runtime/linear.py) but owns the attention: keys and values go into a
preallocated cache at given slots, and every query attends under an explicit boolean mask over
the cache (a sliding layer's by each slot's position). One code path gives plain decoding, chain
and tree verification, the compaction of a tree's accepted path (`compact`), the drafter's aux
hidden states in the same pass (none when `aux_layer_ids` is empty), and batched rows: in
lock-step (`forward_batch`, synth) or each at its own length (`prefill_rows`, `rows_forward`, eval).

A forward of b rows uses the cache's first b rows, so that a batch whose rows finished can go on
over fewer (`keep_rows` moves the live ones to the front: synth). `graph(t, width, rows)`,
`graph_rows(t)` and `graph_compact(n)` capture those forwards in CUDA graphs,
each first `torch.compile`d with `compile` (one that fails to compile is captured eagerly, with a
line on stderr): one decoder layer's step, compiled once per shape and run by every layer
(`compile_scope="layers"`, the default: regional compilation, about one layer's compile instead of
all of them, at the whole forward's speed), or the whole forward (`"forward"`); on CPU the same code
runs eagerly. `check_supported` names the architectures it covers; selfcheck.py holds every model
against its own forward. What each family needs, and why the target is compiled: docs/eval.md,
"How it works".
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.errors import UserError
from draftsmith.runtime.linear import fused_linear, prepacked
from draftsmith.target import base_model, decoder_layers, final_norm, head_dim, text_config


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma-2's soft-capping, elementwise: cap·tanh(x/cap)."""
    return cap * torch.tanh(x / cap)


SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")  # Gemma-2/3, around the MLP


def is_sandwich(layer: nn.Module) -> bool:
    """Whether `layer` norms its sublayers' outputs too (Gemma-2/3: post_attention_layernorm
    after the attention, pre/post_feedforward_layernorm around the MLP)."""
    return all(hasattr(layer, n) for n in SANDWICH_NORMS)


def check_supported(model: nn.Module) -> None:
    """The forward below covers Llama, Mistral, Qwen2/3 and Gemma-1/2/3-style decoders
    (rotary, GQA; pre-norm or Gemma's sandwich norms). Refuse anything else with a clear
    message rather than compute wrong logits."""
    layer = decoder_layers(model)[0]
    attn = getattr(layer, "self_attn", None)
    needed = [getattr(layer, n, None) for n in ("input_layernorm", "post_attention_layernorm", "mlp")]
    if (
        attn is None
        or any(m is None for m in needed)
        or not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    ):
        raise UserError(
            f"draftsmith's static-KV engine (eval, synth) supports Llama-family targets (pre-norm decoder layers with q/k/v/o projections); "
            f"{type(layer).__name__} is not one"
        )
    partial = [n for n in SANDWICH_NORMS if hasattr(layer, n)]
    if partial and not is_sandwich(layer):
        raise UserError(
            f"draftsmith's static-KV engine: {type(layer).__name__} has {partial} without the rest of Gemma's "
            f"sandwich norms ({list(SANDWICH_NORMS)}), which it does not implement"
        )
    if getattr(base_model(model), "rotary_emb", None) is None:
        raise UserError(f"draftsmith's static-KV engine: {type(base_model(model)).__name__} has no rotary_emb module")


def rotary_types(model: nn.Module) -> list[str | None]:
    """Per decoder layer, the layer type to compute its rotary embedding for: Gemma-3's rotary
    embedding takes one (`rotary_emb(x, pos, layer_type)`: its local layers rotate at their own
    base frequency); None everywhere for the rest, whose one rotary serves every layer."""
    if "layer_type" not in inspect.signature(base_model(model).rotary_emb.forward).parameters:
        return [None] * len(decoder_layers(model))
    return list(text_config(model.config).layer_types)


def sliding_layers(model: nn.Module) -> tuple[int | None, list[bool]]:
    """The sliding window (None without one) and, per decoder layer, whether it slides: the
    layers that `layer_types` calls `sliding_attention`, or every layer of a model with a
    window and no layer types (Mistral)."""
    tc, n = text_config(model.config), len(decoder_layers(model))
    window, types = getattr(tc, "sliding_window", None), getattr(tc, "layer_types", None)
    sliding = [False] * n if window is None else [t == "sliding_attention" for t in types] if types else [True] * n
    return (int(window) if any(sliding) else None), sliding


class Graphed:
    """A function of fixed-shape tensors captured in a CUDA graph. Calling it copies the
    arguments into the static input buffers and replays; the outputs are static buffers too,
    overwritten by the next call."""

    def __init__(self, fn: Any, *example: torch.Tensor) -> None:
        self.inputs = [x.clone() for x in example]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):  # warm-up off the capture: allocator, kernel selection
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.outputs = fn(*self.inputs)
        torch.cuda.synchronize()

    def __call__(self, *args: torch.Tensor) -> Any:
        for buf, a in zip(self.inputs, args, strict=True):
            buf.copy_(a)
        self.graph.replay()
        return self.outputs


class FlashDecode(NamedTuple):
    """Where a one-token step's queries read the cache under `flash_decode`, as FlashAttention's
    variable-length sequences: one per (row, KV head), its g query heads as the heads of one query
    token. cum_k [B*nkv + 1] (int32): each sequence's first key in the cache flattened to [B*nkv*max_len,
    1, hd]; used [B*nkv] (int32): its keys; width: the slots attended (the graph's S)."""

    cum_q: torch.Tensor
    cum_k: torch.Tensor
    used: torch.Tensor
    width: int


def flash_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: FlashDecode, scale: float | None
) -> torch.Tensor:
    """FlashAttention-2's variable-length forward (torch's own build; CUDA, bf16/fp16): q [N, g, hd]
    (one token of each of N sequences), k, v [M, 1, hd]; sequence i reads keys
    cum_k[i] .. cum_k[i] + used[i] - 1. Returns [N, g, hd]. A module-level function so that the CPU
    tests can put a reference in its place."""
    return torch.ops.aten._flash_attention_forward(
        q, k, v, meta.cum_q, meta.cum_k, 1, meta.width, 0.0, False, False, scale=scale, seqused_k=meta.used
    )[0]


def flash_attention_problem(model: nn.Module) -> str | None:
    """Why the engine's flash decoding cannot attend as `model` does (None: it can): the kernel
    reads every slot a token sees under plain softmax, so no sliding window and no soft-capped scores."""
    if sliding_layers(model)[0] is not None:
        return "it covers no sliding-window attention"
    if getattr(text_config(model.config), "attn_logit_softcapping", None) is not None:
        return "it covers no soft-capped attention scores"
    return None


def flash_decode_problem(model: nn.Module) -> str | None:
    """Why `flash_varlen` cannot serve `model`'s decode steps where it is (None: it can): its attention
    (`flash_attention_problem`), then torch's FlashAttention-2 build, which takes CUDA tensors of
    16-bit floats, head dims up to 256 in multiples of 8, and Ampere or newer."""
    p, hd = next(model.parameters()), head_dim(text_config(model.config))
    if problem := flash_attention_problem(model):
        return problem
    if p.device.type != "cuda":
        return "it runs on CUDA GPUs only"
    if p.dtype not in (torch.bfloat16, torch.float16):
        return f"it takes bf16 or fp16, not {str(p.dtype).removeprefix('torch.')}"
    if hd > 256 or hd % 8:
        return f"head dim {hd} is not a multiple of 8 up to 256"
    if torch.cuda.get_device_capability(p.device) < (8, 0):
        return "it needs an Ampere or newer GPU"
    return None


class Scratch(NamedTuple):
    """A cache of its own (`TargetEngine.scratch_cache`): kv [2, L, n, nkv, w, hd], and the tokens'
    positions by slot [n, w] under a sliding window (else None)."""

    kv: torch.Tensor
    slot_pos: torch.Tensor | None


class LayerRefs(NamedTuple):
    """What one decoder layer's step reads and writes, passed to it as arguments (not looked up by
    the layer's index), so that a compiled step serves every layer: the model's layer, its fused
    q/k/v and gate/up products (weight, bias; None: the model's own), its keys and values in the
    cache [B, nkv, max_len, hd] (views of the engine's one KV tensor)."""

    layer: nn.Module
    qkv: tuple[torch.Tensor, torch.Tensor | None] | None
    gate_up: tuple[torch.Tensor, torch.Tensor | None] | None
    k: torch.Tensor
    v: torch.Tensor


class TargetEngine:
    """The target with a static KV cache of `max_len` slots for `batch` rows. The unbatched
    methods (`forward`, `chain`, `prefill`, `causal_mask`) need batch 1."""

    name = "fast"

    def __init__(
        self,
        model: nn.Module,
        aux_layer_ids: list[int],
        max_len: int,
        batch: int = 1,
        compile: bool = False,
        fuse: bool | None = None,
        compile_scope: Literal["forward", "layers"] = "layers",
        flash_decode: bool = False,
    ) -> None:
        check_supported(model)
        tc = text_config(model.config)
        self.model, self.base = model, base_model(model)
        # the model's own modules; on CPU their linear layers over prepacked weights (runtime/linear.py)
        self.layers, self.norm = [prepacked(layer) for layer in decoder_layers(model)], final_norm(model)
        self.embed, self.lm_head = model.get_input_embeddings(), prepacked(model.get_output_embeddings())
        self.aux_layer_ids = list(aux_layer_ids)
        self.max_len, self.batch = max_len, batch
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.nh = int(tc.num_attention_heads)
        self.nkv = int(getattr(tc, "num_key_value_heads", None) or self.nh)
        self.hd = head_dim(tc)
        self.vocab_size = int(tc.vocab_size)
        # the family's variations, decided once here (a CUDA graph captures whichever path they pick)
        self.rotary_types = rotary_types(model)
        self.attn_cap = getattr(tc, "attn_logit_softcapping", None)  # Gemma-2's soft-caps, on the attention scores
        self.logit_cap = getattr(tc, "final_logit_softcapping", None)  # and on the logits
        self._attend = self._sdpa if self.attn_cap is None else self._capped_attention
        self._block = self._sandwich_block if is_sandwich(self.layers[0]) else self._prenorm_block
        self.window, self.sliding = sliding_layers(model)
        if self.window is not None and self.window >= max_len:  # no two positions of this cache are a window apart
            self.window = None
        # one-token steps through FlashAttention's variable-length kernel, reading no mask: for
        # families whose attention is plain softmax over every slot a token sees; `flash_decode_problem`
        # also says where the kernel runs
        if flash_decode and (problem := flash_attention_problem(model)):
            raise UserError(f"the engine's flash decoding: {problem}")
        self.flash_decode = flash_decode
        # keys and values of every layer in one tensor [2, L, B, nkv, max_len, hd], so that a tree's
        # compaction moves all of them in one gather and one scatter; each layer attends over its views
        self.kv = torch.zeros(
            (2, len(self.layers), batch, self.nkv, max_len, self.hd), device=self.device, dtype=self.dtype
        )
        self.k_cache, self.v_cache = list(self.kv[0]), list(self.kv[1])  # per layer [B, nkv, max_len, hd]: views
        self.row_ids = torch.arange(batch, device=self.device)[:, None]  # [B, 1]: each row's index into them
        # with a window: the position of the token in each cache slot, written by every forward
        self.slot_pos = torch.zeros(batch, max_len, dtype=torch.long, device=self.device) if self.window else None
        self.graphs: dict[tuple[int, int, int], Graphed] = {}  # (rows, tokens, cache slots attended) -> graph
        self.row_graphs: dict[int, Graphed] = {}  # tokens -> graph of `rows_forward`
        self.functions: dict[tuple, Graphed] = {}  # key -> graph of a function of the cache (`graphed`)
        self.compiled = compile and self.device.type == "cuda"  # each graph's forward torch.compiled first
        self.capture_seconds = 0.0
        # `fuse`: per layer, q/k/v as one product and gate/up as another, as vLLM runs them (4 GEMMs a
        # layer against 7; their weights held once, runtime/linear.py); layers whose MLP is not
        # gate/up/down keep theirs. None: on a GPU, where it made a plain step 1.21x faster (H100,
        # bench/eval_bench.py --fuse-ab, 2026-12-06); on a CPU the prepacked separate products are faster
        fuse = self.device.type == "cuda" if fuse is None else fuse
        self.qkv = [
            fused_linear(layer.self_attn, ("q_proj", "k_proj", "v_proj")) if fuse else None for layer in self.layers
        ]
        self.gate_up = [fused_linear(layer.mlp, ("gate_proj", "up_proj")) if fuse else None for layer in self.layers]
        self.fused = any(f is not None for f in self.qkv + self.gate_up)
        self.refs = [
            LayerRefs(layer, qkv, gate_up, k, v)
            for layer, qkv, gate_up, k, v in zip(
                self.layers, self.qkv, self.gate_up, self.k_cache, self.v_cache, strict=True
            )
        ]
        # what `_forward` runs for each layer: `_block`, or inside a capture with compile_scope "layers"
        # its compiled form (`layers_compiled`)
        self.compile_scope = compile_scope
        self.layer_step = self._block
        self.compiled_step: Any = None

    # -- the forward -----------------------------------------------------------------------
    def _attention(
        self,
        refs: LayerRefs,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | FlashDecode,
    ) -> torch.Tensor:
        """mask [B, 1, g*T, S] (grouped, see `_forward`), or a one-token step's `FlashDecode`: attends over the first S cache slots
        (S = the graph's width when graphed; eager calls pass only the slots in use, which keeps
        CPU decoding cheap). The g = nh/nkv query heads that share a KV head are stacked as g*T
        queries of that head, so attention reads each cached KV head once (no GQA expansion of
        the cache, and SDPA can take its memory-efficient kernel with the mask)."""
        attn = refs.layer.self_attn
        b, t, _ = x.shape
        if refs.qkv is not None:  # one product [B, T, (nh + 2 nkv) hd], split
            q, k, v = F.linear(x, *refs.qkv).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = q.view(b, t, -1, self.hd)  # [B, T, nh, hd]
        k = k.view(b, t, -1, self.hd)  # [B, T, nkv, hd]
        v = v.view(b, t, -1, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        if getattr(attn, "q_norm", None) is not None:  # Qwen3-style per-head norms
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, n, T, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # each row's tokens into its own slots, written in place: as index_put (which inductor's
        # reinplacing keeps in place) rather than scatter, which a compiled forward turned into an
        # out-of-place scatter and a copy of the layer's whole cache back (11.4 ms of the compiled
        # 24.8 ms synth step at 1,024 rows, H100, experiments/LOG.md 2026-12-06 04:50)
        rows = self.row_ids[:b]  # [B, 1], broadcast against slots [B, T]
        refs.k[rows, :, slots] = k.transpose(1, 2)  # [B, T, nkv, hd] at [b, :, slots[b, j]]
        refs.v[rows, :, slots] = v.transpose(1, 2)
        g = self.nh // self.nkv
        q = q.reshape(b, self.nkv, g * t, self.hd)  # [B, nkv, g*T, hd]: head h = kv head h//g, as in GQA
        if isinstance(mask, FlashDecode):  # each (row, KV head) a sequence of its own, the cache rows flattened
            o = flash_varlen(
                q.reshape(b * self.nkv, g, self.hd),  # [B*nkv, g, hd]
                refs.k[:b].reshape(-1, 1, self.hd),  # [B*nkv*max_len, 1, hd]: views, the first B rows being contiguous
                refs.v[:b].reshape(-1, 1, self.hd),
                mask,
                getattr(attn, "scaling", None),
            ).reshape(b, self.nkv, g, self.hd)
        else:
            s = mask.shape[-1]
            o = self._attend(
                q, refs.k[:b, :, :s], refs.v[:b, :, :s], mask, getattr(attn, "scaling", None)
            )  # [B, nkv, g*T, hd]: the first B rows of the cache
        o = o.reshape(b, self.nh, t, self.hd)  # [B, nh, T, hd]
        return attn.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))  # [B, T, H]

    @staticmethod
    def _sdpa(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        """q [B, nkv, g*T, hd]; k, v [B, nkv, S, hd]; mask [B, 1, g*T, S] -> [B, nkv, g*T, hd]."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def _capped_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None
    ) -> torch.Tensor:
        """`_sdpa` with the scores soft-capped before the mask (Gemma-2's attn_logit_softcapping,
        which SDPA cannot do), as the model's eager attention computes it: softmax in float32."""
        scores = softcap(q @ k.transpose(-1, -2) * (scale or self.hd**-0.5), self.attn_cap)  # [B, nkv, g*T, S]
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
        return probs @ v  # [B, nkv, g*T, hd]

    def _prenorm_block(self, refs: LayerRefs, h: torch.Tensor, *attn_args: torch.Tensor) -> torch.Tensor:
        """One decoder layer on the residual h [B, T, H] (Llama & most): norm, sublayer, add."""
        layer = refs.layer
        h = h + self._attention(refs, layer.input_layernorm(h), *attn_args)
        return h + self._mlp(refs, layer.post_attention_layernorm(h))

    def _sandwich_block(self, refs: LayerRefs, h: torch.Tensor, *attn_args: torch.Tensor) -> torch.Tensor:
        """One decoder layer on the residual h [B, T, H] (Gemma-2/3): each sublayer's output is
        normed again before it joins the residual."""
        layer = refs.layer
        h = h + layer.post_attention_layernorm(self._attention(refs, layer.input_layernorm(h), *attn_args))
        return h + layer.post_feedforward_layernorm(self._mlp(refs, layer.pre_feedforward_layernorm(h)))

    def _mlp(self, refs: LayerRefs, x: torch.Tensor) -> torch.Tensor:
        """The layer's MLP on x [B, T, H]: the model's own, or with `fuse` its gate and up as one
        product [B, T, 2 I], halved."""
        mlp = refs.layer.mlp
        if refs.gate_up is None:
            return mlp(x)
        gate, up = F.linear(x, *refs.gate_up).chunk(2, -1)  # [B, T, I] each
        return mlp.down_proj(mlp.act_fn(gate) * up)

    def _rotary(self, h: torch.Tensor, pos: torch.Tensor, kind: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, T, hd] at positions pos [B, T], for layers of type `kind` (`rotary_types`)."""
        cos, sin = self.base.rotary_emb(h, pos) if kind is None else self.base.rotary_emb(h, pos, kind)  # [B, T, hd]
        return cos[:, None], sin[:, None]

    def _forward(
        self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids, pos, slots [B, T] (the cache slots each row writes); mask [B, 1, T, S] bool. Returns logits [B, T, V] (float32; [B, 1, V] with `last_only`)
        and aux [B, T, n_aux*H] (n_aux = 0 without aux layers)."""
        h = self.embed(ids)  # [B, T, H] (Gemma's embedding scales by sqrt(H) itself)
        rope = {kind: self._rotary(h, pos, kind) for kind in dict.fromkeys(self.rotary_types)}  # each type once
        if self.flash_decode and ids.shape[1] == 1:  # the step reads its rows' slots, no mask
            meta = self._flash_meta(mask[:, 0, 0])
            masks: dict[bool, Any] = {False: meta, True: meta}
        else:
            masks = self._masks(pos, slots, mask)  # sliding or not -> [B, 1, g*T, S]
        aux: dict[int, torch.Tensor] = {}
        for i, refs in enumerate(self.refs):
            if i in self.aux_layer_ids:
                aux[i] = h
            h = self.layer_step(refs, h, *rope[self.rotary_types[i]], slots, masks[self.sliding[i]])
        aux[len(self.layers)] = h
        captured = (
            torch.cat([aux[k] for k in self.aux_layer_ids], dim=-1) if self.aux_layer_ids else h[..., :0]
        )  # [B, T, n_aux*H]
        if last_only:
            h = h[:, -1:]  # [B, 1, H]: prompts need only the next token's logits
        logits = self.lm_head(self.norm(h))  # [B, T, V]
        if self.logit_cap is not None:  # in the model's dtype, as its forward caps
            logits = softcap(logits, self.logit_cap)
        return logits.float(), captured

    def _flash_meta(self, seen: torch.Tensor) -> FlashDecode:
        """seen [B, S] bool: the slots each row's one token sees, a contiguous run first..last
        (a one-token step always sees that: its row's tokens, itself last; a padding slot of a
        prompt only itself) -> `FlashDecode` over the first B rows of the cache."""
        b, s = seen.shape
        first = seen.int().argmax(-1)  # [B]
        last = s - 1 - seen.flip(-1).int().argmax(-1)  # [B]
        # the sequences, one per (row, KV head), and one past the last
        seq = torch.arange(b * self.nkv + 1, device=seen.device, dtype=torch.int32)
        start = seq * self.max_len  # [B*nkv + 1]: where each sequence's cache rows begin
        start[:-1] += first.repeat_interleave(self.nkv).to(torch.int32)
        used = (last - first + 1).repeat_interleave(self.nkv).to(torch.int32)  # [B*nkv]
        return FlashDecode(seq, start, used, s)

    def _masks(self, pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> dict[bool, torch.Tensor]:
        """{False: the full layers' mask, True: the sliding layers'}, each [B, 1, g*T, S], one row
        per grouped query. A sliding layer's query at position p sees only the slots whose
        tokens sit at positions > p - window (transformers' sliding-window overlay); pos, slots
        [B, T]; mask [B, 1, T, S]."""
        g = self.nh // self.nkv
        full = mask.repeat(1, 1, g, 1)
        if self.slot_pos is None:
            return {False: full, True: full}
        slot_pos = self.slot_pos[: pos.shape[0]]  # [B, max_len]: the first B rows'
        slot_pos.scatter_(1, slots, pos)  # these tokens' positions, at their slots
        near = slot_pos[:, None, None, : mask.shape[-1]] > pos[:, None, :, None] - self.window  # [B, 1, T, S]
        return {False: full, True: (mask & near).repeat(1, 1, g, 1)}

    def _forward_eager(
        self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_forward` over only the cache slots that some token sees. slots [B, T], mask [B, T, S]."""
        used = int(torch.nonzero(mask.flatten(0, 1).any(0)).max()) + 1
        with torch.no_grad():
            return self._forward(ids, pos, slots, mask[:, None, :, :used], last_only)

    @torch.no_grad()
    def forward_batch(
        self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run `ids [B, T]` (B <= batch: the cache's first B rows) at positions `pos [B, T]`,
        writing their K/V at cache `slots [B, T]` (or [T]: the same in every row); `mask [B, T,
        S]` (S <= max_len) says which of the first S cache slots each token sees (its own slot
        included). Returns logits [B, T, V] and aux [B, T, n_aux*H]. Uses the CUDA graph captured
        for (B, T, S) when there is one (its outputs are overwritten by its next replay);
        `last_only` (prompts: logits [B, 1, V]) always runs eagerly."""
        slots = slots.expand(ids.shape[0], -1)  # [B, T]
        graph = None if last_only else self.graphs.get((*ids.shape, mask.shape[-1]))
        if graph is not None:
            return graph(ids, pos, slots, mask[:, None])  # mask [B, 1, T, S]
        return self._forward_eager(ids, pos, slots, mask, last_only)

    def forward(
        self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch 1: run `ids [T]` at positions `pos [T]`, writing their K/V at cache `slots [T]`;
        `mask [T, max_len]` says which cache slots each token sees (its own slot included).
        Returns logits [T, V] and aux [T, n_aux*H]."""
        logits, aux = self.forward_batch(ids[None], pos[None], slots, mask[None])
        return logits[0], aux[0]

    def chain(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch 1: run `ids [T]` at slots/positions start..start+T-1 under the causal mask
        (plain decoding, chain verification). Slots from `start` on are overwritten, so a
        rejected draft needs no undoing. Returns logits [T, V] and aux [T, n_aux*H]."""
        slots = torch.arange(start, start + ids.shape[0], device=self.device)  # [T], also the positions
        return self.forward(ids, slots, slots, self.causal_mask(start, ids.shape[0]))

    # -- helpers ---------------------------------------------------------------------------
    def causal_mask(self, start: int, t: int) -> torch.Tensor:
        """[t, max_len]: token j (at slot start+j) sees slots 0..start+j."""
        cols = torch.arange(self.max_len, device=self.device)
        rows = torch.arange(start, start + t, device=self.device)
        return cols[None, :] <= rows[:, None]

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the cache with a prompt `ids [P]` at slots/positions 0..P-1 (always eager)."""
        p = ids.shape[0]
        if p >= self.max_len:
            raise UserError(f"prompt of {p} tokens does not fit the KV cache of {self.max_len}; raise --max-len")
        pos = torch.arange(p, device=self.device)
        logits, aux = self._forward_eager(ids[None], pos[None], pos[None], self.causal_mask(0, p)[None])
        return logits[0], aux[0]

    @contextlib.contextmanager
    def scratch_cache(self, rows: int, width: int) -> Iterator[Scratch]:
        """Within: eager forwards read and write a cache of their own, `rows` x `width` slots (prompts
        prefilled beside a running batch, whose cache stays as it is), yielded for `place`."""
        saved = self.kv, self.refs, self.max_len, self.slot_pos
        kv = torch.zeros((2, len(self.layers), rows, self.nkv, width, self.hd), device=self.device, dtype=self.dtype)
        slot_pos = None if self.slot_pos is None else torch.zeros(rows, width, dtype=torch.long, device=self.device)
        self.kv, self.max_len, self.slot_pos = kv, width, slot_pos
        self.refs = [refs._replace(k=kv[0, i], v=kv[1, i]) for i, refs in enumerate(self.refs)]
        try:
            yield Scratch(kv, slot_pos)
        finally:
            self.kv, self.refs, self.max_len, self.slot_pos = saved

    def place(self, scratch: Scratch, rows: torch.Tensor, at: int) -> None:
        """A scratch cache's rows into cache rows `rows` [n] (on the device), its slots 0..w-1 at
        slots at..at+w-1: every layer's keys and values, and under a sliding window the tokens'
        positions."""
        w = scratch.kv.shape[4]
        self.kv[:, :, rows, :, at : at + w] = scratch.kv
        if self.slot_pos is not None:
            self.slot_pos[rows, at : at + w] = scratch.slot_pos

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Move the cache rows `rows` [R] (on the device) to rows 0..R-1, in that order: what a
        forward of R rows then reads. One layer at a time, so that the copy in flight is a layer's."""
        r = rows.shape[0]
        for layer in range(self.kv.shape[1]):
            self.kv[:, layer, :r] = self.kv[:, layer, rows]  # [2, R, nkv, max_len, hd]
        if self.slot_pos is not None:
            self.slot_pos[:r] = self.slot_pos[rows]

    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move each row's accepted path's K/V from slots `src` to slots `dst` (both [B, n], on
        the device: no host sync), by the CUDA graph captured for n rows when there is one."""
        self.functions.get(("compact", src.shape[1]), self.compact_eager)(src, dst)

    def compact_eager(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """`compact` without its graph (for a function captured whole, such as eval's tree
        acceptance): every layer's keys and values at once, one gather, one scatter (two kernels,
        not four a layer)."""
        b, n = src.shape
        if self.slot_pos is not None:  # the moved tokens keep their positions
            self.slot_pos.scatter_(1, dst, self.slot_pos.gather(1, src))
        shape = (*self.kv.shape[:2], b, self.nkv, n, self.hd)  # [2, L, B, nkv, n, hd]
        src, dst = (x[None, None, :, None, :, None].expand(shape) for x in (src, dst))
        self.kv.scatter_(4, dst, self.kv.gather(4, src))

    # -- rows decoding on their own (eval) ---------------------------------------------------
    def prefill_rows(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prompt per row (`batch` of them), left-padded to the longest P: row b's token j
        at slot pad[b] + j, position j (always eager). Returns the logits at each prompt's last
        token [B, V], the aux states [B, P, n_aux*H] (padding columns: garbage), the padded ids
        [B, P] and pad [B]."""
        p = max(map(len, prompts))
        if len(prompts) != self.batch:
            raise ValueError(f"{len(prompts)} prompts for an engine of {self.batch} rows")
        if p >= self.max_len:
            raise UserError(f"prompt of {p} tokens does not fit the KV cache of {self.max_len}; raise --max-len")
        ids = torch.tensor([[0] * (p - len(x)) + list(x) for x in prompts], device=self.device)  # [B, P]
        pad = torch.tensor([p - len(x) for x in prompts], device=self.device)  # [B]
        cols = torch.arange(p, device=self.device)  # [P]: the slots
        seen = (cols >= pad[:, None, None]) & (cols <= cols[:, None])  # [B, P, P]: the prompt's causal mask
        seen |= cols == cols[:, None]  # a padding column sees itself (no empty softmax row)
        logits, aux = self._forward_eager(
            ids, (cols - pad[:, None]).clamp(min=0), cols.expand(len(prompts), -1), seen, last_only=True
        )
        return logits[:, -1], aux, ids, pad

    def rows_forward(
        self,
        ids: torch.Tensor,
        base: torch.Tensor,
        n: torch.Tensor,
        block: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Row b runs ids[b] [T] after its n[b] tokens, which sit at slots base[b].. (base, n
        [B] on the device): the tokens go to slots base+n.., at positions n + offsets (default
        0..T-1), each seeing the row's tokens and, among the new ones, `block` [B, T, T] (a
        tree's ancestors-or-self; default causal). Returns logits [B, T, V], aux [B, T, n_aux*H]."""
        b, t = ids.shape
        step = torch.arange(t, device=self.device)  # [T]
        block = (step[:, None] >= step).expand(b, t, t) if block is None else block  # [B, T, T]
        offsets = step.expand(b, t) if offsets is None else offsets  # [B, T]
        graph = self.row_graphs.get(t)
        if graph is not None:
            return graph(ids, base, n, block, offsets)
        return self._forward_eager(ids, *self._rows_inputs(base, n, block, offsets))

    def _rows_inputs(
        self, base: torch.Tensor, n: torch.Tensor, block: torch.Tensor, offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`rows_forward`'s positions, slots [B, T] and mask [B, T, S], built on the device."""
        b, t = offsets.shape
        start = base + n  # [B]: the first new slot
        slots = start[:, None] + torch.arange(t, device=self.device)  # [B, T]
        cols = torch.arange(self.max_len, device=self.device)  # [S]
        mask = ((cols >= base[:, None]) & (cols < start[:, None]))[:, None, :].repeat(
            1, t, 1
        )  # [B, T, S]: the row's tokens
        mask.scatter_(2, slots[:, None, :].expand(b, t, t), block)  # the new tokens among themselves
        return n[:, None] + offsets, slots, mask

    def _rows_graphed(
        self, ids: torch.Tensor, base: torch.Tensor, n: torch.Tensor, block: torch.Tensor, offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pos, slots, mask = self._rows_inputs(base, n, block, offsets)
        return self._forward(ids, pos, slots, mask[:, None])

    def graph_rows(self, t: int) -> None:
        """Capture `rows_forward` of `t` tokens, its mask building included, in a CUDA graph
        (no-op on CPU): eval's plain decoding (t=1) and verification (t = draft size + 1).
        Warm-up writes garbage K/V at slots 0..t-1 of every row: capture before a prefill."""
        if self.device.type != "cuda" or t in self.row_graphs:
            return
        t0 = time.perf_counter()
        b, step = self.batch, torch.arange(t, device=self.device)
        zeros = torch.zeros(b, dtype=torch.long, device=self.device)
        example = (
            zeros[:, None].expand(b, t),
            zeros,
            zeros,
            (step[:, None] >= step).expand(b, t, t),
            step.expand(b, t),
        )
        self.row_graphs[t] = self._capture(self._rows_graphed, *example)  # ids; base, n; block, offsets
        self.capture_seconds += time.perf_counter() - t0

    def graph(self, t: int, width: int | None = None, rows: int | None = None, at: int = 0) -> None:
        """Capture the forward of `t` tokens of the first `rows` rows (default all) attending
        over the first `width` cache slots (default all) in a CUDA graph (no-op on CPU). Its
        warm-up writes garbage K/V at slots at..at+t-1 of those rows: capture before a prefill,
        or mid-generation with `at` the slot that the next forward writes anyway."""
        width, b = width or self.max_len, rows or self.batch
        if self.device.type != "cuda" or (b, t, width) in self.graphs:
            return
        t0 = time.perf_counter()
        self.graphs[(b, t, width)] = self._capture(self._forward, *self.graph_example(t, width, b, at))
        self.capture_seconds += time.perf_counter() - t0

    def graph_example(self, t: int, width: int, rows: int, at: int = 0) -> tuple[torch.Tensor, ...]:
        """The inputs `graph` captures with (its warm-up runs them): ids, pos, slots [rows, t]
        (slots and positions at..at+t-1) and mask [rows, 1, t, width] (causal from slot 0)."""
        at_slots = torch.arange(at, at + t, device=self.device).repeat(rows, 1)  # [rows, t]
        return (
            torch.zeros(rows, t, dtype=torch.long, device=self.device),
            at_slots,
            at_slots,
            self.causal_mask(0, t)[:, :width].repeat(rows, 1, 1, 1),
        )

    def _capture(self, fn: Any, *example: torch.Tensor) -> Graphed:
        """`fn` in a CUDA graph, compiled first (inductor, this shape only) when `compiled`: the
        whole of it, or with compile_scope "layers" each layer's step; a compile that fails
        leaves the engine uncompiled from then on, and a flash decoding step that fails (a GPU
        that `flash_decode_problem` let through) leaves it masked from then on, the reason on stderr."""
        if self.compiled:
            try:  # every graph's shape is its own compile of the same forward: more than dynamo's default 8
                with torch._dynamo.config.patch(recompile_limit=64):
                    if self.compile_scope == "layers":
                        with self.layers_compiled():
                            return Graphed(fn, *example)
                    return Graphed(torch.compile(fn, dynamic=False), *example)
            except Exception as e:
                print(
                    f"[engine] torch.compile of the target's forward failed ({type(e).__name__}: {str(e)[:200]}); "
                    "capturing the eager forward",
                    file=sys.stderr,
                    flush=True,
                )
                self.compiled = False
        try:
            return Graphed(fn, *example)
        except RuntimeError as e:  # raised by the kernel's own checks in the warm-up, before any capture
            if not self.flash_decode:
                raise
            print(
                f"[engine] flash decoding failed ({type(e).__name__}: {str(e)[:200]}); decoding through masked "
                "SDPA (pass --no-flash-decode to skip the attempt)",
                file=sys.stderr,
                flush=True,
            )
            self.flash_decode = False
            return Graphed(fn, *example)

    @contextlib.contextmanager
    def layers_compiled(self) -> Iterator[None]:
        """Within: every layer runs one compiled step (`_block` under torch.compile, static shapes,
        created once): the layers share its graph, their weights and cache views its arguments,
        so a shape compiles one layer's code, not the whole forward's."""
        if self.compiled_step is None:
            self.compiled_step = torch.compile(self._block, dynamic=False)
        self.layer_step = self.compiled_step
        try:
            yield
        finally:
            self.layer_step = self._block

    def graphed(self, key: tuple, fn: Any, *example: torch.Tensor) -> Any:
        """`fn`, a function of fixed-shape tensors that may move this engine's cache (a tree's
        compaction, eval's tree acceptance), in a CUDA graph captured once per `key` (its warm-up
        runs `example`, which must leave the cache as it was); off a GPU, `fn` itself."""
        if self.device.type != "cuda":
            return fn
        if key not in self.functions:
            t0 = time.perf_counter()
            self.functions[key] = Graphed(fn, *example)
            self.capture_seconds += time.perf_counter() - t0
        return self.functions[key]

    def graph_compact(self, n: int) -> None:
        """Capture `compact` of n rows (a tree's accepted path, padded) in a CUDA graph (no-op on
        CPU). Its warm-up copies slots 0..n-1 onto themselves."""
        rows = torch.arange(n, device=self.device).repeat(self.batch, 1)  # [B, n]
        self.graphed(("compact", n), self.compact_eager, rows, rows)
