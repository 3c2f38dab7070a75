// DPDK backend over net_memif, ranks as real processes (each forked child
// initialises its own EAL with one memif vdev per peer link).
#include <gloo/rendezvous/file_store.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_split.h"
#include "tests/dpdk/dpdk_test_util.h"
#include "tests/transport/conformance_cases.h"
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"

namespace optireduce {
namespace testing {
namespace {

using transport::DpdkPacketIo;
using transport::IoAddress;
using transport::RxDatagram;
using transport::TxDatagram;
namespace dpdk = transport::dpdk;

std::string EalArgsFor(const std::string& dir, int rank, int size, unsigned bsize = 0) {
  return dpdk::MemifMeshEalArgs(dir, rank, size, bsize) + " " + dpdk::DefaultEalArgs();
}

// Publishes our IoAddress and reads the peer's through a FileStore.
IoAddress Exchange(gloo::rendezvous::Store& store, int rank, const IoAddress& mine) {
  store.set("addr" + std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
  const std::string other = "addr" + std::to_string(1 - rank);
  store.wait({other}, std::chrono::seconds(30));
  auto v = store.get(other);
  IoAddress a{};
  std::memcpy(a.data(), v.data(), std::min(v.size(), a.size()));
  return a;
}

uint8_t Pattern(uint32_t seq, size_t i) { return static_cast<uint8_t>(seq * 31 + i * 7); }

// Rank 0 sends bad frames (each must be dropped and counted) and then
// `count` datagrams of varying size; rank 1 checks every byte and echoes.
std::string PacketIoEcho(const std::string& dir, int rank) {
  dpdk::attr a;
  a.eal_args = EalArgsFor(dir, rank, 2);
  auto io_or = DpdkPacketIo::Create(a, transport::EngineOptions().window_bytes);
  if (!io_or.ok()) return io_or.status().ToString();
  DpdkPacketIo& io = **io_or;
  gloo::rendezvous::FileStore store(dir + "/store");
  const IoAddress peer_addr = Exchange(store, rank, io.LocalAddress());
  auto peer = io.ResolvePeer(peer_addr);
  if (!peer.ok()) return peer.status().ToString();
  auto dst = dpdk::DecodeAddress(peer_addr);
  const uint32_t count = 2000;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  auto expired = [&] { return std::chrono::steady_clock::now() > deadline; };
  std::vector<uint8_t> buf(io.MaxDatagram());

  if (rank == 0) {
    // Bad frames, sent once the link is up (memif refuses frames before).
    std::vector<std::vector<uint8_t>> bad;
    auto good_frame = [&](size_t payload) {
      std::vector<uint8_t> f(dpdk::kFrameHeader + payload, 0xAB);
      dpdk::WriteHeaders(f.data(), io.self(), *dst, 1, payload, true);
      return f;
    };
    auto f = good_frame(64);
    f[0] ^= 0x02;  // wrong MAC
    bad.push_back(f);
    f = good_frame(64);
    f[dpdk::kEthHeader + 19] ^= 1;  // wrong destination IP (checksum redone)
    f[dpdk::kEthHeader + 10] = f[dpdk::kEthHeader + 11] = 0;
    {
      uint16_t c = dpdk::Ipv4HeaderChecksum(&f[dpdk::kEthHeader]);
      f[dpdk::kEthHeader + 10] = c >> 8;
      f[dpdk::kEthHeader + 11] = c & 0xFF;
    }
    bad.push_back(f);
    f = good_frame(64);
    f[dpdk::kEthHeader + 20 + 3] ^= 1;  // wrong UDP port
    bad.push_back(f);
    f = good_frame(64);
    f[dpdk::kEthHeader + 20 + 6] = 0x12;  // bad UDP checksum
    f[dpdk::kEthHeader + 20 + 7] = 0x34;
    bad.push_back(f);
    f = good_frame(64);
    f[dpdk::kEthHeader + 12] ^= 0x40;  // bad IPv4 header checksum (src IP)
    bad.push_back(f);
    for (auto& fr : bad) {
      while (!io.SendRawFrame(0, fr.data(), fr.size())) {
        if (expired()) return "link never came up";
        RxDatagram none[4];  // runs the link watchdog; nothing arrives yet
        if (io.RxBurst(none, 4) != 0) return "unexpected datagram";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }

  uint32_t sent = 0, received = 0;
  bool slept = false;
  while (received < count) {
    if (expired()) {
      return "timed out: sent " + std::to_string(sent) + " received " +
             std::to_string(received) + "; " + io.CountersString();
    }
    bool idle = true;
    if (rank == 0 && sent < count) {
      TxDatagram d[16];
      std::vector<std::vector<uint8_t>> payloads(16);
      size_t n = 0;
      for (; n < 16 && sent + n < count; ++n) {
        const uint32_t seq = sent + static_cast<uint32_t>(n);
        const size_t len = 4 + (seq * 97) % (io.MaxDatagram() - 4);
        payloads[n].resize(len);
        std::memcpy(payloads[n].data(), &seq, 4);
        for (size_t i = 4; i < len; ++i) payloads[n][i] = Pattern(seq, i);
        d[n].peer = *peer;
        d[n].head = payloads[n].data();
        d[n].head_len = 4;
        d[n].body = payloads[n].data() + 4;
        d[n].body_len = static_cast<uint32_t>(len - 4);
      }
      const size_t took = io.TxBurst(d, n);
      // TxBurst keeps no pointer into what it was given (bodies of 1 KiB and more
      // leave zero-copy; those that must wait for ring space are copied first):
      // poison the memory at once; rank 1 checks every byte.
      for (auto& p : payloads) std::fill(p.begin(), p.end(), 0xEE);
      sent += static_cast<uint32_t>(took);
      if (took) idle = false;
    }
    RxDatagram rx[32];
    const size_t got = io.RxBurst(rx, 32);
    if (rank == 1 && got > 0 && !slept) {
      // A slow receiver at first: rank 0 fills the memif ring and its backlog.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      slept = true;
    }
    for (size_t k = 0; k < got; ++k) {
      uint32_t seq;
      std::memcpy(&seq, rx[k].data, 4);
      const size_t want = 4 + (seq * 97) % (io.MaxDatagram() - 4);
      if (seq != received) {
        return "datagram " + std::to_string(seq) + " arrived, expected " +
               std::to_string(received) + " (memif is lossless and ordered)";
      }
      if (rx[k].len != want) return "datagram " + std::to_string(seq) + " has wrong length";
      for (size_t i = 4; i < want; ++i) {
        if (rx[k].data[i] != Pattern(seq, i)) {
          return "datagram " + std::to_string(seq) + " byte " + std::to_string(i) + " corrupt";
        }
      }
      ++received;
      if (rank == 1) {  // echo (retry on backpressure)
        TxDatagram d;
        d.peer = *peer;
        d.head = rx[k].data;
        d.head_len = rx[k].len;
        while (io.TxBurst(&d, 1) != 1) {
          if (expired()) return "echo stuck";
          std::this_thread::yield();
        }
      }
    }
    if (got) idle = false;
    if (idle) io.WaitForInput(std::chrono::microseconds(50));
  }
  if (rank == 1) {
    auto c = io.counters();
    using V = dpdk::Verdict;
    const char* names[] = {"wrong_mac", "wrong_ip", "wrong_port", "bad_udp_checksum",
                           "bad_ip_checksum"};
    V verdicts[] = {V::kWrongMac, V::kWrongIp, V::kWrongPort, V::kBadUdpChecksum,
                    V::kBadIpChecksum};
    for (int i = 0; i < 5; ++i) {
      if (c.rx_dropped[static_cast<int>(verdicts[i])] != 1) {
        return std::string("expected exactly one ") + names[i] + " drop: " +
               io.CountersString();
      }
    }
    // Stay until rank 0 has its echoes (it exits the loop first otherwise
    // and memif would lose the tail when we close), and keep driving the
    // port meanwhile: the last echoes may wait in its TX backlog for room in
    // the ring, and only RxBurst/TxBurst calls drain it.
    store.set("done1", {'1'});
    const std::string rank0_done = dir + "/rank0_done";
    while (access(rank0_done.c_str(), F_OK) != 0) {
      if (expired()) return "rank 0 never finished; " + io.CountersString();
      RxDatagram rx[32];
      io.RxBurst(rx, 32);
      io.WaitForInput(std::chrono::microseconds(200));
    }
  } else {
    auto c = io.counters();
    if (c.tx_zero_copy == 0 || c.tx_linearized == 0) {
      return "expected zero-copy frames, some of them linearized to wait: " +
             io.CountersString();
    }
    std::fclose(std::fopen((dir + "/rank0_done").c_str(), "w"));
    store.set("done0", {'1'});
    store.wait({"done1"}, std::chrono::seconds(30));
  }
  return "";
}

TEST(DpdkMemif, PacketIoTwoProcessesExactAndFiltered) {
  TempDir dir("memif_io");
  auto errors = RunForked(2, [&](int r) { return PacketIoEcho(dir.path(), r); },
                          std::chrono::seconds(60));
  for (auto& e : errors) ADD_FAILURE() << e;
}

std::string RunRank(const std::string& dir, int rank, int size,
                    const std::string& faults, const GlooCaseList& list,
                    unsigned bsize = 0, uint32_t want_max_datagram = 0,
                    std::chrono::milliseconds peer_dead = std::chrono::milliseconds(0)) {
  dpdk::attr a;
  a.eal_args = EalArgsFor(dir, rank, size, bsize);
  transport::EngineOptions engine;
  engine.faults = faults;
  if (peer_dead.count() > 0) engine.peer_dead = peer_dead;
  if (!faults.empty()) engine.min_rto = std::chrono::microseconds(2000);
  auto dev = dpdk::CreateDeviceOrError(a, engine);
  if (!dev.ok()) return dev.status().ToString();
  if (want_max_datagram != 0) {
    auto* io = dynamic_cast<transport::DpdkPacketIo*>((*dev)->engine()->io());
    if (io == nullptr || io->MaxDatagram() != want_max_datagram) {
      return "expected datagrams of " + std::to_string(want_max_datagram) + " bytes, got " +
             (io ? std::to_string(io->MaxDatagram()) : std::string("no dpdk io"));
    }
  }
  gloo::rendezvous::FileStore store(dir + "/store");
  auto ctx = ConnectContext(store, *dev, rank, size, std::chrono::seconds(60));
  const bool verbose = std::getenv("OPTIREDUCE_TEST_VERBOSE") != nullptr;
  std::vector<std::string> cases = list.cases;
  if (const char* only = std::getenv("OPTIREDUCE_TEST_CASES")) {
    cases.clear();
    for (absl::string_view c : absl::StrSplit(only, ',', absl::SkipEmpty())) cases.emplace_back(c);
  }
  for (const auto& name : cases) {
    for (size_t n : list.elements) {
      const auto t0 = std::chrono::steady_clock::now();
      std::string e = RunCase(name, ctx, n);
      if (verbose) {
        fprintf(stderr, "rank %d %s(%zu): %.1f ms\n", rank, name.c_str(), n,
                std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0).count());
      }
      if (!e.empty()) return e + " [" + (*dev)->str() + "]";
    }
  }
  // Keep the device until every rank is done: a rank whose receives
  // completed may still owe acknowledgements to a peer still sending.
  store.set("done" + std::to_string(rank), {'1'});
  for (int r = 0; r < size; ++r) store.wait({"done" + std::to_string(r)}, std::chrono::seconds(60));
  if (verbose) {
    auto* io = dynamic_cast<transport::DpdkPacketIo*>((*dev)->engine()->io());
    fprintf(stderr, "rank %d: %s %s\n  engine: %s\n", rank, (*dev)->str().c_str(),
            io ? io->CountersString().c_str() : "", (*dev)->stats().ToString().c_str());
  }
  return "";
}

class DpdkMemifCollectives : public ::testing::TestWithParam<int> {};

TEST_P(DpdkMemifCollectives, ExactAcrossProcesses) {
  const int n = GetParam();
  TempDir dir("memif_coll");
  const GlooCaseList list = StandardCases();
  auto errors = RunForked(n, [&](int r) { return RunRank(dir.path(), r, n, "", list); },
                          std::chrono::seconds(120));
  for (auto& e : errors) ADD_FAILURE() << e;
}

INSTANTIATE_TEST_SUITE_P(Ranks, DpdkMemifCollectives, ::testing::Values(2, 3, 4));

TEST(DpdkMemifBigFrames, ExactWithSixteenKiBBuffers) {
  // The bench's default links: 16 KiB memif buffers give 16370-byte IP frames
  // (datagrams of 16342 bytes), zero-copy bodies and full-size ring primers.
  TempDir dir("memif_big");
  const GlooCaseList list = StandardCases();
  auto errors = RunForked(
      4, [&](int r) { return RunRank(dir.path(), r, 4, "", list, 16384, 16384 - 14 - 28); },
      std::chrono::seconds(120));
  for (auto& e : errors) ADD_FAILURE() << e;
}

TEST(DpdkMemifBigFrames, ExactWithTheLargestBuffersOnFourRanks) {
  // 65535-byte memif buffers carry 65000-byte IP frames (the MTU cap). Each rank has three
  // links; a mempool counted in frames as for a NIC would take ~270 MiB per link, more
  // than the EAL's 512 MiB for three: memif pools of big frames are bounded by bytes.
  // Bringing up three such links per rank (64 MiB of ring per direction, faulted in by
  // full-size primer frames ahead of the connect handshake) takes seconds on a loaded
  // 2-core host; a 1 s silence bound (set here: by default there is none) does not count
  // that time as the peers' silence (DpdkPacketIo::LinkComingUp).
  TempDir dir("memif_max");
  const GlooCaseList list = StandardCases();
  auto errors = RunForked(
      4,
      [&](int r) {
        return RunRank(dir.path(), r, 4, "", list, 65535, 65000 - 28,
                       std::chrono::milliseconds(1000));
      },
      std::chrono::seconds(120));
  for (auto& e : errors) ADD_FAILURE() << e;
}

TEST(DpdkMemifFaults, ExactUnderDropReorderDup) {
  TempDir dir("memif_fault");
  GlooCaseList list{{"allreduce", "AllreduceRing", "broadcast", "allgather", "sendrecv"},
                    {0, 1, 1000, 100000}};
  auto errors = RunForked(
      3,
      [&](int r) {
        return RunRank(dir.path(), r, 3, "drop=0.01,reorder=0.01,dup=0.01,seed=3", list);
      },
      std::chrono::seconds(120));
  for (auto& e : errors) ADD_FAILURE() << e;
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
