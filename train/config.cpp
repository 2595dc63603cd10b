// Reads the YAML training config. One table of fields (dotted key, type, allowed
// range) drives both the file and the command-line overrides, so both get the
// same checks and the same messages.
#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "data/unicode_classes.h"
#include "optim/lr_schedule.h"
#include "train/pretrained.h"

namespace precis::train {
namespace {

const std::vector<std::string> kSections = {"model",     "data",       "optimizer", "schedule", "batch",
                                            "precision", "checkpoint", "sample",    "profile",  "distributed"};

const std::vector<std::string> kPrecisionPresets = {"fp32", "tf32", "fp16", "bf16", "bf16-pure"};
const std::vector<std::string> kPolicyKeys = {"params", "compute", "output", "grads"};
const std::vector<std::string> kPolicyDtypes = {"float32", "fp32", "f32",      "float16", "fp16",
                                                "f16",     "half", "bfloat16", "bf16"};

std::string quoted(const std::string& text) { return "'" + text + "'"; }

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

// Every message starts with where the value came from: "config.yaml:7:3" or
// "override 'optimizer.lr=abc'".
[[noreturn]] void fail(const std::string& where, const std::string& message) { throw Error(where + ": " + message); }

std::string position(const std::string& source, const YAML::Mark& mark) {
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

// What a value that is not a plain scalar looks like, for "got ..." in messages.
std::string describe(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a sequence";
  if (node.IsNull()) return "an empty value";
  return quoted(node.Scalar());
}

// ---- scalar parsers: the whole text must be the value, so "12 layers" is an error, not 12

int64_t parse_integer(const std::string& key, const std::string& text, const std::string& where) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range) fail(where, quoted(key) + " is too large for a 64-bit integer: " + text);
  if (error != std::errc() || stop != end) fail(where, quoted(key) + " must be an integer, got " + quoted(text));
  return value;
}

uint64_t parse_unsigned(const std::string& key, const std::string& text, const std::string& where) {
  if (!text.empty() && text[0] == '-') {
    parse_integer(key, text, where);  // says "must be an integer" when it is not one at all
    fail(where, quoted(key) + " must be >= 0, got " + text);
  }
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range) fail(where, quoted(key) + " is too large for a 64-bit integer: " + text);
  if (error != std::errc() || stop != end) fail(where, quoted(key) + " must be an integer, got " + quoted(text));
  return value;
}

double parse_number(const std::string& key, const std::string& text, const std::string& where) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  // from_chars also reads "inf" and "nan", which are never a sensible setting.
  if (error != std::errc() || stop != end || !std::isfinite(value)) {
    fail(where, quoted(key) + " must be a number, got " + quoted(text));
  }
  return value;
}

// YAML 1.1 spellings too (yes/no/on/off), as yaml-cpp itself accepts them.
bool parse_bool(const std::string& key, const std::string& text, const std::string& where) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "no" || lower == "off") return false;
  fail(where, quoted(key) + " must be true or false, got " + quoted(text));
}

// ---- value rules

struct IntRule {
  std::function<bool(int64_t)> allows;
  std::string text;  // completes "must be ...": ">= 1"
};

IntRule at_least(int64_t min) {
  return {[min](int64_t value) { return value >= min; }, ">= " + std::to_string(min)};
}

// Sizes with a ceiling far above any real run, so a slip of the keyboard (threads=100000,
// n_layer=1e6) is an error here rather than a crash in OpenMP or an allocation.
IntRule between(int64_t min, int64_t max) {
  return {[min, max](int64_t value) { return value >= min && value <= max; },
          "in [" + std::to_string(min) + ", " + std::to_string(max) + "]"};
}

struct Range {
  double low;
  bool low_closed;
  double high = std::numeric_limits<double>::infinity();
  bool high_closed = false;

  bool contains(double value) const {
    bool above = low_closed ? value >= low : value > low;
    bool below = high_closed ? value <= high : value < high;
    return above && below;
  }
  // "> 0", ">= 0", "in [0, 1)"
  std::string text() const {
    std::ostringstream out;
    if (std::isinf(high)) {
      out << (low_closed ? ">= " : "> ") << low;
    } else {
      out << "in " << (low_closed ? "[" : "(") << low << ", " << high << (high_closed ? "]" : ")");
    }
    return out.str();
  }
};

const Range kPositive{0, false};
const Range kNonNegative{0, true};
const Range kProbability{0, true, 1, false};  // [0, 1): a rate of 1 would drop or keep nothing
const Range kOpenUnit{0, false, 1, false};    // (0, 1): both parts of a split must be non-empty

// A string check; throws with `where` when the text is not allowed.
using TextCheck = std::function<void(const std::string& key, const std::string& text, const std::string& where)>;

TextCheck one_of(std::vector<std::string> choices) {
  return [choices](const std::string& key, const std::string& text, const std::string& where) {
    if (!contains(choices, text)) {
      fail(where, quoted(key) + " must be one of " + join(choices) + ", got " + quoted(text));
    }
  };
}

// The keys of one task only: a run of the other task may not set them (check_model), and its
// resolved config leaves them out.
constexpr const char* kImageOnlyKeys[] = {"model.name",        "model.cifar_stem", "data.dataset",    "data.dir",
                                          "data.crop_padding", "data.flip",        "data.image_size", "data.channels",
                                          "data.num_classes",  "channels_last"};
