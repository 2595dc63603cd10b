#include "core/autograd.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/copy.h"

#if PRECIS_WITH_CUDA
#include "core/cuda/side_stream.h"
#endif

namespace precis {

namespace {
thread_local bool g_grad_mode = true;
std::atomic<uint64_t> g_next_sequence_nr{0};
}  // namespace

bool grad_mode_enabled() { return g_grad_mode; }
void set_grad_mode(bool enabled) { g_grad_mode = enabled; }

Node::Node(std::string name, uint32_t num_outputs)
    : name_(std::move(name)), num_outputs_(num_outputs), sequence_nr_(g_next_sequence_nr++) {}

namespace {

// Sums gradients into a leaf's .grad, then fires its grad-ready hooks. Holds the
// leaf weakly: a parameter that is gone needs no gradient. The incoming gradient may
// be of another dtype (a cast's, ops/tensor_methods.cpp): .grad keeps the leaf's
// dtype, and the incoming values are converted as they are added. A .grad marked stale
// (FlatParameters::zero_grad_lazily) is overwritten instead: the same values as adding to
// zeros, without the zeros being written first and read back. Where producers wrote
// into .grad themselves (args.delivered), it adds only what was returned, and the hooks
// fire even if nothing was.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : Node("AccumulateGrad", 1), leaf_(leaf) {}

  std::vector<Tensor> apply(BackwardArgs&& args) override {
    auto leaf = leaf_.lock();
    const Tensor& incoming = args.grad(0);
    const bool delivered = !args.delivered.empty() && args.delivered[0];
    if (!leaf || (!incoming.defined() && !delivered)) return {};
    Tensor param(leaf);
    if (!incoming.defined()) {
      // Every gradient is in .grad already.
    } else if (leaf->grad && leaf->grad_is_stale) {
      copy_(Tensor(leaf->grad), incoming);
      leaf->grad_is_stale = false;
    } else if (leaf->grad) {
      accumulate_(Tensor(leaf->grad), incoming);
    } else {
      // A fresh, dense gradient owned by the leaf: the incoming one may be a view,
      // a broadcast, or another dtype. It takes the leaf's layout where the leaf is dense (a
      // channels-last weight gets a channels-last gradient), as PyTorch's does, so that the
      // optimizers may update the two as flat arrays.
      Tensor grad = empty_with_layout_of(param, param.dtype());
      copy_(grad, incoming);
      leaf->grad = grad.impl_ptr();
    }
    Tensor grad(leaf->grad);
    for (auto& hook : leaf->grad_ready_hooks) hook(grad);
    return {};
  }
  void release() override {}  // saves nothing; may run in every backward
  bool runs_at_once() const override { return true; }
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// record_pass_through's node: the gradient goes on as it came.
class PassThrough final : public Node {
 public:
  explicit PassThrough(const char* op) : Node(op, 1) {}
  std::vector<Tensor> apply(BackwardArgs&& args) override { return {args.grad(0)}; }
  bool passes_gradient_through() const override { return true; }
  void release() override {}  // saves nothing; may run in every backward
};

#if PRECIS_WITH_CUDA
// A node recorded inside a SideStreamScope that asked for it (Backward::on_side_stream: a ResNet
// block's shortcut, models/resnet.cpp): backward() runs it on that device's side stream.
// Otherwise a FunctionNode.
class SideStreamNode final : public Node {
 public:
  SideStreamNode(std::string name, uint32_t num_outputs, BackwardFn fn, bool saves_tensors, Device device)
      : Node(std::move(name), num_outputs), fn_(std::move(fn)), saves_tensors_(saves_tensors), device_(device) {}
  std::vector<Tensor> apply(BackwardArgs&& args) override { return fn_(args); }
  void release() override {
    if (!saves_tensors_) return;
    fn_ = nullptr;
    Node::release();
  }
  Device device() const { return device_; }

