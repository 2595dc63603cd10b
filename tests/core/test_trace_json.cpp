// Chrome/Perfetto trace files: the document read back with the JSON parser has
// the tracks' names and each event's place and times, in microseconds.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/json.h"
#include "core/trace_json.h"
#include "support/errors.h"

using namespace precis;
namespace fs = std::filesystem;

namespace {

const Json* find_event(const Json& events, const std::string& ph, const std::string& name) {
  for (const Json& e : events.as_array())
    if (e.at("ph").as_string() == ph && e.at("name").as_string() == name) return &e;
  return nullptr;
}

}  // namespace

TEST(TraceJson, WritesCompleteEventsAndTrackNames) {
  fs::path path = fs::temp_directory_path() / "precis_trace_json_test.json";
  TraceEvent memcpy_event{"Memcpy HtoD", "memcpy", 1, 7, 1.25, 0.5};
  memcpy_event.args["bytes"] = int64_t{65536};
  write_chrome_trace(path.string(), {{0, 0, "CPU", "phases (host)"}, {1, 7, "GPU cuda:0", "stream 7"}},
                     {{"forward", "phase", 0, 0, 10.5, 2000.0}, memcpy_event});

  Json trace = read_json_file(path.string());
  const Json& events = trace.at("traceEvents");
  ASSERT_EQ(events.size(), 6u);  // 2 tracks x (process name, thread name) + 2 events

  const Json* thread = find_event(events, "M", "thread_name");
  ASSERT_NE(thread, nullptr);
  EXPECT_EQ(thread->at("args").at("name").as_string(), "phases (host)");

  const Json* forward = find_event(events, "X", "forward");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->at("cat").as_string(), "phase");
  EXPECT_EQ(forward->at("pid").as_int(), 0);
  EXPECT_DOUBLE_EQ(forward->at("ts").as_double(), 10.5);
  EXPECT_DOUBLE_EQ(forward->at("dur").as_double(), 2000.0);
  EXPECT_FALSE(forward->contains("args"));

  const Json* copy = find_event(events, "X", "Memcpy HtoD");
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->at("tid").as_int(), 7);
  EXPECT_EQ(copy->at("args").at("bytes").as_int(), 65536);
  EXPECT_FALSE(trace.contains("otherData"));  // nothing about the whole trace was given
  fs::remove(path);
}

TEST(TraceJson, FactsAboutTheWholeTraceGoToOtherData) {
  fs::path path = fs::temp_directory_path() / "precis_trace_json_other.json";
  Json other = Json::object();
  other["origin_steady_ns"] = int64_t{1234567890123456789};  // past a double's exact integers
  write_chrome_trace(path.string(), {}, {}, other);
  Json trace = read_json_file(path.string());
  EXPECT_EQ(trace.at("otherData").at("origin_steady_ns").as_int(), int64_t{1234567890123456789});
  EXPECT_EQ(trace.at("traceEvents").size(), 0u);
  fs::remove(path);
}

TEST(TraceJson, UnwritablePathIsAClearError) {
  precis::testing::expect_error([] { write_chrome_trace("/no-such-dir/trace.json", {}, {}); },
                                "cannot write trace '/no-such-dir/trace.json': No such file or directory");
  precis::testing::expect_error([] { check_writable("/no-such-dir/trace.json", "profile.trace"); },
                                "cannot write profile.trace '/no-such-dir/trace.json'");
  precis::testing::expect_error([] { check_writable(fs::temp_directory_path().string(), "profile.trace"); },
                                "it is a directory");
}

TEST(TraceJson, CheckWritableLeavesNoFileAndKeepsAnExistingOne) {
  fs::path path = fs::temp_directory_path() / "precis_trace_writable.json";
  fs::remove(path);
  check_writable(path.string(), "profile.trace");
  EXPECT_FALSE(fs::exists(path));
  write_chrome_trace(path.string(), {}, {});
  auto size = fs::file_size(path);
  check_writable(path.string(), "profile.trace");
  EXPECT_EQ(fs::file_size(path), size);
  fs::remove(path);
}
