/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fabric.h - the libfabric layer: provider choice, endpoint, AV, CQs,
 * progress (fabric.c); the symmetric heap and keys (mr.c); put + signal
 * strategies (signal.c).  Uses only util.
 */
#ifndef FEP_FABRIC_H
#define FEP_FABRIC_H

#include <stddef.h>
#include <sys/types.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdatomic.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>

#include "fabep.h"
#include "util/util.h"

#define FEP_FI_VERSION FI_VERSION(1, 17)
#define FEP_RAW_KEY_MAX 32
#define FEP_NAME_MAX 160
#define FEP_MAX_CHANNELS 16   /* FABEP_CHANNELS at most */
#define FEP_IOV_MAX 16        /* local buffers gathered into one write */
#define FEP_SENDER_COPY_CHANNELS 2  /* fab->sender_copy up to this many */
/* cma chosen by default stays where ranks have one thread, with
 * FEP_CMA_CHANNELS channels from FEP_CMA_CHANNEL_RANKS ranks (one where
 * FEP_CMA_CROWD ranks or more share each CPU of some rank), and where
 * they have more threads and number at least FEP_CMA_THREADS_RANKS,
 * with a channel per thread (comm.c, signal.c put_cma_chan; below it,
 * with 2 or 3 ranks, a sender's copies to its one or two peers would
 * take as few threads) */
#define FEP_CMA_THREADS_RANKS 4
/* A slice of a put split over the channels carries at least this much
 * (below, the copies' start-up costs more than the threads win): puts
 * of two slices' bytes and more are split (signal.c) */
#define FEP_SLICE_MIN (64u << 10)
#define FEP_CMA_CHANNEL_RANKS 16
#define FEP_CMA_CHANNELS 4
/* From this many ranks a CPU (comm.c, fep_comm_cma_crowded) cma keeps
 * one channel: below, spreading a target's senders over its regions'
 * locks wins for large calls; from it, senders preempted under those
 * locks and the extra regions and queues cost more (docs/performance.md,
 * more ranks than cores) */
#define FEP_CMA_CROWD 8

/* What a posted operation is (fep_op.kind). */
enum fep_op_kind { FEP_OP_WRITE = 1, FEP_OP_ATOMIC, FEP_OP_WRITEDATA,
		   FEP_OP_READ };

/* One posted operation: pooled, never on the stack. */
struct fep_op {
	struct fi_context2 ctx;   /* must stay first */
	uint64_t operand;         /* atomic operand (registered memory) */
	struct fep_op *next;
	uint64_t seq;             /* post order on its endpoint (fep_op_get) */
	int peer;
	int kind;
	bool dc;                  /* a write with FI_DELIVERY_COMPLETE: counted
				     in its peer's dc_out until reaped */
};

/* What each rank publishes about itself at start-up (an opaque blob for
 * the bootstrap). */
struct fep_fab_blob {
	uint32_t magic;
	uint32_t name_len;
	uint64_t heap_base;
	uint64_t heap_size;
	uint64_t key;
	uint32_t raw_key_len;
	uint32_t signal;
	uint8_t raw_key[FEP_RAW_KEY_MAX];
	uint8_t name[FEP_NAME_MAX];
	/* the provider opened (fabric_attr->prov_name): the same on every
	 * rank, whatever each asked for; the domain may differ (each rank
	 * its own NIC) */
	char provider[64];
};

struct fep_peer {
	fi_addr_t addr;
	uint64_t base;   /* added to offsets (0 without FI_MR_VIRT_ADDR) */
	uint64_t key;
	bool key_mapped; /* key came from fi_mr_map_raw: unmapped at close */
	int lost;        /* a transfer to it failed */
	unsigned dc_out; /* its FI_DELIVERY_COMPLETE writes not yet reaped */
};

struct fep_fab_params {
	const char *provider;   /* NULL: any */
	const char *domain;     /* NULL: any */
	fabep_signal_t signal;  /* AUTO: choose */
	bool all_local;         /* every rank on this host: prefer shm, "lo" */
	int rank;
	int size;
	int timeout_ms;
	size_t heap_size;
	int numa_node;          /* for the heap allocation, -1: local */
	bool cma_peers;         /* every rank could process_vm_writev every
				   other (fep_cma_reach): the cma strategy
				   may be used */
	struct fep_fabric *heap_of;  /* a channel: register this one's heap */
};

