// The kernel UDP backend's batching: runs of same-size datagrams to one peer leave as one
// segmented message (UDP_SEGMENT) and may arrive coalesced (UDP_GRO); either way the engine
// must see exactly the datagrams that were sent — same boundaries, same bytes, per-peer
// order — and oversized datagrams are dropped as before.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport_dpdk/io/udp/packet_io_udp.h"

namespace optireduce {
namespace transport {
namespace {

std::unique_ptr<UdpPacketIo> Open(size_t max_datagram, bool offload) {
  udp::attr a;
  a.hostname = "127.0.0.1";
  a.max_datagram = max_datagram;
  a.segmentation_offload = offload;
  auto io = UdpPacketIo::Create(a);
  EXPECT_TRUE(io.ok()) << io.status();
  return io.ok() ? std::move(*io) : nullptr;
}

// A datagram's bytes: its index in the first 4 bytes (head), then a pattern of it (body).
struct Sent {
  std::vector<uint8_t> head, body;
  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> all(head);
    all.insert(all.end(), body.begin(), body.end());
    return all;
  }
};

Sent Make(uint32_t index, size_t len) {
  Sent s;
  s.head.resize(4);
  std::memcpy(s.head.data(), &index, 4);
  s.body.resize(len - 4);
  for (size_t i = 0; i < s.body.size(); i++) s.body[i] = static_cast<uint8_t>(index * 31 + i);
  return s;
}

// Sends every datagram of `sent` (to `peers[i % ...]` as given by `peer_of`), retrying on
// backpressure, then receives until `expect` datagrams arrived or 10 s passed.
std::map<int, std::vector<std::vector<uint8_t>>> Exchange(
    UdpPacketIo& tx, std::vector<UdpPacketIo*> rx, const std::vector<Sent>& sent,
    const std::vector<int>& peer_of, size_t expect, size_t rx_max) {
  std::vector<PeerHandle> handles;
  for (UdpPacketIo* r : rx) handles.push_back(*tx.ResolvePeer(r->LocalAddress()));
  std::vector<TxDatagram> d(sent.size());
  for (size_t i = 0; i < sent.size(); i++) {
    d[i] = {handles[peer_of[i]], sent[i].head.data(), static_cast<uint32_t>(sent[i].head.size()),
            sent[i].body.data(), static_cast<uint32_t>(sent[i].body.size())};
  }
  std::map<int, std::vector<std::vector<uint8_t>>> got;
  size_t done = 0, received = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<RxDatagram> out(rx_max);
  while ((done < d.size() || received < expect) && std::chrono::steady_clock::now() < until) {
    if (done < d.size()) done += tx.TxBurst(d.data() + done, d.size() - done);
    for (size_t r = 0; r < rx.size(); r++) {
      const size_t n = rx[r]->RxBurst(out.data(), out.size());
      for (size_t i = 0; i < n; i++) {
        got[static_cast<int>(r)].emplace_back(out[i].data, out[i].data + out[i].len);
      }
      received += n;
      if (n == 0) rx[r]->WaitForInput(std::chrono::microseconds(200));
    }
  }
  EXPECT_EQ(done, d.size());
  return got;
}

// Datagrams as "index:length:checksum" lines: a failure prints something readable.
std::vector<std::string> Summary(const std::vector<std::vector<uint8_t>>& datagrams) {
  std::vector<std::string> out;
  for (const auto& d : datagrams) {
    uint32_t index = 0;
    if (d.size() >= 4) std::memcpy(&index, d.data(), 4);
    uint64_t sum = 0;
    for (uint8_t b : d) sum = sum * 131 + b;
    out.push_back(std::to_string(index) + ":" + std::to_string(d.size()) + ":" +
                  std::to_string(sum));
  }
  return out;
}

class UdpPacketIoBatching : public ::testing::TestWithParam<bool> {};

TEST_P(UdpPacketIoBatching, EveryDatagramArrivesWholeInOrderPerPeer) {
  const bool offload = GetParam();
  auto tx = Open(1400, offload);
  auto rx0 = Open(1400, offload);
  auto rx1 = Open(1400, offload);
  ASSERT_TRUE(tx && rx0 && rx1);
  // Runs of full-size datagrams, short ones ending runs, peers alternating in blocks.
  std::vector<Sent> sent;
  std::vector<int> peer_of;
  std::vector<std::vector<std::vector<uint8_t>>> want(2);
  for (uint32_t i = 0; i < 600; i++) {
    const size_t len = i % 50 == 49 ? 300 + i % 7 : (i % 97 == 13 ? 1000 : 1400);
    const int peer = (i / 80) % 2;
    sent.push_back(Make(i, len));
    peer_of.push_back(peer);
    want[peer].push_back(sent.back().Bytes());
  }
  auto got = Exchange(*tx, {rx0.get(), rx1.get()}, sent, peer_of, sent.size(), 7);
  EXPECT_EQ(Summary(got[0]), Summary(want[0]));
  EXPECT_EQ(Summary(got[1]), Summary(want[1]));
  if (offload) {
    EXPECT_TRUE(tx->SegmentationOffload()) << "this kernel has UDP_SEGMENT (Linux >= 4.18)";
    EXPECT_GT(tx->SegmentedSends(), 0u);
    // Loopback hands the segmented message to a GRO socket whole.
    EXPECT_GT(rx0->CoalescedReceives() + rx1->CoalescedReceives(), 0u);
  } else {
    EXPECT_EQ(tx->SegmentedSends(), 0u);
    EXPECT_EQ(rx0->CoalescedReceives() + rx1->CoalescedReceives(), 0u);
  }
}

TEST_P(UdpPacketIoBatching, OversizedDatagramsAreDropped) {
  const bool offload = GetParam();
  auto tx = Open(2000, offload);
  auto rx = Open(1400, offload);
  ASSERT_TRUE(tx && rx);
  std::vector<Sent> sent;
  for (uint32_t i = 0; i < 40; i++) sent.push_back(Make(i, i % 2 ? 1400 : 1800));
  // Only the 20 that fit can arrive; wait for them (and give the others time to show up).
  auto got = Exchange(*tx, {rx.get()}, sent, std::vector<int>(sent.size(), 0), 20, 64);
  std::vector<RxDatagram> out(64);
  for (int i = 0; i < 20; i++) {
    const size_t n = rx->RxBurst(out.data(), out.size());
    for (size_t k = 0; k < n; k++) got[0].emplace_back(out[k].data, out[k].data + out[k].len);
    rx->WaitForInput(std::chrono::microseconds(5000));
  }
  std::vector<std::vector<uint8_t>> want;
  for (uint32_t i = 1; i < 40; i += 2) want.push_back(sent[i].Bytes());
  EXPECT_EQ(Summary(got[0]), Summary(want));
}

INSTANTIATE_TEST_SUITE_P(Offload, UdpPacketIoBatching, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "On" : "Off"; });

}  // namespace
}  // namespace transport
}  // namespace optireduce
