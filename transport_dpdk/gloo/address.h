// address.h — what a rank publishes for one pair through rendezvous:
// backend address, context id, rank, context size, session token and the
// largest datagram the rank sends and receives, in a fixed 64-byte
// little-endian layout (every rank's bytes() has the same length, as
// connectFullMesh requires).
#pragma once

#include <string>
#include <vector>

#include <gloo/transport/address.h>

#include "absl/status/statusor.h"
#include "transport_dpdk/io/packet_io.h"

namespace optireduce {
namespace transport {

class Address : public ::gloo::transport::Address {
 public:
  static constexpr size_t kBytes = 64;
  static constexpr uint32_t kMagic = 0x4144524Fu;  // "ORDA"
  static constexpr uint8_t kVersion = 2;

  Address() = default;
  Address(const IoAddress& io, int rank, int size, uint32_t context_id,
          uint64_t token, uint32_t max_datagram)
      : io_(io), rank_(rank), size_(size), context_id_(context_id),
        token_(token), max_datagram_(max_datagram) {}

  static absl::StatusOr<Address> FromBytes(const std::vector<char>& bytes);

  std::string str() const override;
  std::vector<char> bytes() const override;

  const IoAddress& io() const { return io_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  uint32_t context_id() const { return context_id_; }
  uint64_t token() const { return token_; }
  uint32_t max_datagram() const { return max_datagram_; }

 private:
  IoAddress io_{};
  int rank_ = -1;
  int size_ = 0;
  uint32_t context_id_ = 0;
  uint64_t token_ = 0;
  uint32_t max_datagram_ = 0;
};

}  // namespace transport
}  // namespace optireduce