typedef struct fep_fabric {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *txcq;
	struct fid_cq *rxcq;

	int rank;
	int size;
	int timeout_ms;
	fabep_signal_t signal;
	fabep_provider_desc_t desc;

	/* limits */
	size_t inject_size;
	size_t max_msg_size;
	size_t iov_max;          /* local buffers per write (tx iov_limit,
				  * at most FEP_IOV_MAX) */
	size_t atomic_count;
	int mr_mode;
	size_t cq_data_size;
	unsigned cq_idx_bits;   /* cqdata encoding: counter index bits */

	/* heap */
	void *heap;
	size_t heap_size;
	size_t heap_used;
	struct fep_hblock *hb;  /* the handles' blocks (chan[0]'s), by offset */
	int nhb;
	uint64_t cs_base;       /* the handles' counter slots (FEP_CS_*) */
	int cs_n;
	uint8_t cs_state[128];  /* FEP_CS_MAX, enum fep_cs_state */
	bool heap_numa;
	struct fid_mr *heap_mr;
	void *heap_desc;
	uint64_t heap_key;

	/* pooled operation contexts, registered for atomic operands */
	struct fep_op *ops;
	size_t nops;
	struct fep_op *free_ops;
	uint64_t op_seq;        /* operations taken so far (fep_op->seq) */
	struct fid_mr *ops_mr;
	void *ops_desc;
	size_t outstanding;
	size_t writes;          /* of them writes (not atomics) */
	int tx_error;           /* first failed transfer, from or to this rank */
	bool tx_progress;       /* a posted write moves only while this rank
				   progresses (software transports) */
	bool sender_copy;       /* cqdata on shm with its fast path and at
				   most two channels: fep_fab_put_copy_many
				   writes plainly, then signals */
	bool cma_slices;        /* cma with more channels than a target has
				   senders, and a thread per channel: large
				   puts are sliced over every channel, the
				   receivers' threads copying (put_cma_chan) */
	bool oversubscribed;    /* more ranks on this host than CPUs: a wait
				   yields at once instead of spinning first,
				   so that the peer it waits for gets a CPU */

	struct fep_peer *peers;
	/* Atomics posted while a delivery-complete write to the same peer
	 * was not yet reaped: the delivery strategy's rule broken, where
	 * no provider here shows it (shm and tcp carry both through one
	 * queue).  Read by the tests; one add per atomic. */
	uint64_t sig_unreaped;
	/* Puts sent in slices over the channels under cma_slices (read by
	 * the tests). */
	uint64_t cma_sliced;

	/* Channels (FABEP_CHANNELS): chan[0] is this fabric, chan[1..] more
	 * endpoints, each in its own domain with its own CQs, registering
	 * the same heap.  A large put with a signal is split in slices, one
	 * per channel, each signalled with its own CQ data, and the target's
	 * threads progress the channels side by side (on shm the target
	 * copies: one thread per channel copies one slice).  So that every
	 * slice counts, every signal adds nchan times its amount, shared out
	 * over the slices, and fep_counter_load divides by nchan (a channel
	 * itself has nchan 1: its adds are already in those units).  Under
	 * cma a put is not split (but see cma_slices): every put of a rank,
	 * and its signal, go on the rank's own channel (rank % nchan), so
	 * that the senders to one target spread over its channels' regions,
	 * each with its own lock (shm copies into a region under that
	 * region's lock). */
	int nchan;
	struct fep_fabric **chan;
	struct fep_fabric *owner;  /* a channel's chan[0]; NULL on chan[0] */
	/* a channel's progress by a pool run's threads (fep_fabric_progress_mine):
	 * held while one progresses it, and counted, so that the others see
	 * a channel whose thread does not run (preempted, or still waking)
	 * and progress it themselves */
	char pad0[64];
	_Atomic int pbusy;
	_Atomic unsigned pcount;
	char pad1[64];
	/* a lane's channel (fep_fabric_lane_enter): its stalls progress
	 * it alone, not every channel, since the other channels are
	 * driven by other threads at the same time */
	bool lane;
	bool heap_shared;       /* a channel's: the heap is chan[0]'s */
	bool keep_heap;         /* close leaves the heap mapped: peers that
				   did not say goodbye may still write into it */
	struct fep_put *slices; /* scratch of fep_fab_put_signal_many */
	size_t slices_cap;

	/* fep_fabric_set_alive: asked, every FEP_ALIVE_EVERY_MS of a wait
	 * that has lasted that long, whether every peer it can watch still
	 * runs (0) or not (-FABEP_ERR_PEER_LOST; with report, logged and
	 * the communicator marked failed) */
	int (*alive)(void *ctx, bool report);
	/* told after a wait for completions timed out (may be NULL): logs
	 * what it can say about the peers, for the timeout's message */
	void (*stalled)(void *ctx);
	void *alive_ctx;
	uint64_t alive_next;    /* ns: not before */
} fep_fabric_t;

