#!/usr/bin/env bash
# One call on a multi-GPU machine for data parallelism (issue 19): builds Precis (sm_90,
# into build-gpu) and llm.c (scripts/llmc-build.sh, into build-llmc) side by side, runs the
# distributed GPU tests, then times GPT-2 124M (bf16-pure, B=16, T=1024 per GPU) on 1 and
# N GPUs for Precis and llm.c in rounds (odd rounds run Precis first, even ones llm.c), and
# prints a table last, then each round's bars (Precis / llm.c, and Precis's scaling). Each row
# says the mean SM clock its cards ran at (scripts/clock-sampler.sh; the samples stay beside the
# run's log as NAME-Ngpu.clocks.csv): a step slows as the clocks fall.
#   bash scripts/ddp-check.sh
# Environment:
#   NGPUS     GPUs to use (default: all)            ROUNDS   rounds of the main runs (default 2)
#   FIRST_ROUND  the first round's number (default 1; a later call on a warm machine can go on
#             with 2, so that llm.c runs first there)
#   SIZES     GPU counts of the main rounds (default 1, 2 if NGPUS > 2, and NGPUS)
#   MAIN      settings of the main Precis runs (default: bf16 gradients, as llm.c keeps them,
#             with graphs); MAIN_MULTI those of its runs on more than one GPU (default: the best
#             measured on 2x and 4x H100, the same with ZeRO-1 in one bucket, reduce-scattered
#             after the backward, the parameters gathered by the optimizer's own stores:
#             distributed.fused_gather's default, auto: 0.2-0.3 ms off the step on 4x H200)
#   STEPS     timed steps (default 30)              WARMUP   steps before them (default 10)
#   VARIANTS  extra N-GPU Precis runs, ';'-separated "name:ENV=V ENV2=W|config.key=value ...":
#             env assignments before the '|', config settings after it (a name Ngpu-...: N GPUs)
#   EXTRAS    0: only the main rounds and the variants (no eager/traced/ZeRO/llm.c-option runs)
#   SIMULATE  1: also the two-"host" runs on NCCL's socket transport (see docs/distributed.md)
#   CARDS     1: also Precis's 1-GPU run on each card alone (CUDA_VISIBLE_DEVICES), after the
#             first round: an N-GPU step waits for its slowest card, and the 1-GPU rows run on
#             card 0, so a slow card lowers the scaling of both peers (seen: one card of four
#             3.5% slower, bench/RESULTS.md, fourteenth session)
#   TESTS     0: skip the GPU tests (TESTS_REGEX: which; default the distributed ones; TEST_TIMEOUT:
#             seconds one may take, default 90: a hung fault test costs no more)
#   TARGETS   build only these targets (e.g. "precis_cli ops_test_flash_attention_gpu"; default all)
#   LLMC      0: skip llm.c
#   BUDGET_S  no run starts after this many seconds from the start (default 540)
#   RUN_TIMEOUT  seconds a run may take before it is killed (default 150; a hang costs no more)
#   OUT       where logs go (the device tool's $OUT comes back)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu
OUT=${OUT:-/tmp/precis-ddp-check}
LOGS=$OUT/logs
mkdir -p "$LOGS"
: >"$OUT/rows.txt"
NGPUS=${NGPUS:-$(nvidia-smi -L | wc -l)}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
default_sizes="1 $NGPUS"
((NGPUS > 2)) && default_sizes="1 2 $NGPUS"
SIZES=${SIZES:-$default_sizes}
MAIN=${MAIN:-"precision.grad_dtype=bfloat16 cuda_graphs=true"}
MAIN_MULTI=${MAIN_MULTI:-"precision.grad_dtype=bfloat16 distributed.zero=1 distributed.bucket_mb=1000 distributed.first_bucket_mb=1000 cuda_graphs=true"}
MPI="mpirun --allow-run-as-root --bind-to none"
source scripts/clock-sampler.sh

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
start=$(date +%s)
if [[ ${LLMC:-1} == 1 ]]; then
  (scripts/llmc-build.sh build-llmc >"$LOGS/llmc-build.log" 2>&1) &
  llmc_pid=$!
fi
bash scripts/gpu-configure.sh "$BUILD" \
  >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" ${TARGETS:+--target $TARGETS} >"$LOGS/build.log" 2>&1 || { grep -E "error" "$LOGS/build.log" | head -40; exit 1; }
echo "build: ok ($(($(date +%s) - start)) s)"
llmc=""
if [[ ${LLMC:-1} == 1 ]]; then
  if wait "$llmc_pid"; then llmc=build-llmc/train_gpt2cu; else echo "llm.c build failed:"; tail -5 "$LOGS/llmc-build.log"; fi
fi

