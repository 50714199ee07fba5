/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * signal.c - put and put + signal.
 *
 * Data goes with fi_write into the peer's heap; arrival is announced by an
 * atomic FI_SUM on a uint64 counter in the peer's heap, or, without
 * atomics, by remote CQ data that the target's progress adds into the same
 * counter word.  libfabric does not order a write before a later atomic on
 * every provider, hence four strategies:
 *
 *   ordered   FI_ORDER_WAW granted for tx and rx: post write, post atomic.
 *   fence     FI_FENCE on the atomic.
 *   delivery  writes with FI_DELIVERY_COMPLETE; reap their completions;
 *             then the atomics.  One round trip per batch, not per peer.
 *   cqdata    fi_writedata: the data and the signal are one operation.
 *   cma       shm only: plain writes, their local completions reaped,
 *             then the atomics.  libfabric promises only that a local
 *             completion frees the source buffer; shm (1.17,
 *             smr_generic_rma) performs a write with one
 *             process_vm_writev by the initiator, before fi_write
 *             returns and before its completion, when the domain has
 *             FI_MR_VIRT_ADDR, the endpoint asks for no RMA ordering,
 *             the write carries neither FI_REMOTE_CQ_DATA nor
 *             FI_DELIVERY_COMPLETE, it names one remote iov and CMA
 *             works between the two processes.  fabep sets up all of
 *             these and checks what it cannot set (fep_cma_usable,
 *             fep_cma_reach); nothing else counts on it.
 *
 * Counters never reset; waits are counter >= target.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/uio.h>

#include "util/util.h"
#include "fabric/fabric.h"

enum { OP_WRITE = FEP_OP_WRITE, OP_ATOMIC = FEP_OP_ATOMIC,
       OP_WRITEDATA = FEP_OP_WRITEDATA, OP_READ = FEP_OP_READ };

const char *fep_signal_name(fabep_signal_t s)
{
	switch (s) {
	case FABEP_SIGNAL_AUTO: return "auto";
	case FABEP_SIGNAL_ORDERED: return "ordered";
	case FABEP_SIGNAL_FENCE: return "fence";
	case FABEP_SIGNAL_DELIVERY: return "delivery";
	case FABEP_SIGNAL_CQDATA: return "cqdata";
	case FABEP_SIGNAL_CMA: return "cma";
	}
	return "invalid";
}

bool fep_signal_supported(const fabep_provider_desc_t *d, fabep_signal_t s)
{
	bool atom = d->atomic_sum_u64 && d->atomic_count > 0;

	switch (s) {
	case FABEP_SIGNAL_ORDERED:
		return atom && (d->msg_order & FI_ORDER_WAW);
	case FABEP_SIGNAL_FENCE:
		/* sockets (1.17) grants FI_FENCE, but its fenced atomics fail
		 * with -FI_EIO once several ranks signal one target (measured:
		 * 3 ranks, every run), so fabep does not use it there. */
		return atom && d->fence && !fep_prov_is(d->provider, "sockets");
	case FABEP_SIGNAL_DELIVERY:
		return atom && d->delivery_complete;
	case FABEP_SIGNAL_CQDATA:
		return d->cq_data_size >= 4;
	case FABEP_SIGNAL_CMA:
		return atom && fep_prov_is(d->provider, "shm") &&
		       (d->mr_mode & FI_MR_VIRT_ADDR) && fep_cma_usable(NULL, 0);
	default:
		return false;
	}
}

/*
 * The default.  Remote CQ data carries data and signal in one operation
 * and needs no software-emulated atomic, so it is first wherever it
 * exists (docs/performance.md has the pingpong figures of each strategy);
 * then native ordering, then a fence, then delivery-complete (one extra
 * round trip per batch).
 */
static fabep_signal_t fep_signal_choose_portable(const fabep_provider_desc_t *d,
						 char *why, size_t len);

fabep_signal_t fep_signal_choose(const fabep_provider_desc_t *d, char *why,
				 size_t len)
{
	fabep_signal_t s;
	char no_cma[96];
	size_t used;

	if (d->signals & (1u << FABEP_SIGNAL_CMA)) {
		snprintf(why, len, "shm with CMA: the sender's process_vm_writev "
			 "completes each write within fi_write (beyond libfabric's "
			 "promise); below 4 ranks of several threads, cqdata with "
			 "a channel per thread");
		return FABEP_SIGNAL_CMA;
	}
	s = fep_signal_choose_portable(d, why, len);
	/* on shm, say why its fast path is not used */
	if (!strcmp(d->provider, "shm") && why && len) {
		if (fep_cma_usable(no_cma, sizeof(no_cma)))
			snprintf(no_cma, sizeof(no_cma), "%s",
				 !(d->mr_mode & FI_MR_VIRT_ADDR) ?
				 "no FI_MR_VIRT_ADDR" : "not every rank reaches every other");
		used = strlen(why);
		if (used + 1 < len)
			snprintf(why + used, len - used, "; cma not used: %s", no_cma);
	}
	return s;
}

static fabep_signal_t fep_signal_choose_portable(const fabep_provider_desc_t *d,
						 char *why, size_t len)
{
	if (d->signals & (1u << FABEP_SIGNAL_CQDATA)) {
		snprintf(why, len, "remote CQ data (%zu bytes): write and signal "
			 "in one operation, no emulated atomic", d->cq_data_size);
		return FABEP_SIGNAL_CQDATA;
	}
	if (d->signals & (1u << FABEP_SIGNAL_ORDERED)) {
		snprintf(why, len, "FI_ORDER_WAW granted: write then atomic, "
			 "no wait between them");
		return FABEP_SIGNAL_ORDERED;
	}
	if (d->signals & (1u << FABEP_SIGNAL_FENCE)) {
		snprintf(why, len, "no write-after-write ordering; FI_FENCE granted");
		return FABEP_SIGNAL_FENCE;
	}
	if (d->signals & (1u << FABEP_SIGNAL_DELIVERY)) {
		snprintf(why, len, "no ordering, fence or CQ data; writes with "
			 "FI_DELIVERY_COMPLETE are reaped before the atomic");
		return FABEP_SIGNAL_DELIVERY;
	}
	snprintf(why, len, "no usable atomics (FI_SUM on FI_UINT64) and no "
		 "remote CQ data");
	return FABEP_SIGNAL_AUTO;
}

