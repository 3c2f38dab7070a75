#include "transport_dpdk/gloo/address.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace optireduce {
namespace transport {
namespace {
// Layout: 0 magic u32 | 4 version u8 | 5..7 zero | 8 rank u32 | 12 size u32
//         | 16 context id u32 | 20 max datagram u32 | 24 token u64 | 32 io[32]
void Put(std::vector<char>& b, size_t off, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[off + i] = static_cast<char>(v >> (8 * i));
}
uint64_t Get(const std::vector<char>& b, size_t off, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) {
    v |= uint64_t(static_cast<uint8_t>(b[off + i])) << (8 * i);
  }
  return v;
}
}  // namespace

static_assert(Address::kBytes <= ::gloo::transport::Address::kMaxByteSize,
              "Gloo limits address size");
static_assert(32 + kIoAddressBytes == Address::kBytes, "address layout");

std::vector<char> Address::bytes() const {
  std::vector<char> b(kBytes, 0);
  Put(b, 0, kMagic, 4);
  Put(b, 4, kVersion, 1);
  Put(b, 8, static_cast<uint32_t>(rank_), 4);
  Put(b, 12, static_cast<uint32_t>(size_), 4);
  Put(b, 16, context_id_, 4);
  Put(b, 20, max_datagram_, 4);
  Put(b, 24, token_, 8);
  std::memcpy(b.data() + 32, io_.data(), kIoAddressBytes);
  return b;
}

absl::StatusOr<Address> Address::FromBytes(const std::vector<char>& b) {
  if (b.size() != kBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer address has ", b.size(), " bytes, expected ", kBytes,
        " (is the peer using another transport?)"));
  }
  if (Get(b, 0, 4) != kMagic) {
    return absl::InvalidArgumentError(
        "peer address has a bad magic number (not an optireduce address)");
  }
  if (Get(b, 4, 1) != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer address version ", Get(b, 4, 1), ", this build speaks ",
        kVersion));
  }
  Address a;
  a.rank_ = static_cast<int>(Get(b, 8, 4));
  a.size_ = static_cast<int>(Get(b, 12, 4));
  a.context_id_ = static_cast<uint32_t>(Get(b, 16, 4));
  a.max_datagram_ = static_cast<uint32_t>(Get(b, 20, 4));
  a.token_ = Get(b, 24, 8);
  std::memcpy(a.io_.data(), b.data() + 32, kIoAddressBytes);
  return a;
}

std::string Address::str() const {
  return absl::StrFormat("rank %d/%d ctx %u token %016x datagram %u io %02x%02x..",
                         rank_, size_, context_id_, token_, max_datagram_, io_[0], io_[1]);
}

}  // namespace transport
}  // namespace optireduce
