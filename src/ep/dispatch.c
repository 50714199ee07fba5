/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * dispatch.c - expert-parallel dispatch.
 *
 * Send: check the input (nothing leaves before the checks pass), count
 * tokens per destination rank (a token goes to a rank once however many
 * of its experts live there), then write each token's record (metadata
 * with global expert ids, scales, payload) once, into the set's input
 * slot: quantized to FP8 there if asked, copied from the caller's rows
 * unless the caller wrote them there itself (fabep_moe_send_buffer).
 * Every run to another rank leaves as chunks (FABEP_MOE_CHUNK) of
 * consecutive run records, each one write with its signal: straight from
 * the input slot when the chunk's tokens are consecutive, else from a
 * staged copy.  Tokens are packed a block at a time on the pool's
 * workers while the caller posts the finished chunks and drives the
 * fabric.  The own slot gets the metadata of the tokens routed here; their
 * rows stay in the input slot (self_pay).  A rank whose input is bad
 * still sends every peer a header with its error and no records.
 *
 * The headers (count, and rows per expert of the receiver) go on a
 * counter of their own, before any record is packed when the records
 * come to FEP_EP_EARLY_BYTES or more (else in one batch with them; a
 * small call's runs each as one write of header and records under
 * remote CQ data, whose header signal then stands for the records, up to
 * FEP_EP_EARLY_JOIN_BYTES).
 *
 * Receive: wait for the headers, check them (sequence, status, count
 * bounds), agree on the error of the lowest failing rank, lay out the
 * expert-major result from the announced rows per expert, and place and
 * copy this rank's own rows (here already) on the workers while the
 * caller drives the fabric; then wait for the records and place and copy
 * the peers' rows (gather kernel), each source's records checked against
 * its header.  With FABEP_MOE_ZERO_COPY only the index lists are built
 * (the rows stay in the slots).
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep.h"

struct pack_ctx {
	struct fabep_moe *m;
	const struct fep_k_ops *ops;
	int b;
	const int32_t *ids;
	const float *w;
	const uint8_t *x;       /* the caller's rows (in_elt values) */
	size_t ld_x;            /* bytes between them */
	int x_inplace;          /* x is the input slot's payload: no copy */
	const float *scales;    /* FP8_PREQUANT: the caller's scales */
	size_t ld_scales;       /* floats between rows */
	int sc_inplace;
	size_t t0;              /* first token of the block being packed */
	size_t te;              /* tokens [0, te) are packed */
	uint8_t *base;          /* set b's first slot (record index 0) */
	uint8_t *input;         /* set b's input slot records */
	int32_t *self_pay;      /* the set's self_pay */
	struct fep_ep_idle idle; /* drives the fabric while the workers pack */
	int32_t stamp;          /* the call's sequence number, low 32 bits */
};

static uint8_t *run_base(struct fabep_moe *m, int b, int d)
{
	fep_fabric_t *fab = m->comm->fab;

	if (d == m->rank)
		return fep_heap_at(fab, fep_ep_dslot(m, b, m->rank));
	return fep_heap_at(fab, fep_ep_dstage(m, b, d));
}

static inline uint8_t *rec_at(struct fabep_moe *m, int b, int d, uint32_t pos)
{
	return run_base(m, b, d) + (m->hdr_recs + (size_t)pos) * m->rec_bytes;
}

/* The metadata of token t: token index, the call's stamp (what names a
 * sender whose records never came), global expert ids, weights. */
static inline void put_meta(struct fabep_moe *m, const struct pack_ctx *c,
			    uint8_t *rec, int32_t t)
{
	((int32_t *)rec)[0] = t;
	((int32_t *)rec)[1] = c->stamp;
	memcpy(rec + 8, c->ids + (size_t)t * (size_t)m->k, 4 * (size_t)m->k);
	memcpy(rec + 8 + 4 * (size_t)m->k, c->w + (size_t)t * (size_t)m->k,
	       4 * (size_t)m->k);
}

/* Scales and payload of token t's input record. */
static inline void put_payload(struct fabep_moe *m, const struct pack_ctx *c,
			       uint8_t *rec, size_t t)
{
	if (m->cfg.token_type == FABEP_MOE_FP8) {
		fep_k_fp8_args_t a;

		memset(&a, 0, sizeof(a));
		a.in_dt = m->cfg.input_type == FABEP_MOE_FP32 ? FEP_K_F32 : FEP_K_BF16;
		a.ld_in = m->hidden;
		a.ld_out = m->hidden;
		a.ld_scales = m->nscale;
		a.cols = m->hidden;
		a.block = m->cfg.fp8_block;
		a.in = c->x + t * c->ld_x;
		a.out = rec + m->pay_off;
		a.scales = (float *)(rec + m->scale_off);
		c->ops->fp8_quant(&a, 0, 1);
		return;
	}
	if (c->scales && !c->sc_inplace)
		memcpy(rec + m->scale_off, c->scales + t * c->ld_scales, 4 * m->nscale);
	if (!c->x_inplace)
		memcpy(rec + m->pay_off, c->x + t * c->ld_x, m->row_bytes);
}

/* Whether chunk j (>= 1) of the run to d goes straight from the input slot. */
static inline int chunk_direct(const struct fabep_moe *m, int d, size_t j)
{
	return m->chunk_direct[(size_t)d * m->dchunks + j];
}

/* Tokens [t0, t1): the input record, the own slot's metadata if routed
 * here, and a staged copy of the record for each other destination whose
 * chunk is not consecutive in the input slot. */
static void pack_tokens(void *arg, size_t t0, size_t t1)
{
	struct pack_ctx *c = arg;
	struct fabep_moe *m = c->m;
	size_t kk = (size_t)m->kk, t, q;

	for (t = t0; t < t1; t++) {
		const int32_t *dt = m->dest + t * kk;
		const uint32_t *pos = (const uint32_t *)m->pack_pos + t * kk;
		uint8_t *in = c->input + t * m->rec_bytes;

		/* metadata always: a whole-range run may carry this record */
		put_meta(m, c, in, (int32_t)t);
		if (kk && dt[0] < 0)
			continue;  /* routed nowhere: no payload */
		put_payload(m, c, in, t);
		for (q = 0; q < kk && dt[q] >= 0; q++) {
			uint8_t *rec = rec_at(m, c->b, dt[q], pos[q]);

			if (dt[q] == m->rank) {
				put_meta(m, c, rec, (int32_t)t);
				c->self_pay[pos[q]] = (int32_t)((size_t)(in - c->base) /
								m->rec_bytes);
			} else if (!chunk_direct(m, dt[q], 1 + pos[q] / m->dchunk_recs)) {
				memcpy(rec, in, m->rec_bytes);
			}
		}
	}
}

/* pool range [r0, r1) of the block that starts at token c->t0 */
static void pack_block(void *arg, size_t r0, size_t r1)
{
	struct pack_ctx *c = arg;

	pack_tokens(c, c->t0 + r0, c->t0 + r1);
}

/* Local checks of dispatch_send's input: 0 or a negative code (logged). */
static int check_input(struct fabep_moe *m, const void *x, const float *scales,
		       size_t n, const int32_t *ids, const float *w)
{
	size_t i, nk;

	if (n > (size_t)m->cfg.max_tokens) {
		fep_err("%s: %zu tokens, more than max_tokens %d", m->dfn, n,
			m->cfg.max_tokens);
		return -EMSGSIZE;
	}
	if (!n)
		return 0;  /* nothing to route: ids, x and scales may be NULL */
	if (!ids) {
		if (!m->have_prev || m->prev_n != n) {
			fep_err("%s: topk_ids NULL (reuse the previous routing) but %s",
				m->dfn, m->have_prev ? "n differs from the previous "
				"call's" : "there was no previous dispatch");
			return -EINVAL;
		}
		ids = m->prev_ids;
	}
	if (!x) {
		fep_err("%s: NULL tokens", m->dfn);
		return -EINVAL;
	}
	if (m->cfg.token_type == FABEP_MOE_FP8_PREQUANT && !scales) {
		fep_err("%s: FP8_PREQUANT needs the scales", m->dfn);
		return -EINVAL;
	}
	nk = n * (size_t)m->k;
	for (i = 0; i < nk; i++)
		if (ids[i] < -1 || ids[i] >= m->cfg.num_experts) {
			fep_err("%s: token %zu: expert id %d not in [-1, %d)", m->dfn,
				i / (size_t)m->k, ids[i], m->cfg.num_experts);
			return -ERANGE;
		}
	/* a routed slot's weight scales its expert's row in combine: a
	 * NaN or an infinity there would spoil the token's output on its
	 * source alone, after every rank had gone through the call */
	if (w && ids != m->prev_ids)
		for (i = 0; i < nk; i++)
			if (ids[i] >= 0 && !isfinite(w[i])) {
				fep_err("%s: token %zu: the weight of expert %d is "
					"%g, not a finite number", m->dfn,
					i / (size_t)m->k, ids[i], (double)w[i]);
				return -EINVAL;
			}
	return 0;
}

