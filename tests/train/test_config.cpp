// The YAML config: defaults, shipped examples, presets, overrides, and the exact
// text of every kind of error a user can meet.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/errors.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace precis::train {
namespace {

// The smallest valid file: everything else keeps its default.
const std::string kData = "data:\n  text_file: assets/tinyshakespeare.txt\n";

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, overrides, "config.yaml");
}

using precis::testing::error_of;

std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse(text, overrides); });
}

TEST(Config, DefaultsMatchTheHeader) {
  TrainConfig config = parse(kData);
  TrainConfig defaults;
  EXPECT_EQ(config.model_preset, "custom");
  EXPECT_EQ(config.model.n_layer, defaults.model.n_layer);
  EXPECT_EQ(config.model.n_embd, 768);
  EXPECT_EQ(config.model.attention, "flash");
  EXPECT_EQ(config.data.text_file, "assets/tinyshakespeare.txt");
  EXPECT_EQ(config.data.tokenizer, "char");
  EXPECT_DOUBLE_EQ(config.data.val_fraction, 0.1);
  EXPECT_EQ(config.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 6e-4);
  EXPECT_DOUBLE_EQ(config.optimizer.beta2, 0.95);
  EXPECT_EQ(config.schedule.kind, "cosine");
  EXPECT_EQ(config.batch.micro_batch, 12);
  EXPECT_EQ(config.batch.grad_accum, 1);
  EXPECT_EQ(config.precision.policy.name, "fp32");
  EXPECT_EQ(config.checkpoint.keep_last, 2);
  EXPECT_EQ(config.sample.prompt, "\n");
  EXPECT_EQ(config.max_steps, 100);
  EXPECT_EQ(config.seed, 1337u);
  EXPECT_EQ(config.device, "auto");
  EXPECT_EQ(config.out_dir, "out");
  EXPECT_EQ(config.config_path, "");
}

TEST(Config, DecayStepsMinusOneBecomesMaxSteps) {
  EXPECT_EQ(parse(kData + "max_steps: 321\n").schedule.decay_steps, 321);
  EXPECT_EQ(parse(kData + "max_steps: 321\nschedule:\n  decay_steps: 50\n").schedule.decay_steps, 50);
}

TEST(Config, EmptySectionsAndEmptyStringsAreAllowed) {
  TrainConfig config = parse(kData + "checkpoint:\nsample:\n  prompt: \"\"\n");
  EXPECT_EQ(config.checkpoint.dir, "");
  EXPECT_EQ(config.sample.prompt, "");
}

// A config saved with Windows (CR LF) or old Mac (CR) line endings reads as with LF ones,
// the last line's value included when no LF follows its CR (the fuzzer's find: out_dir ended
// in an invisible "\r", and the resolved config did not read back the same).
TEST(Config, CarriageReturnsAreLineBreaks) {
  const std::string lf = kData + "max_steps: 20\nout_dir: out/run\n";
  for (const std::string& text :
       {kData + "max_steps: 20\r\nout_dir: out/run\r\n", kData + "max_steps: 20\rout_dir: out/run\r",
        kData + "max_steps: 20\nout_dir: out/run\r"}) {
    const TrainConfig config = parse(text);
    EXPECT_EQ(config.out_dir, "out/run");
    EXPECT_EQ(config.max_steps, 20);
    const std::string resolved = resolved_config_yaml(config);
    EXPECT_EQ(resolved, resolved_config_yaml(parse(lf)));
    EXPECT_EQ(resolved_config_yaml(parse(resolved)), resolved);
  }
}

TEST(Config, EveryShippedConfigLoads) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator("examples/configs")) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  EXPECT_GE(files.size(), 4u);
  // The fine-tuning configs name weights that are not shipped: they load with a tiny model's
  // weights in their place (the shape comes from the weights).
  const std::filesystem::path weights = std::filesystem::temp_directory_path() / "precis_config_init_from";
  std::filesystem::remove_all(weights);
  models::GPT2Config tiny;
  tiny.n_layer = 1, tiny.n_head = 2, tiny.n_embd = 8, tiny.block_size = 1024;
  models::GPT2 model(tiny);
  save_checkpoint(weights.string(), 1, model, nullptr, Json::object(), 1);
  for (const auto& file : files) {
    SCOPED_TRACE(file.string());
    std::ifstream text(file);
    std::stringstream yaml;
    yaml << text.rdbuf();
    std::vector<std::string> overrides;
    if (yaml.str().find("init_from:") != std::string::npos) overrides.push_back("model.init_from=" + weights.string());
    TrainConfig config = load_config(file.string(), overrides);
    EXPECT_EQ(config.config_path, file.string());
  }
}

