#include "data/token_dataset.h"

#include <utility>

#include "core/error.h"

namespace precis {

Json TokenDatasetPosition::to_json() const {
  Json json;
  json["epoch"] = cursor.epoch;
  json["shard"] = cursor.shard;
  json["window"] = cursor.window;
  json["shuffle"] = shuffle;
  json["seed"] = static_cast<int64_t>(seed);
  json["seq_len"] = seq_len;
  json["num_windows"] = num_windows;
  return json;
}

TokenDatasetPosition TokenDatasetPosition::from_json(const Json& json) {
  for (const char* key : {"epoch", "shard", "window", "shuffle", "seed", "seq_len", "num_windows"})
    PRECIS_CHECK(json.is_object() && json.contains(key), "data position: the key \"", key, "\" is missing in ",
                 json.dump(), "; the checkpoint's data position is damaged");
  TokenDatasetPosition position;
  position.cursor = {json.at("epoch").as_int(), json.at("shard").as_int(), json.at("window").as_int()};
  position.shuffle = json.at("shuffle").as_bool();
  position.seed = static_cast<uint64_t>(json.at("seed").as_int());
  position.seq_len = json.at("seq_len").as_int();
  position.num_windows = json.at("num_windows").as_int();
  return position;
}

namespace {

const TokenDatasetOptions& checked(const TokenDatasetOptions& options) {
  PRECIS_CHECK(options.batch_size >= 1 && options.seq_len >= 1,
               "TokenDataset: batch_size and seq_len must be >= 1, got ", options.batch_size, " and ", options.seq_len);
  PRECIS_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size, "TokenDataset: rank ",
               options.rank, " is not in [0, world_size = ", options.world_size, ")");
  PRECIS_CHECK(options.prefetch_depth >= 1, "TokenDataset: prefetch_depth must be >= 1, got ", options.prefetch_depth,
               "; turn prefetching off with prefetch = false instead");
  return options;
}

std::vector<TokenFileView> open_shards(const std::vector<std::string>& files, int64_t vocab_size) {
  PRECIS_CHECK(!files.empty(), "TokenDataset: no token files given; make them with `precis tokenize`");
  std::vector<TokenFileView> shards;
  shards.reserve(files.size());
  for (const std::string& file : files) {
    shards.emplace_back(file);
    if (vocab_size > 0) check_token_ids(shards.back(), vocab_size);
  }
  return shards;
}

// A shard of n tokens holds floor((n - 1) / T) windows of T+1 tokens starting at multiples of T.
std::vector<int64_t> windows_per_shard(const std::vector<TokenFileView>& shards, int64_t seq_len) {
  std::vector<int64_t> windows;
  int64_t total = 0, tokens = 0;
  for (const TokenFileView& shard : shards) {
    windows.push_back(shard.size() > 0 ? (shard.size() - 1) / seq_len : 0);
    total += windows.back();
    tokens += shard.size();
  }
  PRECIS_CHECK(total > 0, "TokenDataset: the token files (", shards.front().path(), (shards.size() > 1 ? ", ..." : ""),
               ") hold ", tokens, " tokens in all, and no shard has the ", seq_len + 1,
               " tokens of one window of seq_len ", seq_len, " plus its target; use a smaller seq_len or more data");
  return windows;
}

}  // namespace

TokenDataset::TokenDataset(const std::vector<std::string>& files, const TokenDatasetOptions& options)
    : options_(checked(options)),
      shards_(open_shards(files, options_.vocab_size)),
      windows_per_shard_(windows_per_shard(shards_, options_.seq_len)),
      order_(windows_per_shard_, options_.shuffle, options_.seed) {
  for (int64_t windows : windows_per_shard_) num_windows_ += windows;
  for (const TokenFileView& shard : shards_) num_tokens_ += shard.size();
  if (options_.prefetch) {
    prefetch_ = std::make_unique<PrefetchQueue<TokenBatch, WindowCursor>>(
        [this](WindowCursor& cursor) { return make_batch(cursor); }, options_.prefetch_depth);
    prefetch_->start(next_);
  }
}

TokenDataset::~TokenDataset() = default;

double TokenDataset::batches_per_epoch() const {
  return static_cast<double>(num_windows_) / static_cast<double>(options_.batch_size * options_.world_size);
}

TokenBatch TokenDataset::make_batch(WindowCursor& cursor) {
  const int64_t B = options_.batch_size, T = options_.seq_len;
  TokenBatch batch{empty({B, T}, DType::i32), empty({B, T}, DType::i32)};
  int32_t* inputs = batch.inputs.data<int32_t>();
  int32_t* targets = batch.targets.data<int32_t>();
  // Every rank walks the whole global batch, so that all ranks' cursors stay equal.
  for (int64_t rank = 0; rank < options_.world_size; ++rank) {
    for (int64_t row = 0; row < B; ++row) {
      WindowRef ref = order_.take(cursor);
      if (rank != options_.rank) continue;
      const uint16_t* window = shards_[ref.shard].tokens() + ref.window * T;
      for (int64_t t = 0; t < T; ++t) {
        inputs[row * T + t] = window[t];
        targets[row * T + t] = window[t + 1];
      }
    }
  }
  return batch;
}

TokenBatch TokenDataset::next_batch() {
  if (!prefetch_) return make_batch(next_);
  auto [batch, after] = prefetch_->take();
  next_ = after;
  return std::move(batch);
}

TokenDatasetPosition TokenDataset::position() const {
  return {next_, options_.shuffle, options_.seed, options_.seq_len, num_windows_};
}

void TokenDataset::restore(const TokenDatasetPosition& position) {
  PRECIS_CHECK(position.seq_len == options_.seq_len && position.num_windows == num_windows_,
               "TokenDataset: the data position was saved for ", position.num_windows, " windows of seq_len ",
               position.seq_len, ", but this dataset has ", num_windows_, " windows of seq_len ", options_.seq_len,
               "; resume with the same token files and seq_len");
  PRECIS_CHECK(position.shuffle == options_.shuffle && (!position.shuffle || position.seed == options_.seed),
               "TokenDataset: the data position was saved for ", position.shuffle ? "shuffled" : "sequential",
               " order with seed ", position.seed, ", but this dataset uses ",
               options_.shuffle ? "shuffled" : "sequential", " order with seed ", options_.seed,
               "; resume with the same data order and seed");
  const WindowCursor& cursor = position.cursor;
  PRECIS_CHECK(cursor.epoch >= 0 && cursor.shard >= 0 && cursor.shard <= static_cast<int64_t>(shards_.size()) &&
                   cursor.window >= 0,
               "TokenDataset: the data position (epoch ", cursor.epoch, ", shard ", cursor.shard, ", window ",
               cursor.window, ") lies outside a dataset of ", shards_.size(), " shards; it is damaged");
  if (prefetch_) prefetch_->stop();
  next_ = position.cursor;
  if (prefetch_) prefetch_->start(next_);
}

}  // namespace precis