/* The word peers write over in fep_cma_reach (with its own value). */
#define FEP_CMA_MAGIC 0x636d612d70726f62ull
static volatile uint64_t fep_cma_probe_word = FEP_CMA_MAGIC;

uint64_t fep_cma_word(void)
{
	return (uint64_t)(uintptr_t)&fep_cma_probe_word;
}

bool fep_cma_reach(pid_t pid, uint64_t addr)
{
	uint64_t v = FEP_CMA_MAGIC;
	struct iovec l = { .iov_base = &v, .iov_len = sizeof(v) };
	struct iovec r = { .iov_base = (void *)(uintptr_t)addr,
			   .iov_len = sizeof(v) };

	return process_vm_writev(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof(v);
}

/* Whether the effective capabilities hold CAP_SYS_PTRACE (bit 19). */
static bool fep_cap_ptrace(void)
{
	char line[128];
	unsigned long long caps = 0;
	bool found = false;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &caps) == 1) {
			found = true;
			break;
		}
	fclose(f);
	return found && (caps & (1ull << 19));
}

bool fep_cma_usable(char *why, size_t len)
{
	const char *e = getenv("FI_SHM_DISABLE_CMA");
	FILE *f;
	int scope = 0;

	if (!why || !len) {
		static char none[2];

		why = none;
		len = sizeof(none);
	}
	/* libfabric's boolean parameters: 1, on, yes, true (any case) */
	if (e && (!strcmp(e, "1") || !strcasecmp(e, "on") ||
		  !strcasecmp(e, "yes") || !strcasecmp(e, "true") ||
		  !strcasecmp(e, "y"))) {
		snprintf(why, len, "FI_SHM_DISABLE_CMA is set");
		return false;
	}
	if (!fep_cma_reach(getpid(), fep_cma_word())) {
		snprintf(why, len, "process_vm_writev is not permitted here "
			 "(seccomp or no kernel support)");
		return false;
	}
	/* Yama: 1 lets a process reach only its descendants, 2 needs
	 * CAP_SYS_PTRACE, 3 nobody; shm's ranks are siblings */
	f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
	if (f) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = 0;
		fclose(f);
	}
	if (scope >= 3 || (scope >= 1 && !fep_cap_ptrace())) {
		snprintf(why, len, "kernel.yama.ptrace_scope is %d%s", scope,
			 scope < 3 ? " without CAP_SYS_PTRACE" : "");
		return false;
	}
	snprintf(why, len, "process_vm_writev permitted");
	return true;
}

FEP_EXPORT const char *fabep_signal_name(fabep_signal_t sig)
{
	return fep_signal_name(sig);
}

FEP_EXPORT int fabep_signal_parse(const char *name, fabep_signal_t *sig)
{
	static const fabep_signal_t all[] = {
		FABEP_SIGNAL_AUTO, FABEP_SIGNAL_ORDERED, FABEP_SIGNAL_FENCE,
		FABEP_SIGNAL_DELIVERY, FABEP_SIGNAL_CQDATA, FABEP_SIGNAL_CMA,
	};
	size_t i;

	if (!name || !sig) {
		fep_err("fabep_signal_parse: NULL %s", !name ? "name" : "output");
		return -EINVAL;
	}
	for (i = 0; i < FEP_ARRAY_SIZE(all); i++)
		if (!strcmp(name, fep_signal_name(all[i]))) {
			*sig = all[i];
			return 0;
		}
	fep_err("fabep_signal_parse: \"%s\" is not one of "
		"auto|ordered|fence|delivery|cqdata|cma", name);
	return -EINVAL;
}

static int fep_op_get(fep_fabric_t *fab, int peer, int kind,
		      struct fep_op **out)
{
	struct fep_stall st = { { 0, 0 }, 0 };
	int ret;

	while (!fab->free_ops) {
		ret = fep_fabric_stall(fab, &st);
		if (ret == -ETIMEDOUT)
			fep_err("no operation context freed within %d ms (%zu outstanding)",
				fab->timeout_ms, fab->outstanding);
		if (ret)
			return ret;
	}
	*out = fab->free_ops;
	fab->free_ops = (*out)->next;
	(*out)->seq = ++fab->op_seq;
	(*out)->peer = peer;
	(*out)->kind = kind;
	fab->outstanding++;
	if (kind != OP_ATOMIC)
		fab->writes++;
	return 0;
}

static void fep_op_unget(fep_fabric_t *fab, struct fep_op *op)
{
	op->next = fab->free_ops;
	fab->free_ops = op;
	fab->outstanding--;
	if (op->kind != OP_ATOMIC)
		fab->writes--;
}

/* A post that failed at once.  Whatever it was to carry is lost and its
 * peer, waiting for it, cannot be told: the fabric is failed (tx_error,
 * the post's error), so every later call fails at once instead of
 * waiting on what never comes.  One that finds no connection to its peer
 * (sockets: -FI_ENOENT from its connection map once a rank's process is
 * gone, even for posts to the ranks still there; a reset or refused
 * socket elsewhere) means a lost rank, as a failed completion does: the
 * liveness check names the rank that is gone (given the grace of a failed
 * completion for the first failure, under the same conditions), else the
 * post's peer is the lost one.  Either way the fabric is failed
 * (tx_error), so nothing, fabep_comm_destroy included, waits for the
 * peers again. */
static int post_failed(fep_fabric_t *fab, int peer, const char *what, int r)
{
	switch (r) {
	case -FI_ENOENT:
	case -FI_ENOTCONN:
	case -FI_ECONNREFUSED:
	case -FI_ECONNRESET:
	case -FI_ECONNABORTED:
	case -FI_EHOSTUNREACH:
	case -FI_ENETUNREACH:
	case -FI_ENETDOWN:
		break;
	default:
		fep_err("%s to rank %d: %s", what, peer, fi_strerror(-r));
		if (!fab->tx_error)
			fab->tx_error = r;
		return r;
	}
	fep_err("%s to rank %d: %s (no connection to it)", what, peer,
		fi_strerror(-r));
	if (fep_fabric_name_lost(fab, fep_fab_lost_grace(fab)) != -FABEP_ERR_PEER_LOST) {
		fep_err("rank %d is lost: no connection to it", peer);
		fab->peers[peer].lost = 1;
	}
	if (!fab->tx_error)
		fab->tx_error = -FABEP_ERR_PEER_LOST;
	return -FABEP_ERR_PEER_LOST;
}

