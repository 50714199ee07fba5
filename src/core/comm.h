/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * comm.h - the communicator: ties bootstrap, fabric, heap and the kernel
 * thread pool together.  What ep/ and coll/ build on.
 */
#ifndef FEP_CORE_COMM_H
#define FEP_CORE_COMM_H

#include <stdbool.h>
#include <sys/types.h>
#include "fabep.h"
#include "util/util.h"
#include "bootstrap/bootstrap.h"
#include "fabric/fabric.h"

struct fep_pool;

/* A handle made on a communicator (MoE, allreduce), on its list from its
 * creation to its destruction: fabep_comm_destroy and fabep_comm_abort
 * destroy those still alive first, as fabep.h says. */
struct fep_comm_handle {
	struct fep_comm_handle *prev, *next;
	void (*destroy)(struct fep_comm_handle *h);
};

struct fabep_comm {
	int rank;
	int size;
	int timeout_ms;
	bool all_local;
	int shm_apart;        /* a rank of this host beyond shm's reach
				 (fep_shm_apart), or -1 */
	const char *shm_apart_why; /* and why, a static string */
	int local_rank;       /* index among the ranks on this host */
	int local_size;       /* ranks on this host */
	int cpu_share;        /* ranks on this host that may run on a CPU
				 this one may (itself included) */
	int cpu_avail;        /* the CPUs those ranks may use between them
				 (fewer where a cgroup's quota allows fewer) */
	int numa_node;
	fep_boot_t *boot;
	fep_fabric_t *fab;
	struct fep_comm_handle handles; /* the live handles' list (its head) */
	struct fep_pool *pool;
	bool failed;          /* a collective wait failed: peers may be gone */
	bool ending;          /* in destroy's round: a rank whose part of it
	                       * arrived may end (fep_comm_alive_one) */
	/* atomic: -FABEP_ERR_PEER_LOST or the bootstrap's error once a
	 * rank is gone (fep_comm_fail): every later call that involves the
	 * peers refuses with it, as with an error the fabric keeps */
	int broken;
	pid_t pid;            /* the process that made it */
	unsigned fork_gen;    /* fep_fork_gen when it was made */
	pid_t *peer_pid;      /* [size]: pid of a rank on this host and PID
				 namespace (the liveness check; negated once
				 it was reported gone), else 0 */
	/* held while one thread runs the liveness check: the lanes of a
	 * batch (fep_fab_copy_lane) stall on several threads at once, and
	 * the bootstrap's watch is not for concurrent use */
	_Atomic int alive_busy;

	/* barrier and agreement: a counter per source, two slots per
	 * source (round parity; sequence and value: the agreement's values,
	 * and the sequence names missing peers on timeout), and a source
	 * word */
	uint64_t bar_ctr;     /* [size] */
	uint64_t bar_slots;
	uint64_t bar_src;
	uint64_t bar_seq;
	uint64_t *bar_exp;    /* [size]: what each source's counter must reach */
	/* the collectives' scratch, taken at creation so that none of them
	 * can fail for memory on one rank before it joins (its peers would
	 * wait for it to the timeout): the exchange's puts, the
	 * agreement's values, the bootstrap agreements' and the channel
	 * count's values */
	struct fep_put *xchg_puts;  /* [size] */
	int64_t *xchg_vals;         /* [size] */
	int32_t *boot_vals;         /* [2 * size] */
	/* fabep_barrier: a counter per dissemination round, and how many
	 * barriers this rank has entered */
	uint64_t dis_ctr;     /* [FEP_DIS_ROUNDS] */
	uint64_t dis_seq;
	/* a barrier that failed is pending at round dis_pend - 1 (0: none),
	 * whose signal went out where dis_sent: the next call finishes it */
	int dis_pend;
	bool dis_sent;
	/* FABEP_QUEUE_WARMUP (-1 never, 0 auto, 1 always), and the counter of
	 * the queues' warm-up (fep_comm_warm_queues) */
	int queue_warm;
	uint64_t warm_ctr;
	/* fabep_heap_alloc's ranges [2i, 2i+1), in offset order (each
	 * comes from the heap's end): the one-sided calls reach only
	 * these, never the handles' blocks or the communicator's own
	 * counters, which a stray offset would corrupt without a word */
	uint64_t *ualloc;
	size_t nualloc, cualloc;
};

/* The queues' warm-up sends each peer on each channel the endpoint's
 * rx_attr->size signals, at most this many (comm.c,
 * fep_comm_warm_queues). */
