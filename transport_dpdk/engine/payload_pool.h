// payload_pool.h — reusable storage for the payload copies the engine makes: a send's
// bytes taken at PostSend (Gloo's TCP pair writes them into its socket inside send(),
// so callers may reuse the buffer at once), a detached send's copy, and the bytes of
// an eager message that arrive before its receive is posted.
//
// Why a pool: copies of 128 KiB and more are served by glibc malloc from fresh mmap or
// trimmed heap pages, so every copy of such a message first faults in its pages (the
// kernel zeroes each one) and the copy costs several times the memcpy. A buffer given
// back here is handed out again with its pages in place.
//
// Buffers come in power-of-two capacity classes (at least kMinCapacity). A class keeps
// at most kMaxPerClass free buffers and the pool at most max_cached_bytes in all; what
// does not fit is freed. Contents of a taken buffer are unspecified.
//
// Thread-safe: user threads take (PostSend), the progress thread gives back.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace optireduce {
namespace transport {

class PayloadPool : public std::enable_shared_from_this<PayloadPool> {
 public:
  static constexpr size_t kMinCapacity = 4096;
  static constexpr size_t kMaxPerClass = 8;

  // Storage of `size` bytes (capacity rounded up to a power of two), handed back to
  // its pool when destroyed. Move-only.
  class Bytes {
   public:
    Bytes() = default;
    Bytes(Bytes&& o) noexcept { *this = std::move(o); }
    Bytes& operator=(Bytes&& o) noexcept;
    Bytes(const Bytes&) = delete;
    Bytes& operator=(const Bytes&) = delete;
    ~Bytes() { Release(); }

    uint8_t* data() { return buf_.get(); }
    const uint8_t* data() const { return buf_.get(); }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    // Gives the storage back now (the object is then empty).
    void Release();

   private:
    friend class PayloadPool;
    std::shared_ptr<PayloadPool> pool_;
    std::unique_ptr<uint8_t[]> buf_;
    size_t size_ = 0;
    int cls_ = 0;
  };

  // What the pool did so far.
  struct Counters {
    uint64_t taken = 0;      // Take calls for at least one byte
    uint64_t reused = 0;     // of them served by a given-back buffer
    uint64_t freed = 0;      // given-back buffers freed (class or byte cap full)
    size_t cached_bytes = 0;  // free storage held now
  };

  static std::shared_ptr<PayloadPool> Create(size_t max_cached_bytes);

  // `size` bytes of storage (empty for 0).
  Bytes Take(size_t size);
  // Take(size) holding a copy of `data`.
  Bytes Copy(const void* data, size_t size);

  Counters counters() const;

 private:
  explicit PayloadPool(size_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}
  void Give(std::unique_ptr<uint8_t[]> buf, int cls);

  // Class c holds buffers of kMinCapacity << c bytes.
  static constexpr int kClasses = 24;  // up to 32 GiB
  const size_t max_cached_bytes_;
  mutable std::mutex mu_;
  std::array<std::vector<std::unique_ptr<uint8_t[]>>, kClasses> free_;
  size_t cached_bytes_ = 0;
  Counters counters_;
};

}  // namespace transport
}  // namespace optireduce
