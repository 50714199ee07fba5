/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * ep.h - expert parallelism: the MoE handle shared by layout.c (creation,
 * heap layout, routing), dispatch.c and combine.c.  Internal.
 *
 * Heap objects of a handle (same offsets on every rank):
 *
 *   counters  dctr[set], cctr[set], hctr[set]: uint64, every source adds
 *             1 per chunk into the set; never reset; a wait is
 *             ctr >= (size-1) * chunks * uses.  hctr counts dispatch
 *             headers (chunk 0), dctr the dispatch records that follow:
 *             as many as each header announces (its chunks), so dctr's
 *             target is the sum of those (set->dexp).
 *   drecv     [set][2 * size] dispatch slots: [source] slots, the set's
 *             staged runs to the other ranks, the input slot.  A slot:
 *             hdr_recs records holding the header (struct fep_ep_hdr,
 *             then uint32 rows per local expert of the receiver) at
 *             their end, at dhoff, so that it and the records can leave
 *             in one write, and every rank's uint32 rows per expert
 *             (dcnt_bytes, a call that may place) right before it; then
 *             max_tokens records of rec_bytes:
 *               int32 token, int32 pad, int32 expert[k] (global, -1 = none),
 *               float weight[k], float scales[nscale], payload (row_bytes)
 *             The own slot's records carry no payload: self_pay points at
 *             the token's record in the input slot.
 *   crecv     [set][expert rank] combine slots: a header (chdr_rows rows)
 *             then max_tokens rows of crow_bytes (combine_type)
 *   cstage    [size-1] combine send runs
 *
 * A header starts with the call's sequence number (what fep_comm_wait
 * reads to name missing peers), the sender's status and its count.  The
 * part a rank sends to itself is written in place.
 */
#ifndef FEP_EP_H
#define FEP_EP_H

#include <stddef.h>
#include <stdint.h>

#include "core/comm.h"
#include "kernels/kernels.h"

struct fep_ep_hdr {
	uint64_t seq;     /* call sequence number, 1, 2, ... */
	int32_t status;   /* 0 or the sender's negative error code */
	uint32_t count;   /* records / rows that follow */
	uint64_t magic;
	/* dispatch: the signals on the set's record counter that follow
	 * from this sender in this call, dchunks - 1, or 0 when its records
	 * came under the header's own signal (fep_ep_merge) */
	uint32_t chunks;
	/* dispatch: FEP_EP_HDR_ROWS, this source's combine asks for rows,
	 * FEP_EP_HDR_PLACE, it may place its rows, FEP_EP_HDR_COUNTS,
	 * every rank's rows per expert follow the receiver's;
	 * combine: FEP_EP_HDR_ROWS, the run is rows (and UNWEIGHTED) */
	uint32_t flags;
	uint64_t pad[4];
};
/* The combine run of this pair is the expert outputs themselves, one row
 * per (token, k) in the expert-major order of the dispatch, which the
 * source weights and sums (rows_wanted, dispatch.c); otherwise one partial
 * row per token, reduced at the expert rank. */
#define FEP_EP_HDR_ROWS 1u
#define FEP_EP_HDR_UNWEIGHTED 2u
/* A dispatch header's flag: the source may write its rows for this rank
 * straight into their places in the expert-major result (placed
 * dispatch, place_send in dispatch.c).  It needs every header to hold,
 * after the rows per expert of the receiver, the rows per expert of every
 * rank (num_experts counts, FEP_EP_HDR_COUNTS): from all headers each
 * rank knows every receiver's layout, so no round of offsets is needed.
 * What the source did is in its record area: a first record whose token
 * index is FEP_EP_PLACED_MARK and whose stamp is the call's says that the
 * rows are in place and the records that follow are metadata only
 * (with FP8 rows, their scales too: pmeta_bytes apart); else full
 * records came as always. */
#define FEP_EP_HDR_PLACE 4u
/* A dispatch header's flag: every rank's rows per expert follow the
 * receiver's.  Only a call that may place carries them (a placing source
 * needs them from every header, and falls back to records where one
 * lacks them): at 256 experts they are 1 KiB, which would take a small
 * call's header out of the provider's inline path. */
