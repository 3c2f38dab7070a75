// Persistent worker threads for the benchmark's rank threads (--threads).
//
// Warm-up and timed iterations must run on the same threads: algorithms keep per-thread
// scratch memory (as in a training job, whose communication thread lives for the whole run),
// and a fresh thread per batch would make the first timed iteration pay its page faults.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace optireduce {
namespace bench {

class WorkerThreads {
 public:
  explicit WorkerThreads(size_t count) {
    for (size_t t = 0; t < count; t++) threads_.emplace_back([this, t] { Loop(t); });
  }
  ~WorkerThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& th : threads_) th.join();
  }
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

  // Runs job(t) on worker t, for every worker, and returns when all are done. `job` must
  // not throw (catch inside and report through its own state).
  void RunOnEach(const std::function<void(size_t)>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    pending_ = threads_.size();
    generation_++;
    cv_.notify_all();
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void Loop(size_t t) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(t);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace bench
}  // namespace optireduce
