"""The adaptive chain (`eval --stop-below P`): a chain that stops drafting once no live row's
confidence in its whole draft so far (the product of its drafts' probabilities) reaches P. Greedy
output stays the target's own, at every threshold and batch; the chain stops exactly where the
drafter's own probabilities say; a threshold too low to stop anything drafts the fixed chain,
token for token; a parked row keeps no chain going."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.draft.checkpoint import save_drafter
from draftsmith.evaluate.decode import decode
from draftsmith.evaluate.proposer import DrafterProposer
from draftsmith.evaluate.report import shape_label
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from tests.helpers import eval_cli, random_drafter, tiny_vocab_drafter, tiny_vocab_llama

PROMPTS = [[1, 5, 7, 3, 9], [2, 4], [6, 1, 8, 8, 3, 2, 7]]


@pytest.fixture(scope="module")
def pair():
    model = tiny_vocab_llama()
    return model, tiny_vocab_drafter(model, num_layers=2)


def run(pair, prompts, stop_below, depth=5, sampling=None, lookahead=None):
    model, drafter = pair
    eng = TargetEngine(model, [0, 1, 2], 64, batch=len(prompts))
    sampling = sampling or Sampling()
    prop = DrafterProposer(
        drafter, sampling, 64, depth=depth, batch=len(prompts), stop_below=stop_below, lookahead=lookahead
    )
    return decode(eng, prompts, 24, set(), sampling, prop), decode(eng, prompts, 24, set(), Sampling())


@pytest.mark.parametrize("stop_below", [0.9, 0.5, 0.2, 0.05])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_adaptive_chain_equals_plain_decoding(pair, stop_below, batch):
    spec, plain = run(pair, PROMPTS[:batch], stop_below)
    assert [t.tokens for t in spec] == [t.tokens for t in plain]
    drafted = [d for t in spec for d in t.drafted]
    assert all(1 <= d <= 5 for d in drafted)
    assert all(a <= d for t in spec for a, d in zip(t.accepts, t.drafted, strict=True))


def test_the_drafted_length_follows_the_threshold(pair):
    """Lower thresholds draft longer chains; between them, lengths vary from cycle to cycle."""
    mean = {}
    for p in (0.95, 0.5, 0.05):
        spec, _ = run(pair, PROMPTS[:1], p)
        mean[p] = sum(spec[0].drafted) / len(spec[0].drafted)
    assert mean[0.95] < mean[0.5] < mean[0.05], mean
    spec, _ = run(pair, PROMPTS[:1], 0.5)
    assert len(set(spec[0].drafted)) > 1, spec[0].drafted


def test_a_threshold_below_every_confidence_drafts_the_fixed_chain(pair):
    spec, _ = run(pair, PROMPTS, 1e-30)
    model, drafter = pair
    eng = TargetEngine(model, [0, 1, 2], 64, batch=3)
    fixed = decode(eng, PROMPTS, 24, set(), Sampling(), DrafterProposer(drafter, Sampling(), 64, depth=5, batch=3))
    assert [(t.tokens, t.accepts) for t in spec] == [(t.tokens, t.accepts) for t in fixed]
    assert {d for t in spec for d in t.drafted} == {5}


@pytest.mark.parametrize("lookahead", [False, True])
def test_the_chain_stops_at_the_first_draft_whose_confidence_falls_below(pair, lookahead):
    """Each proposal's length, recomputed from the logits each draft was drawn from: drafting
    goes on while some row's product of its drafts' softmax probabilities is >= P. The look-ahead
    (GPU's default) draws one draft more where the chain stops early, and drops it."""
    model, drafter = pair
    eng = TargetEngine(model, [0, 1, 2], 64, batch=2)
    prop = DrafterProposer(drafter, Sampling(), 64, depth=5, batch=2, stop_below=0.4, lookahead=lookahead)
    seen: list[torch.Tensor] = []
    draw = prop._draw

    def spy(logits, i, tokens, qs):
        seen.append(torch.softmax(logits.float(), -1).max(-1).values)  # [B]
        return draw(logits, i, tokens, qs)

    prop._draw = spy
    _, aux, ids, pad = eng.prefill_rows(PROMPTS[:2])
    prop.observe_prompt(aux, torch.cat([ids[:, 1:], torch.tensor([[4], [6]])], dim=1), pad)
    lengths = set()
    for _ in range(6):
        seen.clear()
        draft = prop.propose()
        confidence = torch.stack(seen, 1).cumprod(1)  # [B, L]
        stop = next((i + 1 for i in range(5) if not bool((confidence[:, i] >= 0.4).any())), 5)
        assert draft.tokens.shape == (2, stop) and len(seen) == (min(stop + 1, 5) if lookahead else stop)
        lengths.add(stop)
        prop.observe(aux[:, -1:], torch.tensor([[4], [6]]), torch.tensor([1, 1]))  # one more position, same state
    prop.observe(aux[:, -1:], torch.tensor([[4], [6]]), torch.tensor([0, 1]))  # row 0 parked
    assert prop.walk.live.tolist() == [False, True]
    prop.propose()
    assert float(prop.walk.confidence[0]) == 0.0  # the parked row's confidence keeps no chain going


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("stop_below", [0.7, 0.2])
def test_the_look_ahead_keeps_the_same_drafts(pair, temperature, stop_below):
    """Greedy and sampled, three rows: with and without the look-ahead, the same tokens, the same
    accepted counts and the same chain lengths, cycle by cycle."""
    turns = {
        lookahead: run(
            pair, PROMPTS, stop_below, sampling=Sampling(temperature=temperature, seed=0), lookahead=lookahead
        )[0]
        for lookahead in (False, True)
    }
    assert [(t.tokens, t.accepts, t.drafted) for t in turns[True]] == [
        (t.tokens, t.accepts, t.drafted) for t in turns[False]
    ]
    assert len({d for t in turns[True] for d in t.drafted}) > 1  # chains of several lengths were compared


def test_sampled_adaptive_chain_runs_and_reports_its_lengths(pair):
    sampling = Sampling(temperature=1.0, seed=0)
    spec, _ = run(pair, PROMPTS, 0.3, sampling=sampling)
    assert all(len(t.tokens) == 24 for t in spec)
    assert all(len(t.drafted) == len(t.accepts) and max(t.drafted) <= 5 for t in spec)


@pytest.fixture
def setup(tiny_model, tiny_target, tiny_target_dir, tmp_path):
    drafter = random_drafter(tiny_model, draft_vocab_size=300)
    return tiny_target_dir, save_drafter(drafter, tmp_path / "drafter", target=tiny_target.info.to_dict()), tmp_path


def report(setup) -> dict:
    return json.loads((setup[2] / "e" / "report.json").read_text())


def test_eval_stop_below_reports_the_threshold_and_the_drafts_per_step(setup):
    res = eval_cli(setup, "--depth", "4", "--stop-below", "0.001")
    assert res.exit_code == 0, res.output
    r = report(setup)
    assert r["stop_below"] == 0.001 and r["depth"] == 4 and 1 <= r["drafted_per_cycle"] <= 4
    assert shape_label(r) == "chain K=4 stop<0.001"
    assert r["greedy_turns_matching_plain"] == r["greedy_turns_checked"] == 1
    assert "drafted per step" in (setup[2] / "e" / "report.md").read_text()


def test_eval_stop_below_auto_measures_the_adaptive_chain_beside_the_fixed_ones(setup):
    res = eval_cli(setup, "--stop-below", "auto", "--depth-max", "3", "--calibration-questions", "1")
    assert res.exit_code == 0, res.output
    shape = report(setup)["shape"]
    adaptive = [c for c in shape["candidates"] if c["stop_below"] is not None]
    assert [c["depth"] for c in shape["candidates"]] == [1, 2, 3, 3] and len(adaptive) == 1
    assert 0.01 <= adaptive[0]["stop_below"] <= 0.99 and adaptive[0]["expected_tokens"] >= 1
    assert 1 <= adaptive[0]["drafted_per_cycle"] <= 3
    assert all(c["drafted_per_cycle"] == c["depth"] for c in shape["candidates"] if c["stop_below"] is None)
    assert "`--stop-below auto` chose" in (setup[2] / "e" / "report.md").read_text()


@pytest.mark.parametrize(
    "options, says",
    [
        (["--stop-below", "1"], "strictly between 0 and 1"),
        (["--stop-below", "0"], "strictly between 0 and 1"),
        (["--stop-below", "-0.2"], "strictly between 0 and 1"),
        (["--stop-below", "0.3", "--mode", "tree"], "a tree already keeps only its most confident nodes"),
        (["--stop-below", "0.3", "--tree", "auto"], "a tree already keeps only its most confident nodes"),
        (["--stop-below", "0.3", "--engine", "vllm"], "vLLM drafts a fixed number"),
        (["--stop-below", "0.3", "--depth", "auto"], "give the longest chain as --depth N"),
        (["--stop-below", "auto", "--depth", "5"], "drop --depth"),
    ],
)
def test_a_threshold_eval_cannot_use_is_refused(setup, options, says):
    res = eval_cli(setup, *options)
    assert res.exit_code != 0 and says in " ".join(res.output.split()), res.output
    assert not (setup[2] / "e").exists()


def test_a_parallel_drafter_refuses_the_threshold(tiny_model, tiny_target, tiny_target_dir, tmp_path):
    drafter = random_drafter(tiny_model, draft_vocab_size=300, method="peagle")
    drafter = save_drafter(drafter, tmp_path / "d", target=tiny_target.info.to_dict())
    res = eval_cli((tiny_target_dir, drafter, tmp_path), "--stop-below", "0.3")
    assert res.exit_code != 0 and "stopping early saves nothing" in " ".join(res.output.split()), res.output


def test_the_auto_threshold_is_a_draft_steps_share_of_a_tokens_time():
    """Cycles of 1 + 0.1·K s: a step costs 0.1 s; at the best chain a token costs c/E s, so a
    draft pays when it is accepted with a probability above 0.1 / (c/E)."""
    from draftsmith.evaluate.shape import Calibration, Candidate, Shape, adaptive_threshold, expected_tokens

    accept = [0.9, 0.8, 0.5, 0.2]
    cal = Calibration(
        "chain", [Candidate(Shape(k), expected_tokens(accept, k), 1 + 0.1 * k) for k in (1, 2, 3, 4)], 0.5, 10, accept
    )
    best = cal.best()
    assert adaptive_threshold(cal) == pytest.approx(0.1 * best.expected_tokens / best.cycle_seconds)
    flat = Calibration("chain", [Candidate(Shape(k), 1.5, 1.0) for k in (1, 2)], 0.5, 10, accept)
    assert adaptive_threshold(flat) == 0.01  # free steps: the floor, never 0


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="inductor's CPU backend needs a C++ compiler")
def test_the_compiled_draw_stops_and_drafts_as_the_eager_one(pair):
    """With `compile`, each draft's draw and confidence is one compiled region (inductor; on CPU
    its C++ backend), as the fixed chain's draft is: the same answers, accepted counts and stops."""
    runs = []
    for compile in (False, True):
        model, drafter = pair
        eng = TargetEngine(model, [0, 1, 2], 64, batch=3)
        prop = DrafterProposer(drafter, Sampling(), 64, depth=5, batch=3, stop_below=0.4, compile=compile)
        assert (prop.draft_region is not None) == compile
        runs.append([(t.tokens, t.accepts, t.drafted) for t in decode(eng, PROMPTS, 24, set(), Sampling(), prop)])
    assert runs[0] == runs[1]
    assert len({d for _, _, drafted in runs[0] for d in drafted}) > 1
