// Clear errors of the DPDK backend. The EAL is once per process, so every
// case runs in a forked child of its own.
#include <gloo/common/error.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include "gloo_ext/devices.h"
#include "tests/dpdk/dpdk_test_util.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"

namespace optireduce {
namespace testing {
namespace {

namespace dpdk = transport::dpdk;

const std::string kBase = "--no-huge --no-shconf -m 256 --no-pci --no-telemetry --log-level=*:error";

// Runs fn in a child; fn returns "" when the expectation holds.
void InChild(const std::function<std::string()>& fn) {
  auto errors = RunForked(1, [&](int) { return fn(); }, std::chrono::seconds(60));
  for (auto& e : errors) ADD_FAILURE() << e;
}

std::string Expect(const absl::Status& st, const std::string& needle) {
  if (st.ok()) return "succeeded, expected an error containing '" + needle + "'";
  if (st.ToString().find(needle) == std::string::npos) {
    return "error lacks '" + needle + "': " + st.ToString();
  }
  return "";
}

std::string MemifServer(const std::string& dir, int index) {
  return " --vdev=net_memif" + std::to_string(index) + ",role=server,id=0,socket=" + dir +
         "/s" + std::to_string(index) + ".sock,socket-abstract=no";
}

TEST(DpdkErrors, BadEalArgumentsCarryDpdksReason) {
  InChild([] {
    dpdk::attr a;
    a.eal_args = kBase + " --no-such-option";
    return Expect(dpdk::CreateDeviceOrError(a).status(), "rte_eal_init failed: ");
  });
}

TEST(DpdkErrors, NoPortsAfterProbe) {
  InChild([] {
    dpdk::attr a;
    a.eal_args = kBase;
    return Expect(dpdk::CreateDeviceOrError(a).status(), "found no ethdev ports");
  });
}

TEST(DpdkErrors, VdevThatFailsToProbeMeansNoPorts) {
  InChild([] {
    dpdk::attr a;
    a.eal_args = kBase + " --vdev=net_memif0,role=bogus";
    return Expect(dpdk::CreateDeviceOrError(a).status(), "found no ethdev ports");
  });
}

TEST(DpdkErrors, UnknownPortListsPorts) {
  TempDir dir("err_port");
  InChild([&] {
    dpdk::attr a;
    a.eal_args = kBase + MemifServer(dir.path(), 0);
    a.ports = {"net_nope"};
    std::string e = Expect(dpdk::CreateDeviceOrError(a).status(), "'net_nope' not found");
    if (!e.empty()) return e;
    a.ports = {"7"};
    e = Expect(dpdk::CreateDeviceOrError(a).status(), "0: net_memif0 (net_memif)");
    return e;
  });
}

TEST(DpdkErrors, MtuTooSmall) {
  TempDir dir("err_mtu");
  InChild([&] {
    dpdk::attr a;
    a.eal_args = kBase + MemifServer(dir.path(), 0);
    a.mtu = 100;
    return Expect(dpdk::CreateDeviceOrError(a).status(), "dpdk mtu 100 is outside");
  });
}

TEST(DpdkErrors, MempoolTooBigForEalMemory) {
  TempDir dir("err_pool");
  InChild([&] {
    dpdk::attr a;
    a.eal_args = "--no-huge --no-shconf -m 32 --no-pci --no-telemetry --log-level=*:error" +
                 MemifServer(dir.path(), 0);
    a.mtu = 9000;
    a.rx_descriptors = 16384;
    a.tx_descriptors = 16384;
    return Expect(dpdk::CreateDeviceOrError(a).status(), "cannot allocate a mempool");
  });
}

TEST(DpdkErrors, SecondInitWithOtherArgumentsFailsSameArgumentsReuse) {
  TempDir dir("err_twice");
  InChild([&] {
    dpdk::attr a;
    a.eal_args = kBase + MemifServer(dir.path(), 0) + MemifServer(dir.path(), 1);
    a.ports = {"net_memif0"};
    auto d1 = dpdk::CreateDeviceOrError(a);
    if (!d1.ok()) return "first device: " + d1.status().ToString();
    a.ports = {"net_memif1"};
    auto d2 = dpdk::CreateDeviceOrError(a);  // same args: reuses the EAL
    if (!d2.ok()) return "second device, same args: " + d2.status().ToString();
    dpdk::attr b = a;
    b.eal_args = kBase + " -m 128";
    std::string e = Expect(dpdk::CreateDeviceOrError(b).status(),
                           "cannot be initialised again with");
    if (!e.empty()) return e;
    // The Gloo entry point throws.
    try {
      dpdk::CreateDevice(b);
      return std::string("CreateDevice did not throw");
    } catch (const gloo::Exception& ex) {
      if (std::string(ex.what()).find("already initialised") == std::string::npos) {
        return std::string("unexpected message: ") + ex.what();
      }
    }
    return std::string();
  });
}

// The environment reaches the transport through gloo_ext's helpers (the transport itself
// reads no variable): a device made from DpdkAttrFromEnvironment() with our EAL args and
// EngineOptionsFromEnvironment().
absl::StatusOr<std::shared_ptr<transport::Device>> CreateFromEnvironment(
    const std::string& eal_args) {
  absl::StatusOr<dpdk::attr> a = gloo_ext::DpdkAttrFromEnvironment();
  if (!a.ok()) return a.status();
  absl::StatusOr<transport::EngineOptions> engine = gloo_ext::EngineOptionsFromEnvironment();
  if (!engine.ok()) return engine.status();
  a->eal_args = eal_args;
  return dpdk::CreateDeviceOrError(*a, *engine);
}

TEST(DpdkErrors, BadTxSwitchesAreRefusedWithTheirName) {
  TempDir dir("err_tx");
  InChild([&] {
    const std::string eal_args = kBase + MemifServer(dir.path(), 0);
    setenv("OPTIREDUCE_DPDK_TX_COPY", "sometimes", 1);
    std::string e = Expect(CreateFromEnvironment(eal_args).status(),
                           "OPTIREDUCE_DPDK_TX_COPY='sometimes' is not valid");
    if (!e.empty()) return e;
    setenv("OPTIREDUCE_DPDK_TX_COPY", " On ", 1);
    setenv("OPTIREDUCE_DPDK_TX_BACKLOG", "5000", 1);
    e = Expect(CreateFromEnvironment(eal_args).status(),
               "OPTIREDUCE_DPDK_TX_BACKLOG='5000' is not valid; allowed values: an integer 32..2048");
    if (!e.empty()) return e;
    // The transport refuses the same out-of-range attr on its own.
    dpdk::attr bad;
    bad.eal_args = eal_args;
    bad.tx_backlog = 5000;
    e = Expect(dpdk::CreateDeviceOrError(bad).status(),
               "dpdk attr.tx_backlog=5000 is not valid; allowed values: an integer 32..2048");
    if (!e.empty()) return e;
    setenv("OPTIREDUCE_DPDK_TX_BACKLOG", "64", 1);
    auto d = CreateFromEnvironment(eal_args);
    return d.ok() ? std::string() : "valid switches refused: " + d.status().ToString();
  });
}

TEST(DpdkErrors, EnvArgsAreUsedAndAffinityIsRestored) {
  TempDir dir("err_env");
  InChild([&] {
    setenv("OPTIREDUCE_EAL_ARGS", (kBase + MemifServer(dir.path(), 0)).c_str(), 1);
    cpu_set_t before, after;
    sched_getaffinity(0, sizeof(before), &before);
    absl::StatusOr<dpdk::attr> a = gloo_ext::DpdkAttrFromEnvironment();
    if (!a.ok()) return a.status().ToString();
    absl::StatusOr<transport::EngineOptions> engine = gloo_ext::EngineOptionsFromEnvironment();
    if (!engine.ok()) return engine.status().ToString();
    auto d = dpdk::CreateDeviceOrError(*a, *engine);
    if (!d.ok()) return d.status().ToString();
    sched_getaffinity(0, sizeof(after), &after);
    if (!CPU_EQUAL(&before, &after)) return std::string("affinity not restored");
    if (dpdk::EalArgs() != kBase + MemifServer(dir.path(), 0)) {
      return "EAL args not from env: " + dpdk::EalArgs();
    }
    auto argv = dpdk::EalArgv("--no-huge");
    if (argv.size() != 4 || argv[2] != "-l") return std::string("no -l added");
    if (dpdk::EalArgv("--no-huge -l 1").size() != 4) return std::string("-l added twice");
    return std::string();
  });
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
