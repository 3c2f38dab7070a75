#include "transport_dpdk/io/udp/packet_io_udp.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <linux/errqueue.h>
#include <netinet/ip_icmp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {
namespace {

constexpr uint8_t kUdpTag = 'U';
constexpr size_t kRxBatch = 64;
constexpr size_t kTxBatch = 64;
// UDP_SEGMENT limits: at most 64 segments (UDP_MAX_SEGMENTS on older kernels) and one IPv4
// packet's worth of payload per message. A received coalesced message is at most 64 KiB.
constexpr size_t kMaxSegments = 64;
constexpr size_t kMaxSegmentedBytes = 65000;
constexpr uint32_t kGroSlotBytes = 65536;

std::string Errno(const char* what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

// Sets a socket buffer size, trying the privileged variant first (it ignores
// net.core.[rw]mem_max); failures are tolerated.
void SetBuffer(int fd, int force_opt, int opt, size_t bytes) {
  int v = static_cast<int>(bytes);
  if (setsockopt(fd, SOL_SOCKET, force_opt, &v, sizeof(v)) != 0) {
    setsockopt(fd, SOL_SOCKET, opt, &v, sizeof(v));
  }
}

// MTU of the interface that carries `addr`, or 0 if unknown.
int InterfaceMtu(in_addr addr) {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return 0;
  int mtu = 0;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (sin->sin_addr.s_addr != addr.s_addr) continue;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) break;
    ifreq req{};
    std::strncpy(req.ifr_name, i->ifa_name, IFNAMSIZ - 1);
    if (ioctl(s, SIOCGIFMTU, &req) == 0) mtu = req.ifr_mtu;
    close(s);
    break;
  }
  freeifaddrs(ifs);
  return mtu;
}

}  // namespace

IoAddress UdpAddress(const sockaddr_in& sin) {
  IoAddress a{};
  a[0] = kUdpTag;
  std::memcpy(&a[2], &sin.sin_port, 2);
  std::memcpy(&a[4], &sin.sin_addr.s_addr, 4);
  return a;
}

absl::StatusOr<std::unique_ptr<UdpPacketIo>> UdpPacketIo::Create(
    const udp::attr& attr) {
  std::unique_ptr<UdpPacketIo> io(new UdpPacketIo());
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string host = attr.hostname.empty() ? "127.0.0.1" : attr.hostname;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp attr hostname '", host, "' does not resolve to IPv4: ",
        gai_strerror(rc)));
  }
  io->local_ = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  io->local_.sin_port = htons(attr.port);

  io->fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (io->fd_ < 0) return absl::InternalError(Errno("socket"));
  SetBuffer(io->fd_, SO_RCVBUFFORCE, SO_RCVBUF, attr.socket_buffer_bytes);
  SetBuffer(io->fd_, SO_SNDBUFFORCE, SO_SNDBUF, attr.socket_buffer_bytes);
  int got = 0;
  socklen_t glen = sizeof(got);
  getsockopt(io->fd_, SOL_SOCKET, SO_RCVBUF, &got, &glen);
  io->rcvbuf_bytes_ = static_cast<size_t>(got);
  if (bind(io->fd_, reinterpret_cast<sockaddr*>(&io->local_),
           sizeof(io->local_)) != 0) {
    return absl::UnavailableError(absl::StrCat(
        Errno("bind"), " (", host, ":", attr.port, ")"));
  }
  socklen_t len = sizeof(io->local_);
  getsockname(io->fd_, reinterpret_cast<sockaddr*>(&io->local_), &len);

  size_t max_datagram = attr.max_datagram;
  if (max_datagram == 0) {
    const bool loopback =
        (ntohl(io->local_.sin_addr.s_addr) >> 24) == 127;
    const int mtu = InterfaceMtu(io->local_.sin_addr);
    max_datagram = loopback ? 65000 : (mtu > 576 ? mtu - 28 : 1472);
  }
  if (max_datagram < 256 || max_datagram > 65507) {
    return absl::InvalidArgumentError(absl::StrCat(
        "udp attr max_datagram ", max_datagram, " outside [256, 65507]"));
  }
  io->max_datagram_ = static_cast<uint32_t>(max_datagram);

  // ICMP errors for datagrams we send go to the error queue with the address
  // they were sent to; an unconnected socket hears of them only this way. A
  // port unreachable tells that a peer's process is gone if the datagram it
  // quotes is one we sent (TakeUnreachable; the engine checks the quote).
  int recverr = 1;
  if (setsockopt(io->fd_, IPPROTO_IP, IP_RECVERR, &recverr, sizeof(recverr)) != 0) {
    return absl::InternalError(Errno("setsockopt(IP_RECVERR)"));
  }

  io->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io->wake_fd_ < 0) return absl::InternalError(Errno("eventfd"));
  io->waiter_wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io->waiter_wake_fd_ < 0) return absl::InternalError(Errno("eventfd"));

  if (attr.segmentation_offload) {
    // The kernel says whether it has the options; a device that cannot segment is found at
    // the first send (TxBurst falls back).
    int off = 0;
    io->gso_ = setsockopt(io->fd_, IPPROTO_UDP, UDP_SEGMENT, &off, sizeof(off)) == 0;
    int on = 1;
    io->gro_ = setsockopt(io->fd_, IPPROTO_UDP, UDP_GRO, &on, sizeof(on)) == 0;
  }
  // One extra byte per slot so truncated (oversized) datagrams are detected; with GRO a
  // slot holds a whole coalesced message.
  const size_t slot = io->gro_ ? kGroSlotBytes + 1 : io->max_datagram_ + 1;
  io->rx_slot_bytes_ = static_cast<uint32_t>(slot);
  io->rx_pending_.reserve(kRxBatch * kMaxSegments);
  io->rx_storage_.resize(slot * kRxBatch);
  for (size_t i = 0; i < kRxBatch; ++i) {
    io->rx_slots_.push_back(io->rx_storage_.data() + i * slot);
  }
  return io;
}

