/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * allreduce.c - allreduce, and allreduce + RMSNorm (+ FP8), over the
 * symmetric heap (DESIGN.md, mechanism 8).
 *
 * Heap objects of a handle (one block, carved at creation; every rank
 * makes the same allocation, so offsets agree):
 *
 *   ctr1[2]   phase-1 counters, one per call parity; every source adds 1
 *   ctr_ag    allgather counter; every owner adds 1
 *   slots1[2] phase-1 slots by call parity: one per source rank, each a
 *             header (struct fep_ar_hdr, seq first) + data
 *   stage     what this rank writes in phase 1: block 0 (one-stage) or
 *             one block per destination (two-stage), header + rows (the
 *             header alone where phase 1 is direct, below)
 *   ag        allgather blocks, one per owner rank: header + the owner's
 *             results (FP8 rows, scales, new residual rows, or dtype rows)
 *
 * Calls below the threshold from FEP_AR_RD_RANKS ranks take the
 * log-step path instead, and above it, up to the halving limit, that
 * path's halving mode, with heap objects of its own (rdctr, rdslots,
 * rdstage; fep_ar_rd, below).
 *
 * One call:
 *   1. Phase 1 (every call, every rank to every other rank, even with an
 *      error or no rows): one-stage: the header and the whole input into
 *      slot[me] of every peer; two-stage: the header and the rows peer o
 *      owns (rows [o*q, o*q + n_o), q = ceil(rows / ranks)) into slot[me]
 *      of peer o.  Each write is followed by +1 on ctr1[parity] there
 *      (fep_fab_put_signal_many: one round trip for all destinations).
 *      Direct (fep_ar_direct_ok: the provider reads unregistered memory
 *      and signals after the writes): the rows go from the caller's
 *      input, gathered behind the staged header, so they are not first
 *      copied to the staging; the call waits for these writes before it
 *      returns, as the caller may then change its input.
 *   2. Wait for ctr1[parity] to grow by ranks - 1, then read every
 *      header: an error flag or differing rows / cols / op on any rank
 *      gives every rank the same verdict (below) before any output is
 *      touched.
 *   3. One-stage: sum all rows in rank order (the own input read from the
 *      caller's buffer, the others' from the slots), normalize and
 *      quantize them: done.  Two-stage: the same on the owned rows only,
 *      into the own allgather block, which is then written (header +
 *      results) into the same block of every peer with +1 on ctr_ag;
 *      wait for ranks - 1, then copy every block into the outputs.
 *      By reads (h->rd: the provider reads into unregistered memory
 *      without the owner's progress, fep_fab_reads_alone, since an
 *      owner may have returned and be computing; at most
 *      FEP_AR_READ_THREADS threads on every rank, agreed at creation;
 *      an output in the dtype,
 *      not FP8; fep_ar_read_blocks): only the header is written, and
 *      each rank reads every owner's results from the owner's own block
 *      straight into its outputs, one copy instead of a write and a
 *      copy.  With more threads the pool's parallel copy is faster than
 *      one thread's reads; the FP8 output's blocks are small, and its
 *      scales would be a second read per owner.
 *
 * Back-to-back safety.  Call N uses slots1[N & 1].  Rank A's phase-1
 * write for call N + 2 into B's slots1[N & 1] happens after A's phase-1
 * wait of call N + 1 completed, which needs B's phase-1 signal of call
 * N + 1; B posts that only after it returned from call N, i.e. after it
 * read everything in slots1[N & 1] for call N.  So no slot is written
 * while its reader may still read it.  The same argument keeps the
 * counters unambiguous: a signal for call N + 2 on ctr1[N & 1] cannot
 * arrive before B's wait of call N is over, so "ctr1[p] reached its
 * target" means exactly "every source's data for this call is there"
 * (one shared counter for both parities would not: with 3+ ranks an
 * early signal of call N + 1 from A could stand in for a late one of
 * call N from C).  The allgather blocks need only one copy: A writes
 * its block of call N + 1 into B after A's phase-1 wait of call N + 1,
 * i.e. after B finished call N (including its reads of the blocks), and
 * for the same reason ctr_ag never sees a signal of a later call early;
 * with reads, A rewrites its own block for call N + 1 after that same
 * wait, i.e. after every peer finished call N, whose reads of it
 * completed before the peer returned.
 * The argument needs every rank to signal every other rank in phase 1 of
 * every call, which is why phase 1 always goes to all peers.  The own
 * staging is reused only after fep_fabric_reap_writes (start of each
 * call).
 *
 * Error agreement.  Every rank sees the same set of headers (its own
 * included) after phase 1, so every rank computes the same verdict:
 * the status of the lowest rank that flagged an error, else
 * -FABEP_ERR_MISMATCH when rows, cols or the operation differ.  The
 * phase-1 writes of a rank are bounded by the handle's capacity whatever
 * path it picked, so ranks that disagree on the path (mismatched rows)
 * still complete phase 1 and agree.  A timeout or fabric error leaves
 * the counters out of step: the handle is then marked broken.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

#define FEP_AR_HDR ((size_t)sizeof(struct fep_ar_hdr))
#define A64(x) FEP_ALIGN_UP((x), (size_t)64)
/* The allgather reads (h->rd) where the pool has at most this many
 * threads: one thread's reads skip a copy, and beat a parallel copy by
 * two threads but not by more (fp32 7168 columns, 16 and 1024 rows,
 * at 2, 8 and 16 ranks of one 16-core host; docs/performance.md). */
#define FEP_AR_READ_THREADS 2
/* Rows of a sum + norm chunk: about this many bytes, so the summed chunk
 * is still in cache when the norm reads it. */
#define FEP_AR_CHUNK_BYTES ((size_t)64 << 10)

_Static_assert(sizeof(struct fep_ar_hdr) == 64, "header is one cache line");

/*
 * The threshold below which a call does not take the two-stage path,
 * FEP_AR_ONESTAGE_DEFAULT (32 KiB of input per rank).  The one-stage path
 * (2 or 3 ranks): below it one round trip beats the two-stage path's
 * two, although the one-stage path sums (and normalizes) every row on
 * every rank and, from 3 ranks, moves more bytes; on 2 shm ranks the
 * fused norm's crossover lies between 4 and 8 rows of 7168 bf16 values
 * with one thread a rank and between 16 and 64 with eight.  A plain sum
 * on 2 ranks, where both paths move the same bytes and the one-stage
 * path saves a round trip and the allgather's copy, gains on shm at
 * every size measured (to 7 MiB of fp32, most below 1 MiB) and on tcp
 * up to about 1 MiB, level at 1.8 MiB and losing at 3.5 MiB; so it has
 * a threshold of its own there, FEP_AR_ONESTAGE_SUM2_DEFAULT (1 MiB: 36
 * rows of 7168 fp32 values, a decode step's), whose slots, holding the
 * whole input of a call up to it, add at most twice that to the heap
 * (fabep_bench -o arnorm and -o allreduce with the path forced each
 * way, docs/performance.md).  The
 * log-step path (from FEP_AR_RD_RANKS ranks) moves fp32, twice a bf16
 * input's bytes, where the two-stage path moves the dtype (and FP8
 * results, a byte a value): at 4, 8 and 16 shm ranks of the lent
 * 16-core Xeon it beat the two-stage path up to 4 rows of 7168 fp32
 * values (112 KiB) and lost from 8; but against the two-stage path (4
 * ranks) and the halving mode above it (8 ranks and more, fp32 sums),
 * the plain sum of 4 rows was level or slower on it, and the norm of 4
 * rows (fp32 to FP8) slower by a tenth to a third; at 3 rows (84 KiB)
 * it was ahead for the sum at 4 ranks, behind for the norm, level
 * elsewhere.  So from FEP_AR_RD_WIDE ranks fp32 input takes
 * FEP_AR_RD_DEFAULT_F32 (96 KiB), one threshold for both operations:
 * the log-step path has slots of its own, and ranks that call different
 * operations with the same rows below it then take the same path, where
 * each sees the mismatch and the handle stays usable (the halving
 * limits differ by operation: fep_ar_begin); bf16 input keeps 32 KiB
 * there: its rounds move fp32, so 2 bf16 rows cost what 2 fp32 rows do.
 * Below FEP_AR_RD_WIDE ranks the rounds are two (and, at 5 to 7 ranks,
 * the fold's round trip besides) while the two-stage path's writes are
 * few: at 4 to 6 ranks the log-step path gained or held level up to one
 * row of 7168 fp32 or bf16 values, and from two rows lost by up to half
 * its time (the norm of 3 fp32 rows at 5 ranks: 124 against 54 us; of 2
 * bf16 rows at 4 ranks 53-68 against 41-44), so there it takes
 * FEP_AR_RD_SMALL_SUMS of fp32 sums
 * (fabep_bench -o scale, -o allreduce / arnorm -f bf16,
 * docs/performance.md).  FABEP_AR_ONESTAGE_MAX, where set, is every
 * threshold.
 */
int fep_ar_onestage_env(size_t esize, int nranks, size_t *os_max,
			size_t *os_sum)
{
	size_t v = nranks < FEP_AR_RD_RANKS ? FEP_AR_ONESTAGE_DEFAULT :
		   nranks < FEP_AR_RD_WIDE ? FEP_AR_RD_SMALL_SUMS / 4 * esize :
		   esize == 4 ? FEP_AR_RD_DEFAULT_F32 : FEP_AR_ONESTAGE_DEFAULT;
	int ret = fep_env_size("FABEP_AR_ONESTAGE_MAX", 0, (size_t)1 << 40, &v);

	if (ret < 0)
		return ret;
	*os_max = v;
	*os_sum = !ret && nranks == 2 ? FEP_AR_ONESTAGE_SUM2_DEFAULT : v;
	return 0;
}

/* Whether phase 1 may write straight from the caller's input: the
 * provider reads unregistered memory, and each put's signal follows all
 * of its writes (not so under cqdata, where a write carries it, nor for
 * cma's large puts in slices, fab->cma_slices, whose receivers copy: from
 * the staging, on the heap's huge pages, they take less time than from
 * the caller's pages; 4 ranks, 128 rows of 7168 fp32, 20-25 %). */
static bool fep_ar_direct_ok(const fep_fabric_t *fab)
{
	return fep_fab_ptr_ok(fab) && fab->signal != FABEP_SIGNAL_CQDATA &&
	       !fab->cma_slices;
}

static int mul_ok(size_t a, size_t b, size_t *out)
{
	return !__builtin_mul_overflow(a, b, out);
}

/* Bytes of an allgather block's data for q rows of c cols. */
static size_t ag_bytes(int op, bool res, size_t q, size_t c, size_t esize)
{
	size_t rows = A64(q * c * esize);

	switch (op) {
	case FEP_AR_SUM:
		return rows;
	case FEP_AR_NORM:
		return rows + (res ? rows : 0);
	default:
		return A64(q * c) + A64(q * 4) + (res ? rows : 0);
	}
}