#define FEP_ALIVE_EVERY_MS 50
/* The heap is mapped in whole pages of this size (fep_heap_create). */
#define FEP_HEAP_PAGE ((size_t)4096)
/* A failed transfer waits at most this long for the liveness check to
 * name the rank that is gone (fep_fabric_name_lost). */
#define FEP_LOST_GRACE_MS 500

/* Whether a failed transfer may wait FEP_LOST_GRACE_MS for the liveness
 * check to name the rank that is gone: only on a rank's one channel, where
 * no pool thread progresses another beside it, and for the first failure
 * (the later ones of a call would each wait again). */
static inline bool fep_fab_lost_grace(const fep_fabric_t *fab)
{
	return fab->nchan <= 1 && !fab->heap_shared && !fab->tx_error;
}

/* ---- fabric.c ---- */
/* mr_mode bits added to what every later fep_fabric_open's provider
 * grants, as if it had asked for them: the tests set FI_MR_LOCAL to run
 * the paths of the providers that need registered local buffers (verbs,
 * efa) on shm and tcp, which do not.  0 outside the tests. */
extern uint64_t fep_fab_test_mr_mode;
/* And the most bytes of remote CQ data used, where not 0: the tests set 4
 * to run verbs' and efa's encoding (24 bits of counter index, 8 of add)
 * on shm and tcp, which give 8. */
extern size_t fep_fab_test_cq_data_max;
/* Added to the key the heap asks for, where not 0: the tests give each
 * rank its own key on tcp and sockets, which check keys, as verbs' and
 * efa's provider keys differ between ranks, so that a write made with
 * any key but its target's is lost or refused. */
extern uint64_t fep_fab_test_key_salt;
/* And the largest message, where not 0 and below the provider's: the
 * tests set a few KiB so that puts go as several writes, as they do
 * past max_msg_size on any provider. */
extern size_t fep_fab_test_msg_max;
/* And, where not 0, providers described as refusing
 * FI_DELIVERY_COMPLETE (some verbs and cxi setups): what the strategies
 * that need it fall back to. */
extern int fep_fab_test_no_dc;
/* And the most local pieces of one write, where not 0 and below the
 * provider's iov_limit: the tests set 1 or 2 so that shm and tcp (4)
 * take the paths of a provider that gathers less or not at all. */
extern size_t fep_fab_test_iov_max;
int fep_fabric_open(const struct fep_fab_params *p, fep_fabric_t **out);
void fep_fabric_close(fep_fabric_t *fab);
/* Fill this rank's blob (after the heap exists). */
int fep_fabric_blob(fep_fabric_t *fab, struct fep_fab_blob *blob);
/* Insert every rank's address, record bases and keys.  blobs: size entries. */
int fep_fabric_connect(fep_fabric_t *fab, const struct fep_fab_blob *blobs);
/* Whether provider name (libfabric's prov_name, "tcp;ofi_rxm" for a
 * utility over a core) is core itself or core under a utility. */
bool fep_prov_is(const char *name, const char *core);
/* Whether /dev/shm is too small for libfabric's shm to offer an
 * endpoint; why says so with the figures and the remedy. */
bool fep_shm_short(char *why, size_t len);
/* Remove libfabric shm's regions /dev/shm/<pid>:<n>:<n> of process pid
 * (dead: its own leftovers block a new process with the same pid);
 * returns how many.  fabep_shm_cleanup is the checked public form. */
int fep_shm_remove_regions(pid_t pid);
/* Install the liveness check of the waits (see fep_fabric_t.alive). */
void fep_fabric_set_alive(fep_fabric_t *fab, int (*alive)(void *ctx, bool report),
			  void (*stalled)(void *ctx), void *ctx);
