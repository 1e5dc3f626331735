"""The TTT objective (teacher table, chunked `SoftCE` Function) against a slow, obviously-correct
reference: every step and position on its own, the validity rules spelled out, the teacher's
logits recomputed each time, and plain autograd through softmax/log_softmax (fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.draft.model import Eagle3Drafter
from draftsmith.draft.step_weights import STEP_DECAY
from draftsmith.runtime.head import OutputHead
from draftsmith.train import loss as loss_module
from draftsmith.train.loss import STAT_KEYS, TTTObjective, _chunk_ce, _compiled_chunk_ce, _soft_ce_op
from draftsmith.train.metrics import summarise
from draftsmith.train.ttt import doc_and_positions, unroll
from tests.helpers import tiny_ttt_drafter

V, VD, HT = 50, 6, 24


def tiny_drafter(seed: int = 0, num_layers: int = 1) -> Eagle3Drafter:
    model = tiny_ttt_drafter(seed, num_layers, vocab_size=V, draft_vocab_size=VD)
    draft_ids = torch.randperm(V)[:VD].sort().values  # target ids of the draft vocab
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    model.set_vocab(draft_ids - torch.arange(VD), t2d)
    return model


def teacher_head(drafter: Eagle3Drafter, seed: int = 2) -> torch.Tensor:
    """A random target lm_head [V, H_t] whose draft rows are larger, so that the target's argmax
    is often (not always) a draft token."""
    w = torch.randn(V, HT, generator=torch.Generator().manual_seed(seed))
    w[torch.arange(VD) + drafter.d2t] *= 2
    return w


def packed_batch(rows: list[list[int]], T: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """Rows of packed samples (lengths), padded to T; random ids, states and a loss mask with holes."""
    g = torch.Generator().manual_seed(seed)
    docs, poss = zip(*(doc_and_positions(lengths, T) for lengths in rows))
    B = len(rows)
    return {
        "ids": torch.randint(0, V, (B, T), generator=g),
        "loss_mask": (torch.rand(B, T, generator=g) > 0.2).long(),
        "doc": torch.stack(docs),
        "pos": torch.stack(poss),
        "aux": torch.randn(B, T, 3 * HT, generator=g),
        "final": 2 * torch.randn(B, T, HT, generator=g),
    }


def reference(drafter, w_full, K, ids, loss_mask, doc, pos, aux, final, reached_only=False, temperature=1.0):
    """Loss and stats, one (step, row, position) at a time. `reached_only`: step k's loss is the
    mean over the positions whose steps 0..k-1 were all valid and correct; `temperature`: the
    teacher's logits are divided by it."""
    B, T = ids.shape
    w_draft = w_full[torch.arange(VD) + drafter.d2t]  # [Vd, H_t]
    outs = [out for _, out in unroll(drafter, drafter.project(aux), ids, pos, doc, K, "eager")]
    loss = torch.zeros(())
    stats = {key: [0.0] * K for key in STAT_KEYS}
    trained = [0] * K  # the positions each step's loss averages over
    chain = [[True] * T for _ in range(B)]
    for k in range(K):
        ces = []
        for b in range(B):
            for t in range(T):
                s = t + 2 + k  # the predicted token; the teacher reads the target's state at s-1
                valid = (
                    doc[b, t] >= 0
                    and s < T
                    and doc[b, s] == doc[b, t]
                    and bool(loss_mask[b, s])
                    and bool(drafter.t2d[(w_full @ final[b, s - 1]).argmax()])
                )
                if not valid:
                    chain[b][t] = False
                    continue
                teacher = w_draft @ final[b, s - 1]  # [Vd]
                logits = drafter.lm_head(drafter.norm(outs[k][b, t]))  # [Vd]
                if chain[b][t] or not reached_only:
                    ces.append(-(F.softmax(teacher / temperature, -1) * F.log_softmax(logits, -1)).sum())
                correct = bool(logits.argmax() == teacher.argmax())
                stats["n_valid"][k] += 1
                stats["n_correct"][k] += correct
                stats["n_chain"][k] += chain[b][t]
                stats["n_chain_correct"][k] += chain[b][t] and correct
                chain[b][t] = chain[b][t] and correct
        ce_sum = torch.stack(ces).sum() if ces else torch.zeros(())
        stats["ce_sum"][k] = float(ce_sum.detach())
        trained[k] = len(ces)
        loss = loss + STEP_DECAY**k * ce_sum / max(len(ces), 1)
    return loss, {key: torch.tensor(vals) for key, vals in stats.items()}, trained


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("chunk", "reached_only", "temperature", "layers"),
    [(3, False, 1.0, 1), (4096, False, 1.0, 1), (3, True, 1.0, 1), (3, False, 0.5, 1), (3, False, 1.0, 2)],
)
def test_loss_stats_and_grads_match_the_reference(chunk, reached_only, temperature, layers):
    drafter = tiny_drafter(seed=0 if layers == 1 else 2, num_layers=layers)  # seed 2: a chain correct at step 1
    w_full = teacher_head(drafter)
    batch = packed_batch([[7, 5, 9], [10, 14]], T=24, seed=11)  # row 0 ends with 3 padding positions
    ref_loss, ref_stats, trained = reference(
        drafter, w_full, 3, **batch, reached_only=reached_only, temperature=temperature
    )
    ref_loss.backward()
    ref_grads = grads(drafter)
    loss, stats = TTTObjective(
        drafter,
        OutputHead(w_full),
        ttt=3,
        backend="eager",
        chunk=chunk,
        reached_only=reached_only,
        teacher_temperature=temperature,
    )(**batch)  # training mode
    loss.backward()
    assert ref_stats["n_valid"].min() > 3 and ref_stats["n_valid"].max() < 2 * 24 - 10  # several chunks; many invalid
    assert ref_stats["n_chain_correct"][1] > 0  # the chained counts are exercised
    # the loss averages over n_chain (reached) or n_valid positions per step, as `summarise` divides
    assert trained == ref_stats["n_chain" if reached_only else "n_valid"].long().tolist()
    if reached_only:  # step 0 trains on every valid position, later steps on the reached ones only
        assert trained[0] == ref_stats["n_valid"][0] and 0 < trained[1] < ref_stats["n_valid"][1]
    per_position = [c / max(n, 1) for c, n in zip(ref_stats["ce_sum"].tolist(), trained, strict=True)]
    assert summarise(stats, reached_only)["loss_k"] == pytest.approx(per_position, rel=1e-5)  # the logged loss_k
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for key in STAT_KEYS:
        torch.testing.assert_close(stats[key], ref_stats[key], rtol=1e-5, atol=1e-5, msg=key)
    new_grads = grads(drafter)
    assert new_grads.keys() == ref_grads.keys() and "lm_head.weight" in new_grads and "norm.weight" in new_grads
    later = [g for name, g in new_grads.items() if name.startswith("extra_layers.")]  # layers 1..: trained too
    assert len(later) == 9 * (layers - 1) and all(g.abs().sum() > 0 for g in later)
    for name, g in new_grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_no_grad_forward_gives_the_same_loss_and_stats():
    drafter = tiny_drafter()
    objective = TTTObjective(drafter, OutputHead(teacher_head(drafter)), ttt=2, backend="eager", chunk=5)
    batch = packed_batch([[9, 12]], T=21)
    loss, stats = objective(**batch)
    with torch.no_grad():
        loss_ng, stats_ng = objective(**batch)
    torch.testing.assert_close(loss_ng, loss.detach())
    for key in STAT_KEYS:
        torch.testing.assert_close(stats_ng[key], stats[key])


