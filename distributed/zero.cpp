#include "distributed/zero.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/autograd.h"
#include "core/copy.h"

namespace precis::distributed {

namespace {

// The per-parameter state the optimizers keep (optim/adamw.h, optim/sgd.h, optim/optimizer.h).
constexpr std::array<const char*, 4> kStateNames = {"exp_avg", "exp_avg_sq", "momentum_buffer", "master"};

// The dtype of state `name` for parameters of `param_dtype` (Optimizer::state_buffer, master_buffer).
DType state_dtype(const std::string& name, DType param_dtype) {
  return name != "master" && param_dtype == DType::f64 ? DType::f64 : DType::f32;
}

std::string state_key(size_t index, const std::string& name) { return "state." + std::to_string(index) + "." + name; }

// "state.<index>.<name>" -> index and the position of name in kStateNames.
void parse_state_key(const std::string& key, size_t& index, size_t& name) {
  const size_t dot1 = key.find('.'), dot2 = key.find('.', dot1 + 1);
  PRECIS_CHECK(key.rfind("state.", 0) == 0 && dot2 != std::string::npos, "zero-1: unexpected optimizer state entry '",
               key, "'");
  index = std::stoul(key.substr(dot1 + 1, dot2 - dot1 - 1));
  const std::string suffix = key.substr(dot2 + 1);
  const auto it = std::find(kStateNames.begin(), kStateNames.end(), suffix);
  PRECIS_CHECK(it != kStateNames.end(), "zero-1: optimizer state '", key,
               "' is none of the states ZeRO-1 shards (exp_avg, exp_avg_sq, momentum_buffer, master)");
  name = static_cast<size_t>(it - kStateNames.begin());
}

}  // namespace

Zero1::Zero1(std::shared_ptr<nn::FlatParameters> flat, std::shared_ptr<ProcessGroup> group, const Reducer& reducer)
    : flat_(std::move(flat)), group_(std::move(group)) {
  const int world = group_->world_size(), rank = group_->rank();
  for (size_t k = 0; k < reducer.buckets().size(); ++k) {
    const Bucket& bucket = reducer.buckets()[k];
    const int64_t size = (bucket.end - bucket.begin) / world;
    PRECIS_CHECK(size * world == bucket.end - bucket.begin && reducer.shard_grad(k).defined(),
                 "zero-1: the reducer's bucket ", k, " is not cut into ", world,
                 " chunks; build the reducer with options.shard");
    chunks_.push_back({bucket.buffer, bucket.begin, bucket.end, bucket.begin + rank * size,
                       bucket.begin + (rank + 1) * size, !bucket.slots.empty(), reducer.shard_grad(k)});
  }
  for (const nn::FlatBuffer& buffer : flat_->buffers()) slot_param_index_.emplace_back(buffer.slots.size(), -1);
  gathers_.resize(chunks_.size());
  for (size_t k = 0; k < chunks_.size(); ++k) {
    if (!chunks_[k].has_slots) continue;
    const nn::FlatBuffer& buffer = flat_->buffers()[chunks_[k].buffer];
    for (const nn::FlatSlot& slot : buffer.slots)
      if (slot.offset < chunks_[k].bucket_end && slot.offset + slot.numel > chunks_[k].bucket_begin)
        param_chunks_[slot.param.impl()].push_back(k);
  }
}

std::vector<optim::ParamGroup> Zero1::shard_groups(const std::vector<optim::ParamGroup>& full_groups) {
  PRECIS_CHECK(pieces_.empty() && param_slots_.empty(), "zero-1: shard_groups() is called once");
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> where;  // parameter -> (buffer, slot)
  for (size_t b = 0; b < flat_->buffers().size(); ++b)
    for (size_t s = 0; s < flat_->buffers()[b].slots.size(); ++s)
      where[flat_->buffers()[b].slots[s].param.impl()] = {b, s};
  NoGradGuard no_grad;
  std::vector<optim::ParamGroup> groups;
  for (const optim::ParamGroup& full : full_groups) {
    optim::ParamGroup& group = groups.emplace_back(optim::ParamGroup{{}, full.weight_decay});
    for (const Tensor& p : full.params) {
      const auto it = where.find(p.impl());
      PRECIS_CHECK(it != where.end(), "zero-1: optimizer parameter ", param_slots_.size(),
                   " is not one of the flat parameters; ZeRO-1 shards the flat buffers");
      const auto [b, s] = it->second;
      const nn::FlatSlot& slot = flat_->buffers()[b].slots[s];
      const size_t index = param_slots_.size();
      slot_param_index_[b][s] = static_cast<int64_t>(index);
      param_slots_.push_back(&slot);
      bool covered = false;  // by some bucket (a parameter without a gradient buffer is in none)
      for (size_t k = 0; k < chunks_.size(); ++k) {
        const Chunk& chunk = chunks_[k];
        if (chunk.buffer != b) continue;
        covered |= slot.offset < chunk.bucket_end && slot.offset + slot.numel > chunk.bucket_begin;
        const int64_t begin = std::max(slot.offset, chunk.begin), end = std::min(slot.offset + slot.numel, chunk.end);
        if (begin >= end) continue;
        Tensor view = flat_->buffers()[b].data.slice(0, begin, end);
        view.set_requires_grad(true);
        view.set_grad(chunk.grad.slice(0, begin - chunk.begin, end - chunk.begin));
        group.params.push_back(view);
        pieces_.push_back({index, b, k, slot.offset, begin, end});
      }
      PRECIS_CHECK(covered, "zero-1: parameter ", slot.name, " has no gradient to shard");
    }
  }
  return groups;
}

bool Zero1::grads_staged() const {
  return std::any_of(chunks_.begin(), chunks_.end(), [&](const Chunk& chunk) {
    return chunk.grad.dtype() != flat_->buffers()[chunk.buffer].grad.dtype();
  });
}

void Zero1::sum_over_ranks(const Tensor& sum) const {
  group_->all_reduce(sum, ReduceOp::sum, nullptr, Launch::in_order)->wait();
}

void Zero1::gather_parameters() {
  if (gather_fused_) {
    group_->peer_barrier();
    return;
  }
  defer_gather();
  complete_gather();
}

bool Zero1::fuse_gather_into(optim::Optimizer& optimizer, std::string& why) {
  PRECIS_CHECK(!param_slots_.empty(), "zero-1: fuse_gather_into() comes after shard_groups()");
  if (!optimizer.supports_peer_copies()) {
    why = "the optimizer does not store into the other ranks' copies (AdamW does)";
    return false;
  }
  // Every buffer's offsets, in the same order on every rank (each call is collective).
  std::vector<std::vector<int64_t>> others(flat_->buffers().size());
  for (size_t b = 0; b < flat_->buffers().size(); ++b) {
    // A buffer some bucket gathers (the same on every rank; this rank's pieces lie in them).
    if (std::none_of(chunks_.begin(), chunks_.end(), [&](const Chunk& c) { return c.buffer == b && c.has_slots; }))
      continue;
    std::vector<int64_t> offsets = group_->peer_offsets(flat_->buffers()[b].data, why);
    if (offsets.empty()) return false;  // the same answer on every rank
    for (int r = 0; r < group_->world_size(); ++r)
      if (r != group_->rank()) others[b].push_back(offsets[r]);
  }
  std::vector<std::vector<int64_t>> per_param;
  for (const ShardPiece& piece : pieces_) per_param.push_back(others[piece.buffer]);
  optimizer.set_peer_copies(std::move(per_param));
  gather_fused_ = true;
  return true;
}

void Zero1::launch_gather(Launch launch) {
  PRECIS_CHECK(!gather_fused_, "zero-1: the optimizer gathers the parameters itself (fused gather); there is no ",
               "all-gather to launch");
  gather_pending_ = false;
  gathers_in_flight_ = 0;  // what a failed capture left is not waited for
  // Forward order: the reducer lists the buckets from the last parameter to the first.
  for (size_t k = chunks_.size(); k-- > 0;) {
    const Chunk& chunk = chunks_[k];
    if (!chunk.has_slots) continue;
    const Tensor& data = flat_->buffers()[chunk.buffer].data;
    gathers_[k] = group_->all_gather(data.slice(0, chunk.bucket_begin, chunk.bucket_end),
                                     data.slice(0, chunk.begin, chunk.end), launch);
    ++gathers_in_flight_;
  }
}

void Zero1::wait_for(const nn::Module& module) {
  if (gathers_in_flight_ == 0) return;
  auto [it, first] = module_chunks_.try_emplace(&module);
  if (first) {
    for (const Tensor& p : module.parameters()) {
      const auto found = param_chunks_.find(p.impl());
      if (found != param_chunks_.end()) it->second.insert(it->second.end(), found->second.begin(), found->second.end());
    }
    // Each once, in the order they were launched (the reducer's reversed).
    std::sort(it->second.rbegin(), it->second.rend());
    it->second.erase(std::unique(it->second.begin(), it->second.end()), it->second.end());
  }
  for (size_t k : it->second) {
    if (!gathers_[k]) continue;
    gathers_[k]->wait();
    gathers_[k].reset();
    --gathers_in_flight_;
  }
}

void Zero1::complete_gather() {
  // Nothing is in flight beside a pending gather, and it is waited for at once: in order.
  if (gather_pending_) launch_gather(Launch::in_order);
  for (size_t k = chunks_.size(); k-- > 0;) {
    if (!gathers_[k]) continue;
    gathers_[k]->wait();
    gathers_[k].reset();
  }
  gathers_in_flight_ = 0;
}

std::map<std::string, Tensor> Zero1::gather_state(const std::map<std::string, Tensor>& shard_state) const {
  const auto step = shard_state.find("step");
  PRECIS_CHECK(step != shard_state.end(), "zero-1: the optimizer state has no 'step' entry");
  std::map<std::string, Tensor> out{{"step", step->second}};
  // Which states of which buffer any rank holds: a rank that owns no parameter of a buffer holds none.
  const size_t buffers = flat_->buffers().size(), names = kStateNames.size();
  std::vector<int64_t> held(buffers * names, 0);
  for (const auto& [key, value] : shard_state) {
    if (key == "step") continue;
    size_t index = 0, name = 0;
    parse_state_key(key, index, name);
    PRECIS_CHECK(index < pieces_.size(), "zero-1: optimizer state '", key, "' is for parameter ", index,
                 " of a shard of ", pieces_.size());
    held[pieces_[index].buffer * names + name] = 1;
  }
  Tensor flags = from_vector<int64_t>(held, {static_cast<int64_t>(held.size())}).to(group_->device());
  group_->all_reduce(flags, ReduceOp::sum)->wait();
  held = flags.to_vector<int64_t>();

  for (size_t b = 0; b < buffers; ++b) {
    const nn::FlatBuffer& buffer = flat_->buffers()[b];
    for (size_t name = 0; name < names; ++name) {
      if (held[b * names + name] == 0) continue;
      const DType dtype = state_dtype(kStateNames[name], buffer.dtype);
      // The buffer's state, bucket by bucket: this rank's chunk from its pieces, then every rank's.
      Tensor whole = zeros({buffer.data.numel()}, dtype, group_->device());
      for (size_t k = 0; k < chunks_.size(); ++k) {
        const Chunk& chunk = chunks_[k];
        if (chunk.buffer != b || !chunk.has_slots) continue;
        Tensor mine = zeros({chunk.end - chunk.begin}, dtype, group_->device());
        for (size_t i = 0; i < pieces_.size(); ++i) {
          const auto it = shard_state.find(state_key(i, kStateNames[name]));
          if (pieces_[i].bucket == k && it != shard_state.end())
            copy_(mine.slice(0, pieces_[i].begin - chunk.begin, pieces_[i].end - chunk.begin), it->second);
        }
        group_->all_gather(whole.slice(0, chunk.bucket_begin, chunk.bucket_end), mine)->wait();
      }
      const Tensor host = whole.to(Device::cpu());
      for (size_t s = 0; s < buffer.slots.size(); ++s) {
        const int64_t index = slot_param_index_[b][s];
        if (index < 0) continue;
        // The slot's elements are in the parameter's memory order: read with its strides, they
        // give the unsharded optimizer's state in its usual row-major form.
        const nn::FlatSlot& slot = buffer.slots[s];
        out[state_key(static_cast<size_t>(index), kStateNames[name])] =
            host.as_strided(slot.param.shape(), slot.param.strides(), slot.offset).clone();
      }
    }
  }
  return out;
}

std::map<std::string, Tensor> Zero1::shard_state(const std::map<std::string, Tensor>& full_state) const {
  const auto step = full_state.find("step");
  PRECIS_CHECK(step != full_state.end(), "optimizer state: no 'step' entry; is this an optimizer checkpoint?");
  for (const auto& [key, value] : full_state) {
    if (key == "step") continue;
    size_t index = 0, name = 0;
    parse_state_key(key, index, name);
    PRECIS_CHECK(index < param_slots_.size(), "optimizer state: entry '", key, "' is for parameter ", index,
                 " but there are ", param_slots_.size(), " parameters; the checkpoint was made for a different model");
    PRECIS_CHECK(value.shape() == param_slots_[index]->param.shape(), "optimizer state: '", key, "' has shape ",
                 value.shape(), " but parameter ", index, " has shape ", param_slots_[index]->param.shape());
  }
  std::map<std::string, Tensor> out{{"step", step->second}};
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const ShardPiece& piece = pieces_[i];
    for (const char* name : kStateNames) {
      const auto it = full_state.find(state_key(piece.param_index, name));
      if (it == full_state.end()) continue;
      // Laid out as the parameter is in its slot (channels-last, say), so the piece's range of
      // the slot is the same range of the state, whatever layout the state came in.
      const Tensor& param = param_slots_[piece.param_index]->param;
      const Tensor memory = empty({param.numel()}, it->second.dtype(), it->second.device());
      copy_(memory.as_strided(param.shape(), param.strides(), 0), it->second);
      out[state_key(i, name)] = memory.slice(0, piece.begin - piece.slot_offset, piece.end - piece.slot_offset);
    }
  }
  return out;
}

int64_t Zero1::shard_elements(size_t buffer) const {
  int64_t n = 0;
  for (const ShardPiece& piece : pieces_)
    if (piece.buffer == buffer) n += piece.end - piece.begin;
  return n;
}

int64_t Zero1::total_elements(size_t buffer) const {
  int64_t n = 0;
  for (size_t s = 0; s < flat_->buffers()[buffer].slots.size(); ++s)
    if (slot_param_index_[buffer][s] >= 0) n += flat_->buffers()[buffer].slots[s].numel;
  return n;
}

int64_t Zero1::owned_elements(size_t buffer) const {
  int64_t n = 0;
  for (const Chunk& chunk : chunks_)
    if (chunk.buffer == buffer) n += chunk.end - chunk.begin;
  return n;
}

}  // namespace precis::distributed
