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

// Runs `cmd` through the shell with its output discarded; the exit status.
int Sh(const std::string& cmd);

// A Linux bridge and `n` network namespaces, each holding one end ("inner")
// of a veth pair whose other end ("outer") is a port of the bridge in the
// root namespace. Needs root. The destructor removes namespaces, veths (and
// with them any qdisc/filter on them) and the bridge, also after a failure.
class BridgedNamespaces {
 public:
  explicit BridgedNamespaces(int n);
  ~BridgedNamespaces();
  BridgedNamespaces(const BridgedNamespaces&) = delete;
  BridgedNamespaces& operator=(const BridgedNamespaces&) = delete;
  bool ok() const { return ok_; }
  int size() const { return n_; }
  std::string Bridge() const { return "orb" + tag_; }
  std::string Ns(int r) const { return "orns" + tag_ + "_" + std::to_string(r); }
  std::string Inner(int r) const { return "orv" + tag_ + "_" + std::to_string(r); }
  std::string Outer(int r) const { return "orh" + tag_ + "_" + std::to_string(r); }

 private:
  int n_;
  std::string tag_;
  bool ok_ = false;
};

// Moves the calling process into network namespace `ns`; "" or the error.
std::string EnterNamespace(const std::string& ns);

// EAL arguments for an af_packet port on rank r's inner veth (a large ring: the
// kernel's default af_packet ring loses frames under bursts).
std::string AfPacketEalArgs(const BridgedNamespaces& net, int rank);

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