#define FEP_EP_HDR_COUNTS 8u
#define FEP_EP_PLACED_MARK (-2)
/* The mark's third word: 1 where the source wrote each token's row once,
 * at its first expert of the receiver, for the receiver to copy to the
 * token's further experts there (a run of more than FEP_EP_ONCE / 3 rows
 * a record, place_once in dispatch.c); 0 where it wrote every row. */
#ifndef FEP_EP_ONCE
#define FEP_EP_ONCE 4
#endif
/* FABEP_MOE_PLACE=auto places a run of at most FEP_EP_PLACE_MAX / 2 rows
 * a record (place_wanted in dispatch.c). */
#ifndef FEP_EP_PLACE_MAX
#define FEP_EP_PLACE_MAX 4
#endif
#define FEP_EP_MAGIC 0x66616265704d6f45ull
#define FEP_EP_HDR 64
/* FABEP_MOE_CHUNK when unset: bytes per pipelined write of a run (0: one
 * write per run; on shm the wire is a copy by the threads that pack, so
 * pipelining a run only adds posts) */
#define FEP_MOE_CHUNK_DEFAULT ((size_t)0)

/* A dispatch chunk gathered from the input slot takes at most
 * m->gather_writes writes; a chunk of more ranges is staged.  Every
 * write is a command in the target's queue (shm), and a queue filled by
 * hundreds of small gathered writes stalls every sender to that target
 * until it next progresses, which costs more than the staging copy it
 * saves.  So a chunk takes at most this many writes, or, where writes
 * take shm's fast path, this rank's share of the target's queue
 * (fep_fab_queue_share) less FEP_EP_QUEUE_SPARE for the run's header
 * and signals, if that is more: the staging copy it saves is the larger
 * cost there (16 ranks, 1024 tokens a rank: a third of the local work). */
#define FEP_EP_GATHER_WRITES 16
#define FEP_EP_QUEUE_SPARE 8

/* Dispatch posts its headers before packing when it packs at least this
 * many bytes of records (below, an extra post only adds latency); where
 * the runs would otherwise each leave as one write with their header
 * (remote CQ data), from the second, since an early header then costs
 * every peer a write of its own (docs/performance.md, tcp at 16 ranks). */
#define FEP_EP_EARLY_BYTES ((size_t)64 << 10)
#define FEP_EP_EARLY_JOIN_BYTES ((size_t)256 << 10)

/* A batch of the sender's copies is made in lanes from this many bytes
 * (below, waking the threads for it costs more than they win). */
#define FEP_EP_LANE_BYTES ((size_t)256 << 10)

enum fep_ep_state {
	FEP_EP_FREE = 0,
	FEP_EP_SENT,      /* dispatch_send done, dispatch_recv pending */
	FEP_EP_RECEIVED,  /* dispatch_recv done, combine pending */
	FEP_EP_CSENT,     /* combine_send done, combine_recv pending */
};

/* One buffer set: the state of one dispatch/combine call. */
struct fep_ep_set {
	int state;
	int status;          /* local error of the send half (agreed later) */
	uint64_t seq;
	uint64_t uses;       /* dispatches into this set (hctr target) */
	uint64_t dexp;       /* record signals announced into this set by
			      * the headers so far (dctr target) */
	uint64_t cuses;      /* combines from this set (cctr target) */

	/* source side: what this rank sent (for combine_recv) */
	size_t n;
	uint32_t *sent;      /* [size] tokens sent to each rank */
	int32_t *ret_idx;    /* [n * kk]: row in crecv of each partial, -1 */
	uint8_t *xrun;       /* [size] the combine run from each rank comes
			      * back as rows (FEP_EP_HDR_ROWS) */
	uint32_t *cexp;      /* [size] rows each combine run must hold */
	int nx;              /* ranks in xrun */
	int32_t *xidx;       /* [n * k]: row in crecv of (token, k) where its
			      * rank sends rows; -1 where not routed */
	int32_t *pidx;       /* [n * k]: the partial row of (token, k) for the
			      * first k of each rank; else -1 */
	float *xw;           /* [n * k]: the routing's weights */
	int32_t *fidx;       /* [n * k]: combine_recv's sum over rows and */
	float *fw;           /* partials where nx (fep_ep_final) */
	uint64_t fin_cuse;   /* the combine (cuses) fidx and fw are of */

