#include "ops/autocast.h"

#include <mutex>
#include <unordered_map>

#include "core/autograd.h"

namespace precis::ops::autocast {

namespace {
thread_local bool t_enabled = false;
thread_local DType t_compute = DType::f32;

struct CacheEntry {
  std::weak_ptr<TensorImpl> source;  // so a freed and reused address is not mistaken for it
  Tensor cast;
};
std::mutex g_cache_mutex;
std::unordered_map<TensorImpl*, CacheEntry> g_cache;

bool is_low_precision(DType d) { return d == DType::f16 || d == DType::bf16; }
}  // namespace

bool enabled() { return t_enabled; }
DType compute_dtype() { return t_compute; }

Scope::Scope(DType compute_dtype, bool on) : previous_enabled_(t_enabled), previous_dtype_(t_compute) {
  t_enabled = on;
  t_compute = compute_dtype;
}

Scope::~Scope() {
  t_enabled = previous_enabled_;
  t_compute = previous_dtype_;
}

Tensor to_compute(const Tensor& t) {
  if (!t_enabled || !t.defined() || !is_floating(t.dtype()) || t.dtype() == t_compute) return t;
  bool cacheable = t.is_leaf() && t.requires_grad() && grad_mode_enabled();
  if (!cacheable) return t.to(t_compute);
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  auto it = g_cache.find(t.impl());
  if (it != g_cache.end() && it->second.source.lock() == t.impl_ptr() && it->second.cast.dtype() == t_compute)
    return it->second.cast;
  Tensor cast;
  {
    NoGradGuard no_grad;  // a plain cast; its node is a pass-through (see precache)
    cast = t.to(t_compute);
  }
  autograd::record_pass_through("to", t, cast);
  g_cache[t.impl()] = {t.impl_ptr(), cast};
  return cast;
}

void precache(const Tensor& buffer, const std::vector<Tensor>& leaves, DType dtype, const Tensor& cast) {
  PRECIS_CHECK(buffer.dim() == 1 && buffer.is_contiguous() && is_floating(buffer.dtype()) && is_floating(dtype),
               "autocast::precache: expected a dense 1-D floating buffer and a floating dtype, got ", describe(buffer),
               " and ", dtype_name(dtype));
  if (buffer.dtype() == dtype || leaves.empty()) return;
  PRECIS_CHECK(!cast.defined() || (cast.dim() == 1 && cast.is_contiguous() && cast.numel() == buffer.numel() &&
                                   cast.dtype() == dtype && cast.device() == buffer.device()),
               "autocast::precache: the cast given, ", describe(cast), ", must be a dense 1-D ", dtype_name(dtype),
               " tensor as long as the buffer ", describe(buffer));
  Tensor whole = cast;
  if (!whole.defined()) {
    NoGradGuard no_grad;  // one plain cast of the buffer; each leaf's view gets its own node below
    whole = buffer.to(dtype);
  }
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  for (const Tensor& leaf : leaves) {
    // Dense in any order of its dims (a channels-last weight too): its cast is the same
    // elements of the cast buffer, read with its strides.
    PRECIS_CHECK(leaf.is_leaf() && leaf.requires_grad() && is_non_overlapping_and_dense(leaf) &&
                     leaf.storage() == buffer.storage() && leaf.dtype() == buffer.dtype(),
                 "autocast::precache: every leaf must be a dense view of the buffer that requires grad, got ",
                 describe(leaf));
    Tensor cast = whole.as_strided(leaf.shape(), leaf.strides(), leaf.offset() - buffer.offset());
    // As leaf.to(dtype)'s node (ops/tensor_methods.cpp), the gradient reaches the leaf as it is;
    // a pass-through, so a product may write the weight's gradient into its .grad itself.
    autograd::record_pass_through("to", leaf, cast);
    g_cache[leaf.impl()] = {leaf.impl_ptr(), cast};
  }
}

Tensor to_fp32(const Tensor& t) {
  if (!t.defined() || fp32_dtype(t.dtype()) == t.dtype()) return t;
  return t.to(DType::f32);
}

DType fp32_dtype(DType dtype) { return t_enabled && is_low_precision(dtype) ? DType::f32 : dtype; }

std::optional<DType> linear_input_dtype() { return t_enabled ? std::optional<DType>(t_compute) : std::nullopt; }

void clear_cache() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache.clear();
}

size_t cache_size() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  return g_cache.size();
}

}  // namespace precis::ops::autocast
