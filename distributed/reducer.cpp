#include "distributed/reducer.h"

#include <algorithm>
#include <sstream>

#include "core/autograd.h"
#include "core/copy.h"

namespace precis::distributed {

struct Reducer::State {
  struct BucketRun {
    Tensor grad;                    // the bucket's slice of the flat gradient buffer
    Tensor staging;                 // defined when it is reduced in another dtype
    Tensor shard;                   // ZeRO-1: this rank's chunk of `grad`, averaged over ranks unless staged
    Tensor shard_staging;           // ZeRO-1 with staging: this rank's chunk of `staging`, the reduce_scatter's output
    bool shard_in_staging = false;  // ZeRO-1: shard_grad is shard_staging itself (16-bit), not cast back
    size_t expected = 0;            // parameters of the bucket that take gradients
    size_t pending = 0;             // of those, not ready yet this step
    std::shared_ptr<Work> work;     // its all-reduce, once launched
  };
  struct SlotRun {
    std::string name;
    bool expected = false;  // requires grad: its gradient must arrive each synced step
    bool ready = false;
  };

  std::shared_ptr<nn::FlatParameters> flat;
  std::shared_ptr<ProcessGroup> group;
  std::vector<Bucket> buckets;
  std::vector<BucketRun> runs;
  std::vector<SlotRun> slots;  // every slot of every buffer, buffer after buffer
  // Per slot: the buckets it lies in (one; ZeRO-1's buckets may split a parameter between two).
  std::vector<std::vector<size_t>> slot_buckets;
  size_t next_launch = 0;  // buckets before it are launched
  Profiler* profiler = nullptr;
  bool sync = true;
  bool overlap = true;

  void on_ready(size_t slot_id) {
    if (!sync) return;
    SlotRun& slot = slots[slot_id];
    PRECIS_CHECK(!slot.ready, "ddp reducer: parameter ", slot.name,
                 " got its gradient twice before finish(): run the accumulation micro-steps before the last under "
                 "no_sync, or call finish() after each backward");
    slot.ready = true;
    bool completed = false;
    for (size_t bucket : slot_buckets[slot_id]) completed |= --runs[bucket].pending == 0;
    // One bucket has nothing to overlap: finish() reduces it, in order.
    if (completed && overlap && runs.size() > 1) launch_ready(Launch::beside);
  }

  // Launches ready buckets in list order, so every rank issues the same collectives in the same
  // order. A bucket of frozen parameters only (none expected) is passed over, not reduced.
  void launch_ready(Launch launch) {
    while (next_launch < runs.size() && runs[next_launch].pending == 0) {
      BucketRun& run = runs[next_launch++];
      if (run.expected == 0) continue;
      if (run.staging.defined()) copy_(run.staging, run.grad);
      const Tensor& input = run.staging.defined() ? run.staging : run.grad;
      if (run.shard.defined())
        run.work = group->reduce_scatter(run.shard_staging.defined() ? run.shard_staging : run.shard, input,
                                         ReduceOp::avg, profiler, launch);
      else
        run.work = group->all_reduce(input, ReduceOp::avg, profiler, launch);
    }
  }

  void wait_launched() {
    for (BucketRun& run : runs)
      if (run.work) run.work->wait();
  }