UdpPacketIo::~UdpPacketIo() {
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (waiter_wake_fd_ >= 0) close(waiter_wake_fd_);
}

std::string UdpPacketIo::Describe() const {
  return absl::StrCat("udp ", AddressToString(LocalAddress()));
}

IoAddress UdpPacketIo::LocalAddress() const { return UdpAddress(local_); }

std::string UdpPacketIo::AddressToString(const IoAddress& a) const {
  if (a[0] != kUdpTag) return "<not a udp address>";
  in_addr ip;
  uint16_t port;
  std::memcpy(&port, &a[2], 2);
  std::memcpy(&ip.s_addr, &a[4], 4);
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &ip, buf, sizeof(buf));
  return absl::StrCat(buf, ":", ntohs(port));
}

absl::StatusOr<PeerHandle> UdpPacketIo::ResolvePeer(const IoAddress& a) {
  if (a[0] != kUdpTag) {
    return absl::InvalidArgumentError("peer address is not a udp address");
  }
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  std::memcpy(&sin.sin_port, &a[2], 2);
  std::memcpy(&sin.sin_addr.s_addr, &a[4], 4);
  if (sin.sin_port == 0) {
    return absl::InvalidArgumentError("udp peer address has port 0");
  }
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].sin_port == sin.sin_port &&
        peers_[i].sin_addr.s_addr == sin.sin_addr.s_addr) {
      return static_cast<PeerHandle>(i);
    }
  }
  peers_.push_back(sin);
  return static_cast<PeerHandle>(peers_.size() - 1);
}

// How many datagrams from d[i] on can leave as one segmented message: same peer, all the
// size of the first but the last (which may be shorter), within the kernel's limits.
size_t SegmentRun(const TxDatagram* d, size_t i, size_t n) {
  const size_t first = d[i].head_len + d[i].body_len;
  size_t k = 1;
  size_t total = first;
  while (i + k < n && k < kMaxSegments && d[i + k].peer == d[i].peer) {
    const size_t len = d[i + k].head_len + d[i + k].body_len;
    if (len > first || len == 0 || total + len > kMaxSegmentedBytes) break;
    total += len;
    ++k;
    if (len < first) break;  // a shorter datagram ends a run
  }
  return k;
}

