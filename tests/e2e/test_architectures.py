"""Every stage on tiny random models of the architectures people serve (tests/helpers.py's
ARCHS, built by transformers from its own config classes; fp32, CPU, a few seconds each):

  - `extract`'s store equals `output_hidden_states` at the layer ids (and the final norm's output);
  - `train` (offline, from that store) runs a few steps with a finite loss; its start-up check of
    the teacher's output path passes (Granite's logit scale, Gemma-2's soft-cap);
  - `export --format speculators --engine vllm` reloads with identical draft logits;
  - eval's greedy decoding (plain and speculative with the trained drafter, on the engine eval
    picks) equals the model's own `generate`, past the sliding window of the windowed models;
    `--mode tree` too, on the fast engine or on the generic one under a 4-D tree mask, and a
    clear refusal where neither can (the generic path's sliding-window cache layers:
    NO_GENERIC_TREE);
  - speculative sampling at temperature 1 on the same engines emits the model's own
    distribution (chi-square; the stronger chi-square tests, with a 12-token vocab, are
    tests/unit/test_spec_sampling.py's).

ENGINE says which engine each architecture gets, and why the fast one is not it (README's
architecture table). gpt-oss's attention sinks and DeepSeek-V3's MLA run on the generic path;
the windowed models (Mistral, Gemma-2/3, each with a window shorter than eval's context) decode
on the fast engine (windowed masks, sandwich norms, soft-caps, Gemma-3's local and global rotary).
"""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.data.store import StoreReader
from draftsmith.draft.checkpoint import load_drafter
from draftsmith.errors import UserError
from draftsmith.evaluate.decode import plain_generate, spec_generate
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run as export
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.run import run as extract
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.engine_choice import open_engine
from draftsmith.runtime.generic import HFEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.target import load_target, shared_targets
from draftsmith.train.config import TrainConfig
from draftsmith.train.metrics import read_metrics
from draftsmith.train.run import run as train
from tests.helpers import ARCHS, WINDOW, draft_logits, tiny_causal_lm, write_tokenized_dataset

pytestmark = pytest.mark.slow

V, L, NEW = 300, 4, 3 * WINDOW  # the tiny models' vocab and layers; new tokens decoded, well past the window
CONTEXT = 128  # eval's KV cache: the tokens a run attends over
LAYERS = [1, 2, 3]  # aux layer ids: the engines capture 1..L-1 only (export refuses 0 and L)
# the engine eval decodes each architecture on: None for the fast one, else what keeps it off it
ENGINE = {
    "llama": None,
    "qwen2": None,
    "qwen3": None,
    "qwen3_moe": None,
    "mistral": None,
    "gemma": None,
    "gemma2": None,
    "gemma3": None,
    "phi3": "Phi3DecoderLayer is not one",
    "cohere": "CohereDecoderLayer is not one",
    "granite": "embedding_multiplier=12.0",
    "deepseek_v3": "DeepseekV3DecoderLayer is not one",
    "gpt_oss": "the fast engine fails on it",
}
assert ENGINE.keys() == ARCHS.keys()
# the generic path verifies trees under a 4-D mask, except where sliding-window cache layers keep only their window
NO_GENERIC_TREE = {"gpt_oss"}
assert all(ARCHS[a][1].get("sliding_window") for a in NO_GENERIC_TREE)


def samples(n: int = 8, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, V, (int(torch.randint(16, 40, (), generator=g)),), generator=g).tolist() for _ in range(n)]


@pytest.fixture(scope="module", params=list(ARCHS))
def run(request, tmp_path_factory, tokenizer):
    """One architecture through extract -> train (offline) -> export, the target loaded once.
    Returns (arch, target, folder of the run)."""
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    tiny_causal_lm(arch, V, num_hidden_layers=L).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")  # extract and train load it; the tests' ids are < V
    target = load_target(str(root / "target"), "cpu", "fp32")
    ds = write_tokenized_dataset(root / "ds", samples())
    with shared_targets(target):
        extract(
            ExtractConfig(
                dataset_dir=ds,
                target=str(root / "target"),
                out=root / "store",
                aux_layer_ids=LAYERS,
                device="cpu",
                dtype="fp32",
            )
        )
        train(
            TrainConfig(
                dataset_dir=ds,
                target=str(root / "target"),
                hidden=root / "store",
                out=root / "train",
                steps=3,
                depth=2,
                batch_tokens=64,
                log_every=1,
                val_fraction=0.25,
                device="cpu",
                dtype="fp32",
            )
        )
    export(
        ExportConfig(
            drafter=root / "train", format="speculators", engine="vllm", out=root / "export", include_embeddings=True
        )
    )
    return arch, target, root


