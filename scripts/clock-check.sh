#!/usr/bin/env bash
# Does a card slow GPT-2's step as it heats, and more for Precis than for llm.c? (issue 19's
# 1.10x bar; bench/NOTES.md, thirteenth session.) One call on one GPU: builds Precis (sm_90,
# build-gpu) and llm.c (scripts/llmc-build.sh, build-llmc; carry .peers), then runs GPT-2 124M
# on GPU 0 (bf16-pure, bf16 gradients, graphs; B=16, T=1024; 10 warm-up + 30 measured steps)
# for Precis and llm.c in alternating rounds while nvidia-smi logs the card's SM clock, power,
# temperature and clock-event reasons every 100 ms. Prints, per run, its tok/s and those
# readings' means over the busy samples (power above 250 W), whole and by thirds of the run.
#   OUT=... ROUNDS=2 bash scripts/clock-check.sh
# Each run's log and samples stay in $OUT (NAME.log, NAME.csv).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/precis-clock-check}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
(scripts/llmc-build.sh build-llmc >"$OUT/llmc-build.log" 2>&1) &
llmc_pid=$!
bash scripts/gpu-configure.sh build-gpu >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target precis_cli >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -20; exit 1; }
wait "$llmc_pid" || { tail -5 "$OUT/llmc-build.log"; exit 1; }
build-gpu/precis tokenize --tokenizer gpt2 assets/tinyshakespeare.txt "$OUT/tinyshakespeare" >/dev/null 2>&1
source scripts/clock-sampler.sh
nvidia-smi -i 0 --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader

# logged NAME COMMAND...: the command on GPU 0 with the cards' readings sampled beside it.
logged() {
  local name=$1
  shift
  start_clock_sampler "$OUT/$name.csv"
  sleep 0.5
  CUDA_VISIBLE_DEVICES=0 "$@" >"$OUT/$name.log" 2>&1
  sleep 0.3
  stop_clock_sampler
}
names=()
for ((round = 1; round <= ROUNDS; round++)); do
  logged "precis-$round" build-gpu/precis bench gpt2 --preset gpt2 --batch 16 --seq 1024 --precision bf16-pure \
    --steps 30 --warmup 10 --device cuda precision.grad_dtype=bfloat16 cuda_graphs=true
  logged "llmc-$round" build-llmc/train_gpt2cu -i "$OUT/tinyshakespeare_train.bin" -j "$OUT/tinyshakespeare_train.bin" \
    -e d12 -o none -b 16 -t 1024 -d 16384 -x 40 -v 100000 -s 100000 -pn 1 -r 0
  names+=("precis-$round" "llmc-$round")
done
OUT=$OUT python3 - "${names[@]}" <<'PY'
import os, re, sys
sys.path.insert(0, "scripts")
from clock_samples import busy_samples, summary
out = os.environ["OUT"]
for name in sys.argv[1:]:
    log = open(f"{out}/{name}.log").read()
    found = re.search(r"tokens_per_s=(\d+)", log)  # Precis's result line
    if found:
        tps = int(found.group(1))
    else:  # llm.c: the mean step time of the steps after the 10 warm-up steps
        steps = [float(ms) for step, ms in re.findall(r"^step\s+(\d+)/\d+ \|.*?\|\s*([\d.]+) ms", log, re.M) if int(step) > 10]
        tps = round(16384 * 1000 * len(steps) / sum(steps)) if steps else 0
    print(f"{name:9s} tok/s {tps:7d}  {summary(busy_samples(f'{out}/{name}.csv').get(0, []))}")
PY
