"""Two hidden-state stores of one dataset, sample by sample: equal ids, rows == tokens, and per
layer the worst max |a - b| / max |b| and the lowest row cosine (bf16: about 1e-2 and 0.999).
    python experiments/compare_stores.py REFERENCE_STORE OTHER_STORE [--out-json F]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from draftsmith.data.store import StoreReader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("reference", type=Path)
    p.add_argument("other", type=Path)
    p.add_argument("--out-json", type=Path)
    a = p.parse_args()
    ref, got = StoreReader(a.reference), StoreReader(a.other)
    assert got.sample_ids == ref.sample_ids, "the stores hold different samples"
    H, worst, cos = ref.meta["hidden_size"], {}, {}
    names = [str(k) for k in ref.meta["aux_layer_ids"]] + ["final"]
    for i in range(len(ref)):
        x, y = got[i], ref[i]
        assert torch.equal(x["input_ids"], y["input_ids"]), f"sample {ref.sample_ids[i]}: token ids differ"
        assert x["aux_hidden_states"].shape[0] == x["input_ids"].shape[0], f"sample {ref.sample_ids[i]}: rows != tokens"
        parts = [
            (x["aux_hidden_states"][:, j * H : (j + 1) * H], y["aux_hidden_states"][:, j * H : (j + 1) * H])
            for j in range(len(names) - 1)
        ] + [(x["final_hidden_states"], y["final_hidden_states"])]
        for name, (u, v) in zip(names, parts):
            u, v = u.float(), v.float()
            worst[name] = max(worst.get(name, 0.0), float((u - v).abs().max() / v.abs().max()))
            cos[name] = min(cos.get(name, 1.0), float(torch.nn.functional.cosine_similarity(u, v, dim=-1).min()))
    result = {"samples": len(ref), "tokens": int(sum(ref.lengths)), "max_scaled_error": worst, "min_row_cosine": cos}
    print(json.dumps(result, indent=1))
    if a.out_json:
        a.out_json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