def test_empty_steps_still_use_every_parameter():
    """A short row leaves the late steps without a valid position: every trainable parameter must
    still get a gradient (DDP fails on parameters unused in a step)."""
    drafter = tiny_drafter()
    batch = packed_batch([[4]], T=4)
    batch["loss_mask"][:] = 1
    loss, stats = TTTObjective(drafter, OutputHead(teacher_head(drafter)), ttt=4, backend="eager", chunk=2)(**batch)
    assert stats["n_valid"][-1] == 0
    loss.backward()
    assert all(p.grad is not None for p in drafter.parameters() if p.requires_grad)


@pytest.mark.slow
def test_compiled_chunk_matches_eager():
    """The per-chunk kernel that CUDA runs compiled (here compiled for CPU): same values, also
    for a shorter last chunk (a dynamic row count)."""
    torch.manual_seed(0)
    w, t_logits = torch.randn(VD, 16), 3 * torch.randn(30, VD)
    t_lse = torch.logsumexp(t_logits, -1)
    for c in (8, 5):
        x, rows = torch.randn(c, 16), torch.randint(0, 30, (c,))
        for with_grad in (True, False):
            ce, top, dz = _chunk_ce(x, w, t_logits, t_lse, rows, with_grad)
            ce_c, top_c, dz_c = _compiled_chunk_ce()(x, w, t_logits, t_lse, rows, with_grad)
            torch.testing.assert_close(ce_c, ce)
            assert torch.equal(top_c, top)
            torch.testing.assert_close(dz_c, dz)


