#include "transport_dpdk/wire/wire_format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>
#include <functional>
#include <optional>
#include <random>

#include "transport_dpdk/wire/crc32c.h"

namespace optireduce {
namespace transport {
namespace {

std::vector<uint8_t> Build(const WireHeader& h, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> d(kHeaderBytes + payload.size());
  EncodeHeader(h, payload.data(), payload.size(), d.data());
  if (!payload.empty()) std::memcpy(d.data() + kHeaderBytes, payload.data(), payload.size());
  return d;
}

WireHeader Sample() {
  WireHeader h;
  h.type = static_cast<uint8_t>(PacketType::kData);
  h.flags = kFlagEager | kFlagBufferKind;
  h.session_token = 0x1122334455667788ull;
  h.src_rank = 3;
  h.dst_rank = 5;
  h.dst_context = 9;
  h.seq = 0xdeadbeefcafeull;
  h.message_id = 42;
  h.slot = 0x0400000000000007ull;
  h.offset = (5ull << 30);          // offsets beyond 4 GiB survive
  h.total_length = (6ull << 30);
  h.ack_seq = 77;
  h.aux = 1234;
  return h;
}

// Sample() as a DATA packet carrying all of an 8-byte message, with `flags`.
WireHeader EightByteData(uint16_t flags) {
  WireHeader h = Sample();
  h.type = static_cast<uint8_t>(PacketType::kData);
  h.flags = flags;
  h.offset = 0;
  h.total_length = 8;
  h.payload_length = 8;
  return h;
}

TEST(Crc32c, KnownVector) {
  // CRC32C("123456789") = 0xE3069283 (RFC 3720 test vector).
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtend(Crc32c("1234", 4), "56789", 5), 0xE3069283u);
}

TEST(Crc32c, LargeInputsMatchTheBytewiseDefinition) {
  // Inputs of 768 bytes and more take the three-chain paths (blocks of 4096, 1024 and 256
  // bytes, in turn); every length and split must give the plain bit-by-bit CRC32C.
  auto reference = [](const uint8_t* p, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  std::vector<uint8_t> data(70000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  for (size_t n : {size_t{767}, size_t{768}, size_t{769}, size_t{3071}, size_t{3072},
                   size_t{3072 + 768 + 5}, size_t{8958}, size_t{9000}, size_t{12287},
                   size_t{12288}, size_t{12289}, size_t{32768}, size_t{40000},
                   size_t{65536 + 7}, data.size()}) {
    EXPECT_EQ(Crc32c(data.data(), n), reference(data.data(), n)) << n;
    EXPECT_EQ(Crc32cExtend(Crc32c(data.data(), 100), data.data() + 100, n - 100),
              reference(data.data(), n)) << n;
  }
}

TEST(WireFormat, BoundedFlagsParse) {
  // An estimated bounded DATA packet and a "cannot serve" repair answer are well-formed.
  WireHeader h = EightByteData(kFlagUnreliable | kFlagLast | kFlagEstimated);
  WireHeader out;
  auto d = Build(h, std::vector<uint8_t>(8, 3));
  ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  EXPECT_EQ(out.flags, h.flags);
  h.type = static_cast<uint8_t>(PacketType::kRepair);
  h.flags = kFlagUnreliable | kFlagAbsent;
  h.payload_length = 0;
  h.aux = 1;
  d = Build(h, {});
  ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  EXPECT_EQ(out.flags, h.flags);
  EXPECT_EQ(out.aux, 1u);
  h.flags = kFlagUnreliable | (1u << 9);  // an unknown flag is still refused
  d = Build(h, {});
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadFlags);
}

TEST(WireFormat, PiggybackedAckOnlyOnSequencedPackets) {
  // A reliable DATA or CREDIT may carry its sender's cumulative ack; an ACK (which is one)
  // or an unreliable packet (which nobody acks in order) may not.
  WireHeader h = EightByteData(kFlagEager | kFlagAckPiggyback);
  h.ack_seq = 41;
  WireHeader out;
  auto d = Build(h, std::vector<uint8_t>(8, 3));
  ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  EXPECT_EQ(out.flags, h.flags);
  EXPECT_EQ(out.ack_seq, 41u);
  h.type = static_cast<uint8_t>(PacketType::kCredit);
  h.flags = kFlagAckPiggyback;
  h.payload_length = 0;
  d = Build(h, {});
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  h.type = static_cast<uint8_t>(PacketType::kAck);
  d = Build(h, {});
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadFlags);
  h.type = static_cast<uint8_t>(PacketType::kData);
  h.flags = kFlagUnreliable | kFlagAckPiggyback;
  h.payload_length = 8;
  d = Build(h, std::vector<uint8_t>(8, 3));
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadFlags);
}

TEST(WireFormat, RepairRangesAreLittleEndianAndRoundTrip) {
  const std::vector<RepairRange> ranges = {{0, 1}, {0x0102030405060708ull, ~0ull}};
  std::vector<uint8_t> body(ranges.size() * kRepairRangeBytes);
  EncodeRepairRanges(ranges.data(), ranges.size(), body.data());
  EXPECT_EQ(body[0], 0);
  EXPECT_EQ(body[8], 1);
  EXPECT_EQ(body[16], 0x08) << "begin, least significant byte first";
  EXPECT_EQ(body[23], 0x01);
  EXPECT_EQ(body[24], 0xff);
  // Sent in a REPAIR datagram, parsed and decoded: the same ranges.
  WireHeader h = Sample();
  h.type = static_cast<uint8_t>(PacketType::kRepair);
  h.flags = kFlagUnreliable;
  h.offset = h.total_length = 0;
  h.payload_length = static_cast<uint32_t>(body.size());
  const auto d = Build(h, body);
  WireHeader out;
  ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  std::vector<RepairRange> got;
  RepairRangeRejects rejects;
  ParseRepairRanges(d.data() + kHeaderBytes, out.payload_length, 16, &got, &rejects);
  EXPECT_EQ(got, ranges);
  EXPECT_EQ(rejects.empty, 0u);
  EXPECT_EQ(rejects.over_limit, 0u);
}

TEST(WireFormat, RepairRangesRejectEmptyAndOverLimitWithACountEach) {
  const std::vector<RepairRange> ranges = {{5, 5}, {9, 3}, {0, 10}, {20, 30}, {40, 50}};
  std::vector<uint8_t> body(ranges.size() * kRepairRangeBytes);
  EncodeRepairRanges(ranges.data(), ranges.size(), body.data());
  std::vector<RepairRange> got;
  RepairRangeRejects rejects;
  ParseRepairRanges(body.data(), body.size(), 2, &got, &rejects);
  EXPECT_EQ(got, (std::vector<RepairRange>{{0, 10}, {20, 30}}));
  EXPECT_EQ(rejects.empty, 2u) << "an empty and an inverted range";
  EXPECT_EQ(rejects.over_limit, 1u);
  // A REPAIR payload that is not a whole number of ranges never reaches the decoder.
  WireHeader h = Sample();
  h.type = static_cast<uint8_t>(PacketType::kRepair);
  h.flags = kFlagUnreliable;
  h.offset = h.total_length = 0;
  h.payload_length = 17;
  const auto d = Build(h, std::vector<uint8_t>(17, 1));
  WireHeader out;
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadBounds);
}

