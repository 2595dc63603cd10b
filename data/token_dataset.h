// TokenDataset: batches of next-token-prediction windows from llm.c token
// shards, memory-mapped.
//
// Each batch row is one window of T+1 tokens (see data/window_order.h):
// inputs = its first T tokens, targets = its last T (inputs shifted by one).
// The windows form one stream, epoch after epoch; a batch takes the next B
// (under data parallelism, rank r takes rows r*B..r*B+B-1 of every B*world_size).
// A background thread keeps up to `prefetch_depth` batches ready.
//
// position() says where the next batch starts; saved with a checkpoint and
// given to restore(), the dataset continues with exactly the batches it would
// have produced. The position counts windows, not batches, so a run may resume
// with another batch size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/tensor.h"
#include "data/prefetch_queue.h"
#include "data/token_file.h"
#include "data/window_order.h"

namespace precis {

struct TokenDatasetOptions {
  int64_t batch_size = 1;  // B, rows per rank
  int64_t seq_len = 1;     // T
  bool shuffle = false;    // false: file and token order; true: seeded random order per epoch
  uint64_t seed = 0;
  bool prefetch = true;
  int64_t prefetch_depth = 2;
  int64_t rank = 0;
  int64_t world_size = 1;
  // When > 0, every token of every shard must be below it: checked once when the shards are
  // opened (check_token_ids), so a shard of another tokenizer fails there, naming file and offset.
  int64_t vocab_size = 0;
};

struct TokenBatch {
  Tensor inputs;   // int32 [B, T] on the CPU, contiguous
  Tensor targets;  // int32 [B, T] on the CPU: targets[b][t] = inputs[b][t + 1] within the window
};

struct TokenDatasetPosition {
  WindowCursor cursor;
  // What the cursor means; restore() checks them against the dataset.
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t seq_len = 0;
  int64_t num_windows = 0;

  // {"epoch", "shard", "window", "shuffle", "seed", "seq_len", "num_windows"}; the seed is
  // stored as its int64 bit pattern so that every uint64 round-trips exactly.
  Json to_json() const;
  static TokenDatasetPosition from_json(const Json& json);
  friend bool operator==(const TokenDatasetPosition&, const TokenDatasetPosition&) = default;
};

class TokenDataset {
 public:
  // `files`: token shards (find_token_files expands a glob into them).
  TokenDataset(const std::vector<std::string>& files, const TokenDatasetOptions& options);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  TokenBatch next_batch();
  TokenDatasetPosition position() const;
  void restore(const TokenDatasetPosition& position);

  int64_t num_windows() const { return num_windows_; }
  int64_t num_tokens() const { return num_tokens_; }
  // Batches of B*world_size windows in one epoch (the last may run into the next epoch).
  double batches_per_epoch() const;
  const TokenDatasetOptions& options() const { return options_; }

 private:
  TokenBatch make_batch(WindowCursor& cursor);

  TokenDatasetOptions options_;
  std::vector<TokenFileView> shards_;
  std::vector<int64_t> windows_per_shard_;
  WindowOrder order_;  // used by one thread at a time: the prefetcher while it runs
  int64_t num_windows_ = 0;
  int64_t num_tokens_ = 0;
  WindowCursor next_;  // where the next batch returned by next_batch() starts
  std::unique_ptr<PrefetchQueue<TokenBatch, WindowCursor>> prefetch_;  // with options_.prefetch
};

}  // namespace precis
