// tc clsact program for the cloud lab: drops IPv4 packets in one of three patterns, chosen
// at compile time (clang -O2 -g -target bpf -DDROP_PATTERN=... ; cloudlab.py builds one
// object per setting). Non-IPv4 frames (ARP) pass, so neighbour discovery is never what
// fails.
//
//   DROP_PATTERN 0 (random): each packet independently with probability DROP_PPM / 1e6.
//   DROP_PATTERN 1 (burst):  Gilbert-Elliott with a lossless good state and an all-loss
//                            bad state: a packet that meets the bad state is dropped; after
//                            each packet the chain moves good->bad with probability
//                            GOOD_TO_BAD_PPM / 1e6 and bad->good with BAD_TO_GOOD_PPM / 1e6.
//                            cloudlab.py sets them from the average loss P and the mean burst
//                            length B: P / (B (1 - P)) and 1 / B, so the bad state's share
//                            (the loss rate) is P and a burst lasts B packets on average.
//                            A packet that arrives more than BURST_IDLE_NS after the link's
//                            previous one meets the good state: a loss episode is a stretch
//                            of the wire's time, and a sender that went quiet (waiting for
//                            a retransmission timeout) has left it. Without that bound a
//                            chain counted in packets keeps a quiet flow's retransmissions
//                            in the bad state: a TCP sender needs about B of them to leave
//                            it, a minute of timeout backoff from 200 ms at B = 8. Cut
//                            bursts make the injected share somewhat smaller than P on links
//                            that idle often (drop_counts() measures it).
//   DROP_PATTERN 2 (small):  each packet whose IPv4 total length is at most MAX_LEN bytes
//                            with probability DROP_PPM / 1e6; larger packets always pass.
//                            Pure TCP ACKs and the engine's ack datagrams are small, data
//                            packets are not (cloudlab.py documents the threshold).
#include <stddef.h>

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef DROP_PATTERN
#define DROP_PATTERN 0
#endif
#ifndef DROP_PPM
#define DROP_PPM 0
#endif
#ifndef GOOD_TO_BAD_PPM
#define GOOD_TO_BAD_PPM 0
#endif
#ifndef BAD_TO_GOOD_PPM
#define BAD_TO_GOOD_PPM 1000000
#endif
#ifndef BURST_IDLE_NS
#define BURST_IDLE_NS 1000000
#endif
#ifndef MAX_LEN
#define MAX_LEN 0
#endif

static __always_inline int chance(__u32 ppm) {
  return bpf_get_prandom_u32() % 1000000u < ppm;
}

#if DROP_PATTERN == 1
// The chain's state, one per loaded program, so one per link: tc's libbpf
// loader creates the map when it loads the object. The map is shared by every CPU and
// updated without atomics: two CPUs that handle packets of the link at the same time may
// both act on the old state, so a transition can be lost or doubled. The pattern is then
// approximately, not exactly, Gilbert-Elliott; on a lab link the packets of one flow are
// mostly handled one at a time.
struct chain {
  __u64 last_ns;  // when the link's previous packet arrived
  __u32 bad;      // 0 good, 1 bad
  __u32 pad;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct chain);
} burst_state SEC(".maps");
#endif

SEC("drop")
int drop_packets(struct __sk_buff *skb) {
  if (skb->protocol != bpf_htons(ETH_P_IP)) return TC_ACT_OK;
#if DROP_PATTERN == 1
  __u32 key = 0;
  struct chain *c = bpf_map_lookup_elem(&burst_state, &key);
  if (!c) return TC_ACT_OK;
  const __u64 now = bpf_ktime_get_ns();
  if (now - c->last_ns > BURST_IDLE_NS) c->bad = 0;
  c->last_ns = now;
  if (c->bad) {
    if (chance(BAD_TO_GOOD_PPM)) c->bad = 0;
    return TC_ACT_SHOT;
  }
  if (chance(GOOD_TO_BAD_PPM)) c->bad = 1;
  return TC_ACT_OK;
#elif DROP_PATTERN == 2
  __be16 tot_len;
  if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tot_len), &tot_len,
                         sizeof(tot_len)) < 0) {
    return TC_ACT_OK;
  }
  if (bpf_ntohs(tot_len) > MAX_LEN) return TC_ACT_OK;
  return chance(DROP_PPM) ? TC_ACT_SHOT : TC_ACT_OK;
#else
  return chance(DROP_PPM) ? TC_ACT_SHOT : TC_ACT_OK;
#endif
}

char _license[] SEC("license") = "GPL";