	/* expert side: what this rank received */
	uint32_t *rcount;    /* [size] tokens received from each source */
	uint8_t *crows;      /* [size] the source wants its combine as rows */
	int32_t *self_pay;   /* [max_tokens]: record (set index space) holding
			      * the payload of own record i */
	size_t self_n;       /* own records this set's send packed */
	uint32_t *tbase;     /* [size + 1] prefix of rcount */
	size_t rtokens;      /* sum of rcount */
	int32_t *cidx;       /* [rtokens * k]: output row of each (token, k), -1 */
	float *cw;           /* [rtokens * k]: its weight */
	size_t rows, cap_rows;
	void *x;             /* [cap_rows, row_bytes] */
	float *scales;       /* [cap_rows, nscale] */
	int32_t *gidx;       /* [cap_rows]: zero-copy, each row's record
			      * index in drecv; a place-once source's rows,
			      * the row each copies from or -1 */
	int32_t *psrc, *pdst; /* [cap_rows] copy mode: the rows to copy as
			      * (record, result row), in the records' order */
	int32_t *src_info;   /* [cap_rows * 3] */
	float *weights;      /* [cap_rows] */
	uint32_t *row_offsets; /* [L + 1] */
	uint32_t *counts;    /* [L] */
	int32_t *expert_ids; /* [L] */
	int32_t *row_index;  /* [cap_rows]: identity, or gidx (zero-copy) */
	size_t ident_rows;   /* row_index holds the identity up to here */
	void *xo;            /* this call's result rows: x, or the set's
			      * placed region where sources place rows here */
	uint8_t *placed;     /* [size] the source's rows came in place */
	/* the send half of a placed dispatch waited for and checked the
	 * headers (dispatch_recv takes its results) */
	int hdone, hret, hchk, hrefused;
};

/* Phase times of the last calls (fabep_moe_timing). */
struct fep_ep_timing {
	uint64_t d_pack, d_put, d_wait, d_build;
	uint64_t d_hwait;        /* of d_wait: the placed send half's header wait */
	uint64_t c_own;          /* of c_reduce: the own run (overlapped) */
	uint64_t c_reduce, c_put, c_wait, c_sum;
	uint64_t c_fused;        /* tokens summed into out by the own run */
	uint64_t d_bytes, c_bytes;
	uint64_t d_begin, c_begin; /* when the send half was called (debug log) */
};

struct fabep_moe {
	fabep_comm_t *comm;
	struct fep_comm_handle link; /* on the communicator's list */
	fabep_moe_config_t cfg;
	int rank, size;
	int L;               /* local experts */
	int k, kk;           /* top_k, min(top_k, size) */
	int sets;
	size_t hidden;
	size_t elt;          /* bytes per value on the wire (1, 2, 4) */
	size_t in_elt;       /* bytes per value of the caller's x */
	size_t row_bytes;    /* hidden * elt */
	size_t nscale;       /* FP8: scales per row; else 0 */
	int fp8;
	int zcopy;           /* FABEP_MOE_ZERO_COPY */
	int gather;          /* every chunk leaves from the input slot, its
			      * records' pieces gathered into writes, none
			      * staged */
	size_t gather_writes; /* the most writes of one gathered chunk */
	int crows_mode;      /* FABEP_MOE_COMBINE_ROWS: -1 never, 0 auto, 1
			      * wherever the rows fit the combine slot */
	int lanes_mode;      /* FABEP_MOE_LANES: -1 never, 0 auto (batches of
			      * FEP_EP_LANE_BYTES), 1 always (fep_ep_copy) */
	int dmerge;          /* this dispatch's runs leave in one batch under
			      * one signal per peer (fep_ep_merge) */
	int place_mode;      /* FABEP_MOE_PLACE: -1 never, 0 auto (calls
			      * whose headers leave early), 1 always */
	size_t place_rows;   /* rows of a set's placed region; 0: none */
	int crowded;         /* ranks outnumber the CPUs here (the fabric's
			      * oversubscribed): auto places nothing */
	int placing;         /* this dispatch_send places its rows */
	int dcounts;         /* its headers carry every rank's counts */
	fep_k_dtype_t cdt;   /* combine dtype */
	size_t crow_bytes;