TEST(WireFormat, LivenessPacketsParseWithoutPayloadOnly) {
  // PING, PONG and ABORT carry everything in the header; a payload is refused.
  for (PacketType t : {PacketType::kPing, PacketType::kPong, PacketType::kAbort}) {
    WireHeader h = Sample();
    h.type = static_cast<uint8_t>(t);
    h.flags = 0;
    h.offset = h.total_length = 0;
    h.aux = 3;
    h.payload_length = 0;
    WireHeader out;
    auto d = Build(h, {});
    ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk) << int(h.type);
    EXPECT_EQ(out.type, h.type);
    EXPECT_EQ(out.aux, 3u);
    h.payload_length = 8;
    d = Build(h, std::vector<uint8_t>(8, 1));
    EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadBounds) << int(h.type);
  }
  WireHeader h = Sample();
  h.type = kLastPacketType + 1;
  h.payload_length = 0;
  WireHeader out;
  auto d = Build(h, {});
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadType);
}

TEST(WireFormat, CedeIsUnreliableWithoutPayloadAndItsMessageIsChecked) {
  WireHeader h = Sample();
  h.type = static_cast<uint8_t>(PacketType::kCede);
  h.flags = kFlagUnreliable;
  h.offset = h.total_length = 0;
  h.payload_length = 0;
  SetCedeMessage(CedeMessage::kCeded, &h);
  WireHeader out;
  auto d = Build(h, {});
  ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  EXPECT_EQ(CedeMessageOf(out), CedeMessage::kCeded);
  // A payload, or a sequenced CEDE, is refused; an aux that names no message reads as none.
  h.payload_length = 16;
  d = Build(h, std::vector<uint8_t>(16, 1));
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadBounds);
  h.payload_length = 0;
  h.flags = 0;
  d = Build(h, {});
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kBadBounds);
  for (uint64_t aux : {uint64_t{0}, uint64_t{4}, ~uint64_t{0}}) {
    h.aux = aux;
    EXPECT_FALSE(CedeMessageOf(h).has_value()) << aux;
  }
}

