// The tiny model (ddp_model.h) trained on every rank of a group under plain DDP and
// under ZeRO-1, step by step with the gradients clipped, for the ZeRO-1 tests on the
// MPI backend (test_zero_mpi.cpp) and over NCCL (test_zero_mpi_gpu.cpp).
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ddp_model.h"
#include "distributed/reducer.h"
#include "distributed/zero.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"

namespace precis::testing {

inline constexpr int64_t kRowsPerRank = 3;
inline constexpr double kMaxNorm = 0.05;  // below the tiny model's gradient norm: every step clips

struct RunOptions {
  std::shared_ptr<distributed::ProcessGroup> group;
  DType dtype = DType::f64;
  bool sgd = false;                   // SGD with Nesterov momentum instead of AdamW
  std::optional<DType> reduce_dtype;  // unset: the gradients' own
  // ZeRO-1's buckets: 96 bytes, rounded up to world_size 64-byte lines: several, and in f32
  // a parameter cut between two (fc2.weight, elements 48..71, by the boundary at 64).
  distributed::BucketSizes shard_buckets{96, 96};
  // ZeRO-1 with a bf16/f16 reduce_dtype over f32 gradients (Zero1::grads_staged), whose optimizer
  // reads the reduced chunks in the reducer's 16-bit staging: with widen_staged_grads it steps
  // instead from f32 copies of them in the flat gradient buffer (the path before it read them in
  // place, the reference); round_staged_grads_to_f32 false leaves StepInputs' option off.
  bool widen_staged_grads = false;
  bool round_staged_grads_to_f32 = true;
  // ZeRO-1's parameter buffer in the group's registered memory, as the trainer has it on NCCL.
  bool registered_params = false;
  // ZeRO-1's fused gather (Zero1::fuse_gather_into; needs registered_params): where the group
  // has peer memory, the optimizer stores into every rank's parameters and no all-gather runs.
  bool fused_gather = false;
};

// Rows of step `step`'s global batch that this rank takes, on the group's device.
inline Batch my_rows(const RunOptions& o, int step) {
  const int64_t global = kRowsPerRank * o.group->world_size();
  return global_batch(global * (step + 1), o.dtype)
      .rows(global * step + o.group->rank() * kRowsPerRank, kRowsPerRank)
      .to(o.group->device());
}

// The optimizer of a run over `groups`.
inline std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::ParamGroup> groups, bool sgd) {
  if (sgd) return std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  return std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 1e-2});
}

// One model trained under plain DDP.
struct DdpRun {
  explicit DdpRun(RunOptions options) : o(std::move(options)), model(o.dtype) {
    flat = nn::flatten_parameters(model, o.group->device());
    distributed::broadcast_parameters(*flat, *o.group);
    distributed::ReducerOptions reducer_options;
    reducer_options.reduce_dtype = o.reduce_dtype;
    reducer = std::make_unique<distributed::Reducer>(flat, o.group, reducer_options);
    optimizer = make_optimizer(optim::default_param_groups(model, 0.1), o.sgd);
  }
  // One step; returns {norm, factor}.
  std::vector<double> step(int step) {
    flat->zero_grad();
    mse_loss(model, my_rows(o, step)).backward();
    reducer->finish();
    Tensor norm = optim::clip_grad_norm(model.parameters(), kMaxNorm);
    optimizer->step({.grad_factor = norm.select(0, 1)});
    return norm.to_vector<double>();
  }
  RunOptions o;
  TinyMlp model;
  std::shared_ptr<nn::FlatParameters> flat;
  std::unique_ptr<distributed::Reducer> reducer;
  std::unique_ptr<optim::Optimizer> optimizer;
};