def test_extract_equals_output_hidden_states(run):
    _, target, root = run
    reader = StoreReader(root / "store")
    H = target.info.hidden_size
    assert [int(k) for k in reader.meta["aux_layer_ids"]] == LAYERS and target.info.num_layers == L
    for i in range(len(reader)):
        sample = reader[i]
        ids = sample["input_ids"].long()[None]  # [1, T]
        ref = target.model(ids, output_hidden_states=True).hidden_states  # L+1 entries, the last after the final norm
        aux, final = sample["aux_hidden_states"].float(), sample["final_hidden_states"].float()  # [T, 3H], [T, H]
        for j, k in enumerate(LAYERS):
            torch.testing.assert_close(aux[:, j * H : (j + 1) * H], ref[k][0])
        torch.testing.assert_close(final, ref[-1][0])


def test_training_steps_run(run):
    _, _, root = run
    train_records = [r for r in read_metrics(root / "train") if r["split"] == "train"]
    assert [r["step"] for r in train_records] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in train_records)


def test_export_reloads_identical_logits(run):
    _, _, root = run
    trained, _ = load_drafter(root / "train")
    exported, _ = load_drafter(root / "export")
    assert exported.config.to_dict() == trained.config.to_dict()
    assert torch.equal(draft_logits(exported), draft_logits(trained))


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_eval_greedy_equals_generate(run, mode):
    arch, target, root = run
    model, reason = target.model, ENGINE[arch]
    drafter, _ = load_drafter(root / "train")
    layers = drafter.config.aux_layer_ids
    if reason is not None and mode == "tree" and arch in NO_GENERIC_TREE:
        with pytest.raises(UserError, match=f"--mode tree on {type(model).__name__}: .*sliding-window layers"):
            open_engine(model, layers, CONTEXT, mode)
        return
    engine = open_engine(model, layers, CONTEXT, mode)
    assert isinstance(engine, TargetEngine if reason is None else HFEngine)
    if reason is not None:
        assert reason in engine.reason
    assert_greedy_equals_generate(model, engine, drafter, mode)


def assert_greedy_equals_generate(model, engine, drafter, mode: str) -> None:
    """Plain and speculative greedy decoding (the trained drafter) on `engine` equal `generate`."""
    proposer = DrafterProposer(drafter, Sampling(), engine.max_len, mode=mode, depth=3, top_k=3, total_tokens=8)
    for prompt in samples(2, seed=1):
        ref = hf_greedy(model, prompt, NEW)
        assert plain_generate(engine, prompt, NEW, set(), Sampling()).tokens == ref
        assert spec_generate(engine, proposer, prompt, NEW, set(), Sampling()).tokens == ref


def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value exceeded with probability ~0.001 at `df` degrees of freedom (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_speculative_sampling_follows_the_model(run, mode):
    """Speculative sampling on each architecture's engine (fast or generic, chain and tree where
    the engine verifies trees) emits tokens with the model's own distribution: the second token
    of N two-token answers at temperature 1 (it comes out of a verification: drafted, accepted
    or corrected) against its exact marginal Σ_t1 P(t1) P(t2 | t1), by chi-square."""
    arch, target, root = run
    model = target.model
    drafter, _ = load_drafter(root / "train")
    if mode == "tree" and ENGINE[arch] is not None and arch in NO_GENERIC_TREE:
        pytest.skip("no tree path for this model (test_eval_greedy_equals_generate checks the refusal)")
    engine = open_engine(model, drafter.config.aux_layer_ids, 32, mode)
    sampling = Sampling(temperature=1.0, seed=0)
    proposer = DrafterProposer(drafter, sampling, engine.max_len, mode=mode, depth=2, top_k=2, total_tokens=3)
    prompt = samples(1, seed=2)[0][:6]
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)  # [V]
        after = torch.tensor([prompt + [t] for t in range(V)])  # [V, P+1]: every first token
        p2 = torch.softmax(model(after).logits[:, -1].double(), -1)  # [V, V]: P(t2 | t1)
    expected_p = p1 @ p2  # [V]
    n = 300
    counts = torch.zeros(V, dtype=torch.float64)
    for _ in range(n):
        counts[spec_generate(engine, proposer, prompt, 2, set(), sampling).tokens[1]] += 1
    obs, exp = binned(counts, expected_p * n)
    stat = float(((obs - exp) ** 2 / exp).sum())
    assert stat < chi2_critical(len(obs) - 1), (stat, len(obs))


def binned(counts: torch.Tensor, expected: torch.Tensor, least: float = 10.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Observed and expected counts [V] pooled into bins of at least `least` expected counts
    (tokens taken most likely first; a short last bin joins the one before)."""
    obs, exp, o, e = [], [], 0.0, 0.0
    for t in expected.argsort(descending=True).tolist():
        o, e = o + float(counts[t]), e + float(expected[t])
        if e >= least:
            obs.append(o)
            exp.append(e)
            o, e = 0.0, 0.0
    obs[-1], exp[-1] = obs[-1] + o, exp[-1] + e
    return torch.tensor(obs), torch.tensor(exp)
