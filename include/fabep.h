/*
 * fabep.h - Mixture-of-Experts communication over libfabric RMA.
 *
 * The one public header of libfabep.  Three parts:
 *
 *   1. The communicator and its one-sided layer: a symmetric heap that
 *      every rank allocates identically, put (fi_write into a peer's heap),
 *      put + signal (the write, then an atomic add on a counter in the
 *      peer's heap, ordered so the data is there when the counter moves),
 *      and waits on local counters.
 *   2. Expert parallelism: dispatch and combine.
 *   3. Collectives: barrier, allreduce, allreduce + RMSNorm + FP8.
 *
 * Conventions
 *   - Every function that can fail returns 0 or a negative errno-style
 *     code (libfabric's -FI_E* codes pass through unchanged);
 *     fabep_strerror() turns it into text.  The function that first sees
 *     an error logs why (FABEP_LOG=error|warn|info|debug).
 *   - Outputs are written only on success.
 *   - The library never exits or aborts the process.
 *   - Calls marked "collective" must be made by every rank of the
 *     communicator, in the same order.
 *   - A communicator is used by one thread at a time.
 */
#ifndef FABEP_H
#define FABEP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FABEP_API __attribute__((visibility("default")))
#else
#define FABEP_API
#endif

#define FABEP_VERSION_MAJOR 0
#define FABEP_VERSION_MINOR 1
#define FABEP_VERSION_PATCH 0

/* ------------------------------------------------------------------ */
/* Errors                                                             */
/* ------------------------------------------------------------------ */

/* fabep's own codes, beyond errno values.  All are returned negated. */
enum {
	FABEP_ERR_BASE = 10000,
	FABEP_ERR_MISMATCH,    /* configurations differ between ranks */
	FABEP_ERR_PEER,        /* a peer reported an error in a collective call */
	FABEP_ERR_PEER_LOST,   /* a peer died or closed its connection */
	FABEP_ERR_PROTOCOL,    /* a peer sent a malformed message or count */
	FABEP_ERR_NO_PROVIDER, /* no libfabric provider fits the request */
	FABEP_ERR_NO_SIGNAL,   /* the requested signal strategy is not supported */
	FABEP_ERR_HEAP_FULL,   /* the symmetric heap has no room left */
	FABEP_ERR_BUSY,        /* all buffer sets are in use */
	FABEP_ERR_LAST
};

/* Text for a code returned by any fabep_* call (negative or positive). */
FABEP_API const char *fabep_strerror(int err);

/* The version of the library linked at run time, "MAJOR.MINOR.PATCH". */
FABEP_API const char *fabep_version(void);

/* ------------------------------------------------------------------ */
/* Communicator                                                       */
/* ------------------------------------------------------------------ */

typedef struct fabep_comm fabep_comm_t;

/*
 * An allgather supplied by the caller, for servers that bootstrap over
 * their own control plane: gather `len` bytes from every rank into
 * `recvbuf` (size * len bytes, rank order).  Return 0 or a negative code.
 * It is called collectively, from every rank, in the same order.
 */
typedef int (*fabep_allgather_fn)(const void *sendbuf, void *recvbuf,
				  size_t len, void *ctx);

/* Signal strategies: how a put's data is made visible before its signal. */
typedef enum {
	FABEP_SIGNAL_AUTO = 0, /* pick the fastest correct one for the provider */
	FABEP_SIGNAL_ORDERED,  /* FI_ORDER_WAW: post write then atomic */
	FABEP_SIGNAL_FENCE,    /* FI_FENCE on the atomic */
	FABEP_SIGNAL_DELIVERY, /* FI_DELIVERY_COMPLETE writes, reap, then atomic */
	FABEP_SIGNAL_CQDATA,   /* fi_writedata, counted by the target's progress */
} fabep_signal_t;