// The same model trained under ZeRO-1.
struct ZeroRun {
  explicit ZeroRun(RunOptions options) : o(std::move(options)), model(o.dtype) {
    flat = nn::flatten_parameters(model, o.group->device(), std::nullopt, o.group->world_size(), std::nullopt,
                                  o.registered_params ? o.group->registered_allocator() : nullptr);
    distributed::broadcast_parameters(*flat, *o.group);
    reducer = std::make_unique<distributed::Reducer>(
        flat, o.group,
        distributed::ReducerOptions{.bucket_sizes = o.shard_buckets, .reduce_dtype = o.reduce_dtype, .shard = true});
    zero = std::make_unique<distributed::Zero1>(flat, o.group, *reducer);
    optimizer = make_optimizer(zero->shard_groups(optim::default_param_groups(model, 0.1)), o.sgd);
    if (o.fused_gather) zero->fuse_gather_into(*optimizer, fused_gather_unavailable);
    if (o.widen_staged_grads) {
      // Piece i of the shard is the optimizer's parameter i: its gradient becomes its range of the f32 buffer.
      size_t i = 0;
      for (optim::ParamGroup& group : optimizer->param_groups())
        for (Tensor& view : group.params) {
          const distributed::ShardPiece& piece = zero->pieces()[i++];
          const Tensor wide = flat->buffers()[piece.buffer].grad.slice(0, piece.begin, piece.end);
          widened.push_back({wide, view.grad()});
          view.set_grad(wide);
        }
    }
  }
  std::vector<double> step(int step, const Tensor& found_inf = Tensor()) {
    flat->zero_grad();
    mse_loss(model, my_rows(o, step)).backward();
    reducer->finish();
    {
      NoGradGuard no_grad;
      for (const auto& [wide, staged] : widened) copy_(wide, staged);
    }
    std::vector<Tensor> params;
    for (const optim::ParamGroup& group : optimizer->param_groups())
      params.insert(params.end(), group.params.begin(), group.params.end());
    Tensor norm = optim::clip_grad_norm(params, kMaxNorm, Tensor(), found_inf, Tensor(),
                                        [this](const Tensor& sum) { zero->sum_over_ranks(sum); });
    optimizer->step({.grad_factor = norm.select(0, 1),
                     .skip_if = found_inf,
                     .round_scaled_grads_to_f32 = zero->grads_staged() && o.round_staged_grads_to_f32});
    zero->gather_parameters();
    return norm.to_vector<double>();
  }
  RunOptions o;
  TinyMlp model;
  std::shared_ptr<nn::FlatParameters> flat;
  std::unique_ptr<distributed::Reducer> reducer;
  std::unique_ptr<distributed::Zero1> zero;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::vector<std::pair<Tensor, Tensor>> widened;  // widen_staged_grads: (f32 gradient, staged chunk) per piece
  std::string fused_gather_unavailable;            // fused_gather asked for, not possible: why
};

inline std::vector<Tensor> clones_of(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> copies;
  for (const Tensor& t : tensors) copies.push_back(t.clone());
  return copies;
}

// k clipped steps of ZeRO-1 and DDP: the same norms, factors and parameters within `tolerance`.
inline void expect_zero_equals_ddp(const RunOptions& options, double tolerance) {
  DdpRun ddp(options);
  ZeroRun zero(options);
  const std::vector<Tensor> start = clones_of(ddp.model.parameters());
  for (int step = 0; step < 4; ++step) {
    const std::vector<double> ddp_norm = ddp.step(step), zero_norm = zero.step(step);
    EXPECT_GT(ddp_norm[0], kMaxNorm) << "step " << step << ": the test means to clip";
    EXPECT_NEAR(zero_norm[0], ddp_norm[0], tolerance * ddp_norm[0]) << "step " << step;
    EXPECT_NEAR(zero_norm[1], ddp_norm[1], tolerance * ddp_norm[1]) << "step " << step;
  }
  EXPECT_LT(relative_difference(zero.model.parameters(), ddp.model.parameters()), tolerance);
  EXPECT_GT(relative_difference(ddp.model.parameters(), start), 1e-3);  // they moved
}

