#!/usr/bin/env bash
# The Python packages that draftsmith needs and the H200 image lacks, as wheels for its Python
# 3.12, into .whl (run here, where pip reaches PyPI; .whl is in .gitignore).
# On the device:  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
#                   --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src:.
# (2026-12-01: synth failed there without httpx2 and tenacity; the image has torch, transformers,
# typer, rich, safetensors, httpx, anyio, h11, but not these.)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  gguf pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection \
  httpx2==2.16.2 httpcore2==2.16.2 truststore tenacity
ls .whl