/*
 * The halving mode's limits, in input bytes per rank.  It moves half the
 * sums (fp32) a round where the doubling mode moves them all, in twice
 * the rounds, and every rank still normalizes every row; the two-stage
 * path writes each rank's share (in the dtype) to its owner and back,
 * ranks - 1 writes and as many reads or copies a rank, each owner
 * normalizing its rows.  On shm ranks of the lent 32-core Xeon (rows of
 * 7168; fabep_bench -o scale and -o allreduce / arnorm -f bf16,
 * docs/performance.md) the plain sum's halving was 1.2 times faster at
 * 16 ranks and 1.8 at 32 for 8 fp32 rows (224 KiB of sums), 1.2 at 32
 * ranks for 16 (448 KiB), level or slower beyond; of bf16 rows, whose
 * two-stage path moves half the bytes, 1.1 times faster at 16 ranks for
 * 4 rows (112 KiB of sums) and slower for 8, 1.7 and 1.3 at 32 ranks for
 * 4 and 8, level for 16; with the norm (FP8 out), 1.3 times faster at
 * 32 ranks for 8 fp32 rows and level at 16 ranks, 1.1-1.5 for 4 and 8
 * bf16 rows at 16 and 32 ranks.  Hence, per rank and times the ranks,
 * FEP_AR_HALVING_F32_SUM bytes of fp32 sums for the plain sum of fp32 input,
 * FEP_AR_HALVING_OTHER for that of bf16 input and for the normalizing
 * calls; FABEP_AR_HALVING_MAX, where set, is every limit.
 */
int fep_ar_halving_env(size_t esize, int nranks, size_t *hv_max,
		       size_t *hv_sum)
{
	size_t p = nranks > 0 ? (size_t)nranks : 1, v = 0;
	int ret = fep_env_size("FABEP_AR_HALVING_MAX", 0, (size_t)1 << 40, &v);

	if (ret < 0)
		return ret;
	*hv_max = ret ? v : FEP_AR_HALVING_OTHER * p / 4 * esize;
	*hv_sum = ret ? v : (esize == 4 ? FEP_AR_HALVING_F32_SUM : FEP_AR_HALVING_OTHER) *
			    p / 4 * esize;
	return 0;
}

/* The log-step slots of one parity: rounds k < rd_m take a doubling
 * message (the sums of a call up to os_cap) or a halving one (of a call
 * up to hv_cap, round k carries at most ceil(n / 2^(k + 1)) sums);
 * rounds rd_m and rd_m + 1, the fold and its answer, the whole sums,
 * where the ranks are not a power of two; the halving mode's allgather
 * rounds rd_m + 2 + k only a header (their sums go into the staging). */
static void fep_ar_rd_layout(struct fep_ar_layout *l, size_t esize, size_t p)
{
	size_t m = (size_t)l->rd_m, dcap = A64(l->os_cap / esize * 4);
	size_t hvn = l->hv_cap / esize, off = 0, k, d;

	l->rd_n = 2 * l->rd_m + 2;
	for (k = 0; k < (size_t)l->rd_n; k++) {
		if (k < m)
			d = FEP_MAX(dcap, A64(((hvn + ((size_t)2 << k) - 1) >> (k + 1)) * 4));
		else if (k < m + 2)
			d = p > ((size_t)1 << m) ? FEP_MAX(dcap, A64(hvn * 4)) : 0;
		else
			d = 0;
		l->rdoff[k] = off;
		off += FEP_AR_HDR + d;
	}
	l->rdpar = off;
	l->blkrd = FEP_AR_HDR + FEP_MAX(dcap, A64(hvn * 4));
}

int fep_ar_layout(size_t max_rows, size_t max_cols, size_t esize, int nranks,
		  size_t os_max, size_t os_sum, size_t hv_max, size_t hv_sum,
		  struct fep_ar_layout *l)
{
	size_t rb, all, d1, ag1, ag2, p = (size_t)nranks, t;

	memset(l, 0, sizeof(*l));
	if (!max_rows || !max_cols || nranks < 1)
		return -EINVAL;
	/* Bound everything well below overflow: every product below is then
	 * safe (rows x cols x 8 x ranks x 4 < 2^63). */
	if (!mul_ok(max_cols, esize, &rb) || !mul_ok(max_rows, rb, &all) ||
	    all > ((size_t)1 << 40) || p > 65536)
		return -EOVERFLOW;
	l->esize = esize;
	l->qmax = (max_rows + p - 1) / p;
	l->two_stage = all > FEP_MIN(os_max, os_sum);
	l->os_cap = FEP_MIN(all, FEP_MAX(os_max, os_sum));
	if (p >= FEP_AR_RD_RANKS && l->os_cap) {
		while (((size_t)2 << l->rd_m) <= p)
			l->rd_m++;
		t = FEP_MIN(all, FEP_MAX(hv_max, hv_sum));
		l->hv_cap = t > l->os_cap ? t : 0;
		fep_ar_rd_layout(l, esize, p);
	}
	/* with the log-step path, phase 1 carries two-stage rows only */
	d1 = l->rd_m ? 0 : l->os_cap;
	if (l->two_stage)
		d1 = FEP_MAX(d1, l->qmax * rb);
	l->blk1 = FEP_AR_HDR + A64(d1);
	l->blkst = FEP_AR_HDR + A64(l->qmax * rb);
	if (l->two_stage) {
		ag1 = ag_bytes(FEP_AR_NORM, true, l->qmax, max_cols, esize);
		ag2 = ag_bytes(FEP_AR_NORM_FP8, true, l->qmax, max_cols, esize);
		l->blkag = FEP_AR_HDR + FEP_MAX(ag1, ag2);
	}
	/* every counter before the slots: a block taken back is zeroed up
	 * to o_slots (fep_comm_block), which a new handle's counts need */
	l->o_ctr = 0;
	l->o_rdctr = 24;
	l->o_slots = A64(l->o_rdctr + (l->rd_m ? 2 * (size_t)l->rd_n * 8 : 0));
	l->o_stage = l->o_slots + 2 * p * l->blk1;
	t = FEP_AR_HDR + A64(l->rd_m ? 0 : l->os_cap);
	if (l->two_stage)
		t = FEP_MAX(t, p * l->blkst);
	l->o_ag = l->o_stage + t;
	l->total = l->o_ag + p * l->blkag;
	if (l->rd_m) {
		l->o_rdslots = A64(l->total);
		l->o_rdstage = l->o_rdslots + 2 * l->rdpar;
		l->total = l->o_rdstage + l->blkrd;
	}
	return 0;
}

static int fep_ar_esize(fabep_ar_dtype_t dtype, fep_k_dtype_t *dt, size_t *es)
{
	switch (dtype) {
	case FABEP_AR_F32:
		*dt = FEP_K_F32;
		*es = 4;
		return 0;
	case FABEP_AR_BF16:
		*dt = FEP_K_BF16;
		*es = 2;
		return 0;
	default:
		return -EINVAL;
	}
}

FEP_EXPORT size_t fabep_allreduce_heap_bytes(size_t max_rows, size_t cols,
					     fabep_ar_dtype_t dtype, int nranks)
{
	struct fep_ar_layout l;
	fep_k_dtype_t dt;
	size_t es, os_max, os_sum, hv_max, hv_sum;

	if (fep_ar_esize(dtype, &dt, &es) ||
	    fep_ar_onestage_env(es, nranks, &os_max, &os_sum) ||
	    fep_ar_halving_env(es, nranks, &hv_max, &hv_sum) ||
	    fep_ar_layout(max_rows, cols, es, nranks, os_max, os_sum, hv_max,
			  hv_sum, &l))
		return 0;
	return l.total + 64; /* alignment of the block */
}

/* ---- creation ---- */

/* What every rank must agree on at creation. */
struct fep_ar_hello {
	uint64_t max_rows;
	uint64_t max_cols;
	uint64_t os_max;
	uint64_t os_sum;
	uint64_t hv_max;
	uint64_t hv_sum;
	int32_t dtype;
	int32_t status;
	int32_t reads;        /* this rank would take the reads (h->rd) */
	int32_t pad;
	struct fep_hb_hello hb;
};

/* A handle's host memory; h may be NULL or partly made. */
static void ar_free(fabep_allreduce_t *h)
{
	if (!h)
		return;
	free(h->gamma32);
	free(h->ins);
	free(h->rbase);
	free(h->puts);
	free(h->scratch);
	free(h);
}

/* fabep_comm_destroy's call for a handle still alive */
static void ar_destroy_link(struct fep_comm_handle *l)
{
	fabep_allreduce_destroy((fabep_allreduce_t *)((char *)l -
					offsetof(fabep_allreduce_t, link)));
}