TEST(WireFormat, RoundTrip) {
  std::vector<uint8_t> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  WireHeader h = Sample();
  h.payload_length = payload.size();
  auto d = Build(h, payload);
  WireHeader out;
  ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  EXPECT_EQ(out.type, h.type);
  EXPECT_EQ(out.flags, h.flags);
  EXPECT_EQ(out.session_token, h.session_token);
  EXPECT_EQ(out.src_rank, h.src_rank);
  EXPECT_EQ(out.dst_rank, h.dst_rank);
  EXPECT_EQ(out.dst_context, h.dst_context);
  EXPECT_EQ(out.seq, h.seq);
  EXPECT_EQ(out.message_id, h.message_id);
  EXPECT_EQ(out.slot, h.slot);
  EXPECT_EQ(out.offset, h.offset);
  EXPECT_EQ(out.total_length, h.total_length);
  EXPECT_EQ(out.ack_seq, h.ack_seq);
  EXPECT_EQ(out.aux, h.aux);
  EXPECT_EQ(out.payload_length, payload.size());
}

TEST(WireFormat, HeaderOnlyChecksumIsAcceptedOnlyWhereTheLinkProtectsPayloads) {
  std::vector<uint8_t> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  WireHeader h = Sample();
  h.flags |= kFlagHeaderChecksum;
  h.payload_length = payload.size();
  auto d = Build(h, payload);
  WireHeader out;
  // A link that protects payloads (shared memory, kernel UDP) accepts it ...
  ASSERT_EQ(ParseDatagram(d.data(), d.size(), &out, true), ParseError::kOk);
  EXPECT_EQ(out.flags, h.flags);
  // ... one that can corrupt payloads (fault injection) cannot verify it: refused.
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out, false), ParseError::kBadChecksum);
  // The header stays covered: a changed field is caught on any link.
  auto bad = d;
  bad[56] ^= 0x01;  // offset
  EXPECT_EQ(ParseDatagram(bad.data(), bad.size(), &out, true), ParseError::kBadChecksum);
  // Clearing the flag (a corrupted flags field) makes the checksum cover the payload again,
  // which it was not computed over: refused.
  bad = d;
  WireHeader cleared = h;
  cleared.flags &= ~uint16_t(kFlagHeaderChecksum);
  bad[6] = static_cast<uint8_t>(cleared.flags & 0xff);
  bad[7] = static_cast<uint8_t>(cleared.flags >> 8);
  EXPECT_EQ(ParseDatagram(bad.data(), bad.size(), &out, true), ParseError::kBadChecksum);
  // Without the flag the payload is verified on every link.
  h.flags &= ~uint16_t(kFlagHeaderChecksum);
  d = Build(h, payload);
  d[kHeaderBytes + 500] ^= 0x10;
  EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out, true), ParseError::kBadChecksum);
}