/* A wait's clock: the first call sets *deadline (0 = not yet) timeout_ms
 * from now; later ones return -ETIMEDOUT past it, and run the liveness
 * check when one is due (its error), else 0. */
int fep_fabric_clock(fep_fabric_t *fab, uint64_t *deadline, int timeout_ms);
/* The same for a wait on the counter at off reaching target: a peer found
 * gone fails it only when, after every channel is progressed once more,
 * the counter is still short (a peer may leave right after its last
 * signal).  Safe beside the threads of fep_fabric_progress_mine. */
int fep_fabric_clock_ctr(fep_fabric_t *fab, uint64_t *deadline, int timeout_ms,
			 uint64_t off, uint64_t target);
/* The liveness check when one is due (FEP_ALIVE_EVERY_MS since the
 * last): its error, else 0.  For a caller that polls memory itself. */
int fep_fabric_alive_due(fep_fabric_t *fab);
/* Read both CQs once.  Returns 0 or the first error seen. */
int fep_fabric_progress(fep_fabric_t *fab);
/* The same on every channel, one after the other. */
int fep_fabric_progress_all(fep_fabric_t *fab);
/* What one thread of a pool run has seen of the channels' progress. */
struct fep_chan_watch {
	unsigned calls;
	unsigned seen[FEP_MAX_CHANNELS];
	uint8_t still[FEP_MAX_CHANNELS];
};
/* A pool run's share: thread tid of nthreads progresses channels tid,
 * tid + nthreads, ... (on shm each copies what arrived on its own), and,
 * every scan_every calls (w: this thread's, zeroed before its first
 * call), any other channel that no thread progressed since its last two
 * looks: a thread that the host preempted, or that is still waking, holds
 * no channel back for longer. */
int fep_fabric_progress_mine(fep_fabric_t *fab, int tid, int nthreads,
			     struct fep_chan_watch *w, unsigned scan_every);
/* Lanes: a batch's writes made on several threads at once, one
 * channel each (signal.c fep_fab_copy_lane).  Enter holds channel ch
 * for the calling thread, as a progress of it does (a thread of
 * fep_fabric_progress_mine or fep_fabric_progress_free passes it by),
 * and makes its stalls progress it alone; leave gives it back. */
void fep_fabric_lane_enter(fep_fabric_t *ch);
void fep_fabric_lane_leave(fep_fabric_t *ch);
/* Progress every channel of fab that no other thread holds now, once
 * each: the first error seen, or 0. */
int fep_fabric_progress_free(fep_fabric_t *fab);
/* Open channels 1..n-1 of fab (cqdata or cma: they share its counters) and
 * fill their blobs (blobs[c - 1]); asks for transparent huge pages on the
 * heap (the kernel's copy between processes pins pages one by one, and
 * with 4 KiB pages the copies of every channel queue on one page-table
 * lock); connect them with
 * fep_fabric_chan_connect, blobs of every rank for channel c at
 * all[(c - 1) * size ...]. */
int fep_fabric_chan_open(fep_fabric_t *fab, int n, struct fep_fab_blob *blobs);
int fep_fabric_chan_connect(fep_fabric_t *fab, const struct fep_fab_blob *all);
/* One round of waiting on the fabric: progress both CQs, then back off
 * (spin, yield, sleep); -ETIMEDOUT once the rounds of this wait took the
 * communicator's timeout; 0: look again.  st starts zeroed. */
struct fep_stall {
	struct fep_backoff bo;
	uint64_t deadline;
};
int fep_fabric_stall(fep_fabric_t *fab, struct fep_stall *st);
/* The first transfer error any channel has seen, or 0. */
int fep_fabric_tx_error(const fep_fabric_t *fab);
/* Wait until no operation is outstanding (timeout -> -ETIMEDOUT). */
int fep_fabric_quiet(fep_fabric_t *fab);
/* Wait until no write (or read) of this fabric, on any of its
 * channels, is outstanding; atomics may stay (timeout -> -ETIMEDOUT).
 * Before a buffer that writes read from changes, or before the
 * results of reads are used. */
int fep_fabric_reap_writes(fep_fabric_t *fab);
/* After a failed transfer or post: the liveness check's verdict (0: every
 * rank runs; -FABEP_ERR_PEER_LOST: a rank is gone, logged), and, with
 * grace, asked again for up to FEP_LOST_GRACE_MS while it finds none: a
 * rank of another host is known gone through the bootstrap's root, which
 * can come after the failed transfer, and a killed process of this host
 * closes its sockets (which fails sockets' posts, even to the ranks still
 * there) a little before it has exited.  0 without a liveness check. */