FEP_EXPORT int fabep_allreduce_create(fabep_comm_t *comm, size_t max_rows,
				      size_t max_cols, fabep_ar_dtype_t dtype,
				      fabep_allreduce_t **out)
{
	struct fep_ar_hello me, *all = NULL;
	struct fep_hb_hello hb;
	struct fabep_allreduce *h = NULL;
	fep_fabric_t *fab;
	size_t es = 0, os_max = 0, os_sum = 0, hv_max = 0, hv_sum = 0;
	fep_k_dtype_t dt = FEP_K_F32;
	int r, ret, status = 0, first = -1;

	if (!comm) {
		fep_err("fabep_allreduce_create: NULL communicator");
		return -EINVAL;
	}
	/* a failed communicator's peers cannot take part: refused at once */
	ret = fep_comm_usable(comm, "fabep_allreduce_create");
	if (ret)
		return ret;
	fab = comm->fab;
	h = calloc(1, sizeof(*h));
	if (!h) {
		fep_err("fabep_allreduce_create: out of memory");
		status = -ENOMEM;
	}
	if (!status && !out) {
		fep_err("fabep_allreduce_create: NULL output pointer");
		status = -EINVAL;
	}
	if (!status && fep_ar_esize(dtype, &dt, &es)) {
		fep_err("fabep_allreduce_create: dtype %d is not FABEP_AR_F32 "
			"or FABEP_AR_BF16", (int)dtype);
		status = -EINVAL;
	}
	if (!status)
		status = fep_ar_onestage_env(es, comm->size, &os_max, &os_sum);
	if (!status)
		status = fep_ar_halving_env(es, comm->size, &hv_max, &hv_sum);
	if (!status) {
		ret = fep_ar_layout(max_rows, max_cols, es, comm->size, os_max,
				    os_sum, hv_max, hv_sum, &h->lay);
		if (ret) {
			fep_err("fabep_allreduce_create: shape %zu x %zu %s",
				max_rows, max_cols, ret == -EINVAL ?
				"has a zero dimension" : "is too large");
			status = ret;
		}
	}

	if (!status) {
		h->nthreads = fep_pool_threads(comm->pool);
		h->scratch_bytes = A64(FEP_MAX(FEP_AR_CHUNK_BYTES, max_cols * es));
		h->gamma32 = malloc(max_cols * sizeof(float));
		h->ins = calloc((size_t)h->nthreads * (size_t)comm->size,
				sizeof(void *));
		h->rbase = calloc((size_t)comm->size, sizeof(void *));
		h->puts = calloc(2 * (size_t)comm->size, sizeof(*h->puts));
		h->scratch = aligned_alloc(64, (size_t)h->nthreads * h->scratch_bytes);
		if (!h->gamma32 || !h->ins || !h->rbase || !h->puts || !h->scratch) {
			fep_err("fabep_allreduce_create: out of memory");
			status = -ENOMEM;
		}
	}

	/* Agree on the arguments before the heap block is taken, so the
	 * heaps stay in step whatever happens. */
	memset(&me, 0, sizeof(me));
	me.max_rows = max_rows;
	me.max_cols = max_cols;
	me.os_max = os_max;
	me.os_sum = os_sum;
	me.hv_max = hv_max;
	me.hv_sum = hv_sum;
	fep_hb_hello(fab, &me.hb);
	me.dtype = (int32_t)dtype;
	me.status = status;
	me.reads = fep_fab_reads_alone(fab) && h &&
		   h->nthreads <= FEP_AR_READ_THREADS;
	all = calloc((size_t)comm->size, sizeof(*all));
	if (!all) {
		fep_err("fabep_allreduce_create: out of memory for the exchange: "
			"the other ranks' creation fails at its timeout");
		ret = -ENOMEM;
		goto err;
	}
	ret = fep_comm_allgather(comm, &me, all, sizeof(me));
	if (ret) {
		fep_err("fabep_allreduce_create: exchange: %s", fabep_strerror(ret));
		goto err;
	}
	for (r = 0; r < comm->size; r++)
		if (all[r].status) {
			first = r;
			break;
		}
	if (first >= 0) {
		ret = all[first].status;
		if (first != comm->rank)
			fep_err("fabep_allreduce_create: rank %d failed: %s", first,
				fabep_strerror(ret));
		goto err;
	}
	for (r = 0; r < comm->size; r++)
		if (all[r].max_rows != me.max_rows || all[r].max_cols != me.max_cols ||
		    all[r].dtype != me.dtype || all[r].os_max != me.os_max ||
		    all[r].os_sum != me.os_sum || all[r].hv_max != me.hv_max ||
		    all[r].hv_sum != me.hv_sum) {
			fep_err("fabep_allreduce_create: arguments differ between "
				"ranks: rank %d has %llu x %llu dtype %d thresholds "
				"%llu / %llu / %llu / %llu, rank %d has %llu x %llu "
				"dtype %d thresholds %llu / %llu / %llu / %llu "
				"(FABEP_AR_ONESTAGE_MAX and FABEP_AR_HALVING_MAX must "
				"be the same on every rank)",
				comm->rank, (unsigned long long)me.max_rows,
				(unsigned long long)me.max_cols, me.dtype,
				(unsigned long long)me.os_max,
				(unsigned long long)me.os_sum,
				(unsigned long long)me.hv_max,
				(unsigned long long)me.hv_sum, r,
				(unsigned long long)all[r].max_rows,
				(unsigned long long)all[r].max_cols, all[r].dtype,
				(unsigned long long)all[r].os_max,
				(unsigned long long)all[r].os_sum,
				(unsigned long long)all[r].hv_max,
				(unsigned long long)all[r].hv_sum);
			ret = -FABEP_ERR_MISMATCH;
			goto err;
		}
	ret = fep_hb_agree("fabep_allreduce_create", comm->size,
			   &all[0].hb, sizeof(*all), &hb);
	if (ret)
		goto err;

	/* Every heap is in the same state: the same verdict everywhere. */
	ret = fep_comm_block(comm, &hb, h->lay.total, h->lay.o_slots, &h->base,
			     &h->ctrs);
	if (ret == -FABEP_ERR_HEAP_FULL)
		fep_err("fabep_allreduce_create: a %zu x %zu %s handle on %d ranks "
			"needs %zu heap bytes, %zu of %zu are in use and no block "
			"given back on every rank fits (fabep_allreduce_heap_bytes; "
			"raise FABEP_HEAP_SIZE or attr.heap_size)", max_rows,
			max_cols, dt == FEP_K_BF16 ? "bf16" : "fp32", comm->size,
			h->lay.total, fab->heap_used, fab->heap_size);
	if (ret)
		goto err;

	h->comm = comm;
	h->dt = dt;
	h->max_rows = max_rows;
	h->max_cols = max_cols;
	h->os_max = os_max;
	h->os_sum = os_sum;
	h->hv_max = FEP_MIN(hv_max, h->lay.hv_cap);
	h->hv_sum = FEP_MIN(hv_sum, h->lay.hv_cap);
	h->ctr1[0] = h->ctrs + h->lay.o_ctr;
	h->ctr1[1] = h->ctr1[0] + 8;
	h->ctr_ag = h->ctr1[0] + 16;
	h->slots1[0] = h->base + h->lay.o_slots;
	h->slots1[1] = h->slots1[0] + (uint64_t)comm->size * h->lay.blk1;
	h->stage = h->base + h->lay.o_stage;
	h->ag = h->base + h->lay.o_ag;
	if (h->lay.rd_m) {
		h->rdctr = h->ctrs + h->lay.o_rdctr;
		h->rdslots = h->base + h->lay.o_rdslots;
		h->rdstage = h->base + h->lay.o_rdstage;
	}
	h->direct = fep_ar_direct_ok(fab);
	/* every rank reads or every rank writes its results: the thread
	 * counts, and so the choice, may differ between ranks */
	h->rd = true;
	for (r = 0; r < comm->size; r++)
		h->rd = h->rd && all[r].reads;
	free(all);
	fep_dbg("allreduce handle %zu x %zu %s: thresholds %zu (RMSNorm) and "
		"%zu (sum) bytes, %s, heap %zu bytes", max_rows, max_cols,
		fep_k_dtype_name(dt), os_max, os_sum,
		h->lay.rd_m ? (h->lay.two_stage ? "log-step and two-stage" :
			       "log-step only") :
			      (h->lay.two_stage ? "one- and two-stage" :
			       "one-stage only"),
		h->lay.total);
	fep_comm_handle_add(comm, &h->link, ar_destroy_link);
	*out = h;
	return 0;

err:
	ar_free(h);
	free(all);
	return ret;
}

FEP_EXPORT int fabep_allreduce_destroy(fabep_allreduce_t *h)
{
	int ret;

	if (!h)
		return 0;
	/* a child of a fork after its communicator was made leaves it be */
	ret = fep_comm_forked(h->comm, "fabep_allreduce_destroy");
	if (ret)
		return ret;
	fep_comm_handle_del(&h->link);
	/* the block is free for a later handle unless a call failed (a peer's
	 * write may still land in it) */
	fep_comm_block_free(h->comm, h->base, h->ctrs, !h->broken);
	ar_free(h);
	return 0;
}

FEP_EXPORT size_t fabep_allreduce_onestage_max(const fabep_allreduce_t *h)
{
	return h ? h->os_max : 0;
}

FEP_EXPORT size_t fabep_allreduce_sum_onestage_max(const fabep_allreduce_t *h)
{
	return h ? h->os_sum : 0;
}

/* ---- local work ---- */

/* Sum (then normalize) `rows` rows: in[k] + r * rb is row r of rank k. */
struct fep_ar_job {
	struct fabep_allreduce *h;
	int op;
	int n;                    /* ranks */
	const void *const *in;    /* n row-0 pointers */
	const float *sum32;       /* or: the rows' sums, fp32 (log-step) */
	size_t rows, cols;
	void *out;                /* dtype rows, or FP8 rows */
	float *scales;            /* FP8 */
	const void *res_src;      /* residual rows to start from */
	void *res;                /* updated residual rows (may be res_src) */
	const float *gamma;
	const fabep_rmsnorm_params_t *p;
	size_t next;              /* atomic: the first row not yet claimed */
};

/* Rows [r0, r1) of the job on thread tid (its scratch, its input list),
 * in pieces of what the scratch holds. */
static void fep_ar_job_rows(const struct fep_ar_job *j, int tid, size_t r0,
			    size_t r1)
{
	struct fabep_allreduce *h = j->h;
	const struct fep_k_ops *ops = fep_k_ops();
	size_t es = h->lay.esize, rb = j->cols * es, r, n, ch;
	const void **in = h->ins + (size_t)tid * (size_t)j->n;
	uint8_t *scratch = h->scratch + (size_t)tid * h->scratch_bytes, *dst;
	fep_k_sum_args_t sa;
	fep_k_rmsnorm_args_t na;
	int k;

	ch = FEP_MAX((size_t)1, h->scratch_bytes / rb);
	for (r = r0; r < r1; r += n) {
		n = FEP_MIN(ch, r1 - r);
		/* the sums, rounded to the dtype once: into out (a plain
		 * sum) or the scratch the norm reads */
		dst = j->op == FEP_AR_SUM ? (uint8_t *)j->out + r * rb : scratch;
		if (j->sum32) {
			const float *s32 = j->sum32 + r * j->cols;

			if (h->dt == FEP_K_F32)
				memcpy(dst, s32, n * rb);
			else
				ops->f32_to_bf16(s32, (uint16_t *)dst, 0, n * j->cols);
		} else {
			for (k = 0; k < j->n; k++)
				in[k] = (const uint8_t *)j->in[k] + r * rb;
			memset(&sa, 0, sizeof(sa));
			sa.in = in;
			sa.n = j->n;
			sa.dt = h->dt;
			sa.out = dst;
			ops->sum(&sa, 0, n * j->cols);
		}
		if (j->op == FEP_AR_SUM)
			continue;
		memset(&na, 0, sizeof(na));
		na.in = scratch;
		na.in_dt = h->dt;
		na.ld_in = j->cols;
		if (j->res) {
			na.residual = (uint8_t *)j->res + r * rb;
			na.ld_res = j->cols;
			if (j->res_src != j->res)
				memcpy(na.residual, (const uint8_t *)j->res_src + r * rb,
				       n * rb);
		}
		na.gamma = j->gamma;
		na.eps = j->p->eps;
		na.weight_offset = j->p->weight_offset;
		na.ld_out = j->cols;
		na.cols = j->cols;
		if (j->op == FEP_AR_NORM_FP8) {
			na.out = (uint8_t *)j->out + r * j->cols;
			na.out_dt = FEP_K_FP8;
			na.scales = j->scales + r;
			na.ld_scales = 1;
			na.scale_ub = j->p->scale_ub;
		} else {
			na.out = (uint8_t *)j->out + r * rb;
			na.out_dt = h->dt;
		}
		ops->rmsnorm(&na, 0, n);
	}
}

/* Every thread that comes claims ranges of rows, so a worker that wakes
 * late holds nobody up (a row's result does not depend on which thread
 * computes it). */