TEST(Config, ShippedFinetuneConfigSaysWhereTheWeightsGo) {
  if (std::filesystem::exists("out/gpt2")) GTEST_SKIP() << "out/gpt2 exists here: the weights are in place";
  try {
    load_config("examples/configs/finetune-shakespeare.yaml");
    FAIL() << "loaded without weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("examples/configs/finetune-shakespeare.yaml:14:14: init_from: 'out/gpt2' "
                                         "does not exist; give a Hugging Face GPT-2 folder"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, ShippedDemoConfigSaysWhatTheDemoNeeds) {
  TrainConfig config = load_config("examples/configs/shakespeare-char.yaml");
  EXPECT_EQ(config.model.n_layer, 4);
  EXPECT_EQ(config.model.n_embd, 128);
  EXPECT_EQ(config.model.block_size, 64);
  EXPECT_EQ(config.batch.seq_len, 64);
  EXPECT_EQ(config.batch.micro_batch, 16);
  EXPECT_DOUBLE_EQ(config.optimizer.beta2, 0.99);
  EXPECT_EQ(config.schedule.warmup_steps, 50);
  EXPECT_EQ(config.schedule.decay_steps, 1000);
  EXPECT_EQ(config.sample.tokens, 300);
  EXPECT_EQ(config.out_dir, "out/shakespeare-char");
}

TEST(Config, ShippedGpt2SmallUsesThePresetAndTokensPerStep) {
  TrainConfig config = load_config("examples/configs/gpt2-small.yaml");
  EXPECT_EQ(config.model.n_layer, 12);
  EXPECT_EQ(config.model.n_embd, 768);
  EXPECT_EQ(config.model.vocab_size, 50257);
  EXPECT_EQ(config.batch.grad_accum, 32);  // 524288 / (16 * 1024)
  EXPECT_EQ(config.precision.policy.name, "bf16");
  EXPECT_EQ(config.device, "cuda");
}

// docs/config.md shows every key in one file; it must stay a file that loads.
TEST(Config, CompleteExampleInTheDocsParses) {
  std::ifstream file("docs/config.md");
  ASSERT_TRUE(file) << "docs/config.md not found; run from the repository root";
  std::stringstream docs;
  docs << file.rdbuf();
  std::string text = docs.str();
  size_t section = text.find("## A complete example");
  ASSERT_NE(section, std::string::npos);
  size_t begin = text.find("```yaml\n", section);
  ASSERT_NE(begin, std::string::npos);
  begin += 8;
  size_t end = text.find("```", begin);
  ASSERT_NE(end, std::string::npos);

  TrainConfig example = parse(text.substr(begin, end - begin));
  TrainConfig shipped = load_config("examples/configs/shakespeare-char.yaml");
  EXPECT_EQ(example.model.n_layer, shipped.model.n_layer);
  EXPECT_EQ(example.model.block_size, shipped.model.block_size);
  EXPECT_DOUBLE_EQ(example.optimizer.lr, shipped.optimizer.lr);
  EXPECT_EQ(example.schedule.decay_steps, shipped.schedule.decay_steps);
  EXPECT_EQ(example.batch.micro_batch, shipped.batch.micro_batch);
  EXPECT_EQ(example.sample.prompt, "\n");
  EXPECT_EQ(example.out_dir, shipped.out_dir);
}

TEST(Config, PresetsFillTheSizes) {
  struct Expected {
    const char* preset;
    int64_t n_layer, n_head, n_embd;
  };
  for (Expected expected : {Expected{"gpt2", 12, 12, 768}, Expected{"gpt2-medium", 24, 16, 1024},
                            Expected{"gpt2-large", 36, 20, 1280}, Expected{"gpt2-xl", 48, 25, 1600}}) {
    SCOPED_TRACE(expected.preset);
    // The defaults are gpt2's sizes, so the larger presets are what shows the filling.
    TrainConfig config = parse(kData + "model:\n  preset: " + expected.preset + "\n");
    EXPECT_EQ(config.model.n_layer, expected.n_layer);
    EXPECT_EQ(config.model.n_head, expected.n_head);
    EXPECT_EQ(config.model.n_embd, expected.n_embd);
    EXPECT_EQ(config.model.vocab_size, 50257);
    EXPECT_EQ(config.model.block_size, 1024);
  }
}

TEST(Config, ExplicitKeysBeatThePresetInAnyOrder) {
  TrainConfig before = parse(kData + "model:\n  n_layer: 2\n  preset: gpt2-medium\n");
  TrainConfig after = parse(kData + "model:\n  preset: gpt2-medium\n  n_layer: 2\n");
  for (const TrainConfig& config : {before, after}) {
    EXPECT_EQ(config.model.n_layer, 2);
    EXPECT_EQ(config.model.n_embd, 1024);
    EXPECT_EQ(config.model.n_head, 16);
  }
}

TEST(Config, OverridesBeatThePresetAndAPresetOverrideKeepsExplicitKeys) {
  TrainConfig config = parse(kData + "model:\n  preset: gpt2-large\n", {"model.n_layer=3", "model.block_size=256"});
  EXPECT_EQ(config.model.n_layer, 3);
  EXPECT_EQ(config.model.block_size, 256);
  EXPECT_EQ(config.model.n_embd, 1280);

  TrainConfig switched = parse(kData + "model:\n  preset: gpt2\n  n_layer: 2\n", {"model.preset=gpt2-xl"});
  EXPECT_EQ(switched.model.n_layer, 2);
  EXPECT_EQ(switched.model.n_embd, 1600);
  EXPECT_EQ(switched.model.n_head, 25);
}

TEST(Config, OverridesOfEachType) {
  TrainConfig config = parse(kData + "optimizer:\n  lr: 1.0e-3\nmax_steps: 10\n",
                             {"optimizer.lr=3e-4", "max_steps=50", "checkpoint.resume=true", "model.bias=off",
                              "device=cuda:1", "precision=bf16", "seed=18446744073709551615",
                              "data.text_file=other/file.txt", "sample.prompt=ROMEO: x=1", "optimizer.name=sgd"});
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 3e-4);
  EXPECT_EQ(config.max_steps, 50);
  EXPECT_EQ(config.schedule.decay_steps, 50);  // resolved after the overrides
  EXPECT_TRUE(config.checkpoint.resume);
  EXPECT_FALSE(config.model.bias);
  EXPECT_EQ(config.device, "cuda:1");
  EXPECT_EQ(config.precision.policy.name, "bf16");
  EXPECT_EQ(config.seed, 18446744073709551615ull);
  EXPECT_EQ(config.data.text_file, "other/file.txt");
  EXPECT_EQ(config.sample.prompt, "ROMEO: x=1");
  EXPECT_EQ(config.optimizer.name, "sgd");
}

