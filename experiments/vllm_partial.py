"""The passes that a stopped `eval --engine vllm` finished, from its temporary folder.

The worker writes vllm_result.json after each engine (evaluate/vllm_worker.py); a run stopped from
outside (a step's time limit, a lease's end) leaves it with vllm_request.json in OUT's temporary
folder (`.NAME.*.tmp`). This prints one line per finished speculative pass, with its speed-up where
the plain engine had run, as eval's report.md would (evaluate/vllm_eval.py's `finished_passes`):

    python experiments/vllm_partial.py runs/.vllm_k753.XXXX.tmp [--out-json partial.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.evaluate.questions import Question
from draftsmith.evaluate.report import vllm_pass_line
from draftsmith.evaluate.vllm_eval import finished_passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="the run's temporary folder (vllm_request.json, vllm_result.json)")
    ap.add_argument("--out-json", type=Path, default=None)
    args = ap.parse_args()
    req = json.loads((args.folder / "vllm_request.json").read_text())
    res = json.loads((args.folder / "vllm_result.json").read_text())
    questions = [Question(q["question_id"], q["category"], q["turns"]) for q in req["questions"]]
    done = [name for name, e in res["engines"].items() if "error" not in e]
    rows = finished_passes(res, req["engines"], questions, req["temperature"] == 0)
    print(f"vLLM {res['vllm_version']}: engines finished {', '.join(done) or 'none'} of {len(req['engines'])}")
    for r in rows:
        print(vllm_pass_line(res["vllm_version"], r))
    if args.out_json:
        args.out_json.write_text(json.dumps({"complete": res.get("complete"), "passes": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
