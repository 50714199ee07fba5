/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fabep_info - what fabep sees in each libfabric provider it can use:
 * memory registration mode, ordering, fence, delivery complete, atomics,
 * limits, the usable signal strategies and the one fabep picks (and why),
 * the NIC's NUMA node; plus the library version and the kernel ISA level.
 * Opens no endpoint.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <rdma/fabric.h>

#include "utils/common.h"

struct bitname {
	uint64_t bit;
	const char *name;
};

#define BIT(x) { x, #x }

static const struct bitname caps_names[] = {
	BIT(FI_MSG), BIT(FI_RMA), BIT(FI_TAGGED), BIT(FI_ATOMIC),
	BIT(FI_MULTICAST), BIT(FI_COLLECTIVE), BIT(FI_READ), BIT(FI_WRITE),
	BIT(FI_RECV), BIT(FI_SEND), BIT(FI_REMOTE_READ), BIT(FI_REMOTE_WRITE),
	BIT(FI_MULTI_RECV), BIT(FI_FENCE), BIT(FI_TRIGGER), BIT(FI_HMEM),
	BIT(FI_VARIABLE_MSG), BIT(FI_RMA_PMEM), BIT(FI_SOURCE_ERR),
	BIT(FI_LOCAL_COMM), BIT(FI_REMOTE_COMM), BIT(FI_SHARED_AV),
	BIT(FI_RMA_EVENT), BIT(FI_SOURCE), BIT(FI_NAMED_RX_CTX),
	BIT(FI_DIRECTED_RECV),
	{ 0, NULL },
};

static const struct bitname mode_names[] = {
	BIT(FI_CONTEXT), BIT(FI_MSG_PREFIX), BIT(FI_ASYNC_IOV),
	BIT(FI_RX_CQ_DATA), BIT(FI_LOCAL_MR), BIT(FI_NOTIFY_FLAGS_ONLY),
	BIT(FI_RESTRICTED_COMP), BIT(FI_CONTEXT2), BIT(FI_BUFFERED_RECV),
	{ 0, NULL },
};

static const struct bitname mr_names[] = {
	BIT(FI_MR_BASIC), BIT(FI_MR_SCALABLE), BIT(FI_MR_LOCAL), BIT(FI_MR_RAW),
	BIT(FI_MR_VIRT_ADDR), BIT(FI_MR_ALLOCATED), BIT(FI_MR_PROV_KEY),
	BIT(FI_MR_MMU_NOTIFY), BIT(FI_MR_RMA_EVENT), BIT(FI_MR_ENDPOINT),
	BIT(FI_MR_HMEM), BIT(FI_MR_COLLECTIVE),
	{ 0, NULL },
};

static const struct bitname order_names[] = {
	BIT(FI_ORDER_RAR), BIT(FI_ORDER_RAW), BIT(FI_ORDER_RAS),
	BIT(FI_ORDER_WAR), BIT(FI_ORDER_WAW), BIT(FI_ORDER_WAS),
	BIT(FI_ORDER_SAR), BIT(FI_ORDER_SAW), BIT(FI_ORDER_SAS),
	BIT(FI_ORDER_DATA),
	BIT(FI_ORDER_RMA_RAR), BIT(FI_ORDER_RMA_RAW), BIT(FI_ORDER_RMA_WAR),
	BIT(FI_ORDER_RMA_WAW), BIT(FI_ORDER_ATOMIC_RAR),
	BIT(FI_ORDER_ATOMIC_RAW), BIT(FI_ORDER_ATOMIC_WAR),
	BIT(FI_ORDER_ATOMIC_WAW),
	{ 0, NULL },
};

/* "A|B|C" for the bits set (unknown ones in hex), or "none". */
static const char *bits_str(char *buf, size_t len, uint64_t v,
			    const struct bitname *names)
{
	size_t at = 0;

	buf[0] = '\0';
	for (const struct bitname *n = names; n->name; n++) {
		if (!(v & n->bit))
			continue;
		at += snprintf(buf + at, at < len ? len - at : 0, "%s%s",
			       at ? "|" : "", n->name);
		v &= ~n->bit;
	}
	if (v)
		at += snprintf(buf + at, at < len ? len - at : 0, "%s0x%llx",
			       at ? "|" : "", (unsigned long long)v);
	if (!at)
		snprintf(buf, len, "none");
	return buf;
}

static const char *signals_str(char *buf, size_t len, unsigned sigs,
			       const char *sep)
{
	size_t at = 0;

	buf[0] = '\0';
	for (int s = FABEP_SIGNAL_ORDERED; s <= FABEP_SIGNAL_CMA; s++) {
		if (!(sigs & (1u << s)))
			continue;
		at += snprintf(buf + at, at < len ? len - at : 0, "%s%s",
			       at ? sep : "", fabep_signal_name((fabep_signal_t)s));
	}
	if (!at)
		snprintf(buf, len, "none");
	return buf;
}

static const int info_accept[] = { 'p', 'd', 'm', 'V', 'h', 0 };

static const struct tool_help info_help[] = {
	{ 'p', NULL, "show only this provider (e.g. shm, tcp, sockets, verbs, efa)" },
	{ 'd', NULL, "show only this domain" },
	{ 'm', NULL,
	  "machine-readable output: one line of \"key: value\" pairs for the "
	  "library, then one per provider and domain" },
	{ 0, NULL, NULL },
};