constexpr const char* kLanguageModelOnlyKeys[] = {
    "model.preset",   "model.n_layer",  "model.n_head", "model.n_embd",   "model.block_size",
    "data.text_file", "data.train_bin", "data.val_bin", "data.tokenizer", "batch.seq_len"};

// Whether `key` is one of the other task's (see above).
bool of_another_task(const std::string& key, const std::string& task) {
  const bool images = task == "image_classification";
  for (const char* k :
       images ? std::span<const char* const>(kLanguageModelOnlyKeys) : std::span<const char* const>(kImageOnlyKeys))
    if (key == k) return true;
  return false;
}

void check_device(const std::string& key, const std::string& text, const std::string& where) {
  if (text == "auto" || text == "cpu" || text == "cuda") return;
  const std::string prefix = "cuda:";
  if (text.size() > prefix.size() && text.compare(0, prefix.size(), prefix) == 0 &&
      std::all_of(text.begin() + prefix.size(), text.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return;
  }
  fail(where, quoted(key) + " must be one of auto, cpu, cuda, cuda:N, got " + quoted(text));
}

// A preset name or a jmp-style "params=float32,compute=bfloat16,output=float32";
// what the dtypes mean is decided by amp/, here only the spelling is checked.
void check_precision(const std::string& key, const std::string& text, const std::string& where) {
  if (contains(kPrecisionPresets, text)) return;
  if (text.find('=') == std::string::npos) {
    fail(where, quoted(key) + " must be one of " + join(kPrecisionPresets) +
                    " or a policy like 'params=float32,compute=bfloat16,output=float32', got " + quoted(text));
  }
  std::vector<std::string> seen;
  std::stringstream parts(text);
  std::string part;
  while (std::getline(parts, part, ',')) {
    size_t equals = part.find('=');
    std::string name = part.substr(0, equals);
    if (equals == std::string::npos || !contains(kPolicyKeys, name)) {
      fail(where, quoted(key) + ": " + quoted(part) + " in " + quoted(text) +
                      " is not params=, compute=, output= or grads=<dtype>");
    }
    if (contains(seen, name)) fail(where, quoted(key) + ": " + quoted(name) + " is given twice in " + quoted(text));
    std::string dtype = part.substr(equals + 1);
    if (!contains(kPolicyDtypes, dtype)) {
      fail(where, quoted(key) + ": unknown dtype " + quoted(dtype) + " for " + name + " in " + quoted(text) +
                      " (expected float32, float16 or bfloat16)");
    }
    seen.push_back(name);
  }
}

// ---- the field table

// One settable key. `set` parses the text, checks type and range, and stores the
// value; `get` writes the value back as text `set` reads (the resolved config);
// `text_field` says whether an empty YAML value means the empty string.
struct Field {
  std::string key;       // dotted: "optimizer.lr"
  std::string expected;  // completes "must be ...": "an integer"
  bool text_field;
  std::function<void(const std::string& text, const std::string& where)> set;
  std::function<std::string()> get;
};

// The shortest text that reads back as exactly `value`.
std::string number_text(double value) {
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, end);
}

Field integer(const std::string& key, int64_t& slot, IntRule rule) {
  return {key, "an integer", false,
          [key, &slot, rule](const std::string& text, const std::string& where) {
            int64_t value = parse_integer(key, text, where);
            if (!rule.allows(value)) fail(where, quoted(key) + " must be " + rule.text + ", got " + text);
            slot = value;
          },
          [&slot] { return std::to_string(slot); }};
}

Field unsigned_integer(const std::string& key, uint64_t& slot) {
  return {key, "an integer", false,
          [key, &slot](const std::string& text, const std::string& where) { slot = parse_unsigned(key, text, where); },
          [&slot] { return std::to_string(slot); }};
}

Field number(const std::string& key, double& slot, Range range) {
  return {key, "a number", false,
          [key, &slot, range](const std::string& text, const std::string& where) {
            double value = parse_number(key, text, where);
            if (!range.contains(value)) fail(where, quoted(key) + " must be " + range.text() + ", got " + text);
            slot = value;
          },
          [&slot] { return number_text(slot); }};
}

Field boolean(const std::string& key, bool& slot) {
  return {key, "true or false", false,
          [key, &slot](const std::string& text, const std::string& where) { slot = parse_bool(key, text, where); },
          [&slot] { return std::string(slot ? "true" : "false"); }};
}

Field text(const std::string& key, std::string& slot, TextCheck check = {}) {
  return {key, "a string", true,
          [key, &slot, check](const std::string& value, const std::string& where) {
            if (check) check(key, value, where);
            slot = value;
          },
          [&slot] { return slot; }};
}

// A string from a fixed list, stored as the value it names ("static" -> LossScaling::fixed).
template <typename T>
Field choice(const std::string& key, T& slot, std::vector<std::pair<std::string, T>> choices) {
  std::vector<std::string> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  return {key, "a string", true,
          [key, &slot, choices, check = one_of(names)](const std::string& text, const std::string& where) {
            check(key, text, where);
            for (const auto& [name, value] : choices)
              if (name == text) slot = value;
          },
          [&slot, choices] {
            for (const auto& [name, value] : choices)
              if (value == slot) return name;
            return choices.front().first;
          }};
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names = models::GPT2Config::preset_names();
  names.push_back("custom");
  return names;
}

