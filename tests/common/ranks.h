// Test harness: runs a body on N Gloo ranks, either as threads in this process (HashStore)
// or as real forked processes (FileStore in a temporary directory).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/device.h>

namespace optireduce {
namespace testing {

// Makes the device for one rank (the default is Gloo's TCP device on 127.0.0.1).
using DeviceFactory = std::function<std::shared_ptr<gloo::transport::Device>(int rank)>;
std::shared_ptr<gloo::transport::Device> TcpDevice(int rank);

using RankBody = std::function<void(const std::shared_ptr<gloo::Context>& context)>;

struct RankOptions {
  DeviceFactory device = &TcpDevice;
  std::chrono::milliseconds context_timeout{30000};
  // Whole-run limit for RunProcesses: children still running then are killed.
  std::chrono::seconds process_limit{120};
};

// Runs `body` on `size` ranks as threads. Failures (exceptions, gtest assertion failures)
// are reported through gtest with the rank that failed.
void RunThreads(int size, const RankBody& body, const RankOptions& options = RankOptions());

// Runs `body` on `size` ranks as forked processes; returns "" on success or a description
// of which ranks failed and why. Every child is reaped (killed at the limit) before return.
// Call from a single-threaded test process (fork).
std::string RunProcesses(int size, const RankBody& body,
                         const RankOptions& options = RankOptions());

// A fresh, empty temporary directory removed (recursively) when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace testing
}  // namespace optireduce
