// Fuzz target: transport::ParseDatagram, the first code every received datagram meets, and
// ParseQuotedHeader (a datagram quoted back by an ICMP report) and PeekHeaderKind.
// Checks that an accepted datagram is self-consistent and re-encodes to the same bytes.
// The input is parsed twice: as received, and with a valid CRC32C patched in, so the
// fuzzer also explores the checks behind the checksum. The payload of an accepted REPAIR
// is decoded as repair ranges: every range is kept or counted, and the kept ones
// re-encode to their bytes.
#include <cstring>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "transport_dpdk/wire/wire_format.h"

namespace {

using optireduce::transport::EncodeHeader;
using optireduce::transport::kHeaderBytes;
using optireduce::transport::ParseDatagram;
using optireduce::transport::ParseError;
using optireduce::transport::PacketType;
using optireduce::transport::WireHeader;

void CheckRepairRanges(const uint8_t* payload, size_t len) {
  namespace t = optireduce::transport;
  FUZZ_CHECK(len % t::kRepairRangeBytes == 0, "repair payload of %zu bytes accepted", len);
  const size_t total = len / t::kRepairRangeBytes;
  const size_t limit = total / 2;  // exercises the limit too
  std::vector<t::RepairRange> ranges;
  t::RepairRangeRejects rejects;
  t::ParseRepairRanges(payload, len, limit, &ranges, &rejects);
  FUZZ_CHECK(ranges.size() <= limit, "%zu ranges kept over a limit of %zu", ranges.size(), limit);
  FUZZ_CHECK(ranges.size() + rejects.empty + rejects.over_limit == total,
             "%zu kept + %llu empty + %llu over the limit != %zu ranges", ranges.size(),
             (unsigned long long)rejects.empty, (unsigned long long)rejects.over_limit, total);
  for (const t::RepairRange& r : ranges) {
    FUZZ_CHECK(r.first < r.second, "kept an empty range [%llu, %llu)",
               (unsigned long long)r.first, (unsigned long long)r.second);
  }
  // Without a limit and with no empty range, decoding then encoding gives the bytes back.
  if (rejects.empty == 0) {
    ranges.clear();
    t::ParseRepairRanges(payload, len, total, &ranges, &rejects);
    std::vector<uint8_t> again(len);
    t::EncodeRepairRanges(ranges.data(), ranges.size(), again.data());
    FUZZ_CHECK(len == 0 || std::memcmp(again.data(), payload, len) == 0,
               "repair ranges re-encode differently");
  }
}

void ParseAndCheck(const uint8_t* data, size_t size, bool link_protects_payload = false) {
  WireHeader h;
  const ParseError err = ParseDatagram(data, size, &h, link_protects_payload);
  FUZZ_CHECK(err < ParseError::kCount, "error code %d", static_cast<int>(err));
  optireduce::transport::ParseErrorName(err);
  if (err != ParseError::kOk) return;
  FUZZ_CHECK(size >= kHeaderBytes, "accepted %zu bytes", size);
  FUZZ_CHECK(h.payload_length == size - kHeaderBytes, "payload %u of %zu", h.payload_length,
             size);
  if (static_cast<PacketType>(h.type) == PacketType::kData) {
    FUZZ_CHECK(h.offset <= h.total_length && h.payload_length <= h.total_length - h.offset,
               "data [%llu, +%u) outside total %llu", (unsigned long long)h.offset,
               h.payload_length, (unsigned long long)h.total_length);
  }
  if (static_cast<PacketType>(h.type) == PacketType::kRepair) {
    CheckRepairRanges(data + kHeaderBytes, h.payload_length);
  }
  // The fault injector's peek at an accepted datagram sees its type and flags.
  optireduce::transport::HeaderKind kind;
  FUZZ_CHECK(optireduce::transport::PeekHeaderKind(data, size, &kind) && kind.type == h.type &&
                 kind.flags == h.flags,
             "peek disagrees with the parse");
  // A network error report quoting an accepted datagram decodes to the same header.
  WireHeader quoted;
  FUZZ_CHECK(optireduce::transport::ParseQuotedHeader(data, size, &quoted) == ParseError::kOk,
             "accepted datagram refused as a quote");
  FUZZ_CHECK(quoted.seq == h.seq && quoted.session_token == h.session_token,
             "quote decodes differently");
  // Accepted headers round-trip exactly.
  std::vector<uint8_t> again(kHeaderBytes);
  EncodeHeader(h, data + kHeaderBytes, h.payload_length, again.data());
  FUZZ_CHECK(std::memcmp(again.data(), data, kHeaderBytes) == 0, "re-encoding differs: %s",
             optireduce::transport::HeaderToString(h).c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ParseAndCheck(data, size);
  WireHeader quoted;
  const ParseError quote_err = optireduce::transport::ParseQuotedHeader(data, size, &quoted);
  FUZZ_CHECK(quote_err < ParseError::kCount, "quote error code %d", static_cast<int>(quote_err));
  if (size < kHeaderBytes) return 0;
  // The same bytes with a correct checksum (EncodeHeader computes it; the header fields
  // it writes come from a lenient decode of the input).
  std::vector<uint8_t> fixed(data, data + size);
  WireHeader h;
  if (ParseDatagram(fixed.data(), fixed.size(), &h) == ParseError::kBadChecksum) {
    std::vector<uint8_t> head(kHeaderBytes);
    EncodeHeader(h, fixed.data() + kHeaderBytes, h.payload_length, head.data());
    std::memcpy(fixed.data() + 88, head.data() + 88, 4);
    // A header-only checksum over a payload is refused unless the link protects payloads
    // (DPDK frames with a verified UDP checksum): then the fixed checksum must pass.
    const bool header_only = (h.flags & optireduce::transport::kFlagHeaderChecksum) != 0 &&
                             h.payload_length > 0;
    const ParseError err =
        ParseDatagram(fixed.data(), fixed.size(), &h, /*link_protects_payload=*/header_only);
    FUZZ_CHECK(err != ParseError::kBadChecksum, "checksum still bad after fixing it");
    ParseAndCheck(fixed.data(), fixed.size(), header_only);
  }
  return 0;
}
