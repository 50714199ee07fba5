/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * combine.c - expert-parallel combine.
 *
 * Send (expert rank): for the oldest dispatch not yet combined, reduce
 * each received token's rows here, sum_k w_k * y_k over this rank's
 * experts in fp32 (the pool's top-k kernel reading the caller's y at the
 * row indices dispatch recorded), straight into one contiguous run per
 * source, and write every run with its signal in one batch.
 *
 * Receive (source rank): wait for the set's counter, check the headers
 * (every count must equal what this rank sent there), then sum the at
 * most min(top_k, ranks) partial rows of each token into the output with
 * the same kernel, calling the caller's callback per row.  Receiving
 * every peer's combine is also the credit: they have finished reading
 * this set's dispatch slots, so the set is free for a later dispatch.
 *
 * fabep_moe_combine, which knows the output when it sends, moves that
 * final sum into the own run: once every peer's rows are in (counter
 * reached, headers as combine_recv will find them), each claim of the
 * own run also sums its tokens' rows into out while their own partial
 * is hot, with the same kernel and the same arguments (the same bits);
 * combine_recv then sums only the tokens left (those of the claims
 * before the rows came, and those with no expert here).
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep.h"

/* The set of the oldest dispatch in `state`, or NULL. */
static struct fep_ep_set *oldest(struct fabep_moe *m, int state, int *bp)
{
	struct fep_ep_set *best = NULL;
	int b;

	for (b = 0; b < m->sets; b++)
		if (m->set[b].state == state &&
		    (!best || m->set[b].seq < best->seq)) {
			best = &m->set[b];
			*bp = b;
		}
	return best;
}

struct red_ctx {
	struct fabep_moe *m;
	struct fep_ep_set *s;
	const struct fep_k_ops *ops;
	int b;
	const void *y;
	size_t ld_y;
	int weighted;
	int nt;               /* the peers' runs: streaming stores (topk nt) */
	size_t skip0, skip;   /* tokens [skip0, skip0 + skip) not in this pass */
	size_t p0;            /* first token (of this pass) of the block */
	struct fep_ep_idle idle;
	/* the own run's final sums (fabep_moe_combine) */
	int fuse;             /* this pass (the own run) sums into out too */
	fep_k_topk_args_t fin; /* combine_recv's sum, applied per token */
	uint64_t ctr, target; /* the set's combine counter and wait target */
	int ready;            /* atomic: 1 every peer's rows are in, -1 never */
	size_t nfused;        /* atomic: tokens summed into out */
};

/* Whether rows of hidden values, ld apart, of elt bytes each, span no
 * more than the address space from the first row's start to the last
 * row's end. */
static bool rows_span_ok(size_t rows, size_t ld, size_t hidden, size_t elt)
{
	size_t span;

	return !rows || (!__builtin_mul_overflow(rows - 1, ld, &span) &&
			 !__builtin_add_overflow(span, hidden, &span) &&
			 !__builtin_mul_overflow(span, elt, &span) &&
			 span <= PTRDIFF_MAX);
}

/* The caller's output for n tokens, ld_out values apart (logged with
 * m->cfn when refused). */
static bool out_ok(const struct fabep_moe *m, size_t n, const void *out,
		   size_t ld_out)
{
	const char *why;

	if (!n)
		return true;
	if (!out)
		why = "NULL output";
	else if (ld_out < m->hidden)
		why = "ld_out below hidden";
	else if (!rows_span_ok(n, ld_out, m->hidden, fep_k_dtype_size(m->cdt)))
		why = "ld_out so large that the rows overflow the address space";
	else
		return true;
	fep_err("%s: %s for %zu tokens", m->cfn, why, n);
	return false;
}

static uint8_t *crun_base(struct fabep_moe *m, int b, int src)
{
	fep_fabric_t *fab = m->comm->fab;

	if (src == m->rank)
		return fep_heap_at(fab, fep_ep_cslot(m, b, m->rank));
	return fep_heap_at(fab, fep_ep_cstage(m, src));
}

static void reduce_flat(struct red_ctx *c, size_t t0, size_t t1);

/* Tokens [t0, t1) of this pass: the flat list without [skip0, skip0 + skip). */
static void reduce_range(void *arg, size_t t0, size_t t1)
{
	struct red_ctx *c = arg;

	if (t0 < c->skip0) {
		reduce_flat(c, t0, FEP_MIN(t1, c->skip0));
		t0 = c->skip0;
	}
	if (t1 > t0)
		reduce_flat(c, t0 + c->skip, t1 + c->skip);
}