TEST(WireFormat, LittleEndianOnTheWire) {
  WireHeader h = Sample();
  auto d = Build(h, {});
  EXPECT_EQ(d[0], 'O');
  EXPECT_EQ(d[1], 'R');
  EXPECT_EQ(d[2], 'D');
  EXPECT_EQ(d[3], 'P');
  EXPECT_EQ(d[8], 0x88);   // session token low byte first
  EXPECT_EQ(d[16], 3);     // src rank
  EXPECT_EQ(d[59], 0x40);  // offset 5 << 30 = 0x1'4000'0000 at byte 56
  EXPECT_EQ(d[60], 0x01);
}

struct Mutation {
  const char* name;
  std::function<void(std::vector<uint8_t>&)> mutate;
  ParseError want;
  bool refresh_crc;
};

void RefreshCrc(std::vector<uint8_t>& d) {
  std::memset(d.data() + 88, 0, 4);
  uint32_t crc = Crc32c(d.data(), d.size());
  for (int i = 0; i < 4; ++i) d[88 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

TEST(WireFormat, RejectsMalformed) {
  WireHeader h = Sample();
  h.offset = 100;
  h.total_length = 200;
  h.payload_length = 50;
  const auto good = Build(h, std::vector<uint8_t>(50, 1));
  WireHeader out;
  ASSERT_EQ(ParseDatagram(good.data(), good.size(), &out), ParseError::kOk);

  auto set64 = [](std::vector<uint8_t>& d, size_t off, uint64_t v) {
    for (int i = 0; i < 8; ++i) d[off + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  std::vector<Mutation> cases = {
      {"short", [](auto& d) { d.resize(50); }, ParseError::kTooShort, false},
      {"magic", [](auto& d) { d[0] ^= 1; }, ParseError::kBadMagic, true},
      {"version", [](auto& d) { d[4] = 9; }, ParseError::kBadVersion, true},
      {"type0", [](auto& d) { d[5] = 0; }, ParseError::kBadType, true},
      {"type99", [](auto& d) { d[5] = 99; }, ParseError::kBadType, true},
      {"flags", [](auto& d) { d[7] = 0x80; }, ParseError::kBadFlags, true},
      {"reserved", [](auto& d) { d[93] = 1; }, ParseError::kBadReserved, true},
      {"length", [](auto& d) { d.push_back(0); }, ParseError::kBadLength, true},
      {"payload bit flip", [](auto& d) { d[kHeaderBytes + 3] ^= 4; }, ParseError::kBadChecksum, false},
      {"header bit flip", [](auto& d) { d[40] ^= 1; }, ParseError::kBadChecksum, false},
      {"offset past total", [&](auto& d) { set64(d, 56, 180); }, ParseError::kBadBounds, true},
      {"offset overflow", [&](auto& d) { set64(d, 56, ~0ull - 10); }, ParseError::kBadBounds, true},
      {"control with payload", [](auto& d) { d[5] = 2; }, ParseError::kBadBounds, true},
  };
  for (auto& c : cases) {
    auto d = good;
    c.mutate(d);
    if (c.refresh_crc) RefreshCrc(d);
    EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), c.want)
        << c.name << ": got " << ParseErrorName(ParseDatagram(d.data(), d.size(), &out));
  }
}

TEST(WireFormat, AckBitmapBounded) {
  WireHeader h;
  h.type = static_cast<uint8_t>(PacketType::kAck);
  h.payload_length = kMaxSackBytes;
  auto ok = Build(h, std::vector<uint8_t>(kMaxSackBytes, 0xff));
  WireHeader out;
  EXPECT_EQ(ParseDatagram(ok.data(), ok.size(), &out), ParseError::kOk);
  h.payload_length = kMaxSackBytes + 1;
  auto big = Build(h, std::vector<uint8_t>(kMaxSackBytes + 1, 0xff));
  EXPECT_EQ(ParseDatagram(big.data(), big.size(), &out), ParseError::kBadBounds);
}

// The values carried in aux: written by one function, read back by its twin through an
// encoded and parsed datagram; the raw values are the ones the offset table documents.
TEST(WireFormat, AuxEncodingsRoundTripThroughTheWire) {
  auto through_wire = [](WireHeader h) {
    h.payload_length = 0;
    h.offset = 0;
    h.total_length = 0;
    const auto d = Build(h, {});
    WireHeader out;
    EXPECT_EQ(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
    return out;
  };
  WireHeader h = Sample();
  h.flags = 0;
  h.type = static_cast<uint8_t>(PacketType::kAck);
  h.aux = 0;
  EXPECT_FALSE(AckDuplicateOf(through_wire(h)).has_value());
  SetAckDuplicate(0, &h);
  EXPECT_EQ(h.aux, 1u);
  EXPECT_EQ(AckDuplicateOf(through_wire(h)), std::optional<uint64_t>(0));
  SetAckDuplicate(0xfedcba9876ull, &h);
  EXPECT_EQ(AckDuplicateOf(through_wire(h)), std::optional<uint64_t>(0xfedcba9876ull));

  h.type = static_cast<uint8_t>(PacketType::kAbort);
  SetAbortBlame(-1, &h);
  EXPECT_EQ(h.aux, 0u);
  EXPECT_EQ(AbortBlamedRank(through_wire(h), 4), -1);
  SetAbortBlame(0, &h);
  EXPECT_EQ(AbortBlamedRank(through_wire(h), 4), 0);
  SetAbortBlame(3, &h);
  EXPECT_EQ(h.aux, 4u);
  EXPECT_EQ(AbortBlamedRank(through_wire(h), 4), 3);
  EXPECT_EQ(AbortBlamedRank(through_wire(h), 3), -1);  // no rank 3 in 3 ranks
  h.aux = ~0ull;
  EXPECT_EQ(AbortBlamedRank(through_wire(h), 4), -1);

  h.type = static_cast<uint8_t>(PacketType::kPing);
  h.aux = 0;
  EXPECT_FALSE(IsCloseProbe(through_wire(h)));
  SetCloseProbe(&h);
  EXPECT_EQ(h.aux, 1u);
  EXPECT_TRUE(IsCloseProbe(through_wire(h)));
  h.type = static_cast<uint8_t>(PacketType::kPong);
  SetCloseReply(CloseReply::kBusy, &h);
  EXPECT_EQ(h.aux, 1u);
  EXPECT_FALSE(IsCloseSettled(through_wire(h)));
  SetCloseReply(CloseReply::kSettled, &h);
  EXPECT_EQ(h.aux, 2u);
  EXPECT_TRUE(IsCloseSettled(through_wire(h)));
}

// PeekHeaderKind reads type and flags (little-endian) of any datagram as long as a header,
// valid or not, and nothing shorter.
TEST(WireFormat, PeekHeaderKindReadsTypeAndFlagsOnly) {
  WireHeader h = EightByteData(kFlagUnreliable | kFlagLast);
  auto d = Build(h, std::vector<uint8_t>(8, 1));
  d[0] ^= 0xff;  // a bad magic does not matter to a peek
  HeaderKind kind;
  ASSERT_TRUE(PeekHeaderKind(d.data(), d.size(), &kind));
  EXPECT_EQ(kind.type, static_cast<uint8_t>(PacketType::kData));
  EXPECT_EQ(kind.flags, kFlagUnreliable | kFlagLast);
  EXPECT_EQ(d[6], static_cast<uint8_t>((kFlagUnreliable | kFlagLast) & 0xff));
  EXPECT_TRUE(PeekHeaderKind(d.data(), kHeaderBytes, &kind));
  EXPECT_FALSE(PeekHeaderKind(d.data(), kHeaderBytes - 1, &kind));
}

TEST(WireFormat, RandomBytesNeverParse) {
  std::mt19937 rng(5);
  WireHeader out;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> d(rng() % 300);
    for (auto& b : d) b = static_cast<uint8_t>(rng());
    if (d.size() >= 4) { d[0] = 'O'; d[1] = 'R'; d[2] = 'D'; d[3] = 'P'; }
    EXPECT_NE(ParseDatagram(d.data(), d.size(), &out), ParseError::kOk);
  }
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