/* Retry a post while it says EAGAIN, progressing both CQs. */
#define FEP_POST(fab, peer, what, call)                                          \
	({                                                                       \
		struct fep_stall st_ = { { 0, 0 }, 0 };                          \
		ssize_t r_;                                                      \
		for (;;) {                                                       \
			FEP_TSAN_PROGRESS_BEGIN();                               \
			r_ = FEP_FAULT(what, (call));                            \
			FEP_TSAN_PROGRESS_END();                                 \
			if (r_ != -FI_EAGAIN)                                    \
				break;                                           \
			r_ = fep_fabric_stall(fab, &st_);                        \
			if (r_ == -ETIMEDOUT)                                    \
				fep_err("%s to rank %d: no progress for %d ms",  \
					what, peer, (fab)->timeout_ms);          \
			if (r_)                                                  \
				break;                                           \
		}                                                                \
		if (r_ && r_ != -ETIMEDOUT && r_ != -FABEP_ERR_PEER_LOST)        \
			r_ = post_failed(fab, peer, what, (int)r_);              \
		(int)r_;                                                         \
	})

static int fep_check_peer(fep_fabric_t *fab, int peer)
{
	if (peer < 0 || peer >= fab->size) {
		fep_err("rank %d is not in [0, %d)", peer, fab->size);
		return -EINVAL;
	}
	if (fab->peers[peer].lost) {
		fep_err("rank %d was lost earlier", peer);
		return -FABEP_ERR_PEER_LOST;
	}
	return 0;
}

/* The local bytes of a put: at its heap offset, or at its pointer. */
static inline uint8_t *put_buf(fep_fabric_t *fab, const struct fep_put *p)
{
	return p->src == FEP_PUT_PTR ? (uint8_t *)(uintptr_t)p->ptr :
				       (uint8_t *)fep_heap_at(fab, p->src);
}

/* A local buffer's descriptor: the heap's inside it; none outside (a
 * caller's buffer, where the provider needs no local registration). */
static inline bool in_heap(const fep_fabric_t *fab, const void *b)
{
	uintptr_t h = (uintptr_t)fab->heap, a = (uintptr_t)b;

	return a >= h && a - h < fab->heap_size;
}

static inline void *buf_desc(const fep_fabric_t *fab, const void *b)
{
	return in_heap(fab, b) ? fab->heap_desc : NULL;
}

/* One write of cnt local pieces (buf[i], len[i] bytes) to one contiguous
 * remote range at dst, with CQ data if data; their total is at most
 * max_msg_size and cnt at most iov_max (-EINVAL, logged, otherwise). */
static int fep_post_writev(fep_fabric_t *fab, int peer, uint64_t dst,
			   uint8_t *const *buf, const size_t *len, size_t cnt,
			   uint64_t flags, bool data, uint64_t cqdata)
{
	struct fep_peer *p = &fab->peers[peer];
	struct iovec iov[FEP_IOV_MAX];
	void *desc[FEP_IOV_MAX];
	struct fi_rma_iov rma = { .addr = p->base + dst, .len = 0, .key = p->key };
	struct fi_msg_rma msg = {
		.msg_iov = iov, .desc = desc, .iov_count = cnt,
		.addr = p->addr, .rma_iov = &rma, .rma_iov_count = 1,
		.data = cqdata,
	};
	struct fep_op *op;
	size_t i;
	int ret;

	/* past what the provider takes it would refuse the write or, with
	 * more pieces than iov[] holds, this would overrun it */
	if (!cnt || cnt > fab->iov_max) {
		fep_err("write of %zu pieces to rank %d: the provider takes 1 to %zu",
			cnt, peer, fab->iov_max);
		return -EINVAL;
	}
	for (i = 0; i < cnt; i++) {
		iov[i].iov_base = buf[i];
		iov[i].iov_len = len[i];
		desc[i] = buf_desc(fab, buf[i]);
		rma.len += len[i];
		/* where the provider needs registered local buffers, a write
		 * from outside the heap would fail in it or, worse, read
		 * through a stale translation: refuse it here */
		if (len[i] && !fep_fab_ptr_ok(fab) && !in_heap(fab, buf[i])) {
			fep_err("write of %zu bytes from %p, outside the heap: "
				"the provider needs registered local buffers",
				len[i], (void *)buf[i]);
			return -EFAULT;
		}
	}
	if (rma.len > fab->max_msg_size) {
		fep_err("write of %zu bytes to rank %d: the provider's messages "
			"end at %zu", rma.len, peer, fab->max_msg_size);
		return -EINVAL;
	}
	ret = fep_op_get(fab, peer, data ? OP_WRITEDATA : OP_WRITE, &op);
	if (ret)
		return ret;
	msg.context = op;
	if (data)
		flags |= FI_REMOTE_CQ_DATA;
	if (!flags && cnt == 1)
		ret = FEP_POST(fab, peer, "fi_write",
			       fi_write(fab->ep, iov[0].iov_base, len[0], desc[0],
					p->addr, rma.addr, p->key, op));
	else
		ret = FEP_POST(fab, peer, "fi_writemsg",
			       fi_writemsg(fab->ep, &msg, flags | FI_COMPLETION));
	if (ret) {
		fep_op_unget(fab, op);
	} else if (flags & FI_DELIVERY_COMPLETE) {
		op->dc = true;
		p->dc_out++;
	}
	return ret;
}

static int fep_post_write(fep_fabric_t *fab, int peer, uint64_t dst,
			  uint8_t *buf, size_t len, uint64_t flags, bool data,
			  uint64_t cqdata)
{
	return fep_post_writev(fab, peer, dst, &buf, &len, 1, flags, data, cqdata);
}

/* len bytes from buf to dst at peer, in writes of at most max_msg_size. */
static int write_buf(fep_fabric_t *fab, int peer, uint64_t dst, uint8_t *buf,
		     size_t len, uint64_t flags)
{
	int ret = 0;

	while (!ret && len) {
		size_t n = FEP_MIN(len, fab->max_msg_size);

		ret = fep_post_write(fab, peer, dst, buf, n, flags, false, 0);
		dst += n;
		buf += n;
		len -= n;
	}
	return ret;
}