/* Whether rank d's combine should send this rank's tokens back as their
 * rows (FEP_EP_HDR_ROWS): `rows` rows of `toks` tokens.  The rows must
 * fit the combine slot.  Automatically, where the expert rank writes them
 * from its y in the post itself (the sender's copies of shm's fast path,
 * y free once the send half returns) and they are at most 4/3 of the
 * partial rows: a token's experts mostly lie on different ranks (8 of
 * 256 experts on 16 ranks: about 1.24 rows a token), so reducing at the
 * expert rank saves fewer wire bytes than its pass over y and the stage
 * costs.  Not in a call of one token (n): its partial row is one write
 * that carries its signal, where rows take the sender's write and then
 * the header's, and at that size the operations cost more than the
 * bytes.  (Larger calls keep rows for their runs of one token too: an
 * expert rank that sends both kinds makes both passes.) */
static int rows_wanted(const struct fabep_moe *m, int d, uint64_t rows,
		       uint64_t toks, size_t n)
{
	const fep_fabric_t *fab = m->comm->fab;

	if (d == m->rank || !rows || rows > (uint64_t)m->cfg.max_tokens ||
	    m->crows_mode < 0)
		return 0;
	if (m->crows_mode > 0)
		return 1;
	return fep_fab_ptr_ok(fab) && fep_fab_sender_copies(fab) &&
	       n > 1 && 3 * rows <= 4 * toks;
}

/* Where each (token, k) comes back in combine when its rank sends rows:
 * per rank d, rows by local expert, then by token (records go in token
 * order), then by k, as dispatch_recv places them at d. */
static void route_rows(struct fabep_moe *m, struct fep_ep_set *s,
		       const int32_t *ids, size_t n)
{
	size_t k = (size_t)m->k, L = (size_t)m->L, t, j;
	uint32_t *xb = m->rcur;  /* [size * L]: next row per expert (scratch
				  * here: dispatch_recv sets it later) */
	int d;

	s->nx = 0;
	for (d = 0; d < m->size; d++) {
		uint64_t rows = 0;
		uint32_t pos = 0;
		size_t e;

		for (e = 0; e < L; e++)
			rows += m->ecnt[(size_t)d * L + e];
		s->xrun[d] = (uint8_t)rows_wanted(m, d, rows, s->sent[d], n);
		s->nx += s->xrun[d];
		s->cexp[d] = m->drows[d] = (uint32_t)rows;
		for (e = 0; e < L; e++) {
			xb[(size_t)d * L + e] = pos;
			pos += m->ecnt[(size_t)d * L + e];
		}
	}
	for (t = 0; t < n; t++)
		for (j = 0; j < k; j++) {
			int32_t e = ids[t * k + j];

			s->xw[t * k + j] = m->prev_w[t * k + j];
			d = e < 0 ? -1 : e / m->L;
			s->xidx[t * k + j] = d < 0 || !s->xrun[d] ? -1 :
				(int32_t)((size_t)d * m->cslot_rows + m->chdr_rows +
					  xb[e]++);
		}
}

/* Count per destination, order each destination's tokens, and record
 * where each token's partial rows (or its rows) will come back in
 * combine. */
static void route(struct fabep_moe *m, struct fep_ep_set *s, const int32_t *ids,
		  size_t n)
{
	int R = m->size, k = m->k, kk = m->kk, d;
	uint32_t *cursor = m->cursor;
	size_t t, max;

	memset(s->sent, 0, (size_t)R * sizeof(uint32_t));
	for (t = 0; t < n; t++) {
		int32_t *dt = m->dest + t * (size_t)kk;
		int nd = 0, j, q;

		for (j = 0; j < k; j++) {
			int32_t e = ids[t * (size_t)k + (size_t)j];

			if (e < 0)
				continue;
			d = e / m->L;
			for (q = 0; q < nd && dt[q] != d; q++)
				;
			if (q == nd) {
				dt[nd++] = d;
				s->sent[d]++;
			}
		}
		for (; nd < kk; nd++)
			dt[nd] = -1;
	}
	/* rows per expert (destination d's local expert le is e = d * L + le):
	 * the headers announce them, so receivers place rows before the
	 * records arrive */
	memset(m->ecnt, 0, (size_t)m->cfg.num_experts * sizeof(uint32_t));
	for (t = 0; t < n * (size_t)k; t++)
		if (ids[t] >= 0)
			m->ecnt[ids[t]]++;
	route_rows(m, s, ids, n);
	/* A run to another rank that holds nearly every token of its range
	 * [first, last] (at most 1/16 more records) is that whole range of
	 * the input slot: it leaves in place, and the receiver skips the
	 * records without an expert of its own. */
	for (d = 0; d < R; d++) {
		m->run_first[d] = -1;
		cursor[d] = 0;           /* here: last token + 1 */
	}
	for (t = 0; t < n * (size_t)kk; t++) {
		d = m->dest[t];
		if (d < 0)
			continue;
		if (m->run_first[d] < 0)
			m->run_first[d] = (int32_t)(t / (size_t)kk);
		cursor[d] = (uint32_t)(t / (size_t)kk) + 1;
	}
	for (d = 0; d < R; d++) {
		uint32_t span = cursor[d] - (uint32_t)m->run_first[d];

		if (d == m->rank || m->run_first[d] < 0 ||
		    span - s->sent[d] > s->sent[d] / 16) {
			m->run_first[d] = -1;
			continue;
		}
		s->sent[d] = span;
	}
	m->pack_base[0] = 0;
	for (d = 0; d < R; d++)
		m->pack_base[d + 1] = m->pack_base[d] + s->sent[d];
	for (d = 0; d < R; d++)
		if (m->run_first[d] >= 0)
			for (t = 0; t < s->sent[d]; t++)
				m->pack_tok[m->pack_base[d] + t] = m->run_first[d] + (int32_t)t;
	memset(cursor, 0, (size_t)R * sizeof(uint32_t));
	for (t = 0; t < n; t++) {
		int q;

		for (q = 0; q < kk; q++) {
			int32_t dd = m->dest[t * (size_t)kk + (size_t)q];
			uint32_t pos;

			if (dd < 0) {
				s->ret_idx[t * (size_t)kk + (size_t)q] = -1;
				continue;
			}
			if (m->run_first[dd] >= 0) {
				pos = (uint32_t)((int32_t)t - m->run_first[dd]);
				cursor[dd]++;
			} else {
				pos = cursor[dd]++;
				m->pack_tok[m->pack_base[dd] + pos] = (int32_t)t;
			}
			m->pack_pos[t * (size_t)kk + (size_t)q] = (int32_t)pos;
			s->ret_idx[t * (size_t)kk + (size_t)q] =
				(int32_t)((size_t)dd * m->cslot_rows + m->chdr_rows + pos);
		}
	}
	for (d = 0; d < R; d++)
		if (!s->xrun[d])
			s->cexp[d] = s->sent[d];
	/* the partial row of (t, j): at the first j of its rank */
	for (t = 0; s->nx && t < n; t++) {
		const int32_t *dt = m->dest + t * (size_t)kk;
		int j, q;

		for (j = 0; j < k; j++) {
			int32_t e = ids[t * (size_t)k + (size_t)j], jj;

			s->pidx[t * (size_t)k + (size_t)j] = -1;
			if (e < 0)
				continue;
			for (jj = 0; jj < j; jj++) {
				int32_t f = ids[t * (size_t)k + (size_t)jj];

				if (f >= 0 && f / m->L == e / m->L)
					break;
			}
			for (q = 0; q < kk && dt[q] != e / m->L; q++)
				;
			if (jj == j && q < kk)
				s->pidx[t * (size_t)k + (size_t)j] =
					s->ret_idx[t * (size_t)kk + (size_t)q];
		}
	}
	/* a chunk goes straight from the input slot when its tokens are
	 * one range of consecutive records there, or, where the fabric
	 * gathers (m->gather), ranges that fill at most m->gather_writes
	 * writes */
	max = m->gather ? m->gather_writes * m->comm->fab->iov_max : 1;
	for (d = 0; d < R; d++) {
		const int32_t *tok = m->pack_tok + m->pack_base[d];
		size_t j, b;

		for (j = 1; j < m->dchunks; j++) {
			size_t r0 = (j - 1) * m->dchunk_recs;
			size_t r1 = FEP_MIN(r0 + m->dchunk_recs, (size_t)s->sent[d]);
			size_t ranges = 0;

			for (b = r0; b < r1 && ranges <= max;
			     b = fep_ep_range_end(tok, b, r1))
				ranges++;
			m->chunk_direct[(size_t)d * m->dchunks + j] = ranges <= max;
		}
	}
}

