// gloo_ext::CreateDpdkDevice, the entry point of GLOO_DEVICE_TRANSPORT=DPDK: a process
// has one DPDK device, shared by every caller with the same settings (torch makes one
// device per process group), and its groups' traffic stays in their own contexts. The
// EAL is once per process, so every case runs in forked children.
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gtest/gtest.h>

#include <thread>

#include "gloo_ext/config.h"
#include "gloo_ext/devices.h"
#include "tests/dpdk/dpdk_test_util.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"

namespace optireduce {
namespace testing {
namespace {

namespace dpdk = transport::dpdk;
using gloo_ext::Config;
using gloo_ext::CreateDpdkDevice;

const std::string kBase =
    "--no-huge --no-shconf -m 256 --no-pci --no-telemetry --log-level=*:error";

std::string Expect(const absl::Status& st, const std::vector<std::string>& needles) {
  if (st.ok()) return "succeeded, expected an error";
  for (const auto& n : needles) {
    if (st.ToString().find(n) == std::string::npos) {
      return "error lacks '" + n + "': " + st.ToString();
    }
  }
  return "";
}

TEST(DpdkSharedDevice, SameSettingsShareDifferentSettingsAreNamed) {
  TempDir dir("shared_dev");
  auto errors = RunForked(1, [&](int) -> std::string {
    Config config;
    config.eal_args = kBase + " --vdev=net_memif0,role=server,id=0,socket=" + dir.path() +
                      "/s.sock,socket-abstract=no";
    auto d1 = CreateDpdkDevice(config, "eth0", "host-a");
    if (!d1.ok()) return "first device: " + d1.status().ToString();
    // torch's second group (interface/hostname do not apply to DPDK).
    auto d2 = CreateDpdkDevice(config, "", "");
    if (!d2.ok()) return "second device: " + d2.status().ToString();
    if (d1->get() != d2->get()) return "two devices for the same settings";

    Config mtu = config;
    mtu.dpdk_mtu = 1400;
    std::string e = Expect(CreateDpdkDevice(mtu, "", "").status(),
                           {"OPTIREDUCE_DPDK_MTU", "'0'", "'1400'"});
    if (!e.empty()) return e;
    Config eal = config;
    eal.eal_args += " -m 128";
    e = Expect(CreateDpdkDevice(eal, "", "").status(), {"OPTIREDUCE_EAL_ARGS", "-m 128"});
    if (!e.empty()) return e;
    Config faults = config;
    faults.faults = "drop=0.1";
    e = Expect(CreateDpdkDevice(faults, "", "").status(), {"OPTIREDUCE_FAULTS", "drop=0.1"});
    if (!e.empty()) return e;

    // Once the last user lets go, the port is free again: a device with other settings
    // (same EAL) starts.
    d1->reset();
    d2->reset();
    auto d3 = CreateDpdkDevice(mtu, "", "");
    if (!d3.ok()) return "device after release: " + d3.status().ToString();
    return "";
  }, std::chrono::seconds(60));
  for (auto& e : errors) ADD_FAILURE() << e;
}

// Two ranks over one memif link; each rank asks CreateDpdkDevice twice (two groups) and
// runs different collectives on the two contexts at once, with the same tags and slots:
// a datagram delivered to the other context would break sizes or values.
TEST(DpdkSharedDevice, TwoGroupsOnOneDeviceStayApart) {
  TempDir dir("shared_groups");
  auto errors = RunForked(2, [&](int rank) -> std::string {
    Config config;
    config.eal_args = dpdk::MemifMeshEalArgs(dir.path(), rank, 2) + " " + kBase;
    auto da = CreateDpdkDevice(config, "", "");
    if (!da.ok()) return "device a: " + da.status().ToString();
    auto db = CreateDpdkDevice(config, "", "");
    if (!db.ok()) return "device b: " + db.status().ToString();
    if (da->get() != db->get()) return "two devices for the same settings";
    // A FileStore per group: set() appends to an unguarded member, so one store used by
    // two connecting threads corrupts the heap.
    gloo::rendezvous::FileStore fa(dir.path()), fb(dir.path());
    gloo::rendezvous::PrefixStore sa("a", fa), sb("b", fb);
    std::shared_ptr<gloo::Context> ca, cb;
    std::string ea, eb;
    {
      std::thread ta([&] { ca = ConnectContext(sa, *da, rank, 2, std::chrono::seconds(30)); });
      std::thread tb([&] { cb = ConnectContext(sb, *db, rank, 2, std::chrono::seconds(30)); });
      ta.join();
      tb.join();
    }
    auto run = [](const std::shared_ptr<gloo::Context>& ctx,
                  const std::vector<std::string>& cases, std::string* error) {
      for (int k = 0; k < 3 && error->empty(); ++k) {
        for (const auto& name : cases) {
          for (size_t n : {1, 4096, 300000}) {
            if (error->empty()) *error = RunCase(name, ctx, n);
          }
        }
      }
    };
    std::thread ra([&] { run(ca, {"allreduce", "AllreduceRing", "recv_any"}, &ea); });
    std::thread rb([&] { run(cb, {"broadcast", "allgather", "sendrecv"}, &eb); });
    ra.join();
    rb.join();
    if (!ea.empty()) return "group a: " + ea;
    if (!eb.empty()) return "group b: " + eb;
    const std::string stats = gloo_ext::DeviceStatsJson();
    if (stats.find("\"devices\": 1,") == std::string::npos) return "stats: " + stats;
    return "";
  }, std::chrono::seconds(120));
  for (auto& e : errors) ADD_FAILURE() << e;
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