std::vector<std::pair<std::string, DType>> policy_dtypes() {
  std::vector<std::pair<std::string, DType>> dtypes;
  for (const std::string& name : kPolicyDtypes) dtypes.emplace_back(name, parse_dtype(name));
  return dtypes;
}

std::vector<std::pair<std::string, amp::LossScaling>> loss_scalings() {
  std::vector<std::pair<std::string, amp::LossScaling>> scalings;
  for (amp::LossScaling scaling : {amp::LossScaling::none, amp::LossScaling::fixed, amp::LossScaling::dynamic})
    scalings.emplace_back(amp::loss_scaling_name(scaling), scaling);
  return scalings;
}

const std::vector<std::pair<std::string, bool>> kTrueFalse = {{"true", true}, {"false", false}};

// In the order of train/config.h, which is also the order "known keys" lists them.
std::vector<Field> make_fields(TrainConfig& c) {
  models::GPT2Config& m = c.model;
  DataConfig& d = c.data;
  OptimizerConfig& o = c.optimizer;
  ScheduleConfig& s = c.schedule;
  BatchConfig& b = c.batch;
  CheckpointConfig& k = c.checkpoint;
  SampleConfig& p = c.sample;
  amp::PrecisionPolicy& policy = c.precision.policy;
  amp::GradScalerOptions& scaler = c.precision.scaler;
  const IntRule zero_rule{[](int64_t value) { return value == 0 || value == 1; }, "0 or 1"};
  const IntRule decay_rule{[](int64_t value) { return value == -1 || value >= 1; }, ">= 1, or -1 for max_steps"};
  return {
      text("model.preset", c.model_preset, one_of(model_preset_names())),
      text("model.init_from", c.init_from),
      text("model.name", c.image_model.name, one_of(models::image_model_names())),
      boolean("model.cifar_stem", c.image_model.cifar_stem),
      integer("model.vocab_size", m.vocab_size, between(1, 1 << 24)),
      integer("model.block_size", m.block_size, between(1, 1 << 20)),
      integer("model.n_layer", m.n_layer, between(1, 1024)),
      integer("model.n_head", m.n_head, between(1, 1024)),
      integer("model.n_embd", m.n_embd, between(1, 1 << 16)),
      number("model.dropout", m.dropout, kProbability),
      boolean("model.bias", m.bias),
      boolean("model.tie_embeddings", m.tie_embeddings),
      integer("model.vocab_multiple", m.vocab_multiple, at_least(1)),
      text("model.attention", m.attention, one_of({"reference", "flash"})),

      text("data.text_file", d.text_file),
      text("data.train_bin", d.train_bin),
      text("data.val_bin", d.val_bin),
      text("data.tokenizer", d.tokenizer, one_of({"char", "gpt2"})),
      number("data.val_fraction", d.val_fraction, kOpenUnit),
      text("data.order", d.order, one_of({"random", "sequential"})),
      boolean("data.prefetch", d.prefetch),
      text("data.dataset", d.dataset, one_of({"mnist", "cifar10", "synthetic"})),
      text("data.dir", d.dir),
      integer("data.crop_padding", d.crop_padding, at_least(0)),
      boolean("data.flip", d.flip),
      integer("data.image_size", d.image_size, at_least(1)),
      integer("data.channels", d.channels, at_least(1)),
      integer("data.num_classes", d.num_classes, at_least(2)),

      text("optimizer.name", o.name, one_of({"adamw", "sgd"})),
      number("optimizer.lr", o.lr, kPositive),
      number("optimizer.beta1", o.beta1, kProbability),
      number("optimizer.beta2", o.beta2, kProbability),
      number("optimizer.eps", o.eps, kPositive),
      number("optimizer.weight_decay", o.weight_decay, kNonNegative),
      number("optimizer.momentum", o.momentum, kProbability),
      boolean("optimizer.nesterov", o.nesterov),
      number("optimizer.grad_clip", o.grad_clip, kNonNegative),
      boolean("optimizer.writes_weight_casts", o.writes_weight_casts),

      text("schedule.kind", s.kind, one_of(optim::LrSchedule::kinds())),
      integer("schedule.warmup_steps", s.warmup_steps, at_least(0)),
      number("schedule.min_lr", s.min_lr, kNonNegative),
      integer("schedule.decay_steps", s.decay_steps, decay_rule),
      number("schedule.decay_fraction", s.decay_fraction, Range{0, false, 1, true}),

      integer("batch.micro_batch", b.micro_batch, between(1, 1 << 20)),
      integer("batch.seq_len", b.seq_len, between(1, 1 << 20)),
      integer("batch.grad_accum", b.grad_accum, between(1, 1 << 20)),
      integer("batch.tokens_per_step", b.tokens_per_step, at_least(0)),

      text("precision.policy", policy.name, check_precision),
      choice("precision.params", policy.param_dtype, policy_dtypes()),
      choice("precision.compute", policy.compute_dtype, policy_dtypes()),
      choice("precision.output", policy.output_dtype, policy_dtypes()),
      choice("precision.grad_dtype", policy.grad_dtype, policy_dtypes()),
      choice("precision.grad_reduce", policy.grad_reduce_dtype, policy_dtypes()),
      choice("precision.master_weights", policy.master_weights, kTrueFalse),
      choice("precision.allow_tf32", policy.allow_tf32, kTrueFalse),
      choice("precision.loss_scaling", policy.loss_scaling, loss_scalings()),
      number("precision.loss_scale", scaler.init_scale, kPositive),
      integer("precision.growth_interval", scaler.growth_interval, at_least(1)),
      number("precision.growth_factor", scaler.growth_factor, kPositive),
      number("precision.backoff_factor", scaler.backoff_factor, kPositive),
      number("precision.min_scale", scaler.min_scale, kPositive),
      number("precision.max_scale", scaler.max_scale, kPositive),
      integer("precision.hysteresis", scaler.hysteresis, at_least(1)),
      boolean("precision.stochastic_rounding", c.precision.stochastic_rounding),
      boolean("precision.report", c.precision.report),
      integer("precision.report_interval", c.precision.report_interval, at_least(0)),

      text("checkpoint.dir", k.dir),
      integer("checkpoint.interval", k.interval, at_least(0)),
      integer("checkpoint.keep_last", k.keep_last, at_least(1)),
      boolean("checkpoint.resume", k.resume),
      boolean("checkpoint.overwrite", k.overwrite),
      boolean("checkpoint.save_final", k.save_final),

      integer("sample.tokens", p.tokens, between(0, 1000000)),
      number("sample.temperature", p.temperature, kPositive),
      integer("sample.top_k", p.top_k, at_least(0)),
      text("sample.prompt", p.prompt),

      text("profile.trace", c.profile.trace),
      integer("profile.trace_step", c.profile.trace_step, at_least(1)),
      integer("profile.trace_steps", c.profile.trace_steps, at_least(1)),

      text("distributed.backend", c.distributed.backend, one_of({"auto", "nccl", "mpi"})),
      number("distributed.bucket_mb", c.distributed.bucket_mb, kPositive),
      number("distributed.first_bucket_mb", c.distributed.first_bucket_mb, kPositive),
      number("distributed.timeout_s", c.distributed.timeout_s, kPositive),
      integer("distributed.zero", c.distributed.zero, zero_rule),
      boolean("distributed.gather_overlap", c.distributed.gather_overlap),
      choice("distributed.fused_gather", c.distributed.fused_gather,
             {{"false", FusedGather::off}, {"true", FusedGather::on}, {"auto", FusedGather::where_possible}}),
      boolean("distributed.reduce_overlap", c.distributed.reduce_overlap),

      text("task", c.task, one_of({"language_model", "image_classification"})),
      integer("max_steps", c.max_steps, at_least(1)),
      integer("eval_interval", c.eval_interval, at_least(0)),
      integer("eval_steps", c.eval_steps, at_least(0)),
      integer("log_interval", c.log_interval, at_least(1)),
      unsigned_integer("seed", c.seed),
      text("device", c.device, check_device),
      integer("threads", c.threads, between(0, 4096)),
      boolean("cuda_graphs", c.cuda_graphs),
      boolean("matmul_autotune", c.matmul_autotune),
      boolean("fused_classifier", c.fused_classifier),
      text("channels_last", c.channels_last, one_of({"auto", "true", "false"})),
      text("on_nonfinite", c.on_nonfinite, one_of({"stop", "skip"})),
      integer("max_nonfinite_steps", c.max_nonfinite_steps, at_least(1)),
      text("out_dir", c.out_dir),
  };
}