TEST(Config, PrecisionForms) {
  EXPECT_EQ(parse(kData + "precision: bf16-pure\n").precision.policy.name, "bf16-pure");
  EXPECT_EQ(parse(kData + "precision:\n  policy: tf32\n").precision.policy.name, "tf32");
  const std::string jmp = "params=float32,compute=bfloat16,output=float32";
  EXPECT_EQ(parse(kData + "precision: " + jmp + "\n").precision.policy.name, jmp);
  EXPECT_EQ(parse(kData, {"precision.policy=compute=f16"}).precision.policy.name, "compute=f16");
}

// The config reader's presets are the model's own table (models/gpt2_config.cpp).
TEST(Config, ModelPresetIsExactlyTheModelsPreset) {
  for (const std::string& name : models::GPT2Config::preset_names()) {
    SCOPED_TRACE(name);
    TrainConfig config = parse(kData + "model:\n  preset: " + name + "\n");
    EXPECT_EQ(config.model, models::GPT2Config::preset(name));
    EXPECT_EQ(config.model_preset, name);
  }
  EXPECT_EQ(parse(kData + "model:\n  preset: gpt2-medium\n").model, models::GPT2Config::preset("gpt2-medium"));
  EXPECT_EQ(parse(kData).model, models::GPT2Config()) << "custom: the sizes as given";
}