int fep_fabric_name_lost(fep_fabric_t *fab, bool grace);
/* The same for the writes of this endpoint alone (a batch's writes
 * before its signals, on the endpoint that posted both). */
int fep_fabric_reap_own(fep_fabric_t *fab);
/* Before a call returns to a caller that may compute for long: on a
 * provider whose writes move only while this rank progresses (tx_progress:
 * tcp, udp, net, efa's emulated protocols), wait until they have all left
 * (fep_fabric_quiet), or they and their receivers would wait for this
 * rank's next call; elsewhere 0 at once (the sends drain at the next
 * call's quiet). */
int fep_fabric_drain(fep_fabric_t *fab);
/* Describe a fi_info (opens fabric + domain briefly to query atomics). */
int fep_fabric_describe(struct fi_info *info, fabep_provider_desc_t *d);

/* ---- mr.c: symmetric heap ---- */
int fep_heap_create(fep_fabric_t *fab, size_t size, int numa_node);
/* A channel: register chan[0]'s heap in its own domain. */
int fep_heap_share(fep_fabric_t *fab, const fep_fabric_t *of);
void fep_heap_destroy(fep_fabric_t *fab);
int fep_heap_bind(fep_fabric_t *fab);    /* FI_MR_ENDPOINT: after ep enable */
int fep_heap_alloc_(fep_fabric_t *fab, size_t size, size_t align, uint64_t *off);

/*
 * Handle blocks: the heap space of a collective handle (MoE, allreduce).
 * Its destroy gives the block back, locally; a later creation reuses it
 * once every rank has given it back cleanly (no call of the handle left
 * half done or failed, so no peer's write can still land in it).  The
 * ranks agree at creation: each sends the mask of the blocks it gave back
 * cleanly (fep_hb_hello), and fep_hb_alloc, given the AND of all the
 * masks (fep_hb_agree), makes the same choice on every rank: adjacent
 * blocks given back everywhere merge, the first that fits is reused (what
 * it does not need stays free), else free blocks at the heap's end are
 * taken back and the block comes from the end.  A block given back after
 * a failure is kept for the communicator's lifetime; past FEP_HB_MAX
 * blocks, new ones are never reused.  Handles take their blocks through
 * fep_comm_block (core/comm.h).
 */
#define FEP_HB_MAX 256
#define FEP_HB_WORDS (FEP_HB_MAX / 64)
enum fep_hb_state { FEP_HB_LIVE = 0, FEP_HB_FREE, FEP_HB_KEPT };
struct fep_hblock {
	uint64_t off, size;
	int state;              /* this rank's */
};
/*
 * Counter slots.  A handle's counters sit in a slot of a region the
 * communicator reserves near the heap's start, not in its block, so that
 * remote CQ data names them wherever the block lies: 4 bytes of it (verbs,
 * efa) hold 24 bits of counter index, which reach the first 128 MiB of
 * the heap.  Slots are taken and given back as blocks are (the lowest
 * free on every rank; a slot that held counters is zeroed first); where
 * none is free, or the counters do not fit one, they stay in the block.
 */
#define FEP_CS_MAX 128
#define FEP_CS_BYTES 512
#define FEP_CS_WORDS (FEP_CS_MAX / 64)
enum fep_cs_state { FEP_CS_FRESH = 0, FEP_CS_LIVE, FEP_CS_FREE, FEP_CS_KEPT };
_Static_assert(sizeof(((fep_fabric_t *)0)->cs_state) == FEP_CS_MAX,
	       "one state per counter slot");
struct fep_hb_hello {           /* part of a creation's exchange */
	uint64_t free[FEP_HB_WORDS];
	uint64_t heap_used;
	uint32_t nhb;
	uint32_t pad;
	uint64_t cs_free[FEP_CS_WORDS];  /* slots FRESH or FREE here */
	uint64_t cs_used[FEP_CS_WORDS];  /* slots not FRESH here */
};
void fep_hb_hello(const fep_fabric_t *fab, struct fep_hb_hello *h);
/* The heaps' state agrees (else -FABEP_ERR_MISMATCH, logged with what);
 * all: every rank's hello (stride bytes apart); and = the AND of the masks
 * (cs_used: their OR). */
