#!/usr/bin/env bash
# Lab 5 (docs/labs/05-ladder.md): the optimisation ladder of a GPT-2 training step, one config
# switch a rung: fp32 with the reference attention -> tf32 -> bf16 -> flash attention -> the
# fused classifier -> CUDA graphs. Each rung is `precis bench gpt2 --profile` (the graphs rung
# without --profile, which graphs hide): tokens/s and the profiler's top ops. GPT-2 124M (B=16, T=1024) on a GPU; the tiny preset on the CPU, where the
# GPU-only rungs run but change nothing (the table says which).
# Writes OUT_DIR/ladder.md, OUT_DIR/ladder.svg (precis plot of the rungs) and a folder per
# rung (its metrics and the profiler's roofline.svg).
source "$(dirname "$0")/common.sh"
case $LAB_SIZE in
  tiny) size=(--preset tiny --batch 1 --seq 32 --steps 1 --warmup 1) ;;
  cpu) size=(--preset tiny --batch 4 --seq 64 --steps 3 --warmup 1) ;;
  h100) size=(--preset gpt2 --batch 16 --seq 1024 --steps 20 --warmup 5) ;;
esac
# name | the rung's switches (each adds one to the rung above) | what it does not do on the CPU
rungs=(
  "1-fp32-reference|--precision fp32 --attention reference fused_classifier=false|"
  "2-tf32|--precision tf32 --attention reference fused_classifier=false|tf32 is plain f32 on the CPU"
  "3-bf16|--precision bf16 --attention reference fused_classifier=false|bf16 is emulated on the CPU (f32 arithmetic)"
  "4-flash|--precision bf16 --attention flash fused_classifier=false|flash runs on CUDA only: the reference runs"
  "5-fused-classifier|--precision bf16 --attention flash fused_classifier=true|"
  "6-cuda-graphs|--precision bf16 --attention flash fused_classifier=true --cuda-graphs|no CUDA graphs on the CPU"
)
folders=()
{
  echo "| rung | switches | tokens/s | ms/step | top ops (% of the step) | on the CPU |"
  echo "|---|---|---|---|---|---|"
} >"$OUT/ladder.md"
for rung in "${rungs[@]}"; do
  IFS='|' read -r name switches cpu_note <<<"$rung"
  read -ra args <<<"$switches"
  echo "==== $name: $switches ===="
  # The op profiler times every op, which a replayed graph hides: the graphs rung runs unprofiled.
  profile=(--profile)
  [[ $switches == *--cuda-graphs* ]] && profile=()
  "$PRECIS" bench gpt2 "${size[@]}" --device "$DEVICE" "${profile[@]}" "${args[@]}" --out "$OUT/$name" >"$OUT/$name.log" 2>&1 ||
    { tail -20 "$OUT/$name.log"; exit 1; }
  result=$(grep '^result:' "$OUT/$name.log")
  echo "$result"
  tokens=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$result")
  ms=$(sed -n 's/.*ms_per_step=\([0-9.]*\).*/\1/p' <<<"$result")
  # The profiler's three costliest op rows: "op pass calls total mean %step ...".
  top=$(awk '/^==== ops per step/ {on = 1; getline; next} on && NF == 0 {exit} on && n < 3 {printf "%s%s %s %s", (n ? ", " : ""), $1, $2, $6; n++}' "$OUT/$name.log")
  [[ -n $top ]] || top="not profiled (a replayed graph hides its ops)"
  [[ $DEVICE == cpu ]] || cpu_note="-"
  echo "| $name | \`$switches\` | $tokens | $ms | $top | ${cpu_note:--} |" >>"$OUT/ladder.md"
  folders+=("$OUT/$name")
done
cat "$OUT/ladder.md"
"$PRECIS" plot "${folders[@]}" --out "$OUT/ladder.svg" --csv "$OUT/ladder.csv"
