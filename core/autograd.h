// Define-by-run autograd (docs/architecture.md, "Tensors and autograd").
//
// Each differentiable op calls autograd::record(...) with its inputs, outputs
// and a backward function. record() creates a Node holding that function (and,
// through its captures, the saved tensors) and edges to the nodes that produced
// the inputs. A leaf that requires grad gets an AccumulateGrad node, which sums
// the incoming gradient into .grad and then fires the leaf's grad-ready hooks.
//
// backward() counts, for every node reachable from the root, how many edges
// point at it, then runs nodes whose gradients are complete, latest-created
// first, except that nodes which compute nothing (AccumulateGrad, pass-throughs)
// run as soon as they are ready, whenever they were created (autocast makes a
// step's weight casts before its forward: by creation order they would wait for
// the whole backward). A node's inputs' gradients are final once every consumer
// has run, so each AccumulateGrad runs exactly once per backward, and its hooks
// fire at the moment that leaf's gradient is final (data parallelism starts a
// bucket's all-reduce there, distributed/reducer.h). Unless retain_graph is set, a node's
// backward function (with its saved tensors) is freed as soon as it has run.
//
// Gradients written where they belong. A backward function may write an input's
// gradient straight into the leaf's .grad (a view of the flat f32 gradient buffer,
// say: a product then writes its f32 weight gradient there itself, with no gradient
// tensor, cast or add in between) instead of returning it: take_grad_destination
// offers the .grad of the leaf the input's edge reaches, directly or through
// pass-through nodes (record_pass_through: autocast's weight casts). The engine marks
// that leaf's AccumulateGrad as delivered; it still runs once all its producers have,
// adds whatever gradients were returned the usual way (another use of a tied weight),
// and fires the hooks then, when the gradient is final. Each writer overwrites a .grad
// marked stale (zero_grad_lazily) and adds to any other, as AccumulateGrad would.
//
// Gradients written on the side stream. A backward function may also write a leaf's .grad on
// the device's side stream (core/cuda/side_stream.h; take_grad_destination_on_side_stream: a
// convolution's weight gradient, which nothing in the backward reads, so it runs beside the
// compute stream's kernels). The engine then makes the compute stream wait for the side stream
// (join_side_streams) before anything else touches that .grad: another writer taking it, its
// AccumulateGrad adding a returned gradient or firing hooks (a DDP all-reduce), and at the end of
// backward() in any case, so that what follows (clipping, the optimizer) reads finished gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/op_profile.h"
#include "core/tensor.h"

namespace precis {

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
  uint32_t input_nr = 0;       // which output of `node` the gradient belongs to
};

namespace autograd {
class GraphTask;
}

// A leaf's .grad that a backward function writes an input's gradient into itself.
struct GradDestination {
  Tensor grad;              // dense, of the input's shape; undefined where none is offered
  bool accumulate = false;  // add to what it holds; else write over it (it holds no gradient yet)
  explicit operator bool() const { return grad.defined(); }
};

struct BackwardArgs {
  std::vector<Tensor> grads;           // gradient of each output; undefined where none flowed (zero)
  std::vector<bool> needs_input_grad;  // per input: does anything want its gradient?
  std::vector<bool> delivered;         // per output: a producer wrote gradient into the leaf's .grad itself
  const Tensor& grad(size_t output = 0) const { return grads[output]; }
  bool needs(size_t input) const { return needs_input_grad[input]; }
  // Where input `input`'s gradient may be written directly, instead of returned and then summed
  // by the engine. Offered when it is of `dtype`, of the input's shape and laid out as `layout`
  // (contiguous where `layout` is undefined), and either
  //   - the .grad of a live leaf whose AccumulateGrad the input's edge reaches (through
  //     pass-through nodes only), or
  //   - the gradient the input has gathered so far from its other uses, when nothing else refers
  //     to it (accumulate is then true): a residual block's input, say, whose shortcut's
  //     gradient arrived first, takes the main branch's as the kernel writes it (cuDNN's beta).
  // Taking it is a promise: write the gradient there (added if `accumulate`, else written over;
  // on a GPU, queued on the device's compute stream) and return none for that input. Take it
  // just before writing: the first taker of a stale .grad overwrites it, later ones add.
  // Undefined: return the gradient.
  GradDestination take_grad_destination(size_t input, DType dtype, const Tensor& layout = Tensor()) const;
  // As take_grad_destination, for a gradient to be written on the device's side stream (see the
  // top): offered only where it is the .grad of a live leaf the input's edge reaches (through
  // pass-through nodes), of the input's shape, dense, in whatever dtype and layout it has (the
  // caller converts). Taking it is the same promise, kept on the side stream.
  GradDestination take_grad_destination_on_side_stream(size_t input) const;