	/* record layout */
	size_t meta_bytes, scale_off, pay_off, rec_bytes, hdr_recs;
	size_t pmeta_bytes;  /* a placed run's record: metadata and scales */
	size_t dslot_recs;   /* hdr_recs + max_tokens, padded to 64 bytes */
	size_t dslot_bytes;  /* dslot_recs * rec_bytes */
	size_t dhdr_bytes;   /* dhdr_short + dcnt_bytes: the header's room */
	size_t dhdr_short;   /* FEP_EP_HDR + 4 * L, to 64: a header without
			      * every rank's counts, what chunk 0 then writes */
	size_t dcnt_bytes;   /* 4 * num_experts, to 64, with a placed region:
			      * every rank's counts, right before the header */
	size_t dhoff;        /* a dispatch slot's header: 64-byte aligned at
			      * the end of its header records (fewer than 64
			      * bytes before the first), so that it and the
			      * records can leave in one write */
	size_t chdr_rows, cslot_rows, cslot_bytes;
	size_t choff;        /* a combine slot's header: at the end of its
			      * header rows, 8-byte aligned, so that it and
			      * the rows leave in one write without the
			      * rows' worth of padding before it */
	/* pipelining: every run goes as dchunks (cchunks) writes, the header
	 * then up to dchunk_recs records (cchunk_rows rows) each, each with its
	 * own signal, so the first leave while the rest are packed.  The counts are fixed by
	 * the configuration (a run's later chunks may be empty), so a wait's
	 * target is (size - 1) * chunks * uses. */
	size_t chunk_bytes;  /* FABEP_MOE_CHUNK; 0: one write per run */
	size_t dchunk_recs, dchunks, cchunk_rows, cchunks;
	struct fep_put *puts; /* [(size - 1) * max(dchunks, cchunks)] */
	struct fep_put *rputs; /* combine's rows to every source in one batch */
	size_t rputs_cap;
	uint8_t *chunk_direct; /* [size][dchunks]: chunk leaves from the input slot */

	/* heap offsets */
	uint64_t blk;        /* the handle's heap block (fep_comm_block) */
	uint64_t ctrs;       /* dctr[sets], cctr[sets], hctr[sets]: a counter
				slot, or the block's start */
	uint64_t drecv, crecv, cstage;  /* drecv: [sets][2 * size] slots */
	uint64_t dplace;     /* [sets][place_rows] rows: placed dispatch */

	/* calls */
	uint64_t ndisp;      /* dispatch calls begun */
	int dnext;           /* the set the next dispatch takes (in turn, but
				again after a refused one, settled) */
	int dlast;           /* the set of the last dispatch sent */
	uint64_t ncomb;      /* combines begun (oldest outstanding) */
	uint64_t nlanes;     /* batches of copies made in lanes (fep_ep_copy) */
	int pending_recv;    /* a dispatch_send awaits its dispatch_recv */
	int pending_crecv;   /* a combine_send awaits its combine_recv */
	int cunw;            /* this combine's caller asked for
				FABEP_MOE_UNWEIGHTED */
	int settle;          /* a refused call owes fep_ep_settle, made by
				the next send half before it writes */
	int unclean;         /* a wait or a transfer failed: peers' writes may
				still land here, so the block is never reused */
	const char *dfn;     /* the public dispatch call under way (messages) */
	const char *cfn;     /* the public combine call under way */
	struct fep_ep_set *set;

	/* previous routing, for topk_ids == NULL; the one it replaced
	 * (old_*), until the call is accepted (kept_pending): a refused
	 * call's routing is not kept */
	int32_t *prev_ids, *old_ids;
	float *prev_w, *old_w;
	size_t prev_n, old_n;
	int have_prev, old_have, kept_pending;

	struct fep_ep_timing tm;
	int timing;          /* log the phase times (FABEP_LOG=debug) */