size_t UdpPacketIo::TxBurst(const TxDatagram* d, size_t n) {
  constexpr size_t kIov = 2 * kTxBatch * 4;
  size_t done = 0;
  while (done < n) {
    mmsghdr msgs[kTxBatch];
    iovec iov[kIov];
    alignas(cmsghdr) char control[kTxBatch][CMSG_SPACE(sizeof(uint16_t))];
    size_t count[kTxBatch];  // datagrams in each message
    size_t m = 0, used = 0, i = done;
    while (m < kTxBatch && i < n) {
      size_t k = gso_ ? SegmentRun(d, i, n) : 1;
      if (used + 2 * k > kIov) {
        if (m > 0) break;  // the next sendmmsg takes it
        k = kIov / 2;
      }
      mmsghdr& msg = msgs[m];
      std::memset(&msg, 0, sizeof(msg));
      msg.msg_hdr.msg_iov = &iov[used];
      for (size_t j = 0; j < k; ++j) {
        const TxDatagram& t = d[i + j];
        iov[used++] = {const_cast<void*>(t.head), t.head_len};
        if (t.body_len) iov[used++] = {const_cast<void*>(t.body), t.body_len};
      }
      msg.msg_hdr.msg_iovlen = static_cast<size_t>(&iov[used] - msg.msg_hdr.msg_iov);
      msg.msg_hdr.msg_name = d[i].peer < peers_.size() ? &peers_[d[i].peer] : nullptr;
      msg.msg_hdr.msg_namelen = sizeof(sockaddr_in);
      if (k > 1) {
        msg.msg_hdr.msg_control = control[m];
        msg.msg_hdr.msg_controllen = sizeof(control[m]);
        cmsghdr* c = CMSG_FIRSTHDR(&msg.msg_hdr);
        c->cmsg_level = IPPROTO_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        const uint16_t segment = static_cast<uint16_t>(d[i].head_len + d[i].body_len);
        std::memcpy(CMSG_DATA(c), &segment, sizeof(segment));
      }
      count[m++] = k;
      i += k;
    }
    int sent = sendmmsg(fd_, msgs, static_cast<unsigned>(m), 0);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
        return done;  // backpressure
      }
      if (errno == EINTR) continue;
      if (errno == ECONNREFUSED) {
        // The error of an earlier ICMP report (IP_RECVERR), returned once and
        // cleared: nothing was sent; the report itself is in the error queue.
        errors_pending_.store(true, std::memory_order_relaxed);
        continue;
      }
      if (count[0] > 1) {
        // The route's device cannot segment (EIO), or a limit of this kernel (EINVAL,
        // EMSGSIZE): one datagram per message from now on, starting with these.
        gso_ = false;
        continue;
      }
      // A hard error on one datagram (e.g. EMSGSIZE): skip it like a loss and go on.
      ++done;
      continue;
    }
    for (int j = 0; j < sent; ++j) {
      done += count[j];
      segmented_sends_ += count[j] > 1;
    }
    // Partial: the next message failed; the loop probes it again at the front.
  }
  return done;
}

size_t UdpPacketIo::RxBurst(RxDatagram* out, size_t max) {
  if (rx_pending_next_ == rx_pending_.size()) {
    rx_pending_.clear();
    rx_pending_next_ = 0;
    mmsghdr msgs[kRxBatch];
    iovec iov[kRxBatch];
    alignas(cmsghdr) char control[kRxBatch][CMSG_SPACE(sizeof(int))];
    // Without GRO every message is one datagram: take no more than the caller can hold.
    const size_t want = gro_ ? kRxBatch : std::min(max, kRxBatch);
    for (size_t i = 0; i < want; ++i) {
      std::memset(&msgs[i], 0, sizeof(msgs[i]));
      iov[i] = {rx_slots_[i], rx_slot_bytes_};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      if (gro_) {
        msgs[i].msg_hdr.msg_control = control[i];
        msgs[i].msg_hdr.msg_controllen = sizeof(control[i]);
      }
    }
    int got = recvmmsg(fd_, msgs, static_cast<unsigned>(want), MSG_DONTWAIT, nullptr);
    if (got < 0 && (errno == ECONNREFUSED)) {
      errors_pending_.store(true, std::memory_order_relaxed);  // see TxBurst
    }
    if (got <= 0) return 0;
    for (int i = 0; i < got; ++i) {
      msghdr& h = msgs[i].msg_hdr;
      if (h.msg_flags & MSG_TRUNC) continue;  // oversized: drop
      const uint32_t len = msgs[i].msg_len;
      uint32_t segment = len;
      for (cmsghdr* c = gro_ ? CMSG_FIRSTHDR(&h) : nullptr; c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
          int s = 0;
          std::memcpy(&s, CMSG_DATA(c), sizeof(s));
          if (s > 0) segment = static_cast<uint32_t>(s);
        }
      }
      // A coalesced message is datagrams of `segment` bytes back to back (the last may be
      // shorter); each goes to the engine on its own.
      coalesced_receives_ += segment < len;
      for (uint32_t at = 0; at < len; at += segment) {
        const uint32_t piece = std::min(segment, len - at);
        // Oversized: dropped, as MSG_TRUNC drops it without GRO.
        if (piece <= max_datagram_) rx_pending_.push_back({rx_slots_[i] + at, piece});
      }
    }
  }
  size_t n = 0;
  while (n < max && rx_pending_next_ < rx_pending_.size()) {
    out[n++] = rx_pending_[rx_pending_next_++];
  }
  return n;
}