  void reset() {
    for (BucketRun& run : runs) {
      run.pending = run.expected;
      run.work.reset();
    }
    for (SlotRun& slot : slots) slot.ready = false;
    next_launch = 0;
  }
};

Reducer::Reducer(std::shared_ptr<nn::FlatParameters> flat, std::shared_ptr<ProcessGroup> group, ReducerOptions options)
    : state_(std::make_shared<State>()) {
  PRECIS_CHECK(flat && group, "ddp reducer: needs flat parameters and a process group");
  PRECIS_CHECK(flat->device() == group->device(), "ddp reducer: the model is on ", flat->device(), " but the ",
               group->backend_name(), " process group reduces tensors on ", group->device());
  State& s = *state_;
  s.flat = std::move(flat);
  s.group = std::move(group);
  s.buckets = options.shard ? assign_shard_buckets(layout_of(*s.flat), options.bucket_sizes, s.group->world_size())
                            : assign_buckets(layout_of(*s.flat), options.bucket_sizes);

  std::vector<size_t> first_slot;  // per buffer: its first slot's index in s.slots
  for (const nn::FlatBuffer& buffer : s.flat->buffers()) {
    first_slot.push_back(s.slots.size());
    for (const nn::FlatSlot& slot : buffer.slots) s.slots.push_back({slot.name, slot.param.requires_grad(), false});
  }
  s.slot_buckets.resize(s.slots.size());
  s.runs.resize(s.buckets.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const Bucket& bucket = s.buckets[b];
    const nn::FlatBuffer& buffer = s.flat->buffers()[bucket.buffer];
    State::BucketRun& run = s.runs[b];
    run.grad = buffer.grad.slice(0, bucket.begin, bucket.end);
    if (options.reduce_dtype && *options.reduce_dtype != buffer.grad.dtype())
      run.staging = empty({bucket.end - bucket.begin}, *options.reduce_dtype, s.flat->device());
    if (options.shard) {
      // In place: this rank's chunk of the bucket receives the average, no buffer of its own.
      const int64_t chunk = (bucket.end - bucket.begin) / s.group->world_size(), first = s.group->rank() * chunk;
      run.shard = run.grad.slice(0, first, first + chunk);
      if (run.staging.defined()) {
        run.shard_staging = run.staging.slice(0, first, first + chunk);
        // The optimizers read a 16-bit gradient as it is, rounding it to f32 when they scale it
        // (optim/optimizer.h, StepInputs::round_scaled_grads_to_f32); a staging over another
        // gradient dtype (f32 over f64, bf16 over f16) is cast back into `shard` in finish().
        const DType reduce = *options.reduce_dtype;
        run.shard_in_staging = buffer.grad.dtype() == DType::f32 && (reduce == DType::bf16 || reduce == DType::f16);
      }
    }
    for (size_t slot_index : bucket.slots) {
      const size_t id = first_slot[bucket.buffer] + slot_index;
      if (!s.slots[id].expected) continue;
      ++run.expected;
      s.slot_buckets[id].push_back(b);
    }
  }
  for (size_t buffer = 0; buffer < s.flat->buffers().size(); ++buffer) {
    const std::vector<nn::FlatSlot>& slots = s.flat->buffers()[buffer].slots;
    for (size_t slot_index = 0; slot_index < slots.size(); ++slot_index) {
      const size_t id = first_slot[buffer] + slot_index;
      if (s.slot_buckets[id].empty()) continue;
      std::weak_ptr<State> weak = state_;
      slots[slot_index].param.register_grad_ready_hook([weak, id](const Tensor&) {
        if (std::shared_ptr<State> state = weak.lock()) state->on_ready(id);
      });
    }
  }
  s.reset();
}

Reducer::~Reducer() = default;

void Reducer::set_sync(bool sync) { state_->sync = sync; }
void Reducer::set_overlap(bool overlap) { state_->overlap = overlap; }
bool Reducer::sync() const { return state_->sync; }
void Reducer::set_profiler(Profiler* profiler) { state_->profiler = profiler; }
const std::vector<Bucket>& Reducer::buckets() const { return state_->buckets; }
ProcessGroup& Reducer::group() const { return *state_->group; }

bool Reducer::stages() const {
  for (const State::BucketRun& run : state_->runs)
    if (run.staging.defined()) return true;
  return false;
}

Tensor Reducer::shard_grad(size_t bucket) const {
  const State::BucketRun& run = state_->runs.at(bucket);
  return run.shard_in_staging ? run.shard_staging : run.shard;
}

void Reducer::finish() {
  State& s = *state_;
  if (!s.sync) return;
  std::vector<std::string> missing;
  for (const State::SlotRun& slot : s.slots)
    if (slot.expected && !slot.ready) missing.push_back(slot.name);
  if (!missing.empty()) {
    s.wait_launched();
    s.reset();
    std::ostringstream names;
    for (size_t i = 0; i < missing.size() && i < 10; ++i) names << (i ? ", " : "") << missing[i];
    if (missing.size() > 10) names << " and " << missing.size() - 10 << " more";
    PRECIS_FAIL("ddp reducer: ", missing.size() == 1 ? "parameter " : "parameters ", names.str(),
                " got no gradient in this step's backward; under data parallelism every parameter must take part "
                "in the loss (remove unused ones from the model, or set requires_grad false on them)");
  }
  // All of them without overlap (otherwise none is left), in order on the compute stream unless
  // buckets launched beside it are in flight (process_group.h, "Launch").
  const bool in_flight = std::any_of(s.runs.begin(), s.runs.end(), [](const auto& run) { return run.work; });
  s.launch_ready(in_flight ? Launch::beside : Launch::in_order);
  for (State::BucketRun& run : s.runs) {
    if (!run.work) continue;
    run.work->wait();
    if (run.shard_staging.defined() && !run.shard_in_staging)
      copy_(run.shard, run.shard_staging);
    else if (run.staging.defined() && !run.shard.defined())
      copy_(run.grad, run.staging);
  }
  s.reset();
}

namespace {

// FNV-1a over `text`, continuing from `hash`.
uint64_t fnv1a(uint64_t hash, const std::string& text) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001B3ull;
  }
  return hash;
}