TEST(Config, PrecisionKeysRefineThePolicy) {
  PrecisionConfig c = parse(kData + "precision:\n  policy: fp16\n  loss_scaling: none\n").precision;
  EXPECT_EQ(c.policy.loss_scaling, amp::LossScaling::none);
  EXPECT_EQ(c.policy.name, "fp16*");
  EXPECT_FALSE(c.scaler.enabled);

  c = parse(kData + "precision:\n  policy: bf16\n  params: bfloat16\n").precision;
  EXPECT_EQ(c.policy.param_dtype, DType::bf16);
  EXPECT_EQ(c.policy.grad_reduce_dtype, DType::bf16);
  EXPECT_TRUE(c.policy.master_weights);
  c = parse(kData + "precision:\n  policy: bf16\n  params: bfloat16\n  master_weights: false\n").precision;
  EXPECT_FALSE(c.policy.master_weights);
  // The reduction's dtype on its own: f32 parameters whose gradients travel in bf16.
  c = parse(kData + "precision:\n  policy: bf16\n  grad_reduce: bfloat16\n").precision;
  EXPECT_EQ(c.policy.param_dtype, DType::f32);
  EXPECT_EQ(c.policy.grad_reduce_dtype, DType::bf16);
  EXPECT_EQ(c.policy.name, "bf16*");
  EXPECT_EQ(parse(kData + "precision:\n  policy: bf16\n").precision.policy.grad_reduce_dtype, DType::f32);
  // The gradient buffer's dtype: bf16-pure's parameters' own, or f32 (every preset's).
  EXPECT_EQ(parse(kData + "precision:\n  policy: bf16-pure\n").precision.policy.grad_dtype, DType::f32);
  c = parse(kData + "precision:\n  policy: bf16-pure\n  grad_dtype: bfloat16\n").precision;
  EXPECT_EQ(c.policy.grad_dtype, DType::bf16);
  EXPECT_EQ(c.policy.param_dtype, DType::bf16);
  EXPECT_EQ(c.policy.name, "bf16-pure*");
  EXPECT_EQ(parse(kData, {"precision=bf16-pure", "precision.grad_dtype=bf16"}).precision.policy.grad_dtype,
            DType::bf16);
  EXPECT_EQ(parse(kData + "precision: params=bf16,compute=bf16,grads=bf16\n").precision.policy.grad_dtype, DType::bf16);

  c = parse(kData + "precision:\n  policy: fp32\n  loss_scaling: static\n  loss_scale: 128\n").precision;
  EXPECT_TRUE(c.scaler.enabled);
  EXPECT_EQ(c.scaler.mode, amp::ScalerMode::fixed);
  EXPECT_EQ(c.scaler.init_scale, 128);
  EXPECT_EQ(c.policy.static_scale, 128);
}

// The refining keys win wherever they were written, as the model sizes beat a preset; an
// unrefined policy is exactly the named one, and its loss scaler follows it.
TEST(Config, PrecisionRefinementsInAnyOrderAndUnrefinedPoliciesAsNamed) {
  for (const char* text :
       {"precision:\n  allow_tf32: true\n  policy: fp16\n", "precision:\n  policy: fp16\n  allow_tf32: true\n"}) {
    amp::PrecisionPolicy p = parse(kData + text).precision.policy;
    EXPECT_EQ(p.name, "fp16*");
    EXPECT_TRUE(p.allow_tf32);
    EXPECT_EQ(p.compute_dtype, DType::f16);
  }
  amp::PrecisionPolicy p = parse(kData + "precision:\n  compute: bf16\n", {"precision=fp16"}).precision.policy;
  EXPECT_EQ(p.name, "fp16*");
  EXPECT_EQ(p.compute_dtype, DType::bf16);
  EXPECT_EQ(p.loss_scaling, amp::LossScaling::dynamic);

  for (const char* name : {"fp32", "tf32", "fp16", "bf16", "bf16-pure", "params=bfloat16,compute=bfloat16"}) {
    SCOPED_TRACE(name);
    PrecisionConfig c = parse(kData, {std::string("precision=") + name}).precision;
    const amp::PrecisionPolicy named = amp::PrecisionPolicy::parse(name);
    EXPECT_EQ(c.policy.describe(), named.describe());  // every field but the static scale
    EXPECT_EQ(c.scaler.enabled, named.loss_scaling != amp::LossScaling::none);
    EXPECT_EQ(c.scaler.mode, amp::ScalerMode::dynamic);
    EXPECT_EQ(c.scaler.init_scale, 65536.0);
  }
  EXPECT_FALSE(TrainConfig().precision.scaler.enabled) << "the default policy, fp32, does not scale";
}

TEST(Config, TokensPerStepSetsGradAccum) {
  TrainConfig config =
      parse(kData + "batch:\n  micro_batch: 4\n  seq_len: 64\n  tokens_per_step: 2048\nmodel:\n  block_size: 64\n");
  EXPECT_EQ(config.batch.grad_accum, 8);
}

