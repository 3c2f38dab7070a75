#include "transport_dpdk/io/dpdk/dpdk_port.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace optireduce {
namespace transport {
namespace dpdk {
namespace {

// rte_mempool_obj_iter callback: writes one byte per page of an mbuf's buffer.
void TouchMbuf(rte_mempool*, void*, void* obj, unsigned) {
  auto* m = static_cast<rte_mbuf*>(obj);
  auto* buf = static_cast<volatile uint8_t*>(m->buf_addr);
  for (uint32_t at = 0; at < m->buf_len; at += 4096) buf[at] = 0;
  if (m->buf_len > 0) buf[m->buf_len - 1] = 0;
}

// Per-port state that outlives a device.
struct PortSlot {
  bool in_use = false;
};

// Mempools are never freed (their mbufs may still sit in another port's
// ring) but are handed to the next port that needs one of their size.
struct PoolEntry {
  rte_mempool* pool = nullptr;
  uint32_t size = 0, room = 0;
  bool in_use = false;
};
std::vector<PoolEntry>& Pools() {
  static auto* p = new std::vector<PoolEntry>();
  return *p;
}

std::mutex& RegistryMu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::map<uint16_t, PortSlot>& Registry() {
  static auto* r = new std::map<uint16_t, PortSlot>();
  return *r;
}

std::string PortName(uint16_t id) {
  char name[RTE_ETH_NAME_MAX_LEN] = {};
  if (rte_eth_dev_get_name_by_port(id, name) != 0) return "?";
  return name;
}

std::string Reason(int ret) {
  return rte_strerror(ret < 0 ? -ret : ret);
}

// The devargs of a net_memif port that we use, with the PMD's defaults.
struct MemifDevargs {
  bool client = false;                  // role=client (or slave)
  std::string socket = "/run/memif.sock";
  std::string id = "0";
  bool abstract = true;                 // socket-abstract=no: a file
  uint32_t buffer_size = 0;             // bsize=N; 0 when absent
};

// The one parser of memif devargs; nullopt when the port is not a memif.
std::optional<MemifDevargs> MemifDevargsOf(const rte_eth_dev_info& info) {
  if (!info.driver_name || std::string(info.driver_name) != "net_memif" ||
      !info.device) {
    return std::nullopt;
  }
  MemifDevargs m;
  const rte_devargs* da = rte_dev_devargs(info.device);
  if (da == nullptr || da->args == nullptr) return m;
  for (absl::string_view kv : absl::StrSplit(da->args, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first == "role") m.client = p.second == "client" || p.second == "slave";
    if (p.first == "socket") m.socket = p.second;
    if (p.first == "id") m.id = p.second;
    if (p.first == "socket-abstract") m.abstract = p.second != "no";
    uint32_t bsize = 0;
    if (p.first == "bsize" && m.buffer_size == 0 && absl::SimpleAtoi(p.second, &bsize)) {
      m.buffer_size = bsize;
    }
  }
  return m;
}

// memif needs an ordering the PMD does not enforce: a client must not start
// (connect) before its server's queues exist, or the server's control thread
// dereferences unset queues (crash) or refuses the rings. The server
// publishes a marker file once started; the client waits for it.
MemifLink MemifLinkOf(const rte_eth_dev_info& info) {
  MemifLink m;
  const std::optional<MemifDevargs> args = MemifDevargsOf(info);
  if (!args) return m;
  m.is_memif = true;
  m.client = args->client;
  if (args->abstract) {
    std::string flat = args->socket;
    for (char& c : flat) if (c == '/') c = '_';
    m.marker = absl::StrCat("/tmp/optireduce_memif", flat, ".", args->id, ".ready");
  } else {
    m.marker = absl::StrCat(args->socket, ".", args->id, ".ready");
  }
  return m;
}

}  // namespace

std::string ListPorts() {
  std::string s;
  uint16_t id;
  RTE_ETH_FOREACH_DEV(id) {
    rte_eth_dev_info info{};
    rte_eth_dev_info_get(id, &info);
    absl::StrAppend(&s, s.empty() ? "" : ", ", id, ": ", PortName(id), " (",
                    info.driver_name ? info.driver_name : "?", ")");
  }
  return s.empty() ? "none" : s;
}

absl::StatusOr<uint16_t> FindPort(const std::string& spec) {
  uint32_t index = 0;
  if (absl::SimpleAtoi(spec, &index)) {
    if (index < RTE_MAX_ETHPORTS && rte_eth_dev_is_valid_port(index)) {
      return static_cast<uint16_t>(index);
    }
  } else {
    uint16_t id = 0;
    if (rte_eth_dev_get_port_by_name(spec.c_str(), &id) == 0) return id;
  }
  return absl::NotFoundError(absl::StrCat(
      "dpdk port '", spec, "' not found; ports: ", ListPorts()));
}

uint32_t OpenPort::MemifBufferSize(uint16_t port_id) {
  rte_eth_dev_info info{};
  if (rte_eth_dev_info_get(port_id, &info) != 0) return 0;
  const std::optional<MemifDevargs> args = MemifDevargsOf(info);
  return args ? args->buffer_size : 0;
}

uint32_t OpenPort::PortMtu(uint16_t port_id) {
  uint16_t mtu = 0;
  if (rte_eth_dev_get_mtu(port_id, &mtu) != 0) return 0;
  return mtu;
}

absl::StatusOr<std::unique_ptr<OpenPort>> OpenPort::Open(
    uint16_t port_id, const PortRequest& req) {
  std::unique_ptr<OpenPort> p(new OpenPort());
  p->id_ = port_id;
  p->name_ = PortName(port_id);
  const std::string what = absl::StrCat("dpdk port ", port_id, " (", p->name_, ")");

  PortSlot* slot;
  {
    std::lock_guard<std::mutex> lock(RegistryMu());
    slot = &Registry()[port_id];
    if (slot->in_use) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " is already used by another dpdk device in this process; "
                "give each device its own ports (attr.ports)"));
    }
    slot->in_use = true;
    p->claimed_ = true;
  }
  // From here on the destructor releases the slot.

  rte_eth_dev_info info{};
  int ret = rte_eth_dev_info_get(port_id, &info);
  if (ret != 0) {
    return absl::InternalError(absl::StrCat(what, ": rte_eth_dev_info_get: ", Reason(ret)));
  }

  rte_eth_conf conf{};
  const uint64_t want_tx = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  const uint64_t want_rx = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
  p->tx_ip_csum_ = info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_IPV4_CKSUM;
  p->tx_udp_csum_ = info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  p->rx_csum_ = (info.rx_offload_capa & want_rx) == want_rx;
  conf.txmode.offloads = info.tx_offload_capa & want_tx;
  conf.rxmode.offloads = p->rx_csum_ ? want_rx : 0;
  ret = rte_eth_dev_configure(port_id, 1, 1, &conf);
  if (ret != 0) {
    return absl::InternalError(absl::StrCat(what, ": rte_eth_dev_configure: ", Reason(ret)));
  }

  if (req.mtu > PortMtu(port_id)) {
    ret = rte_eth_dev_set_mtu(port_id, static_cast<uint16_t>(req.mtu));
    if (ret != 0 && !(info.max_mtu >= req.mtu && ret == -ENOTSUP)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " cannot take MTU ", req.mtu, " (its MTU is ", PortMtu(port_id),
          ", max ", info.max_mtu, "): ", Reason(ret)));
    }
  }

  uint16_t rxd = static_cast<uint16_t>(std::min<uint32_t>(req.rx_descriptors, 32768));
  uint16_t txd = static_cast<uint16_t>(std::min<uint32_t>(req.tx_descriptors, 32768));
  rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &rxd, &txd);
  p->rxd_ = rxd;
  p->txd_ = txd;

  // Mempool: rx ring + tx ring + bursts in flight + the frames the engine
  // holds between RxBurst calls + hellos, in mbufs big enough for a frame.
  const uint32_t room = std::max<uint32_t>(
      RTE_PKTMBUF_HEADROOM + ((req.max_frame + 63) / 64) * 64,
      RTE_MBUF_DEFAULT_BUF_SIZE);
  const uint32_t count = rxd + txd + 512 + req.extra_mbufs;
  {
    std::lock_guard<std::mutex> lock(RegistryMu());
    for (PoolEntry& e : Pools()) {
      if (!e.in_use && e.size >= count && e.room >= room) {
        e.in_use = true;
        p->pool_ = e.pool;
        break;
      }
    }
    if (!p->pool_) {
      static int generation = 0;
      const std::string pool_name =
          absl::StrCat("orp", getpid() % 100000, "_", generation++);
      // No per-lcore cache: the engine's progress thread is not an EAL lcore.
      rte_mempool* pool = rte_pktmbuf_pool_create(
          pool_name.c_str(), count, 0, 0, static_cast<uint16_t>(room),
          rte_eth_dev_socket_id(port_id) < 0 ? SOCKET_ID_ANY
                                             : rte_eth_dev_socket_id(port_id));
      if (!pool) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, ": cannot allocate a mempool of ", count, " mbufs of ", room,
            " bytes (", static_cast<uint64_t>(count) * (room + 256) >> 20,
            " MiB): ", rte_strerror(rte_errno),
            "; give the EAL more memory (-m) or lower the MTU / ring sizes"));
      }
      // Touch every mbuf's data room now: without hugepages the pool is plain
      // 4 KiB pages, and a page faulted in the middle of a transfer costs more
      // than the copy that touched it (a run of 30 allreduces of 1 MiB, 4 ranks
      // on 2 cores, spent its time in those faults: 20 ms per operation, 6 ms
      // once every mbuf had been used once).
      rte_mempool_obj_iter(pool, TouchMbuf, nullptr);
      Pools().push_back({pool, count, room, true});
      p->pool_ = pool;
    }
  }

  const int socket = rte_eth_dev_socket_id(port_id);
  const unsigned sock = socket < 0 ? SOCKET_ID_ANY : static_cast<unsigned>(socket);
  rte_eth_rxconf rxconf = info.default_rxconf;
  rxconf.offloads = conf.rxmode.offloads;
  ret = rte_eth_rx_queue_setup(port_id, 0, rxd, sock, &rxconf, p->pool_);
  if (ret != 0) {
    return absl::InternalError(absl::StrCat(what, ": rte_eth_rx_queue_setup(", rxd, "): ", Reason(ret)));
  }
  rte_eth_txconf txconf = info.default_txconf;
  txconf.offloads = conf.txmode.offloads;
  ret = rte_eth_tx_queue_setup(port_id, 0, txd, sock, &txconf);
  if (ret != 0) {
    return absl::InternalError(absl::StrCat(what, ": rte_eth_tx_queue_setup(", txd, "): ", Reason(ret)));
  }
  p->memif_ = MemifLinkOf(info);
  p->driver_ = info.driver_name ? info.driver_name : "";
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  if (p->memif_.client) {
    while (access(p->memif_.marker.c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        return absl::DeadlineExceededError(absl::StrCat(
            what, ": the memif server did not come up within 30 s (no ",
            p->memif_.marker, ")"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // A memif client cannot start before its server listens (EPERM): that
  // peer process may still be starting, so retry for a while.
  while ((ret = rte_eth_dev_start(port_id)) != 0) {
    if ((ret != -EPERM && ret != -ECONNREFUSED && ret != -ENOENT) ||
        std::chrono::steady_clock::now() > give_up) {
      return absl::UnavailableError(absl::StrCat(
          what, ": rte_eth_dev_start: ", Reason(ret),
          " (a memif client needs its server's socket)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  p->started_ = true;
  if (p->memif_.is_memif && !p->memif_.client) {
    // Publish "queues ready" for the client (see MemifLinkOf).
    FILE* f = fopen(p->memif_.marker.c_str(), "w");
    if (f) fclose(f);
  }
  rte_eth_promiscuous_enable(port_id);  // not every PMD can; not needed then

  rte_ether_addr mac{};
  rte_eth_macaddr_get(port_id, &mac);
  std::copy(mac.addr_bytes, mac.addr_bytes + 6, p->mac_.begin());
  return p;
}

void OpenPort::Watchdog(Clock::time_point now) {
  // Only a memif client can re-run its side of a failed handshake; other
  // ports (and memif servers, which just wait) are left alone.
  if (!memif_.client || now < next_check_) return;
  next_check_ = now + std::chrono::milliseconds(50);
  rte_eth_link link{};
  if (started_ && rte_eth_link_get_nowait(id_, &link) == 0 && link.link_status) {
    down_since_ = Clock::time_point{};
    restart_after_ = std::chrono::milliseconds(300);
    return;
  }
  if (down_since_ == Clock::time_point{}) down_since_ = now;
  if (now - down_since_ < restart_after_) return;
  if (started_) rte_eth_dev_stop(id_);
  started_ = rte_eth_dev_start(id_) == 0;
  ++restarts_;
  down_since_ = now;
  restart_after_ = std::min<Clock::duration>(2 * restart_after_, std::chrono::seconds(3));
}

OpenPort::~OpenPort() {
  if (started_) {
    // Free what is still queued for us, then stop (not close: a later device
    // may open the port again). Not on memif: its receive copies out of the
    // peer's shared memory, which a peer that exits at the same time unmaps
    // under us (SIGSEGV in the PMD, ~1 in 10 runs of the two-process test), and
    // none of our mbufs wait there.
    rte_mbuf* m[64];
    for (int i = 0; i < 1024 && !memif_.is_memif; ++i) {
      uint16_t n = rte_eth_rx_burst(id_, 0, m, 64);
      if (n == 0) break;
      rte_pktmbuf_free_bulk(m, n);
    }
    rte_eth_dev_stop(id_);
  }
  if (memif_.is_memif && !memif_.client) unlink(memif_.marker.c_str());
  std::lock_guard<std::mutex> lock(RegistryMu());
  if (claimed_) Registry()[id_].in_use = false;
  for (PoolEntry& e : Pools()) {
    if (pool_ && e.pool == pool_) e.in_use = false;
  }
}

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
