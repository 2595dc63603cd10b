# Sourced by the GPU scripts (ddp-check.sh, clock-check.sh): nvidia-smi's clock and power samples
# beside a run, every 100 ms, into a CSV that scripts/clock_samples.py sums up.
#   start_clock_sampler FILE.csv   (every GPU of the machine)
#   ... the run ...
#   stop_clock_sampler
clock_fields=$(python3 "$(dirname "${BASH_SOURCE[0]}")/clock_samples.py" --fields)
# An older driver names the reasons clocks_throttle_reasons.
nvidia-smi --query-gpu="$clock_fields" --format=csv >/dev/null 2>&1 ||
  clock_fields=${clock_fields/clocks_event_reasons/clocks_throttle_reasons}
clock_sampler_pid=""
start_clock_sampler() {
  nvidia-smi --query-gpu="$clock_fields" --format=csv,noheader,nounits -lms 100 >"$1" 2>/dev/null &
  clock_sampler_pid=$!
}
stop_clock_sampler() {
  [[ -n $clock_sampler_pid ]] && kill "$clock_sampler_pid" 2>/dev/null
  wait "$clock_sampler_pid" 2>/dev/null
  clock_sampler_pid=""
}