static int fep_check_range(fep_fabric_t *fab, uint64_t dst, uint64_t src, size_t len)
{
	if (!fep_heap_range_ok(fab, dst, len) || !fep_heap_range_ok(fab, src, len)) {
		fep_err("put of %zu bytes from offset %llu to %llu leaves the heap "
			"(%zu bytes)", len, (unsigned long long)src,
			(unsigned long long)dst, fab->heap_size);
		return -ERANGE;
	}
	return 0;
}

/* A put's ranges: its destination in the heap, and its source there or,
 * from a pointer, where the provider reads unregistered memory. */
static int check_put_range(fep_fabric_t *fab, const struct fep_put *p)
{
	if (p->src != FEP_PUT_PTR)
		return fep_check_range(fab, p->dst, p->src, p->len);
	if (!fep_fab_ptr_ok(fab) || (!p->ptr && p->len)) {
		fep_err("put of %zu bytes from %p: %s", p->len, p->ptr,
			p->ptr ? "the provider needs registered local buffers" :
				 "NULL source");
		return -EINVAL;
	}
	if (!fep_heap_range_ok(fab, p->dst, p->len)) {
		fep_err("put of %zu bytes to offset %llu leaves the heap (%zu "
			"bytes)", p->len, (unsigned long long)p->dst, fab->heap_size);
		return -ERANGE;
	}
	return 0;
}

int fep_fab_write(fep_fabric_t *fab, int peer, uint64_t dst, uint64_t src,
		  size_t len, uint64_t flags)
{
	int ret = fep_check_peer(fab, peer);

	if (!ret)
		ret = fep_check_range(fab, dst, src, len);
	if (!ret)
		ret = write_buf(fab, peer, dst, fep_heap_at(fab, src), len, flags);
	return ret;
}

int fep_fab_read(fep_fabric_t *fab, int peer, void *buf, uint64_t src,
		 size_t len)
{
	uint8_t *b = buf;
	void *desc = buf_desc(fab, buf);
	int ret = fep_check_peer(fab, peer);

	if (!ret && !fep_heap_range_ok(fab, src, len)) {
		fep_err("read of %zu bytes from offset %llu of rank %d leaves "
			"the heap (%zu bytes)", len, (unsigned long long)src, peer,
			fab->heap_size);
		ret = -ERANGE;
	}
	if (!ret && !in_heap(fab, buf) && !fep_fab_ptr_ok(fab)) {
		fep_err("read into %p, outside the heap: the provider needs "
			"registered local buffers", buf);
		ret = -EINVAL;
	}
	while (!ret && len) {
		struct fep_peer *p = &fab->peers[peer];
		size_t n = FEP_MIN(len, fab->max_msg_size);
		struct fep_op *op;

		ret = fep_op_get(fab, peer, OP_READ, &op);
		if (ret)
			break;
		ret = FEP_POST(fab, peer, "fi_read",
			       fi_read(fab->ep, b, n, desc, p->addr, p->base + src,
				       p->key, op));
		if (ret)
			fep_op_unget(fab, op);
		b += n;
		src += n;
		len -= n;
	}
	return ret;
}

uint64_t fep_fab_write_flags(const fep_fabric_t *fab)
{
	return fab->signal == FABEP_SIGNAL_DELIVERY ? FI_DELIVERY_COMPLETE : 0;
}

/* Whether a write's CQ data can name the counter at heap offset sig
 * (its index in the low cq_idx_bits, the add above them). */
static bool cq_names(const fep_fabric_t *fab, uint64_t sig)
{
	return fab->cq_data_size && !((sig / 8) >> fab->cq_idx_bits);
}

/* Whether signals may travel as CQ data: cqdata, cma's inline puts,
 * the sender's copies. */
static bool cq_signals(const fep_fabric_t *fab)
{
	return fab->cq_data_size && (fab->signal == FABEP_SIGNAL_CQDATA ||
				     fab->signal == FABEP_SIGNAL_CMA ||
				     fab->sender_copy);
}

/* The most of an add one write's CQ data carries (above the index). */
static uint64_t cq_add_max(const fep_fabric_t *fab)
{
	unsigned addbits = (fab->cq_data_size >= 8 ? 64 : 32) - fab->cq_idx_bits;

	return (1ull << addbits) - 1;
}

bool fep_fab_ctrs_named(const fep_fabric_t *fab, uint64_t off, size_t bytes)
{
	return !cq_signals(fab) || !bytes ||
	       cq_names(fab, off + FEP_ALIGN_UP(bytes, 8) - 8);
}

static int fep_check_sig_as(fep_fabric_t *fab, uint64_t sig, bool cqdata)
{
	if ((sig & 7) || !fep_heap_range_ok(fab, sig, 8)) {
		fep_err("signal counter offset %llu is not an 8-byte aligned heap "
			"offset", (unsigned long long)sig);
		return -EINVAL;
	}
	if (cqdata && !cq_names(fab, sig)) {
		fep_err("signal counter offset %llu is beyond what %zu-byte CQ data "
			"can name", (unsigned long long)sig, fab->cq_data_size);
		return -ERANGE;
	}
	return 0;
}

static int fep_check_sig(fep_fabric_t *fab, uint64_t sig)
{
	return fep_check_sig_as(fab, sig, fab->signal == FABEP_SIGNAL_CQDATA);
}

/* With channels an add counts nchan times: it must stay in range. */
static int fep_check_add(const fep_fabric_t *fab, uint64_t add)
{
	if (add > UINT64_MAX / (uint64_t)fab->nchan) {
		fep_err("signal add %llu is too large for %d channels (at most %llu)",
			(unsigned long long)add, fab->nchan,
			(unsigned long long)(UINT64_MAX / (uint64_t)fab->nchan));
		return -ERANGE;
	}
	return 0;
}

/* The most zero-byte writes of CQ data a caller's add may take: each
 * carries at most 2^24 - 1 of it (2^8 - 1 with 4-byte CQ data), and an
 * add beyond what FEP_CQ_ADD_WRITES of them carry is refused rather than
 * posted as millions of writes (the library's own adds count chunks, and
 * are bounded by the handles' sizes). */
#define FEP_CQ_ADD_WRITES 1024