tests_summary="skipped"
if [[ ${TESTS:-1} == 1 ]]; then
  (cd "$BUILD" && ctest -L gpu -R "${TESTS_REGEX:-distributed|ddp|zero|mpi|Mpirun}" --timeout "${TEST_TIMEOUT:-90}" \
    --output-on-failure) >"$LOGS/gpu-tests.log" 2>&1
  tests_summary="$(grep -E 'tests passed|tests failed' "$LOGS/gpu-tests.log" | tail -1)"
  grep -E "Failed|Passed|\*\*\*" "$LOGS/gpu-tests.log" | tail -20
fi

# llm.c reads token shards of the same format as ours (data/token_file.h).
"$BUILD/precis" tokenize --tokenizer gpt2 assets/tinyshakespeare.txt "$OUT/tinyshakespeare" >"$LOGS/tokenize.log" 2>&1

BENCH="$BUILD/precis bench gpt2 --preset gpt2 --batch 16 --seq 1024 --precision bf16-pure --steps $STEPS --warmup $WARMUP --device cuda"
rows=()
declare -A tps_of  # "NAME:GPUS" -> tokens/s, for the bars' ratios at the end
# A result row, also appended to $OUT/rows.txt at once (a call cut short keeps what ran).
row() {
  rows+=("$1")
  echo "$1" >>"$OUT/rows.txt"
}
# The mean SM clock of GPUs $2... over the busy samples of CSV $1 ("1755/1742"): the step slows
# as the clocks fall, so each row says what its cards ran at (bench/NOTES.md, seventeenth session).
clocks_of() {
  python3 scripts/clock_samples.py "$@" | sed -nE 's/.* SM ([0-9]+) MHz.*/\1/p' | paste -sd/ -
}
# The GPUs a run takes: CUDA_VISIBLE_DEVICES among its settings $2..., else 0 to $1 - 1.
gpus_of() {
  local count=$1 e
  shift
  for e in "$@"; do [[ $e == CUDA_VISIBLE_DEVICES=* ]] && { echo "${e#*=}" | tr ',' ' '; return; }; done
  seq 0 $((count - 1)) | tr '\n' ' '
}
# Whether the time is up: the runs come in order of importance, the late ones are left out.
out_of_time() {
  if (($(date +%s) - start > ${BUDGET_S:-540})); then
    row "$(printf "%-28s %6s GPU  %12s" "$1" "$2" "not run (BUDGET_S)")"
    return 0
  fi
  return 1
}
# precis NAME GPUS [ENV...] [-- SETTINGS...]: one Precis run; its tokens/s (and comm figures) into rows.
precis_run() {
  local name=$1 gpus=$2
  shift 2
  out_of_time "$name" "$gpus" && return 0
  local envs=() settings=()
  while (($#)); do
    if [[ $1 == "--" ]]; then shift; settings=("$@"); break; fi
    envs+=("$1"); shift
  done
  local launcher=""
  ((gpus > 1)) && launcher="$MPI -np $gpus"
  local log="$LOGS/$name-${gpus}gpu.log"
  start_clock_sampler "${log%.log}.clocks.csv"
  timeout "${RUN_TIMEOUT:-150}" env "${envs[@]}" $launcher $BENCH "${settings[@]}" >"$log" 2>&1
  stop_clock_sampler
  local clocks=$(clocks_of "${log%.log}.clocks.csv" $(gpus_of "$gpus" "${envs[@]}"))
  local fields
  fields=$(grep -E "^result: " "$log" | tail -1)
  local tps=$(sed -n 's/.* tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$fields")
  local comm=$(sed -n 's/.* comm_ms=\([0-9.]*\).*/\1/p' <<<"$fields")
  local exposed=$(sed -n 's/.* comm_exposed_ms=\([0-9.]*\).*/\1/p' <<<"$fields")
  local optimizer=$(sed -n 's/.* optimizer_ms=\([0-9.]*\).*/\1/p' <<<"$fields")
  local peak=$(sed -n 's/.* peak_gib=\([0-9.]*\).*/\1/p' <<<"$fields")
  # The peak and this rank's optimizer state in MiB to 2 decimals (ZeRO-1's memory bar: the drop
  # against DDP on as many GPUs is at least the (N-1)/N share of the 1-GPU state).
  local peak_bytes=$(sed -n 's/.* peak_bytes=\([0-9]*\).*/\1/p' <<<"$fields")
  local state_bytes=$(sed -n 's/.* optimizer_state_bytes=\([0-9]*\).*/\1/p' <<<"$fields")
  [[ -n $peak && -z $peak_bytes ]] && peak="$peak GiB"
  [[ -n $peak_bytes ]] && peak="$peak GiB = $(awk "BEGIN{printf \"%.2f\", $peak_bytes/1048576}") MiB, state $(awk "BEGIN{printf \"%.2f\", $state_bytes/1048576}") MiB;"
  # The captured step's shape: "one stream", or the forks that slow every kernel of it.
  local shape=$(sed -n 's/^cuda graphs: captured the training step ([0-9]* nodes, \([^)]*\)).*/\1/p' "$log" | head -1)
  [[ -n $tps ]] && tps_of["$name:$gpus"]=$tps
  row "$(printf "%-28s %6s GPU  %12s tok/s  %s%s%s%s%s" "$name" "$gpus" "${tps:-FAILED}" "${clocks:+SM $clocks MHz  }" \
    "${peak:+peak $peak  }" "${comm:+comm $comm ms, exposed $exposed ms  }" "${optimizer:+optimizer $optimizer ms  }" \
    "${shape:+graph: $shape}")"
  [[ -z $tps ]] && tail -5 "$log"
}
# llmc NAME GPUS ARGS...: one llm.c run; tokens/s from the mean step time of the steps after the warm-up.
llmc_run() {
  local name=$1 gpus=$2
  shift 2
  [[ -n $llmc ]] || return 0
  out_of_time "$name" "$gpus" && return 0
  local launcher=""
  ((gpus > 1)) && launcher="$MPI -np $gpus"
  local log="$LOGS/$name-${gpus}gpu.log"
  # Its validation loader is opened though never run (-v 100000), and it asserts that the shard
  # holds a step's tokens of every rank: the val shard (~33K tokens) is too small for 4 ranks.
  start_clock_sampler "${log%.log}.clocks.csv"
  timeout "${RUN_TIMEOUT:-150}" $launcher "$llmc" -i "$OUT/tinyshakespeare_train.bin" -j "$OUT/tinyshakespeare_train.bin" -e d12 -o none \
    -b 16 -t 1024 -d $((16 * 1024 * gpus)) -x $((WARMUP + STEPS)) -v 100000 -s 100000 -pn "$gpus" "$@" >"$log" 2>&1
  stop_clock_sampler
  local clocks=$(clocks_of "${log%.log}.clocks.csv" $(gpus_of "$gpus"))
  local tps
  tps=$(awk -v w="$WARMUP" -v tok=$((16 * 1024 * gpus)) '
    /^step +[0-9]+\/[0-9]+ \|/ { split($2, s, "/"); if (s[1] + 0 > w) { for (i = 1; i < NF; i++) if ($(i + 1) == "ms") { sum += $i; n++ } } }
    END { if (n) printf "%.0f", tok * 1000.0 * n / sum }' "$log")
  [[ -n $tps ]] && tps_of["$name:$gpus"]=$tps
  row "$(printf "%-28s %6s GPU  %12s tok/s  %s(%s)" "$name" "$gpus" "${tps:-FAILED}" "${clocks:+SM $clocks MHz  }" "$*")"
  [[ -z $tps ]] && tail -5 "$log"
}

precis_sizes() {
  local g
  for g in $SIZES; do
    if ((g == 1)); then precis_run "precis-main-r$1" 1 -- $MAIN; else precis_run "precis-main-r$1" "$g" -- $MAIN_MULTI; fi
  done
}
llmc_sizes() {
  local g
  for g in $SIZES; do
    if ((g == 1)); then llmc_run "llmc-r$1" 1 -r 0; else llmc_run "llmc-z1-r$1" "$g" -r 0 -z 1; fi
  done
}
# Cards slow as they heat, so the rounds alternate which peer runs first: Precis in odd rounds
# (all the rounds of a call that runs one), llm.c in even ones.
main_round() {
  if (($1 % 2 == 1)); then
    precis_sizes "$1"
    llmc_sizes "$1"
  else
    llmc_sizes "$1"
    precis_sizes "$1"
  fi
}
# The bars of round $1, from its rows: Precis / llm.c at each size, and Precis's scaling
# (N-GPU tok/s over N times its 1-GPU tok/s).
bars() {
  local g p l line="round $1 bars:" one=${tps_of["precis-main-r$1:1"]:-}
  for g in $SIZES; do
    p=${tps_of["precis-main-r$1:$g"]:-}
    if ((g == 1)); then l=${tps_of["llmc-r$1:1"]:-}; else l=${tps_of["llmc-z1-r$1:$g"]:-}; fi
    [[ -n $p && -n $l ]] && line+=$(awk -v p="$p" -v l="$l" -v g="$g" 'BEGIN { printf "  %d GPU %.3fx llm.c", g, p / l }')
    [[ -n $p && -n $one ]] && ((g > 1)) && line+=$(awk -v p="$p" -v o="$one" -v g="$g" 'BEGIN { printf " (scaling %.2f%%)", 100 * p / (g * o) }')
  done
  echo "$line"
}
FIRST_ROUND=${FIRST_ROUND:-1}
main_round "$FIRST_ROUND"
if [[ ${CARDS:-0} == 1 ]]; then
  for ((card = 0; card < NGPUS; card++)); do precis_run "precis-card$card" 1 CUDA_VISIBLE_DEVICES=$card -- $MAIN; done
fi
if [[ ${EXTRAS:-1} == 1 ]]; then
# Eager steps time their phases (forward, backward, comm, comm_exposed, optimizer), and the
# traced step lists every kernel's time: what the N-GPU step spends beyond the 1-GPU one.
precis_run "precis-eager" 1
precis_run "precis-eager" "$NGPUS"
precis_run "precis-traced" 1 -- profile.trace="$LOGS/trace-1gpu.json" profile.trace_step=$((WARMUP + 1))
precis_run "precis-traced" "$NGPUS" -- profile.trace="$LOGS/trace-${NGPUS}gpu.json" profile.trace_step=$((WARMUP + 1))
precis_run "precis-zero1" "$NGPUS" -- distributed.zero=1
precis_run "precis-zero1-graphs" "$NGPUS" -- distributed.zero=1 cuda_graphs=true
for t in "$LOGS"/trace-*.json; do
  [[ -f $t ]] && python3 scripts/trace_timeline.py "$t" >"${t%.json}-timeline.txt" 2>&1
done
# mpirun's default for 2 ranks binds each to one core (its host thread, the batch prefetch and
# NCCL's proxy share it); the runs above use --bind-to none.
MPI="mpirun --allow-run-as-root" precis_run "precis-graphs-boundcore" "$NGPUS" -- cuda_graphs=true
llmc_run "llmc-recompute" 1 -r 1
llmc_run "llmc-z0" "$NGPUS" -r 0 -z 0
fi
IFS=';' read -ra variants <<<"${VARIANTS:-}"
for v in "${variants[@]}"; do
  [[ -n $v ]] || continue
  name=${v%%:*}
  spec=${v#*:}
  envs=${spec%%|*}
  settings=""
  [[ $spec == *"|"* ]] && settings=${spec#*|}
  gpus=$NGPUS
  [[ $name =~ ^([0-9]+)gpu- ]] && gpus=${BASH_REMATCH[1]}  # a variant named 2gpu-... runs on 2 GPUs
  precis_run "$name" "$gpus" $envs -- $settings
done
for ((round = FIRST_ROUND + 1; round < FIRST_ROUND + ROUNDS; round++)); do main_round "$round"; done
if [[ ${SIMULATE:-0} == 1 ]]; then
  # Two "hosts" of NGPUS/2 GPUs on NCCL's socket transport: no NVLink, no shared memory.
  SOCKET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
  precis_run "socket-eager" "$NGPUS" $SOCKET
  precis_run "socket-bucket100" "$NGPUS" $SOCKET -- distributed.bucket_mb=100
  precis_run "socket-bucket5" "$NGPUS" $SOCKET -- distributed.bucket_mb=5
  precis_run "socket-onebucket" "$NGPUS" $SOCKET -- distributed.bucket_mb=1000 distributed.first_bucket_mb=1000
  precis_run "socket-bf16-f32reduce" "$NGPUS" $SOCKET -- precision=bf16 precision.grad_reduce=float32
  precis_run "socket-bf16-bf16reduce" "$NGPUS" $SOCKET -- precision=bf16 precision.grad_reduce=bfloat16
  precis_run "socket-1gpu" 1 $SOCKET
fi
"$BUILD/precis" device >"$LOGS/device.txt" 2>&1
(cd "$LOGS" && tar czf "$OUT/ddp-logs.tgz" ./*.log ./*.txt 2>/dev/null)
rm -f "$LOGS"/*.json  # large; their timelines are in the archive

echo
echo "==== ddp-check summary ($(head -1 "$OUT/gpu.txt"), $NGPUS GPUs, $(($(date +%s) - start)) s) ===="
echo "gpu tests: $tests_summary"
for r in "${rows[@]}"; do echo "$r"; done
for ((round = FIRST_ROUND; round < FIRST_ROUND + ROUNDS; round++)); do bars "$round"; done
# The cards alone: the slowest against the fastest.
if [[ ${CARDS:-0} == 1 ]]; then
  for ((card = 0; card < NGPUS; card++)); do echo "${tps_of["precis-card$card:1"]:-}"; done |
    awk 'NF { n++; if (!lo || $1 < lo) lo = $1; if ($1 > hi) hi = $1 }
      END { if (n) printf "cards alone: slowest %d, fastest %d tok/s (the slowest %.1f%% behind)\n", lo, hi, 100 * (1 - lo / hi) }'
fi