TEST(Config, DistributedSection) {
  TrainConfig defaults = parse(kData);
  EXPECT_EQ(defaults.distributed.backend, "auto");
  EXPECT_DOUBLE_EQ(defaults.distributed.bucket_mb, 25);
  EXPECT_DOUBLE_EQ(defaults.distributed.first_bucket_mb, 1);
  EXPECT_EQ(defaults.distributed.zero, 0);
  TrainConfig config =
      parse(kData + "distributed: {backend: mpi, bucket_mb: 4, first_bucket_mb: 0.5, timeout_s: 30, zero: 0}\n");
  EXPECT_EQ(config.distributed.backend, "mpi");
  EXPECT_DOUBLE_EQ(config.distributed.bucket_mb, 4);
  EXPECT_DOUBLE_EQ(config.distributed.first_bucket_mb, 0.5);
  EXPECT_DOUBLE_EQ(config.distributed.timeout_s, 30);
  EXPECT_EQ(parse(kData + "distributed: {zero: 1}\n").distributed.zero, 1);
  EXPECT_FALSE(defaults.distributed.gather_overlap);
  EXPECT_TRUE(defaults.distributed.reduce_overlap);
  EXPECT_FALSE(parse(kData + "distributed: {reduce_overlap: false}\n").distributed.reduce_overlap);
  EXPECT_TRUE(parse(kData + "distributed: {zero: 1, gather_overlap: true}\n").distributed.gather_overlap);
  EXPECT_EQ(defaults.distributed.fused_gather, FusedGather::where_possible);
  EXPECT_EQ(parse(kData + "distributed: {zero: 1, fused_gather: true}\n").distributed.fused_gather, FusedGather::on);
  EXPECT_EQ(parse(kData + "distributed: {fused_gather: auto}\n").distributed.fused_gather, FusedGather::where_possible);
  EXPECT_EQ(parse(kData + "distributed: {fused_gather: false}\n").distributed.fused_gather, FusedGather::off);
  // auto gives way quietly: no error without ZeRO-1, nor beside gather_overlap.
  EXPECT_EQ(
      parse(kData + "distributed: {zero: 1, fused_gather: auto, gather_overlap: true}\n").distributed.fused_gather,
      FusedGather::where_possible);
}

TEST(ConfigErrors, DistributedSection) {
  EXPECT_EQ(parse_error(kData + "distributed: {backend: gloo}\n"),
            "config.yaml:3:24: 'distributed.backend' must be one of auto, nccl, mpi, got 'gloo'");
  EXPECT_EQ(parse_error(kData + "distributed: {zero: 2}\n"),
            "config.yaml:3:21: 'distributed.zero' must be 0 or 1, got 2");
  EXPECT_EQ(parse_error(kData + "distributed: {bucket_mb: 0}\n"),
            "config.yaml:3:26: 'distributed.bucket_mb' must be > 0, got 0");
  // Plain DDP has no parameter all-gather to move.
  const std::string error = parse_error(kData + "distributed: {gather_overlap: true}\n");
  EXPECT_NE(error.find("'distributed.gather_overlap'"), std::string::npos) << error;
  EXPECT_NE(error.find("set distributed.zero=1"), std::string::npos) << error;
  const std::string fused = parse_error(kData + "distributed: {fused_gather: true}\n");
  EXPECT_NE(fused.find("'distributed.fused_gather'"), std::string::npos) << fused;
  EXPECT_NE(fused.find("set distributed.zero=1"), std::string::npos) << fused;
  // The fused gather leaves no all-gather to move behind the forward.
  const std::string both = parse_error(kData + "distributed: {zero: 1, fused_gather: true, gather_overlap: true}\n");
  EXPECT_NE(both.find("set one of them"), std::string::npos) << both;
  EXPECT_EQ(parse_error(kData + "distributed: {fused_gather: yes}\n"),
            "config.yaml:3:29: 'distributed.fused_gather' must be one of false, true, auto, got 'yes'");
}

TEST(Config, LoadConfigRecordsThePathAndAppliesOverrides) {
  TrainConfig config = load_config("examples/configs/shakespeare-char.yaml", {"max_steps=7"});
  EXPECT_EQ(config.config_path, "examples/configs/shakespeare-char.yaml");
  EXPECT_EQ(config.max_steps, 7);
  EXPECT_EQ(config.data.text_file, "assets/tinyshakespeare.txt");
}

// ---- errors: the whole message, position included

