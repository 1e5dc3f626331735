#!/usr/bin/env bash
# vLLM's CUDA build for the H200 (torch 2.11.0+cu130, Python 3.12, no network), packed to carry.
# Run here, where pip reaches PyPI; writes .vllm/ (in .gitignore):
#   .vllm/vllm26.tar.xz.part00..02   the installed lean tree, xz, parts of <= 50 MiB
#   .vllm/vllm26.sha256              their checksums
#   .vllm/install.sh                 on the device: join, check, unpack into $1 (default /root/vllm26)
# On the device, after the three carrying calls put the parts in one folder:
#   bash .vllm/install.sh /root/vllm26 PARTS_DIR && export PYTHONPATH=/root/vllm26:$PYTHONPATH
# The lean set: vLLM 0.26.0 (the newest release that pins torch==2.11.0, the H200's build; its
# x86_64 wheel links CUDA 13) and what its offline engine imports that the H200's image lacks,
# found by importing LLM, the v1 engine core, the GPU worker and model runner, EAGLE-3, the Llama
# models, the sampler, the FA3 backend and the hidden-states connector against torch 2.11.0 and
# transformers 5.17 with only the image's packages beside them (2026-12-05). Left out: FA2 (FA3
# is Hopper's), flashinfer (VLLM_USE_FLASHINFER_SAMPLER=0 keeps the sampler off it), the
# Rust server binary, cutlass-dsl, tilelang, the MLA kernels, the server, tracing and video
# packages, and deep_gemm's builds for other Pythons. --no-deps on the device: nothing of the
# image's own packages (numpy 2.5.2, numba, protobuf, setuptools) changes. Also carried: the
# packages draftsmith itself needs there (experiments/h200_wheels.sh's list).
set -euo pipefail
cd "$(dirname "$0")/.."
LEAN=(
  vllm==0.26.0
  annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0
  depyf==0.20.0 fastapi==0.136.3 llguidance==1.7.6 msgspec==0.23.0 openai==3.63.0 openai-harmony==0.0.8
  partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 pyzmq==27.3.0
  setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0 typing-inspection==0.4.5 xgrammar==0.2.9
  # draftsmith's own, missing on the image
  gguf httpx2==2.17.0 httpcore2==2.17.0 truststore tenacity
)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
python3 -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  --target "$W/lean" "${LEAN[@]}"
# slim: FA2, the Rust server binary, deep_gemm for other Pythons, byte code
rm -f "$W"/lean/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$W"/lean/vllm/vllm-rs
find "$W/lean/vllm/third_party/deep_gemm" -name '_C.cpython-*.so' ! -name '_C.cpython-312-*' -delete
find "$W/lean" -name __pycache__ -type d -prune -exec rm -rf {} +
rm -rf "$W"/lean/bin
du -sh "$W/lean"
mkdir -p .vllm && rm -f .vllm/vllm26.tar.xz.part*
tar -C "$W/lean" -cf - . | xz -T2 -6 | split -b 50m -d - .vllm/vllm26.tar.xz.part
(cd .vllm && sha256sum vllm26.tar.xz.part* > vllm26.sha256)
cat > .vllm/install.sh <<'EOF'
#!/usr/bin/env bash
# install.sh DEST [PARTS_DIR]: check and unpack the lean vLLM tree into DEST (once)
set -euo pipefail
dest=${1:-/root/vllm26} parts=${2:-$(dirname "$0")}
[ -f "$dest/.complete" ] && exit 0
here=$(cd "$(dirname "$0")" && pwd)
(cd "$parts" && sha256sum -c --quiet "$here/vllm26.sha256")
rm -rf "$dest" && mkdir -p "$dest"
cat "$parts"/vllm26.tar.xz.part* | xz -d -T0 | tar -C "$dest" -xf -
touch "$dest/.complete"
EOF
ls -la .vllm
