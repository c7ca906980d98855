// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* Zerolayer's kernel layer: per-flow counters and the client allowlist.
 *
 * Maps (pinned by name under the loader's pin root, /sys/fs/bpf/zerolayer):
 *   flows         LRU_HASH  flow_key -> flow_value. The key is the client's view of the flow
 *                 (saddr/sport = client, daddr/dport = server) whichever way the packet goes.
 *                 Ports are in host byte order; IPv4 addresses sit in the first 4 bytes of the
 *                 16-byte fields, the rest zero. family is AF_INET (2) or AF_INET6 (10), proto
 *                 IPPROTO_TCP (6) or IPPROTO_UDP (17). The tc programs add to last_ns/packets/
 *                 bytes in place; digests belong to userspace and are never written here.
 *                 bytes counts skb->len at the tc hook: the frame with its L2 header (14 bytes
 *                 on Ethernet, veth and loopback), without FCS.
 *   ports         HASH      u16 service port (host order) -> u8 1.
 *   allow         LPM_TRIE  lpm_key -> u8. Addresses are IPv6; IPv4 a.b.c.d/n is stored as the
 *                 v4-mapped ::ffff:a.b.c.d with prefixlen 96 + n.
 *   allow_config  ARRAY[1]  u32 enforce: 0 = allow everyone (an empty allowlist means allow
 *                 all), 1 = drop packets to service ports from sources not in `allow`.
 * The tc programs return TC_ACT_UNSPEC for what they pass, so filters after them still run,
 * and TC_ACT_SHOT for what the allowlist refuses.
 *
 *   verdicts      PERCPU_ARRAY[4] u64: TC_PASS, TC_DROP, XDP_PASS, XDP_DROP, counted for
 *                 packets to a service port seen on ingress.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define FLOW_DIGESTS 10
#define DIGEST_SIZE 32
#define AF_INET 2
#define AF_INET6 10

enum verdict_index { V_TC_PASS = 0, V_TC_DROP = 1, V_XDP_PASS = 2, V_XDP_DROP = 3, V_COUNT = 4 };

struct flow_key {
	__u8 family;
	__u8 proto;
	__u16 sport;
	__u16 dport;
	__u8 pad[2];
	__u8 saddr[16];
	__u8 daddr[16];
};

struct flow_value {
	__u64 last_ns;
	__u64 packets;
	__u64 bytes;
	__u8 digests[FLOW_DIGESTS][DIGEST_SIZE];
};

struct lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u16);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} allow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} allow_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, V_COUNT);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} verdicts SEC(".maps");

/* A parsed packet: addresses as on the wire, ports in host order. */
struct pkt {
	__u8 family;
	__u8 proto;
	__u16 sport;
	__u16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Parses Ethernet + IPv4/IPv6 (fixed header) + the first 4 bytes of TCP/UDP. 0 when parsed. */
static __always_inline int parse(void *data, void *data_end, struct pkt *p)
{
	struct ethhdr *eth = data;
	void *l4;

	if ((void *)(eth + 1) > data_end)
		return -1;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return -1;
		if (ip->ihl < 5 || (ip->frag_off & bpf_htons(0x1fff)))
			return -1; /* later fragments carry no ports */
		p->family = AF_INET;
		p->proto = ip->protocol;
		__builtin_memcpy(p->saddr, &ip->saddr, 4);
		__builtin_memcpy(p->daddr, &ip->daddr, 4);
		l4 = (void *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return -1;
		p->family = AF_INET6;
		p->proto = ip6->nexthdr;
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		l4 = (void *)(ip6 + 1);
	} else {
		return -1;
	}
	if (p->proto != IPPROTO_UDP && p->proto != IPPROTO_TCP)
		return -1;
	__u16 *l4ports = l4;
	if ((void *)(l4ports + 2) > data_end)
		return -1;
	p->sport = bpf_ntohs(l4ports[0]);
	p->dport = bpf_ntohs(l4ports[1]);
	return 0;
}

static __always_inline int is_service_port(__u16 port)
{
	return bpf_map_lookup_elem(&ports, &port) != NULL;
}

/* 1 when the source may reach the service ports. */
static __always_inline int source_allowed(const struct pkt *p)
{
	__u32 zero = 0;
	__u32 *enforce = bpf_map_lookup_elem(&allow_config, &zero);
	struct lpm_key key = {};

	if (!enforce || !*enforce)
		return 1;
	if (p->family == AF_INET) {
		key.prefixlen = 128;
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], p->saddr, 4);
	} else {
		key.prefixlen = 128;
		__builtin_memcpy(key.addr, p->saddr, 16);
	}
	return bpf_map_lookup_elem(&allow, &key) != NULL;
}

static __always_inline void count_verdict(__u32 index)
{
	__u64 *counter = bpf_map_lookup_elem(&verdicts, &index);

	if (counter)
		__sync_fetch_and_add(counter, 1);
}

static __always_inline void account(const struct pkt *p, int client_is_source, __u32 len)
{
	struct flow_key key = {};
	struct flow_value *value;

	key.family = p->family;
	key.proto = p->proto;
	if (client_is_source) {
		key.sport = p->sport;
		key.dport = p->dport;
		__builtin_memcpy(key.saddr, p->saddr, 16);
		__builtin_memcpy(key.daddr, p->daddr, 16);
	} else {
		key.sport = p->dport;
		key.dport = p->sport;
		__builtin_memcpy(key.saddr, p->daddr, 16);
		__builtin_memcpy(key.daddr, p->saddr, 16);
	}
	value = bpf_map_lookup_elem(&flows, &key);
	if (!value) {
		struct flow_value zero = {};

		/* NOEXIST: a value inserted meanwhile (by userspace or another CPU) is kept. */
		bpf_map_update_elem(&flows, &key, &zero, BPF_NOEXIST);
		value = bpf_map_lookup_elem(&flows, &key);
		if (!value)
			return;
	}
	value->last_ns = bpf_ktime_get_ns();
	__sync_fetch_and_add(&value->packets, 1);
	__sync_fetch_and_add(&value->bytes, len);
}

static __always_inline int handle_tc(struct __sk_buff *skb, int ingress)
{
	struct pkt p = {};
	int client_is_source;

	if ((void *)(long)skb->data + sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + 4 >
	    (void *)(long)skb->data_end)
		bpf_skb_pull_data(skb, sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + 4);
	if (parse((void *)(long)skb->data, (void *)(long)skb->data_end, &p))
		return TC_ACT_UNSPEC;
	if (is_service_port(p.dport))
		client_is_source = 1;
	else if (is_service_port(p.sport))
		client_is_source = 0;
	else
		return TC_ACT_UNSPEC;
	if (ingress && client_is_source) {
		if (!source_allowed(&p)) {
			count_verdict(V_TC_DROP);
			return TC_ACT_SHOT;
		}
		count_verdict(V_TC_PASS);
	}
	account(&p, client_is_source, skb->len);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int zl_tc_ingress(struct __sk_buff *skb)
{
	return handle_tc(skb, 1);
}

SEC("tc")
int zl_tc_egress(struct __sk_buff *skb)
{
	return handle_tc(skb, 0);
}

SEC("xdp")
int zl_xdp(struct xdp_md *ctx)
{
	struct pkt p = {};

	if (parse((void *)(long)ctx->data, (void *)(long)ctx->data_end, &p))
		return XDP_PASS;
	if (!is_service_port(p.dport))
		return XDP_PASS;
	if (!source_allowed(&p)) {
		count_verdict(V_XDP_DROP);
		return XDP_DROP;
	}
	count_verdict(V_XDP_PASS);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