static void fep_ar_job_run(void *ctx, int tid, int nthreads)
{
	struct fep_ar_job *j = ctx;
	size_t r0, step = FEP_MAX((size_t)1, j->rows / (4 * (size_t)nthreads));

	while ((r0 = __atomic_fetch_add(&j->next, step, __ATOMIC_RELAXED)) < j->rows)
		fep_ar_job_rows(j, tid, r0, FEP_MIN(j->rows, r0 + step));
}

/* fep_ar_job_run on the pool, or on the caller alone where the job's
 * inputs and output are less than FEP_POOL_SOLO_BYTES in all. */
static int fep_ar_job_go(fep_pool_t *pool, struct fep_ar_job *j)
{
	size_t es = j->sum32 ? 4 : j->h->lay.esize;

	if (fep_pool_grain(j->rows, j->cols * es * ((size_t)j->n + 1)) >= j->rows) {
		fep_ar_job_run(j, 0, 1);
		return 0;
	}
	return fep_pool_run(pool, fep_ar_job_run, j);
}

/* Copy rows into place (staging, outputs). */
struct fep_ar_copy {
	struct fabep_allreduce *h;
	int me;
	size_t q, rb, cols;
	const uint8_t *in;      /* staging copy: the caller's input */
	int op;                 /* gather: what the blocks hold */
	bool res;
	void *out;
	float *scales;
	void *residual;
};

/* Two-stage staging: every row not owned here into its owner's block. */
static void fep_ar_stage_rows(void *ctx, size_t r0, size_t r1)
{
	const struct fep_ar_copy *c = ctx;
	struct fabep_allreduce *h = c->h;
	uint8_t *st = fep_heap_at(h->comm->fab, h->stage);
	size_t r;

	for (r = r0; r < r1; r++) {
		size_t o = r / c->q, i = r - o * c->q;

		if ((int)o == c->me)
			continue;
		memcpy(st + o * h->lay.blkst + FEP_AR_HDR + i * c->rb,
		       c->in + r * c->rb, c->rb);
	}
}

static void fep_ar_stage_flat(void *ctx, size_t r0, size_t r1)
{
	const struct fep_ar_copy *c = ctx;
	uint8_t *st = fep_heap_at(c->h->comm->fab, c->h->stage);

	memcpy(st + FEP_AR_HDR + r0 * c->rb, c->in + r0 * c->rb, (r1 - r0) * c->rb);
}

/* Two-stage results: every owner's block into the caller's outputs. */
static void fep_ar_gather_rows(void *ctx, size_t r0, size_t r1)
{
	const struct fep_ar_copy *c = ctx;
	struct fabep_allreduce *h = c->h;
	const uint8_t *ag = fep_heap_at(h->comm->fab, h->ag);
	size_t r, q = c->q, rb = c->rb;

	for (r = r0; r < r1; r++) {
		size_t o = r / q, i = r - o * q;
		const uint8_t *b = ag + o * h->lay.blkag + FEP_AR_HDR;

		switch (c->op) {
		case FEP_AR_SUM:
			memcpy((uint8_t *)c->out + r * rb, b + i * rb, rb);
			break;
		case FEP_AR_NORM:
			memcpy((uint8_t *)c->out + r * rb, b + i * rb, rb);
			if (c->res)
				memcpy((uint8_t *)c->residual + r * rb,
				       b + A64(q * rb) + i * rb, rb);
			break;
		default:
			memcpy((uint8_t *)c->out + r * c->cols, b + i * c->cols, c->cols);
			memcpy(c->scales + r, b + A64(q * c->cols) + i * 4, 4);
			if (c->res)
				memcpy((uint8_t *)c->residual + r * rb,
				       b + A64(q * c->cols) + A64(q * 4) + i * rb, rb);
		}
	}
}

/* This rank's own results into the outputs: rows [0, n) of its block. */
static void fep_ar_gather_own(void *ctx, size_t r0, size_t r1)
{
	const struct fep_ar_copy *c = ctx;
	size_t my0 = (size_t)c->me * c->q;

	fep_ar_gather_rows(ctx, my0 + r0, my0 + r1);
}

/* ---- the call ---- */

static const char *fep_ar_op_name(int op)
{
	switch (op) {
	case FEP_AR_SUM:
		return "fabep_allreduce";
	case FEP_AR_NORM:
		return "fabep_allreduce_rmsnorm";
	default:
		return "fabep_allreduce_rmsnorm_fp8";
	}
}

/* Whether [a, a + na) and [b, b + nb) share a byte. */
static bool fep_ar_overlap(const void *a, size_t na, const void *b, size_t nb)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return na && nb && x < y + nb && y < x + na;
}

/* Check the arguments; the caller's parameters are copied into *pin by
 * their size (fabep.h, "Extensible structs"). */
static int fep_ar_check(struct fabep_allreduce *h, int op, const void *in,
			size_t rows, size_t cols, const fabep_rmsnorm_params_t *p,
			const void *out, const float *scales,
			fabep_rmsnorm_params_t *pin)
{
	const char *name = fep_ar_op_name(op);
	int ret;

	if (cols == 0 || cols > h->max_cols || rows > h->max_rows) {
		fep_err("%s: %zu x %zu is outside the handle's 1..%zu cols, "
			"0..%zu rows", name, rows, cols, h->max_cols, h->max_rows);
		return -EINVAL;
	}
	if (op != FEP_AR_SUM) {
		if (!p) {
			fep_err("%s: NULL parameters", name);
			return -EINVAL;
		}
		ret = fep_struct_in(name, "fabep_rmsnorm_params_t", pin,
				    sizeof(*pin), FEP_RMSNORM_PARAMS_SIZE0, p);
		if (ret)
			return ret;
		p = pin;
		if (!p->gamma) {
			fep_err("%s: NULL gamma", name);
			return -EINVAL;
		}
		if (!(p->eps >= 0.0f) || p->eps > 1e30f) {
			fep_err("%s: eps %g is not in [0, 1e30]", name,
				(double)p->eps);
			return -EINVAL;
		}
		if (!isfinite(p->weight_offset)) {
			fep_err("%s: weight_offset %g is not finite", name,
				(double)p->weight_offset);
			return -EINVAL;
		}
		/* scale_ub is the FP8 output's alone: the bf16 norm ignores it */
		if (op == FEP_AR_NORM_FP8 && isnan(p->scale_ub)) {
			fep_err("%s: scale_ub is not a number", name);
			return -EINVAL;
		}
		/* the residual receives h while out receives y: on the
		 * two-stage path in another order than on the others */
		if (p->residual && rows && out &&
		    fep_ar_overlap(p->residual, rows * cols * h->lay.esize, out,
				   rows * cols * (op == FEP_AR_NORM_FP8 ? 1 : h->lay.esize))) {
			fep_err("%s: out overlaps the residual", name);
			return -EINVAL;
		}
	}
	if (rows && (!in || !out || (op == FEP_AR_NORM_FP8 && !scales))) {
		fep_err("%s: NULL %s", name, !in ? "input" : !out ? "output" : "scales");
		return -EINVAL;
	}
	return 0;
}

static uint64_t fep_ar_rd_ctr(const struct fabep_allreduce *h, int par, int k);

/* A verdict of a call in which some ranks took the log-step path and
 * others phase 1 (their rows, cols or operations put them on different
 * sides of a threshold, or a rank's bad arguments did): the log-step
 * ranks left signals behind that no wait took, and waits that no signal
 * met.  Every rank sees the flag in the same headers, so every rank owes
 * the same repair after the verdict (fep_ar_resync). */
static int fep_ar_logstep_lost(struct fabep_allreduce *h, bool logstep,
			       int ret)
{
	if (logstep)
		h->rd_resync = true;
	return ret;
}

/* The repair fep_ar_logstep_lost asked for: once each rank's operations
 * are complete at their targets (quiet, then an agreement) the log-step
 * counters hold all that call will ever add, and every rank's targets
 * start again from them, read before any rank's next call may signal (a
 * second agreement).  Where that fails too, the handle is unusable. */
static int fep_ar_resync(struct fabep_allreduce *h, int ret, const char *name)
{
	fep_fabric_t *fab = h->comm->fab;
	int p, k, sret;

	if (!h->rd_resync)
		return ret;
	h->rd_resync = false;
	sret = fep_fabric_quiet(fab);
	if (!sret)
		sret = fep_comm_agree(h->comm, 0);
	/* signals counted by this rank's progress (CQ data) are in its
	 * queues now: count them */
	if (!sret)
		sret = fep_fabric_progress_all(fab);
	if (!sret) {
		for (p = 0; p < 2; p++)
			for (k = 0; k < h->lay.rd_n; k++)
				h->rd_expect[p][k] = fep_counter_load(fab,
					fep_ar_rd_ctr(h, p, k));
		/* no peer's next call may signal before every rank has
		 * read its counters */
		sret = fep_comm_agree(h->comm, 0);
		if (!sret)
			return ret;
	}
	fep_err("%s: ranks took different paths (rows or cols differ between "
		"ranks, across the one-stage threshold), and putting the "
		"log-step counters back in step failed (%s): the handle is "
		"unusable now (destroy it)", name, fabep_strerror(sret));
	h->broken = ret ? ret : sret;
	return ret ? ret : sret;
}

/* The fingerprint of p's scalars (FEP_AR_PARM_SHIFT): each as the norm
 * uses it (-0 as 0, scale_ub without a bound as 0), mixed so that any
 * change of a bit moves about half of the 16 kept. */
static uint32_t fep_ar_parm_tag(int op, const fabep_rmsnorm_params_t *p)
{
	float eps, wo, ub = 0.0f;
	uint32_t u[3];
	uint64_t x;

	if (op == FEP_AR_SUM || !p)
		return 0;
	eps = p->eps + 0.0f;
	wo = p->weight_offset + 0.0f;
	if (op == FEP_AR_NORM_FP8 && p->scale_ub > 0.0f && isfinite(p->scale_ub))
		ub = p->scale_ub;
	memcpy(&u[0], &eps, 4);
	memcpy(&u[1], &wo, 4);
	memcpy(&u[2], &ub, 4);
	x = ((uint64_t)u[0] << 32 | u[1]) ^ (uint64_t)u[2] * 0x9e3779b97f4a7c15ull;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return (uint32_t)(x >> 48);
}

/* What a header's op says, for the messages: "rmsnorm_fp8 with residual,
 * parameters 0x1a2b". */
static const char *fep_ar_op_text(uint32_t op, char *buf, size_t n)
{
	uint32_t o = op & 0xff, tag = op >> FEP_AR_PARM_SHIFT;

	snprintf(buf, n, "%s%s%s", o == FEP_AR_SUM ? "allreduce" :
		 o == FEP_AR_NORM ? "rmsnorm" : o == FEP_AR_NORM_FP8 ?
		 "rmsnorm_fp8" : "unknown operation",
		 op & FEP_AR_F_RESIDUAL ? " with residual" : "",
		 o == FEP_AR_SUM ? "" : ", parameters ");
	if (o != FEP_AR_SUM) {
		size_t l = strlen(buf);

		snprintf(buf + l, n - l, "%#06x", tag);
	}
	return buf;
}