int fep_fab_user_add_ok(const fep_fabric_t *fab, uint64_t add)
{
	uint64_t maxadd = cq_add_max(fab) * FEP_CQ_ADD_WRITES / (uint64_t)fab->nchan;

	if (cq_signals(fab) && add > maxadd) {
		fep_err("signal add %llu is too large for the %s strategy with "
			"%zu-byte CQ data and %d channel%s (at most %llu): signal "
			"less at a time", (unsigned long long)add,
			fep_signal_name(fab->signal), fab->cq_data_size, fab->nchan,
			fab->nchan == 1 ? "" : "s", (unsigned long long)maxadd);
		return -ERANGE;
	}
	return 0;
}

/* cqdata: the counter index and the amount, packed into the CQ data. */
static int fep_cqdata_pack(fep_fabric_t *fab, uint64_t sig, uint64_t add,
			   uint64_t *data, uint64_t *rest)
{
	uint64_t maxadd = cq_add_max(fab);
	uint64_t a = add > maxadd ? maxadd : add;

	*data = (sig / 8) | (a << fab->cq_idx_bits);
	*rest = add - a;
	return 0;
}

/* cqdata: add to peer's counter sig in zero-byte writes that carry the
 * CQ data, as many as the add needs (none for 0): the signal of writes
 * already posted. */
static int cqdata_signal(fep_fabric_t *fab, int peer, uint64_t sig,
			 uint64_t add)
{
	uint64_t data;
	int ret = 0;

	while (!ret && add) {
		fep_cqdata_pack(fab, sig, add, &data, &add);
		ret = fep_post_write(fab, peer, sig, fep_heap_at(fab, sig), 0, 0,
				     true, data);
	}
	return ret;
}

static int fep_post_atomic(fep_fabric_t *fab, int peer, uint64_t sig,
			   uint64_t add)
{
	struct fep_peer *p = &fab->peers[peer];
	struct fep_op *op;
	uint64_t flags = FI_COMPLETION;
	struct fi_ioc ioc;
	struct fi_rma_ioc rma = { .addr = p->base + sig, .count = 1, .key = p->key };
	struct fi_msg_atomic msg = { 0 };
	int ret;

	ret = fep_op_get(fab, peer, OP_ATOMIC, &op);
	if (ret)
		return ret;
	op->operand = add;
	ioc.addr = &op->operand;
	ioc.count = 1;
	msg.msg_iov = &ioc;
	msg.desc = &fab->ops_desc;
	msg.iov_count = 1;
	msg.addr = p->addr;
	msg.rma_iov = &rma;
	msg.rma_iov_count = 1;
	msg.datatype = FI_UINT64;
	msg.op = FI_SUM;
	msg.context = op;
	if (fab->signal == FABEP_SIGNAL_FENCE)
		flags |= FI_FENCE;
	if (flags == FI_COMPLETION)
		ret = FEP_POST(fab, peer, "fi_atomic",
			       fi_atomic(fab->ep, &op->operand, 1, fab->ops_desc,
					 p->addr, rma.addr, p->key, FI_UINT64,
					 FI_SUM, op));
	else
		ret = FEP_POST(fab, peer, "fi_atomicmsg",
			       fi_atomicmsg(fab->ep, &msg, flags));
	if (ret)
		fep_op_unget(fab, op);
	else
		fab->sig_unreaped += p->dc_out != 0;
	return ret;
}

int fep_fab_signal(fep_fabric_t *fab, int peer, uint64_t sig, uint64_t add)
{
	int ret = fep_check_peer(fab, peer);

	if (!ret)
		ret = fep_check_sig(fab, sig);
	if (!ret)
		ret = fep_check_add(fab, add);
	if (ret)
		return ret;
	add *= (uint64_t)fab->nchan;
	if (fab->signal == FABEP_SIGNAL_CQDATA) {
		/* a zero-byte write that carries the CQ data */
		uint64_t data, rest = add;

		do {
			fep_cqdata_pack(fab, sig, rest, &data, &rest);
			ret = fep_post_write(fab, peer, sig, fep_heap_at(fab, sig), 0, 0,
				     true, data);
		} while (!ret && rest);
		return ret;
	}
	return fep_post_atomic(fab, peer, sig, add);
}

static int put_many(fep_fabric_t *fab, const struct fep_put *puts, size_t n);
static int put_writes(fep_fabric_t *fab, const struct fep_put *puts, size_t n,
		      uint64_t wflags);
static int put_cqdata(fep_fabric_t *fab, const struct fep_put *puts, size_t n,
		      uint64_t mult);
static bool put_inline(const fep_fabric_t *fab, const struct fep_put *p);
static int puts_not_inline(fep_fabric_t *fab, const struct fep_put *puts,
			   size_t n, const struct fep_put **big, size_t *nbig);
static int put_then_signal(fep_fabric_t *fab, const struct fep_put *puts,
			   size_t n, uint64_t wflags, bool cq_signal,
			   uint64_t mult);
static int put_signals(fep_fabric_t *fab, const struct fep_put *puts,
		       size_t n, bool inl, bool cq_signal, uint64_t mult);

/* *list = fab->slices, with room for n puts; -ENOMEM without. */
static int slices_room(fep_fabric_t *fab, size_t n, struct fep_put **list)
{
	struct fep_put *l;

	if (fab->slices_cap < n) {
		l = realloc(fab->slices, n * sizeof(*l));
		if (!l)
			return -ENOMEM;
		fab->slices = l;
		fab->slices_cap = n;
	}
	*list = fab->slices;
	return 0;
}

/* Slice j of s of put p into q: 64-byte boundaries, the last slice
 * ending the put; the slices' adds share total out. */
static void put_slice(const struct fep_put *p, size_t s, size_t j,
		      uint64_t total, struct fep_put *q)
{
	size_t b0 = (p->len * j / s) & ~(size_t)63;
	size_t b1 = j + 1 < s ? (p->len * (j + 1) / s) & ~(size_t)63 : p->len;

	*q = *p;
	q->dst += b0;
	if (q->src == FEP_PUT_PTR)
		q->ptr = (const uint8_t *)q->ptr + b0;
	else
		q->src += b0;
	q->len = b1 - b0;
	q->add = total / s + (j < total % s);
}

/* Channels: share every put with a signal of at least two slices' bytes
 * over the channels, each slice signalled on its own channel; its adds,
 * in units of the channel count, sum to the put's. */