 private:
  BackwardFn fn_;
  bool saves_tensors_;
  Device device_;
};
#endif

Edge edge_to(const Tensor& t) {
  TensorImpl* impl = t.impl();
  if (!impl->requires_grad) return {};
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return {acc, 0};
}

}  // namespace

namespace autograd {

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_mode) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!g_grad_mode) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, BackwardFn backward,
            bool saves_tensors) {
  if (!any_requires_grad(inputs)) return;
  const auto num_outputs = static_cast<uint32_t>(outputs.size());
  std::shared_ptr<Node> node;
#if PRECIS_WITH_CUDA
  if (const int side = cuda::side_stream_backward_device(); side >= 0)
    node = std::make_shared<SideStreamNode>(op, num_outputs, std::move(backward), saves_tensors, Device::cuda(side));
#endif
  if (!node) node = std::make_shared<FunctionNode>(op, num_outputs, std::move(backward), saves_tensors);
  for (const Tensor& input : inputs) {
    node->next_edges().push_back(input.defined() ? edge_to(input) : Edge{});
    node->input_shapes().push_back(input.defined() ? input.shape() : Shape{});
  }
  const char* profile_op = nullptr;
  OpCost backward_cost;
  if (op_scope_label(&profile_op, &backward_cost)) node->set_profile(profile_op, backward_cost);
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* out = outputs[i].impl();
    out->requires_grad = true;
    out->grad_fn = node;
    out->output_nr = i;
  }
}

void record_pass_through(const char* op, const Tensor& input, const Tensor& output) {
  if (!any_requires_grad({&input})) return;
  PRECIS_CHECK(input.shape() == output.shape(), "autograd::record_pass_through (", op, "): the output ",
               describe(output), " must have the input's shape ", input.shape());
  auto node = std::make_shared<PassThrough>(op);
  node->next_edges().push_back(edge_to(input));
  node->input_shapes().push_back(input.shape());
  TensorImpl* out = output.impl();
  out->requires_grad = true;
  out->grad_fn = node;
  out->output_nr = 0;
}

// Where a gradient was written on the side stream: device -1 where it was not, or the compute
// stream has waited for it since.
#if PRECIS_WITH_CUDA
using SidePoint = cuda::SideStreamPoint;
#else
struct SidePoint {
  int device = -1;
  int slot = 0;
};
#endif
static bool on_side(const SidePoint& point) { return point.device >= 0; }

// The state of one backward pass: what each node still waits for, the gradients held for
// it, and which leaves' AccumulateGrad nodes were delivered gradient directly.
class GraphTask {
 public:
  // Edges, from the nodes reachable from the root, pointing at each node.
  std::unordered_map<Node*, int> dependencies;

  struct Pending {
    std::vector<Tensor> grads;           // one slot per output of the node
    std::vector<bool> delivered;         // per slot: written into the leaf's .grad by a producer
    std::vector<SidePoint> side_points;  // per slot: where it was written on the side stream
  };
  std::unordered_map<Node*, Pending> pending;

  // Inputs of the running node whose destinations it took.
  std::vector<bool> taken;

  // Leaves whose .grad a backward function writes on the side stream (core/autograd.h, top).
  std::unordered_set<const TensorImpl*> side_written;

  // Backward on the side stream (see backward()). Whether the running node runs there, and the
  // pending slots it writes (gathered gradients it adds to), whose point is marked after it. The
  // compute stream's tensors that side-stream work reads or writes (incoming gradients, gathered
  // gradients) and the side-stream nodes whose saved tensors wait to be freed (a convolution's
  // input is the compute stream's) are dropped at the next full join outside such a node (at the
  // latest, the end of backward()), so that the compute stream cannot reuse their blocks before
  // the side stream is done with them. A slot marked on the side stream holds a block of the side
  // stream's pool or one kept here.
  bool running_on_side = false;
  std::vector<std::pair<Node*, uint32_t>> written_on_side;
  std::vector<Tensor> read_on_side;
  std::vector<Node*> release_after_join;