#define FEP_WARM_MAX 4096
/* By default (FABEP_QUEUE_WARMUP=auto) only where each rank sends to at
 * most this many peer endpoints (peers times channels): the warm-up's
 * cost grows with them, while the slow first calls it removes were
 * measured where ranks crowd onto a few CPUs (4 and 8 ranks on 2), not
 * at 32 ranks on 16 cores (comm.c, fep_comm_warm_up). */
#define FEP_WARM_AUTO_PEERS 8

/* Rounds of the dissemination barrier: ceil(log2 size) for any int size. */
#define FEP_DIS_ROUNDS 32

/* Mark comm unusable with code (the first code stays): a rank is gone.
 * A timeout is not enough: the peer may only be slow or stopped, and
 * what timed out (a handle) is unusable on its own. */
void fep_comm_fail(fabep_comm_t *comm, int code);

/* Whether FEP_CMA_CROWD ranks or more share each of this rank's CPUs
 * (cpu_share over cpu_avail): cma then opens one channel, whatever the
 * rank count, where any rank is crowded. */
bool fep_comm_cma_crowded(const fabep_comm_t *comm);

/* 0 if comm can still be used; else its first failure's code, logged
 * with `what` ("...: the communicator is unusable after an earlier
 * failure"), also when its fabric keeps a transfer's error. */
int fep_comm_usable(fabep_comm_t *comm, const char *what);
int fep_comm_forked(const fabep_comm_t *comm, const char *what);

/*
 * Wait until the local counter at `ctr` reaches `target`.  On timeout,
 * names the peers in `peers` (n entries; NULL = every other rank) whose
 * uint64 sequence word at `slots + 8 * peer` (stride `stride`, 0 = 8) is
 * below `seq`, in a message starting with `what`.  slots == UINT64_MAX:
 * no naming.  Returns 0, -ETIMEDOUT, or a fabric error.
 */
int fep_comm_wait(fabep_comm_t *comm, const char *what, uint64_t ctr,
		  uint64_t target, uint64_t slots, size_t stride, uint64_t seq);
/* The same, with work(work_ctx) done once on the calling thread while
 * the pool's other threads already progress the channels (before the
 * wait when nobody would); its error is returned when the wait has none. */
int fep_comm_wait_with(fabep_comm_t *comm, const char *what, uint64_t ctr,
		       uint64_t target, uint64_t slots, size_t stride,
		       uint64_t seq, int (*work)(void *), void *work_ctx);

/* Allgather over the bootstrap (small control data, start-up only). */
int fep_comm_allgather(fabep_comm_t *comm, const void *in, void *out, size_t len);

/*
 * Agree on an error: every rank passes its local status (0 or a negative
 * code); every rank returns the same value: 0 if all were 0, else the
 * first nonzero status by rank for the failing ranks themselves, and
 * -FABEP_ERR_PEER for the others (logged with the failing rank).
 * Uses the fabric barrier slots, so it works after creation.
 */
int fep_comm_agree(fabep_comm_t *comm, int status);

/*
 * Take a collective handle's heap block (fep_hb_alloc: the same on every
 * rank, given the AND of the ranks' masks from the creation's exchange)
 * and the place of its ctr_bytes of counters: a counter slot (fep_cs_*,
 * where remote CQ data can name them) where one fits and is free, else
 * the block's first ctr_bytes.  Counters that held data before are
 * zeroed on every rank, then a barrier, before any peer can add to them.
 * 0 with *off and *ctrs; -FABEP_ERR_HEAP_FULL (nothing taken, for the
 * caller to explain); -ERANGE where the strategy signals with CQ data
 * that cannot name the block's counters and no slot is free (logged,
 * nothing taken); or the barrier's error (logged; block and slot are
 * kept, never reused).
 */
int fep_comm_block(fabep_comm_t *comm, const struct fep_hb_hello *all_free,
		   size_t size, size_t ctr_bytes, uint64_t *off, uint64_t *ctrs);
/* Give back a handle's block at off and its counters at ctrs (clean: no
 * peer's write can still land in them; else both are kept). */
void fep_comm_block_free(fabep_comm_t *comm, uint64_t off, uint64_t ctrs,
			 bool clean);
/* Put a handle just made on the communicator's list, with the function
 * that destroys it; take it off (its destruction). */
void fep_comm_handle_add(fabep_comm_t *comm, struct fep_comm_handle *h,
			 void (*destroy)(struct fep_comm_handle *h));
void fep_comm_handle_del(struct fep_comm_handle *h);

/* Put the default action back for every signal whose handler lies in
 * libinfinipath (libfabric's psm provider installs one that calls exit;
 * signals.c); the number of signals restored. */
int fep_signals_restore(void);

#endif
