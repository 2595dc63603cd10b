// ZeRO-1 (docs/distributed.md, "ZeRO-1"): the optimizer state and the f32 master
// weights sharded across the ranks over the flat buffers, as llm.c does it, with the
// gradient reduction bucketed so it overlaps the backward as DDP's does.
//
// Every flat buffer is padded to a multiple of world_size * alignment elements
// (nn::flatten_parameters' `shards`) and tiled by the reducer's ZeRO-1 buckets
// (distributed/buckets.h, assign_shard_buckets), each world_size equal chunks: rank r
// owns chunk r of every bucket. A step:
//   1. backward; as each bucket's last gradient is final the reducer (options.shard)
//      reduce_scatters it (avg), so rank r gets its chunk of the averaged gradient
//      (Reducer::shard_grad), overlapping the rest of the backward. A bucket reduced in
//      bf16/f16 over the f32 gradient buffer (bf16-pure's grad_reduce) is not cast back:
//      its chunk stays in the reducer's staging buffer, where steps 2 and 3 read it in
//      16 bits (grads_staged());
//   2. clip_grad_norm over the owned gradients with reduce_sum = sum_over_ranks: each
//      rank's sum of squares is all-reduced before the norm, the clip factor and the
//      loss scaler's found_inf are computed from it, on the device, the same on every rank;
//   3. the optimizer, built over shard_groups(), updates only what this rank owns: its
//      parameters are 1-D views of the flat data, one per piece of a parameter inside
//      an owned chunk (a parameter may be cut between chunks and ranks), with the
//      matching slice of the chunk's gradient (Reducer::shard_grad) as .grad, so its moments
//      and master copies hold about 1/world_size of the whole state;
//   4. gather_parameters(): an in-place all_gather of every bucket, each rank
//      contributing its updated chunk, in the parameters' dtype.
//
// With distributed.fused_gather (fuse_gather_into), step 4 is folded into step 3 where the
// ranks' GPUs can store into each other's memory (one NVLink node: ProcessGroup::peer_offsets):
// the flat parameter buffers are NCCL symmetric windows, and the optimizer stores each updated
// element into every rank's copy of its buffer as it writes its own (Optimizer::
// set_peer_copies), so what is left of step 4 is a barrier (ProcessGroup::peer_barrier) after
// which every rank reads every rank's update. The all-gather's traffic then runs inside the
// optimizer's own memory-bound pass instead of after it. Nothing is stored into a rank's copy
// while that rank may still read it: the reduce-scatter of step 1 completes on a rank only
// once every rank's backward is done.
//
// With distributed.gather_overlap, step 4 moves behind the next step's forward: after the
// optimizer the parameters are only pending (defer_gather: each rank holds its own updated
// chunks); every step starts with launch_gather, every bucket's all_gather in forward
// order (the reducer's list reversed: its buckets run from the last parameter to the
// first) without the compute stream waiting, and the model's forward calls the parameter
// gate (nn/parameter_gate.h) with each module before it reads its parameters: wait_for
// makes the compute stream wait for the buckets holding them, once per bucket. Whatever
// reads the parameters outside a step (evaluation, sampling, checkpoints, the numerics
// report, the end of a run) calls complete_gather() first, which does nothing when
// nothing is pending. On the MPI backend the values are the same as gathering at once; on
// NCCL only the time the gather takes moves.
//
// Checkpoints hold the whole state in the unsharded optimizer's format
// ("state.<i>.<name>" for the full model's parameter i, Optimizer::state_dict), so a
// checkpoint resumes under any world size and under zero 0 or 1: gather_state()
// assembles it from the shards on every rank (rank 0 writes it), shard_state() cuts a
// rank's pieces out of it for load_state_dict.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/reducer.h"
#include "nn/flat_parameters.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace precis::distributed {

// One piece of a parameter inside a chunk this rank owns.
struct ShardPiece {
  size_t param_index = 0;   // the parameter's index in the unsharded optimizer (over all groups)
  size_t buffer = 0;        // its flat buffer
  size_t bucket = 0;        // the reducer's bucket whose chunk holds it
  int64_t slot_offset = 0;  // where the parameter starts in the buffer
  int64_t begin = 0;        // the piece: elements [begin, end) of the buffer
  int64_t end = 0;
};

class Zero1 {
 public:
  // `flat` padded for the group's world size, `reducer` built over it and `group` with options.shard.
  Zero1(std::shared_ptr<nn::FlatParameters> flat, std::shared_ptr<ProcessGroup> group, const Reducer& reducer);