int fep_hb_agree(const char *what, int nranks, const void *all, size_t stride,
		 struct fep_hb_hello *and_);
/* A block of size bytes, the same on every rank given the same and_:
 * 0 with *off (and *reused: the space held data before, whose counters
 * the handle must zero before any peer writes), or -FABEP_ERR_HEAP_FULL
 * (not logged; the table may have merged blocks, identically everywhere). */
int fep_hb_alloc(fep_fabric_t *fab, const struct fep_hb_hello *and_, size_t size,
		 uint64_t *off, bool *reused);
/* Give the block at off back: clean, or kept (never reused). */
void fep_hb_free(fep_fabric_t *fab, uint64_t off, bool clean);
/* Reserve the counter slots (n of them, at most FEP_CS_MAX) at the
 * heap's next offset; creation calls it before any handle exists. */
int fep_cs_reserve(fep_fabric_t *fab, size_t n);
/* The lowest slot free on every rank (and_ from fep_hb_agree), taken:
 * its index, with *used where some rank had counters in it before; -1
 * where none is free. */
int fep_cs_take(fep_fabric_t *fab, const struct fep_hb_hello *and_, bool *used);
/* Give back the slot whose counters start at ctrs (clean: no write of a
 * peer can still land in it; else it is kept). */
void fep_cs_give(fep_fabric_t *fab, uint64_t ctrs, bool clean);
/* Whether signals can reach counters at [off, off + bytes) under the
 * strategy: where it signals with remote CQ data, the data must name
 * them. */
bool fep_fab_ctrs_named(const fep_fabric_t *fab, uint64_t off, size_t bytes);
static inline void *fep_heap_at(fep_fabric_t *fab, uint64_t off)
{
	return (char *)fab->heap + off;
}
static inline bool fep_heap_range_ok(const fep_fabric_t *fab, uint64_t off,
				     size_t len)
{
	return off <= fab->heap_size && len <= fab->heap_size - off;
}

/* ---- signal.c: put and put + signal ---- */
/* Post a write of heap[src, src+len) to peer's heap at dst (chunked by
 * max_msg_size).  flags: 0 or FI_DELIVERY_COMPLETE. */
int fep_fab_write(fep_fabric_t *fab, int peer, uint64_t dst, uint64_t src,
		  size_t len, uint64_t flags);
/* Post the signal half: add `add` to the counter at `sig` on peer, ordered
 * after the writes to that peer already posted, per the strategy.  With
 * DELIVERY the caller must have reaped the writes (fep_fabric_quiet). */
int fep_fab_signal(fep_fabric_t *fab, int peer, uint64_t sig, uint64_t add);
/* Write + signal as one, for one peer. */
/* 0, or -ERANGE (logged) for a caller's add that would take more than
 * 1024 writes of CQ data (fabep_put_signal). */
int fep_fab_user_add_ok(const fep_fabric_t *fab, uint64_t add);
int fep_fab_put_signal(fep_fabric_t *fab, int peer, uint64_t dst,
		       uint64_t src, size_t len, uint64_t sig, uint64_t add);
/* Read len bytes at heap offset src of peer into buf: in the heap, or
 * anywhere where fep_fab_ptr_ok.  Counted with the writes: buf holds
 * them once fep_fabric_reap_writes returns. */
int fep_fab_read(fep_fabric_t *fab, int peer, void *buf, uint64_t src,
		 size_t len);
/* The flags data writes need under the current strategy. */
uint64_t fep_fab_write_flags(const fep_fabric_t *fab);
/* Batch: the put + signal of many destinations with one round trip:
 * post all writes, reap if needed, post all signals. */
struct fep_put {
	int peer;
	uint64_t dst;
	uint64_t src;   /* a heap offset, or FEP_PUT_PTR: the bytes at ptr */
	size_t len;
	uint64_t sig;
	uint64_t add;   /* 0: no signal */
	const void *ptr; /* read only where src is FEP_PUT_PTR: a buffer
			    outside the heap (fep_fab_ptr_ok), which must
			    not change until the writes are reaped */
};
#define FEP_PUT_PTR UINT64_MAX
/* Whether puts may read from unregistered local memory (FEP_PUT_PTR):
 * the provider needs no local descriptors (no FI_MR_LOCAL). */