// ---- reading: the file first, then the overrides, then the checks across fields

class ConfigReader {
 public:
  ConfigReader(TrainConfig& config, std::string source)
      : config_(config), source_(std::move(source)), fields_(make_fields(config)) {}

  void read_document(const YAML::Node& root);
  void apply_override(const std::string& override_text);
  void finish();

 private:
  void read_section(const std::string& section, const YAML::Node& key_node, const YAML::Node& value);
  void set_from_node(const std::string& key, const YAML::Node& key_node, const YAML::Node& value);
  void for_each_entry(const YAML::Node& mapping, const std::string& section,
                      const std::function<void(const std::string&, const YAML::Node&, const YAML::Node&)>& visit);
  const Field* find(const std::string& key) const;
  std::vector<std::string> known_keys(const std::string& section) const;
  [[noreturn]] void unknown_key(const std::string& key, const std::string& where) const;
  std::string where_set(std::initializer_list<const char*> keys) const;
  bool was_set(const std::string& key) const { return set_at_.count(key) > 0; }

  void apply_preset();
  void resolve_precision();
  void resolve_init_from();
  void check_model() const;
  void check_data() const;
  void resolve_data();
  void resolve_batch();
  void resolve_schedule();
  void check_profile() const;
  void check_distributed() const;
  void check_checkpoint() const;

  TrainConfig& config_;
  std::string source_;
  std::vector<Field> fields_;
  // Key -> where it was last set. A preset fills only the keys not in here, and
  // errors that involve several keys point at one that the user wrote.
  std::map<std::string, std::string> set_at_;
  bool empty_document_ = false;  // the file holds no keys (only comments, or nothing)
};

const Field* ConfigReader::find(const std::string& key) const {
  for (const Field& field : fields_) {
    if (field.key == key) return &field;
  }
  return nullptr;
}

// The keys of one section without the prefix, or the top-level keys for "".
std::vector<std::string> ConfigReader::known_keys(const std::string& section) const {
  if (section.empty()) {
    std::vector<std::string> keys = kSections;
    for (const Field& field : fields_) {
      if (field.key.find('.') == std::string::npos) keys.push_back(field.key);
    }
    return keys;
  }
  std::vector<std::string> keys;
  const std::string prefix = section + ".";
  for (const Field& field : fields_) {
    if (field.key.compare(0, prefix.size(), prefix) == 0) keys.push_back(field.key.substr(prefix.size()));
  }
  return keys;
}