/* Append to m->puts (from index at) the finished chunks of the run to peer. */
static size_t ready_chunks(struct fabep_moe *m, const struct pack_ctx *c,
			   const struct fep_ep_set *s, int peer, struct fep_put *out)
{
	struct fep_ep_run r;

	memset(&r, 0, sizeof(r));
	r.peer = peer;
	r.dst = fep_ep_dslot(m, c->b, m->rank);
	r.stage = fep_ep_dstage(m, c->b, peer);
	r.unit = m->rec_bytes;
	r.hdr = m->hdr_recs;
	r.count = s->sent[peer];
	r.done = m->cursor[peer];
	if (m->run_first[peer] >= 0)  /* a whole range: done up to te */
		r.done = c->te > (size_t)m->run_first[peer] ?
			FEP_MIN(c->te - (size_t)m->run_first[peer], r.count) : 0;
	r.per = m->dchunk_recs;
	/* a placed dispatch's header leaves alone: where its records go
	 * is known once every header is in (place_send) */
	r.chunks = m->placing && !m->posted[peer] ? 1 : m->dchunks;
	r.sig = fep_ep_dctr(m, c->b);
	r.hlen = m->dcounts ? m->dhdr_bytes : m->dhdr_short;
	r.hoff = m->dcounts ? m->dhoff - m->dcnt_bytes : m->dhoff;
	r.hsig = fep_ep_hctr(m, c->b);
	/* r.hlast 0: headers go first, on their own counter, often early */
	r.merge = m->dmerge;
	/* each merged run one write, where every write is its own signal */
	r.join = m->dmerge && !fep_fab_signals_after_writes(m->comm->fab);
	r.direct = m->chunk_direct + (size_t)peer * m->dchunks;
	r.tok = m->pack_tok + m->pack_base[peer];
	r.input = fep_ep_dinput(m, c->b);
	return fep_ep_ready_chunks(out, &r, &m->posted[peer]);
}

/* Post the finished chunks of every run to another rank (c->te tokens
 * packed). */
static int post_ready(struct fabep_moe *m, const struct pack_ctx *c,
		      const struct fep_ep_set *s)
{
	size_t np = 0;
	int d;

	for (d = 1; d < m->size; d++)
		np += ready_chunks(m, c, s, (m->rank + d) % m->size, m->puts + np);
	return fep_ep_post(m, np, &m->tm.d_bytes, true);
}

static int dispatch_recv(struct fabep_moe *m, fabep_moe_recv_t *out);

/* The set the next dispatch takes, or a refusal of the call order that
 * sends nothing (logged): an unusable handle, a pending receive half,
 * every set still holding a dispatch. */
static int send_admit(struct fabep_moe *m, int *bp)
{
	int ret, b;

	if ((ret = fep_ep_usable(m, m->dfn)))
		return ret;
	if (m->pending_recv || m->pending_crecv) {
		fep_err("%s: the previous %s_send awaits its %s_recv", m->dfn,
			m->pending_recv ? "dispatch" : "combine",
			m->pending_recv ? "dispatch" : "combine");
		return -EINVAL;
	}
	b = m->dnext;
	if (m->set[b].state != FEP_EP_FREE) {
		fep_err("%s: all %d buffer sets hold dispatches not yet combined "
			"(combine the oldest first)", m->dfn, m->sets);
		return -FABEP_ERR_BUSY;
	}
	*bp = b;
	return fep_ep_settle_owed(m, m->dfn);
}

/* The kept routing and the one set aside trade places. */
static void swap_routing(struct fabep_moe *m)
{
	int32_t *ti = m->old_ids;
	float *tw = m->old_w;
	size_t tn = m->old_n;
	int th = m->old_have;

	m->old_ids = m->prev_ids, m->prev_ids = ti;
	m->old_w = m->prev_w, m->prev_w = tw;
	m->old_n = m->prev_n, m->prev_n = tn;
	m->old_have = m->have_prev, m->have_prev = th;
}

/* Keep a call's routing for topk_ids NULL (ids NULL: the previous one,
 * already there; n == 0: the empty routing), the one it replaces aside
 * until the call is accepted (settle_routing). */
static void keep_routing(struct fabep_moe *m, size_t n, const int32_t *ids,
			 const float *w)
{
	size_t i;

	if (!ids && n)
		return;
	swap_routing(m);
	m->kept_pending = 1;
	if (n)
		memcpy(m->prev_ids, ids, n * (size_t)m->k * sizeof(int32_t));
	if (n && w)
		memcpy(m->prev_w, w, n * (size_t)m->k * sizeof(float));
	else
		for (i = 0; i < n * (size_t)m->k; i++)
			m->prev_w[i] = 1.0f;
	m->prev_n = n;
	m->have_prev = 1;
}

/* The call's routing stays the previous one where it was accepted, the
 * one before it comes back where the ranks refused the call. */
static void settle_routing(struct fabep_moe *m, bool accepted)
{
	if (m->kept_pending && !accepted)
		swap_routing(m);
	m->kept_pending = 0;
}

/* The packing context of set b: the kept routing, the input slot, and
 * whether the caller's rows (scales) are already there. */
static void pack_ctx_init(struct fabep_moe *m, struct pack_ctx *c, int b,
			  const void *x, const float *scales)
{
	fep_fabric_t *fab = m->comm->fab;
	struct fep_ep_set *s = &m->set[b];

	memset(c, 0, sizeof(*c));
	c->m = m;
	c->ops = fep_k_ops();
	c->b = b;
	c->ids = m->prev_ids;
	c->w = m->prev_w;
	c->idle.fab = fab;
	c->stamp = (int32_t)(uint32_t)s->seq;
	c->base = fep_heap_at(fab, fep_ep_dslot(m, b, 0));
	c->input = fep_heap_at(fab, fep_ep_dinput(m, b)) + m->hdr_recs * m->rec_bytes;
	c->self_pay = s->self_pay;
	c->x = x;
	c->ld_x = m->hidden * m->in_elt;
	if (m->cfg.token_type != FABEP_MOE_FP8 && x == c->input + m->pay_off) {
		c->x_inplace = 1;  /* the caller wrote its rows into the input slot */
		c->ld_x = m->rec_bytes;
	}
	if (m->cfg.token_type == FABEP_MOE_FP8_PREQUANT) {
		c->scales = scales;
		c->ld_scales = m->nscale;
		if ((const void *)scales == c->input + m->scale_off) {
			c->sc_inplace = 1;
			c->ld_scales = m->rec_bytes / 4;
		}
	}
}

static int fep_ep_merge(const struct fabep_moe *m, size_t n);

/* The index in k of the first of a token's experts (ids) on rank d, or
 * -1: its row is where a placed dispatch writes the token's row at d
 * (place_send), and the one d copies it from to the token's further
 * rows there (place), also those of the same expert again. */
static int first_of(const struct fabep_moe *m, const int32_t *ids, int d)
{
	int j;

	for (j = 0; j < m->k; j++)
		if (ids[j] >= 0 && ids[j] / m->L == d)
			return j;
	return -1;
}

/* Whether a placed run of rows (token, expert) pairs in records tokens
 * goes as each token's row once, at its first expert of the receiver
 * (first_of), for the receiver to copy to the token's further experts
 * there, rather than as every row: where it has more than FEP_EP_ONCE /
 * 3 rows a record.  The sender's copies (process_vm_writev under the
 * target's lock) are slower per byte than the receiver's copy, but each
 * row the receiver copies is read and written once more where it lands:
 * at 8 ranks with top-8 (about 1.5 rows a record) once, at 16 (1.24)
 * every row. */
static int place_once(uint64_t rows, uint64_t records)
{
	return 3 * rows > FEP_EP_ONCE * records;
}

/* Whether this rank's run to d may be placed: where the receiver would
 * copy every row of the records, a placed run's rows it copies none of,
 * or only a token's further rows (place_once).  Automatically not a run
 * of more than FEP_EP_PLACE_MAX / 2 rows a record: the receiver still
 * copies most rows, and the sender writes the others one by one, where
 * records leave in a few writes.  Top-8 of 256, dispatch of 128 tokens
 * placed against records: 2 ranks (4 rows a record) a fifth to a third
 * slower; 4 ranks (2.2) at best level with bf16 rows (in some runs
 * three to four times slower), a fifth to a quarter slower with FP8;
 * 8 ranks (1.5) a fifth faster with bf16, level with FP8; 16 ranks
 * (1.24) faster with either. */