  // Makes the compute streams wait for their side streams; every held gradient is then ready there.
  void join() {
#if PRECIS_WITH_CUDA
    cuda::join_side_streams();
#endif
    for (auto& entry : pending)
      std::fill(entry.second.side_points.begin(), entry.second.side_points.end(), SidePoint{});
    if (running_on_side) return;  // the running node's reads are queued after the join
    read_on_side.clear();
    for (Node* node : release_after_join) node->release();
    release_after_join.clear();
  }

  // Makes the compute stream wait for the side stream up to `point`, which is then cleared.
  static void wait_for(SidePoint& point) {
    if (!on_side(point)) return;
#if PRECIS_WITH_CUDA
    cuda::wait_for_side_stream(point);
#endif
    point = SidePoint{};
  }

  Pending& pending_of(Node* node) {
    Pending& p = pending[node];
    if (p.grads.empty()) {
      p.grads.resize(node->num_outputs());
      p.delivered.resize(node->num_outputs());
      p.side_points.resize(node->num_outputs());
    }
    return p;
  }

  // `grad_point`: where `grad` was written on the side stream (by a node run there), if it was.
  void add_grad(Node* node, uint32_t slot, const Tensor& grad, SidePoint grad_point = {}) {
    Pending& p = pending_of(node);
    Tensor& held = p.grads[slot];
    SidePoint& held_point = p.side_points[slot];
    if (!held.defined()) {
      held = grad;
      held_point = grad_point;
      return;
    }
    // Both written on the side stream: summed there. Else summed on the compute stream, once it
    // has waited for the side stream where either was written there.
#if PRECIS_WITH_CUDA
    std::optional<cuda::SideStreamScope> side_sum;
    if (on_side(held_point) && on_side(grad_point)) side_sum.emplace(grad.device());
#endif
    if (!on_side(held_point) || !on_side(grad_point)) {
      wait_for(held_point);
      wait_for(grad_point);
    }
    // The sum takes the wider dtype: a leaf's gradients can arrive in its own dtype and in a
    // cast's (ops/tensor_methods.cpp), and adding f32 into bf16 would lose bits.
    const DType sum_dtype = promote_types(held.dtype(), grad.dtype());
    // An exclusive held gradient takes the sum in place; any other is copied first. The sum keeps
    // the held gradient's layout (a channels-last one stays channels-last), so that it and the
    // gradient arriving in the same layout add as flat arrays.
    if (!exclusive(held) || held.dtype() != sum_dtype) {
      Tensor sum = empty_with_layout_of(held, sum_dtype);
      copy_(sum, held);
#if PRECIS_WITH_CUDA
      if (side_sum) read_on_side.push_back(held);  // it may be a block of the compute stream's
#endif
      held = sum;
    }
    accumulate_(held, grad);
#if PRECIS_WITH_CUDA
    if (side_sum) {
      side_sum.reset();
      held_point = cuda::mark_side_stream(grad.device());
    }
#endif
  }

  // A gradient nothing else refers to (a backward's fresh dense output, neither saved nor viewed
  // anywhere): it may take a sum in place, as PyTorch's input buffer does. Any other may alias a
  // node's data, or overlap itself (an expanded view).
  static bool exclusive(const Tensor& held) {
    return held.impl_ptr().use_count() == 1 && held.storage().use_count() == 1 && is_non_overlapping_and_dense(held);
  }

  // Whether t is laid out as `layout` (same strides wherever a dim has more than one element),
  // or contiguous where no layout is asked for.
  static bool laid_out_as(const Tensor& t, const Tensor& layout) {
    if (!layout.defined()) return t.is_contiguous();
    if (t.shape() != layout.shape()) return false;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (t.shape()[d] != 1 && t.strides()[d] != layout.strides()[d]) return false;
    return true;
  }

