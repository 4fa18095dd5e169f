#!/usr/bin/env bash
# The checks that need a GPU, in one run (a few minutes on one H200): the engine's unit
# tests on CUDA, `bench engine` on small's shapes (random weights) in fp32 and bf16 with
# and without CUDA graphs against generate's static batch, where a 256-row decode step's
# time goes (the runner's pass and the model's idle time between passes), steps whose text
# is made while the next pass runs against lockstep, the llama-1b preset against the
# memory-bandwidth roofline, and generate in both precisions alternating in one process.
# Usage: infra/gpu-checks.sh [OUT_DIR]   (PY: a Python with a CUDA torch, transformers and
# the project's packages: the CLI imports pydantic, orjson, redis, aiokafka, httpx and
# prometheus_client to parse its commands; default python3; the models are built into
# $TOKENWIRE_CACHE).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${1:-reports/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TW_TEST_DEVICE=cuda
step() { echo; echo "=== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
"$PY" -c "import services.bench.engine_bench" || exit 1

step "engine unit tests on CUDA"
timeout 100 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_decode_graphs.py \
  tests/unit/test_model_runner.py tests/unit/test_direct_decode.py tests/unit/test_engine.py \
  tests/unit/test_engine_overlap.py 2>&1 | tail -15

step "random-weight models: small's shapes, llama-1b"
timeout 120 "$PY" - <<'EOF' || exit 1
import dataclasses
from services.model.build import build_model, default_cache_dir, ensure_model
from services.model.presets import get_preset
root = default_cache_dir()
small = root / "small-random"
if not (small / "build_info.json").exists():
    build_model(dataclasses.replace(get_preset("small"), train_steps=0), small, log=print)
ensure_model("llama-1b", root)
EOF
MODELS=${TOKENWIRE_CACHE:-$HOME/.cache/tokenwire}/models
LLAMA="$MODELS/$("$PY" -c 'from services.model.build import model_dir_name; print(model_dir_name("llama-1b"))')"
bench_small() {
  step "bench engine, small's shapes, $1"
  timeout 150 "$PY" -m services.cli bench engine --model-dir "$MODELS/small-random" --device cuda --dtype "$1" \
    --concurrency 1 32 256 --only throughput --no-generate-batch --out "$OUT/engine_cuda_$1.json" \
    2>&1 | grep -v "^\[model\]"
}

bench_small float32

step "the engine's own time in a 256-row step, small's shapes, fp32"
timeout 150 "$PY" -m services.cli bench engine --model-dir "$MODELS/small-random" --device cuda \
  --dtype float32 --concurrency 256 --only overhead --no-generate-batch \
  --out "$OUT/engine_cuda_overhead.json" 2>&1 | grep -E "alternating|decode step"

step "steps whose text is made while the next pass runs, against lockstep, small's shapes, fp32"
timeout 150 "$PY" -m services.cli bench engine --model-dir "$MODELS/small-random" --device cuda \
  --dtype float32 --concurrency 1 256 --only overlap --no-generate-batch \
  --out "$OUT/engine_cuda_overlap.json" 2>&1 | grep -E "alternating|decode step"

step "llama-1b against the roofline (bf16)"
timeout 150 "$PY" -m services.cli bench engine --model-dir "$LLAMA" --device cuda --dtype bfloat16 \
  --concurrency 1 64 --only throughput --no-generate-batch --new-tokens 128 \
  --out "$OUT/engine_cuda_llama1b.json" 2>&1 | grep -v "^\[model\]"
"$PY" - "$OUT/engine_cuda_llama1b.json" "$LLAMA/config.json" <<'EOF'
import json, sys
rep = json.load(open(sys.argv[1]))
cfg = json.load(open(sys.argv[2]))
params = rep["params_m"] * 1e6
bandwidth = 4.8e12  # H200 HBM3e, bytes/s
head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
kv_token = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 2  # bf16 K and V
for r in rep["throughput"]:
    c = r["concurrency"]
    # A decode step reads every weight once (bf16) and each row's KV (~256 positions).
    kv = c * 256 * kv_token
    roof = c * bandwidth / (2 * params + kv)
    print(f"concurrency {c}: engine {r['engine_tok_s']:,.0f} tok/s, roofline {roof:,.0f} "
          f"({r['engine_tok_s'] / roof:.0%}); generate one at a time {r['hf_generate_serial_tok_s']:,.0f}")
EOF

# The first model a process runs was slow in bf16 on this machine: generate in both
# precisions, alternating in one process, then again after the CUDA allocator was made
# to hold 16 GiB first (a cached pool: no new device allocations as the KV grows).
for pool in fresh held; do
  step "generate, bf16 and fp32 alternating in one process, allocator pool $pool"
  timeout 60 "$PY" - "$MODELS/small-random" $pool <<'EOF'
import sys, time, torch
if sys.argv[2] == "held":
    torch.empty(16 << 30, dtype=torch.uint8, device="cuda")  # freed at once, into the cache
from transformers import AutoModelForCausalLM
for dtype in (torch.bfloat16, torch.float32, torch.bfloat16):
    m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=dtype).cuda().eval()
    for batch in (1, 256):
        ids = torch.randint(3, 4000, (batch, 128), device="cuda")
        m.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=[])
        torch.cuda.synchronize(); t = time.perf_counter()
        m.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=[])
        torch.cuda.synchronize(); s = time.perf_counter() - t
        print(f"{str(dtype)[6:]:9} batch {batch:3}: {batch * 64 / s:9,.0f} tok/s")
    del m
EOF
done

bench_small bfloat16

echo "=== done ($(date +%T))"