namespace {
// Blocks in ppoll on fds[0..n) for at most timeout; a readable eventfd (every fd but the
// socket, which is `socket_at`, -1 if absent) is drained. Returns whether the socket
// reported an error (POLLERR).
bool PollFds(pollfd* fds, int n, int socket_at, std::chrono::microseconds timeout) {
  timespec ts;
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  const int rc = ppoll(fds, n, &ts, nullptr);
  if (rc <= 0) return false;
  for (int i = 0; i < n; ++i) {
    if (i == socket_at || !(fds[i].revents & POLLIN)) continue;
    uint64_t v;
    while (read(fds[i].fd, &v, sizeof(v)) == sizeof(v)) {
    }
  }
  return socket_at >= 0 && (fds[socket_at].revents & POLLERR);
}
}  // namespace

void UdpPacketIo::WaitForInput(std::chrono::microseconds timeout) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  // POLLERR stays up until the error queue is read: the next TakeUnreachable does.
  if (PollFds(fds, 2, 0, timeout)) errors_pending_.store(true, std::memory_order_relaxed);
}

void UdpPacketIo::WaitForWake(std::chrono::microseconds timeout) {
  pollfd fds[1] = {{wake_fd_, POLLIN, 0}};
  PollFds(fds, 1, -1, timeout);
}

void UdpPacketIo::WaitAsWaiter(std::chrono::microseconds timeout) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {waiter_wake_fd_, POLLIN, 0}};
  if (PollFds(fds, 2, 0, timeout)) errors_pending_.store(true, std::memory_order_relaxed);
}

size_t UdpPacketIo::TakeUnreachable(UnreachableReport* out, size_t max) {
  if (!errors_pending_.exchange(false, std::memory_order_relaxed)) return 0;
  size_t n = 0;
  for (int budget = 256; budget > 0; --budget) {
    sockaddr_in from{};
    alignas(cmsghdr) char control[512];
    // The kernel hands over the UDP payload of the datagram the ICMP message quotes (as
    // much of it as the message carries): the engine's header comes first.
    uint8_t quoted[kQuotedBytes];
    iovec iov = {quoted, sizeof(quoted)};
    msghdr m{};
    m.msg_name = &from;
    m.msg_namelen = sizeof(from);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    const ssize_t got = recvmsg(fd_, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (got < 0) break;  // EAGAIN: drained
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != IPPROTO_IP || c->cmsg_type != IP_RECVERR) continue;
      sock_extended_err e;
      std::memcpy(&e, CMSG_DATA(c), sizeof(e));
      // Only "port unreachable" says the peer's socket is closed; other reports
      // (host unreachable while a route or neighbour settles, fragmentation
      // needed) may pass: reliability and the liveness probes handle those.
      if (e.ee_origin != SO_EE_ORIGIN_ICMP || e.ee_type != ICMP_DEST_UNREACH ||
          e.ee_code != ICMP_PORT_UNREACH) {
        continue;
      }
      ++unreachable_reports_;
      for (size_t i = 0; i < peers_.size() && n < max; ++i) {
        if (peers_[i].sin_port == from.sin_port &&
            peers_[i].sin_addr.s_addr == from.sin_addr.s_addr) {
          UnreachableReport& r = out[n++];
          r.peer = static_cast<PeerHandle>(i);
          r.link_down = false;
          r.quoted_len = static_cast<uint32_t>(got);
          std::memcpy(r.quoted.data(), quoted, static_cast<size_t>(got));
        }
      }
    }
    if (n == max) {
      errors_pending_.store(true, std::memory_order_relaxed);  // more next time
      break;
    }
  }
  return n;
}

void UdpPacketIo::Wake() {
  uint64_t one = 1;
  ssize_t r = write(wake_fd_, &one, sizeof(one));
  (void)r;
}

void UdpPacketIo::WakeWaiter() {
  uint64_t one = 1;
  ssize_t r = write(waiter_wake_fd_, &one, sizeof(one));
  (void)r;
}

}  // namespace transport
}  // namespace optireduce