// What every rank's model must agree on: a hash of the names, shapes, dtypes and
// offsets of the parameters, their number, their elements and the buffers.
std::vector<int64_t> model_fingerprint(const nn::FlatParameters& flat) {
  uint64_t hash = 0xCBF29CE484222325ull;
  int64_t slots = 0;
  for (const nn::FlatBuffer& buffer : flat.buffers()) {
    hash = fnv1a(hash, dtype_name(buffer.dtype));
    for (const nn::FlatSlot& slot : buffer.slots) {
      std::ostringstream entry;
      entry << slot.name << ':' << slot.offset;
      for (int64_t d : slot.param.shape()) entry << ',' << d;
      hash = fnv1a(hash, entry.str());
      ++slots;
    }
  }
  return {static_cast<int64_t>(hash >> 2), slots, flat.numel(), static_cast<int64_t>(flat.buffers().size())};
}

}  // namespace

void broadcast_parameters(nn::FlatParameters& flat, ProcessGroup& group, int root) {
  PRECIS_CHECK(flat.device() == group.device(), "broadcast_parameters: the model is on ", flat.device(), " but the ",
               group.backend_name(), " process group works on ", group.device());
  const std::vector<int64_t> mine = model_fingerprint(flat);
  const int64_t n = static_cast<int64_t>(mine.size());
  Tensor local = from_vector<int64_t>(mine, {n}).to(group.device());
  Tensor gathered = empty({n * group.world_size()}, DType::i64, group.device());
  group.all_gather(gathered, local)->wait();
  group.synchronize();  // a rank that never joins is an error after the group's timeout, not a hang
  const std::vector<int64_t> all = gathered.to_vector<int64_t>();
  for (int r = 0; r < group.world_size(); ++r) {
    const bool same = std::equal(all.begin() + r * n, all.begin() + (r + 1) * n, all.begin() + root * n);
    PRECIS_CHECK(same, "broadcast_parameters: rank ", r, " built another model than rank ", root, " (", all[r * n + 1],
                 " parameters of ", all[r * n + 2], " elements against ", all[root * n + 1], " of ", all[root * n + 2],
                 ", or other names, shapes or dtypes); every rank must run the same config");
  }
  NoGradGuard no_grad;
  for (nn::FlatBuffer& buffer : flat.buffers()) group.broadcast(buffer.data, root)->wait();
}

}  // namespace precis::distributed