TEST(ConfigErrors, UnknownKeyNamesTheKeyItsPositionAndTheKnownKeys) {
  EXPECT_EQ(parse_error(kData + "optimizer:\n  lr: 1.0e-3\n  lrr: 2\n"),
            "config.yaml:5:3: unknown key 'optimizer.lrr' (known keys: name, lr, beta1, beta2, eps, weight_decay, "
            "momentum, nesterov, grad_clip, writes_weight_casts)");
  EXPECT_EQ(
      parse_error(kData + "max_step: 5\n"),
      "config.yaml:3:1: unknown key 'max_step' (known keys: model, data, optimizer, schedule, batch, "
      "precision, checkpoint, sample, profile, distributed, task, max_steps, eval_interval, eval_steps, log_interval, "
      "seed, device, threads, cuda_graphs, matmul_autotune, fused_classifier, channels_last, on_nonfinite, "
      "max_nonfinite_steps, out_dir)");
  EXPECT_EQ(
      parse_error(kData + "precision: {policy: fp32, loss_scal: 2}\n"),
      "config.yaml:3:27: unknown key 'precision.loss_scal' (known keys: policy, params, compute, output, "
      "grad_dtype, grad_reduce, master_weights, allow_tf32, loss_scaling, loss_scale, growth_interval, growth_factor, "
      "backoff_factor, "
      "min_scale, max_scale, hysteresis, stochastic_rounding, report, report_interval)");
  EXPECT_EQ(parse_config(kData + "precision: {policy: fp16, loss_scale: 1024, hysteresis: 2, compute: bf16}\n")
                .precision.scaler.hysteresis,
            2);
  EXPECT_EQ(parse_error(kData + "precision: {compute: float8}\n").substr(0, 60),
            "config.yaml:3:22: 'precision.compute' must be one of float32");
}

TEST(ConfigErrors, DuplicateKey) {
  EXPECT_EQ(parse_error(kData + "optimizer:\n  lr: 1.0e-3\n  lr: 2.0e-3\n"),
            "config.yaml:5:3: duplicate key 'optimizer.lr' (first set at config.yaml:4:3)");
}

TEST(ConfigErrors, WrongType) {
  EXPECT_EQ(parse_error(kData + "batch:\n  micro_batch: twelve\n"),
            "config.yaml:4:16: 'batch.micro_batch' must be an integer, got 'twelve'");
  EXPECT_EQ(parse_error(kData + "max_steps: 1.5\n"), "config.yaml:3:12: 'max_steps' must be an integer, got '1.5'");
  EXPECT_EQ(parse_error(kData + "optimizer:\n  lr: fast\n"),
            "config.yaml:4:7: 'optimizer.lr' must be a number, got 'fast'");
  EXPECT_EQ(parse_error(kData + "model:\n  bias: maybe\n"),
            "config.yaml:4:9: 'model.bias' must be true or false, got 'maybe'");
  EXPECT_EQ(parse_error(kData + "seed: [1, 2]\n"), "config.yaml:3:7: 'seed' must be an integer, got a sequence");
  EXPECT_EQ(parse_error(kData + "max_steps:\n"), "config.yaml:3:1: 'max_steps' must be an integer, got an empty value");
  EXPECT_EQ(parse_error(kData + "device: {name: cpu}\n"), "config.yaml:3:9: 'device' must be a string, got a mapping");
}

TEST(ConfigErrors, SectionMustBeAMapping) {
  EXPECT_EQ(parse_error(kData + "model: 12\n"), "config.yaml:3:1: 'model' must be a mapping, got '12'");
  EXPECT_EQ(parse_error(kData + "precision: [bf16]\n"),
            "config.yaml:3:1: 'precision' must be a mapping or a policy name, got a sequence");
  EXPECT_EQ(
      parse_error("- a\n- b\n"),
      "config.yaml:1:1: a config must be a mapping of keys (model, data, optimizer, schedule, batch, "
      "precision, checkpoint, sample, profile, distributed, task, max_steps, eval_interval, eval_steps, log_interval, "
      "seed, device, threads, cuda_graphs, matmul_autotune, fused_classifier, channels_last, on_nonfinite, "
      "max_nonfinite_steps, out_dir), got a sequence");
}

