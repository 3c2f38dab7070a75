#include "transport_dpdk/wire/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace optireduce {
namespace transport {
namespace {

struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

uint32_t SoftwareCrc(uint32_t crc, const uint8_t* p, size_t n) {
  static const Table table;
  for (size_t i = 0; i < n; ++i) crc = table.t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// One dependency chain of the crc32 instruction: 8 bytes per ~3 cycles (its latency).
__attribute__((target("sse4.2"))) uint32_t HardwareCrc(uint32_t crc,
                                                        const uint8_t* p,
                                                        size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}

// Longer inputs run three independent chains over three consecutive blocks of kBlock bytes
// (the instruction's throughput is one per cycle, three times its latency) and join them:
// the CRC register is linear, so crc(c, A||B) = Shift(crc(c, A)) ^ crc(0, B), where Shift
// appends kBlock zero bytes — a fixed 32x32 bit matrix, applied by four table lookups.
// Several block sizes, largest first, so that a jumbo frame's payload (~9 KB, the common
// case on the wire) also runs at three chains' speed, not only inputs of 12 KiB and more.
template <size_t kBlock>
struct ShiftTable {
  uint32_t t[4][256];
  ShiftTable() {
    static const uint8_t zeros[kBlock] = {};
    uint32_t basis[32];
    for (int b = 0; b < 32; ++b) basis[b] = HardwareCrc(1u << b, zeros, kBlock);
    for (int j = 0; j < 4; ++j) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t x = 0;
        for (int b = 0; b < 8; ++b) {
          if (v & (1u << b)) x ^= basis[8 * j + b];
        }
        t[j][v] = x;
      }
    }
  }
  uint32_t Shift(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

// Consumes whole groups of three kBlock-byte blocks from (*p, *n); returns the extended CRC.
template <size_t kBlock>
__attribute__((target("sse4.2"))) uint32_t ThreeChains(uint32_t crc, const uint8_t** p,
                                                        size_t* n) {
  static const ShiftTable<kBlock> shift;
  const uint8_t* q = *p;
  size_t left = *n;
  while (left >= 3 * kBlock) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t va, vb, vc;
      std::memcpy(&va, q + i, 8);
      std::memcpy(&vb, q + kBlock + i, 8);
      std::memcpy(&vc, q + 2 * kBlock + i, 8);
      a = _mm_crc32_u64(a, va);
      b = _mm_crc32_u64(b, vb);
      c = _mm_crc32_u64(c, vc);
    }
    crc = shift.Shift(shift.Shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
    q += 3 * kBlock;
    left -= 3 * kBlock;
  }
  *p = q;
  *n = left;
  return crc;
}

uint32_t HardwareCrc3(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ThreeChains<4096>(crc, &p, &n);
  crc = ThreeChains<1024>(crc, &p, &n);
  crc = ThreeChains<256>(crc, &p, &n);
  return HardwareCrc(crc, p, n);
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (HaveSse42()) return ~HardwareCrc3(crc, p, n);
#endif
  return ~SoftwareCrc(crc, p, n);
}

}  // namespace transport
}  // namespace optireduce
