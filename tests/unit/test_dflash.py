"""The DFlash block drafter (`--method dflash`): its training blocks equal each block drafted
alone, speculative decoding with it is lossless (greedy: token for token the target's own), and
`train --method dflash` writes a drafter that eval and export take."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.draft.dflash import DFlashDrafter, block_mask
from draftsmith.evaluate.decode import decode
from draftsmith.evaluate.dflash_proposer import DFlashProposer
from draftsmith.layers import default_aux_layers
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.target import decoder_layers
from draftsmith.train.metrics import read_metrics
from tests.helpers import random_dflash, write_tokenized_dataset


@torch.no_grad()
def test_training_blocks_equal_each_block_alone(tiny_model):
    """Blocks anchored in a packed row of two samples, drafted in one forward under `block_mask`,
    give each block's outputs drafted alone after its own sample's context."""
    d = random_dflash(tiny_model).double()
    bs, t = d.config.block_size, 20
    doc = torch.tensor([0] * 12 + [1] * 8)
    pos = torch.cat([torch.arange(12), torch.arange(8)])
    ids = torch.randint(0, 1000, (t,))
    aux = torch.randn(1, t, d.fc.in_features, dtype=torch.float64)
    anchors = torch.tensor([0, 5, 11, 12, 16])
    kv = d.context_kv(d.context(aux), pos[None])
    block_ids = d.block_ids(ids[anchors]).flatten()[None]
    block_pos = (pos[anchors][:, None] + torch.arange(bs)).flatten()[None]
    out = d(block_ids, block_pos, kv, block_mask(anchors, doc, bs, t)[None]).view(len(anchors), bs, -1)
    for i, a in enumerate(anchors.tolist()):
        start = 0 if a < 12 else 12  # the anchor's sample
        ctx = aux[:, start:a]
        kv_alone = d.context_kv(d.context(ctx), pos[None, start:a])
        mask = torch.ones(1, bs, a - start + bs, dtype=torch.bool)
        alone = d(
            d.block_ids(ids[a : a + 1])[None, 0][None].view(1, bs), block_pos[:, i * bs : (i + 1) * bs], kv_alone, mask
        )
        assert torch.allclose(out[i], alone[0], atol=1e-10), a


@pytest.mark.slow
@pytest.mark.parametrize("depth", [1, 3])
def test_greedy_dflash_decoding_equals_plain(tiny_model, depth):
    """fp32 greedy: two rows of different lengths decode token for token as plain decoding, with
    a trained-looking acceptance or none (random drafter: the equality is the point)."""
    engine = TargetEngine(tiny_model, default_aux_layers(len(decoder_layers(tiny_model))), 256, batch=2)
    drafter = random_dflash(tiny_model, block_size=4)
    prompts = [torch.randint(3, 1000, (n,)).tolist() for n in (9, 14)]
    plain = decode(engine, prompts, 24, set(), Sampling(temperature=0.0))
    proposer = DFlashProposer(drafter, Sampling(temperature=0.0), 256, depth, batch=2)
    spec = decode(engine, prompts, 24, set(), Sampling(temperature=0.0), proposer)
    assert [s.tokens for s in spec] == [p.tokens for p in plain]
    assert all(len(a) > 0 and max(a) <= depth for a in (s.accepts for s in spec))


@torch.no_grad()
def test_proposer_drafts_the_training_block(tiny_model):
    """The proposer's draft after a prompt is the argmax of the training formulation's block at
    that anchor (the context through its KV cache = the context through the block mask)."""
    engine = TargetEngine(tiny_model, default_aux_layers(len(decoder_layers(tiny_model))), 128)
    drafter = random_dflash(tiny_model, block_size=5, seed=3)
    prompt = torch.randint(3, 1000, (11,))
    logits, aux, ids, pad = engine.prefill_rows([prompt.tolist()])
    bonus = logits.argmax(-1)  # [1]
    proposer = DFlashProposer(drafter, Sampling(temperature=0.0), 128, 4)
    proposer.observe_prompt(aux, torch.cat([ids[:, 1:], bonus[:, None]], dim=1), pad)
    draft = proposer.propose().tokens  # [1, 4]
    kv = drafter.context_kv(drafter.context(aux), torch.arange(11)[None])
    block = drafter.block_ids(bonus)  # [1, 5]
    out = drafter(block, 11 + torch.arange(5)[None], kv, torch.ones(1, 5, 16, dtype=torch.bool))
    assert torch.equal(draft, drafter.logits(out)[:, 1:].argmax(-1))


def _samples(n: int, seed: int = 0) -> list[list[int]]:
    g = np.random.default_rng(seed)
    return [g.integers(3, 400, size=int(g.integers(12, 40))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def dflash_run(tmp_path_factory, tiny_target_dir):
    root = tmp_path_factory.mktemp("dflash")
    ds = write_tokenized_dataset(root / "ds", _samples(10))
    args = [
        "train", str(ds), "--target", str(tiny_target_dir), "--out", str(root / "run"), "--method", "dflash",
        "--steps", "6", "--depth", "3", "--batch-tokens", "96", "--draft-vocab-size", "300", "--log-every", "2",
        "--val-fraction", "0.2", "--save-every", "3", "--lr", "1e-3", "--device", "cpu",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return root, ds, root / "run", args


def test_train_method_dflash_writes_a_dflash_drafter(dflash_run):
    _, _, out, _ = dflash_run
    records = read_metrics(out)
    assert [r["step"] for r in records if r["split"] == "train"] == [2, 4, 6]
    val = [r for r in records if r["split"] == "val"]
    assert val and all(len(r["acc_k"]) == 3 for r in records) and "tau_walk" in val[-1]
    record = json.loads((out / "drafter" / "drafter.json").read_text())
    assert record["method"] == "dflash" and record["config"]["block_size"] == 4
    model, manifest = load_drafter(out)
    assert isinstance(model, DFlashDrafter) and manifest["meta"]["method"] == "dflash"
    assert model.config.draft_vocab_size == 300 and not model.t2d[model.config.mask_token_id]


def test_train_dflash_resume_continues_the_run(dflash_run):
    _, _, out, args = dflash_run
    res = CliRunner().invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    assert "finished at step 6 already" in res.output


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--fc-norm"], "EAGLE-3 architecture options"),
        (["--for-engine", "sglang"], "--for-engine sglang"),
        (["--ttt-positions", "reached"], "--ttt-positions reached"),
    ],
)
def test_train_dflash_refuses_what_a_block_drafter_has_no_use_for(dflash_run, tmp_path, extra, says):
    _, ds, _, args = dflash_run
    i = args.index("--out")
    res = CliRunner().invoke(app, [*args[: i + 1], str(tmp_path / "x"), *args[i + 2 :], *extra])
    assert res.exit_code != 0 and says in res.output, res.output
    assert not (tmp_path / "x").exists()


def test_export_dflash_reloads_with_identical_logits_and_refuses_sglang(dflash_run, tmp_path):
    """`export` writes vLLM's DFlash layout (its reload check: identical logits), which
    load_drafter reads back as the same drafter; SGLang and --format speculators are refused
    before anything is written, naming vLLM."""
    from draftsmith.draft.dflash_layout import ARCHITECTURE

    _, _, run, _ = dflash_run
    out = tmp_path / "export"
    res = CliRunner().invoke(app, ["export", str(run), "--engine", "vllm", "--out", str(out)])
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    model, _ = load_drafter(run)
    assert config["architectures"] == [ARCHITECTURE] and config["block_size"] == 4
    assert config["dflash_config"] == {
        "mask_token_id": model.config.mask_token_id,
        "target_layer_ids": [k - 1 for k in model.config.aux_layer_ids],
    }
    readme = (out / "README.md").read_text()
    assert "vllm serve" in readme and '"method": "dflash"' in readme
    again, record = load_drafter(out)
    assert isinstance(again, DFlashDrafter) and record["meta"]["needs_target_embeddings"]
    again.load_target_embeddings(model.embed_tokens.weight)
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    for extra, says in ((["--engine", "sglang"], "--engine vllm"), (["--format", "speculators"], "--format")):
        bad = tmp_path / f"bad{extra[1]}"
        res = CliRunner().invoke(app, ["export", str(run), "--out", str(bad), *extra])
        assert res.exit_code != 0 and says in res.output, res.output
        assert not bad.exists()


def test_export_of_a_full_vocab_dflash_ships_no_vocab_maps(tiny_model, tmp_path):
    """vLLM's DFlash model has no draft_id_to_target_id when the draft vocabulary is the target's:
    an identity d2t in the export made vLLM 0.26 refuse to start (LOG 2026-12-06 04:50)."""
    from safetensors import safe_open

    from draftsmith.draft.checkpoint import save_drafter

    drafter = random_dflash(tiny_model).cpu()
    save_drafter(drafter, tmp_path / "drafter", target={"name": "tiny", "num_layers": len(decoder_layers(tiny_model))})
    res = CliRunner().invoke(
        app, ["export", str(tmp_path / "drafter"), "--engine", "vllm", "--out", str(tmp_path / "x")]
    )
    assert res.exit_code == 0, res.output
    with safe_open(tmp_path / "x" / "model.safetensors", "pt") as f:
        assert not {"d2t", "t2d"} & set(f.keys())
    again, _ = load_drafter(tmp_path / "x")
    assert torch.equal(again.d2t, drafter.d2t) and torch.equal(again.t2d, drafter.t2d)


def test_eval_refuses_a_tree_or_a_chain_longer_than_the_block(dflash_run, tiny_target_dir, tmp_path):
    _, _, run, _ = dflash_run
    for extra, says in ((["--mode", "tree"], "no tree"), (["--depth", "5"], "at most 3")):
        res = CliRunner().invoke(
            app,
            ["eval", "--target", str(tiny_target_dir), "--drafter", str(run), "--out", str(tmp_path / "e"), *extra],
        )
        assert res.exit_code != 0 and says in res.output, res.output
        assert not (tmp_path / "e").exists()


def test_plan_and_status_for_a_dflash_run(dflash_run, tiny_target_dir):
    """`plan --method dflash` times the block step it would train; `status` reads a DFlash run."""
    _, ds, out, _ = dflash_run
    args = ["plan", str(ds), "--target", str(tiny_target_dir), "--device", "cpu", "--calibrate-tokens", "64"]
    res = CliRunner().invoke(app, [*args, "--method", "dflash", "--depth", "3"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # rich wraps lines
    assert "DFlash block-4 step" in text and "train (online)" in text
    res = CliRunner().invoke(app, ["status", str(out)])
    assert res.exit_code == 0 and "6/6" in res.output, res.output


@pytest.mark.slow
def test_train_dflash_resume_after_a_lost_step_gives_the_same_curve(dflash_run, tmp_path):
    """The run's last checkpoint lost (as after a kill between two saves): --resume from the one
    before retrains the same steps to the same metrics (the anchors are drawn from the
    checkpointed RNG, the rows from the data position)."""
    import shutil

    _, _, out, args = dflash_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    before = read_metrics(run)
    shutil.rmtree(run / "checkpoints" / "step_00000006")
    i = args.index("--out")
    res = CliRunner().invoke(app, [*args[: i + 1], str(run), *args[i + 2 :], "--resume"])
    assert res.exit_code == 0, res.output
    after = read_metrics(run)
    keys = ("step", "split", "loss", "acc_k", "tau")
    assert [{k: r.get(k) for k in keys} for r in after] == [{k: r.get(k) for k in keys} for r in before]


@pytest.mark.slow
def test_train_dflash_offline_from_a_store(dflash_run, tiny_target_dir, tmp_path):
    _, ds, _, args = dflash_run
    store = tmp_path / "store"
    res = CliRunner().invoke(
        app, ["extract", str(ds), "--target", str(tiny_target_dir), "--out", str(store), "--device", "cpu"]
    )
    assert res.exit_code == 0, res.output
    i = args.index("--out")
    res = CliRunner().invoke(app, [*args[: i + 1], str(tmp_path / "off"), *args[i + 2 :], "--hidden", str(store)])
    assert res.exit_code == 0, res.output
    model, manifest = load_drafter(tmp_path / "off")
    assert isinstance(model, DFlashDrafter) and manifest["meta"]["mode"] == "offline"
