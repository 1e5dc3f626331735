"""`draftsmith pipeline --only`: runs just the named stages; the others are neither run nor
marked done, and an unknown name is refused with the list of stages."""

import json

import pytest

from draftsmith.data.dataset import META_FILE

from draftsmith.errors import UserError
from draftsmith.pipeline.config import PipelineConfig
from draftsmith.pipeline.run import run
from tests.helpers import write_tokenized_dataset


def test_only_runs_the_named_stages(tmp_path):
    ds = write_tokenized_dataset(tmp_path / "ds", [[5, 6, 7, 8, 9, 10], [7, 8, 9, 11, 12, 13]])
    meta = json.loads((ds / META_FILE).read_text())
    (ds / META_FILE).write_text(json.dumps({**meta, "target": {"vocab_size": 32}}))
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"out: {tmp_path / 'run'}\nstages:\n"
                   f"  - vocab: {{name: small, dataset_dir: {ds}, size: 4}}\n"
                   f"  - vocab: {{name: big, dataset_dir: {ds}, size: 8}}\n")
    run(PipelineConfig(pipeline_config=cfg, only=["big"]))
    root = tmp_path / "run"
    assert (root / "big" / "vocab.safetensors").exists() and (root / ".pipeline" / "big.done").exists()
    assert not (root / "small").exists() and not (root / ".pipeline" / "small.done").exists()
    with pytest.raises(UserError, match="no such stage.*small, big"):
        run(PipelineConfig(pipeline_config=cfg, only=["eval"]))


def test_quickstart_full_budget_is_the_h200_recipe():
    """`quickstart --budget full` says it runs the recipe's data and training: keep them equal."""
    from pathlib import Path

    from draftsmith.config import load_yaml_mapping
    from draftsmith.pipeline.quickstart import BUDGETS
    from draftsmith.pipeline.run import parse_stages

    recipe = load_yaml_mapping(Path(__file__).parents[2] / "recipes" / "h200.yaml", "recipe")
    stages = {name: opts for name, _, opts in parse_stages(recipe["stages"])}
    full = {name: opts for name, _, opts in BUDGETS["full"]}
    for name in ("synth", "magpie", "magpie2", "prepare"):
        assert full[name] == stages[name], name
    online = {k: v for k, v in stages["train_online"].items() if k != "save_every"}
    assert full["train"] == online