/* combine_recv's final sum where some ranks send rows (s->nx): for each
 * (token, k), its row from such a rank with the router's weight (1 where
 * that rank's caller asked for FABEP_MOE_UNWEIGHTED), or, at the first k
 * of any other rank, that rank's partial row with weight 1 (exact: the
 * same sum as without weights). */
static void final_rows(struct fabep_moe *m, int b, struct fep_ep_set *s)
{
	fep_fabric_t *fab = m->comm->fab;
	size_t k = (size_t)m->k, i;
	uint8_t *unw = m->xunw;
	int r;

	for (r = 0; r < m->size; r++) {
		struct fep_ep_hdr h;

		memcpy(&h, fep_heap_at(fab, fep_ep_chdr(m, b, r)), sizeof(h));
		unw[r] = !!(h.flags & FEP_EP_HDR_UNWEIGHTED);
	}
	for (i = 0; i < s->n * k; i++) {
		int32_t x = s->xidx[i];

		if (x >= 0) {
			r = (int)((size_t)x / m->cslot_rows);
			s->fidx[i] = x;
			s->fw[i] = unw[r] ? 1.0f : s->xw[i];
		} else {
			s->fidx[i] = s->pidx[i];
			s->fw[i] = 1.0f;
		}
	}
	s->fin_cuse = s->cuses;
}

/* What set s's combine counter reaches once every peer's rows of the
 * pending combine are in (the counter never resets: s->cuses calls). */
static uint64_t comb_target(const struct fabep_moe *m, const struct fep_ep_set *s)
{
	return (uint64_t)(m->size - 1) * m->cchunks * s->cuses;
}

/* Whether every peer's rows of this combine are here, with headers that
 * combine_recv will accept (call, magic, status 0, the count this rank
 * sent there).  Silent: combine_recv checks again and names what is
 * wrong; until then, or after a bad header, no token is fused. */