static int place_wanted(const struct fabep_moe *m, const struct fep_ep_set *s,
			int d)
{
	if (d == m->rank || !s->sent[d])
		return 0;
	if (m->place_mode > 0)
		return 1;
	return 2 * (uint64_t)m->drows[d] <= FEP_EP_PLACE_MAX * (uint64_t)s->sent[d];
}

/* Route the call (a refused one: no tokens anywhere) and write every
 * run's header: sequence, status, count, rows per expert of its rank. */
static void write_headers(struct fabep_moe *m, int b, struct fep_ep_set *s,
			  size_t n, int status)
{
	int d, p;

	if (!status) {
		route(m, s, m->prev_ids, n);
		for (d = 0, p = 0; m->placing && d < m->size; d++)
			p += m->pdest[d] = (uint8_t)place_wanted(m, s, d);
		/* a call whose tokens all stay here has nothing to place
		 * and no reason to wait for every header */
		if (m->placing && !p) {
			m->placing = 0;
			m->dmerge = fep_ep_merge(m, n);
		}
	} else {
		memset(s->sent, 0, (size_t)m->size * sizeof(uint32_t));
		memset(m->ecnt, 0, (size_t)m->cfg.num_experts * sizeof(uint32_t));
		memset(s->xrun, 0, (size_t)m->size);
		memset(s->cexp, 0, (size_t)m->size * sizeof(uint32_t));
		s->nx = 0;
		for (d = 0; d < m->size; d++)
			m->run_first[d] = -1;
	}
	for (d = 0; d < m->size; d++) {
		uint8_t *h = run_base(m, b, d) + m->dhoff;
		uint32_t chunks = m->dmerge ? 0 : (uint32_t)(m->dchunks - 1);
		uint32_t fl = (s->xrun[d] ? FEP_EP_HDR_ROWS : 0) |
			      (m->placing ? FEP_EP_HDR_PLACE : 0) |
			      (m->dcounts ? FEP_EP_HDR_COUNTS : 0);

		fep_ep_hdr_write(h, s->seq, status, s->sent[d]);
		memcpy(h + offsetof(struct fep_ep_hdr, chunks), &chunks, 4);
		memcpy(h + offsetof(struct fep_ep_hdr, flags), &fl, 4);
		memcpy(h + FEP_EP_HDR, m->ecnt + (size_t)d * (size_t)m->L,
		       4 * (size_t)m->L);
		if (m->dcounts)  /* every rank's: each receiver's layout */
			memcpy(h - m->dcnt_bytes, m->ecnt,
			       4 * (size_t)m->cfg.num_experts);
	}
}

/* Whether each run of n tokens would be one write with its header
 * (remote CQ data, fep_fab_joins; never where signals follow writes). */
static bool runs_join(const struct fabep_moe *m, size_t n)
{
	return fep_fab_joins(m->comm->fab, 2,
			     (m->hdr_recs + n) * m->rec_bytes);
}

/* Whether the headers of n tokens leave before the records: from
 * FEP_EP_EARLY_BYTES of records, or FEP_EP_EARLY_JOIN_BYTES where the runs
 * would otherwise each be one write with their header (join, runs_join):
 * there an early header costs every peer a write of its own, more than
 * the layout it lets the receivers start. */
static int early(const struct fabep_moe *m, size_t n, bool join)
{
	size_t bytes = n * m->rec_bytes;

	return bytes >= FEP_EP_EARLY_BYTES &&
	       (bytes >= FEP_EP_EARLY_JOIN_BYTES || !join);
}

/* Whether a send of n tokens leaves in one batch with one signal per peer:
 * headers not early, one block (every chunk of every run complete when
 * the batch is posted), and either a strategy whose signal is an
 * operation posted after the batch's writes (ordered after them, or
 * after their completion), or each run in one write (remote CQ data,
 * where every write is its own signal: the header and the records, from
 * the staging or from one range of the input slot, runs_join): the
 * header's signal then stands for the records too, and the header says
 * so (chunks 0). */
static int fep_ep_merge(const struct fabep_moe *m, size_t n)
{
	bool join = runs_join(m, n);

	return !early(m, n, join) && n <= m->dchunk_recs &&
	       (join || fep_fab_signals_after_writes(m->comm->fab));
}

/* Pack the n tokens a block at a time on the workers (the caller drives
 * the fabric meanwhile) and post every chunk as soon as it is complete;
 * the headers first when there is packing to overlap.  0 or the pool's
 * or the fabric's error. */
static int pack_and_post(struct fabep_moe *m, struct pack_ctx *c,
			 const struct fep_ep_set *s, size_t n)
{
	uint64_t t2, t3, tp = 0;
	size_t tb, te;
	int d, ret;

	/* the headers leave first when there is packing to overlap:
	 * receivers lay out their rows (and copy their own) while the
	 * records are packed and move; else with the records, one batch */
	memset(m->cursor, 0, (size_t)m->size * sizeof(uint32_t)); /* records done */
	for (d = 0; d < m->size; d++)
		m->posted[d] = 0;
	if ((!m->dmerge && early(m, n, runs_join(m, n))) || m->placing) {
		c->te = 0;
		ret = post_ready(m, c, s);
		if (ret)
			return ret;
	}
	for (tb = 0;; tb = te) {
		size_t i;

		te = FEP_MIN(n, tb + m->dchunk_recs);
		t2 = fep_now_ns();
		if (te > tb) {
			c->t0 = tb;
			/* one block: every thread packs; several: the caller
			 * drives the fabric meanwhile (the peers' chunks move) */
			ret = fep_ep_fab(m, fep_ep_pool_run(m->comm->pool, te - tb,
							    m->row_bytes * (size_t)m->kk,
							    te - tb != n, pack_block,
							    c, &c->idle));
			if (ret)
				return ret;
			for (i = tb * (size_t)m->kk; i < te * (size_t)m->kk; i++)
				if (m->dest[i] >= 0)
					m->cursor[m->dest[i]]++;
		}
		t3 = fep_now_ns();
		tp += t3 - t2;
		c->te = te;
		/* the peers' copy is left to the next block's pool run, or
		 * to dispatch_recv, where it overlaps the copy of this
		 * rank's own rows; a placed dispatch's records wait for
		 * every header (place_send) */
		ret = m->placing ? 0 : post_ready(m, c, s);
		if (ret)
			return ret;
		m->tm.d_put += fep_now_ns() - t3;
		if (te == n)
			break;
	}
	m->tm.d_pack = tp;
	return 0;
}

/* Wait for set b's headers and check them, once per call: in a placed
 * dispatch's send half, else in dispatch_recv (the check adds the
 * records' signals to their target, which must happen once).  The
 * results stay in s until dispatch_recv takes them. */
static void take_hdrs(struct fabep_moe *m, int b, struct fep_ep_set *s)
{
	if (s->hdone)
		return;
	s->hdone = 1;
	s->hchk = s->hrefused = 0;
	s->hret = fep_ep_wait(m, m->dfn, fep_ep_hctr(m, b),
			      (uint64_t)(m->size - 1) * s->uses,
			      fep_ep_dhdr(m, b, 0), m->dslot_bytes, s->seq);
	if (!s->hret)
		s->hchk = fep_ep_check_hdrs(m, m->dfn, fep_ep_dhdr(m, b, 0),
					    m->dslot_bytes, s->seq, NULL, s->status,
					    s->rcount, &s->dexp, &s->hrefused);
}

/* The send half of a placed dispatch, after its headers left and its
 * records were packed: wait for every rank's headers, which hold every
 * rank's rows per expert, so that this rank knows each receiver's
 * expert-major layout (by expert, then source, then token, as
 * build_begin lays it out) and where its own rows go in it; then write
 * each token's row once to a receiver, at the place of its first
 * expert there (first_of), from the input slot, with the records'
 * metadata behind a mark in this rank's slot and the signals the header
 * announced, one batch.  The receiver then copies a token's row only to
 * its further experts there (place), where records it copies to every
 * one.  A receiver
 * whose rows exceed its placed region, or whose rows would take more
 * writes than this rank's share of its queue (m->gather_writes), gets the
 * records as always; so does every receiver where a header is refused
 * or bad (dispatch_recv reports it). */
static int place_send(struct fabep_moe *m, struct pack_ctx *c, int b,
		      struct fep_ep_set *s)
{
	fep_fabric_t *fab = m->comm->fab;
	const uint8_t *hb = fep_heap_at(fab, fep_ep_dhdr(m, b, 0));
	size_t L = (size_t)m->L, E = (size_t)m->cfg.num_experts, k = (size_t)m->k;
	size_t np = 0, i, e, iov = FEP_MAX(fab->iov_max, (size_t)1);
	uint64_t in = fep_ep_dinput(m, b) + m->hdr_recs * m->rec_bytes;
	uint64_t cap = (uint64_t)m->cfg.max_tokens * k;
	uint64_t t0 = fep_now_ns(), t1;
	int d, src, ok, ret;