	/* scratch */
	int32_t *pack_tok;   /* [max_tokens * size]: token of each packed record */
	int32_t *pack_pos;   /* [max_tokens * kk]: record of (token, q) in its run */
	uint32_t *pack_base; /* [size + 1] */
	int32_t *dest;       /* [max_tokens * kk]: distinct ranks of a token */
	uint32_t *cursor;    /* [size] */
	size_t *posted;      /* [size]: chunks of each run posted this call */
	int32_t *run_first;  /* [size]: first token of a whole-range run, or -1 */
	int *place_ret;      /* [size]: each source's placement (dispatch_recv) */
	uint32_t *ecnt;      /* [size * L]: rows for each destination's experts */
	uint32_t *rcur, *rend; /* [size * L]: next and end row of (source, expert) */
	uint32_t *pbase;     /* [size + 1]: each source's first entry of psrc */
	uint32_t *blk_start, *blk_pre; /* [size * L + 2 * L + 1]: row blocks to gather */
	uint32_t *dup_start, *dup_pre; /* [place_rows + 1]: the rows a placed
					* dispatch's receiver copies (place) */
	/* combine's final sum, done per token by the own run once every
	 * peer's rows are in (fabep_moe_combine, which knows out): */
	size_t cfused;       /* tokens the own run summed: the pending
	                      * combine_recv sums only the rest */
	int32_t *own_tok;    /* [max_tokens]: source token of own row p */
	uint8_t *fused;      /* [max_tokens]: token t's row is in out */
	/* combine runs as rows: the row blocks of y for each source, by
	 * source then expert (a source's rows of one expert are one block) */
	uint32_t *xblk;      /* [2 * size * L]: start, rows */
	uint32_t *xnblk;     /* [size] */
	uint8_t *xunw;       /* [size]: FEP_EP_HDR_UNWEIGHTED of each run */
	/* placed dispatch (place_send): rows of all ranks per expert, and
	 * this rank's next row at each (destination, expert); the index in
	 * pputs of the next put to each (destination, expert); the puts of
	 * the placed rows */
	uint64_t *pcol, *pnext; /* [num_experts] */
	size_t *pput;        /* [num_experts] */
	uint32_t *drows;     /* [size]: rows to each rank this call (route) */
	uint8_t *pdest;      /* [size]: the run to d is worth placing (write_headers),
			      * and goes placed (place_send) */
	struct fep_put *pputs; /* [max_tokens * (k + kk) + size * (dchunks + 1)] */
};

/* 0, or -FABEP_ERR_PEER_LOST (logged) once a wait or a transfer of m
 * failed: the ranks' calls are no longer in step, so m is unusable. */
int fep_ep_usable(struct fabep_moe *m, const char *what);

/* ret of a transfer or a wait of m's: a failure leaves m unclean */
static inline int fep_ep_fab(struct fabep_moe *m, int ret)
{
	if (ret)
		m->unclean = 1;
	return ret;
}

static inline uint64_t fep_ep_dctr(const struct fabep_moe *m, int b)
{
	return m->ctrs + 8 * (uint64_t)b;
}
static inline uint64_t fep_ep_cctr(const struct fabep_moe *m, int b)
{
	return m->ctrs + 8 * (uint64_t)(m->sets + b);
}
static inline uint64_t fep_ep_hctr(const struct fabep_moe *m, int b)
{
	return m->ctrs + 8 * (uint64_t)(2 * m->sets + b);
}
/* Set b holds 2 * size dispatch slots: one per source (what arrives), the
 * staged runs to the other ranks, then the input slot (every token's
 * record, written once; fabep_moe_send_buffer hands out its payloads).
 * One index space of records spans a set, so received rows may point
 * into the input slot (this rank's own tokens are not copied again). */
static inline uint64_t fep_ep_dset_slots(const struct fabep_moe *m)
{
	return 2 * (uint64_t)m->size;
}
/* Dispatch slot of source s in set b. */
static inline uint64_t fep_ep_dslot(const struct fabep_moe *m, int b, int s)
{
	return m->drecv + ((uint64_t)b * fep_ep_dset_slots(m) + (uint64_t)s) *
			  m->dslot_bytes;
}
/* The header in dispatch slot of source s in set b. */
static inline uint64_t fep_ep_dhdr(const struct fabep_moe *m, int b, int s)
{
	return fep_ep_dslot(m, b, s) + m->dhoff;
}
/* Staging of the run to rank d (d != rank) in set b. */
static inline uint64_t fep_ep_dstage(const struct fabep_moe *m, int b, int d)
{
	return fep_ep_dslot(m, b, m->size + (d - m->rank - 1 + m->size) % m->size);
}
/* The input slot of set b. */
static inline uint64_t fep_ep_dinput(const struct fabep_moe *m, int b)
{
	return fep_ep_dslot(m, b, 2 * m->size - 1);
}
/* The placed region of set b. */
static inline uint64_t fep_ep_dplace(const struct fabep_moe *m, int b)
{
	return m->dplace + (uint64_t)b * m->place_rows * m->row_bytes;
}
static inline uint64_t fep_ep_cslot(const struct fabep_moe *m, int b, int d)
{
	return m->crecv + ((uint64_t)b * (uint64_t)m->size + (uint64_t)d) * m->cslot_bytes;
}
static inline uint64_t fep_ep_cstage(const struct fabep_moe *m, int d)
{
	int i = (d - m->rank - 1 + m->size) % m->size;
	return m->cstage + (uint64_t)i * m->cslot_bytes;
}
/* The header of combine slot (b, d) (m->choff into it). */
static inline uint64_t fep_ep_chdr(const struct fabep_moe *m, int b, int d)
{
	return fep_ep_cslot(m, b, d) + m->choff;
}

