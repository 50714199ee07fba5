/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
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
 *   - Every struct the caller allocates and passes in opens with
 *     `size_t size`, see "Extensible structs" below.
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
#define FABEP_VERSION_MINOR 5
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

/* The error messages the library logged on the calling thread since this
 * function last returned them (whatever FABEP_LOG says), oldest first, one
 * per line; "" if none.  The text stays valid until the thread logs its
 * next error.  See fabep_last_error(3). */
FABEP_API const char *fabep_last_error(void);

/* quiet != 0: the calling thread's log lines are no longer printed to
 * standard error (its error messages are still kept for
 * fabep_last_error()); 0: printed as FABEP_LOG says, the default.  Returns
 * the thread's previous setting, 0 or 1.  See fabep_log_quiet(3). */
FABEP_API int fabep_log_quiet(int quiet);

/* The version of the library linked at run time, "MAJOR.MINOR.PATCH". */
FABEP_API const char *fabep_version(void);

/* ------------------------------------------------------------------ */
/* Extensible structs                                                 */
/* ------------------------------------------------------------------ */

/*
 * Every struct the caller allocates and passes to the library
 * (fabep_comm_attr_t, fabep_moe_config_t, fabep_rmsnorm_params_t,
 * fabep_moe_recv_t, fabep_moe_timing_t, fabep_provider_desc_t) opens with
 * `size_t size`: sizeof the struct as the caller compiled it.  Later
 * versions only append fields, so the library can tell an older or newer
 * caller's layout from it (the rule of Linux's copy_struct_from_user):
 *   - the *_init() functions set it; for an output struct the caller sets
 *     `.size = sizeof(x)` before the call (zero the struct first when it
 *     may have fields this library does not know: they are left alone);
 *   - size 0, smaller than the first extensible layout (fabep 0.2's), or
 *     larger than FABEP_STRUCT_SIZE_MAX: -EINVAL, logged naming the
 *     struct; nothing is read or written past the size field;
 *   - an input larger than the library knows is accepted only if every
 *     byte past the fields it knows is zero, else -E2BIG (the caller
 *     asked for something this library cannot do); a field it knows that
 *     a smaller (older) input lacks counts as 0, which is always its
 *     default;
 *   - an output is written only up to min(size, what the library knows);
 *     its size field is left as the caller set it.
 */
#define FABEP_STRUCT_SIZE_MAX 4096

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
	FABEP_SIGNAL_CMA       /* shm only: plain writes, which shm's fast path
				  completes by the initiator's
				  process_vm_writev; reap, then atomic */
} fabep_signal_t;

typedef struct fabep_comm_attr {
	size_t size;      /* sizeof(fabep_comm_attr_t): fabep_comm_attr_init */
	/* Bootstrap.  With allgather == NULL the communicator is made from the
	 * environment: FABEP_RANK, FABEP_WORLD_SIZE, FABEP_ROOT (host:port of
	 * rank 0's rendezvous), else OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE,
	 * SLURM_PROCID/NTASKS with FABEP_ROOT still naming the rendezvous. */
	fabep_allgather_fn allgather;
	void *allgather_ctx;
	int rank;         /* with allgather: this rank */
	int nranks;       /* with allgather: number of ranks */

	/* Fabric.  NULL / 0 / AUTO means "from the environment, else chosen". */
	const char *provider;   /* FABEP_PROVIDER, e.g. "shm", "tcp", "sockets", "verbs" */
	const char *domain;     /* FABEP_DOMAIN */
	fabep_signal_t signal;  /* FABEP_SIGNAL=ordered|fence|delivery|cqdata|cma */
	int timeout_ms;         /* FABEP_TIMEOUT_MS, default 30000 */
	size_t heap_size;       /* FABEP_HEAP_SIZE, default 64 MiB; rounded up to pages */

	/* Local work.  threads: FABEP_THREADS (0 = default); numa_node:
	 * FABEP_NUMA_NODE (-1 = the NIC's node, or the caller's for shm). */
	int threads;
	int numa_node;

	/* How long creation's TCP rendezvous (FABEP_ROOT) waits for every
	 * rank to arrive: FABEP_RENDEZVOUS_TIMEOUT_MS, else timeout_ms; -1
	 * waits without a limit, as a server for clients that come when
	 * their operator starts them.  Every later wait keeps timeout_ms.
	 * Not used with an allgather callback (its own waits decide). */
	int rendezvous_timeout_ms;
} fabep_comm_attr_t;