	take_hdrs(m, b, s);
	m->tm.d_hwait = fep_now_ns() - t0;
	if (s->hret)
		return s->hret;
	/* pcol: every rank's rows per expert; pnext first the rows of the
	 * ranks before this one */
	memset(m->pcol, 0, E * sizeof(uint64_t));
	memset(m->pnext, 0, E * sizeof(uint64_t));
	ok = !s->hchk;
	for (src = 0; ok && src < m->size; src++) {
		const uint8_t *hd = hb + (size_t)src * m->dslot_bytes;
		const uint8_t *h = hd - m->dcnt_bytes;  /* every rank's counts */
		uint32_t fl;

		/* a rank whose call could not place sent no counts: without
		 * every receiver's layout every run goes as records */
		memcpy(&fl, hd + offsetof(struct fep_ep_hdr, flags), 4);
		ok = !!(fl & FEP_EP_HDR_COUNTS);
		for (e = 0; ok && e < E; e++) {
			uint32_t v;

			memcpy(&v, h + 4 * e, 4);
			ok = v <= cap;  /* a bad count: build_begin reports it */
			m->pcol[e] += v;
			if (src < m->rank)
				m->pnext[e] += v;
		}
	}
	/* m->pdest: the runs write_headers found worth placing, of those
	 * the ones that fit */
	for (d = 0; d < m->size; d++) {
		uint64_t tot = 0, writes = 0, at = 0;

		for (e = 0; ok && m->pdest[d] && e < L; e++) {
			tot += m->pcol[(size_t)d * L + e];
			writes += (m->ecnt[(size_t)d * L + e] + iov - 1) / iov;
		}
		if (!ok || !m->pdest[d] || tot > m->place_rows ||
		    writes > m->gather_writes) {
			m->pdest[d] = 0;
			continue;
		}
		for (e = 0; e < L; e++) {
			size_t x = (size_t)d * L + e;

			m->pnext[x] += at;  /* this rank's first row */
			at += m->pcol[x];
		}
	}
	for (d = 0; d < m->size; d++) {
		const int32_t *tok = m->pack_tok + m->pack_base[d];
		uint8_t *st;
		int32_t mark[3] = { FEP_EP_PLACED_MARK, c->stamp, 0 };

		if (d == m->rank)
			continue;
		if (!m->pdest[d]) {
			np += ready_chunks(m, c, s, d, m->pputs + np);
			continue;
		}
		/* every row, or each token's row once, at the place of its
		 * first expert of d (in k order; place_once): each put at its
		 * place in the list, by expert then row, so that puts to one
		 * (destination, expert)'s range are next to each other and
		 * consecutive ones leave as gathered writes */
		mark[2] = place_once(m->drows[d], s->sent[d]);
		if (mark[2]) {
			for (e = 0; e < L; e++)
				m->pput[(size_t)d * L + e] = 0;
			for (i = 0; i < s->sent[d]; i++) {
				const int32_t *ids = c->ids + (size_t)tok[i] * k;
				int j = first_of(m, ids, d);

				if (j >= 0)
					m->pput[ids[j]]++;
			}
		} else {
			for (e = 0; e < L; e++)
				m->pput[(size_t)d * L + e] = m->ecnt[(size_t)d * L + e];
		}
		for (e = 0; e < L; e++) {
			size_t x = (size_t)d * L + e, cnt = m->pput[x];

			m->pput[x] = np;
			np += cnt;
		}
		for (i = 0; i < s->sent[d]; i++) {
			size_t t = (size_t)tok[i], j;
			/* once: only the row at the token's first expert here */
			int j1 = mark[2] ? first_of(m, c->ids + t * k, d) : -1;

			for (j = 0; j < k; j++) {
				int32_t g = c->ids[t * k + j];
				struct fep_put *p;
				uint64_t at;

				if (g < 0 || g / m->L != d)
					continue;
				at = m->pnext[g]++;  /* every row takes its place */
				if (mark[2] && (int)j != j1)
					continue;
				p = &m->pputs[m->pput[g]++];
				p->peer = d;
				p->dst = fep_ep_dplace(m, b) + at * m->row_bytes;
				p->src = in + t * m->rec_bytes + m->pay_off;
				p->len = m->row_bytes;
				p->sig = 0;
				p->add = 0;
				p->ptr = NULL;
			}
		}
		/* the metadata behind the mark, staged */
		st = fep_heap_at(fab, fep_ep_dstage(m, b, d)) + m->hdr_recs * m->rec_bytes;
		memset(st, 0, m->pmeta_bytes);
		memcpy(st, mark, sizeof(mark));
		for (i = 0; i < s->sent[d]; i++)
			memcpy(st + (1 + i) * m->pmeta_bytes,
			       c->input + (size_t)tok[i] * m->rec_bytes, m->pmeta_bytes);
		m->pputs[np].peer = d;
		m->pputs[np].dst = fep_ep_dslot(m, b, m->rank) + m->hdr_recs * m->rec_bytes;
		m->pputs[np].src = fep_ep_dstage(m, b, d) + m->hdr_recs * m->rec_bytes;
		m->pputs[np].len = (1 + (size_t)s->sent[d]) * m->pmeta_bytes;
		m->pputs[np].sig = fep_ep_dctr(m, b);
		m->pputs[np].add = m->dchunks - 1;
		m->pputs[np].ptr = NULL;
		np++;
	}
	t1 = fep_now_ns();
	ret = fep_ep_copy(m, m->pputs, np, &m->tm.d_bytes);
	m->tm.d_put += fep_now_ns() - t1;
	return ret;
}

/* A send refused for its input (status: the caller's, else the checks')
 * still takes part in the exchange: every peer gets a header with the
 * error and no records, and the receive half runs here at once, so the
 * refusing rank owes no dispatch_recv and every rank returns the agreed
 * code with its handle ready for the next call. */
static int dispatch_send(struct fabep_moe *m, const void *x, const float *scales,
			 size_t n, const int32_t *ids, const float *w, int status)
{
	struct fep_ep_set *s;
	struct pack_ctx c;
	uint64_t t0, t1;
	int b, ret;

	if ((ret = send_admit(m, &b)))
		return ret;
	s = &m->set[b];
	m->tm.d_begin = fep_now_ns();
	fep_pool_wake(m->comm->pool);  /* they wake while the sends drain */
	/* the send runs of the previous call must have left (wire time)
	 * before their staging is packed again; its signals need not be
	 * acknowledged: waiting for those would wait for every peer to
	 * progress, i.e. to enter this call */
	t0 = fep_now_ns();
	ret = fep_ep_fab(m, fep_fabric_reap_writes(m->comm->fab));
	if (ret)
		return ret;
	t1 = fep_now_ns();
	if (!status)
		status = check_input(m, x, scales, n, ids, w);
	if (status)
		n = 0;
	else
		keep_routing(m, n, ids, w);
	/* from here on the call counts: every rank advances the same way */
	m->ndisp++;
	m->dlast = b;
	m->dnext = (b + 1) % m->sets;
	s->seq = m->ndisp;
	s->uses++;
	s->state = FEP_EP_SENT;
	s->status = status;
	s->n = n;
	m->pending_recv = 1;

	pack_ctx_init(m, &c, b, x, scales);
	s->self_n = 0;
	s->hdone = 0;
	/* rows placed where every header is awaited anyway (early), or
	 * always where asked; not by itself where ranks outnumber the
	 * CPUs: a placed source writes nothing before every header is in,
	 * so it waits for the ranks that are not running, where records
	 * leave at once (4 ranks on 2 CPUs: a third to a half slower) */
	m->placing = !status && n && m->place_rows &&
		     fep_fab_signals_after_writes(m->comm->fab) &&
		     (m->place_mode > 0 || (early(m, n, runs_join(m, n)) &&
					    !m->crowded));
	/* every rank's counts in the headers of a call that may place, and
	 * of an empty one (an idle rank must not keep the others from
	 * placing); not in a small call's, which then fit inline */
	m->dcounts = m->placing || (!status && !n && m->place_rows);
	m->dmerge = !m->placing && fep_ep_merge(m, n);
	write_headers(m, b, s, n, status);  /* placing: only if worth it */
	m->tm.d_put = t1 - t0;
	m->tm.d_bytes = 0;
	m->tm.d_wait = m->tm.d_build = m->tm.d_hwait = 0;
	t0 = fep_now_ns();  /* the checks and the routing count as packing */
	ret = pack_and_post(m, &c, s, n);
	m->tm.d_pack += t0 - t1;
	if (!ret && m->placing)
		ret = place_send(m, &c, b, s);
	if (ret) {
		fep_err("%s: %s", m->dfn, fabep_strerror(ret));
		return ret;
	}
	if (status)  /* the refusal owes nothing: its receive half now */
		return dispatch_recv(m, NULL);
	s->self_n = s->sent[m->rank];
	return 0;
}

