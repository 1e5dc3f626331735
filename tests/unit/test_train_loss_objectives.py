"""train --loss tv and lk (train/loss.py): the chunked objective against a plain dense reference
(value and gradient, chunk sizes, kept rows), the whole TTT objective against a per-position
reference on the dynamic and static steps (and the static student as dynamo compiles it), and
the command: it trains, logs the objective under its name, records it, and refuses a --resume
with another --loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.draft.step_weights import STEP_DECAY
from draftsmith.runtime.head import OutputHead
from draftsmith.train.config import TrainConfig
from draftsmith.train.loss import (
    LK_ETA,
    STAT_KEYS,
    Teacher,
    TTTObjective,
    _chunk_acceptance,
    _compiled,
    _soft_ce_op,
    soft_ce,
)
from draftsmith.train.metrics import read_metrics, summarise
from draftsmith.train.ttt import unroll
from tests.helpers import write_tokenized_dataset
from tests.unit.test_ttt_loss import VD, assert_same_step, grads, packed_batch, static_batch, teacher_head, tiny_drafter


def dense_objective(z: torch.Tensor, t: torch.Tensor, objective: str, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Student logits z [..., Vd], teacher logits t [..., Vd] -> (objective [...], soft CE [...]),
    written out plainly: α = Σ min(p, q), TV = ½ Σ |p - q|, LK^λ = λ KL + (1 - λ) TV, λ = exp(-η α)
    held constant (detached)."""
    p, log_q = F.softmax(t, -1), F.log_softmax(z, -1)
    q = log_q.exp()
    ce = -(p * log_q).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    if objective == "tv":
        return tv, ce
    alpha = torch.minimum(p, q).sum(-1)
    lam = torch.exp(-eta * alpha).detach()
    kl = (p * (F.log_softmax(t, -1) - log_q)).sum(-1)
    return lam * kl + (1 - lam) * tv, ce


def random_rows(n: int = 11, h: int = 16, m: int = 30, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, h, generator=g), 0.5 * torch.randn(VD, h, generator=g)
    t_logits = 2 * torch.randn(m, VD, generator=g)
    rows = torch.randint(0, m, (n,), generator=g)
    teacher = Teacher(t_logits, torch.logsumexp(t_logits, -1), t_logits.argmax(-1))
    return x, w, teacher, rows


@pytest.mark.parametrize(("objective", "eta"), [("tv", LK_ETA), ("lk", LK_ETA), ("lk", 0.5)])
@pytest.mark.parametrize("chunk", [1, 4, 11, 4096])
@pytest.mark.parametrize("masked", [False, True])
def test_chunked_objective_matches_the_dense_reference(objective, eta, chunk, masked):
    """Σ objective and Σ ce over the kept rows, and the gradients of Σ objective in x and the
    lm_head weight, equal plain autograd through the dense formulas (fp32), whatever the chunk."""
    x, w, teacher, rows = random_rows()
    keep = torch.tensor([1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1]).bool() if masked else None
    x.requires_grad_(True)
    w.requires_grad_(True)
    ce_sum, obj_sum, pred = soft_ce(x, w, teacher, rows, chunk, keep=keep, objective=objective, eta=eta)
    obj_sum.backward()
    got = x.grad.clone(), w.grad.clone()
    x.grad, w.grad = None, None
    obj, ce = dense_objective(x @ w.T, teacher.logits[rows], objective, eta)
    kept = keep if keep is not None else torch.ones_like(obj, dtype=torch.bool)
    obj[kept].sum().backward()
    torch.testing.assert_close(obj_sum, obj[kept].sum().detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ce_sum, ce[kept].sum().detach(), rtol=1e-5, atol=1e-6)
    assert torch.equal(pred, (x @ w.T).argmax(-1))
    assert not ce_sum.requires_grad  # only the trained objective is differentiated
    torch.testing.assert_close(got[0], x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], w.grad, rtol=1e-5, atol=1e-6)


