"""A trained drafter made small enough to carry from one GPU lease to the next, and back again.

A drafter folder holds its weights in float32 and, beside them, a copy of the target's token
embedding, frozen during training. For the recipe's shape that is 232 MB, about 15 of the
device tool's parts. `pack` keeps what the next lease's measurements read:
- every weight in bfloat16, the dtype that eval (`drafter.to(target.dtype)`) and vLLM run it in
  on a GPU;
- not the frozen embedding, which `unpack` copies back from the target.
That is about 60 MB. `unpack` writes an ordinary drafter folder again: float32, the embedding
included.

    python experiments/drafter_pack.py pack RUN/train_online/drafter PACKED   # a drafter folder
    python experiments/drafter_pack.py unpack PACKED DEST --target HF_FOLDER

Not for resuming training: the optimizer state and the float32 master weights stay behind.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from draftsmith.draft.checkpoint import DRAFTER_FILE, WEIGHTS, load_drafter, save_file
from draftsmith.target import hf_folder

EMBED = "embed_tokens.weight"
PACK = "pack.json"


def pack(drafter: Path, out: Path) -> None:
    record = json.loads((drafter / DRAFTER_FILE).read_text())
    trained_embedding = bool(record["config"].get("train_embedding"))
    state = load_file(str(drafter / WEIGHTS))
    dropped = [] if trained_embedding else [EMBED]
    kept = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items() if k not in dropped}
    out.mkdir(parents=True, exist_ok=True)
    save_file(kept, out / WEIGHTS)
    shutil.copy(drafter / DRAFTER_FILE, out / DRAFTER_FILE)
    (out / PACK).write_text(json.dumps({"dtype": "bfloat16", "dropped": dropped, "from": str(drafter)}) + "\n")
    size = (out / WEIGHTS).stat().st_size
    print(f"packed {drafter} -> {out}: {size / 2**20:.1f} MiB (bf16, without {dropped or 'nothing'})")


def target_embedding(target: str) -> torch.Tensor:
    """The target's input embedding [V, H], read alone from its HF folder's safetensors."""
    folder = hf_folder(target, "drafter_pack.py unpack")
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            name = next((k for k in f.keys() if k.endswith(EMBED)), None)
            if name is not None:
                return f.get_tensor(name)
    raise SystemExit(f"{folder}: no {EMBED} in its safetensors")


def unpack(packed: Path, dest: Path, target: str) -> None:
    info = json.loads((packed / PACK).read_text())
    state = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(packed / WEIGHTS)).items()}
    if EMBED in info["dropped"]:
        state[EMBED] = target_embedding(target).float()
    dest.mkdir(parents=True, exist_ok=True)
    save_file(state, dest / WEIGHTS)
    shutil.copy(packed / DRAFTER_FILE, dest / DRAFTER_FILE)
    load_drafter(dest)  # the folder reads back as a drafter: every weight of its config, finite
    print(f"unpacked {packed} -> {dest} (the embedding from {target})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("drafter", type=Path)
    p.add_argument("out", type=Path)
    u = sub.add_parser("unpack")
    u.add_argument("packed", type=Path)
    u.add_argument("dest", type=Path)
    u.add_argument("--target", required=True, help="the target the drafter was trained on (its HF folder or spec)")
    args = ap.parse_args()
    if args.command == "pack":
        pack(args.drafter, args.out)
    else:
        unpack(args.packed, args.dest, args.target)


if __name__ == "__main__":
    main()