/* Fill attr with defaults (everything from the environment) and set
 * attr->size. */
FABEP_API void fabep_comm_attr_init(fabep_comm_attr_t *attr);

/* Create a communicator.  Collective.  attr may be NULL (all defaults).
 * A field out of range (or a bad FABEP_* variable) fails with -EINVAL on
 * the rank that has it, which still tells the others through the
 * rendezvous: theirs fails at once with -FABEP_ERR_PEER.  An attr whose
 * size is refused is not read: that rank fails before any exchange, and
 * the others wait for it until their timeout. */
FABEP_API int fabep_comm_create(const fabep_comm_attr_t *attr,
				fabep_comm_t **comm);
/* Destroy it, and first the MoE and allreduce handles made on it that
 * are still alive (which must not be used or destroyed afterwards).
 * Collective when every rank is alive; returns after a bounded wait when
 * peers are gone.  NULL is accepted and ignored. */
FABEP_API int fabep_comm_destroy(fabep_comm_t *comm);
/* Free it without waiting for the peers and without the goodbye, as a
 * rank that gives up does (an exception, a signal, a failure of its
 * own): not collective, it returns at once, and the peers waiting for
 * this rank fail with -FABEP_ERR_PEER_LOST instead of at their timeout
 * (bootstrapped through the caller's allgather, at their timeout).  Its
 * handles are destroyed first, as for fabep_comm_destroy.  The heap's
 * memory stays mapped until the process ends (peers may still write
 * into it), as after a destroy that followed a failure.  NULL is
 * ignored. */
FABEP_API void fabep_comm_abort(fabep_comm_t *comm);
/* For launchers: remove the shared-memory regions that process `pid` of
 * this host left behind when it died without destroying its
 * communicators (killed, or crashed): libfabric's shm names them
 * /dev/shm/<pid>:<uid>:<endpoint>.  Call it after reaping a rank
 * (0 removed where it destroyed them).  Returns how many it removed,
 * -EINVAL for pid <= 0,
 * -EBUSY while a process with that pid exists (its regions may be in
 * use).  See fabep_shm_cleanup(3). */
FABEP_API int fabep_shm_cleanup(long pid);

FABEP_API int fabep_comm_rank(const fabep_comm_t *comm);
FABEP_API int fabep_comm_size(const fabep_comm_t *comm);
/* The provider, domain and signal strategy chosen at creation. */
FABEP_API const char *fabep_comm_provider(const fabep_comm_t *comm);
FABEP_API const char *fabep_comm_domain(const fabep_comm_t *comm);
FABEP_API fabep_signal_t fabep_comm_signal(const fabep_comm_t *comm);
FABEP_API const char *fabep_signal_name(fabep_signal_t sig);
/* Parse "ordered"|"fence"|"delivery"|"cqdata"|"cma"|"auto"; -EINVAL
 * otherwise. */
FABEP_API int fabep_signal_parse(const char *name, fabep_signal_t *sig);

/*
 * What a provider offers, as fabep sees it (fabep_info prints these).
 * Describes what fi_getinfo granted for fabep's request (FI_RMA,
 * FI_ATOMIC where offered, FI_EP_RDM, FI_AV_TABLE).
 */