FEP_EXPORT int fabep_moe_send_buffer(fabep_moe_t *m, void **x, size_t *stride,
				     float **scales, size_t *scale_stride)
{
	uint8_t *in;
	int b, ret;

	if (!m) {
		fep_err("fabep_moe_send_buffer: NULL handle");
		return -EINVAL;
	}
	if ((ret = fep_ep_usable(m, "fabep_moe_send_buffer")))
		return ret;
	if (m->cfg.token_type == FABEP_MOE_FP8) {
		fep_err("fabep_moe_send_buffer: token_type FP8 quantizes the "
			"caller's rows during dispatch: there is no send buffer");
		return -ENOTSUP;
	}
	b = m->dnext;
	if (m->set[b].state != FEP_EP_FREE) {
		fep_err("fabep_moe_send_buffer: all %d buffer sets hold dispatches "
			"not yet combined", m->sets);
		return -FABEP_ERR_BUSY;
	}
	in = (uint8_t *)fep_heap_at(m->comm->fab, fep_ep_dinput(m, b)) +
	     m->hdr_recs * m->rec_bytes;
	if (x)
		*x = in + m->pay_off;
	if (stride)
		*stride = m->rec_bytes;
	if (scales)
		*scales = m->nscale ? (float *)(in + m->scale_off) : NULL;
	if (scale_stride)
		*scale_stride = m->nscale ? m->rec_bytes / 4 : 0;
	return 0;
}

FEP_EXPORT int fabep_moe_dispatch_send(fabep_moe_t *m, const void *x,
				       const float *scales, size_t n,
				       const int32_t *topk_ids,
				       const float *topk_weights)
{
	if (!m) {
		fep_err("fabep_moe_dispatch_send: NULL handle");
		return -EINVAL;
	}
	m->dfn = "fabep_moe_dispatch_send";
	return dispatch_send(m, x, scales, n, topk_ids, topk_weights, 0);
}

#define PLACE_AHEAD 4

/* The records of source src: check each (token index, expert ids), give
 * every (token, k) with an expert of this rank its row (the next of its
 * (source, expert) block), and check the rows of each expert against
 * what the source's header announced.  Where a placed source wrote each
 * token's row once, at its first expert's row (first_of), the gather
 * index of the token's further rows is that row (build_end copies
 * them), of the first -1. */
static int place(struct fabep_moe *m, struct fep_ep_set *s, const uint8_t *base,
		 int src)
{
	/* a placed source's records are metadata (and FP8 scales) only,
	 * behind its mark */
	size_t stride = s->placed[src] ? m->pmeta_bytes : m->rec_bytes;
	size_t meta = s->placed[src] ? m->pmeta_bytes : m->meta_bytes;
	const uint8_t *recs = base + (size_t)src * m->dslot_bytes +
			      m->hdr_recs * m->rec_bytes +
			      (s->placed[src] ? m->pmeta_bytes : 0);
	/* a placed FP8 row's scales, from its record (copy mode) */
	float *sc = s->placed[src] && m->fp8 ? s->scales : NULL;
	uint32_t *cur = m->rcur + (size_t)src * (size_t)m->L;
	const uint32_t *end = m->rend + (size_t)src * (size_t)m->L;
	int once = s->placed[src] == 2;
	/* copy mode, rows not in place: the copies as pairs, in the
	 * records' order (gather_blocks) */
	int pairs = !m->zcopy && !s->placed[src];
	uint32_t p = m->pbase[src];
	size_t k = (size_t)m->k, i;
	int e, j;

	for (i = 0; i < s->rcount[src]; i++) {
		const uint8_t *rec = recs + i * stride;
		size_t tok = s->tbase[src] + i;
		int32_t t, le, first = -1;
		float w;

		/* the records are a row apart, too far for the hardware's
		 * prefetchers: their metadata a few records ahead */
		if (i + PLACE_AHEAD < s->rcount[src]) {
			const uint8_t *ahead = rec + PLACE_AHEAD * stride;

			__builtin_prefetch(ahead);
			__builtin_prefetch(ahead + meta - 1);
		}
		memcpy(&t, rec, 4);
		if (t < 0 || t >= m->cfg.max_tokens) {
			fep_err("%s: rank %d sent token index %d", m->dfn, src, t);
			return -FABEP_ERR_PROTOCOL;
		}
		for (j = 0; j < m->k; j++) {
			uint32_t r;

			memcpy(&le, rec + 8 + 4 * (size_t)j, 4);
			if (le < -1 || le >= m->cfg.num_experts) {
				fep_err("%s: rank %d sent expert %d", m->dfn, src, le);
				return -FABEP_ERR_PROTOCOL;
			}
			le -= m->rank * m->L;
			if (le < 0 || le >= m->L) {  /* none, or another rank's */
				s->cidx[tok * k + (size_t)j] = -1;
				s->cw[tok * k + (size_t)j] = 0;
				continue;
			}
			if (cur[le] == end[le]) {
				fep_err("%s: rank %d sent more rows for "
					"expert %d than its header announced", m->dfn, src,
					m->rank * m->L + le);
				return -FABEP_ERR_PROTOCOL;
			}
			memcpy(&w, rec + 8 + 4 * k + 4 * (size_t)j, 4);
			r = cur[le]++;
			if (once) {  /* -1: in place; else the row to copy */
				s->gidx[r] = first;
				if (first < 0)
					first = (int32_t)r;
			} else {
				int32_t g = src == m->rank && i < s->self_n ? s->self_pay[i] :
					(int32_t)((size_t)src * m->dslot_recs + m->hdr_recs + i);

				if (pairs) {
					s->psrc[p] = g;
					s->pdst[p++] = (int32_t)r;
				} else if (m->zcopy)
					s->gidx[r] = g;
			}
			if (sc)
				memcpy(sc + (size_t)r * m->nscale, rec + m->scale_off,
				       4 * m->nscale);
			s->src_info[3 * (size_t)r] = src;
			s->src_info[3 * (size_t)r + 1] = t;
			s->src_info[3 * (size_t)r + 2] = j;
			s->weights[r] = w;
			s->cidx[tok * k + (size_t)j] = (int32_t)r;
			s->cw[tok * k + (size_t)j] = w;
		}
	}
	for (e = 0; e < m->L; e++)
		if (cur[e] != end[e]) {
			fep_err("%s: rank %d sent %u rows fewer for "
				"expert %d than its header announced", m->dfn, src,
				end[e] - cur[e], m->rank * m->L + e);
			return -FABEP_ERR_PROTOCOL;
		}
	return 0;
}

/* Copy the rows of the nb blocks of pairs (psrc, pdst) in m->blk_start /
 * m->blk_pre into the expert-major result (rows and FP8 scales), each
 * record's row read once for all its experts; idle: drive the fabric on
 * the caller meanwhile. */
static int gather_blocks(struct fabep_moe *m, struct fep_ep_set *s,
			 const uint8_t *base, size_t nb, struct fep_ep_idle *idle)
{
	fep_k_perm_args_t a;
	int ret;

	if (!nb)
		return 0;  /* no rows (s->x may not exist) */
	memset(&a, 0, sizeof(a));
	a.src = base + m->pay_off;
	a.src_stride = m->rec_bytes;
	a.dst = s->xo;
	a.dst_stride = m->row_bytes;
	a.row_bytes = m->row_bytes;
	a.idx = s->psrc;
	a.didx = s->pdst;
	/* one streaming decision for the whole result */
	a.nt = s->rows * m->row_bytes >= FEP_K_NT_BYTES ? 1 : -1;
	ret = fep_k_gather_blocks_mt(m->comm->pool, &a, m->blk_start, m->blk_pre,
				     nb, idle ? fep_ep_idle : NULL, idle);
	if (!ret && m->fp8) {
		a.src = base + m->scale_off;
		a.dst = s->scales;
		a.dst_stride = 4 * m->nscale;
		a.row_bytes = 4 * m->nscale;
		a.nt = -1;
		ret = fep_k_gather_blocks_mt(m->comm->pool, &a, m->blk_start,
					     m->blk_pre, nb, NULL, NULL);
	}
	if (!ret && idle)
		ret = idle->err;
	return ret;
}

/* Append the rows [r0, r1) to the block list start / pre (merged with
 * the last). */
