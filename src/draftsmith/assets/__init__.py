"""Bundled data files (see README.md here for sources and licences)."""

from pathlib import Path

ASSETS = Path(__file__).parent
MT_BENCH = ASSETS / "mt_bench.jsonl"
GSM8K_TRAIN = ASSETS / "gsm8k_train.jsonl"
H200_RECIPE = ASSETS / "recipes" / "h200.yaml"  # recipes/h200.yaml links here; quickstart --budget full runs it