static inline bool fep_fab_ptr_ok(const fep_fabric_t *fab)
{
	return !(fab->mr_mode & FI_MR_LOCAL);
}
/* Whether a read into any local memory (fep_fab_ptr_ok) moves its bytes
 * in the reader's own call, whatever the target does: shm with CMA to
 * every peer, on an endpoint without RMA ordering (cma, cqdata), takes
 * its fast path, the reader's process_vm_readv.  Elsewhere the target's
 * progress serves a read (tcp;ofi_rxm's, shm's without the fast path),
 * and a target busy outside the library would hold its readers up. */
static inline bool fep_fab_reads_alone(const fep_fabric_t *fab)
{
	return fep_fab_ptr_ok(fab) &&
	       (fab->desc.signals & (1u << FABEP_SIGNAL_CMA)) &&
	       (fab->signal == FABEP_SIGNAL_CMA || fab->signal == FABEP_SIGNAL_CQDATA);
}
int fep_fab_put_signal_many(fep_fabric_t *fab, const struct fep_put *puts,
			    size_t n);
/* The same, for a phase whose copies are better made by the sender: where
 * fab->sender_copy, the writes go without CQ data (shm's fast path: the
 * sender's process_vm_writev, done when fi_write returns), are reaped,
 * and then every signal is a zero-byte write with CQ data (a put that
 * fits in the inject size goes as one write with its signal); elsewhere
 * as fep_fab_put_signal_many. */
int fep_fab_put_copy_many(fep_fabric_t *fab, const struct fep_put *puts,
			  size_t n);
/* The same in lanes, where fep_fab_copy_lanes(fab) > 1 (cma with
 * channels, whose serial form makes every copy on the calling thread):
 * fep_fab_copy_check checks the batch once; then the lanes 0 ..
 * lanes - 1, each at most once, by any threads side by side: lane c
 * makes the copies to the peers p with (rank + p) % lanes == c on
 * channel c, and reaps them; once every lane has returned 0,
 * fep_fab_copy_signals posts the batch's signals on the rank's own
 * channel, as the serial form does after its copies.  The copies of
 * different peers move at once, and each target's senders stay spread
 * over its channels' regions (each under its own lock in shm).  A lane
 * that fails leaves its channel usable; the batch is then failed, as a
 * failed serial batch is. */
int fep_fab_copy_lanes(const fep_fabric_t *fab);
int fep_fab_copy_check(fep_fabric_t *fab, const struct fep_put *puts, size_t n);
/* The lane whose copies include put p, or -1: p has no bytes, or goes
 * with the signals (one write with its CQ data). */
int fep_fab_copy_lane_of(const fep_fabric_t *fab, const struct fep_put *p);
int fep_fab_copy_lane(fep_fabric_t *fab, const struct fep_put *puts,
		      size_t n, int lane);
int fep_fab_copy_signals(fep_fabric_t *fab, const struct fep_put *puts,
			 size_t n);
/* The same, for a phase whose copies are better made by the receivers:
 * under cma every write carries its signal as CQ data (shm's
 * receiver-driven path, the target's progress copies and counts);
 * elsewhere as fep_fab_put_signal_many. */
int fep_fab_put_recv_many(fep_fabric_t *fab, const struct fep_put *puts,
			  size_t n);
/* Whether fep_fab_put_copy_many's writes are the sender's copies (cma,
 * or cqdata's sender_copy): each done in fi_write and reaped before the
 * batch's signals, so its sources are free again when it returns. */
static inline bool fep_fab_sender_copies(const fep_fabric_t *fab)
{
	return fab->signal == FABEP_SIGNAL_CMA || fab->sender_copy;
}
/* Whether fep_fab_put_copy_many signals only after every write of the
 * batch has completed (or is ordered before it): not so where each write
 * of remote CQ data is its own signal. */
static inline bool fep_fab_signals_after_writes(const fep_fabric_t *fab)
{
	return fab->signal != FABEP_SIGNAL_CQDATA || fab->sender_copy;
}
/* Whether fep_fab_put_signal_many posts a chain of at most pieces puts
 * of len bytes in all, consecutive in the batch, to one peer at
 * consecutive destinations, none but the last with a signal, as one
 * write carrying that signal (remote CQ data, where a signal stands
 * only for its own write): so where the write fits one message and the
 * provider's local buffers per write, and no channel takes a slice. */
