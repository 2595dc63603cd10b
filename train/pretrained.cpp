#include "train/pretrained.h"

#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "train/checkpoint.h"

namespace precis::train {

namespace fs = std::filesystem;

namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

File open_file(const std::string& path) {
  File file(std::fopen(path.c_str(), "rb"), &std::fclose);
  PRECIS_CHECK(file, "init_from: cannot read '", path, "'");
  return file;
}

struct LlmcHeader {
  int32_t version, max_t, vocab, layers, heads, channels, padded_vocab;
};

LlmcHeader read_llmc_header(std::FILE* file, const std::string& path) {
  int32_t header[256];
  PRECIS_CHECK(std::fread(header, sizeof header, 1, file) == 1, "init_from: '", path,
               "' is shorter than an llm.c header (1024 bytes)");
  PRECIS_CHECK(header[0] == kLlmcMagic, "init_from: '", path, "' is not an llm.c model file (magic ", header[0],
               ", expected ", kLlmcMagic, ")");
  PRECIS_CHECK(header[1] == 3 || header[1] == 5, "init_from: '", path, "' is llm.c model version ", header[1],
               "; only 3 (fp32) and 5 (bf16) are known");
  LlmcHeader h{header[1], header[2], header[3], header[4], header[5], header[6], header[7]};
  PRECIS_CHECK(h.max_t > 0 && h.vocab > 0 && h.layers > 0 && h.heads > 0 && h.channels > 0 &&
                   h.padded_vocab >= h.vocab && h.channels % h.heads == 0,
               "init_from: '", path, "' has an inconsistent llm.c header (max_seq_len ", h.max_t, ", vocab ", h.vocab,
               ", padded vocab ", h.padded_vocab, ", layers ", h.layers, ", heads ", h.heads, ", channels ", h.channels,
               ")");
  return h;
}

// The next `count` values of the file as a CPU tensor of `shape` (f32 or bf16, as stored).
Tensor read_values(std::FILE* file, const std::string& path, bool bf16, const Shape& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  const size_t n = static_cast<size_t>(count);
  if (bf16) {
    std::vector<bfloat16> values(n);
    PRECIS_CHECK(std::fread(values.data(), sizeof(bfloat16), n, file) == n, "init_from: '", path,
                 "' ends before its tensors do (truncated?)");
    return from_vector(values, shape);
  }
  std::vector<float> values(n);
  PRECIS_CHECK(std::fread(values.data(), sizeof(float), n, file) == n, "init_from: '", path,
               "' ends before its tensors do (truncated?)");
  return from_vector(values, shape);
}

bool is_llmc_file(const std::string& path) {
  if (fs::is_directory(path)) return false;
  File file(std::fopen(path.c_str(), "rb"), &std::fclose);
  int32_t magic = 0;
  return file && std::fread(&magic, sizeof magic, 1, file.get()) == 1 && magic == kLlmcMagic;
}

}  // namespace

std::string run_checkpoint_path(const std::string& path) {
  if (fs::exists(fs::path(path) / "checkpoints" / "latest")) return (fs::path(path) / "checkpoints").string();
  return path;
}

models::GPT2Config read_llmc_config(const std::string& path) {
  File file = open_file(path);
  const LlmcHeader h = read_llmc_header(file.get(), path);
  models::GPT2Config c;
  c.vocab_size = h.vocab;
  c.block_size = h.max_t;
  c.n_layer = h.layers;
  c.n_head = h.heads;
  c.n_embd = h.channels;
  c.bias = true;  // llm.c's GPT-2 has biases and tied embeddings
  c.tie_embeddings = true;
  return c;
}

std::vector<nn::NamedTensor> read_llmc_weights(const std::string& path) {
  File file = open_file(path);
  const LlmcHeader h = read_llmc_header(file.get(), path);
  const bool bf16 = h.version == 5;
  const int64_t L = h.layers, C = h.channels;
  auto next = [&](const Shape& shape) { return read_values(file.get(), path, bf16, shape); };
  std::vector<nn::NamedTensor> out;
  out.push_back({"transformer.wte.weight", next({h.padded_vocab, C}).narrow(0, 0, h.vocab)});
  out.push_back({"transformer.wpe.weight", next({h.max_t, C})});
  // One tensor per kind with every layer's slice: [L, ...] -> transformer.h.<i>.<name>; the
  // Linear weights [out, in] become Hugging Face's Conv1D [in, out].
  auto per_layer = [&](const std::string& name, const Shape& shape, bool conv1d) {
    Shape all = {L};
    all.insert(all.end(), shape.begin(), shape.end());
    const Tensor stacked = next(all);
    for (int64_t i = 0; i < L; ++i) {
      Tensor layer = stacked.narrow(0, i, 1).reshape(shape);
      out.push_back({"transformer.h." + std::to_string(i) + "." + name, conv1d ? layer.t() : layer});
    }
  };
  per_layer("ln_1.weight", {C}, false);
  per_layer("ln_1.bias", {C}, false);
  per_layer("attn.c_attn.weight", {3 * C, C}, true);
  per_layer("attn.c_attn.bias", {3 * C}, false);
  per_layer("attn.c_proj.weight", {C, C}, true);
  per_layer("attn.c_proj.bias", {C}, false);
  per_layer("ln_2.weight", {C}, false);
  per_layer("ln_2.bias", {C}, false);
  per_layer("mlp.c_fc.weight", {4 * C, C}, true);
  per_layer("mlp.c_fc.bias", {4 * C}, false);
  per_layer("mlp.c_proj.weight", {C, 4 * C}, true);
  per_layer("mlp.c_proj.bias", {C}, false);
  out.push_back({"transformer.ln_f.weight", next({C})});
  out.push_back({"transformer.ln_f.bias", next({C})});
  char extra = 0;
  PRECIS_CHECK(std::fread(&extra, 1, 1, file.get()) == 0, "init_from: '", path,
               "' holds more bytes than its header's model (another format or version?)");
  return out;
}

PretrainedSource inspect_pretrained(const std::string& path) {
  PRECIS_CHECK(fs::exists(path), "init_from: '", path,
               "' does not exist; give a Hugging Face GPT-2 folder (config.json + model.safetensors), a Precis run "
               "or checkpoint folder, or an llm.c model file (gpt2_124M.bin)");
  if (is_llmc_file(path)) return {path, "llm.c", read_llmc_config(path)};
  const std::string weights = resolve_checkpoint(run_checkpoint_path(path));
  std::optional<models::GPT2Config> config = checkpoint_model_config(weights);
  PRECIS_CHECK(config.has_value(), "init_from: no config.json beside the weights in '", path,
               "' (a Hugging Face folder has one, as save_pretrained writes it)");
  return {weights, "Hugging Face / Precis checkpoint", *config};
}

void load_pretrained(const PretrainedSource& source, models::GPT2& model) {
  if (source.format == "llm.c") {
    try {
      load_hf_state_dict(model, read_llmc_weights(source.path));
    } catch (const Error& e) {
      PRECIS_FAIL("init_from '", source.path, "': ", e.what());
    }
    return;
  }
  load_checkpoint(source.path, model, nullptr);  // the weights; the train state is not used
}

}  // namespace precis::train