/* Ranks a and b called differently: the message every rank logs. */
static void fep_ar_disagree(const char *name, int a, uint64_t arows,
			    uint64_t acols, uint32_t aop, int b, uint64_t brows,
			    uint64_t bcols, uint32_t bop)
{
	uint32_t mask = ~((uint32_t)0xffff << FEP_AR_PARM_SHIFT);
	char ta[64], tb[64];

	fep_err("%s: ranks disagree: rank %d passed %llu x %llu (%s), rank %d "
		"passed %llu x %llu (%s)%s", name, a, (unsigned long long)arows,
		(unsigned long long)acols, fep_ar_op_text(aop, ta, sizeof(ta)), b,
		(unsigned long long)brows, (unsigned long long)bcols,
		fep_ar_op_text(bop, tb, sizeof(tb)),
		arows == brows && acols == bcols && (aop & mask) == (bop & mask) ?
		": their eps, weight_offset or scale_ub differ" : "");
}

/* The verdict after phase 1: the same on every rank. */
static int fep_ar_verdict(struct fabep_allreduce *h, const struct fep_ar_hdr *mine,
			  const uint8_t *slots, const char *name)
{
	fabep_comm_t *comm = h->comm;
	const struct fep_ar_hdr *hd;
	int r, mismatch = -1, ret;
	bool logstep = false;

	for (r = 0; r < comm->size; r++) {
		hd = r == comm->rank ? mine :
			(const struct fep_ar_hdr *)(slots + (size_t)r * h->lay.blk1);
		logstep = logstep || (hd->op & FEP_AR_F_LOGSTEP);
		if (hd->seq != mine->seq) {
			fep_err("%s: rank %d's slot holds call %llu, expected %llu",
				name, r, (unsigned long long)hd->seq,
				(unsigned long long)mine->seq);
			h->broken = -FABEP_ERR_PROTOCOL;
			return -FABEP_ERR_PROTOCOL;
		}
	}
	for (r = 0; r < comm->size; r++) {
		hd = r == comm->rank ? mine :
			(const struct fep_ar_hdr *)(slots + (size_t)r * h->lay.blk1);
		if (hd->status) {
			/* A peer's status comes off the wire: only a negative
			 * code is an error to pass on (found by
			 * fuzz/fuzz_coll_hdrs.c; the same bound as src/ep). */
			if (hd->status > 0 || hd->status < -100000) {
				fep_err("%s: rank %d sent status %d", name, r,
					(int)hd->status);
				ret = -FABEP_ERR_PROTOCOL;
			} else {
				if (r != comm->rank)
					fep_err("%s: rank %d reported: %s", name, r,
						fabep_strerror(hd->status));
				ret = hd->status;
			}
			return fep_ar_logstep_lost(h, logstep, ret);
		}
		if (mismatch < 0 && (hd->rows != mine->rows || hd->cols != mine->cols ||
				     hd->op != mine->op))
			mismatch = r;
	}
	if (mismatch >= 0) {
		hd = (const struct fep_ar_hdr *)(slots + (size_t)mismatch * h->lay.blk1);
		fep_ar_disagree(name, comm->rank, mine->rows, mine->cols, mine->op,
				mismatch, hd->rows, hd->cols, hd->op);
		return fep_ar_logstep_lost(h, logstep, -FABEP_ERR_MISMATCH);
	}
	return 0;
}

static int fep_ar_fail(struct fabep_allreduce *h, int ret)
{
	h->broken = ret;
	return ret;
}

/* One call, as its steps see it. */
struct fep_ar_state {
	struct fabep_allreduce *h;
	int op;
	const char *name;
	const void *in;
	size_t rows, cols;
	const fabep_rmsnorm_params_t *p; /* the checked copy, or NULL */
	fabep_rmsnorm_params_t pin;
	void *out;
	float *scales;
	size_t rb;             /* bytes per row */
	size_t q, my0, myn;    /* two-stage: rows per owner, this rank's rows */
	bool one;              /* the one-stage path (or an error to agree on) */
	bool rdp;              /* the log-step path (fep_ar_rd) */
	bool half;             /* in its halving mode */
	bool hdr_only;         /* phase 1 carries the header alone */
	bool res;              /* a residual is added */
	bool direct;           /* phase 1 from the caller's input */
	bool rd;               /* the allgather by reads (h->rd) */
	int par;               /* the slots' parity */
	struct fep_ar_hdr hdr; /* this rank's header */
	struct fep_ar_copy cp; /* staging and gather */
	char what[96];
};

/* Check the arguments and the handle, and fill c and this rank's header;
 * an argument error becomes the header's status, for every rank to see. */
static int fep_ar_begin(struct fep_ar_state *c, struct fabep_allreduce *h,
			int op, const void *in, size_t rows, size_t cols,
			const fabep_rmsnorm_params_t *p, void *out, float *scales)
{
	int status, ret;

	memset(c, 0, sizeof(*c));
	c->name = fep_ar_op_name(op);
	if (!h) {
		fep_err("%s: NULL handle", c->name);
		return -EINVAL;
	}
	/* the communicator's failure first: its own error says more */
	ret = fep_comm_usable(h->comm, c->name);
	if (ret)
		return ret;
	if (h->broken) {
		fep_err("%s: the handle is unusable after an earlier failure (%s)",
			c->name, fabep_strerror(h->broken));
		return -FABEP_ERR_PEER_LOST;
	}
	c->h = h;
	c->op = op;
	c->in = in;
	c->rows = rows;
	c->cols = cols;
	c->out = out;
	c->scales = scales;
	status = fep_ar_check(h, op, in, rows, cols, p, out, scales, &c->pin);
	if (!status && op != FEP_AR_SUM)
		c->p = &c->pin;
	c->res = !status && c->p && c->p->residual && rows;
	c->rb = cols * h->lay.esize;
	{
		size_t rb = 0, bytes = 0; /* set where fits */
		/* the same on every rank that passes the same rows, cols
		 * and operation, whatever else it got wrong; ranks whose
		 * operations differ may differ here, but on one path or the
		 * other every rank's phase 1 writes into the same slots, so
		 * every rank sees the mismatch (from FEP_AR_RD_RANKS ranks,
		 * where the log-step path has slots of its own, the two
		 * thresholds are one: fep_ar_onestage_env).  The halving
		 * limits are not (the plain sum's is the larger): above the
		 * threshold ranks whose operations differ may take the
		 * halving mode and the two-stage path, and then, as ranks
		 * whose rows differ across it, every rank still sees the
		 * mismatch (fep_ar_rd_cross), and the log-step counters are
		 * put back in step after it (fep_ar_logstep_lost) */
		bool fits = !__builtin_mul_overflow(cols, h->lay.esize, &rb) &&
			    !__builtin_mul_overflow(rows, rb, &bytes);
		bool small = !h->lay.two_stage ||
			(fits && bytes <= (op == FEP_AR_SUM ? h->os_sum : h->os_max));

		c->half = h->lay.rd_m && !small && fits &&
			  bytes <= (op == FEP_AR_SUM ? h->hv_sum : h->hv_max);
		c->rdp = h->lay.rd_m && (small || c->half);
		c->one = !c->rdp && (status || small);
		h->path = c->rdp ? 'l' : c->one ? 'o' : 't';
	}
	c->direct = h->direct && !status;
	c->rd = h->rd && !c->one && op != FEP_AR_NORM_FP8;
	c->par = (int)((h->seq + 1) & 1);

	/* the staging must not change under a write still in flight; the
	 * signals may still be unacknowledged (that would wait for every
	 * peer to enter this call) */
	ret = fep_fabric_reap_writes(h->comm->fab);
	if (ret)
		return fep_ar_fail(h, ret);
	c->hdr.seq = ++h->seq;
	c->hdr.rows = rows;
	c->hdr.cols = cols;
	c->hdr.status = status;
	c->hdr.op = (uint32_t)op | (c->res ? FEP_AR_F_RESIDUAL : 0) |
		    fep_ar_parm_tag(op, c->p) << FEP_AR_PARM_SHIFT;
	c->cp.h = h;
	c->cp.me = h->comm->rank;
	c->cp.rb = c->rb;
	c->cp.cols = cols;
	c->cp.in = in;
	return 0;
}

/* The rows of owner o's block (two-stage): from row *r0, *n of them. */
static void fep_ar_owned(const struct fep_ar_state *c, int o, size_t *r0,
			 size_t *n)
{
	*r0 = FEP_MIN(c->rows, (size_t)o * c->q);
	*n = FEP_MIN(c->rows - *r0, c->q);
}

/* Phase 1's put to peer o: this rank's rows (all of them,
 * one-stage; o's, two-stage) with the header before them, from the
 * staging, or (direct) the header from the staging and the rows from
 * the caller's input, in one write where the provider gathers.  The
 * signal goes with the rows' put, the last. */
static int fep_ar_put1(struct fep_ar_state *c, int o, struct fep_put *pu)
{
	struct fabep_allreduce *h = c->h;
	uint64_t dst = h->slots1[c->par] + (uint64_t)h->comm->rank * h->lay.blk1;
	uint64_t st = h->stage + (c->one ? 0 : (uint64_t)o * h->lay.blkst);
	size_t r0 = 0, nr = c->hdr.status || c->hdr_only ? 0 : c->rows;
	int n = 0;

	if (!c->one)
		fep_ar_owned(c, o, &r0, &nr);
	pu[n] = (struct fep_put){ .peer = o, .dst = dst, .src = st,
				  .len = FEP_AR_HDR + (c->direct ? 0 : nr * c->rb) };
	if (c->direct && nr)
		pu[++n] = (struct fep_put){ .peer = o, .dst = dst + FEP_AR_HDR,
					    .src = FEP_PUT_PTR,
					    .ptr = (const uint8_t *)c->in + r0 * c->rb,
					    .len = nr * c->rb };
	pu[n].sig = h->ctr1[c->par];
	pu[n].add = 1;
	return n + 1;
}

/* Phase 1: stage this rank's headers and, unless direct, its rows (all
 * of them, one-stage; each owner's, two-stage), write them to every
 * peer, and wait for every peer's. */