def static_batch() -> dict[str, torch.Tensor]:
    """Two rows of several packed samples each, both padded (row 0 by 8 positions, row 1 by 6)."""
    return packed_batch([[7, 5, 9, 3], [10, 14, 2]], T=32, seed=6)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("chunk", "reached_only", "temperature"), [(5, False, 1.0), (4096, False, 1.0), (5, True, 1.0), (5, False, 0.5)]
)
def test_static_step_matches_the_compacted_step(chunk, reached_only, temperature):
    """--compile-step's static form (every position, the valid ones masked; CPU: eager) gives the
    default step's loss, counts and gradients: padding, several samples per row, two rows,
    positions whose teacher argmax is not a draft token, one or several chunks per step; also
    with --ttt-positions reached and with a teacher temperature."""
    drafter = tiny_drafter()
    head = OutputHead(teacher_head(drafter))
    batch = static_batch()
    out = {}
    for static in (False, True):
        loss, stats = TTTObjective(
            drafter,
            head,
            ttt=3,
            backend="eager",
            chunk=chunk,
            static=static,
            reached_only=reached_only,
            teacher_temperature=temperature,
        )(**batch)
        loss.backward()
        out[static] = loss, stats, grads(drafter)
    (loss, stats, g), (s_loss, s_stats, s_g) = out[False], out[True]
    argmax = batch["final"] @ head.weight.T  # [B, T, V]
    needed = torch.cat([batch["loss_mask"][:, 1:], torch.zeros(2, 1, dtype=torch.long)], 1).bool() & (batch["doc"] >= 0)
    assert not drafter.t2d[argmax.argmax(-1)][needed].all()  # some trained positions have a non-draft teacher argmax
    assert stats["n_valid"].min() > 5 and stats["n_chain_correct"][1] > 0
    torch.testing.assert_close(s_loss, loss, rtol=1e-5, atol=1e-6)
    for key in STAT_KEYS:
        torch.testing.assert_close(s_stats[key], stats[key], rtol=1e-5, atol=1e-5, msg=key)
    assert {
        "fc.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.mlp.down_proj.weight",
        "lm_head.weight",
    } <= g.keys()
    assert s_g.keys() == g.keys()
    for name in g:
        torch.testing.assert_close(s_g[name], g[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_static_step_traces_as_one_graph():
    """The static step has no host sync (a boolean-mask index would break dynamo's graph): one
    graph, no breaks, with and without gradients."""
    drafter = tiny_drafter()
    objective = TTTObjective(drafter, OutputHead(teacher_head(drafter)), ttt=3, backend="eager", chunk=20, static=True)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            explained = torch._dynamo.explain(objective.static_step)(**static_batch())
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_compiled_static_student_matches_the_compacted_step():
    """The student's region as CUDA compiles it (dynamo and AOTAutograd, one graph, SoftCE's op
    inside, backward through it), here with the aot_eager backend on CPU: the compacted step's
    loss, counts and gradients, and the same again on a second batch without recompiling."""
    drafter = tiny_drafter()
    head = OutputHead(teacher_head(drafter))
    compacted = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7)
    static = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7, static=True)
    static.static_student = torch.compile(static.static_student, backend="aot_eager", fullgraph=True, dynamic=False)
    for i, batch in enumerate((static_batch(), packed_batch([[20, 6], [3, 9, 11]], T=32, seed=8))):
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            assert_same_step(drafter, compacted, static, batch)


