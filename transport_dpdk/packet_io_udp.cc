#include "transport_dpdk/packet_io_udp.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
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

  io->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io->wake_fd_ < 0) return absl::InternalError(Errno("eventfd"));

  // One extra byte per slot so truncated (oversized) datagrams are detected.
  const size_t slot = io->max_datagram_ + 1;
  io->rx_storage_.resize(slot * kRxBatch);
  for (size_t i = 0; i < kRxBatch; ++i) {
    io->rx_slots_.push_back(io->rx_storage_.data() + i * slot);
  }
  return io;
}

UdpPacketIo::~UdpPacketIo() {
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
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

size_t UdpPacketIo::TxBurst(const TxDatagram* d, size_t n) {
  size_t done = 0;
  while (done < n) {
    const size_t batch = std::min(kTxBatch, n - done);
    mmsghdr msgs[kTxBatch];
    iovec iov[kTxBatch][2];
    size_t m = 0;
    for (size_t i = 0; i < batch; ++i) {
      const TxDatagram& t = d[done + i];
      std::memset(&msgs[m], 0, sizeof(msgs[m]));
      iov[m][0] = {const_cast<void*>(t.head), t.head_len};
      iov[m][1] = {const_cast<void*>(t.body), t.body_len};
      msgs[m].msg_hdr.msg_iov = iov[m];
      msgs[m].msg_hdr.msg_iovlen = t.body_len ? 2 : 1;
      msgs[m].msg_hdr.msg_name =
          t.peer < peers_.size() ? &peers_[t.peer] : nullptr;
      msgs[m].msg_hdr.msg_namelen = sizeof(sockaddr_in);
      ++m;
    }
    int sent = sendmmsg(fd_, msgs, static_cast<unsigned>(m), 0);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
        return done;  // backpressure
      }
      if (errno == EINTR) continue;
      // A hard error on one datagram (e.g. ECONNREFUSED from an ICMP error,
      // EMSGSIZE): skip it like a loss and go on.
      ++done;
      continue;
    }
    done += static_cast<size_t>(sent);
    if (static_cast<size_t>(sent) < m) {
      // Partial: the next datagram failed. Probe it once more alone.
      continue;
    }
  }
  return done;
}

size_t UdpPacketIo::RxBurst(RxDatagram* out, size_t max) {
  const size_t want = std::min(max, kRxBatch);
  mmsghdr msgs[kRxBatch];
  iovec iov[kRxBatch];
  for (size_t i = 0; i < want; ++i) {
    std::memset(&msgs[i], 0, sizeof(msgs[i]));
    iov[i] = {rx_slots_[i], max_datagram_ + 1};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  int got = recvmmsg(fd_, msgs, static_cast<unsigned>(want), MSG_DONTWAIT,
                     nullptr);
  if (got <= 0) return 0;
  size_t n = 0;
  for (int i = 0; i < got; ++i) {
    if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) continue;  // oversized: drop
    out[n].data = rx_slots_[i];
    out[n].len = msgs[i].msg_len;
    ++n;
  }
  return n;
}

void UdpPacketIo::WaitForInput(std::chrono::microseconds timeout) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  timespec ts;
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  int rc = ppoll(fds, 2, &ts, nullptr);
  if (rc > 0 && (fds[1].revents & POLLIN)) {
    uint64_t v;
    while (read(wake_fd_, &v, sizeof(v)) == sizeof(v)) {
    }
  }
}

void UdpPacketIo::Wake() {
  uint64_t one = 1;
  ssize_t r = write(wake_fd_, &one, sizeof(one));
  (void)r;
}

}  // namespace transport
}  // namespace optireduce