  // The AccumulateGrad node `edge` reaches, directly or through pass-through nodes; else null.
  static AccumulateGrad* accumulator_reached(const Edge& edge) {
    Node* target = edge.node.get();
    while (target && target->passes_gradient_through()) target = target->next_edges()[0].node.get();
    return dynamic_cast<AccumulateGrad*>(target);
  }

  // Where `node` runs (see backward()): on the side stream of the device returned, or on the
  // compute stream (none). A SideStreamNode runs there; so do an AccumulateGrad (of a leaf
  // without hooks) and a pass-through node whose gradient was written there. A node run on the
  // compute stream waits for the side stream first where a gradient it reads was written there;
  // one run on the side stream keeps the compute stream's gradients it reads to the next join.
  // A slot's point is cleared once waited for.
  std::optional<Device> stream_for(Node* node, const BackwardArgs& args, std::vector<SidePoint>& points) {
    std::optional<Device> side;
#if PRECIS_WITH_CUDA
    const bool any_on_side = std::any_of(points.begin(), points.end(), on_side);
    if (auto* side_node = dynamic_cast<SideStreamNode*>(node)) side = side_node->device();
    if (any_on_side && node->passes_gradient_through()) side = args.grads[0].device();
    if (auto* accumulate = dynamic_cast<AccumulateGrad*>(node); accumulate && any_on_side) {
      std::shared_ptr<TensorImpl> leaf = accumulate->leaf();
      if (leaf && leaf->grad_ready_hooks.empty()) {
        side = args.grads[0].device();
        side_written.insert(leaf.get());
      }
    }
#else
    (void)node;
#endif
    if (side) {
      for (size_t i = 0; i < args.grads.size(); ++i)
        if (args.grads[i].defined() && !on_side(points[i])) read_on_side.push_back(args.grads[i]);
    } else {
      for (SidePoint& point : points) wait_for(point);
    }
    return side;
  }

  // Makes the compute stream wait for the side stream where `leaf`'s .grad is written there
  // (nothing to wait for when the running node runs there too).
  void join_side_stream_for(const TensorImpl* leaf) {
    if (side_written.count(leaf) && !running_on_side) join();
  }

  // Before `node` runs: an AccumulateGrad that adds a returned gradient to a .grad written on the
  // side stream, or fires its hooks, waits for the side stream first.
  void join_side_stream_before(Node* node, const BackwardArgs& args) {
    auto* accumulate = dynamic_cast<AccumulateGrad*>(node);
    std::shared_ptr<TensorImpl> leaf = accumulate ? accumulate->leaf() : nullptr;
    if (leaf && (args.grads[0].defined() || !leaf->grad_ready_hooks.empty())) join_side_stream_for(leaf.get());
  }

  void mark_taken(Node* node, size_t input) {
    if (taken.size() < node->next_edges().size()) taken.resize(node->next_edges().size());
    taken[input] = true;
  }

  GradDestination take_destination(Node* node, size_t input, DType dtype, const Tensor& layout) {
    if (input >= node->next_edges().size() || (input < taken.size() && taken[input])) return {};
    const Edge& edge = node->next_edges()[input];
    const Shape& shape = node->input_shapes()[input];
    auto fits = [&](const Tensor& t) { return t.dtype() == dtype && t.shape() == shape && laid_out_as(t, layout); };
    GradDestination destination;
    AccumulateGrad* accumulate = accumulator_reached(edge);
    std::shared_ptr<TensorImpl> leaf = accumulate ? accumulate->leaf() : nullptr;
    if (leaf && leaf->grad && fits(Tensor(leaf->grad))) {
      // A leaf's .grad.
      join_side_stream_for(leaf.get());
      destination = {Tensor(leaf->grad), !leaf->grad_is_stale};
      leaf->grad_is_stale = false;
      pending_of(accumulate).delivered[0] = true;
      if (running_on_side) side_written.insert(leaf.get());
    } else if (auto it = pending.find(edge.node.get()); it != pending.end()) {
      // The gradient gathered so far for the input from its other uses, if nothing else holds it.
      const Tensor& held = it->second.grads[edge.input_nr];
      if (!held.defined() || !exclusive(held) || !fits(held)) return {};
      SidePoint& held_point = it->second.side_points[edge.input_nr];
      if (running_on_side) {
        if (!on_side(held_point)) read_on_side.push_back(held);
        written_on_side.emplace_back(edge.node.get(), edge.input_nr);
      } else {
        wait_for(held_point);
      }
      destination = {held, true};
    } else {
      return {};
    }
    mark_taken(node, input);
    return destination;
  }

