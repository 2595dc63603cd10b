#include "train/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "core/error.h"
#include "core/json.h"
#include "train/checkpoint.h"

namespace precis::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = "run.lock";

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("?");
}

std::string read_all(int fd) {
  std::string text;
  char buffer[256];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The first free "path.N".
fs::path free_numbered_name(const fs::path& path) {
  for (int n = 1;; ++n) {
    fs::path candidate = path.string() + "." + std::to_string(n);
    std::error_code ec;
    if (!fs::exists(candidate, ec)) return candidate;
  }
}

bool nonempty_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && fs::file_size(path, ec) > 0;
}

}  // namespace

RunLock::RunLock(const std::string& out_dir) {
  const std::string path = (fs::path(out_dir) / kLockFile).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  PRECIS_CHECK(fd_ >= 0, "cannot create the run lock '", path, "': ", std::strerror(errno),
               "; check that out_dir is writable");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = error == EWOULDBLOCK ? read_all(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    PRECIS_CHECK(error != EWOULDBLOCK, "out_dir '", out_dir, "' is in use by another run (",
                 holder.empty() ? std::string("holder unknown") : holder, ", per ", path,
                 "); two runs in one folder would mix their checkpoints and metrics. Wait for it to end, stop it, "
                 "or give this run another out_dir");
    PRECIS_FAIL("cannot lock '", path, "': ", std::strerror(error));
  }
  const std::string owner = detail::concat("pid ", ::getpid(), " on ", host_name(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, owner.data(), owner.size(), 0) != static_cast<ssize_t>(owner.size()))
    PRECIS_FAIL("cannot write the run lock '", path, "': ", std::strerror(errno));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

void prepare_run_folder(const TrainConfig& config) {
  const CheckpointConfig& c = config.checkpoint;
  if (c.resume) return;  // the logs are trimmed to the restored step when the run starts
  if (has_checkpoint(c.dir)) {
    PRECIS_CHECK(c.overwrite, "out_dir '", config.out_dir,
                 "' already holds the checkpoints of a run (newest: ", resolve_checkpoint(c.dir),
                 "); set checkpoint.resume=true to continue that run, checkpoint.overwrite=true to delete its "
                 "checkpoints and start over, or give this run another out_dir");
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(c.dir)) {
      const std::string name = entry.path().filename().string();
      if (name == "latest" || name.starts_with("step_")) fs::remove_all(entry.path(), ec);
      PRECIS_CHECK(!ec, "checkpoint.overwrite: cannot delete '", entry.path().string(), "': ", ec.message());
    }
  }
  for (const char* file : kRunLogFiles) {
    const fs::path path = fs::path(config.out_dir) / file;
    if (!nonempty_file(path)) continue;
    if (c.overwrite) {  // starting over was asked for: the old run's logs go with its checkpoints
      std::error_code ec;
      fs::remove(path, ec);
      PRECIS_CHECK(!ec, "checkpoint.overwrite: cannot delete '", path.string(), "': ", ec.message());
      continue;
    }
    const fs::path aside = free_numbered_name(path);
    std::error_code ec;
    fs::rename(path, aside, ec);
    PRECIS_CHECK(!ec, "cannot move the previous run's '", path.string(), "' aside to '", aside.string(),
                 "': ", ec.message());
    std::cerr << "note: the previous run's " << file << " was moved to " << aside.string() << "\n";
  }
}

namespace {

void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    PRECIS_CHECK(out, "cannot write '", tmp, "' (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  PRECIS_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace

void save_resolved_config(const TrainConfig& config) {
  replace_file((fs::path(config.out_dir) / "resolved_config.yaml").string(),
               "# The resolved config of this run: every key, with the defaults, presets and overrides applied.\n" +
                   resolved_config_yaml(config));
}

void drop_rows_after_step(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  bool changed = false;
  while (std::getline(in, line)) {
    bool keep = false;
    try {
      Json row = Json::parse(line);
      keep = row.is_object() && (!row.contains("step") || row.at("step").as_int() <= step);
    } catch (const Error&) {
      keep = false;  // a torn line
    }
    if (keep) {
      kept += line + "\n";
    } else {
      changed = true;
    }
  }
  if (changed) replace_file(path, kept);
}

}  // namespace precis::train