static int put_sliced(fep_fabric_t *fab, const struct fep_put *puts, size_t n)
{
	size_t nch = (size_t)fab->nchan, i, c, cnt[FEP_MAX_CHANNELS] = { 0 };
	struct fep_put *list;
	int ret;

	ret = slices_room(fab, n * nch, &list);  /* channel c's at list[c * n ...] */
	if (ret)
		return ret;
	for (i = 0; i < n; i++) {
		const struct fep_put *p = &puts[i];
		uint64_t total = p->add * (uint64_t)fab->nchan;
		size_t s = p->add ? FEP_MIN(nch, p->len / FEP_SLICE_MIN) : 1, j;

		if (s <= 1) {
			list[cnt[0]] = *p;
			list[cnt[0]++].add = total;
			continue;
		}
		for (j = 0; j < s; j++)
			put_slice(p, s, j, total, &list[j * n + cnt[j]++]);
	}
	for (c = 0; c < nch; c++) {
		ret = put_many(fab->chan[c], list + c * n, cnt[c]);
		if (ret)
			return ret;
	}
	return 0;
}

static int put_checks(fep_fabric_t *fab, const struct fep_put *puts, size_t n,
		      bool cqdata)
{
	size_t i;
	int ret;

	for (i = 0; i < n; i++) {
		ret = fep_check_peer(fab, puts[i].peer);
		if (!ret)
			ret = check_put_range(fab, &puts[i]);
		if (!ret && puts[i].add)
			ret = fep_check_sig_as(fab, puts[i].sig, cqdata);
		if (!ret)
			ret = fep_check_add(fab, puts[i].add);
		if (ret)
			return ret;
	}
	return 0;
}

/* Under fab->cma_slices, a put of at least two slices' bytes whose
 * counter CQ data can name goes in slices, as under cqdata (put_sliced);
 * a smaller one is the sender's copy (or, recv, the receiver's on the
 * sender's own channel), which small calls gain by. */
static bool put_cma_sliced(const fep_fabric_t *fab, const struct fep_put *p)
{
	return p->add && cq_names(fab, p->sig) &&
	       p->len >= 2 * (size_t)FEP_SLICE_MIN;
}

/* cma with channels: every put on this rank's own channel, each signal
 * times the channel count; recv: each write carries its signal as CQ
 * data (the target copies), else the sender's copies, reaped, then the
 * signals.  With slices, under fab->cma_slices (a target has fewer
 * senders than channels, so the senders' own channels would leave some
 * of its threads idle), a large put goes in slices, one on every
 * channel, each with its share of the signal as CQ data: the receiver's
 * threads copy them side by side, as under cqdata, and its source is
 * read after the call returns (not for fep_fab_put_copy_many, whose
 * sources are free on return). */
static int put_cma_chan(fep_fabric_t *fab, const struct fep_put *puts,
			size_t n, bool recv, bool slices)
{
	fep_fabric_t *ch = fab->chan[fab->rank % fab->nchan];
	uint64_t mult = (uint64_t)fab->nchan;
	size_t i = 0, j, s, k;
	int ret = 0;

	if (!slices || !fab->cma_slices)
		return recv ? put_cqdata(ch, puts, n, mult) :
			      put_then_signal(ch, puts, n, 0, false, mult);
	while (!ret && i < n) {
		if (put_cma_sliced(fab, &puts[i])) {
			s = FEP_MIN((size_t)fab->nchan, puts[i].len / FEP_SLICE_MIN);
			for (k = 0; !ret && k < s; k++) {
				struct fep_put q;

				put_slice(&puts[i], s, k, puts[i].add * mult, &q);
				ret = put_cqdata(fab->chan[(fab->rank + k) % fab->nchan],
						 &q, 1, 1);
			}
			fab->cma_sliced++;
			i++;
			continue;
		}
		for (j = i + 1; j < n && !put_cma_sliced(fab, &puts[j]); j++)
			;
		ret = recv ? put_cqdata(ch, puts + i, j - i, mult) :
			     put_then_signal(ch, puts + i, j - i, 0, false, mult);
		i = j;
	}
	return ret;
}

int fep_fab_put_signal_many(fep_fabric_t *fab, const struct fep_put *puts,
			    size_t n)
{
	int ret = put_checks(fab, puts, n, fab->signal == FABEP_SIGNAL_CQDATA);

	if (ret)
		return ret;
	if (fab->nchan > 1 && fab->signal == FABEP_SIGNAL_CMA)
		return put_cma_chan(fab, puts, n, false, true);
	return fab->nchan > 1 ? put_sliced(fab, puts, n) : put_many(fab, puts, n);
}

int fep_fab_put_recv_many(fep_fabric_t *fab, const struct fep_put *puts,
			  size_t n)
{
	int ret;

	if (fab->signal != FABEP_SIGNAL_CMA || !fab->cq_data_size)
		return fep_fab_put_signal_many(fab, puts, n);
	ret = put_checks(fab, puts, n, true);
	if (ret)
		return ret;
	return fab->nchan > 1 ? put_cma_chan(fab, puts, n, true, true) :
				put_cqdata(fab, puts, n, 1);
}

int fep_fab_copy_lanes(const fep_fabric_t *fab)
{
	return fab->signal == FABEP_SIGNAL_CMA && fab->nchan > 1 ? fab->nchan : 0;
}

int fep_fab_copy_check(fep_fabric_t *fab, const struct fep_put *puts, size_t n)
{
	return put_checks(fab, puts, n, false);
}

/* The rank's own channel carries the signals, and decides which puts go
 * inline, in the lanes as in put_cma_chan. */
int fep_fab_copy_lane_of(const fep_fabric_t *fab, const struct fep_put *p)
{
	if (!p->len || put_inline(fab->chan[fab->rank % fab->nchan], p))
		return -1;
	return (int)(((size_t)fab->rank + (size_t)p->peer) % (size_t)fab->nchan);
}

int fep_fab_copy_lane(fep_fabric_t *fab, const struct fep_put *puts,
		      size_t n, int lane)
{
	fep_fabric_t *ch = fab->chan[lane];
	size_t i, cnt = 0;
	struct fep_put *list;
	int ret;

	ret = slices_room(ch, n, &list);
	if (ret)
		return ret;
	for (i = 0; i < n; i++)
		if (fep_fab_copy_lane_of(fab, &puts[i]) == lane)
			list[cnt++] = puts[i];
	if (!cnt)
		return 0;
	fep_fabric_lane_enter(ch);
	ret = put_writes(ch, list, cnt, 0);
	if (!ret)
		ret = fep_fabric_reap_own(ch);
	fep_fabric_lane_leave(ch);
	return ret;
}

