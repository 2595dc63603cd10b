#!/usr/bin/env bash
# Lab 6 (docs/labs/06-cnn-ddp.md): (a) LeNet-5 on MNIST under each precision policy
# (precis sweep); (b) data-parallel GPT-2 over 2 ranks with mpirun, the gradient bucket size
# swept (distributed.bucket_mb; docs/distributed.md): tokens/s and the communication time.
# Writes OUT_DIR/cnn/sweep.md + sweep.svg, and OUT_DIR/ddp-buckets.md + ddp-buckets.svg.
# LAB6_PARTS=cnn or ddp runs one half (default both; the device calls split them by GPU count).
source "$(dirname "$0")/common.sh"
case $LAB_SIZE in
  tiny) cnn=(max_steps=4 log_interval=2 eval_interval=4 eval_steps=2 batch.micro_batch=16)
        ddp=(--preset tiny --batch 1 --seq 32 --steps 1 --warmup 1) buckets="1 25" ;;
  cpu) cnn=(max_steps=400 log_interval=50 eval_interval=200 eval_steps=20)
       ddp=(--preset tiny --batch 2 --seq 64 --steps 3 --warmup 1) buckets="0.25 1 4 25" ;;
  h100) cnn=(device=cuda) ddp=(--preset gpt2 --batch 16 --seq 1024 --steps 20 --warmup 5) buckets="1 5 25 100" ;;
esac

parts=${LAB6_PARTS:-cnn,ddp}
if [[ $parts == *cnn* ]]; then
  echo "==== (a) LeNet-5 on MNIST, one run per precision policy ===="
  "$PRECIS" sweep examples/configs/mnist-lenet.yaml --precisions fp32,fp16,bf16,bf16-pure "${cnn[@]}" \
    out_dir="$OUT/cnn" >"$OUT/cnn.log" 2>&1 || { tail -20 "$OUT/cnn.log"; exit 1; }
  cat "$OUT/cnn/sweep.md"
fi
[[ $parts == *ddp* ]] || exit 0

echo "==== (b) DDP over 2 ranks: bucket size ===="
ranks=2
if ! command -v mpirun >/dev/null; then
  echo "(no mpirun: the DDP sweep needs MPI; skipped)" | tee "$OUT/ddp-buckets.md"
  exit 0
fi
if [[ $DEVICE == cuda ]] && (($(nvidia-smi -L 2>/dev/null | wc -l) < 2)); then
  echo "(fewer than 2 GPUs: the DDP sweep needs 2; skipped)" | tee "$OUT/ddp-buckets.md"
  exit 0
fi
# OpenMPI refuses root without these (CI runs as root); one thread per rank on the CPU.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
[[ $DEVICE == cpu ]] && export OMP_NUM_THREADS=1
{
  echo "| bucket MiB | tokens/s | ms/step | backward ms | communication ms | of it exposed (not hidden behind the backward) |"
  echo "|---|---|---|---|---|---|"
} >"$OUT/ddp-buckets.md"
folders=()
for mb in $buckets; do
  dir=$OUT/ddp-bucket-$mb
  mpirun -np $ranks --oversubscribe "$PRECIS" bench gpt2 "${ddp[@]}" --device "$DEVICE" --precision bf16 \
    distributed.bucket_mb="$mb" --out "$dir" >"$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
  result=$(grep -m1 '^result:' "$dir.log")
  echo "$result"
  field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$result"; }
  echo "| $mb | $(field tokens_per_s) | $(field ms_per_step) | $(field backward_ms) | $(field comm_ms) | $(field comm_exposed_ms) |" >>"$OUT/ddp-buckets.md"
  folders+=("$dir")
done
cat "$OUT/ddp-buckets.md"
"$PRECIS" plot "${folders[@]}" --out "$OUT/ddp-buckets.svg" --csv "$OUT/ddp-buckets.csv"