/* Drives the fabric while pool workers pack (fep_pool_for_idle); the
 * first error stays in err. */
struct fep_ep_idle {
	fep_fabric_t *fab;
	int err;
};
void fep_ep_idle(void *arg);
/* fn over [0, n) on the pool: on every thread, or (caller_idles) on the
 * workers while the caller drives the fabric (fep_pool_for_idle); with
 * several channels, caller_idles has every thread claim ranges and
 * progress its channel before each claim.  A run of n items of about
 * item_bytes each below FEP_POOL_SOLO_BYTES in all goes on the caller
 * alone, the fabric left to the phase's next wait.  Returns the pool's
 * or the fabric's first error. */
int fep_ep_pool_run(fep_pool_t *pool, size_t n, size_t item_bytes,
		    int caller_idles, fep_pool_range_fn fn, void *ctx,
		    struct fep_ep_idle *idle);
/* Post m->puts[0, np), counting their bytes into *bytes; sender: the
 * phase's copies are better made by the sender (fep_ep_copy), else by
 * the receivers (fep_fab_put_recv_many).  A post of the receivers'
 * copies does not drive the fabric: on shm that progress is where this
 * rank copies its peers' data in, with the workers idle between two pool
 * runs; the phase's next step (a pool run whose caller drives the
 * fabric, or the wait) overlaps that copy with the workers' own work
 * instead. */
int fep_ep_post(struct fabep_moe *m, size_t np, uint64_t *bytes, bool sender);
/* fep_fab_put_copy_many of puts[0, np), their bytes added to *total
 * (the phase's count), made in lanes on
 * the pool's threads (fep_fab_copy_lane) where fep_ep_lanes and the
 * batch has copies in two lanes or more, FEP_EP_LANE_BYTES or more of
 * them unless FABEP_MOE_LANES is always: one thread would make every
 * copy while the others wait. */
int fep_ep_copy(struct fabep_moe *m, const struct fep_put *puts, size_t np,
		uint64_t *total);
/* Whether fep_ep_copy may make a batch in lanes: FABEP_MOE_LANES is not
 * never, the fabric offers them and the pool has two threads or more. */
static inline int fep_ep_lanes(const struct fabep_moe *m)
{
	return m->lanes_mode >= 0 && fep_fab_copy_lanes(m->comm->fab) > 1 &&
	       fep_pool_threads(m->comm->pool) > 1;
}

/* layout.c */
int fep_ep_set_reserve(struct fabep_moe *m, struct fep_ep_set *s, size_t rows);
/* Check the headers of set b's slots (base: first slot, stride between
 * slots) after the wait: sequence, magic, count bounds.  `expect`: per
 * source the exact count required, or NULL (<= max_tokens); counts
 * (may be NULL) gets each accepted count.  `signals`: NULL for combine
 * headers; for dispatch headers, each peer's record signals (0 or
 * dchunks - 1) are checked too and added to *signals, whatever else is
 * refused (dchunks - 1 for a header that is not this call's or not
 * valid).  Returns 0, the agreed error of the lowest failing rank (local
 * status included; then *refused = 1, a rank refused its input), or
 * -FABEP_ERR_PROTOCOL. */
int fep_ep_check_hdrs(struct fabep_moe *m, const char *what, uint64_t base,
		      size_t stride, uint64_t seq, const uint32_t *expect,
		      int local_status, uint32_t *counts, uint64_t *signals,
		      int *refused);