int fep_fab_copy_signals(fep_fabric_t *fab, const struct fep_put *puts,
			 size_t n)
{
	return put_signals(fab->chan[fab->rank % fab->nchan], puts, n, true,
			   false, (uint64_t)fab->nchan);
}

int fep_fab_put_copy_many(fep_fabric_t *fab, const struct fep_put *puts,
			  size_t n)
{
	int ret;

	if (!fab->sender_copy && fab->nchan > 1 && fab->signal == FABEP_SIGNAL_CMA) {
		ret = put_checks(fab, puts, n, false);
		return ret ? ret : put_cma_chan(fab, puts, n, false, false);
	}
	if (!fab->sender_copy)
		return fep_fab_put_signal_many(fab, puts, n);
	ret = put_checks(fab, puts, n, true);
	return ret ? ret : put_then_signal(fab, puts, n, 0, true,
					   (uint64_t)fab->nchan);
}

size_t fep_fab_queue_share(const fep_fabric_t *fab)
{
	size_t senders;

	if (!fep_fab_sender_copies(fab))
		return 0;
	if (fab->signal == FABEP_SIGNAL_CMA && fab->nchan > 1)
		senders = ((size_t)fab->size + (size_t)fab->nchan - 1) /
			  (size_t)fab->nchan;
	else
		senders = (size_t)fab->size - 1;
	return fab->info->rx_attr->size / FEP_MAX(senders, (size_t)1);
}

/* Where cma's writes start: the first put to a rank above this one. */
static size_t put_start(const fep_fabric_t *fab, const struct fep_put *puts,
			size_t n)
{
	size_t i;

	if (!fep_fab_sender_copies(fab))
		return 0;
	for (i = 0; i < n; i++)
		if (puts[i].peer > fab->rank)
			return i;
	return 0;
}

/* How many puts from puts[i], taken cyclically and at most avail,
 * continue one write: to one peer at consecutive destinations, none
 * empty, at most iov_max pieces and one message; with to_signal, up to
 * the first put with a signal.  0 where puts[i] is empty or alone past
 * one message. */
static size_t put_run(const fep_fabric_t *fab, const struct fep_put *puts,
		      size_t n, size_t i, size_t avail, bool to_signal)
{
	const struct fep_put *a = &puts[i];
	size_t k, tot = 0;

	for (k = 0; k < avail && k < fab->iov_max; k++) {
		const struct fep_put *p = &puts[(i + k) % n];

		if (!p->len || p->peer != a->peer || p->dst != a->dst + tot ||
		    p->len > fab->max_msg_size - tot)
			break;
		tot += p->len;
		if (to_signal && p->add)
			return k + 1;
	}
	return k;
}

/* The local pieces of the cnt puts from puts[i] (taken cyclically), one
 * write's iovec (cnt at most iov_max, put_run). */
static void run_iov(fep_fabric_t *fab, const struct fep_put *puts,
		    size_t n, size_t i, size_t cnt, uint8_t **buf, size_t *len)
{
	size_t k;

	for (k = 0; k < cnt; k++) {
		buf[k] = put_buf(fab, &puts[(i + k) % n]);
		len[k] = puts[(i + k) % n].len;
	}
}

/* The length of the chain at puts[i] that leaves as one write with its
 * signal (fep_fab_joins): puts without a signal, then one with (put_run
 * to the signal); 0 where puts[i] starts none. */
static size_t put_chain(const fep_fabric_t *fab, const struct fep_put *puts,
			size_t n, size_t i)
{
	size_t cnt = put_run(fab, puts, n, i, n - i, true);

	return cnt && puts[i + cnt - 1].add ? cnt : 0;
}

/* A chain of put_chain as one write with the last put's signal. */
static int post_chain(fep_fabric_t *fab, const struct fep_put *puts,
		      size_t cnt, uint64_t mult)
{
	const struct fep_put *last = &puts[cnt - 1];
	uint8_t *buf[FEP_IOV_MAX];
	size_t len[FEP_IOV_MAX];
	uint64_t data, rest;
	int ret;

	run_iov(fab, puts, cnt, 0, cnt, buf, len);
	fep_cqdata_pack(fab, last->sig, last->add * mult, &data, &rest);
	ret = fep_post_writev(fab, puts[0].peer, puts[0].dst, buf, len, cnt, 0,
			      true, data);
	if (!ret)  /* past what one CQ data holds */
		ret = cqdata_signal(fab, last->peer, last->sig, rest);
	return ret;
}

/* Every put's signal, times mult, in the CQ data of its own write (of
 * its last write, past max_msg_size), counted by the target's progress;
 * a chain of puts and its signal as one write (put_chain). */
static int put_cqdata(fep_fabric_t *fab, const struct fep_put *puts, size_t n,
		      uint64_t mult)
{
	size_t i;
	int ret;

	for (i = 0; i < n; i++) {
		const struct fep_put *p = &puts[i];
		uint64_t data, rest;
		size_t len = p->len, head, cnt;

		if (!p->add && (cnt = put_chain(fab, puts, n, i))) {
			ret = post_chain(fab, puts + i, cnt, mult);
			if (ret)
				return ret;
			i += cnt - 1;
			continue;
		}
		if (!p->add) {
			ret = write_buf(fab, p->peer, p->dst, put_buf(fab, p), len, 0);
			if (ret)
				return ret;
			continue;
		}
		/* Larger than one message: the head goes with
		 * delivery-complete writes, reaped before the tail that
		 * carries the signal. */
		head = len > fab->max_msg_size ? len - fab->max_msg_size : 0;
		if (head) {
			ret = write_buf(fab, p->peer, p->dst, put_buf(fab, p), head,
					FI_DELIVERY_COMPLETE);
			if (!ret)
				ret = fep_fabric_quiet(fab);
			if (ret)
				return ret;
		}
		fep_cqdata_pack(fab, p->sig, p->add * mult, &data, &rest);
		ret = fep_post_write(fab, p->peer, p->dst + head,
				     put_buf(fab, p) + head, len - head, 0, true,
				     data);
		if (!ret)  /* past what one CQ data holds */
			ret = cqdata_signal(fab, p->peer, p->sig, rest);
		if (ret)
			return ret;
	}
	return 0;
}

