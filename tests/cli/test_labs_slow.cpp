// Every lab of docs/labs/ run at LAB_SIZE=tiny on the CPU (scripts/labs/NN-name.sh with the
// built precis), so none of them rots: the tables have their rows and the SVG plots are
// well-formed XML with what they should draw.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "core/source_dir.h"
#include "support/cli.h"

namespace {

namespace fs = std::filesystem;

// Runs lab `name` into a fresh folder and returns the folder.
fs::path run_lab(const std::string& name) {
  const fs::path out = fs::temp_directory_path() / ("precis_lab_" + name);
  fs::remove_all(out);
  const auto r = precis::testing::run_command("LAB_SIZE=tiny PRECIS=" + std::string(PRECIS_CLI_PATH) + " bash " +
                                              PRECIS_SOURCE_DIR + "/scripts/labs/" + name + ".sh " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return out;
}

// Whether `text` is well-formed XML as far as an SVG needs: every tag closed in order,
// attributes quoted, one root element.
bool well_formed(const std::string& text, std::string* why) {
  std::vector<std::string> open;
  int roots = 0;
  for (size_t at = text.find('<'); at != std::string::npos; at = text.find('<', at + 1)) {
    if (text.compare(at, 2, "<?") == 0 || text.compare(at, 4, "<!--") == 0) {
      at = text.find(text.compare(at, 2, "<?") == 0 ? "?>" : "-->", at);
      if (at == std::string::npos) return *why = "an unclosed declaration or comment", false;
      continue;
    }
    // The tag's end: the first '>' outside quotes.
    size_t end = at + 1;
    char quote = 0;
    for (; end < text.size() && (quote || text[end] != '>'); ++end)
      if (text[end] == '"' || text[end] == '\'') quote = quote == text[end] ? 0 : quote ? quote : text[end];
    if (end >= text.size()) return *why = "a tag without '>'", false;
    std::string tag = text.substr(at + 1, end - at - 1);
    if (tag.empty()) return *why = "an empty tag", false;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return *why = "</" + name + "> closes nothing open", false;
      open.pop_back();
    } else {
      const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
      if (open.empty() && roots++ > 0) return *why = "more than one root element", false;
      if (tag.back() != '/') open.push_back(name);
    }
    at = end;
  }
  if (!open.empty()) return *why = "<" + open.back() + "> is never closed", false;
  return roots == 1 || (*why = "no root element", false);
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The SVG at `path` parses, and draws at least `lines` polylines and `points` points.
void expect_svg(const fs::path& path, size_t lines = 1, size_t points = 0) {
  const std::string svg = precis::testing::read_text_file(path);
  std::string why;
  EXPECT_TRUE(well_formed(svg, &why)) << path << ": " << why;
  EXPECT_NE(svg.find("<svg"), std::string::npos) << path;
  EXPECT_GE(count(svg, "<polyline"), lines) << path;
  EXPECT_GE(count(svg, "class=\"point\""), points) << path;
}

// `table` has a row whose first cell is each of `first_cells`.
void expect_rows(const std::string& table, const std::vector<std::string>& first_cells) {
  for (const std::string& cell : first_cells)
    EXPECT_NE(table.find("\n| " + cell + " |"), std::string::npos) << "no row '" << cell << "' in\n" << table;
}

TEST(LabsSlow, WellFormedCheckerRejectsBrokenXml) {
  std::string why;
  EXPECT_TRUE(well_formed("<?xml version=\"1.0\"?>\n<svg a=\"x>y\"><g><line/></g></svg>\n", &why)) << why;
  EXPECT_FALSE(well_formed("<svg><g></svg>", &why));
  EXPECT_FALSE(well_formed("<svg><g></g>", &why));
  EXPECT_FALSE(well_formed("<svg></svg><svg></svg>", &why));
}

TEST(LabsSlow, Formats) {
  const fs::path out = run_lab("01-formats");
  const std::string md = precis::testing::read_text_file(out / "formats.md");
  expect_rows(md, {"fp32", "tf32", "fp16", "bf16", "fp8 e4m3", "fp8 e5m2"});
  for (const char* value : {"## 3.14159", "## 1e-08", "## 65504", "## 70000", "## 57344"})
    EXPECT_NE(md.find(value), std::string::npos) << value;
  EXPECT_NE(md.find("0x7BFF"), std::string::npos);  // 65504 in fp16
  expect_svg(out / "formats.svg", 6);
}

TEST(LabsSlow, LossScaling) {
  const fs::path out = run_lab("02-loss-scaling");
  expect_rows(precis::testing::read_text_file(out / "loss-scaling.md"),
              {"fp32", "fp16-none", "fp16-static", "fp16-dynamic", "bf16-pure"});
  expect_svg(out / "loss-scaling.svg", 5);
  expect_svg(out / "numerics.svg", 4 * 5);  // four panels, a line per run
  EXPECT_TRUE(fs::exists(out / "loss-scaling.csv"));
}

TEST(LabsSlow, TensorCores) {
  const fs::path out = run_lab("03-tensor-cores");
  const std::string md = precis::testing::read_text_file(out / "matmul.md");
  expect_rows(md, {"tiny", "gpt2-b1"});
  EXPECT_EQ(count(md, "\n| tiny |"), 2u);  // fp32 and bf16
  expect_svg(out / "roofline.svg", 2, 4);  // a roof per dtype, a point per product
}

TEST(LabsSlow, Attention) {
  const fs::path out = run_lab("04-attention");
  for (const char* sweep : {"seq", "batch"}) {
    const std::string md = precis::testing::read_text_file(out / sweep / "attention.md");
    EXPECT_NE(md.find("| time slope"), std::string::npos) << md;
    expect_rows(md, {std::string(sweep) == "seq" ? "64" : "32"});
    expect_svg(out / sweep / "attention-time.svg");
    expect_svg(out / sweep / "attention-memory.svg");
  }
}

TEST(LabsSlow, Ladder) {
  const fs::path out = run_lab("05-ladder");
  expect_rows(precis::testing::read_text_file(out / "ladder.md"),
              {"1-fp32-reference", "2-tf32", "3-bf16", "4-flash", "5-fused-classifier", "6-cuda-graphs"});
  expect_svg(out / "ladder.svg", 6);
  expect_svg(out / "1-fp32-reference" / "roofline.svg", 1, 1);
}

TEST(LabsSlow, CnnAndDdp) {
  const fs::path out = run_lab("06-cnn-ddp");
  expect_rows(precis::testing::read_text_file(out / "cnn" / "sweep.md"), {"fp32", "fp16", "bf16", "bf16-pure"});
  expect_svg(out / "cnn" / "sweep.svg", 4);
#ifdef PRECIS_MPIEXEC
  expect_rows(precis::testing::read_text_file(out / "ddp-buckets.md"), {"1", "25"});
  expect_svg(out / "ddp-buckets.svg", 2);
#else
  EXPECT_TRUE(fs::exists(out / "ddp-buckets.md"));  // says why it skipped
#endif
}

}  // namespace
