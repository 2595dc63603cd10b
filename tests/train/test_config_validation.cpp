// Config mistakes a hostile but fair user makes (issue 16): each is an error naming the key,
// the text and what to do, before anything runs.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/errors.h"
#include "support/tiny_run.h"
#include "train/config.h"
#include "train/trainer.h"

using namespace precis;
using namespace precis::train;
using precis::testing::error_of;
namespace fs = std::filesystem;

namespace {

const std::string kData = "data:\n  text_file: assets/tinyshakespeare.txt\n";

std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(text, overrides, "config.yaml"); });
}

}  // namespace

TEST(ConfigValidation, SizesHaveCeilings) {
  EXPECT_EQ(parse_error(kData, {"threads=100000"}),
            "override 'threads=100000': 'threads' must be in [0, 4096], got 100000");
  EXPECT_EQ(parse_error(kData, {"model.n_layer=1000000"}),
            "override 'model.n_layer=1000000': 'model.n_layer' must be in [1, 1024], got 1000000");
  EXPECT_EQ(parse_error(kData, {"sample.tokens=1000000000"}),
            "override 'sample.tokens=1000000000': 'sample.tokens' must be in [0, 1000000], got 1000000000");
}

TEST(ConfigValidation, NumbersNameTheKeyAndTheText) {
  EXPECT_EQ(parse_error(kData, {"max_steps=1e9"}),
            "override 'max_steps=1e9': 'max_steps' must be an integer, got '1e9'");
  EXPECT_EQ(parse_error(kData + "optimizer: {lr: fast}\n"),
            "config.yaml:3:17: 'optimizer.lr' must be a number, got 'fast'");
  EXPECT_EQ(parse_error(kData, {"on_nonfinite=ignore"}),
            "override 'on_nonfinite=ignore': 'on_nonfinite' must be one of stop, skip, got 'ignore'");
  EXPECT_EQ(parse_error(kData, {"max_nonfinite_steps=0"}),
            "override 'max_nonfinite_steps=0': 'max_nonfinite_steps' must be >= 1, got 0");
}

TEST(ConfigValidation, ASecondYamlDocumentIsAnError) {
  const std::string second =
      "a second YAML document starts here; a config is one document: merge them or remove the '---'";
  EXPECT_EQ(parse_error(kData + "---\nmax_steps: 5\n"), "config.yaml:3:1: " + second);
  EXPECT_EQ(parse_error(kData + "...\nmax_steps: 5\n"), "config.yaml:4:1: " + second);
  EXPECT_EQ(parse_error("# c\n--- # first\n" + kData + "--- {}\n"), "config.yaml:5:1: " + second);
  // A "---" that opens the only document, and one inside a string, are fine.
  EXPECT_EQ(parse_config("%YAML 1.2\n---\n" + kData + "...\n# end\n").data.text_file, "assets/tinyshakespeare.txt");
  EXPECT_EQ(parse_config(kData + "sample: {prompt: \"a\n  --- b\"}\n").sample.prompt, "a --- b");
}

// Found by the fuzzer: yaml-cpp loops forever on some bytes that are not UTF-8.
TEST(ConfigValidation, TextThatIsNotUtf8IsAnErrorBeforeParsing) {
  EXPECT_EQ(parse_error(",\xff\xff"), "config.yaml:1:2: the file is not UTF-8 text (byte 0xff); save it as UTF-8");
  EXPECT_EQ(parse_error(kData + "sample: {prompt: caf\xe9}\n"),
            "config.yaml:3:21: the file is not UTF-8 text (byte 0xe9); save it as UTF-8");
  EXPECT_EQ(parse_config(kData + "sample: {prompt: \"caf\xc3\xa9 \xe2\x80\x94\"}\n").sample.prompt,
            "caf\xc3\xa9 \xe2\x80\x94");
}

