#include "transport_dpdk/wire/wire_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport_dpdk/wire/crc32c.h"

namespace optireduce {
namespace transport {
namespace {

// Explicit little-endian stores and loads, so the wire format does not depend
// on the host byte order.
void Put16(uint8_t* p, uint16_t v) { p[0] = v & 0xff; p[1] = v >> 8; }
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t Get16(const uint8_t* p) { return p[0] | (uint16_t(p[1]) << 8); }
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

void Serialise(const WireHeader& h, uint8_t* o) {
  Put32(o + 0, h.magic);
  o[4] = h.version;
  o[5] = h.type;
  Put16(o + 6, h.flags);
  Put64(o + 8, h.session_token);
  Put32(o + 16, h.src_rank);
  Put32(o + 20, h.dst_rank);
  Put32(o + 24, h.dst_context);
  Put32(o + 28, h.payload_length);
  Put64(o + 32, h.seq);
  Put64(o + 40, h.message_id);
  Put64(o + 48, h.slot);
  Put64(o + 56, h.offset);
  Put64(o + 64, h.total_length);
  Put64(o + 72, h.ack_seq);
  Put64(o + 80, h.aux);
  Put32(o + 88, h.checksum);
  Put32(o + 92, h.reserved);
}

void Deserialise(const uint8_t* p, WireHeader* h) {
  h->magic = Get32(p + 0);
  h->version = p[4];
  h->type = p[5];
  h->flags = Get16(p + 6);
  h->session_token = Get64(p + 8);
  h->src_rank = Get32(p + 16);
  h->dst_rank = Get32(p + 20);
  h->dst_context = Get32(p + 24);
  h->payload_length = Get32(p + 28);
  h->seq = Get64(p + 32);
  h->message_id = Get64(p + 40);
  h->slot = Get64(p + 48);
  h->offset = Get64(p + 56);
  h->total_length = Get64(p + 64);
  h->ack_seq = Get64(p + 72);
  h->aux = Get64(p + 80);
  h->checksum = Get32(p + 88);
  h->reserved = Get32(p + 92);
}

// The checks of a header's own fields, whatever follows it.
ParseError CheckFields(const WireHeader& h) {
  if (h.magic != kMagic) return ParseError::kBadMagic;
  if (h.version != kVersion) return ParseError::kBadVersion;
  if (h.type < static_cast<uint8_t>(PacketType::kData) || h.type > kLastPacketType) {
    return ParseError::kBadType;
  }
  if ((h.flags & ~uint16_t(kKnownFlags)) != 0) return ParseError::kBadFlags;
  if ((h.flags & kFlagAckPiggyback) &&
      ((h.flags & kFlagUnreliable) || h.type == static_cast<uint8_t>(PacketType::kAck))) {
    return ParseError::kBadFlags;
  }
  if (h.reserved != 0) return ParseError::kBadReserved;
  return ParseError::kOk;
}

// CRC32C of the header at data with its checksum field zeroed.
uint32_t HeaderCrc(const uint8_t* data) {
  uint8_t head[kHeaderBytes];
  std::memcpy(head, data, kHeaderBytes);
  Put32(head + 88, 0);
  return Crc32cExtend(0, head, kHeaderBytes);
}

}  // namespace

const char* ParseErrorName(ParseError e) {
  switch (e) {
    case ParseError::kOk: return "ok";
    case ParseError::kTooShort: return "too_short";
    case ParseError::kBadMagic: return "bad_magic";
    case ParseError::kBadVersion: return "bad_version";
    case ParseError::kBadType: return "bad_type";
    case ParseError::kBadFlags: return "bad_flags";
    case ParseError::kBadReserved: return "bad_reserved";
    case ParseError::kBadLength: return "bad_length";
    case ParseError::kBadChecksum: return "bad_checksum";
    case ParseError::kBadBounds: return "bad_bounds";
    case ParseError::kCount: break;
  }
  return "unknown";
}

void EncodeHeader(const WireHeader& h, const void* payload, size_t payload_len,
                  uint8_t* out) {
  WireHeader copy = h;
  copy.checksum = 0;
  Serialise(copy, out);
  uint32_t crc = Crc32cExtend(0, out, kHeaderBytes);
  if (payload_len > 0 && !(h.flags & kFlagHeaderChecksum)) {
    crc = Crc32cExtend(crc, payload, payload_len);
  }
  Put32(out + 88, crc);
}

ParseError ParseDatagram(const uint8_t* data, size_t len, WireHeader* h,
                         bool link_protects_payload) {
  if (len < kHeaderBytes) return ParseError::kTooShort;
  Deserialise(data, h);
  if (const ParseError e = CheckFields(*h); e != ParseError::kOk) return e;
  if (h->payload_length != len - kHeaderBytes) return ParseError::kBadLength;
  uint32_t crc = HeaderCrc(data);
  if (h->flags & kFlagHeaderChecksum) {
    if (!link_protects_payload && h->payload_length > 0) return ParseError::kBadChecksum;
  } else {
    crc = Crc32cExtend(crc, data + kHeaderBytes, h->payload_length);
  }
  if (crc != h->checksum) return ParseError::kBadChecksum;
  const auto type = static_cast<PacketType>(h->type);
  switch (type) {
    case PacketType::kData:
      // offset + payload <= total, written so it cannot overflow.
      if (h->offset > h->total_length ||
          h->payload_length > h->total_length - h->offset) {
        return ParseError::kBadBounds;
      }
      break;
    case PacketType::kAck:
      if (h->payload_length > kMaxSackBytes) return ParseError::kBadBounds;
      break;
    case PacketType::kRepair:
      if (!(h->flags & kFlagUnreliable) || h->payload_length % kRepairRangeBytes != 0) {
        return ParseError::kBadBounds;
      }
      break;
    case PacketType::kCede:
      if (!(h->flags & kFlagUnreliable) || h->payload_length != 0) return ParseError::kBadBounds;
      break;
    default:
      if (h->payload_length != 0) return ParseError::kBadBounds;
      break;
  }
  return ParseError::kOk;
}

bool PeekHeaderKind(const uint8_t* data, size_t len, HeaderKind* out) {
  if (len < kHeaderBytes) return false;
  out->type = data[5];
  out->flags = Get16(data + 6);
  return true;
}

ParseError ParseQuotedHeader(const uint8_t* data, size_t len, WireHeader* h) {
  if (len < kHeaderBytes) return ParseError::kTooShort;
  Deserialise(data, h);
  if (const ParseError e = CheckFields(*h); e != ParseError::kOk) return e;
  if ((h->flags & kFlagHeaderChecksum) && HeaderCrc(data) != h->checksum) {
    return ParseError::kBadChecksum;
  }
  return ParseError::kOk;
}

void EncodeRepairRanges(const RepairRange* ranges, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    Put64(out + kRepairRangeBytes * i, ranges[i].first);
    Put64(out + kRepairRangeBytes * i + 8, ranges[i].second);
  }
}

void ParseRepairRanges(const uint8_t* payload, size_t len, size_t max_ranges,
                       std::vector<RepairRange>* out, RepairRangeRejects* rejects) {
  size_t taken = 0;
  for (size_t at = 0; at + kRepairRangeBytes <= len; at += kRepairRangeBytes) {
    const uint64_t begin = Get64(payload + at);
    const uint64_t end = Get64(payload + at + 8);
    if (begin >= end) {
      ++rejects->empty;
    } else if (taken == max_ranges) {
      ++rejects->over_limit;
    } else {
      out->emplace_back(begin, end);
      ++taken;
    }
  }
}

std::string HeaderToString(const WireHeader& h) {
  return absl::StrCat("type=", h.type, " flags=", h.flags, " src=", h.src_rank,
                      " dst=", h.dst_rank, " ctx=", h.dst_context,
                      " seq=", h.seq, " msg=", h.message_id, " slot=", h.slot,
                      " off=", h.offset, " total=", h.total_length,
                      " len=", h.payload_length, " ack=", h.ack_seq,
                      " aux=", h.aux);
}

}  // namespace transport
}  // namespace optireduce
