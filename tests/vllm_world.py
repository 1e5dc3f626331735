"""What the three vLLM agreement tests (tests/e2e/test_vllm_*agreement*.py) share: their small
target, its prompts and greedy answers prepared into a dataset (`base_world`, the `vllm_base`
fixture of conftest.py), one vLLM worker run of several engines (`serve_greedy`), an export
copied with an edit (`broken`) and the accepted counts per draft position (`per_position`).

The target: a 6-layer Llama (hidden 128, head_dim 32, which vLLM's CPU attention supports) with
random layers whose lm_head is the embedding matrix permuted, so that its greedy answers follow
a fixed token order, bent by its context: varied text that a drafter learns in a few steps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftsmith.data.config import PrepareConfig
from draftsmith.data.prepare import run as prepare
from draftsmith.target import load_target, shared_targets
from tests.helpers import ASSETS

K, NEW_TOKENS, QUESTIONS = 3, 32, 8  # drafts per cycle, new tokens per answer, MT-bench prompts
ENGINE_ARGS = {"enforce_eager": True, "distributed_executor_backend": "uni"}
MT_BENCH = Path(__file__).parents[1] / "src" / "draftsmith" / "assets" / "mt_bench.jsonl"


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


def base_world(root: Path) -> dict:
    """The target folder under `root` (and loaded), the first QUESTIONS MT-bench prompts (also as
    `root/bench.jsonl`), and the target's greedy answers to them prepared into `root/ds`."""
    folder = make_target(root / "target")
    target = load_target(str(folder), "cpu", "float32")
    prompts = [json.loads(line)["turns"][0] for line in MT_BENCH.read_text().splitlines()[:QUESTIONS]]
    bench = root / "bench.jsonl"
    bench.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    (root / "convs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in greedy_conversations(target, prompts)))
    with shared_targets(target):
        ds = prepare(PrepareConfig(data=root / "convs.jsonl", target=str(folder), out=root / "ds"))
    return {"root": root, "target": folder, "loaded": target, "prompts": prompts, "bench": bench, "ds": ds}


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


def serve_greedy(world: dict, engines: list[dict]) -> dict:
    """One vLLM worker run of `engines` on the world's prompts, fp32 greedy: {engine: its pass, or its error}."""
    from draftsmith.evaluate.vllm_eval import run_worker

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


def per_position(accepts: list[list[int]]) -> list[int]:
    """Accepted tokens at draft positions 1..K over every step of every answer."""
    steps = [a for turn in accepts for a in turn]
    return [sum(a >= j for a in steps) for j in range(1, K + 1)]


# what every agreement drafter trains with on the world's data: a few steps at a high rate, no validation
TRAIN = {"device": "cpu", "depth": K, "lr": 1e-2, "warmup_ratio": 0, "val_fraction": 0, "val_every": 1000}
TRAIN |= {"draft_vocab_size": 512, "batch_tokens": 512, "log_every": 10, "save_every": 1000}


def trained(world: dict, name: str, options: dict, questions: int = QUESTIONS) -> dict:
    """A drafter trained on the world's data into root/train-NAME (TRAIN, with `options` on top)
    and draftsmith eval's fp32 greedy answers with it to the world's first `questions` prompts:
    {"run", "answers", "report"}."""
    from draftsmith.config import resolve_config
    from draftsmith.evaluate.config import EvalConfig
    from draftsmith.evaluate.run import run as evaluate
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.run import run as train

    root, run = world["root"], world["root"] / f"train-{name}"
    with shared_targets(world["loaded"]):
        flags = {"dataset_dir": world["ds"], "target": str(world["target"]), "out": run, **TRAIN, **options}
        train(resolve_config(TrainConfig, None, flags))
        out = evaluate(
            EvalConfig(
                drafter=run,
                target=str(world["target"]),
                out=root / f"eval-{name}",
                bench=str(world["bench"]),
                depth=K,
                num_questions=questions,
                max_new_tokens=NEW_TOKENS,
                speed=False,
                device="cpu",
            )
        )
    return {"run": run, "answers": read_answers(out), "report": json.loads((out / "report.json").read_text())}


def read_answers(folder: Path) -> list[dict]:
    """An eval folder's answers.jsonl, one dict per question."""
    return [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()]


def answer_views(answers: list[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """The first turn's token ids and per-step accepted counts of each answer of an answers.jsonl."""
    return [a["token_ids"][0] for a in answers], [a["accepts"][0] for a in answers]


def eval_vllm(
    world: dict, drafter: Path, out: Path, questions: int = 2, speed: bool = False
) -> tuple[Path, list[dict]]:
    """`draftsmith eval --engine vllm` of `drafter` (a train folder: exported by eval itself, or an
    exported folder) on the world's first `questions` prompts (`speed`: with vLLM's plain pass):
    its folder and its answers."""
    from draftsmith.evaluate.config import EvalConfig
    from draftsmith.evaluate.run import run as evaluate

    folder = evaluate(
        EvalConfig(
            engine="vllm",
            drafter=drafter,
            target=str(world["target"]),
            out=out,
            bench=str(world["bench"]),
            depth=K,
            num_questions=questions,
            max_new_tokens=NEW_TOKENS,
            speed=speed,
        )
    )
    return folder, read_answers(folder)
