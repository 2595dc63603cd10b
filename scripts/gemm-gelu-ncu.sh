#!/usr/bin/env bash
# Nsight Compute on the GELU-epilogue products at GPT-2's shape (ops/cuda/gemm_gelu_sm90.cu):
# one launch of each kernel variant (forward/backward x the shared-tile "tma" or register "reg"
# epilogue, clusters of 2; and the 128 x 256 tile "wide", shared-tile epilogue, clusters of 2)
# and cuBLASLt's two kernels, from GemmGeluGpu.TimesAtGpt2Shape
# (tests/ops/test_gemm_gelu_gpu.cpp), with `--set full`; then one compact table: duration,
# SM and tensor-pipe throughput, DRAM throughput and bytes, global-store sector use, shared
# store bank conflicts, and the top warp stall reasons (cycles a warp waits per issued
# instruction). Builds nothing: run it after building ops_test_gemm_gelu_gpu.
#   BIN=path/to/ops_test_gemm_gelu_gpu  (default: the first of build-ab, build-cuda, build)
#   OUT=folder                          (default: $OUT or /tmp/gemm-gelu-ncu) for the .ncu-rep files
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-}
if [[ -z "$BIN" ]]; then
  for d in build-ab build-cuda build; do
    if [[ -x "$d/tests/ops_test_gemm_gelu_gpu" ]]; then BIN=$d/tests/ops_test_gemm_gelu_gpu; break; fi
  done
fi
[[ -x "$BIN" ]] || { echo "no ops_test_gemm_gelu_gpu binary (set BIN)" >&2; exit 1; }
OUT=${OUT:-/tmp/gemm-gelu-ncu}
mkdir -p "$OUT"
FILTER=--gtest_filter=GemmGeluGpu.TimesAtGpt2Shape

# name  kernel-name-base  kernel regex  (the kernel's template arguments: <backward, tma store, cluster, wide>)
profiles=(
  "cublaslt_fwd_bwd function regex:sm90_xmma|gemm|nvjet|cutlass"
  "fwd_tma mangled regex:gemm_gelu_sm90_kernelILb0ELb1ELi2ELb0E"
  "fwd_reg mangled regex:gemm_gelu_sm90_kernelILb0ELb0ELi2ELb0E"
  "bwd_tma mangled regex:gemm_gelu_sm90_kernelILb1ELb1ELi2ELb0E"
  "bwd_reg mangled regex:gemm_gelu_sm90_kernelILb1ELb0ELi2ELb0E"
  "fwd_wide mangled regex:gemm_gelu_sm90_kernelILb0ELb1ELi2ELb1E"
  "bwd_wide mangled regex:gemm_gelu_sm90_kernelILb1ELb1ELi2ELb1E"
)
for p in "${profiles[@]}"; do
  read -r name base regex <<<"$p"
  count=1
  [[ $name == cublaslt_fwd_bwd ]] && count=2  # the test runs cuBLASLt first: its forward, then its backward
  echo "== ncu $name" >&2
  ncu --set full --kernel-name-base "$base" -k "$regex" -c "$count" -f -o "$OUT/$name" "$BIN" "$FILTER" \
    >"$OUT/$name.log" 2>&1 || { echo "ncu $name failed: tail of $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; }
done

for name in cublaslt_fwd_bwd fwd_tma fwd_reg bwd_tma bwd_reg fwd_wide bwd_wide; do
  [[ -f "$OUT/$name.ncu-rep" ]] && ncu --import "$OUT/$name.ncu-rep" --csv --page raw --print-units base \
    >"$OUT/$name.csv" 2>/dev/null || true
done

python3 - "$OUT" <<'PY'
import csv, os, re, sys
out = sys.argv[1]
cols = [("us", "gpu__time_duration.sum", 1e-3),
        ("SM%", "sm__throughput.avg.pct_of_peak_sustained_elapsed", 1),
        ("tensor%", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active|"
                    "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active", 1),
        ("DRAM%", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1),
        ("rd MB", "dram__bytes_read.sum", 1e-6),
        ("wr MB", "dram__bytes_write.sum", 1e-6),
        ("st sect%", "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct", 1),
        ("STG", "smsp__sass_inst_executed_op_global_st.sum", 1),
        ("sts confl", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", 1)]
stall = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
print(f"{'kernel':34}" + "".join(f"{c[0]:>10}" for c in cols) + "  top stalls (warps waiting per issue)")
for name in ["cublaslt_fwd_bwd", "fwd_tma", "fwd_reg", "bwd_tma", "bwd_reg", "fwd_wide", "bwd_wide"]:
    path = os.path.join(out, name + ".csv")
    if not os.path.exists(path):
        print(f"{name:34} (no profile)")
        continue
    with open(path, newline="") as f:
        rows = list(csv.reader(l for l in f if l.startswith('"')))
    if len(rows) < 3:
        print(f"{name:34} (empty profile)")
        continue
    header, data = rows[0], rows[2:]  # row 1: units
    for r in data:
        m = dict(zip(header, r))
        def num(keys):  # the first of the |-separated names this ncu reports
            for key in keys.split("|"):
                try:
                    return float(m[key].replace(",", ""))
                except (KeyError, ValueError):
                    pass
            return None
        label = (name + ":" + m.get("Kernel Name", "?")[:24])[:34]
        cells = []
        for _, key, scale in cols:
            v = num(key)
            cells.append(f"{v * scale:10.1f}" if v is not None else f"{'n/a':>10}")
        stalls = sorted(((num(k) or 0.0, stall.match(k).group(1)) for k in header if stall.match(k)), reverse=True)[:5]
        print(f"{label:34}" + "".join(cells) + "  " + ", ".join(f"{s} {v:.2f}" for v, s in stalls))
PY
