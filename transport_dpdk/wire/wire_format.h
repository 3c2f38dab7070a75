// wire_format.h — THE definition of the optireduce datagram header.
//
// Every datagram is one 96-byte header followed by payload_length bytes.
// All fields are little-endian and naturally aligned (offsets below). The
// checksum is CRC32C over the header (with the checksum field zero) followed
// by the payload; it catches corruption the link layer missed. With
// kFlagHeaderChecksum it covers the header only: the sender's link already
// guarantees the payload's integrity (shared memory, or the kernel's UDP
// checksum), and a second pass over every byte on both ends is a large share
// of an allreduce's time on a CPU-bound host. A receiver whose own link
// can corrupt payloads (fault injection) refuses such datagrams.
//
//  off size field           meaning
//    0   4  magic           kMagic ("ORDP")
//    4   1  version         kVersion
//    5   1  type            PacketType
//    6   2  flags           PacketFlags bits
//    8   8  session_token   per-job token; packets of other jobs are dropped
//   16   4  src_rank        sender's rank in the context
//   20   4  dst_rank        receiver's rank in the context
//   24   4  dst_context     receiver's context id (from its Address)
//   28   4  payload_length  bytes after the header
//   32   8  seq             per-(peer, direction) packet sequence (not ACK)
//   40   8  message_id      per-(peer, direction) message number
//   48   8  slot            Gloo slot/tag of the message
//   56   8  offset          DATA: byte offset of the payload in the message
//   64   8  total_length    length of the whole message
//   72   8  ack_seq         ACK: cumulative ack (all seq < ack_seq received);
//                           selective-ack bitmap for seqs ack_seq+1.. in payload
//   80   8  aux             RTS/DATA of a Buffer message: destination offset;
//                           CREDIT: eager bytes returned; ACK: 1 + a seq that
//                           arrived twice since the last ack (0: none);
//                           ABORT: 1 + blamed rank; CEDE: a CedeMessage
// PING/PONG (liveness) are unsequenced and carry no payload; message_id
// is the ping's number, echoed by the pong. aux 1 on a PING: a close probe
// (the sender's context is destroyed and lingers); its PONG says aux 2 when
// the answering side has nothing unacknowledged or queued for the prober (it
// needs nothing more from it), aux 1 otherwise. A released context's engine
// still answers close probes for it (aux 2).
//   88   4  checksum        CRC32C
// Bounded-service packets (flag kFlagUnreliable) reuse the layout: seq 0,
// message_id = bounded operation id, offset/total_length as DATA (total_length:
// the sender's whole source for this receiver, which must equal the region the
// receiver posted for it); a bounded DATA's aux is the byte count of the
// sender's whole allreduce (0: not stated, as in repairs), which must equal the
// receiver's own. An empty bounded DATA (no payload, total_length 0) only
// states that count: the notice a rank that found the sizes differ sends.
//   92   4  reserved        must be zero
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace optireduce {
namespace transport {

inline constexpr uint32_t kMagic = 0x5044524Fu;  // "ORDP" little-endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 96;
// Largest selective-ack bitmap an ACK may carry (bits for 8192 packets).
inline constexpr size_t kMaxSackBytes = 1024;

enum class PacketType : uint8_t {
  kData = 1,    // message bytes [offset, offset+payload_length)
  kRts = 2,     // rendezvous announce: "message_id of total_length on slot"
  kCts = 3,     // rendezvous grant: "send message_id now"
  kAck = 4,     // unsequenced; cumulative + selective ack
  kCredit = 5,  // eager buffer space returned (aux bytes)
  kNop = 6,     // fills a sequence number whose packet was cancelled
  // Bounded service (always with kFlagUnreliable): "send the byte ranges of
  // bounded operation message_id listed in the payload again" — payload is
  // pairs of little-endian u64 [begin, end) (EncodeRepairRanges).
  kRepair = 7,
  // Peer liveness (unsequenced, no payload, like kAck): a rank with operations
  // pending with a peer it has not heard from lately sends kPing; the peer's
  // engine answers kPong while the context is live. message_id carries the
  // ping's number back in the pong (diagnostics only).
  kPing = 8,
  kPong = 9,
  // The sender's context failed (a peer is gone, or a wait timed out): it
  // sends, acknowledges and answers nothing more for this context, so what
  // the receiver has pending with it cannot complete. Unsequenced, no
  // payload; aux = 1 + the rank its failure blames, 0 if none (a timeout).
  kAbort = 10,
  // Sequenced, no payload: the sender withdraws its unbound send message_id on
  // slot (sent once all its packets are acknowledged). A receiver that has not
  // matched it to a receive drops it and returns its credit as if taken; one
  // that has lets it complete as usual.
  kWithdraw = 11,
  // Bounded service (always with kFlagUnreliable, no payload): the hand-over of
  // bounded operation message_id's decision from its leader to its deputy
  // (algorithms/bounded_agreement.h). aux is a CedeMessage: the deputy asks
  // (kAsk), the leader's transport answers kCeded when it had not begun the
  // operation (it then never decides it) or kRefused when it had.
  kCede = 12,
};
inline constexpr uint8_t kLastPacketType = static_cast<uint8_t>(PacketType::kCede);

enum PacketFlags : uint16_t {
  kFlagEager = 1u << 0,       // DATA sent without a grant (eager protocol)
  kFlagBufferKind = 1u << 1,  // targets an old-style Buffer (aux = offset)
  // Bounded service: the sender will not retransmit this packet and the
  // receiver acks nothing; message_id is the bounded operation id, seq is 0.
  kFlagUnreliable = 1u << 2,
  // Bounded DATA among the last packets of its operation (early timeout).
  kFlagLast = 1u << 3,
  // Bounded DATA whose bytes are an estimate: the sender's own inputs were
  // incomplete (a TAR shard owner that lost phase-1 contributions).
  kFlagEstimated = 1u << 4,
  // kRepair answered by the sender that cannot serve it (empty payload; aux is
  // an AbsentReason). The requester stops waiting for data that is not coming.
  kFlagAbsent = 1u << 5,
  // The checksum covers the header only (see the top of this file).
  kFlagHeaderChecksum = 1u << 6,
  // A sequenced packet (not an ACK, not unreliable) whose ack_seq is its sender's
  // cumulative ack: every packet below ack_seq from the receiver arrived. The
  // receiver takes it as an ACK without SACK ranges, so an answer that is due
  // anyway (a CREDIT, a reply) saves the ACK packet of its own.
  kFlagAckPiggyback = 1u << 7,
  kKnownFlags = kFlagEager | kFlagBufferKind | kFlagUnreliable | kFlagLast | kFlagEstimated |
                kFlagAbsent | kFlagHeaderChecksum | kFlagAckPiggyback,
};

// Why a sender answers a repair request with kFlagAbsent (carried in aux).
enum class AbsentReason : uint64_t {
  kReleased = 0,    // its sources of message_id are released
  kNotStarted = 1,  // it has not started that operation yet
};

// A kCede's aux.
enum class CedeMessage : uint64_t {
  kAsk = 1,      // deputy -> leader: hand me the decision of message_id if you have not begun it
  kCeded = 2,    // leader -> deputy: not begun; the deputy decides
  kRefused = 3,  // leader -> deputy: begun; the leader decides
};

struct WireHeader {
  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t type = 0;
  uint16_t flags = 0;
  uint64_t session_token = 0;
  uint32_t src_rank = 0;
  uint32_t dst_rank = 0;
  uint32_t dst_context = 0;
  uint32_t payload_length = 0;
  uint64_t seq = 0;
  uint64_t message_id = 0;
  uint64_t slot = 0;
  uint64_t offset = 0;
  uint64_t total_length = 0;
  uint64_t ack_seq = 0;
  uint64_t aux = 0;
  uint32_t checksum = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(WireHeader) == kHeaderBytes, "header layout");
static_assert(offsetof(WireHeader, session_token) == 8, "header layout");
static_assert(offsetof(WireHeader, seq) == 32, "header layout");
static_assert(offsetof(WireHeader, checksum) == 88, "header layout");

// Why a datagram was rejected by ParseDatagram. kOk means accepted.
enum class ParseError : uint8_t {
  kOk = 0,
  kTooShort,
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadFlags,
  kBadReserved,
  kBadLength,     // payload_length disagrees with the datagram length
  kBadChecksum,
  kBadBounds,     // offset/length outside total_length, or control with payload
  kCount,
};
const char* ParseErrorName(ParseError e);

// The AbsentReason of a kRepair with kFlagAbsent (an unknown value reads as kReleased:
// either way the requester stops waiting), and setting it.
inline AbsentReason AbsentReasonOf(const WireHeader& h) {
  return h.aux == static_cast<uint64_t>(AbsentReason::kNotStarted) ? AbsentReason::kNotStarted
                                                                    : AbsentReason::kReleased;
}
inline void SetAbsentReason(AbsentReason reason, WireHeader* h) {
  h->aux = static_cast<uint64_t>(reason);
}

// The CedeMessage of a kCede; nullopt for an aux that is none (the packet is dropped and
// counted).
inline std::optional<CedeMessage> CedeMessageOf(const WireHeader& h) {
  if (h.aux < static_cast<uint64_t>(CedeMessage::kAsk) ||
      h.aux > static_cast<uint64_t>(CedeMessage::kRefused)) {
    return std::nullopt;
  }
  return static_cast<CedeMessage>(h.aux);
}
inline void SetCedeMessage(CedeMessage m, WireHeader* h) { h->aux = static_cast<uint64_t>(m); }

// A PING's aux: 0 for a liveness probe; kCloseProbe for a close probe (the sender's context
// is destroyed and lingers). The PONG answering a close probe carries a CloseReply.
inline constexpr uint64_t kCloseProbe = 1;
inline bool IsCloseProbe(const WireHeader& h) { return h.aux == kCloseProbe; }
inline void SetCloseProbe(WireHeader* h) { h->aux = kCloseProbe; }

// The aux of a PONG answering a close probe: kSettled when the answering side has nothing
// unacknowledged or queued for the prober (it needs nothing more from it; a released
// context's engine answers so too), kBusy otherwise.
enum class CloseReply : uint64_t {
  kBusy = 1,
  kSettled = 2,
};
inline bool IsCloseSettled(const WireHeader& h) {
  return h.aux == static_cast<uint64_t>(CloseReply::kSettled);
}
inline void SetCloseReply(CloseReply reply, WireHeader* h) {
  h->aux = static_cast<uint64_t>(reply);
}

// An ACK's aux: 1 + the sequence number of a packet that arrived twice since the last ack
// (DSACK), 0: none.
inline std::optional<uint64_t> AckDuplicateOf(const WireHeader& h) {
  if (h.aux == 0) return std::nullopt;
  return h.aux - 1;
}
inline void SetAckDuplicate(uint64_t seq, WireHeader* h) { h->aux = seq + 1; }

// An ABORT's aux: 1 + the rank the sender's failure blames, 0: none (a timeout). Reading
// it: the blamed rank, or -1 for none or a rank outside a context of context_size ranks.
inline int AbortBlamedRank(const WireHeader& h, int context_size) {
  if (h.aux == 0 || h.aux > static_cast<uint64_t>(context_size)) return -1;
  return static_cast<int>(h.aux - 1);
}
inline void SetAbortBlame(int rank, WireHeader* h) {
  h->aux = rank >= 0 ? static_cast<uint64_t>(rank) + 1 : 0;
}

// The type and flags of a datagram's header, read without checking anything else (magic,
// checksum, lengths): for a fault injector that picks the datagrams it drops by their
// kind. False if the datagram is shorter than a header.
struct HeaderKind {
  uint8_t type = 0;
  uint16_t flags = 0;
};
bool PeekHeaderKind(const uint8_t* data, size_t len, HeaderKind* out);

// Serialises h (with h.checksum ignored) into out[0..kHeaderBytes) and fills
// in the checksum over header + payload (header only if h.flags has
// kFlagHeaderChecksum). h.payload_length must equal payload_len.
void EncodeHeader(const WireHeader& h, const void* payload, size_t payload_len,
                  uint8_t* out);

// Validates a received datagram and decodes its header. On success the
// payload is data + kHeaderBytes with h->payload_length bytes.
// link_protects_payload: the receiving link cannot deliver a corrupted payload;
// when false, a datagram whose checksum covers only its header is refused
// (kBadChecksum) — its payload cannot be verified here.
ParseError ParseDatagram(const uint8_t* data, size_t len, WireHeader* h,
                         bool link_protects_payload = false);

// Decodes the header of a datagram this side sent, as a network error report quotes it
// back (ICMP carries the datagram's first bytes: payload and length cannot be checked).
// The header's own fields are checked as ParseDatagram checks them, and its checksum
// where it covers the header only (kFlagHeaderChecksum). kOk: *h holds the header.
ParseError ParseQuotedHeader(const uint8_t* data, size_t len, WireHeader* h);

std::string HeaderToString(const WireHeader& h);

// kRepair payload: the byte ranges [begin, end) of the bounded operation to send
// again, each two little-endian u64 (begin, then end).
inline constexpr size_t kRepairRangeBytes = 16;
using RepairRange = std::pair<uint64_t, uint64_t>;  // [begin, end)

// Writes ranges[0, n) into out[0, n * kRepairRangeBytes).
void EncodeRepairRanges(const RepairRange* ranges, size_t n, uint8_t* out);

// Ranges ParseRepairRanges dropped, by reason (the engine counts each in Stats).
struct RepairRangeRejects {
  uint64_t empty = 0;       // begin >= end
  uint64_t over_limit = 0;  // beyond max_ranges
};

// Decodes a kRepair payload of `len` bytes (a whole number of ranges: ParseDatagram
// refuses any other length; a trailing partial range is ignored). Appends its
// non-empty ranges to *out, at most max_ranges of them, and counts what it drops in
// *rejects.
void ParseRepairRanges(const uint8_t* payload, size_t len, size_t max_ranges,
                       std::vector<RepairRange>* out, RepairRangeRejects* rejects);

}  // namespace transport
}  // namespace optireduce