void ConfigReader::unknown_key(const std::string& key, const std::string& where) const {
  size_t dot = key.find('.');
  std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  if (!section.empty() && !contains(kSections, section)) {
    fail(where, "unknown key " + quoted(section) + " (known keys: " + join(known_keys("")) + ")");
  }
  fail(where, "unknown key " + quoted(key) + " (known keys: " + join(known_keys(section)) + ")");
}

// Calls visit(name, key node, value node) for each entry, after checking that the
// key is a plain name that appears once (yaml-cpp keeps duplicate keys silently).
void ConfigReader::for_each_entry(
    const YAML::Node& mapping, const std::string& section,
    const std::function<void(const std::string&, const YAML::Node&, const YAML::Node&)>& visit) {
  std::map<std::string, std::string> seen;
  for (const auto& entry : mapping) {
    const YAML::Node& key_node = entry.first;
    std::string where = position(source_, key_node.Mark());
    if (!key_node.IsScalar()) fail(where, "a key must be a plain name, got " + describe(key_node));
    std::string name = section.empty() ? key_node.Scalar() : section + "." + key_node.Scalar();
    auto [previous, inserted] = seen.emplace(name, where);
    if (!inserted) fail(where, "duplicate key " + quoted(name) + " (first set at " + previous->second + ")");
    visit(name, key_node, entry.second);
  }
}

void ConfigReader::read_document(const YAML::Node& root) {
  if (root.IsNull()) {  // no keys: every default, and no data (check_data says the file is empty)
    empty_document_ = true;
    return;
  }
  if (!root.IsMap()) {
    fail(position(source_, root.Mark()),
         "a config must be a mapping of keys (" + join(known_keys("")) + "), got " + describe(root));
  }
  for_each_entry(root, "", [this](const std::string& name, const YAML::Node& key_node, const YAML::Node& value) {
    if (contains(kSections, name)) {
      read_section(name, key_node, value);
    } else {
      set_from_node(name, key_node, value);
    }
  });
}

void ConfigReader::read_section(const std::string& section, const YAML::Node& key_node, const YAML::Node& value) {
  // `precision: bf16` is short for `precision: {policy: bf16}`.
  if (section == "precision" && value.IsScalar()) {
    set_from_node("precision.policy", key_node, value);
    return;
  }
  // The section's own key marks the spot: an empty value's mark is the next line.
  if (value.IsNull()) return;
  if (!value.IsMap()) {
    std::string expected = section == "precision" ? "a mapping or a policy name" : "a mapping";
    fail(position(source_, key_node.Mark()), quoted(section) + " must be " + expected + ", got " + describe(value));
  }
  for_each_entry(value, section, [this](const std::string& name, const YAML::Node& key, const YAML::Node& item) {
    set_from_node(name, key, item);
  });
}

void ConfigReader::set_from_node(const std::string& key, const YAML::Node& key_node, const YAML::Node& value) {
  const Field* field = find(key);
  if (!field) unknown_key(key, position(source_, key_node.Mark()));
  std::string where = position(source_, value.IsNull() ? key_node.Mark() : value.Mark());
  if (value.IsScalar()) {
    field->set(value.Scalar(), where);
  } else if (value.IsNull() && field->text_field) {
    field->set("", where);
  } else {
    fail(where, quoted(key) + " must be " + field->expected + ", got " + describe(value));
  }
  set_at_[key] = where;
}

// "optimizer.lr=1e-3": the value is taken as written (no YAML parsing), so
// `sample.prompt=ROMEO:` is the string it looks like.
void ConfigReader::apply_override(const std::string& override_text) {
  std::string where = "override " + quoted(override_text);
  size_t equals = override_text.find('=');
  if (equals == std::string::npos || equals == 0) fail(where, "expected key=value, e.g. optimizer.lr=1e-3");
  std::string key = override_text.substr(0, equals);
  std::string value = override_text.substr(equals + 1);
  if (key == "precision") key = "precision.policy";
  if (contains(kSections, key)) {
    fail(where, quoted(key) + " is a mapping; override one of its keys (" + join(known_keys(key)) + ")");
  }
  const Field* field = find(key);
  if (!field) unknown_key(key, where);
  field->set(value, where);
  set_at_[key] = where;
}

// Where to point an error about several keys: the first of them that the user set.
std::string ConfigReader::where_set(std::initializer_list<const char*> keys) const {
  for (const char* key : keys) {
    auto found = set_at_.find(key);
    if (found != set_at_.end()) return found->second;
  }
  return source_;
}

// Explicit keys win over the preset wherever they were written (before or after
// `preset:` in the file, or on the command line).
void ConfigReader::apply_preset() {
  if (config_.model_preset == "custom") return;  // the sizes are as given
  const models::GPT2Config preset = models::GPT2Config::preset(config_.model_preset);
  models::GPT2Config& model = config_.model;
  auto fill = [this](const char* key, int64_t& slot, int64_t value) {
    if (!was_set(key)) slot = value;
  };
  fill("model.n_layer", model.n_layer, preset.n_layer);
  fill("model.n_head", model.n_head, preset.n_head);
  fill("model.n_embd", model.n_embd, preset.n_embd);
  fill("model.vocab_size", model.vocab_size, preset.vocab_size);
  fill("model.block_size", model.block_size, preset.block_size);
}

