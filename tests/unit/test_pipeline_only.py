"""`draftsmith pipeline --only`: runs just the named stages; the others are neither run nor
marked done, and an unknown name is refused with the list of stages. The run ends with each
stage's time."""

import json
import re
from pathlib import Path

import pytest

from draftsmith.data.dataset import META_FILE
from draftsmith.errors import UserError
from draftsmith.pipeline.config import PipelineConfig
from draftsmith.pipeline.run import run
from tests.helpers import write_tokenized_dataset


@pytest.fixture
def two_vocabs(tmp_path):
    """A pipeline of two vocab stages, `small` and `big`, over one tiny dataset, into tmp_path/run."""
    ds = write_tokenized_dataset(tmp_path / "ds", [[5, 6, 7, 8, 9, 10], [7, 8, 9, 11, 12, 13]])
    meta = json.loads((ds / META_FILE).read_text())
    (ds / META_FILE).write_text(json.dumps({**meta, "target": {"vocab_size": 32}}))
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        f"out: {tmp_path / 'run'}\nstages:\n"
        f"  - vocab: {{name: small, dataset_dir: {ds}, size: 4}}\n"
        f"  - vocab: {{name: big, dataset_dir: {ds}, size: 8}}\n"
    )
    return cfg


def test_only_runs_the_named_stages(tmp_path, two_vocabs):
    cfg = two_vocabs
    run(PipelineConfig(pipeline_config=cfg, only=["big"]))
    root = tmp_path / "run"
    assert (root / "big" / "vocab.safetensors").exists() and (root / ".pipeline" / "big.done").exists()
    assert not (root / "small").exists() and not (root / ".pipeline" / "small.done").exists()
    with pytest.raises(UserError, match="no such stage.*small, big"):
        run(PipelineConfig(pipeline_config=cfg, only=["eval"]))


def test_the_run_ends_with_each_stages_time(tmp_path, two_vocabs, capsys):
    cfg = two_vocabs
    run(PipelineConfig(pipeline_config=cfg, only=["big"]))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"\[pipeline\] stage times: big \d+s; total \d+s", last), last  # not the unselected one
    marker = tmp_path / "run" / ".pipeline" / "big.done"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "seconds": 125.0}))
    run(PipelineConfig(pipeline_config=cfg))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"\[pipeline\] stage times: small \d+s, big 2m05s \(earlier\); total 2m0\ds", last), last


def test_out_and_target_flags_beat_the_yaml_and_default(tmp_path, monkeypatch):
    """--out and --target beat the YAML's `out:`/`target:` (flag > YAML > default); without
    either, the root is runs/<the YAML's name> and the stages take their default target."""
    import draftsmith.pipeline.run as pipeline_run

    ds = write_tokenized_dataset(tmp_path / "ds", [[5, 6, 7, 8, 9, 10], [7, 8, 9, 11, 12, 13]])
    meta = json.loads((ds / META_FILE).read_text())
    (ds / META_FILE).write_text(json.dumps({**meta, "target": {"vocab_size": 32}}))
    bare = tmp_path / "bare.yaml"
    bare.write_text(f"stages:\n  - vocab: {{dataset_dir: {ds}, size: 4}}\n")
    monkeypatch.chdir(tmp_path)
    assert run(PipelineConfig(pipeline_config=bare)) == Path("runs") / "bare"
    assert (tmp_path / "runs" / "bare" / "vocab" / "vocab.safetensors").exists()
    named = tmp_path / "named.yaml"
    named.write_text(
        f"out: {tmp_path / 'yaml_out'}\ntarget: from-yaml\nstages:\n  - prepare: {{data: {tmp_path / 'x.jsonl'}}}\n"
    )
    seen = {}
    monkeypatch.setattr(
        pipeline_run,
        "run_stages",
        lambda root, stages, common, only=None, recipe=None: seen.update(root=root, **common),
    )
    run(PipelineConfig(pipeline_config=named))
    assert seen == {"root": tmp_path / "yaml_out", "target": "from-yaml"}
    run(PipelineConfig(pipeline_config=named, out=tmp_path / "flag_out", target="from-flag"))
    assert seen == {"root": tmp_path / "flag_out", "target": "from-flag"}


def test_quickstart_full_budget_is_the_packaged_h200_recipe(tmp_path):
    """`quickstart --budget full` runs the H200 recipe's stages, read from the one recipe file
    (package data; recipes/h200.yaml links to it), and every stage's options are valid."""
    from draftsmith.assets import H200_RECIPE
    from draftsmith.config import DEFAULT_TARGET, load_yaml_mapping
    from draftsmith.pipeline.quickstart import budget_stages
    from draftsmith.pipeline.run import plan_stages

    assert (Path(__file__).parents[2] / "recipes" / "h200.yaml").resolve() == H200_RECIPE.resolve()
    # a template: the folder and the target come from the command (flags or defaults), not a machine's paths
    assert not {"out", "target"} & load_yaml_mapping(H200_RECIPE, "recipe").keys()
    stages = budget_stages("full")
    names = [name for name, _, _ in stages]
    # every data stage of the recipe (its Magpie sets under four seeds each), then online training and chain eval only
    assert names == [
        "synth",
        "magpie",
        "magpie_b",
        "magpie2",
        "magpie2_b",
        "magpie_c",
        "magpie_d",
        "magpie2_c",
        "magpie2_d",
        "prepare",
        "vocab",
        "train_online",
        "eval_chain",
    ]
    planned = plan_stages(tmp_path, stages, {"target": DEFAULT_TARGET})
    assert planned[-1].cfg.drafter == tmp_path / "train_online" / "drafter"  # eval_chain reads train_online's drafter


ROOT = Path(__file__).parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))  # the lab's: experiments/test_recipes.py


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_recipe_is_valid(recipe, tmp_path):
    """Each recipe under recipes/ parses, names known top-level keys and gives every stage valid
    options."""
    from draftsmith.pipeline.run import check_common, load_yaml_mapping, parse_stages, plan_stages

    spec = load_yaml_mapping(recipe, "recipe")
    spec.pop("out", None)
    stages = parse_stages(spec.pop("stages"))
    check_common(recipe, spec, stages)
    assert plan_stages(tmp_path, stages, spec)