TEST(ConfigErrors, OutOfRange) {
  EXPECT_EQ(parse_error(kData + "optimizer:\n  lr: -1\n"), "config.yaml:4:7: 'optimizer.lr' must be > 0, got -1");
  EXPECT_EQ(parse_error(kData + "model:\n  dropout: 1.0\n"),
            "config.yaml:4:12: 'model.dropout' must be in [0, 1), got 1.0");
  EXPECT_EQ(parse_error("data:\n  text_file: a.txt\n  val_fraction: 0\n"),
            "config.yaml:3:17: 'data.val_fraction' must be in (0, 1), got 0");
  EXPECT_EQ(parse_error(kData + "model:\n  n_layer: 0\n"),
            "config.yaml:4:12: 'model.n_layer' must be in [1, 1024], got 0");
  EXPECT_EQ(parse_error(kData + "optimizer:\n  weight_decay: -0.1\n"),
            "config.yaml:4:17: 'optimizer.weight_decay' must be >= 0, got -0.1");
  EXPECT_EQ(parse_error(kData + "schedule:\n  decay_steps: 0\n"),
            "config.yaml:4:16: 'schedule.decay_steps' must be >= 1, or -1 for max_steps, got 0");
  EXPECT_EQ(parse_error(kData + "seed: -3\n"), "config.yaml:3:7: 'seed' must be >= 0, got -3");
  EXPECT_EQ(parse_error(kData + "sample:\n  temperature: 0\n"),
            "config.yaml:4:16: 'sample.temperature' must be > 0, got 0");
  EXPECT_EQ(parse_error(kData + "optimizer:\n  lr: .nan\n"),
            "config.yaml:4:7: 'optimizer.lr' must be a number, got '.nan'");
}

TEST(ConfigErrors, BadEnum) {
  EXPECT_EQ(parse_error(kData + "device: gpu\n"),
            "config.yaml:3:9: 'device' must be one of auto, cpu, cuda, cuda:N, got 'gpu'");
  EXPECT_EQ(parse_error(kData + "device: cuda:x\n"),
            "config.yaml:3:9: 'device' must be one of auto, cpu, cuda, cuda:N, got 'cuda:x'");
  EXPECT_EQ(parse_error(kData + "optimizer:\n  name: adam\n"),
            "config.yaml:4:9: 'optimizer.name' must be one of adamw, sgd, got 'adam'");
  EXPECT_EQ(parse_error(kData + "model:\n  preset: gpt3\n"),
            "config.yaml:4:11: 'model.preset' must be one of gpt2, gpt2-medium, gpt2-large, gpt2-xl, custom, got "
            "'gpt3'");
  EXPECT_EQ(parse_error(kData + "schedule: {kind: step}\n"),
            "config.yaml:3:18: 'schedule.kind' must be one of cosine, constant, linear, wsd, inverse_sqrt, got 'step'");
}

TEST(ConfigErrors, BadPrecision) {
  EXPECT_EQ(parse_error(kData + "precision: bf32\n"),
            "config.yaml:3:12: 'precision.policy' must be one of fp32, tf32, fp16, bf16, bf16-pure or a policy like "
            "'params=float32,compute=bfloat16,output=float32', got 'bf32'");
  EXPECT_EQ(parse_error(kData + "precision: params=float32,gradients=float32\n"),
            "config.yaml:3:12: 'precision.policy': 'gradients=float32' in 'params=float32,gradients=float32' is not "
            "params=, compute=, output= or grads=<dtype>");
  // The gradient buffer's dtype: f32, or the 16-bit parameters' own; the error is where it was set.
  EXPECT_EQ(parse_error(kData + "precision:\n  policy: bf16\n  grad_dtype: bfloat16\n"),
            "config.yaml:5:15: precision 'bf16': precision.grad_dtype (grads=) bfloat16 is not allowed with "
            "parameters in float32: use float32 (gradients of float32/float64 parameters keep their dtype)");
  EXPECT_EQ(parse_error(kData + "precision:\n  policy: bf16-pure\n  grad_dtype: float16\n"),
            "config.yaml:5:15: precision 'bf16-pure': precision.grad_dtype (grads=) float16 is not allowed with "
            "parameters in bfloat16: use float32 or bfloat16 (the parameters' own dtype)");
  EXPECT_EQ(parse_error(kData + "precision: compute=int8\n"),
            "config.yaml:3:12: 'precision.policy': unknown dtype 'int8' for compute in 'compute=int8' (expected "
            "float32, float16 or bfloat16)");
  EXPECT_EQ(parse_error(kData + "precision: compute=bf16,compute=f16\n"),
            "config.yaml:3:12: 'precision.policy': 'compute' is given twice in 'compute=bf16,compute=f16'");
}