/* The sender's copies (cma, sender_copy): a put with a signal that fits
 * in one injected message goes as one write with CQ data, where a write
 * and its signal would be two operations under the target's lock: the
 * few bytes are copied by the target's progress, and the decode calls,
 * whose runs to most peers are a header alone, post half the
 * operations. */
static bool put_inline(const fep_fabric_t *fab, const struct fep_put *p)
{
	return fep_fab_sender_copies(fab) && p->add && p->len &&
	       p->len <= fab->inject_size && cq_names(fab, p->sig);
}

/* The puts that are not put_inline: puts itself when all are, else a
 * list in fab->slices.  *nbig = how many. */
static int puts_not_inline(fep_fabric_t *fab, const struct fep_put *puts,
			   size_t n, const struct fep_put **big, size_t *nbig)
{
	struct fep_put *list;
	size_t i;
	int ret;

	*big = puts;
	*nbig = n;
	for (i = 0; i < n && !put_inline(fab, &puts[i]); i++)
		;
	if (i == n)
		return 0;
	ret = slices_room(fab, n, &list);
	if (ret)
		return ret;
	for (*nbig = 0, i = 0; i < n; i++)
		if (!put_inline(fab, &puts[i]))
			list[(*nbig)++] = puts[i];
	*big = list;
	return 0;
}

/* The writes of a batch, then its signals, each add times mult (the
 * channel count where the adds are not yet in its units): an atomic
 * each, or with cq_signal (sender_copy) zero-byte writes with CQ data; a
 * put_inline put goes instead as one write that carries its signal,
 * after the others.  Where the sender copies (cma, cq_signal) each write
 * was done in fi_write, so reaping the completions puts every byte in
 * place before any signal leaves; earlier signals need not be
 * acknowledged first. */
static int put_then_signal(fep_fabric_t *fab, const struct fep_put *puts,
			   size_t n, uint64_t wflags, bool cq_signal,
			   uint64_t mult)
{
	const struct fep_put *big;
	size_t nbig;
	int ret;

	ret = puts_not_inline(fab, puts, n, &big, &nbig);
	if (!ret)
		ret = put_writes(fab, big, nbig, wflags);
	if (!ret && fab->signal == FABEP_SIGNAL_DELIVERY)
		ret = fep_fabric_quiet(fab);
	if (!ret && (fab->signal == FABEP_SIGNAL_CMA || cq_signal))
		ret = fep_fabric_reap_own(fab);
	return ret ? ret : put_signals(fab, puts, n, nbig < n, cq_signal, mult);
}

/* The signals of a batch whose writes are done (put_then_signal): inl,
 * some of its puts are put_inline and go now, each as one write. */
static int put_signals(fep_fabric_t *fab, const struct fep_put *puts,
		       size_t n, bool inl, bool cq_signal, uint64_t mult)
{
	size_t i;
	int ret = 0;

	for (i = 0; !ret && i < n; i++) {
		if (!puts[i].add)
			continue;
		if (inl && put_inline(fab, &puts[i]))
			ret = put_cqdata(fab, &puts[i], 1, mult);
		else if (cq_signal)
			ret = cqdata_signal(fab, puts[i].peer, puts[i].sig,
					    puts[i].add * mult);
		else
			ret = fep_post_atomic(fab, puts[i].peer, puts[i].sig,
					      puts[i].add * mult);
	}
	return ret;
}

/* The puts of one channel, checked by fep_fab_put_signal_many; adds as
 * given (in units of the channels). */
static int put_many(fep_fabric_t *fab, const struct fep_put *puts, size_t n)
{
	if (fab->signal == FABEP_SIGNAL_CQDATA)
		return put_cqdata(fab, puts, n, 1);
	return put_then_signal(fab, puts, n, fep_fab_write_flags(fab), false, 1);
}

/* The writes of a batch, without signals.  With the sender's copies (cma,
 * sender_copy) each write is done in fi_write, and the kernel pins the
 * target's pages under the target's locks: starting after this rank
 * (puts in rank order) spreads the senders over the targets instead of
 * all copying into the first.  Puts that continue the previous one's
 * destination at the same peer (the pieces of a run gathered from its
 * sources) leave as one write of up to iov_max pieces. */
static int put_writes(fep_fabric_t *fab, const struct fep_put *puts, size_t n,
		      uint64_t wflags)
{
	size_t i, j;
	int ret;

	for (j = 0, i = n ? put_start(fab, puts, n) : 0; j < n;) {
		uint8_t *buf[FEP_IOV_MAX];
		size_t len[FEP_IOV_MAX], cnt;

		if (!puts[i].len) {
			j++;
			i = (i + 1) % n;
			continue;
		}
		cnt = put_run(fab, puts, n, i, n - j, false);
		if (!cnt)  /* one put past a message: write_buf slices it */
			cnt = 1;
		run_iov(fab, puts, n, i, cnt, buf, len);
		ret = cnt == 1 ? write_buf(fab, puts[i].peer, puts[i].dst, buf[0],
					   puts[i].len, wflags) :
				 fep_post_writev(fab, puts[i].peer, puts[i].dst, buf,
						 len, cnt, wflags, false, 0);
		if (ret)
			return ret;
		j += cnt;
		i = (i + cnt) % n;
	}
	return 0;
}

int fep_fab_put_signal(fep_fabric_t *fab, int peer, uint64_t dst,
		       uint64_t src, size_t len, uint64_t sig, uint64_t add)
{
	struct fep_put p = { peer, dst, src, len, sig, add, NULL };

	return fep_fab_put_signal_many(fab, &p, 1);
}

int fep_fab_wait(fep_fabric_t *fab, uint64_t off, uint64_t target,
		 int timeout_ms)
{
	struct fep_backoff bo = { 0 };
	uint64_t deadline = 0;
	unsigned n = 0;
	int ret;

	if (timeout_ms < 0)
		timeout_ms = fab->timeout_ms;
	if (fab->oversubscribed)
		bo.spins = 64;  /* straight to yielding */
	for (;;) {
		if (fep_counter_load(fab, off) >= target)
			return 0;
		ret = fep_fabric_progress_all(fab);
		if (ret)
			return ret;
		if (fep_counter_load(fab, off) >= target)
			return 0;
		if ((++n & 63) == 0 || bo.spins >= 64) {
			ret = fep_fabric_clock_ctr(fab, &deadline, timeout_ms,
						   off, target);
			if (ret)
				return ret;
		}
		fep_backoff_step(&bo);
	}
}
