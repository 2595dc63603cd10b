// End-to-end checks of the training loop on a tiny char-level GPT.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/gpu.h"
#include "core/json.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace precis;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_trainer_" + name);
  fs::remove_all(dir);
  return dir.string();
}

// A tiny model on the first part of tinyshakespeare, with dropout so that the
// generator state matters for resuming.
train::TrainConfig tiny_config(const std::string& out_dir, int64_t max_steps) {
  return train::parse_config(R"(
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.1}
data: {text_file: assets/tinyshakespeare.txt, tokenizer: char}
optimizer: {lr: 3.0e-3, beta2: 0.99, weight_decay: 0.1}
schedule: {kind: cosine, warmup_steps: 2, min_lr: 1.0e-4}
batch: {micro_batch: 4, seq_len: 32, grad_accum: 2}
sample: {tokens: 0}
eval_interval: 4
eval_steps: 2
log_interval: 2
device: cpu
threads: 2
)",
                             {"max_steps=" + std::to_string(max_steps), "out_dir=" + out_dir});
}

}  // namespace

TEST(Trainer, LossFallsAndMetricsAreWritten) {
  std::string dir = fresh_dir("metrics");
  train::TrainConfig config = tiny_config(dir, 16);
  config.schedule.decay_steps = 16;
  train::Trainer trainer(config);
  trainer.run();
  const auto& losses = trainer.losses();
  ASSERT_EQ(losses.size(), 16u);
  EXPECT_NEAR(losses.front(), std::log(65.0), 0.3) << "an untrained model guesses uniformly over 65 chars";
  EXPECT_LT(losses.back(), losses.front() - 0.5);

  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::string line;
  int records = 0, with_val = 0;
  while (std::getline(in, line)) {
    Json r = Json::parse(line);
    for (const char* key : {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s", "phase_ms"})
      EXPECT_TRUE(r.contains(key)) << key << " missing in " << line;
    for (const char* phase : {"data", "forward", "backward", "optimizer"})
      EXPECT_TRUE(r.at("phase_ms").contains(phase)) << phase << " missing in " << line;
    if (r.contains("val_loss")) ++with_val;
    ++records;
  }
  EXPECT_EQ(records, 8);   // every 2 steps
  EXPECT_EQ(with_val, 4);  // steps 4, 8, 12, 16
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "latest"));
}

TEST(Trainer, ResumedRunReproducesTheUninterruptedOne) {
  std::string straight_dir = fresh_dir("straight"), resumed_dir = fresh_dir("resumed");
  train::TrainConfig straight_config = tiny_config(straight_dir, 8);
  straight_config.schedule.decay_steps = 8;
  train::Trainer straight(straight_config);
  straight.run();

  // The same run stopped after 5 steps (its checkpoint is at step 5) ...
  train::TrainConfig first_config = tiny_config(resumed_dir, 5);
  first_config.schedule.decay_steps = 8;
  train::Trainer first(first_config);
  first.run();
  // ... and continued to 8 by a new trainer.
  train::TrainConfig second_config = tiny_config(resumed_dir, 8);
  second_config.schedule.decay_steps = 8;
  second_config.checkpoint.resume = true;
  train::Trainer second(second_config);
  second.run();

  ASSERT_EQ(second.losses().size(), 3u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(first.losses()[i], straight.losses()[i]) << "step " << i + 1;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(second.losses()[i], straight.losses()[5 + i]) << "step " << i + 6;
}

TEST(Trainer, SamplesDecodeToText) {
  std::string dir = fresh_dir("sample");
  train::Trainer trainer(tiny_config(dir, 2));
  trainer.run();
  std::string text = trainer.sample("ROMEO:", 20);
  EXPECT_EQ(text.size(), 20u) << "one char per token";
  EXPECT_EQ(text, trainer.sample("ROMEO:", 20)) << "sampling is seeded";
}

// config.json and the train state's "model" are the one GPT2Config::to_json of the model trained.
TEST(Trainer, CheckpointRecordsTheModelConfigOnce) {
  std::string dir = fresh_dir("model_config");
  train::Trainer trainer(tiny_config(dir, 2));
  trainer.run();
  fs::path folder = fs::path(dir) / "checkpoints" / train::checkpoint_step_name(2);
  Json config_json = read_json_file((folder / "config.json").string());
  EXPECT_EQ(models::GPT2Config::from_json(config_json), trainer.gpt2().config());
  EXPECT_EQ(trainer.gpt2().config().dropout, 0.1);
  train::SafetensorsMetadata metadata = train::read_safetensors_metadata((folder / "train_state.safetensors").string());
  Json state = Json::parse(metadata.at("train_state"));
  EXPECT_EQ(state.at("model"), config_json);
}

TEST(Trainer, DeviceCudaWithoutAGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  train::TrainConfig config = tiny_config(fresh_dir("cuda"), 1);
  config.device = "cuda";
  try {
    train::Trainer trainer(config);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'cuda' requested but no GPU is usable"), std::string::npos)
        << e.what();
  }
}

TEST(Trainer, CudaGraphsOnTheCpuFallBackToTheSameStepWithTheReason) {
  train::TrainConfig plain_config = tiny_config(fresh_dir("graphs_off"), 4);
  train::TrainConfig graphs_config = tiny_config(fresh_dir("graphs_on"), 4);
  graphs_config.cuda_graphs = true;
  train::Trainer plain(plain_config), graphs(graphs_config);
  plain.run();
  ::testing::internal::CaptureStderr();
  graphs.run();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("note: cuda_graphs: not used: this run is on the CPU, and CUDA graphs need a GPU; the step runs "
                     "eagerly"),
            std::string::npos)
      << err;
  EXPECT_FALSE(graphs.replaying_graph());
  EXPECT_EQ(graphs.losses(), plain.losses()) << "bit for bit";
}