def test_tv_gradient_matches_finite_differences():
    """The TV gradient q (g - Σ q g), g = ½ sign(q - p), against central differences of the
    plain TV in fp64 (away from the kinks p = q, which random logits do not hit)."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 8, generator=g), torch.randn(VD, 8, generator=g)
    t_logits = torch.randn(4, VD, generator=g)
    _, _, _, dz = _chunk_acceptance(x, w, t_logits, torch.logsumexp(t_logits, -1), torch.arange(4), True)
    z = (x @ w.T).double()

    def tv(z: torch.Tensor) -> torch.Tensor:
        return dense_objective(z, t_logits.double(), "tv", 0.0)[0].sum()

    eps, numeric = 1e-6, torch.zeros_like(z)
    for i in range(z.shape[0]):
        for j in range(z.shape[1]):
            step = torch.zeros_like(z)
            step[i, j] = eps
            numeric[i, j] = (tv(z + step) - tv(z - step)) / (2 * eps)
    torch.testing.assert_close(dz.double(), numeric, rtol=1e-4, atol=1e-6)


def test_the_compiled_kernel_and_the_op_take_the_objective():
    """The chunk kernel as CUDA runs it (compiled; here for CPU) gives the eager values for tv and
    lk, rows left out zero; the opaque op of the static step passes torch's custom-op checks with
    either objective."""
    x, w, teacher, rows = random_rows(n=8)
    keep = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1]).bool()
    for eta in (None, LK_ETA):
        want = _chunk_acceptance(x, w, teacher.logits, teacher.lse, rows, True, keep, eta)
        got = _compiled(_chunk_acceptance)(x, w, teacher.logits, teacher.lse, rows, True, keep, eta)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        assert (want[0][~keep] == 0).all() and (want[3][~keep] == 0).all()
    for objective in ("tv", "lk"):
        for with_grad, want_dw in ((True, True), (False, False)):
            args = (x, w, teacher.logits, teacher.lse, rows, keep, 3, with_grad, want_dw, torch.float32, objective, 0.7)
            torch.library.opcheck(_soft_ce_op, args)


def reference(drafter, w_full, K, ids, loss_mask, doc, pos, aux, final, objective, eta):
    """The weighted loss and per-step Σ objective / Σ ce of --loss `objective`, one (step, row,
    position) at a time with the validity rules spelled out (as test_ttt_loss's reference)."""
    B, T = ids.shape
    w_draft = w_full[torch.arange(VD) + drafter.d2t]  # [Vd, H_t]
    outs = [out for _, out in unroll(drafter, drafter.project(aux), ids, pos, doc, K, "eager")]
    loss, obj_sums, ce_sums = torch.zeros(()), [], []
    for k in range(K):
        objs, ces = [], []
        for b in range(B):
            for t in range(T):
                s = t + 2 + k
                if not (
                    doc[b, t] >= 0
                    and s < T
                    and doc[b, s] == doc[b, t]
                    and bool(loss_mask[b, s])
                    and bool(drafter.t2d[(w_full @ final[b, s - 1]).argmax()])
                ):
                    continue
                logits = drafter.lm_head(drafter.norm(outs[k][b, t]))  # [Vd]
                obj, ce = dense_objective(logits, w_draft @ final[b, s - 1], objective, eta)
                objs.append(obj)
                ces.append(ce.detach())
        obj_sum = torch.stack(objs).sum() if objs else torch.zeros(())
        loss = loss + STEP_DECAY**k * obj_sum / max(len(objs), 1)
        obj_sums.append(float(obj_sum.detach()))
        ce_sums.append(float(sum(ces)))
    return loss, torch.tensor(obj_sums), torch.tensor(ce_sums)


@pytest.mark.parametrize("objective", ["tv", "lk"])
@pytest.mark.parametrize(("static", "chunk"), [(False, 3), (False, 4096), (True, 5), (True, 4096)])
def test_ttt_objective_matches_the_reference(objective, static, chunk):
    """The whole TTT objective with --loss tv / lk, on the dynamic (compacted) and the static step:
    the loss, Σ objective and Σ ce per step, the other counts as under ce, and every gradient."""
    drafter = tiny_drafter()
    w_full = teacher_head(drafter)
    batch = static_batch()
    eta = 1.5 if objective == "lk" else LK_ETA
    ref_loss, ref_obj, ref_ce = reference(drafter, w_full, 3, **batch, objective=objective, eta=eta)
    ref_loss.backward()
    ref_grads = grads(drafter)
    kwargs = {"ttt": 3, "backend": "eager", "chunk": chunk, "static": static}
    loss, stats = TTTObjective(drafter, OutputHead(w_full), **kwargs, loss=objective, lk_eta=eta)(**batch)
    loss.backward()
    new_grads = grads(drafter)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats["obj_sum"], ref_obj, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats["ce_sum"], ref_ce, rtol=1e-5, atol=1e-5)
    _, ce_stats = TTTObjective(drafter, OutputHead(w_full), **kwargs)(**batch)  # --loss ce: same counts
    for key in set(STAT_KEYS) - {"obj_sum"}:
        torch.testing.assert_close(stats[key], ce_stats[key], msg=key)
    assert (ce_stats["obj_sum"] == 0).all() and stats["n_valid"].min() > 5
    record = summarise(stats, loss=objective)
    assert record[f"{objective}_k"] == pytest.approx((ref_obj / stats["n_valid"]).tolist(), rel=1e-5)
    assert record["loss_k"] == pytest.approx((ref_ce / stats["n_valid"]).tolist(), rel=1e-5)  # still the soft CE
    assert new_grads.keys() == ref_grads.keys() and "lm_head.weight" in new_grads
    for name, g in new_grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["tv", "lk"])