/* After a call that every rank refused alike: return once every rank
 * has read that call's headers, so that a peer's next call cannot write
 * over them (a barrier; its failure leaves m unclean).  Owed by a refused
 * call (m->settle) and made by the next send half, dispatch or combine,
 * before it writes anything: every rank gets there only after its
 * receive half of the refused call, so the refusing rank's send half
 * waits for nothing past the peers' send halves. */
int fep_ep_settle(struct fabep_moe *m, const char *what);
/* The settle a refused call owes, if any (fep_ep_settle). */
int fep_ep_settle_owed(struct fabep_moe *m, const char *what);
/* Wait for the counter of a phase, naming missing peers on timeout. */
int fep_ep_wait(struct fabep_moe *m, const char *what, uint64_t ctr,
		uint64_t target, uint64_t slots, size_t stride, uint64_t seq);
/* The same, with work(work_ctx) on the caller meanwhile (fep_comm_wait_with). */
int fep_ep_wait_with(struct fabep_moe *m, const char *what, uint64_t ctr,
		     uint64_t target, uint64_t slots, size_t stride, uint64_t seq,
		     int (*work)(void *), void *work_ctx);
void fep_ep_hdr_write(void *p, uint64_t seq, int status, uint32_t count);
/* A run to one peer, as fep_ep_ready_chunks posts it: chunk 0 is the
 * header (hlen bytes at hoff, signalled on hsig), chunk j >= 1 the units
 * [(j - 1) * per, j * per) of the run (empty past its end: a signal
 * only) on sig. */
struct fep_ep_run {
	int peer;
	uint64_t dst;          /* the receiver's slot for this rank */
	uint64_t stage;        /* this rank's staged run */
	size_t unit, hdr;      /* bytes per record (row); units of the header */
	size_t count, done;    /* units in the run; units written so far */
	size_t per, chunks;
	uint64_t sig;
	size_t hlen;           /* header bytes (hlast 0; with hlast the
				* header is hdr units) */
	size_t hoff;           /* where in its hdr units the header starts;
				* its write begins there */
	uint64_t hsig;
	/* 0: the header leaves first (chunk 0), then the chunks in order,
	 * empty ones included; done counts the units complete from the
	 * run's start.  1: the run is produced back to front (done counts
	 * the units complete at its end) and the header leaves last, in one
	 * write with the first chunk's units (contiguous in stage), once the
	 * run is complete, so that a header seen means every chunk of the
	 * sender was posted (a timeout's header check names a sender that did
	 * not finish); the other chunks leave as they complete, the last one
	 * first, and the header's write adds the signals of the chunks that
	 * had no units.  Unchunked (2 chunks), the run is one write adding 2.
	 * Needs sig == hsig, no direct chunks. */
	int hlast;
	/* hlast 0 only: the header's signal stands for the data chunks
	 * (dispatch's merged batch, chunks 0 in its header), whose puts add
	 * nothing */
	int merge;
	/* merge only: the header and the units (at most per, in chunk 1)
	 * leave together once all are done, the header's signal on the
	 * last piece, so that the fabric posts them as one write
	 * (fep_fab_joins: remote CQ data, where a signal stands only for its
	 * own write); the header reaches to the units (hlen ignored) */
	int join;
	const uint8_t *direct; /* [chunks]: chunk leaves from input; or NULL */
	const int32_t *tok;    /* run position -> input record (direct chunks) */
	uint64_t input;        /* the input slot */
};
/* The end of the range of consecutive input records that starts at run
 * position r0 of tok (run position -> input record), at most r1.  A
 * chunk that leaves from the input slot is one put per range: route()
 * decides by their number, fep_ep_ready_chunks posts them. */
static inline size_t fep_ep_range_end(const int32_t *tok, size_t r0, size_t r1)
{
	size_t b = r0 + 1;

	while (b < r1 && tok[b] == tok[b - 1] + 1)
		b++;
	return b;
}
/* Append to out the chunks of r that are complete and not yet posted
 * (*posted of them are); each adds 1 to its counter (a data chunk under
 * r->merge adds 0).  Returns how many. */
size_t fep_ep_ready_chunks(struct fep_put *out, const struct fep_ep_run *r,
			   size_t *posted);

#endif
