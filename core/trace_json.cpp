#include "core/trace_json.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace precis {

namespace {

Json metadata(const char* kind, int pid, int tid, const std::string& name) {
  Json event = Json::object();
  event["name"] = kind;
  event["ph"] = "M";
  event["pid"] = pid;
  event["tid"] = tid;
  event["args"]["name"] = name;
  return event;
}

// Opens `path` for writing, or fails with the reason.
std::FILE* open_for_writing(const std::string& path, const char* mode, const std::string& setting) {
  std::FILE* file = std::fopen(path.c_str(), mode);
  PRECIS_CHECK(file, "cannot write ", setting, " '", path, "': ", std::strerror(errno));
  return file;
}

}  // namespace

Json chrome_trace(const std::vector<TraceTrack>& tracks, const std::vector<TraceEvent>& events, const Json& other) {
  Json list = Json::array();
  for (const TraceTrack& track : tracks) {
    list.push_back(metadata("process_name", track.pid, track.tid, track.process_name));
    list.push_back(metadata("thread_name", track.pid, track.tid, track.thread_name));
  }
  for (const TraceEvent& e : events) {
    Json event = Json::object();
    event["name"] = e.name;
    event["cat"] = e.category;
    event["ph"] = "X";
    event["pid"] = e.pid;
    event["tid"] = e.tid;
    event["ts"] = e.start_us;
    event["dur"] = e.duration_us;
    if (e.args.size() > 0) event["args"] = e.args;
    list.push_back(std::move(event));
  }
  Json trace = Json::object();
  trace["traceEvents"] = std::move(list);
  trace["displayTimeUnit"] = "ms";
  if (other.size() > 0) trace["otherData"] = other;
  return trace;
}

void write_chrome_trace(const std::string& path, const std::vector<TraceTrack>& tracks,
                        const std::vector<TraceEvent>& events, const Json& other) {
  std::string text = chrome_trace(tracks, events, other).dump();
  std::FILE* file = open_for_writing(path, "wb", "trace");
  bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  bool closed = std::fclose(file) == 0;
  PRECIS_CHECK(written && closed, "cannot write trace '", path, "': ", std::strerror(errno));
}

void check_writable(const std::string& path, const std::string& setting) {
  PRECIS_CHECK(!path.empty(), setting, " is empty; give a file name such as trace.json");
  bool existed = std::filesystem::exists(path);
  PRECIS_CHECK(!std::filesystem::is_directory(path), "cannot write ", setting, " '", path, "': it is a directory");
  std::fclose(open_for_writing(path, "ab", setting));  // "a": an existing file is left as it is
  if (!existed) std::filesystem::remove(path);
}

}  // namespace precis
