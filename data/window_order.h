// WindowOrder: the order in which a token dataset visits its windows, epoch
// after epoch. A window is T+1 consecutive tokens of one shard, starting at a
// multiple of T, so window w of a shard holds tokens [w*T, w*T + T] and no
// window crosses a shard boundary.
//
// Sequential: shards in file order, windows in token order (llm.c's loader
// without shuffling). Shuffled: as llm.c, the shards are permuted per epoch and
// the windows of each shard are permuted per (epoch, shard): random order with
// one shard's pages in use at a time. The permutations are Philox Fisher-Yates
// shuffles of (seed, epoch, shard), so the same seed gives the same order on
// every machine and a position alone says where the stream continues.
#pragma once

#include <cstdint>
#include <vector>

namespace precis {

// A place in the stream of windows: the `shard`-th shard of this epoch's shard
// order and the `window`-th window of that shard's window order.
struct WindowCursor {
  int64_t epoch = 0;
  int64_t shard = 0;
  int64_t window = 0;
  friend bool operator==(const WindowCursor&, const WindowCursor&) = default;
};

struct WindowRef {
  int64_t shard;   // index of the shard file
  int64_t window;  // window index within it
};

class WindowOrder {
 public:
  WindowOrder(std::vector<int64_t> windows_per_shard, bool shuffle, uint64_t seed);

  // The window at `cursor`; moves the cursor to the next window (in the next shard or epoch
  // when this one is done).
  WindowRef take(WindowCursor& cursor);

 private:
  void skip_finished_shards(WindowCursor& cursor);
  int64_t shard_in_order(int64_t epoch, int64_t k);
  int64_t window_in_order(int64_t epoch, int64_t shard, int64_t k);

  std::vector<int64_t> windows_per_shard_;
  bool shuffle_;
  uint64_t seed_;
  // The permutations in use, kept until the cursor moves to another epoch or shard.
  int64_t shard_order_epoch_ = -1;
  std::vector<int64_t> shard_order_;
  int64_t window_order_epoch_ = -1, window_order_shard_ = -1;
  std::vector<int64_t> window_order_;
};

// A permutation of 0..n-1 drawn from (seed, stream) by a Fisher-Yates shuffle on Philox numbers.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream);

}  // namespace precis
