#include "data/window_order.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/philox.h"

namespace precis {

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    Philox4 r = philox4x32(static_cast<uint64_t>(i), stream, seed);
    uint64_t bits = (static_cast<uint64_t>(r.x[1]) << 32) | r.x[0];
    // The modulo bias is below (i+1)/2^64: nothing for any real number of windows.
    std::swap(order[i], order[bits % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

namespace {

// Philox streams: one for each epoch's shard order, one for each (epoch, shard) window order.
uint64_t shard_order_stream(int64_t epoch) { return static_cast<uint64_t>(epoch) << 32; }
uint64_t window_order_stream(int64_t epoch, int64_t shard) {
  return (static_cast<uint64_t>(epoch) << 32) | static_cast<uint64_t>(shard + 1);
}

}  // namespace

WindowOrder::WindowOrder(std::vector<int64_t> windows_per_shard, bool shuffle, uint64_t seed)
    : windows_per_shard_(std::move(windows_per_shard)), shuffle_(shuffle), seed_(seed) {
  int64_t total = std::accumulate(windows_per_shard_.begin(), windows_per_shard_.end(), int64_t{0});
  PRECIS_CHECK(total > 0, "WindowOrder: the shards hold no window at all");
}

int64_t WindowOrder::shard_in_order(int64_t epoch, int64_t k) {
  if (!shuffle_) return k;
  if (shard_order_epoch_ != epoch) {
    shard_order_ =
        seeded_permutation(static_cast<int64_t>(windows_per_shard_.size()), seed_, shard_order_stream(epoch));
    shard_order_epoch_ = epoch;
  }
  return shard_order_[k];
}

int64_t WindowOrder::window_in_order(int64_t epoch, int64_t shard, int64_t k) {
  if (!shuffle_) return k;
  if (window_order_epoch_ != epoch || window_order_shard_ != shard) {
    window_order_ = seeded_permutation(windows_per_shard_[shard], seed_, window_order_stream(epoch, shard));
    window_order_epoch_ = epoch;
    window_order_shard_ = shard;
  }
  return window_order_[k];
}

void WindowOrder::skip_finished_shards(WindowCursor& cursor) {
  const int64_t num_shards = static_cast<int64_t>(windows_per_shard_.size());
  // Ends because some shard has windows (checked in the constructor).
  while (cursor.shard == num_shards ||
         cursor.window >= windows_per_shard_[shard_in_order(cursor.epoch, cursor.shard)]) {
    cursor.window = 0;
    if (++cursor.shard >= num_shards) {
      cursor.shard = 0;
      ++cursor.epoch;
    }
  }
}

WindowRef WindowOrder::take(WindowCursor& cursor) {
  const int64_t num_shards = static_cast<int64_t>(windows_per_shard_.size());
  PRECIS_CHECK(cursor.epoch >= 0 && cursor.shard >= 0 && cursor.shard <= num_shards && cursor.window >= 0,
               "WindowOrder: invalid position (epoch ", cursor.epoch, ", shard ", cursor.shard, ", window ",
               cursor.window, ") for ", num_shards, " shards");
  skip_finished_shards(cursor);
  int64_t shard = shard_in_order(cursor.epoch, cursor.shard);
  WindowRef ref{shard, window_in_order(cursor.epoch, shard, cursor.window)};
  ++cursor.window;
  // So that the cursor's epoch is always the epoch of the next window.
  skip_finished_shards(cursor);
  return ref;
}

}  // namespace precis
