// tc clsact program for the cloud lab: drops each IPv4 packet with probability
// DROP_PPM / 1e6 (set at compile time: clang -O2 -target bpf -DDROP_PPM=10000 ...).
// Non-IPv4 frames (ARP) pass, so neighbour discovery is never what fails.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef DROP_PPM
#define DROP_PPM 0
#endif

SEC("drop")
int random_drop(struct __sk_buff *skb) {
  if (skb->protocol != bpf_htons(ETH_P_IP)) return TC_ACT_OK;
  if (bpf_get_prandom_u32() % 1000000u < (__u32)DROP_PPM) return TC_ACT_SHOT;
  return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