typedef struct fabep_provider_desc {
	size_t size;             /* the caller sets it: see fabep_provider_list */
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
 * written.  Opens no endpoint.  With max > 0 the caller sets descs[0].size
 * to sizeof(fabep_provider_desc_t): it is the size of every element (the
 * array's stride); entry i is written up to that size, its size field
 * included (set to descs[0].size).
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
 * Allocate `size` bytes (aligned to `align`, a power of two up to 4096,
 * 0 = 64) from the symmetric heap.  Collective in effect: every rank must
 * make the same sequence of allocations so offsets agree.  Nothing checks
 * that here: the next fabep_moe_create() or fabep_allreduce_create()
 * compares the ranks' heaps (bytes in use, handle blocks) and fails on
 * every rank with -FABEP_ERR_MISMATCH when they differ.  The memory is
 * zeroed.  -EINVAL for an align that is not a power of two or exceeds
 * 4096; -FABEP_ERR_HEAP_FULL when it does not fit.
 */
FABEP_API int fabep_heap_alloc(fabep_comm_t *comm, size_t size, size_t align,
			       fabep_off_t *off);
/* Local address of a heap offset (NULL unless within an allocation).
 * Every offset and range the one-sided calls below take must lie within
 * one allocation of fabep_heap_alloc (the rest of the heap is the
 * library's own): a put or get's bytes outside one give -ERANGE, a
 * counter outside one -EINVAL. */
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
 * Read counters with fabep_counter_read or fabep_wait: with several
 * channels (FABEP_CHANNELS, fabep(7)) the word in memory holds the count
 * times the number of channels, since a large put is split over them and
 * each part adds its share.
 */
FABEP_API int fabep_put_signal(fabep_comm_t *comm, int peer, fabep_off_t dst,
			       fabep_off_t src, size_t len, fabep_off_t sig,
			       uint64_t add);

/*
 * Read `len` bytes at heap offset `src` of `peer` into heap offset `dst`
 * of this rank.  Returns once posted; the bytes are at dst after
 * fabep_flush().  The peer takes no part: the caller orders the read
 * after the peer's writes of those bytes (a counter the peer signals).
 * peer may be this rank.  -EINVAL for a peer out of range, -ERANGE for
 * a range not within one allocation on either side.
 */
FABEP_API int fabep_get(fabep_comm_t *comm, int peer, fabep_off_t dst,
			fabep_off_t src, size_t len);

/* Wait until every put, signal and get this rank posted has completed
 * locally (source buffers reusable, gets' bytes in place). */
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
	FABEP_ISA_AVX512 = 2  /* AVX-512 F/BW/VL (+BF16 where present) */
} fabep_isa_t;

/* The level chosen at start-up (FABEP_ISA=scalar|avx2|avx512 forces one
 * no higher than the CPU supports). */
FABEP_API fabep_isa_t fabep_isa(void);
FABEP_API const char *fabep_isa_name(fabep_isa_t isa);

/* Number of worker threads and NUMA node of a communicator's pool. */
FABEP_API int fabep_comm_threads(const fabep_comm_t *comm);
FABEP_API int fabep_comm_numa_node(const fabep_comm_t *comm);
/* Number of channels: endpoints per rank that large puts are split over
 * (FABEP_CHANNELS, fabep(7)). */
FABEP_API int fabep_comm_channels(const fabep_comm_t *comm);

/* ------------------------------------------------------------------ */
/* Expert parallelism: dispatch and combine                           */
/* ------------------------------------------------------------------ */
/* @@EP-BEGIN@@ (src/ep owns this section) */
/*
 * A MoE handle moves tokens to the ranks that own their experts
 * (dispatch) and brings the expert outputs back, summed with the router
 * weights (combine).  Experts are split in equal contiguous blocks: rank
 * r owns experts [r * E / size, (r + 1) * E / size).  See fabep_moe(3).
 *
 * Create and every dispatch and combine call (and their halves) are
 * collective: every rank makes the same sequence of them;
 * fabep_moe_send_buffer, fabep_moe_timing and fabep_moe_destroy are
 * local.  Bad input on any rank (NULL buffers, more
 * tokens than max_tokens, an expert id outside [-1, E), a routed slot's
 * weight that is not finite) is caught before a byte is sent; the rank
 * still completes the exchange with an error flag, and every rank returns
 * the same code (the one of the lowest failing rank, logged with its
 * rank).  A send half (dispatch_send, combine_send)
 * that refuses its input completes the exchange itself before it returns
 * the code: that rank owes no receive half, the other ranks' receive
 * halves return the code, and every handle is ready for the next call.  A
 * refused dispatch is gone (call it again); a refused combine leaves its
 * dispatch received on every rank, for the next combine.  The exception:
 * the output arguments of the receive halves (dispatch_recv,
 * combine_recv) are checked on the calling rank alone (see each).
 */

/* Element formats of tokens and expert outputs. */
typedef enum {
	FABEP_MOE_FP32 = 0,
	FABEP_MOE_BF16 = 1,
	/* token_type only: e4m3fn (OCP), quantized by dispatch from rows of
	 * input_type, with one fp32 scale per token (fp8_block 0) or per
	 * fp8_block values (e.g. 128) */
	FABEP_MOE_FP8 = 2,
	/* token_type only: e4m3fn rows the caller quantized, passed through
	 * with its scales (same layout as FABEP_MOE_FP8's) */
	FABEP_MOE_FP8_PREQUANT = 3
} fabep_moe_type_t;

#define FABEP_MOE_MAX_TOPK 32

typedef struct fabep_moe_config {
	size_t size;       /* sizeof(fabep_moe_config_t): fabep_moe_config_init */
	int num_experts;   /* E, a multiple of the number of ranks */
	int top_k;         /* 1 .. FABEP_MOE_MAX_TOPK, at most num_experts */
	size_t hidden;     /* values per token row, 1 .. 2^24 */
	int max_tokens;    /* most tokens any rank passes to one dispatch,
			      1 .. 2^24, times the ranks below about 2^30 */
	fabep_moe_type_t token_type;   /* what travels: FP32, BF16, FP8, FP8_PREQUANT */
	/* FP8: the caller's rows, FP32 or BF16 (checked for every token type) */
	fabep_moe_type_t input_type;
	/* FP8: 0 = one scale per token, else a multiple of 16 (checked for
	 * every token type) */
	int fp8_block;
	fabep_moe_type_t combine_type; /* FP32 or BF16: expert outputs and combine output */
	int buffer_sets;   /* dispatches that may be outstanding; 0 = 2 */
	unsigned flags;    /* FABEP_MOE_ZERO_COPY; 0 = default */
} fabep_moe_config_t;

/* Config flags */
/* Dispatch leaves the received rows where they landed (the receive slots)
 * instead of copying them into expert-major order: fabep_moe_recv_t's
 * row_index then lists, in expert-major order, the slot row of each
 * (token, k) with an expert here (what a grouped matmul that takes row
 * ids, such as llama.cpp's mul_mat_id, consumes), and the rows stay
 * valid only until the combine of that dispatch. */
#define FABEP_MOE_ZERO_COPY 1u

typedef struct fabep_moe fabep_moe_t;

/* Defaults: bf16 tokens and combine, 2 buffer sets, cfg->size set; the
 * sizes are 0 and must be set. */
FABEP_API void fabep_moe_config_init(fabep_moe_config_t *cfg);

/* Symmetric-heap bytes a handle with this configuration takes on a
 * communicator of `nranks` ranks (0 if the configuration is invalid;
 * a bad cfg->size is logged).
 * Add it to fabep_comm_attr_t.heap_size (or FABEP_HEAP_SIZE). */
FABEP_API size_t fabep_moe_heap_bytes(const fabep_moe_config_t *cfg, int nranks);

/*
 * Create a handle.  Collective.  Configurations that differ between ranks
 * give -FABEP_ERR_MISMATCH on every rank; a configuration out of range on
 * any rank, or a malformed FABEP_MOE_CHUNK, -EINVAL on every rank; a heap
 * without room -FABEP_ERR_HEAP_FULL (the message names the bytes needed);
 * host memory that runs out or a NULL cfg or moe on any rank, -ENOMEM or
 * -EINVAL on every rank (fabep_moe(3) names the two cases that fail on
 * one rank alone).  A cfg->size refused on one rank (-EINVAL, or -E2BIG
 * for unknown nonzero fields) gives that code on every rank.
 */
FABEP_API int fabep_moe_create(fabep_comm_t *comm, const fabep_moe_config_t *cfg,
			       fabep_moe_t **moe);
/* Free the handle (not collective).  Its heap block is reused by a later
 * creation once every rank has destroyed its handle, unless a call of it
 * failed in a wait or a transfer or a send half that returned 0 was never
 * received (then it is kept).  NULL is ignored. */
FABEP_API int fabep_moe_destroy(fabep_moe_t *moe);

/*
 * What dispatch delivers to an expert rank: the rows it received, in
 * expert-major order (the rows of local expert i are
 * [row_offsets[i], row_offsets[i + 1]); within an expert by source rank,
 * then token index, then k).  There is one row per (token, k) whose
 * expert lives here: a token that names an expert in two of its k slots
 * brings it two rows, each with its k and weight, and combine sums both
 * (the same as one row with the weights' sum, up to rounding).  Row r's values start at
 *     (const char *)x + row_index[r] * row_stride
 * and its FP8 scales at scales + row_index[r] * scale_stride.  By default
 * the rows are copied in that order (row_index[r] == r, row_stride the
 * row size, scale_stride scales_per_row), and the buffers belong to the
 * handle (the rows in its heap where sources placed them,
 * FABEP_MOE_PLACE) and stay valid until the dispatch that reuses this
 * buffer set (buffer_sets dispatches later) or fabep_moe_destroy.  With
 * FABEP_MOE_ZERO_COPY nothing is copied: x and scales point into the
 * receive slots (a row received once for several local experts appears
 * once per expert in row_index, with the same slot row), and they stay
 * valid until this dispatch's combine (send half) begins.  The caller
 * sets out->size = sizeof(fabep_moe_recv_t) before the call.
 */
typedef struct fabep_moe_recv {
	size_t size;                 /* the caller's sizeof(fabep_moe_recv_t) */
	size_t rows;                 /* rows received */
	int local_experts;           /* E / size */
	int first_expert;            /* global id of local expert 0 */
	const void *x;               /* [rows, hidden] of token_type (FP8: bytes) */
	const float *scales;         /* FP8: [rows, scales_per_row]; else NULL */
	size_t scales_per_row;       /* FP8: 1 or ceil(hidden / fp8_block) */
	const uint32_t *row_offsets; /* [local_experts + 1] */
	const int32_t *expert_ids;   /* [local_experts]: global id of each group */
	const uint32_t *expert_counts; /* [local_experts]: rows per expert (load) */
	const int32_t *src_info;     /* [rows, 3]: source rank, token index, k */
	const float *weights;        /* [rows]: the router weight of each row */
	const int32_t *row_index;    /* [rows]: slot row of expert-major row r */
	size_t row_stride;           /* bytes between slot rows of x */
	size_t scale_stride;         /* FP8: floats between slot rows of scales */
} fabep_moe_recv_t;

/*
 * Send half of dispatch: check the input, write each token's record once,
 * and write each destination's tokens as one run of records (in chunks of
 * FABEP_MOE_CHUNK bytes, each with its signal, so the first leave while
 * the rest are packed).  x: [n, hidden] of input_type (FP8) or token_type,
 * or the x of fabep_moe_send_buffer() (rows at its stride, no copy);
 * scales: FP8_PREQUANT only, [n, scales_per_row] or the send buffer's;
 * topk_ids: [n, top_k], -1 = not routed; topk_weights: [n, top_k] or NULL
 * (all 1).  topk_ids == NULL reuses the previous accepted dispatch's
 * routing and weights (n must match): the backward of combine.  0 <= n <= max_tokens;
 * with n == 0, x, scales and topk_ids may be NULL (nothing to route, and
 * the empty routing becomes the previous one).  x and scales may be
 * reused as soon as this returns.  -FABEP_ERR_BUSY (nothing sent, on
 * every rank) when
 * buffer_sets dispatches are already outstanding without their combine.
 */
FABEP_API int fabep_moe_dispatch_send(fabep_moe_t *moe, const void *x,
				      const float *scales, size_t n,
				      const int32_t *topk_ids,
				      const float *topk_weights);
/*
 * Where the next dispatch_send can find its tokens without copying them:
 * the caller writes token t's row at *x + t * *stride bytes (and, for
 * FP8_PREQUANT, its scales at *scales + t * *scale_stride floats), then
 * passes *x (and *scales) to dispatch_send.  The buffer is registered
 * memory of the next dispatch's buffer set, valid for that one call; it
 * stays the library's afterwards (received rows may point into it).  Any
 * output may be NULL.  -ENOTSUP for token_type FP8 (quantized during
 * dispatch: the rows are the caller's); -FABEP_ERR_BUSY when the next
 * buffer set still holds a dispatch not yet combined.
 */
FABEP_API int fabep_moe_send_buffer(fabep_moe_t *moe, void **x, size_t *stride,
				    float **scales, size_t *scale_stride);
/* Receive half: wait for every peer's run, build *out.  Output written
 * only on success.  A NULL out or a bad out->size fails with -EINVAL on
 * this rank alone, before anything is consumed: the dispatch stays
 * pending, and the call may be repeated with a valid out. */
FABEP_API int fabep_moe_dispatch_recv(fabep_moe_t *moe, fabep_moe_recv_t *out);
/* Both halves. */
FABEP_API int fabep_moe_dispatch(fabep_moe_t *moe, const void *x,
				 const float *scales, size_t n,
				 const int32_t *topk_ids, const float *topk_weights,
				 fabep_moe_recv_t *out);

/* Combine flags */
#define FABEP_MOE_UNWEIGHTED 1u /* plain sum (the backward of dispatch) */

/* Called once per finished output row (token index, the row), from the
 * communicator's worker threads, possibly concurrently. */
typedef void (*fabep_moe_row_fn)(void *ctx, size_t token, void *row);

/*
 * Send half of combine, for the oldest dispatch not yet combined: y holds
 * the expert outputs in the order dispatch delivered (rows, ld_y values
 * between rows, combine_type; NULL allowed when rows == 0).  Each token
 * is pre-reduced here (sum_k w_k * y_k over the experts of this rank, fp32
 * accumulation) and one row per token goes back to its source; or, where
 * the source asked for it in the dispatch (FABEP_MOE_COMBINE_ROWS), the
 * token's rows go back as they are and the source weights them.  y may
 * be reused as soon as this returns.
 */
FABEP_API int fabep_moe_combine_send(fabep_moe_t *moe, const void *y,
				     size_t ld_y, unsigned flags);
/* Receive half: out [n, ld_out] of combine_type (n of the matching
 * dispatch; out may be NULL when n == 0); each row the fp32 sum of its
 * partial rows; cb (optional) sees each finished row.  Frees the buffer
 * set for a later dispatch.  A NULL out or ld_out < hidden (with n > 0,
 * after a send half that accepted its input) fails with -EINVAL on this
 * rank alone, before anything is consumed: the combine stays pending, and
 * the call may be repeated with valid arguments. */
FABEP_API int fabep_moe_combine_recv(fabep_moe_t *moe, void *out, size_t ld_out,
				     fabep_moe_row_fn cb, void *cb_ctx);
/* Both halves.  Knowing out before it sends, it sums a token's partial
 * rows into out already while it reduces this rank's own tokens, once
 * every peer's rows have come (the same bits as the halves); the rest
 * after the wait.  out must not overlap y for that (else all after). */
FABEP_API int fabep_moe_combine(fabep_moe_t *moe, const void *y, size_t ld_y,
				unsigned flags, void *out, size_t ld_out,
				fabep_moe_row_fn cb, void *cb_ctx);

/*
 * Where the time of this rank's last dispatch and last combine went, in
 * nanoseconds (each field the last call's; 0 before the first):
 *   dispatch: pack (checks, routing, FP8 quantization, packing the runs),
 *     put (posting the writes and signals), wait (until every peer's run
 *     arrived, with the header checks), build (the expert-major rows and
 *     their metadata);
 *   combine: reduce (the weighted sums on the expert rank), put, wait,
 *     sum (the final sum into out, of the tokens that fabep_moe_combine's
 *     reduce did not already sum there).
 * put + wait is the wire time; wire_bytes what this rank wrote to other
 * ranks (headers included).  Not collective; NULL arguments give -EINVAL.
 * The caller sets out->size = sizeof(fabep_moe_timing_t) before the call.
 */
typedef struct fabep_moe_timing {
	size_t size;     /* the caller's sizeof(fabep_moe_timing_t) */
	uint64_t dispatch_pack_ns, dispatch_put_ns, dispatch_wait_ns,
		 dispatch_build_ns;
	uint64_t combine_reduce_ns, combine_put_ns, combine_wait_ns,
		 combine_sum_ns;
	uint64_t dispatch_wire_bytes, combine_wire_bytes;
} fabep_moe_timing_t;
FABEP_API int fabep_moe_timing(const fabep_moe_t *moe, fabep_moe_timing_t *out);
/* @@EP-END@@ */

/* ------------------------------------------------------------------ */
/* Collectives: allreduce, allreduce + RMSNorm (+ FP8)                */
/* ------------------------------------------------------------------ */
/* @@COLL-BEGIN@@ (src/coll owns this section) */

/*
 * Allreduce, and allreduce + RMSNorm (+ FP8), on [rows, cols] row-major
 * tensors of one element type.  A handle is made once per largest shape;
 * its buffers come from the communicator's symmetric heap (size the heap
 * with fabep_allreduce_heap_bytes()).
 *
 * Algorithm: up to a threshold of input bytes per rank (measured; the
 * environment variable FABEP_AR_ONESTAGE_MAX, in bytes with k/M/G
 * suffixes, overrides it at handle creation; 0 forces the two-stage path)
 * every rank writes its input to every peer and reduces all rows itself;
 * above it, a reduce-scatter by whole rows (rank r owns ceil(rows/ranks)
 * rows), the normalization and quantization of the owned rows, and an
 * allgather of the results (FP8 rows + scales: half the bytes of bf16).
 *
 * Sums are taken in fp32 in rank order (rank 0 + rank 1 + ...) and rounded
 * to the element type, so every rank gets bitwise the same result.  The
 * RMSNorm of a row is
 *     h = sum (+ residual);  inv = 1 / sqrt(mean(h^2) + eps);
 *     y = (h * (gamma + weight_offset)) * inv
 * in fp32, multiplied in that order, and FP8 e4m3fn output has one fp32
 * scale per row, max|y| / 448 (of the finite y) clamped to scale_ub
 * (> 0), with out = e4m3(y / scale), computed as e4m3((h * (gamma +
 * weight_offset)) * (inv * (1 / scale))).
 *
 * Collective errors: every call is collective.  A rank whose arguments
 * are bad still takes part, so every rank returns the same code: the code
 * of the lowest failing rank (e.g. -EINVAL for rows above the handle's
 * maximum or a NULL buffer), -FABEP_ERR_MISMATCH when ranks passed
 * different rows or cols.  After a timeout or a fabric error the handle
 * is unusable (every later call returns -FABEP_ERR_PEER_LOST).
 */
typedef enum {
	FABEP_AR_F32 = 0,   /* float */
	FABEP_AR_BF16 = 1   /* bfloat16, as uint16_t bit patterns */
} fabep_ar_dtype_t;

typedef struct fabep_allreduce fabep_allreduce_t;

/*
 * Symmetric-heap bytes one handle takes (with FABEP_AR_ONESTAGE_MAX and
 * FABEP_AR_HALVING_MAX as the environment says now); add it to
 * fabep_comm_attr_t.heap_size.  0 when
 * an argument is out of range.
 */
FABEP_API size_t fabep_allreduce_heap_bytes(size_t max_rows, size_t cols,
					    fabep_ar_dtype_t dtype, int nranks);

/*
 * Create a handle for calls of up to max_rows x max_cols elements of
 * `dtype`.  Collective (every rank passes the same shape and type, else
 * every rank gets -FABEP_ERR_MISMATCH).  -FABEP_ERR_HEAP_FULL (logged with
 * the bytes needed) when the heap has no room.
 */
FABEP_API int fabep_allreduce_create(fabep_comm_t *comm, size_t max_rows,
				     size_t max_cols, fabep_ar_dtype_t dtype,
				     fabep_allreduce_t **ar);
/* Not collective; NULL is ignored.  The heap block is reused as a MoE
 * handle's is (fabep_moe_destroy), kept after a failed call. */
FABEP_API int fabep_allreduce_destroy(fabep_allreduce_t *ar);
/* The one-stage threshold in force, in input bytes per rank: of the
 * RMSNorm calls, and of fabep_allreduce() (larger on 2 ranks). */
FABEP_API size_t fabep_allreduce_onestage_max(const fabep_allreduce_t *ar);
FABEP_API size_t fabep_allreduce_sum_onestage_max(const fabep_allreduce_t *ar);

/*
 * out[rows, cols] = the sum over ranks of in[rows, cols].  Collective.
 * in == out is allowed (other overlaps are not).  rows may be 0.
 */
FABEP_API int fabep_allreduce(fabep_allreduce_t *ar, const void *in,
			      void *out, size_t rows, size_t cols);

/* Parameters of the RMSNorm calls.  A p->size refused on one rank
 * (-EINVAL, or -E2BIG for unknown nonzero fields) gives that code on
 * every rank, as any bad argument does; eps, weight_offset or scale_ub
 * that differ between ranks give -FABEP_ERR_MISMATCH on every rank
 * (gamma's and the residual's values are not compared). */
typedef struct fabep_rmsnorm_params {
	size_t size;          /* sizeof(fabep_rmsnorm_params_t): fabep_rmsnorm_params_init */
	const void *gamma;    /* cols values of the handle's dtype */
	float eps;            /* e.g. 1e-6 */
	float weight_offset;  /* 0, or 1 for (1 + gamma) models */
	float scale_ub;       /* FP8: > 0: upper bound of a row's scale */
	/* NULL, or [rows, cols] of the handle's dtype, the same on every rank:
	 * on input the residual; on success it holds h = sum + residual
	 * (rounded to the dtype), the value that was normalized. */
	void *residual;
} fabep_rmsnorm_params_t;

/* Zero p and set p->size (eps, weight_offset, scale_ub and residual 0,
 * gamma NULL: the caller sets gamma, and eps as its model needs). */
FABEP_API void fabep_rmsnorm_params_init(fabep_rmsnorm_params_t *p);

/*
 * Allreduce, then RMSNorm, then FP8 e4m3fn: out[rows, cols] bytes and
 * scales[rows] fp32, the same on every rank.  Collective.
 */
FABEP_API int fabep_allreduce_rmsnorm_fp8(fabep_allreduce_t *ar, const void *in,
					  size_t rows, size_t cols,
					  const fabep_rmsnorm_params_t *p,
					  uint8_t *out, float *scales);

/* Allreduce, then RMSNorm: out[rows, cols] of the handle's dtype (out
 * may equal in).  Collective.  p->scale_ub is ignored. */
FABEP_API int fabep_allreduce_rmsnorm(fabep_allreduce_t *ar, const void *in,
				      size_t rows, size_t cols,
				      const fabep_rmsnorm_params_t *p, void *out);

/* @@COLL-END@@ */

#ifdef __cplusplus
}
#endif

#endif /* FABEP_H */