typedef struct fabep_comm_attr {
	/* Bootstrap.  With allgather == NULL the communicator is made from the
	 * environment: FABEP_RANK, FABEP_WORLD_SIZE, FABEP_ROOT (host:port of
	 * rank 0's rendezvous), else OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE,
	 * SLURM_PROCID/NTASKS with FABEP_ROOT still naming the rendezvous. */
	fabep_allgather_fn allgather;
	void *allgather_ctx;
	int rank;         /* with allgather: this rank */
	int size;         /* with allgather: number of ranks */

	/* Fabric.  NULL / 0 / AUTO means "from the environment, else chosen". */
	const char *provider;   /* FABEP_PROVIDER, e.g. "shm", "tcp", "sockets", "verbs" */
	const char *domain;     /* FABEP_DOMAIN */
	fabep_signal_t signal;  /* FABEP_SIGNAL=ordered|fence|delivery|cqdata */
	int timeout_ms;         /* FABEP_TIMEOUT_MS, default 30000 */
	size_t heap_size;       /* FABEP_HEAP_SIZE, default 64 MiB; rounded up to pages */

	/* Local work.  threads: FABEP_THREADS (0 = default); numa_node:
	 * FABEP_NUMA_NODE (-1 = the NIC's node, or the caller's for shm). */
	int threads;
	int numa_node;
} fabep_comm_attr_t;

/* Fill attr with defaults (everything from the environment). */
FABEP_API void fabep_comm_attr_init(fabep_comm_attr_t *attr);

/* Create a communicator.  Collective.  attr may be NULL (all defaults). */
FABEP_API int fabep_comm_create(const fabep_comm_attr_t *attr,
				fabep_comm_t **comm);
/* Destroy it.  Collective when every rank is alive; returns after a
 * bounded wait when peers are gone.  NULL is accepted and ignored. */
FABEP_API int fabep_comm_destroy(fabep_comm_t *comm);

FABEP_API int fabep_comm_rank(const fabep_comm_t *comm);
FABEP_API int fabep_comm_size(const fabep_comm_t *comm);
/* The provider, domain and signal strategy chosen at creation. */
FABEP_API const char *fabep_comm_provider(const fabep_comm_t *comm);
FABEP_API const char *fabep_comm_domain(const fabep_comm_t *comm);
FABEP_API fabep_signal_t fabep_comm_signal(const fabep_comm_t *comm);
FABEP_API const char *fabep_signal_name(fabep_signal_t sig);
/* Parse "ordered"|"fence"|"delivery"|"cqdata"|"auto"; -EINVAL otherwise. */
FABEP_API int fabep_signal_parse(const char *name, fabep_signal_t *sig);

/*
 * What a provider offers, as fabep sees it (fabep_info prints these).
 * Describes what fi_getinfo granted for fabep's request (FI_RMA,
 * FI_ATOMIC where offered, FI_EP_RDM, FI_AV_TABLE).
 */
typedef struct fabep_provider_desc {
	char provider[64];       /* e.g. "shm", "tcp;ofi_rxm", "sockets" */
	char fabric[64];
	char domain[64];
	uint64_t caps;           /* FI_* capability bits granted */
	uint64_t mode;
	int mr_mode;             /* FI_MR_* bits granted */
	uint64_t msg_order;      /* FI_ORDER_* bits granted */
	int fence;               /* FI_FENCE granted */
	int delivery_complete;   /* FI_DELIVERY_COMPLETE offered */
	int atomic_sum_u64;      /* fi_query_atomic(FI_UINT64, FI_SUM) works */
	size_t atomic_count;     /* largest count per atomic op (0 = none) */
	size_t inject_size;
	size_t max_msg_size;
	size_t rma_iov_limit;
	size_t cq_data_size;
	unsigned signals;        /* bit (1 << fabep_signal_t) per strategy usable */
	fabep_signal_t signal;   /* what fabep picks by default */
	char signal_why[192];    /* why */
	int numa_node;           /* of the NIC, -1 if unknown / not a NIC */
} fabep_provider_desc_t;

/*
 * List the providers fabep can use (FI_RMA, FI_EP_RDM), at most `max`,
 * with `provider` (NULL = all) as a filter.  *count gets the number
 * written.  Opens no endpoint.
 */
FABEP_API int fabep_provider_list(const char *provider,
				  fabep_provider_desc_t *descs, int max,
				  int *count);

/* Barrier over the fabric.  Collective.  -ETIMEDOUT after the timeout. */
FABEP_API int fabep_barrier(fabep_comm_t *comm);