def assert_same_step(drafter: Eagle3Drafter, compacted: TTTObjective, static: TTTObjective, batch: dict) -> None:
    """The static objective's loss, counts and gradients on `batch` equal the compacted one's."""
    loss, stats = compacted(**batch)
    loss.backward()
    g = grads(drafter)
    s_loss, s_stats = static(**batch)
    s_loss.backward()
    s_g = grads(drafter)
    torch.testing.assert_close(s_loss, loss, rtol=1e-5, atol=1e-6)
    for key in STAT_KEYS:
        torch.testing.assert_close(s_stats[key], stats[key], rtol=1e-5, atol=1e-5, msg=key)
    for name in g:
        torch.testing.assert_close(s_g[name], g[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_compiled_region_runs_on_cuda_only_and_only_in_the_static_form():
    """The one rule that the static step (which region runs) and `Trainer.validate` (whether to
    validate with gradients on) both read."""
    drafter = tiny_drafter()
    head = OutputHead(teacher_head(drafter))
    static = TTTObjective(drafter, head, ttt=3, backend="eager", static=True)
    compacted = TTTObjective(drafter, head, ttt=3, backend="eager")
    assert static.compiled_on(torch.device("cuda", 0)) and not static.compiled_on(torch.device("cpu"))
    assert not compacted.compiled_on(torch.device("cuda", 0))


def test_validation_with_gradients_replays_the_training_region():
    """Nothing inside the compiled static region tells training from validation: after a training
    step, an eval-mode forward with gradients on (how `Trainer.validate` runs the compiled step)
    reuses the region's graph, and counts what a validation without gradients counts, the walked
    counts included. Under no_grad the region compiles a second graph (what the H200 paid ~100 s
    for once per run)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    drafter = tiny_drafter()
    head = OutputHead(teacher_head(drafter))
    plain = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7, static=True).eval()
    compiled = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7, static=True, aux_noise=0.1)
    counter = CompileCounterWithBackend("aot_eager")
    compiled.static_student = torch.compile(compiled.static_student, backend=counter, fullgraph=True, dynamic=False)
    batch = static_batch()
    compiled.train()
    compiled(**batch)[0].backward()
    compiled.eval()
    with torch.no_grad():
        with torch.enable_grad(), torch._dynamo.config.patch(error_on_recompile=True):
            stats = compiled(**batch)[1]
        want = plain(**batch)[1]
    assert counter.frame_count == 1
    for key in STAT_KEYS:
        torch.testing.assert_close(stats[key], want[key], rtol=1e-5, atol=1e-5, msg=key)
    assert want["walk_reach"].sum() > 0  # the walk ran
    with torch.no_grad():
        compiled(**batch)
    assert counter.frame_count == 2


def test_compiled_static_step_under_autocast_compiles_once_in_bf16(monkeypatch):
    """The CUDA form of --compile-step, on CPU: the student's region compiled (inductor) with
    SoftCE's op inside, and the op's chunk kernel compiled too, under bf16 autocast. A second
    batch recompiles neither (the op's first run leaves other dispatch keys on than its later
    ones; the chunk kernel once recompiled there, on an H200), and the op's matmuls run in bf16
    as the compacted step's do (the compiled region runs with autocast off inside)."""
    seen = []

    def kernel(device):
        def run(x, w, *rest):
            seen.append((x.dtype, w.dtype))
            return _compiled_chunk_ce()(x, w, *rest)

        return run

    monkeypatch.setattr(loss_module, "_chunk_kernel", kernel)
    drafter = tiny_drafter()
    head = OutputHead(teacher_head(drafter))
    compacted = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7)
    static = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7, static=True)
    static.static_student = torch.compile(static.static_student, fullgraph=True, dynamic=False)
    for i, batch in enumerate((static_batch(), packed_batch([[20, 6], [3, 9, 11]], T=32, seed=8))):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = compacted(**batch)
            seen.clear()
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                s_loss, _ = static(**batch)
        s_loss.backward()
        assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}, seen
        torch.testing.assert_close(s_loss, loss, rtol=1e-3, atol=1e-4)


def test_compiled_chunk_with_keep_matches_eager():
    """The per-chunk kernel with a `keep` mask: rows left out give zero ce and gradient, even
    when their values are not finite; the kept rows are unchanged. The opaque op of SoftCE's
    forward pass (what the compiled static step calls) passes torch's custom-op checks."""
    torch.manual_seed(0)
    w, t_logits = torch.randn(VD, 16), 3 * torch.randn(30, VD)
    t_lse = torch.logsumexp(t_logits, -1)
    x, rows, keep = torch.randn(8, 16), torch.randint(0, 30, (8,)), torch.tensor([1, 0, 1, 1, 0, 0, 1, 1]).bool()
    x[1] = float("nan")
    ce, top, dz = _chunk_ce(x, w, t_logits, t_lse, rows, True, keep)
    ce_all, _, dz_all = _chunk_ce(x[keep], w, t_logits, t_lse, rows[keep], True)
    torch.testing.assert_close(ce[keep], ce_all)
    torch.testing.assert_close(dz[keep], dz_all)
    assert (ce[~keep] == 0).all() and (dz[~keep] == 0).all()
    ce_c, top_c, dz_c = _compiled_chunk_ce()(x, w, t_logits, t_lse, rows, True, keep)
    torch.testing.assert_close(ce_c, ce)
    assert torch.equal(top_c[keep], top[keep])
    torch.testing.assert_close(dz_c, dz)
    x[1] = 0.0  # (opcheck compares runs, and NaN differs from itself)
    for with_grad, want_dw in ((True, True), (True, False), (False, False)):
        torch.library.opcheck(_soft_ce_op, (x, w, t_logits, t_lse, rows, keep, 3, with_grad, want_dw, torch.float32))
