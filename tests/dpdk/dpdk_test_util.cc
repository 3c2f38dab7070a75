#include "tests/dpdk/dpdk_test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "transport_dpdk/io/dpdk/dpdk_eal.h"

namespace optireduce {
namespace testing {

TempDir::TempDir(const std::string& tag) {
  std::string tmpl = "/tmp/optireduce_" + tag + "_XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
  std::filesystem::create_directory(path_ + "/store");  // for FileStores
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::string> RunForked(int n, const std::function<std::string(int)>& fn,
                                   std::chrono::seconds timeout) {
  struct Child {
    pid_t pid = -1;
    int fd = -1;
    std::string out;
    bool eof = false;
  };
  std::vector<Child> kids(n);
  std::vector<std::string> errors;
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe(p) != 0) {
      errors.push_back("pipe failed");
      break;
    }
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      std::string result;
      try {
        result = fn(r);
      } catch (const std::exception& e) {
        result = std::string("exception: ") + e.what();
      } catch (...) {
        result = "unknown exception";
      }
      if (!result.empty()) {
        result = "rank " + std::to_string(r) + ": " + result;
        ssize_t w = write(p[1], result.data(), result.size());
        (void)w;
      }
      close(p[1]);
      _exit(result.empty() ? 0 : 1);
    }
    close(p[1]);
    kids[r].pid = pid;
    kids[r].fd = p[0];
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> idx;
    for (int r = 0; r < n; ++r) {
      if (kids[r].fd >= 0 && !kids[r].eof) {
        fds.push_back({kids[r].fd, POLLIN, 0});
        idx.push_back(r);
      }
    }
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got <= 0) {
        kids[idx[i]].eof = true;
      } else {
        kids[idx[i]].out.append(buf, static_cast<size_t>(got));
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    Child& k = kids[r];
    if (k.pid <= 0) continue;
    if (timed_out) kill(k.pid, SIGKILL);
    int status = 0;
    waitpid(k.pid, &status, 0);
    if (k.fd >= 0) close(k.fd);
    if (!k.eof && timed_out) {
      errors.push_back("rank " + std::to_string(r) + ": timed out after " +
                       std::to_string(timeout.count()) + " s" +
                       (k.out.empty() ? "" : " (" + k.out + ")"));
    } else if (!k.out.empty()) {
      errors.push_back(k.out);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      errors.push_back("rank " + std::to_string(r) + ": died (status " +
                       std::to_string(status) + ")");
    }
  }
  return errors;
}

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

BridgedNamespaces::BridgedNamespaces(int n) : n_(n) {
  static int counter = 0;
  tag_ = std::to_string(getpid() % 100000) + std::to_string(counter++);
  ok_ = Sh("ip link add " + Bridge() + " type bridge") == 0 &&
        Sh("ip link set " + Bridge() + " up") == 0;
  for (int r = 0; r < n && ok_; ++r) {
    ok_ = Sh("ip netns add " + Ns(r)) == 0 &&
          Sh("ip link add " + Inner(r) + " type veth peer name " + Outer(r)) == 0 &&
          Sh("ip link set " + Inner(r) + " netns " + Ns(r)) == 0 &&
          Sh("ip link set " + Outer(r) + " master " + Bridge() + " up") == 0 &&
          Sh("ip -n " + Ns(r) + " link set " + Inner(r) + " up") == 0;
  }
}

BridgedNamespaces::~BridgedNamespaces() {
  for (int r = 0; r < n_; ++r) {
    Sh("ip netns del " + Ns(r));     // takes the inner veth (and its peer)
    Sh("ip link del " + Outer(r));   // in case the move never happened
  }
  Sh("ip link del " + Bridge());
}

std::string AfPacketEalArgs(const BridgedNamespaces& net, int rank) {
  return "--vdev=net_af_packet0,iface=" + net.Inner(rank) +
         ",framecnt=16384,blocksz=4096,framesz=2048 " + transport::dpdk::DefaultEalArgs();
}

std::string EnterNamespace(const std::string& ns) {
  const std::string path = "/var/run/netns/" + ns;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path;
  const int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc == 0 ? "" : "setns " + ns + " failed";
}

GlooCaseList StandardCases() {
  return {{"allreduce", "AllreduceRing", "broadcast", "allgather", "sendrecv",
           "recv_any", "send_before_recv"},
          {0, 1, 1000, 65536, 1 << 20}};
}

}  // namespace testing
}  // namespace optireduce