static int fep_ar_phase1(struct fep_ar_state *c)
{
	struct fabep_allreduce *h = c->h;
	fep_fabric_t *fab = h->comm->fab;
	int P = h->comm->size, me = h->comm->rank, r, n = 0, ret;
	uint8_t *st = fep_heap_at(fab, h->stage);
	size_t i;

	if (c->one) {
		memcpy(st, &c->hdr, sizeof(c->hdr));
		if (!c->direct && !c->hdr.status && !c->hdr_only && c->rows &&
		    P > 1)
			fep_pool_for(h->comm->pool, c->rows,
				     fep_pool_grain(c->rows, c->rb),
				     fep_ar_stage_flat, &c->cp);
	} else {
		c->q = (c->rows + (size_t)P - 1) / (size_t)P;
		c->cp.q = c->q;
		for (r = 0; r < P; r++)
			memcpy(st + (size_t)r * h->lay.blkst, &c->hdr, sizeof(c->hdr));
		if (!c->direct)
			fep_pool_for(h->comm->pool, c->rows,
				     fep_pool_grain(c->rows, c->rb),
				     fep_ar_stage_rows, &c->cp);
		fep_ar_owned(c, me, &c->my0, &c->myn);
	}
	for (i = 1; i < (size_t)P; i++)
		n += fep_ar_put1(c, (int)((me + i) % (size_t)P), h->puts + n);
	if (!n)
		return 0;
	ret = fep_fab_put_signal_many(fab, h->puts, (size_t)n);
	if (ret) {
		fep_err("%s: posting phase 1: %s", c->name, fabep_strerror(ret));
	} else {
		h->expect1[c->par] += (uint64_t)(P - 1);
		snprintf(c->what, sizeof(c->what), "%s (call %llu, %s)", c->name,
			 (unsigned long long)c->hdr.seq,
			 c->one ? "one-stage" : "reduce-scatter");
		ret = fep_comm_wait(h->comm, c->what, h->ctr1[c->par],
				    h->expect1[c->par], h->slots1[c->par],
				    h->lay.blk1, c->hdr.seq);
		if (!ret)  /* the peers wait for these rows (tcp) */
			ret = fep_fabric_drain(fab);
	}
	if (c->direct) {
		/* the writes read the caller's input, which the caller may
		 * change or free once the call returns, even with an error
		 * (the fabric's timeout at most: past it they are not coming
		 * back) */
		int rret = fep_fabric_reap_writes(fab);

		if (!ret)
			ret = rret;
	}
	if (ret)
		return fep_ar_fail(h, ret);
	return 0;
}

/* Reduce (and normalize) every row (one-stage: into out) or this rank's
 * owned rows (two-stage: into its allgather block, header last). */
static int fep_ar_reduce(struct fep_ar_state *c, const uint8_t *slots)
{
	struct fabep_allreduce *h = c->h;
	fep_fabric_t *fab = h->comm->fab;
	int P = h->comm->size, me = h->comm->rank, r, ret;
	const float *gamma = NULL;
	struct fep_ar_job job;
	const void **base = h->rbase;
	uint8_t *mine;
	size_t q = c->q;

	if (c->op != FEP_AR_SUM) {
		if (h->dt == FEP_K_F32)
			gamma = c->p->gamma;
		else {
			fep_k_ops()->bf16_to_f32(c->p->gamma, h->gamma32, 0, c->cols);
			gamma = h->gamma32;
		}
	}
	memset(&job, 0, sizeof(job));
	job.h = h;
	job.op = c->op;
	job.n = P;
	job.in = base;
	job.cols = c->cols;
	job.gamma = gamma;
	job.p = c->p;
	if (c->one) {
		for (r = 0; r < P; r++)
			base[r] = r == me ? c->in : slots + (size_t)r * h->lay.blk1 +
							 FEP_AR_HDR;
		job.rows = c->rows;
		job.out = c->out;
		job.scales = c->scales;
		job.res_src = job.res = c->res ? c->p->residual : NULL;
		return fep_ar_job_go(h->comm->pool, &job);
	}
	mine = (uint8_t *)fep_heap_at(fab, h->ag) + (size_t)me * h->lay.blkag;
	for (r = 0; r < P; r++)
		base[r] = r == me ? (const uint8_t *)c->in + c->my0 * c->rb :
			slots + (size_t)r * h->lay.blk1 + FEP_AR_HDR;
	job.rows = c->myn;
	job.out = mine + FEP_AR_HDR;
	if (c->op == FEP_AR_NORM_FP8) {
		job.scales = (float *)(mine + FEP_AR_HDR + A64(q * c->cols));
		if (c->res)
			job.res = mine + FEP_AR_HDR + A64(q * c->cols) + A64(q * 4);
	} else if (c->res) {
		job.res = mine + FEP_AR_HDR + A64(q * c->rb);
	}
	if (c->res)
		job.res_src = (const uint8_t *)c->p->residual + c->my0 * c->rb;
	if (c->myn) {
		ret = fep_ar_job_go(h->comm->pool, &job);
		if (ret)
			return fep_ar_fail(h, ret);
	}
	memcpy(mine, &c->hdr, sizeof(c->hdr));
	return 0;
}

/* Allgather by reads (sum, or norm with a bf16 / fp32 output): every
 * peer's results from its own block straight into the caller's outputs
 * (rows, and the new residual rows), this rank's own copied; then wait for the
 * reads, so the outputs are whole when the call returns.  An owner
 * rewrites its block only after every peer's phase 1 of a later call has
 * come, and a peer starts that only after its reads completed. */
static int fep_ar_read_blocks(struct fep_ar_state *c)
{
	struct fabep_allreduce *h = c->h;
	fep_fabric_t *fab = h->comm->fab;
	int P = h->comm->size, me = h->comm->rank, ret = 0, rret;
	size_t rb = c->rb, i;

	for (i = 1; !ret && i < (size_t)P; i++) {
		int o = (int)((me + i) % (size_t)P);
		uint64_t b = h->ag + (uint64_t)o * h->lay.blkag + FEP_AR_HDR;
		size_t r0, n;

		fep_ar_owned(c, o, &r0, &n);
		if (!n)
			continue;
		ret = fep_fab_read(fab, o, (uint8_t *)c->out + r0 * rb, b, n * rb);
		if (!ret && c->res)  /* after the rows, as ag_bytes lays out */
			ret = fep_fab_read(fab, o, (uint8_t *)c->p->residual + r0 * rb,
					   b + A64(c->q * rb), n * rb);
	}
	if (!ret && c->myn)
		ret = fep_pool_for(h->comm->pool, c->myn,
				   fep_pool_grain(c->myn, c->rb),
				   fep_ar_gather_own, &c->cp);
	/* the reads posted must be done before the call returns, even
	 * after an error */
	rret = fep_fabric_reap_writes(fab);
	if (!ret)
		ret = rret;
	if (ret) {
		fep_err("%s: reading the results: %s", c->name, fabep_strerror(ret));
		return fep_ar_fail(h, ret);
	}
	return 0;
}

/* Two-stage: write this rank's results (c->rd: only its header, the
 * peers read the rest) to every peer, wait for every peer's, check that
 * each block is of this call. */
static int fep_ar_allgather(struct fep_ar_state *c)
{
	struct fabep_allreduce *h = c->h;
	fep_fabric_t *fab = h->comm->fab;
	int P = h->comm->size, me = h->comm->rank, r, n = 0, ret;
	size_t es = h->lay.esize, i;

	for (i = 1; i < (size_t)P; i++) {
		struct fep_put *pu = &h->puts[n++];

		pu->peer = (int)((me + i) % (size_t)P);
		pu->dst = h->ag + (uint64_t)me * h->lay.blkag;
		pu->src = pu->dst;
		pu->len = FEP_AR_HDR + (c->myn && !c->rd ?
					ag_bytes(c->op, c->res, c->q, c->cols, es) : 0);
		pu->sig = h->ctr_ag;
		pu->add = 1;
	}
	ret = fep_fab_put_signal_many(fab, h->puts, (size_t)n);
	if (ret) {
		fep_err("%s: posting the allgather: %s", c->name, fabep_strerror(ret));
		return fep_ar_fail(h, ret);
	}
	h->expect_ag += (uint64_t)(P - 1);
	snprintf(c->what, sizeof(c->what), "%s (call %llu, allgather)", c->name,
		 (unsigned long long)c->hdr.seq);
	ret = fep_comm_wait(h->comm, c->what, h->ctr_ag, h->expect_ag, h->ag,
			    h->lay.blkag, c->hdr.seq);
	if (!ret)
		ret = fep_fabric_drain(fab);
	if (ret)
		return fep_ar_fail(h, ret);
	for (r = 0; r < P; r++) {
		const struct fep_ar_hdr *b = (const struct fep_ar_hdr *)(
			(uint8_t *)fep_heap_at(fab, h->ag) + (size_t)r * h->lay.blkag);

		if (b->seq != c->hdr.seq) {
			fep_err("%s: rank %d's allgather block holds call %llu, "
				"expected %llu", c->name, r, (unsigned long long)b->seq,
				(unsigned long long)c->hdr.seq);
			return fep_ar_fail(h, -FABEP_ERR_PROTOCOL);
		}
	}
	return 0;
}

/* ---- the log-step path ----
 *
 * Calls below the one-stage threshold, from FEP_AR_RD_RANKS ranks
 * (recursive doubling): with M the largest power of two <= ranks, rank
 * M + j (an extra rank) first sends its input to rank j (the fold);
 * ranks 0..M-1 then exchange their partial sums with rank me ^ 2^k in
 * round k = 0..log2(M)-1, each adding the same two partials, so both
 * hold the same bits; rank j finally sends the total to rank M + j.  Sums are fp32
 * throughout (a bf16 input is widened once) and rounded to the dtype
 * once, at the end; every rank holds the same sums, taken in the order
 * of a tree over the ranks: (x0 + x1) + (x2 + x3), ..., with x_j + x_M+j
 * at its leaves.  Each message is a struct fep_ar_rdhdr and the sums,
 * written into the partner's slot of that round (by call parity) and
 * signalled on its counter of that round.
 *
 * The header of each message merges what its sender knows of the ranks
 * its sums cover (fep_ar_rd_merge), so that after the last round every
 * rank holds the same view of every rank: the lowest rank with an error
 * and its status, and the lowest rank whose rows, cols or operation
 * differ from rank 0's.  The verdict is taken from it, as phase 1's is
 * from the headers.  Where the view so far holds an error, the rounds
 * go on with the headers alone, so that every rank learns it.
 *
 * The halving mode (calls above the threshold up to hv_sum / hv_max,
 * fep_ar_halving_env): in round k each partner sends only the half of
 * its range of the sums (the whole sums before round 0) that the other
 * keeps, the rank whose bit k is 0 keeping the lower half, and adds the
 * partner's half of its own range, so each sum is taken in the same
 * tree as by doubling; after round m - 1 each rank holds the totals of
 * its 1/M.  Then an allgather in the rounds m - 1 down to 0, on
 * counters and slots of their own (rd_m + 2 + k: the partner's message
 * of round k may come while this rank still adds the slot of round k):
 * each partner writes its range of totals into the other's staging,
 * where they lie in its own, and its header into the slot, so the
 * staging holds every total after round 0.  Where the view after the
 * halving rounds holds an error (the same on every rank then), no rank
 * takes the allgather.  Every other step, the fold, the views, the
 * verdict and the totals' use, is the doubling mode's.
 *
 * Back-to-back safety is phase 1's argument, round by round: rank A
 * writes round k of call N + 2 into B's slot of call N's parity only
 * after A had B's round-k message of call N + 1, which B sent after it
 * returned from call N.  In the halving mode A writes its totals into
 * B's staging (the range that B sent A in their halving round, and
 * reads no more) only after B's message of that round came, whose bytes
 * were then read out of it; B rewrites its staging for call N + 1 only
 * after every allgather message of call N came.  A call of ranks whose
 * rows differ across the threshold sends some ranks here and others to
 * phase 1: a rank here watches the phase-1 counter while it waits, and
 * when a phase-1 message comes it joins phase 1 with its header alone
 * (fep_ar_rd_cross), so that every rank reaches the same verdict; the
 * log-step counters are out of step after that, until every rank puts
 * them back (fep_ar_logstep_lost). */

