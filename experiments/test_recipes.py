"""The lab's recipes hold before a GPU run spends device time on them: run by hand, beside the
drivers (`pytest experiments/test_recipes.py`), not by the product's suite (testpaths: tests/).

- every recipe under experiments/recipes/ parses, names known top-level keys and gives every
  stage valid options;
- recipes that share a run folder (the H200 drivers' `$RUN`) list the same data stages;
- h200_mix.yaml changes only the data of the shipped H200 recipe.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the shipped recipe and the lab's (ablations and the mix, run by the H200 drivers)
RECIPES = [ROOT / "recipes" / "h200.yaml", *sorted((ROOT / "experiments" / "recipes").glob("*.yaml"))]
# the folder experiments/h200_recipe.sh runs recipes/h200.yaml in (--out $RUN, steps.sh's RUN)
H200_RUN = "/root/runs/h200"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recipe_is_valid(recipe, tmp_path):
    from draftsmith.pipeline.run import check_common, load_yaml_mapping, parse_stages, plan_stages

    spec = load_yaml_mapping(recipe, "recipe")
    spec.pop("out", None)
    stages = parse_stages(spec.pop("stages"))
    check_common(recipe, spec, stages)
    assert plan_stages(tmp_path, stages, spec)


def test_recipes_sharing_a_folder_make_the_same_data():
    """Recipes whose `out` is the same folder share its data stages' markers, so each must list the
    same data stages with the same options: else each recipe's run makes the folder's data again
    in its own form (a stage whose options or inputs changed runs again), under the other's
    trained drafters, and their runs stop comparing step for step."""
    from draftsmith.pipeline.quickstart import DATA_COMMANDS
    from draftsmith.pipeline.run import load_yaml_mapping, parse_stages

    assert f"RUN=${{RUN:-{H200_RUN}}}" in (ROOT / "experiments" / "steps.sh").read_text()
    by_out: dict[str, dict[str, list]] = {}
    for recipe in RECIPES:
        spec = load_yaml_mapping(recipe, "recipe")
        data = [
            (name, command, opts) for name, command, opts in parse_stages(spec["stages"]) if command in DATA_COMMANDS
        ]
        out = spec.get("out", H200_RUN if recipe == ROOT / "recipes" / "h200.yaml" else None)
        by_out.setdefault(out, {})[recipe.name] = data
    assert len(by_out[H200_RUN]) >= 2  # the recipe and the ablation that trains beside it
    for out, recipes in by_out.items():
        first, *rest = recipes.items()
        for name, data in rest:
            assert data == first[1], f"{name} and {first[0]} share {out} but not its data stages"


def test_the_mix_recipe_trains_and_evaluates_as_the_h200_recipe():
    """experiments/recipes/h200_mix.yaml changes only the data: its training and chain eval are the H200 recipe's."""
    from draftsmith.config import load_yaml_mapping
    from draftsmith.pipeline.run import parse_stages
    from draftsmith.synth.mix import load_mix

    experiments = ROOT / "experiments" / "recipes"
    stages = {}
    for name, recipe in (("h200", ROOT / "recipes" / "h200.yaml"), ("h200_mix", experiments / "h200_mix.yaml")):
        stages[name] = {n: opts for n, _, opts in parse_stages(load_yaml_mapping(recipe, "recipe")["stages"])}
    for stage in ("prepare", "vocab", "train_online", "export_vllm", "eval_chain"):
        assert stages["h200_mix"][stage] == stages["h200"][stage], stage
    mix = load_mix(experiments / "mixes" / "h200.yaml")
    assert [s.source for s in mix.sources] == ["gsm8k", "evals", "chitchat", "magpie", "magpie"]
