// flatten_parameters' data_allocator (the memory ZeRO-1's all-gather fills in place on NCCL,
// ProcessGroup::registered_allocator) and empty_from beneath it, on the CPU with an allocator
// of the test's own: the parameter buffers come from it and the gradient buffers do not, the
// values move unchanged, the padding is zero whatever the memory held, a tensor keeps its
// allocator alive and frees through it, and memory on another device is an error.
#include <gtest/gtest.h>

#include <cstring>

#include "core/copy.h"
#include "nn/flat_parameters.h"
#include "nn/linear.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::expect_error;

namespace {

// The CPU allocator's memory, filled with 0xFF bytes (a NaN in every float dtype) when
// handed out, with the bytes it has live; it claims to be on `device`.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Device device = Device::cpu()) : device_(device) {}
  void* allocate(size_t nbytes) override {
    void* p = cpu_allocator().allocate(nbytes);
    std::memset(p, 0xFF, nbytes);
    live_ += nbytes;
    ++allocations_;
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    cpu_allocator().deallocate(ptr, nbytes);
    live_ -= nbytes;
  }
  Device device() const override { return device_; }
  AllocatorStats stats() const override { return {.allocated_bytes = live_, .num_allocs = allocations_}; }
  void reset_peak() override {}

 private:
  Device device_;
  size_t live_ = 0, allocations_ = 0;
};

// Two linear layers of 5x3 (+3) and 3x2 (+2) parameters: 26 in all, in one f32 buffer.
class TwoLayers : public nn::Module {
 public:
  TwoLayers() : nn::Module("TwoLayers") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(5, 3));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(3, 2));
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

}  // namespace

TEST(FlatParametersAllocator, ATensorKeepsItsAllocatorAliveAndFreesThroughIt) {
  auto allocator = std::make_shared<CountingAllocator>();
  std::weak_ptr<CountingAllocator> watch = allocator;
  Tensor t = empty_from(allocator, {4, 8}, DType::f64);
  EXPECT_EQ(t.shape(), (Shape{4, 8}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(allocator->stats().allocated_bytes, 4u * 8 * 8);
  allocator.reset();
  ASSERT_FALSE(watch.expired());  // the tensor's storage holds it
  EXPECT_EQ(watch.lock()->stats().allocated_bytes, 256u);
  t = Tensor();
  EXPECT_TRUE(watch.expired());  // freed through it, then gone with the last storage
}

TEST(FlatParametersAllocator, TheParameterBuffersComeFromItWithTheValuesAndZeroPadding) {
  TwoLayers model;
  std::vector<Tensor> before;
  for (const Tensor& p : model.parameters()) before.push_back(p.clone());
  auto allocator = std::make_shared<CountingAllocator>();
  // Slots at 64-byte (16-element) boundaries: fc1.weight 0..14, fc1.bias 16..18, fc2.weight
  // 32..37, fc2.bias 48..49; with 3 shards the end rounds up to a multiple of 3 x 16: 96.
  auto flat = nn::flatten_parameters(model, Device::cpu(), std::nullopt, 3, std::nullopt, allocator);
  ASSERT_EQ(flat->buffers().size(), 1u);
  const nn::FlatBuffer& buffer = flat->buffers()[0];
  EXPECT_EQ(buffer.data.numel(), 96);
  EXPECT_EQ(allocator->stats().allocated_bytes, 96u * 4);  // the data buffer, not the gradients
  EXPECT_EQ(allocator->stats().num_allocs, 1u);
  const std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].storage(), buffer.data.storage()) << i;
    EXPECT_EQ(params[i].to_vector<double>(), before[i].to_vector<double>()) << i;
  }
  // Every element that belongs to no parameter (the slots' 64-byte gaps and the end) is zero.
  std::vector<bool> in_slot(96, false);
  for (const nn::FlatSlot& slot : buffer.slots)
    for (int64_t e = slot.offset; e < slot.offset + slot.numel; ++e) in_slot[e] = true;
  const std::vector<double> values = buffer.data.to_vector<double>();
  for (int64_t e = 0; e < 96; ++e) {
    if (!in_slot[e]) {
      EXPECT_EQ(values[e], 0.0) << "element " << e;
    }
  }
  flat.reset();
}

TEST(FlatParametersAllocator, MemoryOnAnotherDeviceIsAnError) {
  TwoLayers model;
  auto elsewhere = std::make_shared<CountingAllocator>(Device::cuda(0));
  expect_error([&] { nn::flatten_parameters(model, Device::cpu(), std::nullopt, 1, std::nullopt, elsewhere); },
               "the data allocator gives memory on cuda:0, not on cpu");
}