static uint64_t fep_ar_rd_ctr(const struct fabep_allreduce *h, int par, int k)
{
	return h->rdctr + 8 * ((uint64_t)par * (uint64_t)h->lay.rd_n + (uint64_t)k);
}

static uint64_t fep_ar_rd_slot(const struct fabep_allreduce *h, int par, int k)
{
	return h->rdslots + (uint64_t)par * h->lay.rdpar + h->lay.rdoff[k];
}

/* Whether a merged view holds an error or a disagreement. */
static bool fep_ar_rd_bad(const struct fep_ar_rdhdr *v)
{
	return v->err >= 0 || v->diff >= 0;
}

/* Whether a view off the wire names only ranks there are, and an error
 * as a negative code (the bound of phase 1's verdict). */
static bool fep_ar_rd_sane(const struct fep_ar_rdhdr *b, int P)
{
	return b->ref >= 0 && b->ref < P && b->err >= -1 && b->err < P &&
	       b->diff >= -1 && b->diff < P &&
	       (b->err < 0 || (b->status < 0 && b->status >= -100000));
}

/* Merge b, a peer's view (off the wire), into a, this rank's: a then
 * covers both rank sets.  The rule is the verdict's, on the union: the
 * lowest rank with an error; the lowest rank whose call differs from the
 * lowest rank's.  A view that cannot be a peer's becomes this rank's
 * error, -FABEP_ERR_PROTOCOL (*proto set), and the rounds go on. */
static void fep_ar_rd_merge(struct fep_ar_rdhdr *a, const struct fep_ar_rdhdr *b,
			    int P, int me, uint64_t seq, int from, bool *proto,
			    const char *name)
{
	const struct fep_ar_rdhdr *lo = a->ref < b->ref ? a : b;
	const struct fep_ar_rdhdr *hi = lo == a ? b : a;
	struct fep_ar_rdhdr m = *lo;
	int hd_rank;
	uint32_t hd_op;
	uint64_t hd_rows, hd_cols;

	if (b->seq != seq || b->ref == a->ref || !fep_ar_rd_sane(b, P)) {
		if (b->seq != seq)
			fep_err("%s: rank %d's message holds call %llu, expected "
				"%llu", name, from, (unsigned long long)b->seq,
				(unsigned long long)seq);
		else
			fep_err("%s: rank %d sent a malformed header", name, from);
		*proto = true;
		if (a->err < 0 || me < a->err) {
			a->err = me;
			a->status = -FABEP_ERR_PROTOCOL;
		}
		return;
	}
	/* the lowest error */
	if (hi->err >= 0 && (m.err < 0 || hi->err < m.err)) {
		m.err = hi->err;
		m.status = hi->status;
	}
	/* hi's lowest rank differing from lo's call: hi's own lowest rank
	 * where its call differs, else the one that differs from it */
	if (hi->rows != lo->rows || hi->cols != lo->cols || hi->op != lo->op) {
		hd_rank = hi->ref;
		hd_rows = hi->rows;
		hd_cols = hi->cols;
		hd_op = hi->op;
	} else {
		hd_rank = hi->diff;
		hd_rows = hi->drows;
		hd_cols = hi->dcols;
		hd_op = hi->dop;
	}
	if (hd_rank >= 0 && (m.diff < 0 || hd_rank < m.diff)) {
		m.diff = hd_rank;
		m.drows = hd_rows;
		m.dcols = hd_cols;
		m.dop = hd_op;
	}
	*a = m;
}

/* The verdict from the merged view of every rank. */
static int fep_ar_rd_verdict(const struct fep_ar_state *c,
			     const struct fep_ar_rdhdr *v)
{
	int me = c->h->comm->rank;

	if (v->err >= 0) {
		if (v->err != me)
			fep_err("%s: rank %d reported: %s", c->name, v->err,
				fabep_strerror(v->status));
		return v->status;
	}
	if (v->diff >= 0) {
		fep_ar_disagree(c->name, v->ref, v->rows, v->cols, v->op, v->diff,
				v->drows, v->dcols, v->dop);
		return -FABEP_ERR_MISMATCH;
	}
	return 0;
}

/* Round k's message to peer: the staged header, then the staged sums
 * [lo, lo + cnt) (cnt 0: the view holds an error), into the peer's slot
 * k behind the header or (at: the halving mode's allgather) into the
 * peer's staging where they lie in this rank's, signalled on the peer's
 * counter k after both. */
static int fep_ar_rd_post(struct fep_ar_state *c, int peer, int k, size_t lo,
			  size_t cnt, bool at)
{
	struct fabep_allreduce *h = c->h;
	fep_fabric_t *fab = h->comm->fab;
	uint64_t dst = fep_ar_rd_slot(h, c->par, k);
	struct fep_put pu[2] = {
		{ .peer = peer, .dst = dst, .src = h->rdstage, .len = FEP_AR_HDR },
		{ .peer = peer, .src = h->rdstage + FEP_AR_HDR + lo * 4,
		  .len = cnt * 4 },
	};
	int n = 0, ret;

	if (cnt && !lo && !at) {
		pu[0].len += cnt * 4;
	} else if (cnt) {
		pu[1].dst = at ? pu[1].src : dst + FEP_AR_HDR;
		n = 1;
	}
	pu[n].sig = fep_ar_rd_ctr(h, c->par, k);
	pu[n].add = 1;
	ret = fep_fab_put_signal_many(fab, pu, (size_t)n + 1);

	if (ret)
		fep_err("%s: posting to rank %d: %s", c->name, peer,
			fabep_strerror(ret));
	return ret;
}

/* Wait for round k's message from peer, watching the phase-1 counter:
 * *cross when a rank took the two-stage path instead. */
static int fep_ar_rd_wait(struct fep_ar_state *c, int peer, int k, bool *cross)
{
	struct fabep_allreduce *h = c->h;
	fabep_comm_t *comm = h->comm;
	fep_fabric_t *fab = comm->fab;
	uint64_t ctr = fep_ar_rd_ctr(h, c->par, k);
	uint64_t target = ++h->rd_expect[c->par][k];
	struct fep_stall st;
	int ret;

	memset(&st, 0, sizeof(st));
	for (;;) {
		if (fep_counter_load(fab, ctr) >= target)
			break;
		if (fep_counter_load(fab, h->ctr1[c->par]) > h->expect1[c->par]) {
			*cross = true;
			return 0;
		}
		ret = fep_fabric_stall(fab, &st);
		if (ret) {
			comm->failed = true;
			if (ret == -ETIMEDOUT)
				fep_err("%s (call %llu, log-step round %d): timed out "
					"after %d ms; rank %d never signalled", c->name,
					(unsigned long long)c->hdr.seq, k,
					comm->timeout_ms, peer);
			else
				fep_err("%s (call %llu, log-step round %d, rank %d): "
					"%s", c->name, (unsigned long long)c->hdr.seq,
					k, peer, fabep_strerror(ret));
			return fep_ar_fail(h, ret);
		}
	}
	/* tcp: the peer waits for what this rank posted */
	ret = fep_fabric_drain(fab);
	return ret ? fep_ar_fail(h, ret) : 0;
}

/* A rank took the two-stage path: join its phase 1 with this rank's
 * header alone, flagged, and take phase 1's verdict (which puts the
 * log-step counters back in step, fep_ar_logstep_lost). */
static int fep_ar_rd_cross(struct fep_ar_state *c)
{
	int ret;

	c->rdp = false;
	c->one = true;
	c->hdr_only = true;
	c->hdr.op |= FEP_AR_F_LOGSTEP;
	ret = fep_fabric_reap_writes(c->h->comm->fab);
	if (ret)
		return fep_ar_fail(c->h, ret);
	ret = fep_ar_phase1(c);
	if (ret)
		return ret;
	ret = fep_ar_verdict(c->h, &c->hdr,
			     fep_heap_at(c->h->comm->fab, c->h->slots1[c->par]),
			     c->name);
	ret = fep_ar_resync(c->h, ret, c->name);
	if (!ret) {  /* cannot be: this rank's flag differs from every op */
		fep_err("%s: ranks took different paths", c->name);
		ret = fep_ar_fail(c->h, -FABEP_ERR_PROTOCOL);
	}
	return ret;
}

/* Own input into the staged sums, widened to fp32. */
static void fep_ar_rd_widen(void *ctx, size_t i0, size_t i1)
{
	const struct fep_ar_state *c = ctx;
	struct fabep_allreduce *h = c->h;
	float *sum = (float *)((uint8_t *)fep_heap_at(h->comm->fab, h->rdstage) +
			       FEP_AR_HDR);

	if (h->dt == FEP_K_F32)
		memcpy(sum + i0, (const float *)c->in + i0, (i1 - i0) * 4);
	else
		fep_k_ops()->bf16_to_f32((const uint16_t *)c->in, sum, i0, i1);
}

/* The staged sums plus those of round k's message, the partial of the
 * ranks with the lower numbers first. */
struct fep_ar_rd_add {
	float *sum;
	const float *peer;
	bool peer_first;
};

static void fep_ar_rd_add_fn(void *ctx, size_t i0, size_t i1)
{
	const struct fep_ar_rd_add *a = ctx;
	const void *in[2];
	fep_k_sum_args_t sa;

	in[0] = a->peer_first ? (const void *)a->peer : a->sum;
	in[1] = a->peer_first ? (const void *)a->sum : a->peer;
	in[0] = (const float *)in[0] + i0;
	in[1] = (const float *)in[1] + i0;
	memset(&sa, 0, sizeof(sa));
	sa.in = in;
	sa.n = 2;
	sa.dt = FEP_K_F32;
	sa.out = a->sum + i0;
	sa.nt = -1;
	fep_k_ops()->sum(&sa, 0, i1 - i0);
}

/* Elements per range of a pool run over the sums; a run that moves
 * less than FEP_POOL_SOLO_BYTES in all goes on the caller alone. */
#define FEP_AR_RD_GRAIN 4096

static size_t fep_ar_rd_grain(size_t n, size_t elem_bytes)
{
	return fep_pool_grain(n, elem_bytes) >= n ? n : FEP_AR_RD_GRAIN;
}