  // The sharded optimizer's groups: for each of `full_groups` (the unsharded optimizer's,
  // every parameter one of flat's), the same weight decay over the views of its
  // parameters' pieces this rank owns, in the groups' order; piece i of pieces() is the
  // sharded optimizer's parameter i. Call once.
  std::vector<optim::ParamGroup> shard_groups(const std::vector<optim::ParamGroup>& full_groups);
  const std::vector<ShardPiece>& pieces() const { return pieces_; }

  // Whether the shard's gradients are the reducer's 16-bit staging of f32 gradients
  // (Reducer::shard_grad): the step then passes StepInputs::round_scaled_grads_to_f32, so a
  // clipped or unscaled gradient rounds as the f32 one did and the update is the same.
  bool grads_staged() const;
  // sum <- the sum over ranks of sum (in place; optim::clip_grad_norm's reduce_sum).
  void sum_over_ranks(const Tensor& sum) const;
  // Every rank's chunks of the parameters into every rank's flat buffers, now (in order on the
  // compute stream: process_group.h, "Launch"); with the fused gather, the barrier after the
  // optimizer's stores.
  void gather_parameters();

  // The fused gather (above): makes `optimizer` (built over shard_groups()) store its updates
  // into the other ranks' copies too. A collective. False, with `why` set, where it cannot (the
  // backend, the GPUs, an optimizer without peer copies: SGD); the all-gather then stays.
  bool fuse_gather_into(optim::Optimizer& optimizer, std::string& why);
  bool gather_fused() const { return gather_fused_; }

  // gather_overlap (above). The parameters' chunks are updated and not gathered yet.
  void defer_gather() { gather_pending_ = true; }
  bool gather_pending() const { return gather_pending_; }
  // Launches the gather, pending or not (a step captured into a CUDA graph must hold it), bucket
  // by bucket in forward order, each in flight until waited for (beside the compute stream,
  // or in order on it).
  void launch_gather(Launch launch = Launch::beside);
  // The parameter gate: the work queued after it sees `module`'s parameters, and its
  // descendants', gathered (each bucket of a launched gather is waited for once).
  void wait_for(const nn::Module& module);
  // Launches a pending gather (in order) and waits for every bucket still in flight: the
  // parameters are whole after it. Nothing when none is pending or in flight.
  void complete_gather();

  // A collective: the unsharded optimizer's state, on the CPU, from this rank's
  // sharded optimizer state (every rank passes its own and gets the whole).
  std::map<std::string, Tensor> gather_state(const std::map<std::string, Tensor>& shard_state) const;
  // This rank's sharded optimizer state cut out of the unsharded one (no communication).
  std::map<std::string, Tensor> shard_state(const std::map<std::string, Tensor>& full_state) const;

  // Elements of buffer `buffer`'s parameters the optimizer covers on this rank, and in all.
  int64_t shard_elements(size_t buffer) const;
  int64_t total_elements(size_t buffer) const;
  // Elements of buffer `buffer` this rank owns (its chunks, padding included).
  int64_t owned_elements(size_t buffer) const;

 private:
  // This rank's chunk of one of the reducer's buckets.
  struct Chunk {
    size_t buffer = 0;
    int64_t bucket_begin = 0, bucket_end = 0;  // the bucket, in the buffer
    int64_t begin = 0, end = 0;                // this rank's chunk of it
    bool has_slots = false;                    // false: padding only, never reduced nor gathered
    Tensor grad;                               // Reducer::shard_grad (f32, or 16-bit staged)
  };

  std::shared_ptr<nn::FlatParameters> flat_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<Chunk> chunks_;  // one per bucket, in the reducer's order
  std::vector<ShardPiece> pieces_;
  // Per buffer: the unsharded optimizer's index of each slot's parameter (-1: not in it).
  std::vector<std::vector<int64_t>> slot_param_index_;
  // Per unsharded optimizer parameter: its flat slot.
  std::vector<const nn::FlatSlot*> param_slots_;

  bool gather_fused_ = false;  // fuse_gather_into succeeded
  // gather_overlap: per chunk, its all_gather until waited for (null: not in flight).
  bool gather_pending_ = false;
  std::vector<std::shared_ptr<Work>> gathers_;
  size_t gathers_in_flight_ = 0;
  // Per parameter (by its TensorImpl): the chunks of slots it lies in; per module gated
  // so far: the chunks of its parameters and its descendants', found on its first gate.
  std::unordered_map<const TensorImpl*, std::vector<size_t>> param_chunks_;
  std::unordered_map<const nn::Module*, std::vector<size_t>> module_chunks_;
};

}  // namespace precis::distributed