TEST(ConfigErrors, CrossField) {
  EXPECT_EQ(parse_error(kData + "model:\n  n_head: 5\n  n_embd: 128\n"),
            "config.yaml:5:11: 'model.n_embd' (128) must be a multiple of 'model.n_head' (5)");
  EXPECT_EQ(parse_error(kData + "model:\n  block_size: 32\n"),
            "config.yaml:4:15: 'batch.seq_len' (64) must be <= 'model.block_size' (32)");
  EXPECT_EQ(parse_error("max_steps: 5\n"),
            "config.yaml: no training data: set 'data.text_file' (a text file) or 'data.train_bin' (token shards); "
            "examples/configs/ has complete configs");
  EXPECT_EQ(parse_error(kData + "  train_bin: out/train_*.bin\n"),
            "config.yaml:3:14: 'data.text_file' and 'data.train_bin' are both set; set exactly one");
  EXPECT_EQ(parse_error(kData + "  val_bin: out/val.bin\n"),
            "config.yaml:3:12: 'data.val_bin' needs 'data.train_bin' (with 'data.text_file' the validation split is "
            "the last 'data.val_fraction' of the text)");
  EXPECT_EQ(parse_error(kData + "batch:\n  tokens_per_step: 1000\n"),
            "config.yaml:4:20: 'batch.tokens_per_step' (1000) must be a multiple of micro_batch * seq_len = 12 * 64 "
            "= 768");
  EXPECT_EQ(parse_error(kData + "batch:\n  tokens_per_step: 1536\n  grad_accum: 4\n"),
            "config.yaml:5:15: 'batch.tokens_per_step' and 'batch.grad_accum' (4) are both set; set one "
            "(tokens_per_step sets grad_accum)");
}

TEST(ConfigErrors, CrossFieldErrorFromAnOverrideNamesTheOverride) {
  EXPECT_EQ(parse_error(kData, {"batch.seq_len=2048"}),
            "override 'batch.seq_len=2048': 'batch.seq_len' (2048) must be <= 'model.block_size' (1024)");
}

TEST(ConfigErrors, MissingFile) {
  EXPECT_EQ(error_of([] { load_config("no/such/dir/x.yaml"); }),
            "cannot read config file 'no/such/dir/x.yaml': No such file or directory");
  EXPECT_EQ(error_of([] { load_config("examples/configs"); }),
            "cannot read config file 'examples/configs': Is a directory");
}

TEST(ConfigErrors, YamlSyntaxErrorCarriesYamlCppsPosition) {
  EXPECT_EQ(parse_error("max_steps: 1\n  eval_steps: 2\n"), "config.yaml:2:13: invalid YAML: illegal map value");
}

TEST(ConfigErrors, BadOverride) {
  EXPECT_EQ(parse_error(kData, {"optimizer.lr=abc"}),
            "override 'optimizer.lr=abc': 'optimizer.lr' must be a number, got 'abc'");
  EXPECT_EQ(parse_error(kData, {"optimizer.lr=0"}), "override 'optimizer.lr=0': 'optimizer.lr' must be > 0, got 0");
  EXPECT_EQ(parse_error(kData, {"optimizer.lrr=1"}),
            "override 'optimizer.lrr=1': unknown key 'optimizer.lrr' (known keys: name, lr, beta1, beta2, eps, "
            "weight_decay, momentum, nesterov, grad_clip, writes_weight_casts)");
  EXPECT_EQ(parse_error(kData, {"optimiser.lr=1"}),
            "override 'optimiser.lr=1': unknown key 'optimiser' (known keys: model, data, optimizer, schedule, "
            "batch, precision, checkpoint, sample, profile, distributed, task, max_steps, eval_interval, eval_steps, "
            "log_interval, seed, device, threads, cuda_graphs, matmul_autotune, fused_classifier, channels_last, "
            "on_nonfinite, max_nonfinite_steps, out_dir)");
  EXPECT_EQ(parse_error(kData, {"max_steps"}), "override 'max_steps': expected key=value, e.g. optimizer.lr=1e-3");
  EXPECT_EQ(parse_error(kData, {"checkpoint.resume=sure"}),
            "override 'checkpoint.resume=sure': 'checkpoint.resume' must be true or false, got 'sure'");
  EXPECT_EQ(parse_error(kData, {"schedule=cosine"}),
            "override 'schedule=cosine': 'schedule' is a mapping; override one of its keys (kind, warmup_steps, "
            "min_lr, decay_steps, decay_fraction)");
}

}  // namespace
}  // namespace precis::train