static void add_blk(uint32_t *start, uint32_t *pre, size_t *nb, uint32_t r0,
		    uint32_t r1)
{
	if (r1 <= r0)
		return;
	if (*nb && start[*nb - 1] + (pre[*nb] - pre[*nb - 1]) == r0) {
		pre[*nb] += r1 - r0;
		return;
	}
	start[*nb] = r0;
	pre[*nb + 1] = pre[*nb] + (r1 - r0);
	(*nb)++;
}

static void add_block(struct fabep_moe *m, size_t *nb, uint32_t r0, uint32_t r1)
{
	add_blk(m->blk_start, m->blk_pre, nb, r0, r1);
}

/* After the headers: lay out the expert-major result from the rows each
 * source announced per expert (ordered by expert, then source, then
 * token), then place and copy this rank's own rows, which are here
 * already, while the caller drives the fabric (the peers' records move). */
static int build_begin(struct fabep_moe *m, int b, struct fep_ep_set *s)
{
	fep_fabric_t *fab = m->comm->fab;
	const uint8_t *base = fep_heap_at(fab, fep_ep_dslot(m, b, 0));
	const uint8_t *hb = base + m->dhoff;
	size_t L = (size_t)m->L, rows = 0, nb = 0;
	struct fep_ep_idle idle = { fab, 0 };
	int src, e, ret;

	s->tbase[0] = 0;
	for (src = 0; src < m->size; src++)
		s->tbase[src + 1] = s->tbase[src] + s->rcount[src];
	s->rtokens = s->tbase[m->size];
	memset(s->counts, 0, L * sizeof(uint32_t));
	for (src = 0; src < m->size; src++) {
		const uint8_t *h = hb + (size_t)src * m->dslot_bytes + FEP_EP_HDR;
		uint32_t *cnt = m->rend + (size_t)src * L;
		uint64_t sum = 0;
		uint32_t fl;

		memcpy(cnt, h, 4 * L);
		memcpy(&fl, h - FEP_EP_HDR + offsetof(struct fep_ep_hdr, flags), 4);
		for (e = 0; e < m->L; e++)
			sum += cnt[e];
		if (sum > (uint64_t)s->rcount[src] * (uint64_t)m->k) {
			fep_err("%s: rank %d announced %llu rows for "
				"%u tokens of top-%d", m->dfn, src, (unsigned long long)sum,
				s->rcount[src], m->k);
			return -FABEP_ERR_PROTOCOL;
		}
		/* every rank's rows per expert (placed dispatch): its
		 * counts for this rank's experts must be those above */
		if ((fl & FEP_EP_HDR_COUNTS) && m->place_rows &&
		    memcmp(h - FEP_EP_HDR - m->dcnt_bytes + 4 * L * (size_t)m->rank,
			   h, 4 * L)) {
			fep_err("%s: rank %d announced other rows for this rank's "
				"experts in its counts for every rank", m->dfn, src);
			return -FABEP_ERR_PROTOCOL;
		}
		s->placed[src] = (fl & FEP_EP_HDR_PLACE) && src != m->rank;
		/* its combine as rows: they must fit its combine slot */
		s->crows[src] = (fl & FEP_EP_HDR_ROWS) && src != m->rank;
		if (s->crows[src] && sum > (uint64_t)m->cfg.max_tokens) {
			fep_err("%s: rank %d asked for %llu rows back, above "
				"max_tokens %d", m->dfn, src, (unsigned long long)sum,
				m->cfg.max_tokens);
			return -FABEP_ERR_PROTOCOL;
		}
		for (e = 0; e < m->L; e++)
			s->counts[e] += cnt[e];
		m->pbase[src] = (uint32_t)rows;
		rows += sum;
		/* row indices are int32_t */
		if (rows > INT32_MAX) {
			fep_err("%s: %zu rows received", m->dfn, rows);
			return -FABEP_ERR_PROTOCOL;
		}
	}
	m->pbase[m->size] = (uint32_t)rows;
	ret = fep_ep_set_reserve(m, s, rows);
	if (ret)
		return ret;
	s->rows = rows;
	/* sources that may place their rows place them in the set's
	 * placed region where all of them fit (place_send): the result is
	 * there then, this rank's own rows and the records' copied to it */
	s->xo = s->x;
	if (rows <= m->place_rows && memchr(s->placed, 1, (size_t)m->size))
		s->xo = fep_heap_at(fab, fep_ep_dplace(m, b));
	else
		memset(s->placed, 0, (size_t)m->size);
	s->row_offsets[0] = 0;
	for (e = 0; e < m->L; e++) {
		uint32_t pos = s->row_offsets[e];

		s->row_offsets[e + 1] = pos + s->counts[e];
		for (src = 0; src < m->size; src++) {
			size_t i = (size_t)src * L + (size_t)e;

			m->rcur[i] = pos;
			pos += m->rend[i];
			m->rend[i] = pos;
		}
	}
	if (m->zcopy)
		return 0;  /* rows stay in the slots; own placed in the wait */
	ret = place(m, s, base, m->rank);
	if (ret)
		return ret;
	m->blk_pre[0] = 0;
	add_block(m, &nb, m->pbase[m->rank], m->pbase[m->rank + 1]);
	return gather_blocks(m, s, base, nb, &idle);
}

struct place_ctx {
	struct fabep_moe *m;
	struct fep_ep_set *s;
	const uint8_t *base;
	int *ret;               /* per source (place_range) */
};

/* pool range of sources: each writes only its own rows and tokens */
static void place_range(void *arg, size_t r0, size_t r1)
{
	struct place_ctx *c = arg;
	size_t src;

	for (src = r0; src < r1; src++)
		c->ret[src] = src == (size_t)c->m->rank ? 0 :
			place(c->m, c->s, c->base, (int)src);
}

/* zero-copy: this rank's own records, placed on the caller while the
 * other threads progress the channels (the records' wait) */
static int place_own(void *arg)
{
	struct place_ctx *c = arg;

	return place(c->m, c->s, c->base, c->m->rank);
}

/* The rows of the sources that wrote each token's row once (place_once):
 * each further row of a token copied from its first (place), on the
 * workers. */
static int copy_once(struct fabep_moe *m, struct fep_ep_set *s)
{
	fep_k_perm_args_t a;
	size_t L = (size_t)m->L, nb = 0, e;
	uint32_t r;
	int src;

	m->dup_pre[0] = 0;
	for (src = 0; src < m->size; src++) {
		if (s->placed[src] != 2)
			continue;
		for (e = 0; e < L; e++)
			for (r = src ? m->rend[(size_t)(src - 1) * L + e] : s->row_offsets[e];
			     r < m->rend[(size_t)src * L + e]; r++)
				if (s->gidx[r] >= 0)
					add_blk(m->dup_start, m->dup_pre, &nb, r, r + 1);
	}
	if (!nb)
		return 0;
	memset(&a, 0, sizeof(a));
	a.src = a.dst = s->xo;
	a.src_stride = a.dst_stride = a.row_bytes = m->row_bytes;
	a.idx = s->gidx;
	a.nt = s->rows * m->row_bytes >= FEP_K_NT_BYTES ? 1 : -1;
	return fep_k_gather_blocks_mt(m->comm->pool, &a, m->dup_start, m->dup_pre, nb,
				      NULL, NULL);
}

/* Whether source src's record area opens with this call's placed mark:
 * its rows are in place, its records metadata only; 2 where it wrote
 * each token's row once (place_once), 1 every row, 0 no mark. */
static int placed_mark(const struct fabep_moe *m, const struct fep_ep_set *s,
		       const uint8_t *base, int src)
{
	int32_t mark[3];

	memcpy(mark, base + (size_t)src * m->dslot_bytes + m->hdr_recs * m->rec_bytes,
	       sizeof(mark));
	if (mark[0] != FEP_EP_PLACED_MARK || mark[1] != (int32_t)(uint32_t)s->seq)
		return 0;
	return mark[2] ? 2 : 1;
}

/* After the records: place the peers' rows (the sources side by side on
 * the workers), then copy them. */
static int build_end(struct fabep_moe *m, int b, struct fep_ep_set *s)
{
	const uint8_t *base = fep_heap_at(m->comm->fab, fep_ep_dslot(m, b, 0));
	struct place_ctx c = { m, s, base, m->place_ret };
	size_t nb = 0, i;
	int src, ret = 0;

	for (src = 0; src < m->size; src++)
		if (s->placed[src])
			s->placed[src] = placed_mark(m, s, base, src);
	if (m->size > 2)  /* several peers: worth the workers */
		ret = fep_pool_for(m->comm->pool, (size_t)m->size, 1, place_range, &c);
	else
		place_range(&c, 0, (size_t)m->size);
	for (src = 0; !ret && src < m->size; src++)
		ret = m->place_ret[src];  /* the lowest source's error */
	if (ret)
		return ret;
	if (m->zcopy)
		return 0;  /* gidx is row_index */
	ret = copy_once(m, s);
	if (ret)
		return ret;
	if (s->ident_rows < s->rows) {
		for (i = s->ident_rows; i < s->rows; i++)
			s->row_index[i] = (int32_t)i;
		s->ident_rows = s->rows;
	}
	m->blk_pre[0] = 0;
	for (src = 0; src < m->size; src++)
		if (src != m->rank && !s->placed[src])
			add_block(m, &nb, m->pbase[src], m->pbase[src + 1]);
	return gather_blocks(m, s, base, nb, NULL);
}

