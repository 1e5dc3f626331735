"""Select a mix's prompts on this machine and write them as plain files that a GPU host without
network or the source packages can synthesize from (`draftsmith.synth.mix.freeze`).

    pip install --no-deps evals && pip install chitchat-dataset     # the named sources' data
    python experiments/freeze_mix.py experiments/recipes/mixes/h200.yaml runs/h200_mix_prompts
    # then, on the GPU host (carry runs/h200_mix_prompts): draftsmith pipeline experiments/recipes/h200_mix.yaml

Prints the frozen mix file and, per source, the prompts it holds. Conversation ids, licenses
and names are the original mix's, so mix.json and the model card say where the data came from.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from draftsmith.errors import UserError
from draftsmith.synth.mix import freeze


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mix", type=Path, help="the mix file (YAML)")
    ap.add_argument("out", type=Path, help="folder for the frozen prompts and mix.yaml")
    args = ap.parse_args()
    t0 = time.time()
    try:
        frozen = freeze(args.mix, args.out)
    except UserError as e:
        sys.exit(f"error: {e}")
    print(f"{frozen} ({time.time() - t0:.0f} s)")
    for entry in yaml.safe_load(frozen.read_text())["sources"]:
        if entry["source"] == "magpie":
            print(f"  {entry['name']}: {entry['cap']} Magpie conversations, {entry['turns']} turn(s)")
        else:
            n = sum(1 for _ in (args.out / entry["source"]).open())
            size = (args.out / entry["source"]).stat().st_size / 1e6
            print(f"  {entry['name']}: {n} prompts from {entry['origin']} ({entry['license']}), {size:.1f} MB")


if __name__ == "__main__":
    main()