// model.init_from: the model's shape is the weights'; a size the config gives must agree.
void ConfigReader::resolve_init_from() {
  if (config_.init_from.empty()) return;
  if (config_.task != "language_model")
    fail(where_set({"model.init_from"}), "'model.init_from' loads a GPT-2; this run's task is " + config_.task);
  PretrainedSource source;
  try {
    source = inspect_pretrained(config_.init_from);
  } catch (const Error& e) {
    fail(where_set({"model.init_from"}), e.what());
  }
  models::GPT2Config& model = config_.model;
  auto take = [&](const char* key, auto& slot, auto value) {
    if ((was_set(key) || was_set("model.preset")) && slot != value) {
      std::ostringstream message;
      message << std::boolalpha << quoted(key) << " (" << slot << ") contradicts the weights of 'model.init_from' ("
              << value << " in " << config_.init_from << "); leave it out: the shape comes from the weights";
      fail(where_set({key, "model.preset"}), message.str());
    }
    slot = value;
  };
  take("model.n_layer", model.n_layer, source.config.n_layer);
  take("model.n_head", model.n_head, source.config.n_head);
  take("model.n_embd", model.n_embd, source.config.n_embd);
  take("model.block_size", model.block_size, source.config.block_size);
  take("model.vocab_size", model.vocab_size, source.config.vocab_size);
  take("model.bias", model.bias, source.config.bias);
  take("model.tie_embeddings", model.tie_embeddings, source.config.tie_embeddings);
}

// As the model preset: the keys after `precision.policy` refine the policy it names wherever
// they were written, and a refined policy's name gets a "*". The loss scaler follows it.
void ConfigReader::resolve_precision() {
  amp::PrecisionPolicy& policy = config_.precision.policy;
  amp::GradScalerOptions& scaler = config_.precision.scaler;
  const amp::PrecisionPolicy named = amp::PrecisionPolicy::parse(policy.name);
  bool refined = false;
  auto fill = [&](const char* key, auto& slot, const auto& value) {
    if (was_set(key)) {
      refined = true;
    } else {
      slot = value;
    }
  };
  fill("precision.params", policy.param_dtype, named.param_dtype);
  fill("precision.compute", policy.compute_dtype, named.compute_dtype);
  fill("precision.output", policy.output_dtype, named.output_dtype);
  // Parameters given in a dtype are reduced in it and, in f16/bf16, updated through f32
  // master weights, as those of a policy string are.
  const bool params_given = was_set("precision.params");
  const bool low_precision_params = policy.param_dtype == DType::f16 || policy.param_dtype == DType::bf16;
  fill("precision.grad_dtype", policy.grad_dtype, named.grad_dtype);
  fill("precision.grad_reduce", policy.grad_reduce_dtype, params_given ? policy.param_dtype : named.grad_reduce_dtype);
  fill("precision.master_weights", policy.master_weights, params_given ? low_precision_params : named.master_weights);
  fill("precision.allow_tf32", policy.allow_tf32, named.allow_tf32);
  fill("precision.loss_scaling", policy.loss_scaling, named.loss_scaling);
  policy.static_scale = scaler.init_scale;
  try {
    policy.check_grad_dtype();
  } catch (const Error& e) {
    fail(where_set({"precision.grad_dtype", "precision.params", "precision.policy"}), e.what());
  }
  if (refined) policy.name += "*";

  scaler.enabled = policy.loss_scaling != amp::LossScaling::none;
  scaler.mode = policy.loss_scaling == amp::LossScaling::fixed ? amp::ScalerMode::fixed : amp::ScalerMode::dynamic;
}

void ConfigReader::check_model() const {
  // A key of the other task would be ignored without a word: say so instead.
  const bool images = config_.task == "image_classification";
  for (const char* key : kImageOnlyKeys)
    if (!images && was_set(key))
      fail(where_set({key}),
           quoted(key) + " is a setting of 'task: image_classification'; this run's task is " + config_.task);
  for (const char* key : kLanguageModelOnlyKeys)
    if (images && was_set(key))
      fail(where_set({key}), quoted(key) + " is a setting of 'task: language_model' (GPT-2); this run's task is " +
                                 config_.task + " (its model is model.name)");
  if (images) return;
  const models::GPT2Config& model = config_.model;
  if (model.n_embd % model.n_head != 0) {
    fail(where_set({"model.n_embd", "model.n_head", "model.preset"}),
         "'model.n_embd' (" + std::to_string(model.n_embd) + ") must be a multiple of 'model.n_head' (" +
             std::to_string(model.n_head) + ")");
  }
  if (config_.batch.seq_len > model.block_size) {
    fail(where_set({"batch.seq_len", "model.block_size", "model.preset"}),
         "'batch.seq_len' (" + std::to_string(config_.batch.seq_len) + ") must be <= 'model.block_size' (" +
             std::to_string(model.block_size) + ")");
  }
}