static inline bool fep_fab_joins(const fep_fabric_t *fab, size_t pieces,
				 size_t len)
{
	return !fep_fab_signals_after_writes(fab) && pieces <= fab->iov_max &&
	       len <= fab->max_msg_size &&
	       (fab->nchan <= 1 || len < 2 * (size_t)FEP_SLICE_MIN);
}

/* How many writes one rank may post to one target in a batch without
 * filling the target's queue, where every write is shm's fast path
 * (cma, fab->sender_copy): the fast path copies, then leaves a notice of
 * the write in the command queue of the target's region (libfabric 1.17
 * smr_rma_fast), which holds rx_attr->size commands and empties only
 * when the target progresses; a post into a full queue waits for that.
 * The ranks that post into one region share it: under cma with
 * channels, those on the same channel (each posts on its own, rank %
 * nchan), else every other rank.  0 where writes are not of that kind. */
size_t fep_fab_queue_share(const fep_fabric_t *fab);

/*
 * ThreadSanitizer: libfabric is not instrumented, so when a rank's
 * progress (inside fi_cq_read, or inside a post) copies a peer's data
 * into the heap and then applies the peer's atomic add to a counter, the
 * tool sees the copy (an intercepted memcpy or recv) but not the add,
 * and a thread that reads the data after it saw the counter move looks
 * unordered to it.  In a ThreadSanitizer build every libfabric call that
 * can progress holds a lock shared, and a counter load that finds a
 * count takes it exclusively once: it waits for the calls in flight
 * (one of which may have applied the add it saw) and is ordered after
 * them, which is the order the strategies provide.  Progress calls are
 * not ordered with each other.  A provider that copies on threads of
 * its own (sockets) stays out of reach.  Nothing in other builds.
 */
#if defined(__SANITIZE_THREAD__)
#define FEP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FEP_TSAN 1
#endif
#endif
#ifdef FEP_TSAN
void fep_tsan_progress_begin(void);
void fep_tsan_progress_end(void);
void fep_tsan_observe(void);
#define FEP_TSAN_PROGRESS_BEGIN() fep_tsan_progress_begin()
#define FEP_TSAN_PROGRESS_END() fep_tsan_progress_end()
#define FEP_TSAN_OBSERVE(v) ((v) ? fep_tsan_observe() : (void)0)
#else
#define FEP_TSAN_PROGRESS_BEGIN() ((void)0)
#define FEP_TSAN_PROGRESS_END() ((void)0)
#define FEP_TSAN_OBSERVE(v) ((void)0)
#endif

/* Local counter access: acquire load, in the units of the adds. */
static inline uint64_t fep_counter_load(fep_fabric_t *fab, uint64_t off)
{
	uint64_t v = __atomic_load_n((uint64_t *)fep_heap_at(fab, off),
				     __ATOMIC_ACQUIRE);

	FEP_TSAN_OBSERVE(v);
	return fab->nchan > 1 ? v / (uint64_t)fab->nchan : v;
}
/* Wait for the counter at off to reach target, progressing.  timeout_ms
 * < 0: the fabric's.  -ETIMEDOUT (not logged: the caller names peers). */
int fep_fab_wait(fep_fabric_t *fab, uint64_t off, uint64_t target,
		 int timeout_ms);

/* Strategy helpers */
const char *fep_signal_name(fabep_signal_t s);
/* Whether the strategy is possible with the described provider. */
bool fep_signal_supported(const fabep_provider_desc_t *d, fabep_signal_t s);
/* Whether this process can use shm's CMA fast path at all: the
 * FI_SHM_DISABLE_CMA variable unset (or false), process_vm_writev
 * permitted on itself, and the Yama ptrace policy letting it reach its
 * siblings.  The reason when not, in why. */
bool fep_cma_usable(char *why, size_t len);
/* Whether process_vm_writev into process pid works: writes FEP_CMA_MAGIC
 * over the word at addr there, which holds that value (fep_cma_word). */
bool fep_cma_reach(pid_t pid, uint64_t addr);
/* The address of this process's word for fep_cma_reach. */
uint64_t fep_cma_word(void);
/* Choose the default for the described provider, with the reason. */
fabep_signal_t fep_signal_choose(const fabep_provider_desc_t *d, char *why,
				 size_t len);

#endif