  GradDestination take_destination_on_side_stream(Node* node, size_t input) {
    if (input >= node->next_edges().size() || (input < taken.size() && taken[input])) return {};
    AccumulateGrad* accumulate = accumulator_reached(node->next_edges()[input]);
    std::shared_ptr<TensorImpl> leaf = accumulate ? accumulate->leaf() : nullptr;
    if (!leaf || !leaf->grad) return {};
    const Tensor grad(leaf->grad);
    if (grad.shape() != node->input_shapes()[input] || !is_non_overlapping_and_dense(grad)) return {};
    GradDestination destination{grad, !leaf->grad_is_stale};
    leaf->grad_is_stale = false;
    pending_of(accumulate).delivered[0] = true;
    side_written.insert(leaf.get());
    mark_taken(node, input);
    return destination;
  }
};

namespace {

// Ends backward() with the compute streams joined to their side streams, also when it throws
// (a CUDA-graph capture must not end with the side stream unjoined).
struct JoinSideStreamsAtExit {
  bool done = false;
  void now() {
#if PRECIS_WITH_CUDA
    cuda::join_side_streams();
#endif
    done = true;
  }
  ~JoinSideStreamsAtExit() {
    if (done) return;
    try {
      now();
    } catch (...) {  // the error that is unwinding says more
    }
  }
};

}  // namespace