/* After the records' wait timed out: name the senders whose records are
 * not all in (the last record of each of their chunks lacks this call's
 * stamp).  Diagnosis only: arrival is what the counter says. */
static void name_missing(struct fabep_moe *m, int b, const struct fep_ep_set *s)
{
	const uint8_t *base = fep_heap_at(m->comm->fab, fep_ep_dslot(m, b, 0));
	char names[256];
	size_t len = 0, j;
	int src, missing = 0;

	names[0] = '\0';
	for (src = 0; src < m->size; src++) {
		const uint8_t *recs = base + (size_t)src * m->dslot_bytes +
				      m->hdr_recs * m->rec_bytes;
		int bad = 0;

		if (src == m->rank || (s->placed[src] && placed_mark(m, s, base, src)))
			continue;
		for (j = 0; j * m->dchunk_recs < s->rcount[src] && !bad; j++) {
			size_t last = FEP_MIN((j + 1) * m->dchunk_recs,
					      (size_t)s->rcount[src]) - 1;
			int32_t st;

			memcpy(&st, recs + last * m->rec_bytes + 4, 4);
			bad = st != (int32_t)(uint32_t)s->seq;
		}
		if (bad && len < sizeof(names) - 16) {
			missing++;
			len += (size_t)snprintf(names + len, sizeof(names) - len,
						"%s%d", missing > 1 ? ", " : "", src);
		}
	}
	if (missing)
		fep_err("%s: the records of rank%s %s never came "
			"(their headers did)", m->dfn, missing > 1 ? "s" : "", names);
}

static int dispatch_recv(struct fabep_moe *m, fabep_moe_recv_t *out)
{
	struct fep_ep_set *s;
	uint64_t t0, t1, t2, t3;
	int b, ret, hret, refused = 0;

	if ((ret = fep_ep_usable(m, m->dfn)))
		return ret;
	if (!m->pending_recv) {
		fep_err("%s: no dispatch_send to complete", m->dfn);
		return -EINVAL;
	}
	b = m->dlast;
	s = &m->set[b];
	m->pending_recv = 0;
	memset(s->crows, 0, (size_t)m->size);
	memset(s->placed, 0, (size_t)m->size);
	fep_pool_wake(m->comm->pool);  /* for the layout after the wait */
	/* the headers, then this rank's own rows, then the records */
	t0 = fep_now_ns();
	take_hdrs(m, b, s);  /* unless a placed send half did */
	hret = ret = s->hret;
	if (!ret)
		ret = s->hchk;
	refused = s->hrefused;
	s->hdone = 0;
	t1 = fep_now_ns();
	if (!ret)
		ret = build_begin(m, b, s);
	t2 = fep_now_ns();
	if (!hret) {  /* wait for the records even after an error: drained */
		struct place_ctx o = {
			m, s, fep_heap_at(m->comm->fab, fep_ep_dslot(m, b, 0)), NULL
		};
		int dret = fep_ep_wait_with(m, m->dfn, fep_ep_dctr(m, b),
					    s->dexp, UINT64_MAX, 0, s->seq,
					    m->zcopy && !ret ? place_own : NULL, &o);

		if (dret == -ETIMEDOUT && !ret)
			name_missing(m, b, s);
		if (!ret)
			ret = dret;
	}
	/* this rank's runs must have left before the caller computes (tcp) */
	if (!ret)
		ret = fep_ep_fab(m, fep_fabric_drain(m->comm->fab));
	t3 = fep_now_ns();
	if (!ret)
		ret = build_end(m, b, s);
	m->tm.d_wait = m->tm.d_hwait + (t1 - t0) + (t3 - t2);
	m->tm.d_build = (t2 - t1) + (fep_now_ns() - t3);
	if (m->timing)
		fep_dbg("%s: call %llu: pack %.1f put %.1f wait %.1f (headers "
			"%.1f) build %.1f total %.1f us, %llu wire bytes, %zu rows%s",
			m->dfn, (unsigned long long)s->seq, m->tm.d_pack / 1e3,
			m->tm.d_put / 1e3, m->tm.d_wait / 1e3, m->tm.d_hwait / 1e3,
			m->tm.d_build / 1e3,
			(fep_now_ns() - m->tm.d_begin) / 1e3,
			(unsigned long long)m->tm.d_bytes, s->rows,
			m->zcopy ? " (zero-copy)" : "");
	if (ret) {
		/* A refused call's set serves the next dispatch (the retry,
		 * whatever the other sets hold) once every rank has read its
		 * headers and drained its records: a peer's next dispatch into
		 * it may start as soon as that peer has agreed too. */
		if (refused && !m->unclean) {
			m->dnext = b;
			m->settle = 1;
		}
		/* a failure of this rank alone (host memory for the result,
		 * the pool): the peers' calls went on, and they will wait
		 * for this rank's combine.  A peer's broken records
		 * (-FABEP_ERR_PROTOCOL) are that peer's failure, reported as
		 * such (fabep_moe(3)). */
		if (!refused && ret != -FABEP_ERR_PROTOCOL && !m->unclean) {
			fep_err("%s: failed on this rank alone: the other ranks "
				"received this dispatch, so the handle is unusable "
				"(destroy it)", m->dfn);
			m->unclean = 1;
		}
		settle_routing(m, !refused);
		s->state = FEP_EP_FREE;
		return ret;
	}
	settle_routing(m, true);
	s->state = FEP_EP_RECEIVED;
	if (out) {
		const uint8_t *base = fep_heap_at(m->comm->fab, fep_ep_dslot(m, b, 0));
		fabep_moe_recv_t r, *user = out;

		/* built here, written up to the caller's size (checked) */
		out = &r;
		memset(out, 0, sizeof(*out));
		out->rows = s->rows;
		out->local_experts = m->L;
		out->first_expert = m->rank * m->L;
		out->scales_per_row = m->nscale;
		if (m->zcopy) {
			out->x = base + m->pay_off;
			out->row_stride = m->rec_bytes;
			out->scales = m->fp8 ? (const float *)(base + m->scale_off) : NULL;
			out->scale_stride = m->fp8 ? m->rec_bytes / 4 : 0;
			out->row_index = s->gidx;
		} else {
			out->x = s->xo;
			out->row_stride = m->row_bytes;
			out->scales = m->fp8 ? s->scales : NULL;
			out->scale_stride = m->fp8 ? m->nscale : 0;
			out->row_index = s->row_index;
		}
		out->row_offsets = s->row_offsets;
		out->expert_ids = s->expert_ids;
		out->expert_counts = s->counts;
		out->src_info = s->src_info;
		out->weights = s->weights;
		fep_struct_out(user, user->size, out, sizeof(*out));
	}
	return 0;
}

FEP_EXPORT int fabep_moe_dispatch_recv(fabep_moe_t *m, fabep_moe_recv_t *out)
{
	size_t size;
	int ret;

	if (!m || !out) {
		fep_err("fabep_moe_dispatch_recv: NULL %s", !m ? "handle" : "output");
		return -EINVAL;
	}
	ret = fep_struct_out_size("fabep_moe_dispatch_recv", "fabep_moe_recv_t",
				  out, FEP_MOE_RECV_SIZE0, &size);
	if (ret)
		return ret;
	m->dfn = "fabep_moe_dispatch_recv";
	return dispatch_recv(m, out);
}

FEP_EXPORT int fabep_moe_dispatch(fabep_moe_t *m, const void *x,
				  const float *scales, size_t n,
				  const int32_t *topk_ids, const float *topk_weights,
				  fabep_moe_recv_t *out)
{
	size_t size;
	int ret, status = 0;

	if (!m) {
		fep_err("fabep_moe_dispatch: NULL handle");
		return -EINVAL;
	}
	m->dfn = "fabep_moe_dispatch";
	if (!out) {
		fep_err("fabep_moe_dispatch: NULL output");
		status = -EINVAL;
	} else {
		status = fep_struct_out_size("fabep_moe_dispatch", "fabep_moe_recv_t",
					     out, FEP_MOE_RECV_SIZE0, &size);
	}
	/* a refused input completes the exchange inside, so all agree */
	ret = dispatch_send(m, x, scales, n, topk_ids, topk_weights, status);
	if (ret)
		return ret;
	return dispatch_recv(m, out);
}