  autograd::GraphTask* task = nullptr;  // set by the engine for the node it runs
  Node* node = nullptr;
};

// Returns one gradient per input (undefined where not needed), each of the input's shape.
using BackwardFn = std::function<std::vector<Tensor>(const BackwardArgs&)>;

class Node {
 public:
  Node(std::string name, uint32_t num_outputs);
  virtual ~Node() = default;

  const std::string& name() const { return name_; }
  uint32_t num_outputs() const { return num_outputs_; }
  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge>& next_edges() { return next_edges_; }
  // Shapes of the inputs, to check each gradient a backward function returns.
  std::vector<Shape>& input_shapes() { return input_shapes_; }

  virtual std::vector<Tensor> apply(BackwardArgs&& args) = 0;
  // Its one input's gradient is its one output's, unchanged (record_pass_through).
  virtual bool passes_gradient_through() const { return false; }
  // Runs as soon as its gradients are complete, before any node that computes (see the top).
  virtual bool runs_at_once() const { return passes_gradient_through(); }
  // Frees what the node saved for backward. Running it again afterwards is an error.
  virtual void release() { released_ = true; }
  bool released() const { return released_; }
  // The op whose backward this is and that backward's cost, for an op profile (core/op_profile.h):
  // the outermost op that recorded it; the node's name when recorded outside one.
  void set_profile(const char* op, const OpCost& backward_cost) { profile_op_ = op, backward_cost_ = backward_cost; }
  const char* profile_op() const { return profile_op_ ? profile_op_ : name_.c_str(); }
  const OpCost& backward_cost() const { return backward_cost_; }

 private:
  std::string name_;
  uint32_t num_outputs_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
  std::vector<Shape> input_shapes_;
  bool released_ = false;
  const char* profile_op_ = nullptr;
  OpCost backward_cost_;
};

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, uint32_t num_outputs, BackwardFn fn, bool saves_tensors)
      : Node(std::move(name), num_outputs), fn_(std::move(fn)), saves_tensors_(saves_tensors) {}
  std::vector<Tensor> apply(BackwardArgs&& args) override { return fn_(args); }
  // A node that saved nothing has nothing to free and may run in every backward
  // (autocast's cached weight casts are shared by the micro-batches of a step).
  void release() override {
    if (!saves_tensors_) return;
    fn_ = nullptr;
    Node::release();
  }

 private:
  BackwardFn fn_;
  bool saves_tensors_;
};

// Gradient mode: ops record nodes only while it is on (the default).
bool grad_mode_enabled();
void set_grad_mode(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

namespace autograd {

// True when grad mode is on and any of `inputs` requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// Records the op that made `outputs` from `inputs`, if any input requires grad:
// the outputs get requires_grad and a grad_fn running `backward`.
// `saves_tensors`: false when `backward` captured no tensors (see FunctionNode::release).
void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, BackwardFn backward,
            bool saves_tensors = true);

// Records `output` as `input` itself to autograd: a cast or view of the same shape whose
// gradient is the incoming one unchanged (autocast's weight casts, whose gradient reaches
// the f32 leaf in the compute dtype and is widened as it is added). A backward function
// may write through such a node into the leaf's .grad (BackwardArgs::take_grad_destination).
void record_pass_through(const char* op, const Tensor& input, const Tensor& output);

void backward(const Tensor& root, const Tensor& gradient, bool retain_graph);

}  // namespace autograd
}  // namespace precis
