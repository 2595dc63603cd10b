// The DDP reducer: averages the gradients of every rank while the backward runs.
//
// Built over a model's flat parameters (nn/flat_parameters.h) and a process
// group, it splits the flat gradient buffers into buckets (distributed/buckets.h)
// and registers a grad-ready hook on every parameter (core/autograd.h). When a
// bucket's last gradient is final, its all-reduce (avg over ranks) is launched,
// so it overlaps the rest of the backward (on a GPU: on the communication stream);
// buckets launch in their list order on every rank, a bucket that is ready early
// waiting for the ones before it. finish() waits for every bucket, so the gradients
// are averaged when it returns (on a GPU: for the work queued on the compute
// stream after it); the optimizer step comes after. A lone bucket (or every bucket
// without overlap, set_overlap(false)) has nothing to overlap: finish() launches it in
// order on the compute stream (process_group.h, "Launch"), which keeps a captured step's
// graph a single stream.
//
//   reducer.set_sync(false) / NoSync guard: accumulation micro-steps; their
//     gradients only accumulate locally, and the last micro-step (synced) reduces
//     the sum, as PyTorch's no_sync.
//   reduce_dtype (the precision policy's grad_reduce_dtype): a bucket whose
//     gradients are of another dtype is cast into a staging buffer of it on the
//     compute stream, reduced there (bf16/f16: divided by the world size before
//     the sum, see process_group.h), and cast back in finish() (not under ZeRO-1: below).
//   A parameter that got no gradient by finish() is an error naming it: every rank
//     must reduce every bucket, so every parameter must take part in the loss.
//
// One backward per synced step: a parameter whose gradient arrives twice before
// finish() is an error (use no_sync for the micro-steps before the last).
//
// ZeRO-1 (options.shard, distributed/zero.h): the buckets tile each flat buffer, padded
// for the world size (nn::flatten_parameters' `shards`), in slices of world_size equal
// chunks (assign_shard_buckets: a parameter may straddle two buckets, and is waited for
// by both), and a bucket's collective is a reduce_scatter (avg) instead of an all-reduce:
// rank r receives only chunk r of the bucket's averaged gradient, in place: shard_grad(bucket)
// is that chunk of the flat gradient buffer (the other chunks keep this rank's own sum), so
// ZeRO-1 takes no gradient memory beyond DDP's. A bucket reduced in bf16/f16 over an f32
// gradient buffer is not cast back: shard_grad is then chunk r of its staging buffer (made
// once with the reducer and reused every step, so a CUDA graph's replays find it where the
// capture did), which the optimizer reads in the reduce dtype; the flat gradient buffer
// keeps this rank's own sums everywhere. It launches as soon as the bucket's last gradient
// is final, overlapping the rest of the backward as DDP's all-reduces do; finish() waits.
#pragma once

#include <memory>
#include <optional>

#include "distributed/buckets.h"
#include "distributed/process_group.h"
#include "nn/flat_parameters.h"

namespace precis::distributed {

struct ReducerOptions {
  BucketSizes bucket_sizes;
  std::optional<DType> reduce_dtype;  // unset: each gradient buffer's own dtype
  bool shard = false;                 // ZeRO-1: reduce_scatter each bucket (above)
};

class Reducer {
 public:
  Reducer(std::shared_ptr<nn::FlatParameters> flat, std::shared_ptr<ProcessGroup> group, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Whether the next backward reduces (true) or only accumulates (false, no_sync).
  void set_sync(bool sync);
  bool sync() const;
  // Whether the next synced backward launches each bucket as soon as it is ready (true, the
  // default) or all of them in finish(), after the backward: a step whose products are
  // autotuned (the first of a process, ops/cuda/matmul_autotune.h) must time them without
  // NCCL's kernels running beside them, or it picks what is fastest under that contention.
  void set_overlap(bool overlap);
  // Times each bucket's all-reduce of the next backwards as phase "comm" of `profiler`
  // (process_group.h); nullptr (the default) times nothing, as a step captured into a CUDA
  // graph must.
  void set_profiler(Profiler* profiler);
  // Waits for every bucket's all-reduce of this step; the error for parameters without a gradient.
  // Does nothing after a no_sync backward.
  void finish();

  const std::vector<Bucket>& buckets() const;
  ProcessGroup& group() const;
  // Whether any bucket is cast into a staging buffer (its reduce dtype differs from its gradients').
  bool stages() const;
  // ZeRO-1: this rank's chunk of bucket `bucket`'s averaged gradient (chunk r of world_size
  // equal ones), complete after finish(): a view of the bucket's staging buffer when it is
  // reduced in bf16/f16 over an f32 gradient buffer, else of the flat gradient buffer; the
  // same tensor every step; undefined without options.shard.
  Tensor shard_grad(size_t bucket) const;

  struct State;

 private:
  std::shared_ptr<State> state_;  // the hooks hold it weakly: they outlive the reducer as no-ops
};

// Turns the reducer's sync off for a scope (gradient-accumulation micro-steps).
class NoSync {
 public:
  explicit NoSync(Reducer& reducer) : reducer_(reducer), previous_(reducer.sync()) { reducer.set_sync(false); }
  ~NoSync() { reducer_.set_sync(previous_); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  Reducer& reducer_;
  bool previous_;
};

// Copies rank `root`'s parameters into every rank's (at the start of a run), after
// checking that every rank built the same model (names, shapes, dtypes, layout):
// a mismatch is an error naming the first rank that differs.
void broadcast_parameters(nn::FlatParameters& flat, ProcessGroup& group, int root = 0);

}  // namespace precis::distributed
