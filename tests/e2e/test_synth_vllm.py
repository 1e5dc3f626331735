"""`synth --generator vllm`: vLLM's offline engine answers the prompts the local backend would get,
with the same stop ids and cut, so greedy answers match draftsmith's own engine in fp32 on CPU;
Magpie (a raw template prefix with its own stop token) works through it too."""

from __future__ import annotations

import json

import pytest

from draftsmith.synth import vllm as vllm_backend
from draftsmith.synth.config import SynthConfig
from draftsmith.synth.run import run as synth
from tests.helpers import SMOLLM2

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

PROMPTS = [
    "What is 12 times 7?",
    "Name a colour.",
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "How many legs does a spider have?",
    "Say hello.",
]


def answers(path):
    return {r["id"]: r["messages"][-1]["content"] for r in map(json.loads, path.read_text().splitlines())}


def test_vllm_answers_equal_the_local_backends_at_greedy(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    common = {"prompts": str(prompts), "target": SMOLLM2, "max_new_tokens": 24, "keep_unfinished": True}
    local = synth(SynthConfig(**common, out=tmp_path / "local" / "c.jsonl", dtype="fp32"))
    served = synth(SynthConfig(**common, out=tmp_path / "vllm" / "c.jsonl", dtype="fp32", generator="vllm"))
    a, b = answers(local), answers(served)
    assert a.keys() == b.keys() and len(a) == len(PROMPTS)
    same = sum(a[k] == b[k] for k in a)
    assert same == len(PROMPTS), {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    first = json.loads(served.read_text().splitlines()[0])
    assert first["generation"]["backend"] == "vllm"


def test_magpie_through_vllm(tmp_path):
    out = synth(
        SynthConfig(
            magpie=3,
            target=SMOLLM2,
            dtype="fp32",
            max_new_tokens=16,
            keep_unfinished=True,
            generator="vllm",
            out=tmp_path / "m" / "c.jsonl",
        )
    )
    assert len(out.read_text().splitlines()) >= 1
    engines = len(vllm_backend._ENGINES)
    again = {"magpie": 2, "seed": 7, "target": SMOLLM2, "dtype": "fp32", "max_new_tokens": 16, "keep_unfinished": True}
    synth(SynthConfig(**again, generator="vllm", out=tmp_path / "m2" / "c.jsonl"))
    assert (
        len(vllm_backend._ENGINES) == engines
    )  # another seed, the same engine: a second one would not fit a GPU beside it
