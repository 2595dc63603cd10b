// The CPU allocator keeps freed memory for the next allocation (core/allocator.cpp): blocks
// freed and allocated again, as a training step's activations are, fault no pages back in.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <vector>

#include "core/allocator.h"

using namespace precis;

namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

}  // namespace

// A step's worth of blocks (24 of 1 MiB), written and freed six times over: glibc by itself
// unmaps or trims them after each round (its thresholds follow the largest freed block), so
// every round faults most of their 6144 pages in again; kept, the heap settles after a round
// or two (aligned allocations leave some slack at first) and then faults (almost) none.
TEST(CpuAllocator, AStepsBlocksFreedAndAllocatedAgainFaultNoPages) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "the setting is glibc's (mallopt)";
#endif
  CpuAllocator& allocator = cpu_allocator();
  constexpr size_t kBlock = 1 << 20, kBlocks = 24, kPages = kBlocks * kBlock / 4096;
  constexpr int kRounds = 6, kSettled = 3;
  long settled_faults = 0;
  for (int round = 0; round < kRounds; ++round) {
    const long before = minor_faults();
    std::vector<void*> blocks;
    for (size_t i = 0; i < kBlocks; ++i) {
      blocks.push_back(allocator.allocate(kBlock));
      std::memset(blocks.back(), round, kBlock);
    }
    for (void* block : blocks) allocator.deallocate(block, kBlock);
    if (round >= kRounds - kSettled) settled_faults += minor_faults() - before;
  }
  EXPECT_LT(settled_faults, static_cast<long>(kSettled * kPages / 10));
}
