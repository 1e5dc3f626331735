"""Convert a GGUF target (e.g. the embedded default) to a plain HF safetensors folder.

Loading the dequantised folder takes seconds instead of ~30 s of GGUF dequantisation, which
matters when a benchmark or recipe loads the target several times.

    python bench/gguf_to_hf.py /root/m/SmolLM2-135M-Instruct.Q4_1.gguf /root/smollm2-hf [--dtype bf16]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from draftsmith.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("gguf")
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    target = load_target(args.gguf, device="cpu", dtype=args.dtype)
    target.model.config.quantization_config = None  # plain weights now
    if hasattr(target.model, "hf_quantizer"):
        target.model.hf_quantizer = None
    target.model.save_pretrained(args.out)
    target.tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out} ({target.info.num_layers} layers, hidden {target.info.hidden_size})")


if __name__ == "__main__":
    main()
