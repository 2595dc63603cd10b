#include "train/lm_task.h"

#include <filesystem>
#include <iostream>

#include "core/autograd.h"
#include "data/char_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenize.h"

namespace precis::train {

namespace fs = std::filesystem;

LmTask::LmTask(TrainConfig& config, int rank, int world_size, distributed::ProcessGroup* group) : config_(config) {
  setup_data(rank, world_size, group);
  PRECIS_CHECK(config.init_from.empty() || config.model.vocab_size == tokenizer_->vocab_size(),
               "model.init_from: the weights in '", config.init_from, "' have a vocabulary of ",
               config.model.vocab_size, " tokens but the data's tokenizer (", config.data.tokenizer, ") has ",
               tokenizer_->vocab_size(), "; fine-tune with the tokenizer the weights were trained with ",
               "(data.tokenizer: gpt2 for GPT-2)");
  config.model.vocab_size = tokenizer_->vocab_size();
  model_ = std::make_unique<models::GPT2>(config_.model, config_.seed);
  if (config_.batch.seq_len < config_.model.block_size && rank == 0)
    std::cerr << "note: seq_len " << config_.batch.seq_len << " < block_size " << config_.model.block_size
              << ": positions from " << config_.batch.seq_len << " on are never trained, so samples longer than "
              << config_.batch.seq_len << " tokens degrade; set block_size to seq_len for sampling\n";
}

void LmTask::setup_data(int rank, int world_size, distributed::ProcessGroup* group) {
  const DataConfig& d = config_.data;
  if (!d.text_file.empty()) {
    // Tokenise the text into shards under out_dir/data (fast: a char vocabulary
    // is immediate, GPT-2 BPE takes about a second for tinyshakespeare).
    fs::path dir = fs::path(config_.out_dir) / "data";
    fs::create_directories(dir);
    std::string prefix = (dir / (fs::path(d.text_file).stem().string() + "_" + d.tokenizer)).string();
    // One rank writes the shards, the others read them once it is done.
    if (rank == 0) tokenize_file(d.text_file, prefix, d.tokenizer, d.val_fraction, /*quiet=*/true);
    if (group) group->barrier();
    train_files_ = {prefix + "_train.bin"};
    val_files_ = {prefix + "_val.bin"};
    if (d.tokenizer == "char") {
      auto tok = std::make_unique<CharTokenizer>(CharTokenizer::load(prefix + "_vocab.json"));
      tokenizer_json_ = tok->to_json();
      tokenizer_ = std::move(tok);
    }
  } else {
    train_files_ = find_token_files(d.train_bin);
    if (!d.val_bin.empty()) val_files_ = find_token_files(d.val_bin);
  }
  if (!tokenizer_) {
    tokenizer_ = std::make_unique<GPT2Tokenizer>();
    tokenizer_json_ = Json::object();
    tokenizer_json_["tokenizer"] = "gpt2";
  }

  TokenDatasetOptions train_options;
  train_options.batch_size = config_.batch.micro_batch;
  train_options.seq_len = config_.batch.seq_len;
  train_options.shuffle = d.order == "random";
  train_options.seed = config_.seed;
  train_options.prefetch = d.prefetch;
  // Rank r takes rows r*B..r*B+B-1 of each global batch of B*world_size windows; the
  // dataset's position counts global windows, the same on every rank.
  train_options.rank = rank;
  train_options.world_size = world_size;
  train_options.vocab_size = tokenizer_->vocab_size();  // a shard's token ids are checked against it
  train_data_ = std::make_unique<TokenDataset>(train_files_, train_options);
  if (!val_files_.empty()) {
    TokenDatasetOptions val_options = train_options;
    val_options.shuffle = false;
    val_options.prefetch = false;  // rank and world_size as for training: each rank its own rows
    val_data_ = std::make_unique<TokenDataset>(val_files_, val_options);
    val_start_ = val_data_->position();
  }
}

TaskBatch LmTask::next_batch() {
  TokenBatch batch = train_data_->next_batch();
  return {batch.inputs, batch.targets};
}

TaskLoss LmTask::forward(const Tensor& inputs, const Tensor& targets, const Tensor& loss_gradient) {
  models::GPT2Output out = model_->forward(inputs, targets, loss_gradient);
  return {out.loss, out.classifier_output, out.classifier_grad};
}

EvalTotals LmTask::evaluate() {
  // The same batches every time, so the curve shows the model, not the sampling noise.
  val_data_->restore(val_start_);
  const Device device = model_->wte().device();
  EvalTotals totals;
  for (int64_t i = 0; i < config_.eval_steps; ++i) {
    TokenBatch batch = val_data_->next_batch();
    totals.loss_sum += model_->forward(batch.inputs.to(device), batch.targets.to(device)).loss.item();
    totals.loss_count += 1;
  }
  return totals;
}

std::string LmTask::sample(const std::string& prompt, int64_t tokens) {
  std::vector<int32_t> ids = tokenizer_->encode(prompt);
  if (ids.empty()) ids.push_back(tokenizer_->eot_token() >= 0 ? tokenizer_->eot_token() : 0);
  std::vector<int32_t> out =
      model_->generate(ids, tokens, config_.sample.temperature, config_.sample.top_k, config_.seed);
  return tokenizer_->decode(out);
}

void LmTask::finish() {
  if (config_.sample.tokens <= 0) return;
  std::cout << "---- sample (" << config_.sample.tokens << " tokens, temperature " << config_.sample.temperature
            << ", top_k " << config_.sample.top_k << ") ----\n"
            << sample(config_.sample.prompt, config_.sample.tokens) << "\n----\n";
}

Json LmTask::state() const {
  Json state = Json::object();
  state["data"] = train_data_->position().to_json();
  Json rng = Json::object();
  rng["dropout_seed"] = static_cast<int64_t>(model_->dropout_generator().seed());
  rng["dropout_offset"] = static_cast<int64_t>(model_->dropout_generator().offset());
  state["rng"] = rng;
  state["model"] = model_->config().to_json();
  state["tokenizer"] = tokenizer_json_;
  return state;
}

void LmTask::restore(const Json& state) {
  // The position is in global windows: a run resumed under another world size (or per-rank
  // batch) continues the same stream of windows, split over its own ranks from there on.
  train_data_->restore(TokenDatasetPosition::from_json(state.at("data")));
  const Json& rng = state.at("rng");
  model_->dropout_generator().manual_seed(static_cast<uint64_t>(rng.at("dropout_seed").as_int()));
  model_->dropout_generator().set_offset(static_cast<uint64_t>(rng.at("dropout_offset").as_int()));
}

std::string LmTask::describe() const {
  const auto& c = model_->config();
  return detail::concat("GPT-2 ", c.n_layer, " layers, ", c.n_head, " heads, ", c.n_embd, " wide, vocab ", c.vocab_size,
                        " (", model_->num_parameters_unpadded() / 1e6, "M parameters)");
}

std::string LmTask::data_description() const {
  return detail::concat(config_.batch.micro_batch, " x ", config_.batch.seq_len, " tokens x ", config_.batch.grad_accum,
                        " micro-steps per step; ", train_data_->num_tokens(), " training tokens");
}

// 3x the forward (the backward is twice the forward).
double LmTask::train_flops_per_item() const {
  return 3.0 * model_->config().flops_per_token_forward(config_.batch.seq_len);
}

std::string LmTask::graph_fallback_reason() const {
  if (config_.model.dropout > 0)
    return "dropout draws its random offset on the host every step (model.dropout is " +
           std::to_string(config_.model.dropout) + "; 0 allows the graph)";
  return "";
}

}  // namespace precis::train
