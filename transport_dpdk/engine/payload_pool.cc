// payload_pool.cc — see payload_pool.h.
#include "transport_dpdk/engine/payload_pool.h"

#include <cstring>
#include <new>
#include <utility>

namespace optireduce {
namespace transport {

namespace {
// The smallest class whose capacity holds `size`.
int ClassOf(size_t size) {
  int cls = 0;
  while ((PayloadPool::kMinCapacity << cls) < size) ++cls;
  return cls;
}
}  // namespace

PayloadPool::Bytes& PayloadPool::Bytes::operator=(Bytes&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = std::move(o.pool_);
    buf_ = std::move(o.buf_);
    size_ = std::exchange(o.size_, 0);
    cls_ = o.cls_;
  }
  return *this;
}

void PayloadPool::Bytes::Release() {
  if (buf_ && pool_) pool_->Give(std::move(buf_), cls_);
  buf_.reset();
  pool_.reset();
  size_ = 0;
}

std::shared_ptr<PayloadPool> PayloadPool::Create(size_t max_cached_bytes) {
  return std::shared_ptr<PayloadPool>(new PayloadPool(max_cached_bytes));
}

PayloadPool::Bytes PayloadPool::Take(size_t size) {
  Bytes b;
  if (size == 0) return b;
  const int cls = ClassOf(size);
  b.pool_ = shared_from_this();
  b.size_ = size;
  b.cls_ = cls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.taken;
    if (cls < kClasses && !free_[cls].empty()) {
      b.buf_ = std::move(free_[cls].back());
      free_[cls].pop_back();
      cached_bytes_ -= kMinCapacity << cls;
      ++counters_.reused;
      return b;
    }
  }
  // Not zeroed: every byte is written before it is read (a copy, or arrivals).
  b.buf_.reset(new uint8_t[cls < kClasses ? kMinCapacity << cls : size]);
  return b;
}

PayloadPool::Bytes PayloadPool::Copy(const void* data, size_t size) {
  Bytes b = Take(size);
  if (size > 0) std::memcpy(b.data(), data, size);
  return b;
}

void PayloadPool::Give(std::unique_ptr<uint8_t[]> buf, int cls) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cls >= kClasses || free_[cls].size() >= kMaxPerClass ||
      cached_bytes_ + (kMinCapacity << cls) > max_cached_bytes_) {
    ++counters_.freed;
    return;  // `buf` frees it
  }
  cached_bytes_ += kMinCapacity << cls;
  free_[cls].push_back(std::move(buf));
}

PayloadPool::Counters PayloadPool::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  Counters c = counters_;
  c.cached_bytes = cached_bytes_;
  return c;
}

}  // namespace transport
}  // namespace optireduce