static const struct tool_desc info_desc = {
	.name = "fabep_info",
	.args = NULL,
	.summary = "Show the libfabric providers fabep can use (FI_RMA, FI_EP_RDM), "
		   "what each grants, and the signal strategy fabep picks for it.",
	.accept = info_accept,
	.help = info_help,
	.max_args = 0,
	.epilog = "Exit status: 0 success, 1 no usable provider (or an error), "
		  "2 bad command line.\n",
};

#define MAX_DESCS 256

int main(int argc, char **argv)
{
	static fabep_provider_desc_t descs[MAX_DESCS];
	struct tool_opts o;
	char b1[512], b2[512], b3[512], b4[512], b5[128];
	int count = 0, shown = 0, ret;

	tool_parse(&info_desc, argc, argv, &o);

	descs[0].size = sizeof(descs[0]);  /* the element size */
	ret = fabep_provider_list(o.provider, descs, MAX_DESCS, &count);
	if (ret) {
		fprintf(stderr, "%s: fabep_provider_list: %s\n", tool_name,
			fabep_strerror(ret));
		return TOOL_EXIT_FAIL;
	}

	if (o.machine)
		printf("version: %s isa: %s\n", fabep_version(),
		       fabep_isa_name(fabep_isa()));
	else
		printf("fabep %s, kernels: %s\n", fabep_version(),
		       fabep_isa_name(fabep_isa()));

	for (int i = 0; i < count; i++) {
		const fabep_provider_desc_t *p = &descs[i];

		if (o.domain && strcmp(o.domain, p->domain))
			continue;
		shown++;
		bits_str(b1, sizeof(b1), p->caps, caps_names);
		bits_str(b2, sizeof(b2), p->mode, mode_names);
		bits_str(b3, sizeof(b3), (uint64_t)(unsigned)p->mr_mode, mr_names);
		bits_str(b4, sizeof(b4), p->msg_order, order_names);
		if (o.machine) {
			printf("provider: %s fabric: %s domain: %s caps: %s mode: %s "
			       "mr_mode: %s msg_order: %s fence: %d "
			       "delivery_complete: %d atomic_sum_u64: %d "
			       "atomic_count: %zu inject_size: %zu max_msg_size: %zu "
			       "rma_iov_limit: %zu cq_data_size: %zu signals: %s "
			       "signal: %s numa_node: %d why: %s\n",
			       p->provider, p->fabric[0] ? p->fabric : "-",
			       p->domain[0] ? p->domain : "-", b1, b2, b3, b4,
			       p->fence, p->delivery_complete, p->atomic_sum_u64,
			       p->atomic_count, p->inject_size, p->max_msg_size,
			       p->rma_iov_limit, p->cq_data_size,
			       signals_str(b5, sizeof(b5), p->signals, ","),
			       fabep_signal_name(p->signal), p->numa_node,
			       p->signal_why[0] ? p->signal_why : "-");
			continue;
		}
		printf("\nprovider: %s\n", p->provider);
		printf("    %-20s%s\n", "fabric:", p->fabric);
		printf("    %-20s%s\n", "domain:", p->domain);
		printf("    %-20s%s\n", "caps:", b1);
		printf("    %-20s%s\n", "mode:", b2);
		printf("    %-20s%s\n", "mr_mode:", b3);
		printf("    %-20s%s\n", "msg_order:", b4);
		printf("    %-20s%s\n", "fence:", p->fence ? "yes" : "no");
		printf("    %-20s%s\n", "delivery_complete:",
		       p->delivery_complete ? "yes" : "no");
		if (p->atomic_sum_u64)
			printf("    %-20syes, up to %zu per op\n", "atomic FI_SUM u64:",
			       p->atomic_count);
		else
			printf("    %-20sno\n", "atomic FI_SUM u64:");
		printf("    %-20s%zu\n", "inject_size:", p->inject_size);
		printf("    %-20s%zu\n", "max_msg_size:", p->max_msg_size);
		printf("    %-20s%zu\n", "rma_iov_limit:", p->rma_iov_limit);
		printf("    %-20s%zu\n", "cq_data_size:", p->cq_data_size);
		printf("    %-20s%s\n", "signals usable:",
		       signals_str(b5, sizeof(b5), p->signals, " "));
		printf("    %-20s%s%s%s%s\n", "signal chosen:",
		       fabep_signal_name(p->signal), p->signal_why[0] ? " (" : "",
		       p->signal_why, p->signal_why[0] ? ")" : "");
		if (p->numa_node >= 0)
			printf("    %-20s%d\n", "numa_node:", p->numa_node);
		else
			printf("    %-20sunknown\n", "numa_node:");
	}
	if (!shown) {
		fprintf(stderr, "%s: no usable provider%s%s%s%s\n", tool_name,
			o.provider ? " matches -p " : "",
			o.provider ? o.provider : "",
			o.domain ? " with domain " : "", o.domain ? o.domain : "");
		return TOOL_EXIT_FAIL;
	}
	return TOOL_EXIT_OK;
}
