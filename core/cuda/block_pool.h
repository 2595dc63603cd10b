// BlockPool: the bookkeeping of the CUDA caching allocator (core/cuda/allocator.cu),
// in plain C++ so that it runs, and is unit-tested, without a GPU. It never
// touches the memory it manages: it hands out addresses inside segments that a
// SystemAlloc function gave it (cudaMalloc on the GPU, a fake in the tests).
//
// The rules are PyTorch's CUDACachingAllocator:
//   - Every request is rounded up to a multiple of 512 bytes (round_size).
//   - Requests up to 1 MiB come from the small pool, which carves 2 MiB
//     segments; larger ones from the large pool, whose segments are 20 MiB for
//     requests under 10 MiB and the request rounded up to 2 MiB otherwise.
//   - A free block is found best-fit (the smallest that is large enough) among
//     the free blocks of the same stream; if it is larger than needed it is
//     split (small pool: when at least 512 bytes remain; large pool: when more
//     than 1 MiB remains, so that large segments are not shredded into small
//     pieces) and the remainder stays free.
//   - A freed block merges with the free blocks beside it in its segment, so a
//     segment whose blocks are all free is one block again and can be released.
//   - Blocks belong to the stream they were allocated for. A block freed on its
//     stream can be handed out again at once: any later work queued on that
//     stream runs after the work that used it. Use by other streams is the
//     caller's business (pending_events: the block is not reused until its
//     count drops to zero, see event_done).
//   - A block allocated while a CUDA graph is being captured belongs to that
//     capture's private pool (Block::graph): replaying the graph writes it, so
//     it must not be handed to code outside the graph until the graph is gone
//     (release_graph). Allocations during a capture may take free blocks of the
//     general pool, and may grow it with a new segment, but never release
//     segments (the caller passes may_release=false: cudaFree is not capturable).
//     A capture's blocks never return to the general pool before then, so a general
//     free block holds no byte the capture has used (unused_by_graph).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace precis::cuda {

inline constexpr size_t kMinBlockSize = 512;                // every block is a multiple of this
inline constexpr size_t kSmallSize = size_t(1) << 20;       // requests up to 1 MiB use the small pool
inline constexpr size_t kSmallSegment = size_t(2) << 20;    // the small pool's segments
inline constexpr size_t kLargeSegment = size_t(20) << 20;   // large-pool segment for requests under 10 MiB
inline constexpr size_t kMinLargeAlloc = size_t(10) << 20;  // from here on a request gets its own segment...
inline constexpr size_t kRoundLarge = size_t(2) << 20;      // ...rounded up to a multiple of 2 MiB
inline constexpr size_t kMaxRequest = size_t(1) << 60;      // larger requests fail without asking the system

// The block size serving a request of `nbytes`.
size_t round_size(size_t nbytes);
// The size of the segment to allocate from the system for a block of `block_size` bytes.
size_t segment_size_for(size_t block_size);
// "512 B", "1.50 KiB", "20.00 MiB", "1.00 PiB": for error messages.
std::string format_bytes(size_t nbytes);

// A stream, as the pool sees it: an opaque handle (a cudaStream_t on the GPU).
using StreamId = void*;

struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  StreamId stream = nullptr;          // the stream whose segment holds this block
  uint64_t graph = 0;                 // 0, or the id of the graph capture whose private pool holds it
  bool small = false;                 // small or large pool
  bool allocated = false;             // handed out and not yet freed
  bool cached = false;                // in a free list, ready to be handed out
  int pending_events = 0;             // uses on other streams not yet known to be complete
  std::vector<StreamId> stream_uses;  // other streams that use this block (record_stream)
  Block* prev = nullptr;              // neighbours within the segment
  Block* next = nullptr;
};

class BlockPool {
 public:
  // Returns a fresh segment of `nbytes`, or nullptr when the system is out of memory.
  using SystemAlloc = std::function<void*(size_t nbytes)>;
  using SystemFree = std::function<void(void* ptr, size_t nbytes)>;

  BlockPool(SystemAlloc system_alloc, SystemFree system_free);
  // Deletes the bookkeeping only; memory goes back to the system through release_cached().
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `nbytes` for `stream`, taken from `graph`'s private pool
  // (when graph != 0 and not unused_by_graph), else from the general free blocks,
  // else, when may_grow, from a new segment. If the system is out of memory and
  // may_release, every unused cached segment is released and the new segment is
  // tried once more. nullptr when none of that serves the request (and for
  // requests above kMaxRequest). With unused_by_graph the block holds no byte
  // that the capture `graph` has handed out before (its private pool is skipped):
  // no node captured so far touches it (core/cuda/graph_memsets.h).
  Block* allocate(size_t nbytes, StreamId stream, uint64_t graph, bool may_grow, bool may_release = true,
                  bool unused_by_graph = false);
  // Returns an allocated block: to the free lists now, or, while it has pending
  // events, once event_done has brought their count to zero.
  void free(Block* block);
  // One of the block's pending events completed.
  void event_done(Block* block);
  // The allocated block holding `ptr` (its start or any byte inside), or nullptr.
  Block* find(const void* ptr) const;
  // Gives every segment of the general pool that is wholly free back to the
  // system. Returns the bytes released.
  size_t release_cached();
  // The capture `graph` is gone: its blocks join the general pool.
  void release_graph(uint64_t graph);

  const AllocatorStats& stats() const { return stats_; }
  // The peak counts the blocks kept for captured graphs (stats().graph_pool_bytes) as live:
  // a replay writes them, so a step replayed from a graph needs them as an eager step needs
  // its activations.
  void reset_peak() { stats_.peak_bytes = stats_.allocated_bytes + stats_.graph_pool_bytes; }

 private:
  struct BySizeOrder {
    // Free blocks sort by (graph, stream, size, address): a lower_bound finds the best fit.
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeList = std::set<Block*, BySizeOrder>;

  FreeList& free_list(const Block* block) { return block->small ? small_free_ : large_free_; }
  Block* take_free(bool small, size_t size, StreamId stream, uint64_t graph);
  Block* new_segment(size_t size, StreamId stream, bool small, bool may_release);
  void insert_free(Block* block);  // merges with free neighbours of the same pool, then lists it

  SystemAlloc system_alloc_;
  SystemFree system_free_;
  FreeList small_free_, large_free_;
  std::map<const char*, Block*> allocated_;  // by start address
  std::vector<Block*> segments_;             // the first block of each segment
  AllocatorStats stats_;
};

}  // namespace precis::cuda
