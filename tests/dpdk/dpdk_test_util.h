// dpdk_test_util.h — helpers of the DPDK backend tests: a temp dir that
// removes itself, forked ranks with a hard timeout (children always killed
// and reaped), and the collective cases every DPDK test runs.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace optireduce {
namespace testing {

// mkdtemp under /tmp; removed recursively (with everything in it) on
// destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Forks `n` children; child r runs fn(r) and reports its string ("" = ok)
// through a pipe. Children still running after `timeout` are killed. Returns
// one entry per failed rank. fn must not return into the parent's code: the
// child _exits after fn.
std::vector<std::string> RunForked(int n, const std::function<std::string(int)>& fn,
                                   std::chrono::seconds timeout);

// Runs the standard cases (allreduce, AllreduceRing, broadcast, allgather,
// sendrecv, ...) at sizes up to 4 MiB on a connected context; "" or the
// first error.
struct GlooCaseList {
  std::vector<std::string> cases;
  std::vector<size_t> elements;
};
GlooCaseList StandardCases();

}  // namespace testing
}  // namespace optireduce