def test_compiled_static_student_matches_the_compacted_step(objective):
    """The static student's region as CUDA compiles it (one graph, SoftCE's op inside with the
    objective, backward through it), with the aot_eager backend on CPU: the compacted step's
    loss, counts and gradients."""
    drafter = tiny_drafter()
    head = OutputHead(teacher_head(drafter))
    compacted = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7, loss=objective)
    static = TTTObjective(drafter, head, ttt=3, backend="eager", chunk=7, static=True, loss=objective)
    static.static_student = torch.compile(static.static_student, backend="aot_eager", fullgraph=True, dynamic=False)
    assert_same_step(drafter, compacted, static, packed_batch([[20, 6], [3, 9, 11]], T=32, seed=8))


def test_the_lk_default_is_one_number():
    assert TrainConfig.model_fields["lk_eta"].default == LK_ETA
    assert TrainConfig.model_fields["loss"].default == "ce"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 400, (int(n),), generator=g).tolist() for n in (30, 22, 35, 18, 27, 40)]
    return write_tokenized_dataset(tmp_path_factory.mktemp("loss") / "ds", samples)


def train_args(ds, target, out, *extra: str) -> list[str]:
    return [
        "train",
        str(ds),
        "--target",
        str(target),
        "--out",
        str(out),
        "--depth",
        "2",
        "--batch-tokens",
        "96",
        "--draft-vocab-size",
        "300",
        "--val-fraction",
        "0",
        "--device",
        "cpu",
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["tv", "lk"])
def test_train_with_an_acceptance_loss_lowers_it(objective, dataset, tiny_target_dir, tmp_path):
    """A few optimizer steps of `train --loss tv|lk` on the tiny model: the objective, logged under
    its name next to the soft CE, goes down over the epochs; run.yaml and the drafter record it."""
    out = tmp_path / "run"
    args = ["--steps", "9", "--log-every", "3", "--lr", "3e-3", "--loss", objective]
    res = CliRunner().invoke(app, train_args(dataset, tiny_target_dir, out, *args))
    assert res.exit_code == 0, res.output
    assert f"autocast off, loss {objective}" in res.output  # the run's first line says how it trains
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert [r["step"] for r in train] == [3, 6, 9]
    assert all(len(r[f"{objective}_k"]) == 2 and "loss_k" in r and "tau" in r for r in train)
    assert train[-1][objective] < train[0][objective] - 0.01, [r[objective] for r in train]
    assert any(r["split"] == "val" and objective in r for r in read_metrics(out))
    assert yaml.safe_load((out / "run.yaml").read_text())["config"]["loss"] == objective
    _, manifest = load_drafter(out)
    assert manifest["meta"]["loss"] == ("tv" if objective == "tv" else f"lk (eta {LK_ETA:g})")


def test_resume_with_another_loss_is_refused(dataset, tiny_target_dir, tmp_path):
    """--resume continues a run with the loss it was started with (run.yaml): another --loss is
    refused before anything is written; leaving --loss out resumes with the run's."""
    out = tmp_path / "run"
    runner = CliRunner()
    base = train_args(dataset, tiny_target_dir, out, "--steps", "1", "--save-every", "1")
    assert runner.invoke(app, [*base, "--loss", "tv"]).exit_code == 0
    before = (out / "run.yaml").read_bytes()
    for other in ("lk", "ce"):
        res = runner.invoke(app, [*base, "--loss", other, "--resume"])
        assert res.exit_code == 2 and f"--loss {other} (the run's: tv)" in res.output, res.output
    assert (out / "run.yaml").read_bytes() == before
    res = runner.invoke(app, [*base, "--resume"])
    assert res.exit_code == 0 and "nothing to train" in res.output, res.output
    old = tmp_path / "run-old"  # a run made before --loss existed (no `loss` in its run.yaml) trained ce
    old_args = train_args(dataset, tiny_target_dir, old, "--steps", "1", "--save-every", "1")
    assert runner.invoke(app, old_args).exit_code == 0
    record = yaml.safe_load((old / "run.yaml").read_text())
    del record["config"]["loss"], record["config"]["lk_eta"]
    (old / "run.yaml").write_text(yaml.safe_dump(record))
    res = runner.invoke(app, [*old_args, "--loss", "tv", "--resume"])
    assert res.exit_code == 2 and "was made with other options: --loss tv" in res.output, res.output
