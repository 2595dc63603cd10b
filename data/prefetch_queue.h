// PrefetchQueue: a background thread that keeps up to `depth` batches ready, for the
// datasets (token windows, images). A dataset is a cursor into a deterministic stream
// of batches plus a function that makes the batch at a cursor and advances it; the
// queue runs that function ahead on its own thread and hands the batches out in order,
// each with the cursor after it, so the dataset's position is exact whatever the
// thread has prepared. A failure while preparing is rethrown by take(), every time
// (the thread stops at it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace precis {

template <typename Batch, typename Cursor>
class PrefetchQueue {
 public:
  // make(cursor): the batch at `cursor`, with `cursor` moved past it. Called on the thread.
  using Make = std::function<Batch(Cursor&)>;

  PrefetchQueue(Make make, int64_t depth) : make_(std::move(make)), depth_(depth) {}
  ~PrefetchQueue() { stop(); }
  PrefetchQueue(const PrefetchQueue&) = delete;
  PrefetchQueue& operator=(const PrefetchQueue&) = delete;

  // Starts preparing the batches from `at` on (stop() first when running).
  void start(Cursor at) {
    stop();
    at_ = at;
    stop_ = false;
    thread_ = std::thread([this] { loop(); });
  }

  // Stops the thread and drops what it prepared.
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    space_.notify_all();
    thread_.join();
    queue_.clear();
  }

  // The next batch and the cursor after it; waits for the thread when none is ready.
  std::pair<Batch, Cursor> take() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !queue_.empty(); });
    if (queue_.front().error) std::rethrow_exception(queue_.front().error);
    Prepared prepared = std::move(queue_.front());
    queue_.pop_front();
    space_.notify_one();
    return {std::move(prepared.batch), prepared.after};
  }

 private:
  struct Prepared {
    Batch batch;
    Cursor after;              // the cursor once this batch is taken
    std::exception_ptr error;  // set instead of a batch when preparing failed
  };

  void loop() {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        space_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < depth_; });
        if (stop_) return;
      }
      Prepared prepared;
      try {
        prepared.batch = make_(at_);
        prepared.after = at_;
      } catch (...) {
        prepared.error = std::current_exception();
      }
      const bool failed = prepared.error != nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(std::move(prepared));
      }
      ready_.notify_one();
      if (failed) return;
    }
  }

  Make make_;
  int64_t depth_;
  Cursor at_;  // where the thread's next batch starts
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable ready_;  // a batch was queued
  std::condition_variable space_;  // a batch was taken, or stop was asked
  std::deque<Prepared> queue_;
  bool stop_ = false;
};

}  // namespace precis