/* ------------------------------------------------------------------ */
/* Symmetric heap and one-sided operations                            */
/* ------------------------------------------------------------------ */

/* An offset into the symmetric heap: the same object sits at the same
 * offset on every rank. */
typedef uint64_t fabep_off_t;

/*
 * Allocate `size` bytes (aligned to `align`, a power of two, 0 = 64) from
 * the symmetric heap.  Collective in effect: every rank must make the same
 * sequence of allocations so offsets agree (checked in debug builds).
 * The memory is zeroed.  -FABEP_ERR_HEAP_FULL when it does not fit.
 */
FABEP_API int fabep_heap_alloc(fabep_comm_t *comm, size_t size, size_t align,
			       fabep_off_t *off);
/* Local address of a heap offset (NULL if out of range). */
FABEP_API void *fabep_heap_ptr(fabep_comm_t *comm, fabep_off_t off);
FABEP_API size_t fabep_heap_size(const fabep_comm_t *comm);

/*
 * Write `len` bytes from local heap offset `src` to heap offset `dst` on
 * `peer`.  Returns once posted; the source may be reused after
 * fabep_flush().  No ordering with later puts is implied.
 */
FABEP_API int fabep_put(fabep_comm_t *comm, int peer, fabep_off_t dst,
			fabep_off_t src, size_t len);

/*
 * Put, then add `add` to the uint64 counter at heap offset `sig` on
 * `peer`, such that when the peer sees the counter move, the data is
 * there.  Counters are never reset: wait for counter >= a target that
 * advances.  `sig` must be 8-byte aligned; len may be 0 (signal only).
 */
FABEP_API int fabep_put_signal(fabep_comm_t *comm, int peer, fabep_off_t dst,
			       fabep_off_t src, size_t len, fabep_off_t sig,
			       uint64_t add);

/* Wait until every put and signal this rank posted has completed locally
 * (source buffers reusable). */
FABEP_API int fabep_flush(fabep_comm_t *comm);

/*
 * Wait until the local uint64 counter at heap offset `sig` reaches
 * `target` (>=), driving progress.  -ETIMEDOUT after the communicator's
 * timeout, with a log message.
 */
FABEP_API int fabep_wait(fabep_comm_t *comm, fabep_off_t sig, uint64_t target);

/* Read a local counter (acquire). */
FABEP_API uint64_t fabep_counter_read(fabep_comm_t *comm, fabep_off_t sig);

/* Drive progress of the fabric once (for callers that poll). */
FABEP_API int fabep_progress(fabep_comm_t *comm);

/* ------------------------------------------------------------------ */
/* Compute kernels                                                    */
/* ------------------------------------------------------------------ */

/* Instruction-set levels of the local kernels. */
typedef enum {
	FABEP_ISA_SCALAR = 0,
	FABEP_ISA_AVX2 = 1,   /* AVX2 + F16C + FMA */
	FABEP_ISA_AVX512 = 2, /* AVX-512 F/BW/VL (+BF16 where present) */
} fabep_isa_t;

/* The level chosen at start-up (FABEP_ISA=scalar|avx2|avx512 forces one
 * no higher than the CPU supports). */
FABEP_API fabep_isa_t fabep_isa(void);
FABEP_API const char *fabep_isa_name(fabep_isa_t isa);

/* Number of worker threads and NUMA node of a communicator's pool. */
FABEP_API int fabep_comm_threads(const fabep_comm_t *comm);
FABEP_API int fabep_comm_numa_node(const fabep_comm_t *comm);

/* ------------------------------------------------------------------ */
/* Expert parallelism: dispatch and combine                           */
/* ------------------------------------------------------------------ */
/* @@EP-BEGIN@@ (src/ep owns this section) */
/* @@EP-END@@ */

/* ------------------------------------------------------------------ */
/* Collectives: allreduce, allreduce + RMSNorm (+ FP8)                */
/* ------------------------------------------------------------------ */
/* @@COLL-BEGIN@@ (src/coll owns this section) */
/* @@COLL-END@@ */

#ifdef __cplusplus
}
#endif

#endif /* FABEP_H */
