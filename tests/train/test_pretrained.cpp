// model.init_from's loaders (train/pretrained.h) on tiny models written by the test: an llm.c
// model file in fp32 and bf16 (written here from the model's own parameters, in llm.c's
// order and [out, in] layout), a Hugging Face folder (config.json + model.safetensors only)
// and a Precis checkpoint; each must load into a differently initialised model as the
// source's exact values, and the config must take the shape from the weights.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "models/gpt2.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/pretrained.h"

namespace fs = std::filesystem;

namespace precis::train {
namespace {

models::GPT2Config tiny_config() {
  models::GPT2Config c;
  c.vocab_size = 11;  // padded to 16 below: llm.c's padded vocabulary
  c.vocab_multiple = 16;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("precis_pretrained_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::map<std::string, Tensor> parameters(const models::GPT2& model) {
  std::map<std::string, Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.name] = p.tensor;
  return out;
}

// llm.c's write_model: the header, then each kind of tensor for all layers, as stored in the
// PyTorch model (Linear weights [out, in]); bf16 files hold the top 16 bits of each float
// rounded to nearest even, as llm.c's write_bf16 (torch's .to(bfloat16)) does.
void write_llmc(const fs::path& path, const models::GPT2& model, bool bf16) {
  const models::GPT2Config& c = model.config();
  std::map<std::string, Tensor> p = parameters(model);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  int32_t header[256] = {};
  header[0] = 20240326;
  header[1] = bf16 ? 5 : 3;
  header[2] = static_cast<int32_t>(c.block_size);
  header[3] = static_cast<int32_t>(c.vocab_size);
  header[4] = static_cast<int32_t>(c.n_layer);
  header[5] = static_cast<int32_t>(c.n_head);
  header[6] = static_cast<int32_t>(c.n_embd);
  header[7] = static_cast<int32_t>(c.padded_vocab_size());
  std::fwrite(header, sizeof header, 1, f);
  auto write = [&](const Tensor& t) {
    std::vector<float> v = t.contiguous().to_vector<float>();
    if (!bf16) {
      std::fwrite(v.data(), sizeof(float), v.size(), f);
      return;
    }
    for (float x : v) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      const uint16_t rounded = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
      std::fwrite(&rounded, 2, 1, f);
    }
  };
  write(p.at("transformer.wte.weight"));
  write(p.at("transformer.wpe.weight"));
  for (const char* kind :
       {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
        "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
    for (int64_t i = 0; i < c.n_layer; ++i) write(p.at("transformer.h." + std::to_string(i) + "." + kind));
  write(p.at("transformer.ln_f.weight"));
  write(p.at("transformer.ln_f.bias"));
  std::fclose(f);
}

// Every parameter of `loaded` equals `source`'s (bf16: the source rounded to bf16), the
// padded vocabulary rows zero.
void expect_same_weights(const models::GPT2& source, const models::GPT2& loaded, bool bf16) {
  std::map<std::string, Tensor> want = parameters(source), got = parameters(loaded);
  ASSERT_EQ(want.size(), got.size());
  const int64_t V = source.config().vocab_size;
  for (const auto& [name, tensor] : want) {
    Tensor expected = bf16 ? tensor.to(DType::bf16).to(DType::f32) : tensor;
    Tensor actual = got.at(name);
    if (name == "transformer.wte.weight") {
      expected = expected.narrow(0, 0, V);
      for (float v : actual.narrow(0, V, actual.size(0) - V).contiguous().to_vector<float>())
        EXPECT_EQ(v, 0.0f) << "padded rows";
      actual = actual.narrow(0, 0, V);
    }
    EXPECT_EQ(actual.contiguous().to_vector<float>(), expected.contiguous().to_vector<float>()) << name;
  }
}

TEST(Pretrained, LlmcFilesInFp32AndBf16) {
  fs::path dir = temp_dir("llmc");
  models::GPT2 source(tiny_config(), /*seed=*/1);
  for (bool bf16 : {false, true}) {
    const fs::path file = dir / (bf16 ? "tiny_bf16.bin" : "tiny.bin");
    write_llmc(file, source, bf16);
    PretrainedSource found = inspect_pretrained(file.string());
    EXPECT_EQ(found.format, "llm.c");
    EXPECT_EQ(found.config.n_layer, 2);
    EXPECT_EQ(found.config.n_embd, 8);
    EXPECT_EQ(found.config.vocab_size, 11);
    EXPECT_EQ(found.config.block_size, 8);
    models::GPT2Config shape = found.config;
    shape.vocab_multiple = 16;
    models::GPT2 loaded(shape, /*seed=*/2);
    load_pretrained(found, loaded);
    expect_same_weights(source, loaded, bf16);
  }
}

TEST(Pretrained, LlmcFileErrorsSayWhatIsWrong) {
  fs::path dir = temp_dir("llmc_errors");
  models::GPT2 source(tiny_config(), 1);
  write_llmc(dir / "tiny.bin", source, false);
  fs::resize_file(dir / "tiny.bin", fs::file_size(dir / "tiny.bin") - 4);
  models::GPT2 loaded(tiny_config(), 2);
  try {
    load_pretrained(inspect_pretrained((dir / "tiny.bin").string()), loaded);
    FAIL() << "a truncated file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ends before its tensors do"), std::string::npos) << e.what();
  }
  EXPECT_THROW(inspect_pretrained((dir / "nothing-here").string()), Error);
}

TEST(Pretrained, HuggingFaceFolderAndPrecisCheckpoint) {
  fs::path dir = temp_dir("hf");
  models::GPT2 source(tiny_config(), 1);
  const std::string step =
      save_checkpoint((dir / "run" / "checkpoints").string(), 7, source, nullptr, Json::object(), /*keep_last=*/1);
  // A Hugging Face folder has config.json and model.safetensors only.
  fs::create_directories(dir / "hf");
  for (const char* file : {"config.json", "model.safetensors"}) fs::copy_file(fs::path(step) / file, dir / "hf" / file);
  for (const fs::path& path : {dir / "hf", dir / "run", dir / "run" / "checkpoints", fs::path(step)}) {
    PretrainedSource found = inspect_pretrained(path.string());
    EXPECT_EQ(found.config.n_layer, 2) << path;
    models::GPT2 loaded(found.config, 2);
    load_pretrained(found, loaded);
    expect_same_weights(source, loaded, false);
  }
}

TEST(Pretrained, TheConfigTakesTheShapeFromTheWeightsAndRefusesAContradiction) {
  fs::path dir = temp_dir("config");
  models::GPT2 source(tiny_config(), 1);
  write_llmc(dir / "tiny.bin", source, false);
  const std::string data = "data: {text_file: assets/tinyshakespeare.txt}\nbatch: {seq_len: 8}\n";
  TrainConfig config = parse_config(data, {"model.init_from=" + (dir / "tiny.bin").string()});
  EXPECT_EQ(config.model.n_layer, 2);
  EXPECT_EQ(config.model.n_head, 2);
  EXPECT_EQ(config.model.n_embd, 8);
  EXPECT_EQ(config.model.block_size, 8);
  EXPECT_EQ(config.model.vocab_size, 11);
  TrainConfig same = parse_config(data + "model: {n_layer: 2}\n", {"model.init_from=" + (dir / "tiny.bin").string()});
  EXPECT_EQ(same.model.n_layer, 2);
  try {
    parse_config(data + "model: {n_layer: 4}\n", {"model.init_from=" + (dir / "tiny.bin").string()}, "ft.yaml");
    FAIL() << "a contradicting n_layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ft.yaml:3:18: 'model.n_layer' (4) contradicts the weights of "
                                         "'model.init_from' (2 in "),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace precis::train
