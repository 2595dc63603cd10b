// Chrome/Perfetto trace files: the JSON "traceEvents" format that
// chrome://tracing and ui.perfetto.dev open. Each event is a complete ("X")
// event with a start and a duration in microseconds on one track; a track is a
// (process, thread) pair, named by "M" metadata events so that the viewer
// shows "CPU phases" or "GPU stream 7" instead of bare numbers.
#pragma once

#include <string>
#include <vector>

#include "core/json.h"

namespace precis {

struct TraceTrack {
  int pid = 0;
  int tid = 0;
  std::string process_name;
  std::string thread_name;
};

struct TraceEvent {
  std::string name;
  std::string category;  // "phase", "kernel", "memcpy", ...
  int pid = 0;
  int tid = 0;
  double start_us = 0;
  double duration_us = 0;
  Json args = Json::object();  // shown in the viewer's details pane
};

// The whole trace document: {"traceEvents": [...], "displayTimeUnit": "ms"}, and
// {"otherData": other} where `other` holds anything (the format's place for facts about
// the whole trace, such as where its time 0 lies on a clock other traces share).
Json chrome_trace(const std::vector<TraceTrack>& tracks, const std::vector<TraceEvent>& events,
                  const Json& other = Json::object());
// Writes chrome_trace(...) to `path`; an unwritable path is an error naming it.
void write_chrome_trace(const std::string& path, const std::vector<TraceTrack>& tracks,
                        const std::vector<TraceEvent>& events, const Json& other = Json::object());
// Fails now, with `setting` in the message, if `path` cannot be written, so a
// long run does not find out only at the end. Leaves no file behind.
void check_writable(const std::string& path, const std::string& setting);

}  // namespace precis
