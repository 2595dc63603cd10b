#!/usr/bin/env bash
# Lab 2 (docs/labs/02-loss-scaling.md): a small GPT-2 (char-level on the CPU, GPT-2 tokens on
# an H100) trained from one seed in fp32,
# in fp16 without loss scaling, with a static and with a dynamic scale, and in bf16-pure;
# the numerics report (precis train precision.report=true) counts fp16 underflow and lost
# updates, precis plot draws the loss, the loss scale and the skipped steps.
# Writes OUT_DIR/loss-scaling.md, OUT_DIR/loss-scaling.svg (+ .csv), OUT_DIR/numerics.svg (the
# reports over the steps) and a run folder per run. LAB2_STEPS sets the H100 size's steps (1000).
source "$(dirname "$0")/common.sh"
config=examples/configs/shakespeare-char-baby.yaml
case $LAB_SIZE in
  tiny) size=(model.n_layer=1 model.n_head=2 model.n_embd=32 batch.micro_batch=2 batch.seq_len=16 max_steps=4
              log_interval=2 precision.report_interval=2 eval_interval=4 eval_steps=1) ;;
  cpu) size=(model.n_layer=2 model.n_head=2 model.n_embd=64 batch.micro_batch=8 max_steps=300 log_interval=10
             precision.report_interval=100 eval_interval=100 eval_steps=10) ;;
  # GPT-2's 50257-token vocabulary and 8192 tokens a step: the logits' gradients are about
  # p / 8192 with p near 1/50257, far below fp16's smallest subnormal.
  h100) config=examples/configs/gpt2-shakespeare.yaml
        size=(batch.micro_batch=64 max_steps=${LAB2_STEPS:-1000} log_interval=10 precision.report_interval=100 eval_interval=100
              eval_steps=20) ;;
esac
# name, then the precision settings of that run.
runs=(
  "fp32|precision=fp32"
  "fp16-none|precision=fp16 precision.loss_scaling=none"
  "fp16-static|precision=fp16 precision.loss_scaling=static precision.loss_scale=1024"
  "fp16-dynamic|precision=fp16 precision.growth_interval=50"
  "bf16-pure|precision=bf16-pure"
)
folders=()
for run in "${runs[@]}"; do
  name=${run%%|*}
  read -ra settings <<<"${run#*|}"
  echo "==== $name: ${settings[*]} ===="
  "$PRECIS" train "$config" "${size[@]}" "${settings[@]}" precision.report=true device="$DEVICE" out_dir="$OUT/$name" \
    sample.tokens=0 checkpoint.overwrite=true checkpoint.save_final=false checkpoint.interval=0 on_nonfinite=skip \
    >"$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log"; exit 1; }
  tail -1 "$OUT/$name.log"
  folders+=("$OUT/$name")
done

# The table: the last metrics row, the scaler's skipped steps, and the last numerics report
# averaged over its layers.
{
  echo "| run | final loss | final val loss | skipped steps | final loss scale | act grads fp16-subnormal | act grads fp16 -> 0 | weight grads fp16-subnormal | lost updates |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for run in "${runs[@]}"; do
    name=${run%%|*}
    metrics=$OUT/$name/metrics.jsonl
    last=$(tail -1 "$metrics")
    loss=$(json_number loss <<<"$last")
    val=$( (grep '"val_loss"' "$metrics" || true) | tail -1 | json_number val_loss)
    [[ -n $val ]] && val=$(printf '%.4f' "$val")
    skipped=$( (grep -o 'skipped [0-9]*' "$OUT/$name.log" || true) | tail -1 | awk '{print $2}')
    numerics=$OUT/$name/numerics.jsonl
    step=$(tail -1 "$numerics" | json_number step)
    scale=$(tail -1 "$numerics" | json_number loss_scale)
    # Means over the layers of the last report, as percentages.
    # The fraction over all elements of the rows of one kind: each layer's weighted by its count.
    mean() { (grep "\"step\":$step," "$numerics" | grep "\"kind\":\"$1\"" || true) |
      while read -r row; do echo "$(json_number "$2" <<<"$row") $(json_number count <<<"$row")"; done |
      awk '{s += $1 * $2; n += $2} END {if (n) printf "%.2f%%", 100 * s / n; else printf "-"}'; }
    printf '| %s | %.4f | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$loss" "${val:--}" "${skipped:-0}" "$scale" \
      "$(mean 'act grad' fp16_subnormal)" "$(mean 'act grad' fp16_underflow)" "$(mean gradient fp16_subnormal)" \
      "$(mean update lost)"
  done
  echo
  echo "Underflow and lost-update columns: the report at step $step, over all elements of the layers (gradients as stored,"
  echo "i.e. multiplied by the loss scale). Lost updates: parameters with a nonzero gradient whose stored value"
  echo "did not change."
} >"$OUT/loss-scaling.md"
cat "$OUT/loss-scaling.md"
"$PRECIS" plot "${folders[@]}" --out "$OUT/loss-scaling.svg" --csv "$OUT/loss-scaling.csv" --numerics "$OUT/numerics.svg"