static int peers_in(struct red_ctx *c)
{
	struct fabep_moe *m = c->m;
	fep_fabric_t *fab = m->comm->fab;
	int v = __atomic_load_n(&c->ready, __ATOMIC_ACQUIRE), r, zero = 0;

	if (v)
		return v == 1;  /* 2: another thread checks the headers */
	if (fep_counter_load(fab, c->ctr) < c->target)
		return 0;
	if (!__atomic_compare_exchange_n(&c->ready, &zero, 2, false,
					 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return zero == 1;
	v = 1;
	for (r = 0; r < m->size && v > 0; r++) {
		struct fep_ep_hdr h;

		memcpy(&h, fep_heap_at(fab, fep_ep_chdr(m, c->b, r)), sizeof(h));
		/* anything combine_recv would refuse (check_hdrs,
		 * check_kinds, check_weighting) fuses nothing: out is
		 * written only by a call that succeeds, a fabric failure of
		 * its drain aside */
		if (h.seq != c->s->seq || h.magic != FEP_EP_MAGIC || h.status ||
		    h.count != c->s->cexp[r] ||
		    !(h.flags & FEP_EP_HDR_ROWS) != !c->s->xrun[r] ||
		    !(h.flags & FEP_EP_HDR_UNWEIGHTED) != !m->cunw)
			v = -1;
	}
	if (v > 0 && c->s->nx)
		final_rows(m, c->b, c->s);
	__atomic_store_n(&c->ready, v, __ATOMIC_RELEASE);
	return v > 0;
}

/* About what a partial row's reduction moves: the row, and the rows of
 * its token's experts on this rank (k / size of them, on average, at
 * least one). */
static size_t red_item_bytes(const struct fabep_moe *m)
{
	return m->crow_bytes *
	       (1 + ((size_t)m->k + (size_t)m->size - 1) / (size_t)m->size);
}

static void reduce_block(void *arg, size_t r0, size_t r1)
{
	struct red_ctx *c = arg;
	struct fabep_moe *m = c->m;
	size_t p, nf = 0;

	reduce_range(c, c->p0 + r0, c->p0 + r1);
	if (!c->fuse || !peers_in(c))
		return;
	/* own rows [r0, r1) are done: their tokens' final sums */
	for (p = r0; p < r1; p++) {
		int32_t t = m->own_tok[p];

		if (t < 0)
			continue;
		c->ops->topk_sum(&c->fin, (size_t)t, (size_t)t + 1);
		m->fused[t] = 1;
		nf++;
	}
	__atomic_add_fetch(&c->nfused, nf, __ATOMIC_RELAXED);
}

/* combine_recv's final sum of set b into out. */
static void fin_args(struct fabep_moe *m, int b, const struct fep_ep_set *s,
		     void *out, size_t ld_out, fabep_moe_row_fn cb, void *cb_ctx,
		     fep_k_topk_args_t *a)
{
	memset(a, 0, sizeof(*a));
	a->y = fep_heap_at(m->comm->fab, fep_ep_cslot(m, b, 0));
	a->y_dt = m->cdt;
	a->ld_y = m->hidden;
	a->idx = s->nx ? s->fidx : s->ret_idx;
	a->w = s->nx ? s->fw : NULL;
	a->k = s->nx ? m->k : m->kk;
	a->out = out;
	a->out_dt = m->cdt;
	a->ld_out = ld_out;
	a->cols = m->hidden;
	a->cb = (fep_k_row_cb)cb;
	a->cb_ctx = cb_ctx;
}

/* Whether [a, a + an) and [b, b + bn) share a byte. */
static int overlap(const void *a, size_t an, const void *b, size_t bn)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return an && bn && x < y + bn && y < x + an;
}

/* Whether the own run can fuse the final sums (then c is set up for it):
 * it has tokens, out is given and shares no byte with y (the own run
 * writes out while other threads still read y), and the kernel takes
 * the arguments.  own_tok maps own row p to its token. */
static int fuse_setup(struct red_ctx *c, void *out, size_t ld_out,
		       fabep_moe_row_fn cb, void *cb_ctx)
{
	struct fabep_moe *m = c->m;
	struct fep_ep_set *s = c->s;
	size_t kk = (size_t)m->kk, base, own = s->rcount[m->rank], i;
	size_t elt = fep_k_dtype_size(m->cdt);

	if (!out || !s->n || !own || s->status ||
	    overlap(out, ((s->n - 1) * ld_out + m->hidden) * elt, c->y,
		    s->rows ? ((s->rows - 1) * c->ld_y + m->hidden) * elt : 0))
		return 0;
	fin_args(m, c->b, s, out, ld_out, cb, cb_ctx, &c->fin);
	if (fep_k_topk_check(&c->fin))
		return 0;  /* logged; combine_recv meets it again */
	base = (size_t)m->rank * m->cslot_rows + m->chdr_rows;
	for (i = 0; i < own; i++)
		m->own_tok[i] = -1;
	for (i = 0; i < s->n * kk; i++) {
		int32_t r = s->ret_idx[i];

		if (r >= 0 && (size_t)r >= base && (size_t)r < base + own)
			m->own_tok[(size_t)r - base] = (int32_t)(i / kk);
	}
	memset(m->fused, 0, s->n);
	c->ctr = fep_ep_cctr(m, c->b);
	c->target = comb_target(m, s);
	return 1;
}

/* Reduce received tokens [t0, t1) (flattened over sources). */
static void reduce_flat(struct red_ctx *c, size_t t0, size_t t1)
{
	struct fabep_moe *m = c->m;
	struct fep_ep_set *s = c->s;
	size_t k = (size_t)m->k;
	int src = 0;

	while (t0 < t1) {
		size_t i0, i1;
		fep_k_topk_args_t a;

		while (s->tbase[src + 1] <= t0)
			src++;
		i0 = t0 - s->tbase[src];
		i1 = FEP_MIN(t1, (size_t)s->tbase[src + 1]) - s->tbase[src];
		if (s->crows[src]) {  /* its rows go back as they are */
			t0 = s->tbase[src] + i1;
			continue;
		}
		memset(&a, 0, sizeof(a));
		a.y = c->y;
		a.y_dt = m->cdt;
		a.ld_y = c->ld_y;
		a.idx = s->cidx + (size_t)s->tbase[src] * k;
		a.w = c->weighted ? s->cw + (size_t)s->tbase[src] * k : NULL;
		a.k = m->k;
		a.out = crun_base(m, c->b, src) + m->chdr_rows * m->crow_bytes;
		a.out_dt = m->cdt;
		a.ld_out = m->hidden;
		a.cols = m->hidden;
		/* the own run is summed again at once; a peer's leaves */
		a.nt = src == m->rank ? -1 : c->nt;
		c->ops->topk_sum(&a, i0, i1);
		t0 = s->tbase[src] + i1;
	}
}

static int combine_recv(struct fabep_moe *m, void *out, size_t ld_out,
			fabep_moe_row_fn cb, void *cb_ctx);

/* The rows of y each source that asked for rows gets back (s->crows):
 * its rows of one expert are one block of the expert-major y, so at
 * most L blocks, in expert order (m->xblk, m->xnblk); the number of its
 * rows to *rows[src]. */
static int row_blocks(struct fabep_moe *m, const struct fep_ep_set *s,
		      uint32_t *rows)
{
	size_t L = (size_t)m->L, r;
	uint32_t *nb = m->xnblk;

	memset(nb, 0, (size_t)m->size * sizeof(uint32_t));
	memset(rows, 0, (size_t)m->size * sizeof(uint32_t));
	for (r = 0; r < s->rows; r++) {
		int p = s->src_info[3 * r];
		uint32_t *blk = m->xblk + 2 * L * (size_t)p;

		if (!s->crows[p])
			continue;
		rows[p]++;
		if (nb[p] && blk[2 * (nb[p] - 1)] + blk[2 * (nb[p] - 1) + 1] == r) {
			blk[2 * (nb[p] - 1) + 1]++;
			continue;
		}
		if (nb[p] == L) {  /* not expert-major: the layout is broken */
			fep_err("%s: rank %d's rows are not in expert order", m->cfn, p);
			return -FABEP_ERR_PROTOCOL;
		}
		blk[2 * nb[p]] = (uint32_t)r;
		blk[2 * nb[p] + 1] = 1;
		nb[p]++;
	}
	return 0;
}

/* Whether combine's rows leave straight from y (rows_puts). */
static bool rows_from_y(const fep_fabric_t *fab)
{
	return fep_fab_ptr_ok(fab) && fep_fab_signals_after_writes(fab);
}

/* The puts of the rows of y to source p (row_blocks) into out, behind
 * the run's header, with the run's signals: straight from y where the
 * provider reads unregistered memory and the header's signal follows
 * the writes before it, else through p's stage, the run one write (under
 * remote CQ data a write without a signal has no order with the
 * header's).  Returns how many: at most one a row and the header. */
static size_t rows_puts(struct fabep_moe *m, int b, int p, const uint8_t *y,
			size_t ld_y, struct fep_put *out)
{
	fep_fabric_t *fab = m->comm->fab;
	size_t L = (size_t)m->L, unit = m->crow_bytes, ld = ld_y * fep_k_dtype_size(m->cdt);
	const uint32_t *blk = m->xblk + 2 * L * (size_t)p;
	uint64_t dst = fep_ep_cslot(m, b, m->rank), stage = fep_ep_cstage(m, p);
	uint8_t *st = fep_heap_at(fab, stage);
	size_t np = 0, pos = m->chdr_rows, i, j;
	int ptr = rows_from_y(fab);

	for (i = 0; i < m->xnblk[p]; i++) {
		const uint8_t *r0 = y + (size_t)blk[2 * i] * ld;
		size_t n = blk[2 * i + 1];

		for (j = 0; j < n; j += ld == unit ? n : 1) {
			size_t c = ld == unit ? n : 1;

			if (!ptr) {
				memcpy(st + (pos + j) * unit, r0 + j * ld, c * unit);
				continue;
			}
			out[np++] = (struct fep_put){
				.peer = p, .dst = dst + (pos + j) * unit,
				.src = FEP_PUT_PTR, .len = c * unit, .ptr = r0 + j * ld,
			};
		}
		pos += n;
	}
	/* the header last, with the run's signals; from the stage, it is
	 * one write with the rows */
	out[np++] = (struct fep_put){
		.peer = p, .dst = dst + m->choff, .src = stage + m->choff,
		.len = (ptr ? m->chdr_rows : pos) * unit - m->choff,
		.sig = fep_ep_cctr(m, b), .add = m->cchunks,
	};
	return np;
}

/* Room in m->rputs for the one batch of post_rows: before the send half's
 * status is final, so that a failure is a refused call. */
static int rows_reserve(struct fabep_moe *m, const struct fep_ep_set *s)
{
	size_t cap = s->rows + (size_t)m->size;
	struct fep_put *l;

	if (!fep_ep_lanes(m) || m->rputs_cap >= cap)
		return 0;
	l = realloc(m->rputs, cap * sizeof(*l));
	if (!l) {
		fep_err("%s: no memory for the puts of %zu rows", m->cfn, s->rows);
		return -ENOMEM;
	}
	m->rputs = l;
	m->rputs_cap = cap;
	return 0;
}

/* Post the runs of rows to every source that asked for them: each on its
 * own, so that a source starts its sum as soon as its rows are in; or,
 * where the sender's copies can be made in lanes (fep_ep_copy), all in
 * one batch, whose copies to different sources then move at once. */
static int post_rows(struct fabep_moe *m, struct fep_ep_set *s, int b,
		     const uint8_t *y, size_t ld_y)
{
	int lanes = fep_ep_lanes(m);
	uint64_t t0 = fep_now_ns();
	size_t np = 0;
	int d, ret = 0;

	for (d = 1; !ret && d < m->size; d++) {
		int peer = (m->rank + d) % m->size;

		if (!s->crows[peer])
			continue;
		if (lanes) {
			np += rows_puts(m, b, peer, y, ld_y, m->rputs + np);
			continue;
		}
		np = rows_puts(m, b, peer, y, ld_y, m->puts);
		ret = fep_ep_post(m, np, &m->tm.c_bytes, true);
	}
	if (lanes)
		ret = fep_ep_copy(m, m->rputs, np, &m->tm.c_bytes);
	m->tm.c_put += fep_now_ns() - t0;
	return ret;
}

/* out, ld_out, cb, cb_ctx: combine_recv's, when the caller gave them
 * now (fabep_moe_combine); out NULL otherwise.  A send refused for its
 * arguments (status: the caller's, else the checks') still sends every
 * peer a header with the error and no rows, and runs its receive half
 * at once: the refusing rank owes no combine_recv, every rank returns the
 * agreed code, and the dispatch stays received, to be combined again. */
static int combine_send(struct fabep_moe *m, const void *y, size_t ld_y,
			unsigned flags, int status, void *out, size_t ld_out,
			fabep_moe_row_fn cb, void *cb_ctx)
{
	fabep_comm_t *comm = m->comm;
	fep_fabric_t *fab = comm->fab;
	struct fep_ep_set *s;
	struct red_ctx c;
	uint64_t t0, t1, t2, t3;
	size_t np_all, pb, pe, blk, nrows;
	int b = 0, d, ret;

	if ((ret = fep_ep_usable(m, m->cfn)))
		return ret;
	if (m->pending_recv || m->pending_crecv) {
		fep_err("%s: the previous %s_send awaits its %s_recv", m->cfn,
			m->pending_recv ? "dispatch" : "combine",
			m->pending_recv ? "dispatch" : "combine");
		return -EINVAL;
	}
	s = oldest(m, FEP_EP_RECEIVED, &b);
	if (!s) {
		fep_err("%s: no received dispatch to combine", m->cfn);
		return -EINVAL;
	}
	if ((ret = fep_ep_settle_owed(m, m->cfn)))
		return ret;
	m->tm.c_begin = fep_now_ns();
	fep_pool_wake(comm->pool);  /* they wake while the sends drain */
	t0 = fep_now_ns();
	/* the previous runs' writes, not their signals (as dispatch) */
	ret = fep_ep_fab(m, fep_fabric_reap_writes(fab));
	if (ret)
		return ret;
	t1 = fep_now_ns();
	if (!status && s->rows && !y) {
		fep_err("%s: NULL expert outputs for %zu rows", m->cfn, s->rows);
		status = -EINVAL;
	}
	if (!status && s->rows && ld_y < m->hidden) {
		fep_err("%s: ld_y %zu below hidden %zu", m->cfn, ld_y, m->hidden);
		status = -EINVAL;
	}
	if (!status && y && !rows_span_ok(s->rows, ld_y, m->hidden,
					   fep_k_dtype_size(m->cdt))) {
		fep_err("%s: %zu rows %zu values apart overflow the address space",
			m->cfn, s->rows, ld_y);
		status = -EINVAL;
	}
	if (!status && (flags & ~FABEP_MOE_UNWEIGHTED)) {
		fep_err("%s: unknown flags 0x%x", m->cfn, flags);
		status = -EINVAL;
	}
	nrows = 0;
	if (!status) {  /* the runs of rows, and their sizes (m->cursor) */
		for (d = 0; d < m->size; d++)
			nrows += s->crows[d];
		if (nrows && ((ret = row_blocks(m, s, m->cursor)) ||
			      (ret = rows_reserve(m, s))))
			status = ret;
	}
	s->state = FEP_EP_CSENT;
	s->cuses++;
	s->status = status;
	m->pending_crecv = 1;
	m->cfused = 0;
	memset(&c, 0, sizeof(c));
	c.m = m;
	c.s = s;
	c.ops = fep_k_ops();
	c.b = b;
	c.y = y ? y : (const void *)s;
	c.ld_y = y ? ld_y : m->hidden;
	c.weighted = !(flags & FABEP_MOE_UNWEIGHTED);
	m->cunw = !c.weighted;
	c.idle.fab = fab;
	for (d = 0; d < m->size; d++) {
		uint8_t *h = crun_base(m, b, d) + m->choff;
		/* UNWEIGHTED on every run, so that every rank can compare
		 * its own with its peers' (check_weighting) */
		uint32_t fl = status ? 0 : (s->crows[d] ? FEP_EP_HDR_ROWS : 0) |
			(c.weighted ? 0 : FEP_EP_HDR_UNWEIGHTED);

		fep_ep_hdr_write(h, s->seq, status, status ? 0 :
				 (fl & FEP_EP_HDR_ROWS) ? m->cursor[d] : s->rcount[d]);
		memcpy(h + offsetof(struct fep_ep_hdr, flags), &fl, 4);
	}
	m->tm.c_put = t1 - t0;
	m->tm.c_bytes = 0;
	m->tm.c_reduce = m->tm.c_wait = m->tm.c_sum = m->tm.c_own = 0;
	m->tm.c_fused = 0;

	/* the runs of rows first: they need no reduction */
	if (!status && nrows && (ret = post_rows(m, s, b, c.y, c.ld_y)))
		goto fail;

	/* pass 0, pipelined: reduce the other ranks' tokens a block at a time
	 * (on the workers, the caller driving the fabric), last block first,
	 * posting each chunk of a run as soon as it is complete; a run's
	 * header leaves last, with its first chunk, so that a receiver whose
	 * wait times out names the senders that did not finish
	 * (fep_ep_ready_chunks, hlast: runs produced back to front, so the
	 * first chunk is the last one reduced, not one held back) */
	c.skip0 = s->tbase[m->rank];
	c.skip = s->rcount[m->rank];
	np_all = status ? 0 : s->rtokens - c.skip;
	/* the peers' runs go out of this rank's caches: streamed, once they
	 * are large (one decision for the whole pass) */
	c.nt = np_all * m->crow_bytes >= FEP_K_NT_BYTES ? 1 : -1;
	for (d = 0; d < m->size; d++)
		m->posted[d] = 0;
	for (blk = np_all ? (np_all - 1) / m->cchunk_rows : 0; m->size > 1; blk--) {
		size_t np = 0;

		pb = blk * m->cchunk_rows;
		pe = FEP_MIN(np_all, pb + m->cchunk_rows);
		t2 = fep_now_ns();
		if (pe > pb) {
			c.p0 = pb;
			/* one block: every thread reduces; several: the caller
			 * drives the fabric meanwhile */
			ret = fep_ep_fab(m, fep_ep_pool_run(comm->pool, pe - pb,
							    red_item_bytes(m),
							    pe - pb != np_all,
							    reduce_block, &c,
							    &c.idle));
			if (ret)
				goto fail;
		}
		t3 = fep_now_ns();
		m->tm.c_reduce += t3 - t2;
		for (d = 1; d < m->size; d++) {
			int peer = (m->rank + d) % m->size;
			size_t first = peer < m->rank ? s->tbase[peer]
						      : s->tbase[peer] - c.skip;
			size_t cnt = status ? 0 : s->rcount[peer];
			/* its units in [pb, np_all): the end of its run */
			size_t done = pb <= first ? cnt :
				      pb < first + cnt ? first + cnt - pb : 0;
			struct fep_ep_run r;

			if (s->crows[peer] && !status)
				continue;  /* posted as rows */
			r = (struct fep_ep_run){
				.peer = peer, .dst = fep_ep_cslot(m, b, m->rank),
				.stage = fep_ep_cstage(m, peer), .unit = m->crow_bytes,
				.hdr = m->chdr_rows, .count = cnt, .done = done,
				.per = m->cchunk_rows, .chunks = m->cchunks,
				.sig = fep_ep_cctr(m, b),
				.hsig = fep_ep_cctr(m, b), .hlast = 1,
				.hoff = m->choff,
			};

			np += fep_ep_ready_chunks(m->puts + np, &r, &m->posted[peer]);
		}
		/* the peers' copy is left to the next pool run's caller */
		ret = fep_ep_post(m, np, &m->tm.c_bytes, false);
		if (ret)
			goto fail;
		m->tm.c_put += fep_now_ns() - t3;
		if (!blk)
			break;
	}
	/* this rank's own tokens, while the caller drives the fabric */
	if (!status && s->rcount[m->rank]) {
		t3 = fep_now_ns();
		c.skip0 = 0;
		c.skip = s->tbase[m->rank];
		c.p0 = 0;
		c.fuse = fuse_setup(&c, out, ld_out, cb, cb_ctx);
		/* where the receivers copy (cma's combine), the peers' rows
		 * that came meanwhile are copied in by this progress, so that
		 * a rank that starts late fuses from its first claim; but only
		 * with one thread: with more, the run's own progress (the
		 * caller's, or every thread's channel) copies them beside the
		 * reduction, where this would copy them all on the caller
		 * while the other threads wait */
		ret = c.fuse && fep_pool_threads(comm->pool) == 1 ?
		      fep_ep_fab(m, fep_fabric_progress_all(fab)) : 0;
		if (ret)
			goto fail;
		ret = fep_ep_fab(m, fep_ep_pool_run(comm->pool, s->rcount[m->rank],
						    m->crow_bytes * (1 + (size_t)m->k),
						    1, reduce_block, &c, &c.idle));
		if (ret)
			goto fail;
		m->tm.c_own = fep_now_ns() - t3;
		m->tm.c_reduce += m->tm.c_own;
		m->cfused = m->tm.c_fused = c.nfused;
	}
	/* rows written from y: y is the caller's again once they have left,
	 * at once where the sender copies in the post */
	if (!status && nrows && rows_from_y(fab) && !fep_fab_sender_copies(fab)) {
		ret = fep_ep_fab(m, fep_fabric_reap_writes(fab));
		if (ret)
			goto fail;
	}
	if (status)
		return combine_recv(m, NULL, 0, NULL, NULL);
	return 0;
fail:
	fep_err("%s: %s", m->cfn, fabep_strerror(ret));
	return ret;
}

FEP_EXPORT int fabep_moe_combine_send(fabep_moe_t *m, const void *y,
				      size_t ld_y, unsigned flags)
{
	if (!m) {
		fep_err("fabep_moe_combine_send: NULL handle");
		return -EINVAL;
	}
	m->cfn = "fabep_moe_combine_send";
	return combine_send(m, y, ld_y, flags, 0, NULL, 0, NULL, NULL);
}

/* The final sum of the tokens the own run did not fuse. */
struct rest_ctx {
	const fep_k_topk_args_t *a;
	const struct fep_k_ops *ops;
	const uint8_t *fused;
};

static void sum_rest(void *arg, size_t t0, size_t t1)
{
	struct rest_ctx *c = arg;

	while (t0 < t1) {
		size_t e;

		if (c->fused[t0]) {
			t0++;
			continue;
		}
		for (e = t0 + 1; e < t1 && !c->fused[e]; e++)
			;
		c->ops->topk_sum(c->a, t0, e);
		t0 = e;
	}
}

/* Every run is the kind this rank asked for in the dispatch (rows or
 * partial rows); then, where some are rows, the final sum's lists. */
static int check_kinds(struct fabep_moe *m, int b, struct fep_ep_set *s)
{
	int r;

	for (r = 0; r < m->size; r++) {
		struct fep_ep_hdr h;

		memcpy(&h, fep_heap_at(m->comm->fab, fep_ep_chdr(m, b, r)), sizeof(h));
		if (!(h.flags & FEP_EP_HDR_ROWS) != !s->xrun[r]) {
			fep_err("%s: rank %d sent %s, this rank asked for %s", m->cfn,
				r, s->xrun[r] ? "partial rows" : "rows",
				s->xrun[r] ? "rows" : "partial rows");
			return -FABEP_ERR_PROTOCOL;
		}
	}
	if (s->nx && s->fin_cuse != s->cuses)  /* not built by peers_in */
		final_rows(m, b, s);
	return 0;
}

/* Every rank asked for the same weighting (FABEP_MOE_UNWEIGHTED): a
 * token's sum would otherwise mix the two.  Where ranks differ, every
 * rank has a peer that differs from it, so all fail alike. */
static int check_weighting(struct fabep_moe *m, int b)
{
	int r;

	for (r = 0; r < m->size; r++) {
		struct fep_ep_hdr h;

		memcpy(&h, fep_heap_at(m->comm->fab, fep_ep_chdr(m, b, r)), sizeof(h));
		if (!(h.flags & FEP_EP_HDR_UNWEIGHTED) != !m->cunw) {
			fep_err("%s: rank %d combined %s, this rank %s: "
				"FABEP_MOE_UNWEIGHTED must be the same on every rank",
				m->cfn, r, m->cunw ? "weighted" : "unweighted",
				m->cunw ? "unweighted" : "weighted");
			return -FABEP_ERR_MISMATCH;
		}
	}
	return 0;
}

static int combine_recv(struct fabep_moe *m, void *out, size_t ld_out,
			fabep_moe_row_fn cb, void *cb_ctx)
{
	struct fep_ep_set *s;
	uint64_t t0, t1;
	size_t fused;
	int b = 0, ret, refused = 0;

	if ((ret = fep_ep_usable(m, m->cfn)))
		return ret;
	if (!m->pending_crecv) {
		fep_err("%s: no combine_send to complete", m->cfn);
		return -EINVAL;
	}
	s = oldest(m, FEP_EP_CSENT, &b);
	if (!s) {
		/* pending_crecv promises a sent combine: the handle's state
		 * is broken */
		fep_err("%s: no combine was sent to complete (internal state)",
			m->cfn);
		return -FABEP_ERR_PROTOCOL;
	}
	m->pending_crecv = 0;
	fused = m->cfused;
	m->cfused = 0;
	if (s->n > fused)
		fep_pool_wake(m->comm->pool);  /* for the sum after the wait */
	t0 = fep_now_ns();
	ret = fep_ep_wait(m, m->cfn, fep_ep_cctr(m, b), comb_target(m, s),
			  fep_ep_chdr(m, b, 0), m->cslot_bytes, s->seq);
	if (!ret)
		ret = fep_ep_check_hdrs(m, m->cfn, fep_ep_chdr(m, b, 0),
					m->cslot_bytes, s->seq, s->cexp, s->status,
					NULL, NULL, &refused);
	if (!ret)
		ret = check_kinds(m, b, s);
	/* this rank's rows must have left before the caller computes (tcp) */
	if (!ret)
		ret = fep_ep_fab(m, fep_fabric_drain(m->comm->fab));
	if (!ret)
		ret = check_weighting(m, b);
	t1 = fep_now_ns();
	/* (a fused token's row is in out: its rows were all here, so only a
	 * fabric failure of the drain can still fail the call) */
	if (!ret && s->n > fused) {
		fep_k_topk_args_t a;

		fin_args(m, b, s, out, ld_out, cb, cb_ctx, &a);
		if (!fused) {
			ret = fep_k_topk_sum_mt(m->comm->pool, &a, s->n);
		} else {
			struct rest_ctx rc = { &a, fep_k_ops(), m->fused };

			ret = fep_pool_for(m->comm->pool, s->n, 1, sum_rest, &rc);
		}
	}
	m->tm.c_wait = t1 - t0;
	m->tm.c_sum = fep_now_ns() - t1;
	if (m->timing)
		fep_dbg("%s: call %llu: reduce %.1f (own run %.1f, "
			"%zu of %zu tokens summed there) put %.1f wait %.1f sum %.1f "
			"total %.1f us, %llu wire bytes",
			m->cfn, (unsigned long long)s->seq, m->tm.c_reduce / 1e3,
			m->tm.c_own / 1e3, fused, s->n, m->tm.c_put / 1e3, m->tm.c_wait / 1e3,
			m->tm.c_sum / 1e3, (fep_now_ns() - m->tm.c_begin) / 1e3,
			(unsigned long long)m->tm.c_bytes);
	/* A rank refused its arguments: nothing was combined, the dispatch
	 * stays received on every rank (the peers still hold its credit);
	 * a retry writes over this call's headers, so the next send half
	 * first settles (fep_ep_settle). */
	if (refused && !m->unclean) {
		s->state = FEP_EP_RECEIVED;
		m->settle = 1;
		return ret;
	}
	s->state = FEP_EP_FREE;
	return ret;
}

FEP_EXPORT int fabep_moe_combine_recv(fabep_moe_t *m, void *out, size_t ld_out,
				      fabep_moe_row_fn cb, void *cb_ctx)
{
	struct fep_ep_set *s;
	int b;

	if (!m) {
		fep_err("fabep_moe_combine_recv: NULL handle");
		return -EINVAL;
	}
	m->cfn = "fabep_moe_combine_recv";
	s = oldest(m, FEP_EP_CSENT, &b);
	if (s && !s->status && !out_ok(m, s->n, out, ld_out))
		return -EINVAL;
	return combine_recv(m, out, ld_out, cb, cb_ctx);
}

FEP_EXPORT int fabep_moe_combine(fabep_moe_t *m, const void *y, size_t ld_y,
				 unsigned flags, void *out, size_t ld_out,
				 fabep_moe_row_fn cb, void *cb_ctx)
{
	struct fep_ep_set *s;
	int b, ret, status = 0;

	if (!m) {
		fep_err("fabep_moe_combine: NULL handle");
		return -EINVAL;
	}
	m->cfn = "fabep_moe_combine";
	s = oldest(m, FEP_EP_RECEIVED, &b);
	if (s && !out_ok(m, s->n, out, ld_out))
		status = -EINVAL;
	/* a refused argument completes the exchange inside, so all agree */
	ret = combine_send(m, y, ld_y, flags, status, out, ld_out, cb, cb_ctx);
	if (ret)
		return ret;
	return combine_recv(m, out, ld_out, cb, cb_ctx);
}