void ConfigReader::check_data() const {
  const DataConfig& data = config_.data;
  if (config_.task == "image_classification") {
    if (data.dataset == "cifar10" && data.dir.empty())
      fail(where_set({"data.dataset"}),
           "'data.dataset: cifar10' needs 'data.dir': the folder with CIFAR-10's binary files (data_batch_1.bin .. "
           "data_batch_5.bin, test_batch.bin)");
    return;
  }
  if (data.text_file.empty() && data.train_bin.empty()) {
    fail(source_, std::string(empty_document_ ? "the config is empty (no keys, only comments or blank lines): " : "") +
                      "no training data: set 'data.text_file' (a text file) or 'data.train_bin' (token shards); "
                      "examples/configs/ has complete configs");
  }
  if (!data.train_bin.empty() && data.tokenizer == "char" && was_set("data.tokenizer")) {
    fail(where_set({"data.tokenizer"}),
         "'data.tokenizer: char' cannot read 'data.train_bin': token shards hold GPT-2 tokens (a char vocabulary is "
         "made from 'data.text_file'); drop data.tokenizer or set it to gpt2");
  }
  if (!data.text_file.empty() && !data.train_bin.empty()) {
    fail(where_set({"data.train_bin"}), "'data.text_file' and 'data.train_bin' are both set; set exactly one");
  }
  if (!data.val_bin.empty() && data.train_bin.empty()) {
    fail(where_set({"data.val_bin"}),
         "'data.val_bin' needs 'data.train_bin' (with 'data.text_file' the validation split is the last "
         "'data.val_fraction' of the text)");
  }
}

// Token shards are GPT-2 tokens, whatever the default tokenizer: the resolved config says so.
void ConfigReader::resolve_data() {
  if (!config_.data.train_bin.empty()) config_.data.tokenizer = "gpt2";
}

void ConfigReader::resolve_batch() {
  BatchConfig& batch = config_.batch;
  if (batch.tokens_per_step == 0) return;
  if (batch.grad_accum != 1) {
    fail(where_set({"batch.grad_accum"}), "'batch.tokens_per_step' and 'batch.grad_accum' (" +
                                              std::to_string(batch.grad_accum) +
                                              ") are both set; set one (tokens_per_step sets grad_accum)");
  }
  int64_t micro_tokens = batch.micro_batch * batch.seq_len;
  if (batch.tokens_per_step % micro_tokens != 0) {
    fail(where_set({"batch.tokens_per_step"}),
         "'batch.tokens_per_step' (" + std::to_string(batch.tokens_per_step) +
             ") must be a multiple of micro_batch * seq_len = " + std::to_string(batch.micro_batch) + " * " +
             std::to_string(batch.seq_len) + " = " + std::to_string(micro_tokens));
  }
  batch.grad_accum = batch.tokens_per_step / micro_tokens;
}

// A trace of a step the run never reaches would silently write nothing.
void ConfigReader::check_profile() const {
  const ProfileConfig& profile = config_.profile;
  const int64_t last = profile.trace_step + profile.trace_steps - 1;
  if (profile.trace.empty() || last <= config_.max_steps) return;
  if (profile.trace_steps == 1)
    fail(where_set({"profile.trace_step", "max_steps", "profile.trace"}),
         "'profile.trace_step' (" + std::to_string(profile.trace_step) + ") must be <= 'max_steps' (" +
             std::to_string(config_.max_steps) + ") so that the traced step runs");
  fail(where_set({"profile.trace_step", "profile.trace_steps", "max_steps", "profile.trace"}),
       "the traced steps " + std::to_string(profile.trace_step) + " to " + std::to_string(last) +
           " ('profile.trace_step' and 'profile.trace_steps') must end by 'max_steps' (" +
           std::to_string(config_.max_steps) + ") so that they all run");
}

void ConfigReader::check_distributed() const {
  const DistributedConfig& d = config_.distributed;
  // fused_gather: auto gives way quietly, without ZeRO-1 and to gather_overlap.
  const bool fused_asked = d.fused_gather == FusedGather::on;
  for (const auto& [key, on] : {std::pair<const char*, bool>{"distributed.gather_overlap", d.gather_overlap},
                                {"distributed.fused_gather", fused_asked}}) {
    if (!on || d.zero == 1) continue;
    fail(where_set({key, "distributed.zero"}), std::string("'") + key +
                                                   "' changes how ZeRO-1 gathers its parameters, but "
                                                   "'distributed.zero' is " +
                                                   std::to_string(d.zero) +
                                                   ": plain DDP gathers nothing; set distributed.zero=1 or drop it");
  }
  if (d.gather_overlap && fused_asked)
    fail(where_set({"distributed.gather_overlap", "distributed.fused_gather"}),
         "'distributed.fused_gather' writes the parameters during the optimizer, so there is no all-gather left to "
         "run behind the next forward ('distributed.gather_overlap'); set one of them");
}

void ConfigReader::resolve_schedule() {
  const ScheduleConfig& schedule = config_.schedule;
  if (schedule.kind == "cosine" && schedule.min_lr > config_.optimizer.lr) {
    fail(where_set({"schedule.min_lr", "optimizer.lr"}),
         "'schedule.min_lr' (" + detail::concat(schedule.min_lr) + (was_set("schedule.min_lr") ? "" : ", the default") +
             ") is above 'optimizer.lr' (" + detail::concat(config_.optimizer.lr) +
             "): the cosine schedule decays from lr down to min_lr; set min_lr at most lr (lr / 10 is usual)");
  }
  ScheduleConfig& s = config_.schedule;
  s.decay_steps_from_max_steps = s.decay_steps == -1;
  if (s.decay_steps_from_max_steps) s.decay_steps = config_.max_steps;
}

void ConfigReader::check_checkpoint() const {
  if (config_.checkpoint.resume && config_.checkpoint.overwrite) {
    fail(where_set({"checkpoint.overwrite", "checkpoint.resume"}),
         "'checkpoint.resume' and 'checkpoint.overwrite' are both true: resume continues the run in the folder, "
         "overwrite deletes its checkpoints; set one");
  }
}