// After some steps the state gathered from the shards is DDP's; a fresh ZeRO-1 run that
// loads DDP's state (and weights), cut into shards, steps on as DDP does.
inline void expect_gathered_state_is_ddps(const RunOptions& options, double tolerance) {
  DdpRun ddp(options);
  ZeroRun zero(options);
  for (int step = 0; step < 3; ++step) {
    ddp.step(step);
    zero.step(step);
  }
  const std::map<std::string, Tensor> ddp_state = ddp.optimizer->state_dict();
  const std::map<std::string, Tensor> gathered = zero.zero->gather_state(zero.optimizer->state_dict());
  ASSERT_EQ(gathered.size(), ddp_state.size());
  for (const auto& [key, value] : ddp_state) {
    ASSERT_TRUE(gathered.count(key)) << key;
    EXPECT_EQ(gathered.at(key).shape(), value.shape()) << key;
    EXPECT_EQ(gathered.at(key).dtype(), value.dtype()) << key;
    EXPECT_LT(relative_difference({gathered.at(key)}, {value}), tolerance) << key;
  }

  ZeroRun resumed(options);
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < ddp.model.parameters().size(); ++i)
      copy_(resumed.model.parameters()[i], ddp.model.parameters()[i]);
  }
  resumed.optimizer->load_state_dict(resumed.zero->shard_state(ddp_state));
  for (int step = 3; step < 5; ++step) {
    ddp.step(step);
    resumed.step(step);
  }
  EXPECT_LT(relative_difference(resumed.model.parameters(), ddp.model.parameters()), tolerance);
}

// ZeRO-1 reducing f32 gradients in options.reduce_dtype (bf16 or f16): the optimizer's views
// take their gradients from the reducer's 16-bit staging (not from the f32 gradient buffer),
// and k clipped steps give the norms (within norm_tolerance: 0 on the CPU) and the parameters
// (within param_tolerance, relative: 0 on the CPU, bit for bit) of the run that widens the
// reduced chunks into the f32 buffer first.
inline void expect_staged_grads_step_as_widened(RunOptions options, double norm_tolerance, double param_tolerance) {
  ZeroRun in_place(options);
  options.widen_staged_grads = true;
  ZeroRun widened(options);
  ASSERT_TRUE(in_place.zero->grads_staged());
  const Tensor& wide = in_place.flat->buffers()[0].grad;
  const char* begin = static_cast<const char*>(wide.raw_data());
  const char* end = begin + wide.numel() * element_size(wide.dtype());
  int64_t views = 0;  // a rank may own padding only
  for (const optim::ParamGroup& group : in_place.optimizer->param_groups())
    for (const Tensor& view : group.params) {
      EXPECT_EQ(view.grad().dtype(), *options.reduce_dtype);
      const char* grad = static_cast<const char*>(view.grad().raw_data());
      EXPECT_TRUE(grad < begin || grad >= end) << "a view's gradient lies in the f32 gradient buffer";
      ++views;
    }
  Tensor all_views = from_vector<int64_t>({views}, {1}).to(options.group->device());
  options.group->all_reduce(all_views, distributed::ReduceOp::sum)->wait();
  EXPECT_GT(all_views.to_vector<int64_t>()[0], 0);

  const std::vector<Tensor> start = clones_of(in_place.model.parameters());
  for (int step = 0; step < 4; ++step) {
    const std::vector<double> norm = in_place.step(step), reference = widened.step(step);
    EXPECT_LT(norm[1], 1.0) << "step " << step << ": the test means to clip (a factor to round)";
    EXPECT_NEAR(norm[0], reference[0], norm_tolerance * reference[0]) << "step " << step;
    EXPECT_NEAR(norm[1], reference[1], norm_tolerance * reference[1]) << "step " << step;
  }
  EXPECT_LE(relative_difference(in_place.model.parameters(), widened.model.parameters()), param_tolerance);
  EXPECT_GT(relative_difference(in_place.model.parameters(), start), 1e-3);  // they moved
}

}  // namespace precis::testing
