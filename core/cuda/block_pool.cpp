#include "core/cuda/block_pool.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

namespace precis::cuda {

size_t round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t segment_size_for(size_t block_size) {
  if (block_size <= kSmallSize) return kSmallSegment;
  if (block_size < kMinLargeAlloc) return kLargeSegment;
  return (block_size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

std::string format_bytes(size_t nbytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (nbytes < 1024) return std::to_string(nbytes) + " B";
  double value = static_cast<double>(nbytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  return text;
}

bool BlockPool::BySizeOrder::operator()(const Block* a, const Block* b) const {
  if (a->graph != b->graph) return a->graph < b->graph;
  if (a->stream != b->stream) return std::less<StreamId>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<const char*>()(a->ptr, b->ptr);
}

BlockPool::BlockPool(SystemAlloc system_alloc, SystemFree system_free)
    : system_alloc_(std::move(system_alloc)), system_free_(std::move(system_free)) {}

BlockPool::~BlockPool() {
  for (Block* head : segments_) {
    for (Block* block = head; block != nullptr;) {
      Block* next = block->next;
      delete block;
      block = next;
    }
  }
}

Block* BlockPool::take_free(bool small, size_t size, StreamId stream, uint64_t graph) {
  FreeList& list = small ? small_free_ : large_free_;
  Block key;
  key.size = size;
  key.stream = stream;
  key.graph = graph;
  auto it = list.lower_bound(&key);
  if (it == list.end() || (*it)->graph != graph || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  list.erase(it);
  block->cached = false;
  if (graph != 0) stats_.graph_pool_bytes -= block->size;
  return block;
}

Block* BlockPool::new_segment(size_t size, StreamId stream, bool small, bool may_release) {
  size_t segment = segment_size_for(size);
  void* ptr = system_alloc_(segment);
  if (ptr == nullptr) {
    // Out of memory: give back what the cache holds unused, and try once more.
    if (!may_release || release_cached() == 0) return nullptr;
    ptr = system_alloc_(segment);
    if (ptr == nullptr) return nullptr;
  }
  stats_.reserved_bytes += segment;
  ++stats_.num_system_allocs;
  auto* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = segment;
  block->stream = stream;
  block->small = small;
  segments_.push_back(block);
  return block;
}

Block* BlockPool::allocate(size_t nbytes, StreamId stream, uint64_t graph, bool may_grow, bool may_release,
                           bool unused_by_graph) {
  if (nbytes > kMaxRequest) return nullptr;
  size_t size = round_size(nbytes);
  bool small = size <= kSmallSize;
  Block* block = graph != 0 && !unused_by_graph ? take_free(small, size, stream, graph) : nullptr;
  if (block == nullptr) block = take_free(small, size, stream, 0);
  if (block == nullptr && may_grow) block = new_segment(size, stream, small, may_release);
  if (block == nullptr) return nullptr;

  size_t remaining = block->size - size;
  if (small ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    // The remainder stays in the pool the block came from: a capture takes only what it uses.
    auto* rest = new Block;
    rest->ptr = block->ptr + size;
    rest->size = remaining;
    rest->stream = stream;
    rest->graph = block->graph;
    rest->small = small;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_free(rest);
  }
  block->graph = graph;
  block->allocated = true;
  allocated_[block->ptr] = block;
  stats_.allocated_bytes += block->size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.allocated_bytes + stats_.graph_pool_bytes);
  ++stats_.num_allocs;
  return block;
}

void BlockPool::free(Block* block) {
  allocated_.erase(block->ptr);
  block->allocated = false;
  stats_.allocated_bytes -= block->size;
  if (block->pending_events == 0) insert_free(block);
}

void BlockPool::event_done(Block* block) {
  if (--block->pending_events == 0 && !block->allocated) insert_free(block);
}

void BlockPool::insert_free(Block* block) {
  block->stream_uses.clear();
  // A graph's free neighbours, merged below, are counted already: only this block's bytes join.
  if (block->graph != 0) stats_.graph_pool_bytes += block->size;
  auto mergeable = [&](const Block* other) {
    return other != nullptr && other->cached && other->graph == block->graph;
  };
  if (mergeable(block->prev)) {
    Block* prev = block->prev;
    free_list(prev).erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (mergeable(block->next)) {
    Block* next = block->next;
    free_list(next).erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  block->cached = true;
  free_list(block).insert(block);
}

Block* BlockPool::find(const void* ptr) const {
  auto it = allocated_.upper_bound(static_cast<const char*>(ptr));
  if (it == allocated_.begin()) return nullptr;
  Block* block = std::prev(it)->second;
  return static_cast<const char*>(ptr) < block->ptr + block->size ? block : nullptr;
}

size_t BlockPool::release_cached() {
  size_t released = 0;
  auto keep = std::remove_if(segments_.begin(), segments_.end(), [&](Block* head) {
    if (head->next != nullptr || !head->cached || head->graph != 0) return false;
    free_list(head).erase(head);
    system_free_(head->ptr, head->size);
    stats_.reserved_bytes -= head->size;
    ++stats_.num_system_frees;
    released += head->size;
    delete head;
    return true;
  });
  segments_.erase(keep, segments_.end());
  return released;
}

void BlockPool::release_graph(uint64_t graph) {
  if (graph == 0) return;
  std::vector<Block*> freed;
  for (Block* head : segments_) {
    for (Block* block = head; block != nullptr; block = block->next) {
      if (block->graph != graph) continue;
      if (block->cached) {
        free_list(block).erase(block);
        block->cached = false;
        stats_.graph_pool_bytes -= block->size;
        freed.push_back(block);
      }
      block->graph = 0;
    }
  }
  // Re-listing merges each with its general-pool neighbours. A block is only ever
  // merged into one listed before it, so the ones still to come stay valid.
  for (Block* block : freed) insert_free(block);
}

}  // namespace precis::cuda
