// The run folder (out_dir) belongs to one run at a time, and a run never loses another's
// results (docs/config.md, "The run folder"):
//   - RunLock: an advisory lock (flock) on out_dir/run.lock while a run uses the folder. The
//     kernel drops it when the process ends, however it ends, so a lock left by a killed run
//     never blocks the next one; the file keeps the holder's pid and host for the message.
//   - prepare_run_folder: a new run (not a resume) in a folder that holds checkpoints is an
//     error unless checkpoint.overwrite deletes them (and the old logs); otherwise a new run's
//     old metrics.jsonl and numerics.jsonl are moved aside (metrics.jsonl.1, ...), never truncated.
//   - drop_rows_after_step: a resumed run first drops the log rows of the steps it will redo,
//     so no step appears twice (and a line torn by a kill is dropped with them).
#pragma once

#include <cstdint>
#include <string>

#include "train/config.h"

namespace precis::train {

class RunLock {
 public:
  // Takes the lock or throws a precis::Error naming the pid and host that hold it.
  explicit RunLock(const std::string& out_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// The run's log files in out_dir that a resume trims and a fresh run sets aside.
inline constexpr const char* kRunLogFiles[] = {"metrics.jsonl", "numerics.jsonl"};

// Before a run starts in config.out_dir (rank 0, after the lock): the checks and clean-up above.
void prepare_run_folder(const TrainConfig& config);

// Writes resolved_config_yaml(config) to out_dir/resolved_config.yaml (atomically), so the
// run folder says exactly what ran; `precis train` reads the file back.
void save_resolved_config(const TrainConfig& config);

// Rewrites the JSONL file at `path` (if any) without the rows whose "step" is after `step`
// and without lines that are not JSON objects (a row torn by a kill); atomic (a renamed copy).
void drop_rows_after_step(const std::string& path, int64_t step);

}  // namespace precis::train