// Runs after every value is in, so the order of keys in the file never matters.
void ConfigReader::finish() {
  apply_preset();
  resolve_init_from();
  resolve_precision();
  check_model();
  check_data();
  resolve_data();
  resolve_batch();
  resolve_schedule();
  check_profile();
  check_checkpoint();
  check_distributed();
}

// YAML is Unicode text, and yaml-cpp 0.7 can loop forever on bytes that are not UTF-8 (the
// fuzzer found ",\xff\xff": tests/fuzz/repro/config): such a file is an error before it is parsed.
// So is a control character other than tab and line breaks, which YAML does not allow either:
// yaml-cpp reads a NUL followed by '_' in a plain scalar as the lone byte 0xa0, a value that is
// not UTF-8 (the fuzzer again).
void check_utf8(const std::string& text, const std::string& source_name) {
  int64_t line = 1, column = 1;
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char c = decode_utf8(text, pos);
    const bool not_utf8 = c.code_point == 0xFFFD && c.length == 1;
    const bool control = (c.code_point < 0x20 && c.code_point != '\t' && c.code_point != '\n') || c.code_point == 0x7F;
    if (not_utf8 || control) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[pos]));
      fail(source_name + ":" + std::to_string(line) + ":" + std::to_string(column),
           not_utf8 ? std::string("the file is not UTF-8 text (byte ") + byte + "); save it as UTF-8"
                    : std::string("the file holds a control character (byte ") + byte +
                          "), which YAML does not allow; remove it");
    }
    if (text[pos] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    pos += c.length;
  }
}

// The line where a second YAML document starts, or 0: a "---" at the start of a line after
// content (before any, it opens the first document), or content after a "..." end marker.
// Found in the text because yaml-cpp 0.7's LoadAll can loop forever (on "," for one).
int64_t second_document_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  bool content = false, ended = false;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    auto marker = [&](const char* m) {
      return line.compare(0, 3, m) == 0 && (line.size() == 3 || std::isspace(static_cast<unsigned char>(line[3])));
    };
    const bool start = marker("---"), end = marker("...");
    const std::string body = start || end ? line.substr(3) : line;
    const size_t first = body.find_first_not_of(" \t\r");
    const bool directive = !start && !end && !line.empty() && line[0] == '%';
    const bool has_content = first != std::string::npos && body[first] != '#' && !directive;
    if (start && (content || ended)) return number;
    if (end) {
      ended = true;
    } else if (has_content) {
      if (ended) return number;
      content = true;
    }
  }
  return 0;
}

// YAML's line breaks are LF, CR LF and a lone CR (YAML 1.2, 5.4). yaml-cpp keeps a lone CR
// (a last line saved with a Windows or old Mac ending and no LF after it) inside the scalar
// before it, so a value would end in an invisible "\r", and the config written back would not
// read back the same. All three become LF first.
std::string with_lf_line_breaks(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\r') {
      out += text[i];
      continue;
    }
    out += '\n';
    if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
  }
  return out;
}

YAML::Node parse_yaml(const std::string& raw_text, const std::string& source_name) {
  const std::string yaml_text = with_lf_line_breaks(raw_text);
  check_utf8(yaml_text, source_name);
  if (const int64_t line = second_document_line(yaml_text)) {
    fail(source_name + ":" + std::to_string(line) + ":1",
         "a second YAML document starts here; a config is one document: merge them or remove the '---'");
  }
  try {
    return YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    fail(position(source_name, e.mark), "invalid YAML: " + e.msg);
  } catch (const YAML::Exception& e) {
    fail(source_name, std::string("invalid YAML: ") + e.what());
  }
}

std::string read_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) PRECIS_FAIL("cannot read config file '", path, "': ", std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  size_t count = 0;
  while ((count = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) text.append(buffer, count);
  // A directory opens fine on Linux and fails only here, with EISDIR.
  if (std::ferror(file.get())) PRECIS_FAIL("cannot read config file '", path, "': ", std::strerror(errno));
  return text;
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                         const std::string& source_name) {
  YAML::Node root = parse_yaml(yaml_text, source_name);
  TrainConfig config;
  ConfigReader reader(config, source_name);
  reader.read_document(root);
  for (const std::string& override_text : overrides) reader.apply_override(override_text);
  reader.finish();
  return config;
}

std::string resolved_config_yaml(const TrainConfig& config) {
  TrainConfig copy = config;
  YAML::Node root(YAML::NodeType::Map);
  for (const Field& field : make_fields(copy)) {
    std::string value = field.get();
    // A refined policy's name ends in "*" (not a policy name); its refining keys are written too.
    if (field.key == "precision.policy" && value.ends_with("*")) value.pop_back();
    // tokens_per_step sets grad_accum: writing both would be a contradiction.
    if (field.key == "batch.grad_accum" && config.batch.tokens_per_step > 0) continue;
    if (of_another_task(field.key, config.task)) continue;
    const size_t dot = field.key.find('.');
    if (dot == std::string::npos) {
      root[field.key] = value;
    } else {
      root[field.key.substr(0, dot)][field.key.substr(dot + 1)] = value;
    }
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  TrainConfig config = parse_config(read_file(path), overrides, path);
  config.config_path = path;
  return config;
}

}  // namespace precis::train