/* The staged sums [lo, lo + n) plus those of round k's message. */
static int fep_ar_rd_sum(struct fep_ar_state *c, int k, bool peer_first,
			 size_t lo, size_t n)
{
	struct fabep_allreduce *h = c->h;
	fep_fabric_t *fab = h->comm->fab;
	struct fep_ar_rd_add a = {
		.sum = (float *)((uint8_t *)fep_heap_at(fab, h->rdstage) + FEP_AR_HDR) + lo,
		.peer = (const float *)((const uint8_t *)fep_heap_at(
			fab, fep_ar_rd_slot(h, c->par, k)) + FEP_AR_HDR),
		.peer_first = peer_first,
	};

	/* two fp32 inputs, one output */
	size_t grain = fep_ar_rd_grain(n, 12);

	if (n <= grain) {
		fep_ar_rd_add_fn(&a, 0, n);
		return 0;
	}
	return fep_pool_for(h->comm->pool, n, grain, fep_ar_rd_add_fn,
			    &a);
}

static int fep_ar_rd(struct fep_ar_state *c)
{
	struct fabep_allreduce *h = c->h;
	fabep_comm_t *comm = h->comm;
	fep_fabric_t *fab = comm->fab;
	int P = comm->size, me = comm->rank, m = h->lay.rd_m, M = 1 << m;
	int X = P - M, k, peer, ret;
	struct fep_ar_rdhdr *st = fep_heap_at(fab, h->rdstage), view;
	const struct fep_ar_rdhdr *got;
	const float *total;
	bool cross = false, proto = false, data;
	struct fep_ar_job job;
	size_t n = c->rows * c->cols, lo = 0, hi = n;
	size_t plo[FEP_AR_RD_MAX], phi[FEP_AR_RD_MAX];

	memset(&view, 0, sizeof(view));
	view.seq = c->hdr.seq;
	view.rows = c->hdr.rows;
	view.cols = c->hdr.cols;
	view.op = c->hdr.op;
	view.ref = me;
	view.err = c->hdr.status ? me : -1;
	view.status = c->hdr.status;
	view.diff = -1;
	data = !c->hdr.status && c->rows;
	if (data) {
		/* the input's element, widened to an fp32 sum */
		size_t grain = fep_ar_rd_grain(n, h->lay.esize + 4);

		if (n <= grain)
			fep_ar_rd_widen(c, 0, n);
		else if ((ret = fep_pool_for(comm->pool, n, grain,
					     fep_ar_rd_widen, c)))
			return fep_ar_fail(h, ret);
	}
	snprintf(c->what, sizeof(c->what), "%s (call %llu, log-step)", c->name,
		 (unsigned long long)c->hdr.seq);

	if (me >= M) {  /* an extra rank: the fold, then the total */
		peer = me - M;
		*st = view;
		ret = fep_ar_rd_post(c, peer, m, 0, data ? n : 0, false);
		if (!ret)
			ret = fep_ar_rd_wait(c, peer, m + 1, &cross);
		if (ret)
			return fep_ar_fail(h, ret);
		if (cross)
			return fep_ar_rd_cross(c);
		got = fep_heap_at(fab, fep_ar_rd_slot(h, c->par, m + 1));
		/* the partner's view covers every rank, this one included */
		if (got->seq != view.seq || got->ref != 0 || !fep_ar_rd_sane(got, P)) {
			fep_err("%s: rank %d's total holds call %llu (ranks from "
				"%d): malformed", c->name, peer,
				(unsigned long long)got->seq, got->ref);
			return fep_ar_fail(h, -FABEP_ERR_PROTOCOL);
		}
		view = *got;
		total = (const float *)(got + 1);
	} else {
		if (me < X) {  /* the fold: the extra rank's input */
			ret = fep_ar_rd_wait(c, me + M, m, &cross);
			if (ret)
				return ret;
			if (cross)
				return fep_ar_rd_cross(c);
			got = fep_heap_at(fab, fep_ar_rd_slot(h, c->par, m));
			fep_ar_rd_merge(&view, got, P, me, view.seq, me + M, &proto,
					c->name);
			data = data && !fep_ar_rd_bad(&view);
			if (data && (ret = fep_ar_rd_sum(c, m, false, 0, n)))
				return fep_ar_fail(h, ret);
		}
		/* the staging changes only while no write reads it: the
		 * call's start reaped the last call's, each round reaps its
		 * own before its sum; in the halving mode the sums a write
		 * reads are not those the round adds to (or, in the
		 * allgather, receives) */
		for (k = 0; k < m; k++) {
			size_t mid = lo + (hi - lo) / 2;
			bool up = (me >> k) & 1;

			/* halving: keep one half of [lo, hi) (the lower one
			 * where bit k is 0), send the other */
			plo[k] = lo;
			phi[k] = hi;
			peer = me ^ (1 << k);
			*st = view;
			if (c->half)
				ret = fep_ar_rd_post(c, peer, k, up ? lo : mid,
						     data ? (up ? mid - lo : hi - mid) : 0,
						     false);
			else
				ret = fep_ar_rd_post(c, peer, k, 0, data ? n : 0, false);
			if (!ret)
				ret = fep_ar_rd_wait(c, peer, k, &cross);
			if (ret)
				return fep_ar_fail(h, ret);
			if (cross)
				return fep_ar_rd_cross(c);
			got = fep_heap_at(fab, fep_ar_rd_slot(h, c->par, k));
			fep_ar_rd_merge(&view, got, P, me, view.seq, peer, &proto,
					c->name);
			data = data && !fep_ar_rd_bad(&view);
			if (c->half) {
				lo = up ? mid : lo;
				hi = up ? hi : mid;
			}
			ret = fep_fabric_reap_writes(fab);
			if (!ret && data)
				ret = fep_ar_rd_sum(c, k, up, lo, hi - lo);
			if (ret)
				return fep_ar_fail(h, ret);
		}
		/* halving: the allgather, the rounds in reverse, where the
		 * view (the same on every rank by now) holds no error: each
		 * rank's sums of its part into the partner's staging, whose
		 * part is the rest of the two's range of the round */
		for (k = m - 1; c->half && data && k >= 0; k--) {
			peer = me ^ (1 << k);
			ret = fep_fabric_reap_writes(fab);
			if (!ret) {
				*st = view;
				ret = fep_ar_rd_post(c, peer, m + 2 + k, lo, hi - lo, true);
			}
			if (!ret)
				ret = fep_ar_rd_wait(c, peer, m + 2 + k, &cross);
			if (ret)
				return fep_ar_fail(h, ret);
			if (cross)
				return fep_ar_rd_cross(c);
			got = fep_heap_at(fab, fep_ar_rd_slot(h, c->par, m + 2 + k));
			if (got->seq != view.seq) {
				fep_err("%s: rank %d's allgather message holds call "
					"%llu, expected %llu", c->name, peer,
					(unsigned long long)got->seq,
					(unsigned long long)view.seq);
				return fep_ar_fail(h, -FABEP_ERR_PROTOCOL);
			}
			lo = plo[k];
			hi = phi[k];
		}
		if (me < X) {  /* the total to the extra rank */
			ret = fep_fabric_reap_writes(fab);
			if (!ret) {
				*st = view;
				ret = fep_ar_rd_post(c, me + M, m + 1, 0, data ? n : 0,
						     false);
			}
			if (ret)
				return fep_ar_fail(h, ret);
		}
		total = (const float *)(st + 1);
	}
	if (proto)
		h->broken = -FABEP_ERR_PROTOCOL;
	ret = fep_ar_rd_verdict(c, &view);
	if (ret || !c->rows)
		return ret;

	/* the total into the caller's outputs, as the one-stage path */
	memset(&job, 0, sizeof(job));
	job.h = h;
	job.op = c->op;
	job.n = 1;
	job.sum32 = total;
	job.rows = c->rows;
	job.cols = c->cols;
	job.out = c->out;
	job.scales = c->scales;
	job.res_src = job.res = c->res ? c->p->residual : NULL;
	if (c->op != FEP_AR_SUM) {
		if (h->dt == FEP_K_F32) {
			job.gamma = c->p->gamma;
		} else {
			fep_k_ops()->bf16_to_f32(c->p->gamma, h->gamma32, 0, c->cols);
			job.gamma = h->gamma32;
		}
	}
	job.p = c->p;
	ret = fep_ar_job_go(comm->pool, &job);
	return ret ? fep_ar_fail(h, ret) : 0;
}

static int fep_ar_call(struct fabep_allreduce *h, int op, const void *in,
		       size_t rows, size_t cols, const fabep_rmsnorm_params_t *p,
		       void *out, float *scales)
{
	struct fep_ar_state c;
	const uint8_t *slots;
	int ret;

	ret = fep_ar_begin(&c, h, op, in, rows, cols, p, out, scales);
	if (ret)
		return ret;
	if (c.rdp)
		return fep_ar_rd(&c);
	/* 1. phase 1: stage and write */
	ret = fep_ar_phase1(&c);
	if (ret)
		return ret;
	/* 2. the verdict, the same on every rank */
	slots = fep_heap_at(h->comm->fab, h->slots1[c.par]);
	ret = fep_ar_resync(h, fep_ar_verdict(h, &c.hdr, slots, c.name), c.name);
	if (ret)
		return ret;
	if (!rows)
		return 0;
	/* 3. reduce (and normalize): the result, or this rank's share */
	ret = fep_ar_reduce(&c, slots);
	if (ret || c.one)
		return ret;
	/* 4. two-stage: allgather of the owned results, then out */
	ret = fep_ar_allgather(&c);
	if (ret)
		return ret;
	c.cp.op = op;
	c.cp.q = c.q;
	c.cp.res = c.res;
	c.cp.out = out;
	c.cp.scales = scales;
	c.cp.residual = c.res ? c.p->residual : NULL;
	if (c.rd)
		return fep_ar_read_blocks(&c);
	return fep_pool_for(h->comm->pool, rows, fep_pool_grain(rows, c.rb),
			    fep_ar_gather_rows, &c.cp);
}

FEP_EXPORT void fabep_rmsnorm_params_init(fabep_rmsnorm_params_t *p)
{
	if (!p)
		return;
	memset(p, 0, sizeof(*p));
	p->size = sizeof(*p);
}

FEP_EXPORT int fabep_allreduce(fabep_allreduce_t *ar, const void *in,
			       void *out, size_t rows, size_t cols)
{
	return fep_ar_call(ar, FEP_AR_SUM, in, rows, cols, NULL, out, NULL);
}

FEP_EXPORT int fabep_allreduce_rmsnorm_fp8(fabep_allreduce_t *ar, const void *in,
					   size_t rows, size_t cols,
					   const fabep_rmsnorm_params_t *p,
					   uint8_t *out, float *scales)
{
	return fep_ar_call(ar, FEP_AR_NORM_FP8, in, rows, cols, p, out, scales);
}

FEP_EXPORT int fabep_allreduce_rmsnorm(fabep_allreduce_t *ar, const void *in,
				       size_t rows, size_t cols,
				       const fabep_rmsnorm_params_t *p, void *out)
{
	return fep_ar_call(ar, FEP_AR_NORM, in, rows, cols, p, out, NULL);
}
