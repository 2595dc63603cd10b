// precis eval CHECKPOINT_OR_RUN_DIR [--data SHARD_OR_TEXT] [--steps N] [--batch B] [--seq T]
//                                   [--precision P] [--device D]
// The mean next-token cross-entropy of a GPT-2 checkpoint and its perplexity exp(loss), with
// no training: over consecutive windows of T + 1 tokens (inputs and targets shifted by one, as
// training's validation reads them), B per batch, N batches (default: the data once). The
// model runs as the trainer's validation does: parameters stored in the policy's params
// dtype, the forward under its autocast, no gradients. Without --data it reads the run's own
// validation data (the shards its config names, or the validation split `precis train` wrote
// under out_dir/data), so `eval RUN --steps eval_steps` repeats the run's last validation.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "amp/precision_policy.h"
#include "cli/bench_common.h"
#include "cli/checkpoint_tokenizer.h"
#include "cli/commands.h"
#include "cli/usage.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/gpu.h"
#include "data/token_dataset.h"
#include "data/token_file.h"
#include "models/gpt2.h"
#include "nn/flat_parameters.h"
#include "ops/autocast.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/pretrained.h"

namespace precis::cli {

namespace fs = std::filesystem;

namespace {

// The run's config, when the checkpoint names one that still loads.
std::optional<train::TrainConfig> run_config(const Json& state) {
  if (!state.is_object() || !state.contains("config_path")) return std::nullopt;
  const std::string path = state.at("config_path").as_string();
  if (path.empty() || !fs::exists(path)) return std::nullopt;
  return train::load_config(path);
}

// The token shards to evaluate on: --data (a .bin shard, or text tokenised with the
// checkpoint's tokenizer into a shard in the temporary directory), else the run's validation data.
std::vector<std::string> eval_files(const std::string& data, const std::string& run_path,
                                    const std::optional<train::TrainConfig>& config, const Tokenizer& tokenizer) {
  if (!data.empty() && fs::path(data).extension() == ".bin") return {data};
  if (!data.empty()) {
    std::ifstream in(data, std::ios::binary);
    PRECIS_CHECK(in.is_open(), "eval: cannot read --data '", data, "'");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::vector<int32_t> tokens = tokenizer.encode(text);
    const fs::path shard = fs::temp_directory_path() / ("precis-eval-" + std::to_string(::getpid()) + ".bin");
    write_token_file(shard.string(), tokens);
    return {shard.string()};
  }
  PRECIS_CHECK(config.has_value(), "eval: the checkpoint names no config file that still exists, so its ",
               "validation data is unknown; give --data (a token shard .bin or a text file)");
  const train::DataConfig& d = config->data;
  if (!d.val_bin.empty()) return find_token_files(d.val_bin);
  PRECIS_CHECK(!d.text_file.empty(), "eval: the run has no validation data; give --data");
  // Where LmTask put the split of text_file: out_dir/data/<stem>_<tokenizer>_val.bin.
  const std::string name = fs::path(d.text_file).stem().string() + "_" + d.tokenizer + "_val.bin";
  for (const fs::path& dir : {fs::path(run_path), fs::path(config->out_dir)}) {
    const fs::path val = dir / "data" / name;
    if (fs::exists(val)) return {val.string()};
  }
  PRECIS_FAIL("eval: the run's validation split '", (fs::path(config->out_dir) / "data" / name).string(),
              "' is gone; give --data (a token shard .bin or a text file)");
}

}  // namespace

int eval_command(const Args& args) {
  Options o = parse_options(args, {"data", "steps", "batch", "seq", "precision", "device"}, "eval");
  usage_check(o.positional.size() == 1, "eval", "give one checkpoint directory or run folder");
  const std::string path = train::run_checkpoint_path(o.positional[0]);
  std::optional<models::GPT2Config> model_config = train::checkpoint_model_config(path);
  PRECIS_CHECK(model_config.has_value(), "eval: no GPT-2 config.json beside the weights in '", path,
               "'; point at a run folder or checkpoint directory written by `precis train`");
  const amp::PrecisionPolicy policy = amp::PrecisionPolicy::parse(o.get("precision", "fp32"));
  const Device device = resolve_device(o.get("device", "auto"));

  models::GPT2 model(*model_config);
  std::optional<DType> param_dtype;
  if (policy.param_dtype != DType::f32) param_dtype = policy.param_dtype;
  nn::flatten_parameters(model, device, param_dtype);
  const Json state = train::load_checkpoint(path, model, nullptr);
  const std::unique_ptr<Tokenizer> tokenizer = checkpoint_tokenizer(state);
  PRECIS_CHECK(tokenizer->vocab_size() == model_config->vocab_size, "eval: the tokenizer has ", tokenizer->vocab_size(),
               " tokens but the model's vocabulary is ", model_config->vocab_size);

  const std::optional<train::TrainConfig> config = run_config(state);
  TokenDatasetOptions options;
  options.batch_size = parse_count(o, "batch", config ? config->batch.micro_batch : 8, 1, "eval");
  options.seq_len = parse_count(
      o, "seq", config ? config->batch.seq_len : std::min<int64_t>(model_config->block_size, 1024), 1, "eval");
  PRECIS_CHECK(options.seq_len <= model_config->block_size, "eval: --seq ", options.seq_len,
               " is longer than the model's block_size ", model_config->block_size);
  options.prefetch = false;
  const std::string data = o.get("data", "");
  const std::vector<std::string> files = eval_files(data, o.positional[0], config, *tokenizer);
  TokenDataset dataset(files, options);
  PRECIS_CHECK(dataset.num_windows() > 0, "eval: the data holds ", dataset.num_tokens(),
               " tokens, fewer than one window of --seq ", options.seq_len, " + 1");
  const int64_t once = std::max<int64_t>(1, dataset.num_windows() / options.batch_size);
  const int64_t steps = parse_count(o, "steps", once, 1, "eval");

  NoGradGuard no_grad;
  model.eval();
  ops::autocast::Scope autocast(policy.compute_dtype, policy.autocasts());
  double loss_sum = 0;
  for (int64_t i = 0; i < steps; ++i) {
    TokenBatch batch = dataset.next_batch();
    loss_sum += model.forward(batch.inputs.to(device), batch.targets.to(device)).loss.item();
  }
  if (!data.empty() && fs::path(data).extension() != ".bin") fs::remove(files[0]);
  const double loss = loss_sum / static_cast<double>(steps);
  const int64_t tokens = steps * options.batch_size * options.seq_len;
  std::cout << "eval: " << path << " on " << (data.empty() ? "the run's validation data (" + files[0] + ")" : data)
            << ", " << steps << (steps == 1 ? " batch" : " batches") << " of " << options.batch_size << " x "
            << options.seq_len << " tokens, " << policy.describe() << " on " << device << "\n"
            << "loss " << format("%.4f", loss) << "  perplexity " << format("%.2f", std::exp(loss)) << "\n"
            << "result: loss=" << format("%.6f", loss) << " perplexity=" << format("%.4f", std::exp(loss))
            << " tokens=" << tokens << " batches=" << steps << std::endl;
  return 0;
}

}  // namespace precis::cli