// Found by the fuzzer: yaml-cpp reads a NUL followed by '_' as the byte 0xa0, so the config
// accepted a path that is not UTF-8 and its resolved YAML did not read back.
TEST(ConfigValidation, ControlCharactersAreAnErrorBeforeParsing) {
  EXPECT_EQ(parse_error(kData + std::string("out_dir: out/a\0_b\n", 18)),
            "config.yaml:3:15: the file holds a control character (byte 0x00), which YAML does not allow; remove it");
  EXPECT_EQ(parse_error(kData + "out_dir: out\x07\n"),
            "config.yaml:3:13: the file holds a control character (byte 0x07), which YAML does not allow; remove it");
  EXPECT_EQ(parse_config(kData + "sample: {prompt: \"a\tb\"}\r\nout_dir: out\r\n").sample.prompt, "a\tb");
}

TEST(ConfigValidation, AnEmptyConfigSaysItIsEmpty) {
  for (const char* text : {"", "# only a comment\n\n"}) {
    const std::string message = parse_error(text);
    EXPECT_NE(message.find("config.yaml: the config is empty"), std::string::npos) << message;
    EXPECT_NE(message.find("data.text_file"), std::string::npos) << message;
  }
  // Given only on the command line, the data is enough.
  EXPECT_EQ(parse_config("", {"data.text_file=assets/tinyshakespeare.txt"}).data.text_file,
            "assets/tinyshakespeare.txt");
}

TEST(ConfigValidation, ContradictionsAreErrors) {
  EXPECT_EQ(parse_error("data: {train_bin: shards/*.bin, tokenizer: char}\n"),
            "config.yaml:1:44: 'data.tokenizer: char' cannot read 'data.train_bin': token shards hold GPT-2 tokens (a "
            "char vocabulary is made from 'data.text_file'); drop data.tokenizer or set it to gpt2");
  EXPECT_EQ(parse_config("data: {train_bin: shards/*.bin, tokenizer: gpt2}\n").data.tokenizer, "gpt2");

  EXPECT_EQ(parse_error(kData + "optimizer: {lr: 1.0e-4}\nschedule: {min_lr: 1.0e-3}\n"),
            "config.yaml:4:20: 'schedule.min_lr' (0.001) is above 'optimizer.lr' (0.0001): the cosine schedule decays "
            "from lr down to min_lr; set min_lr at most lr (lr / 10 is usual)");
  EXPECT_NE(parse_error(kData, {"optimizer.lr=1e-5"}).find("'schedule.min_lr' (6e-05, the default) is above"),
            std::string::npos);
  EXPECT_EQ(parse_config(kData + "optimizer: {lr: 1.0e-5}\nschedule: {kind: constant}\n").optimizer.lr, 1e-5)
      << "a constant schedule has no min_lr to contradict";

  EXPECT_NE(parse_error(kData, {"checkpoint.resume=true", "checkpoint.overwrite=true"})
                .find("'checkpoint.resume' and 'checkpoint.overwrite' are both true"),
            std::string::npos);
}

// Resuming with another optimizer (or another parameter storage) is refused before anything
// is loaded, naming the setting, both values and the way out.
TEST(ConfigValidation, AResumeThatWouldBreakTheOptimizerStateIsRefused) {
  const fs::path dir = precis::testing::empty_temp_dir("config_validation_resume");
  std::vector<std::string> overrides = {"max_steps=2"};
  Trainer(precis::testing::tiny_run(dir, overrides)).run();
  overrides.push_back("checkpoint.resume=true");
  overrides.push_back("max_steps=3");
  std::vector<std::string> sgd = overrides;
  sgd.push_back("optimizer.name=sgd");
  const std::string message = error_of([&] { Trainer(precis::testing::tiny_run(dir, sgd)).run(); });
  EXPECT_NE(message.find("step_00000002 was written with optimizer.name adamw, but this config has sgd"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("checkpoint.overwrite=true"), std::string::npos) << message;
  std::vector<std::string> bf16 = overrides;
  bf16.push_back("precision=bf16-pure");
  EXPECT_NE(error_of([&] { Trainer(precis::testing::tiny_run(dir, bf16)).run(); }).find("precision.params float32"),
            std::string::npos);
  Trainer same(precis::testing::tiny_run(dir, overrides));
  same.run();
  EXPECT_EQ(same.losses().size(), 1u) << "the unchanged config resumes";
}
