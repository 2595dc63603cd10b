#include "core/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>

#include "core/copy.h"

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
// zeros, without the zeros being written first and read back.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : Node("AccumulateGrad", 1), leaf_(leaf) {}

  std::vector<Tensor> apply(BackwardArgs&& args) override {
    auto leaf = leaf_.lock();
    const Tensor& incoming = args.grad(0);
    if (!leaf || !incoming.defined()) return {};
    Tensor param(leaf);
    if (leaf->grad && leaf->grad_is_stale) {
      copy_(Tensor(leaf->grad), incoming);
      leaf->grad_is_stale = false;
    } else if (leaf->grad) {
      accumulate_(Tensor(leaf->grad), incoming);
    } else {
      // A fresh, dense gradient owned by the leaf: the incoming one may be a view,
      // a broadcast, or another dtype.
      Tensor grad = empty(param.shape(), param.dtype(), param.device());
      copy_(grad, incoming);
      leaf->grad = grad.impl_ptr();
    }
    Tensor grad(leaf->grad);
    for (auto& hook : leaf->grad_ready_hooks) hook(grad);
    return {};
  }
  void release() override {}  // saves nothing; may run in every backward

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

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

void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn backward, bool saves_tensors) {
  if (!any_requires_grad(inputs)) return;
  auto node =
      std::make_shared<FunctionNode>(op, static_cast<uint32_t>(outputs.size()), std::move(backward), saves_tensors);
  for (const Tensor& input : inputs) {
    node->next_edges().push_back(input.defined() ? edge_to(input) : Edge{});
    node->input_shapes().push_back(input.defined() ? input.shape() : Shape{});
  }
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* out = outputs[i].impl();
    out->requires_grad = true;
    out->grad_fn = node;
    out->output_nr = i;
  }
}

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
  std::unordered_map<Node*, int> dependencies;
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

  // Gradients waiting for each node, one slot per output of the node.
  std::unordered_map<Node*, std::vector<Tensor>> pending;
  auto add_grad = [&](Node* node, uint32_t slot, const Tensor& grad) {
    auto& slots = pending[node];
    if (slots.empty()) slots.resize(node->num_outputs());
    Tensor& held = slots[slot];
    if (!held.defined()) {
      held = grad;
      return;
    }
    // The sum takes the wider dtype: a leaf's gradients can arrive in its own dtype and in a
    // cast's (ops/tensor_methods.cpp), and adding f32 into bf16 would lose bits.
    const DType sum_dtype = promote_types(held.dtype(), grad.dtype());
    // A held gradient that nothing else refers to (a backward's fresh dense output, neither
    // saved nor viewed anywhere) takes the sum in place, as PyTorch's input buffer does. Any
    // other may alias a node's data, or overlap itself (an expanded view): it is copied first.
    const bool exclusive = held.impl_ptr().use_count() == 1 && held.storage().use_count() == 1 &&
                           held.is_contiguous() && held.dtype() == sum_dtype;
    if (!exclusive) {
      Tensor sum = empty(held.shape(), sum_dtype, held.device());
      copy_(sum, held);
      held = sum;
    }
    accumulate_(held, grad);
  };
  add_grad(root_edge.node.get(), root_edge.input_nr, seed);

  auto later_first = [](Node* a, Node* b) { return a->sequence_nr() < b->sequence_nr(); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  ready.push(root_edge.node.get());

  // Keep nodes alive while they run, even if the graph drops them.
  std::shared_ptr<Node> root_node = root_edge.node;
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    PRECIS_CHECK(!node->released(), "backward: trying to run ", node->name(),
                 "'s backward a second time, but its saved tensors were freed after the first; ",
                 "pass retain_graph=true to the first backward() if you need to call it twice");
    BackwardArgs args;
    args.grads = std::move(pending[node]);
    args.grads.resize(node->num_outputs());
    pending.erase(node);
    for (const Edge& e : node->next_edges()) args.needs_input_grad.push_back(e.node != nullptr);
    std::vector<Tensor> input_grads = node->apply(std::move(args));
    if (!retain_graph) node->release();

    auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.node) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        PRECIS_CHECK(input_grads[i].shape() == node->input_shapes()[i], "backward of ", node->name(),
                     " returned a gradient of shape ", input_grads[i].shape(), " for input ", i, " of shape ",
                     node->input_shapes()[i], " (a bug in that op's backward)");
        add_grad(e.node.get(), e.input_nr, input_grads[i]);
      }
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
}

}  // namespace autograd
}  // namespace precis