// Backward on the side stream. A node recorded inside a SideStreamScope with
// Backward::on_side_stream (a SideStreamNode: a ResNet shortcut's convolution and batch norm,
// models/resnet.cpp) runs inside a SideStreamScope of its own, forked, so that the side stream
// has what the compute stream wrote for it; nodes run in the usual order, so the kernels and
// bits are the usual ones. Where it writes a gradient there (one it returns, a gathered one it
// adds to) the slot keeps the side stream's point after it (cuda::mark_side_stream); a leaf's
// .grad it writes goes into side_written. A node run on the compute stream waits for a slot's
// point (cuda::wait_for_side_stream: only the side stream's work up to it, not the weight
// gradients queued there since) before it reads or adds to that gradient, and so does the sum of
// a marked gradient and an unmarked one; two marked ones are summed on the side stream. A
// pass-through node, and an AccumulateGrad of a leaf without hooks, whose gradient is marked run
// on the side stream too, so that a returned weight gradient does not wait at once. In a ResNet
// block the wait falls where the main branch's conv1 adds its gradient of the block input into
// the shortcut's.
void backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
  PRECIS_CHECK(root.requires_grad(), "backward: the tensor does not require grad and has no grad_fn; ",
               "did you compute it under NoGradGuard or from tensors without requires_grad?");
  Tensor seed = gradient;
  if (!seed.defined()) {
    PRECIS_CHECK(root.numel() == 1, "backward: gradient can be implied only for a scalar output; this one has shape ",
                 root.shape(), ", so pass a gradient of that shape");
    seed = ones(root.shape(), root.dtype(), root.device());
  }
  PRECIS_CHECK(seed.shape() == root.shape(), "backward: gradient shape ", seed.shape(), " does not match output shape ",
               root.shape());

  Edge root_edge = edge_to(root);
  NoGradGuard no_grad;  // backward formulas are not themselves recorded

  // Count, for each reachable node, the edges pointing at it.
  GraphTask task;
  auto& dependencies = task.dependencies;
  std::vector<Node*> stack{root_edge.node.get()};
  dependencies[root_edge.node.get()] = 0;
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges()) {
      if (!e.node) continue;
      auto [it, fresh] = dependencies.try_emplace(e.node.get(), 0);
      ++it->second;
      if (fresh) stack.push_back(e.node.get());
    }
  }
  task.add_grad(root_edge.node.get(), root_edge.input_nr, seed);

  // The queue's top: a node that runs at once, else the latest created.
  auto later_first = [](Node* a, Node* b) {
    if (a->runs_at_once() != b->runs_at_once()) return b->runs_at_once();
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  ready.push(root_edge.node.get());

  // Keep nodes alive while they run, even if the graph drops them.
  std::shared_ptr<Node> root_node = root_edge.node;
  JoinSideStreamsAtExit join_side_streams;
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    PRECIS_CHECK(!node->released(), "backward: trying to run ", node->name(),
                 "'s backward a second time, but its saved tensors were freed after the first; ",
                 "pass retain_graph=true to the first backward() if you need to call it twice");
    BackwardArgs args;
    GraphTask::Pending& held = task.pending_of(node);
    args.grads = std::move(held.grads);
    args.delivered = std::move(held.delivered);
    std::vector<SidePoint> grad_points = std::move(held.side_points);
    task.pending.erase(node);
    for (const Edge& e : node->next_edges()) args.needs_input_grad.push_back(e.node != nullptr);
    args.task = &task;
    args.node = node;
    task.taken.clear();
    const std::optional<Device> side = task.stream_for(node, args, grad_points);
    if (!side && !task.side_written.empty()) task.join_side_stream_before(node, args);
    std::vector<Tensor> input_grads;
    {
      OpScope timed(node->profile_op(), node->backward_cost());
      task.running_on_side = side.has_value();
#if PRECIS_WITH_CUDA
      std::optional<cuda::SideStreamScope> side_scope;
      if (side && !node->passes_gradient_through()) side_scope.emplace(*side);
#endif
      input_grads = node->apply(std::move(args));
      task.running_on_side = false;
    }
    // Where what it wrote on the side stream ends there.
    SidePoint written;
#if PRECIS_WITH_CUDA
    if (side && node->passes_gradient_through()) {
      written = grad_points[0];
    } else if (side && (!node->next_edges().empty() || !task.written_on_side.empty())) {
      written = cuda::mark_side_stream(*side);
    }
#endif
    for (const auto& [target, slot] : task.written_on_side) task.pending_of(target).side_points[slot] = written;
    task.written_on_side.clear();
    if (!retain_graph) {
      if (side) {
        task.release_after_join.push_back(node);  // its saved tensors may be the compute stream's
      } else {
        node->release();
      }
    }

    auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.node) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        PRECIS_CHECK(input_grads[i].shape() == node->input_shapes()[i], "backward of ", node->name(),
                     " returned a gradient of shape ", input_grads[i].shape(), " for input ", i, " of shape ",
                     node->input_shapes()[i], " (a bug in that op's backward)");
        PRECIS_CHECK(i >= task.taken.size() || !task.taken[i], "backward of ", node->name(), " both wrote input ", i,
                     "'s gradient into its .grad and returned it (a bug in that op's backward)");
        task.add_grad(e.node.get(), e.input_nr, input_grads[i], written);
      }
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
  task.join();
  join_side_streams.now();
}

}  // namespace autograd

GradDestination BackwardArgs::take_grad_destination(size_t input, DType dtype, const Tensor& layout) const {
  if (!task || !node || input >= needs_input_grad.size() || !needs_input_grad[input]) return {};
  return task->take_destination(node, input, dtype, layout);
}

GradDestination BackwardArgs::take_grad_destination_on_side_stream(size_t input) const {
  if (!task || !node || input >= needs_input_grad.size() || !needs_input_grad[input]) return {};
  return task->take_destination_on_side_stream(node, input);
}

}  // namespace precis
