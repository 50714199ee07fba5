/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * layout.c - the MoE handle: configuration checks and agreement, the heap
 * layout of its slots and counters, per-set output buffers, and the
 * header checks both phases share.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep.h"

FEP_EXPORT void fabep_moe_config_init(fabep_moe_config_t *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
	cfg->token_type = FABEP_MOE_BF16;
	cfg->input_type = FABEP_MOE_BF16;
	cfg->combine_type = FABEP_MOE_BF16;
	cfg->buffer_sets = 2;
}

static size_t type_size(fabep_moe_type_t t)
{
	switch (t) {
	case FABEP_MOE_FP32: return 4;
	case FABEP_MOE_BF16: return 2;
	case FABEP_MOE_FP8:
	case FABEP_MOE_FP8_PREQUANT: return 1;
	}
	return 0;
}

/* A choice of three from the environment: 0 where name is unset, empty
 * or "auto", -1 for "never" or "0", 1 for `on` or "1"; anything else is
 * -EINVAL (logged unless quiet). */
static int env_mode(const char *name, const char *on, int quiet, int *mode)
{
	const char *v = NULL;

	fep_env_str(name, &v);
	if (!v || !*v || !strcmp(v, "auto"))
		*mode = 0;
	else if (!strcmp(v, "never") || !strcmp(v, "0"))
		*mode = -1;
	else if (!strcmp(v, on) || !strcmp(v, "1"))
		*mode = 1;
	else {
		if (!quiet)
			fep_err("fabep_moe: %s is %s (auto, %s or never)", name, v, on);
		return -EINVAL;
	}
	return 0;
}

/* Validate and fill the geometry of m from cfg and nranks. */
static int ep_geometry(struct fabep_moe *m, const fabep_moe_config_t *c,
		       int nranks, int quiet)
{
#define BAD(...) do { if (!quiet) fep_err(__VA_ARGS__); return -EINVAL; } while (0)
	size_t hdr;

	if (nranks < 1)
		BAD("fabep_moe: %d ranks", nranks);
	if (c->num_experts < 1 || c->num_experts % nranks)
		BAD("fabep_moe: num_experts %d is not a positive multiple of the "
		    "%d ranks", c->num_experts, nranks);
	if (c->top_k < 1 || c->top_k > FABEP_MOE_MAX_TOPK)
		BAD("fabep_moe: top_k %d not in [1, %d]", c->top_k, FABEP_MOE_MAX_TOPK);
	/* a token's experts are distinct in any router's top-k */
	if (c->top_k > c->num_experts)
		BAD("fabep_moe: top_k %d above num_experts %d", c->top_k,
		    c->num_experts);
	if (c->hidden < 1 || c->hidden > (1u << 24))
		BAD("fabep_moe: hidden %zu not in [1, 2^24]", c->hidden);
	/* 0 is what fabep_moe_config_init leaves: a size never set */
	if (c->max_tokens < 1 || c->max_tokens > (1 << 24))
		BAD("fabep_moe: max_tokens %d not in [1, 2^24]", c->max_tokens);
	if (c->token_type < FABEP_MOE_FP32 || c->token_type > FABEP_MOE_FP8_PREQUANT)
		BAD("fabep_moe: token_type %d unknown", (int)c->token_type);
	if (c->token_type == FABEP_MOE_FP8 && c->input_type != FABEP_MOE_FP32 &&
	    c->input_type != FABEP_MOE_BF16)
		BAD("fabep_moe: FP8 tokens need input_type FP32 or BF16");
	/* read only with FP8 tokens, but never a value outside the enum */
	if (c->input_type < FABEP_MOE_FP32 || c->input_type > FABEP_MOE_FP8_PREQUANT)
		BAD("fabep_moe: input_type %d unknown", (int)c->input_type);
	if (c->combine_type != FABEP_MOE_FP32 && c->combine_type != FABEP_MOE_BF16)
		BAD("fabep_moe: combine_type must be FP32 or BF16");
	if (c->fp8_block < 0 || c->fp8_block % 16 ||
	    (size_t)c->fp8_block > c->hidden + 15)
		BAD("fabep_moe: fp8_block %d is not 0 or a multiple of 16 up to the "
		    "hidden size", c->fp8_block);
	if (c->buffer_sets < 0 || c->buffer_sets > 16)
		BAD("fabep_moe: buffer_sets %d not in [0, 16]", c->buffer_sets);
	if (c->flags & ~FABEP_MOE_ZERO_COPY)
		BAD("fabep_moe: unknown flags 0x%x", c->flags);
	m->cfg = *c;
	if (!m->cfg.buffer_sets)
		m->cfg.buffer_sets = 2;
	m->size = nranks;
	m->sets = m->cfg.buffer_sets;
	m->L = c->num_experts / nranks;
	m->k = c->top_k;
	m->kk = FEP_MIN(c->top_k, nranks);
	m->hidden = c->hidden;
	m->fp8 = c->token_type == FABEP_MOE_FP8 || c->token_type == FABEP_MOE_FP8_PREQUANT;
	m->zcopy = !!(c->flags & FABEP_MOE_ZERO_COPY);
	m->elt = type_size(c->token_type);
	m->in_elt = c->token_type == FABEP_MOE_FP8 ? type_size(c->input_type) : m->elt;
	m->row_bytes = m->hidden * m->elt;
	m->nscale = !m->fp8 ? 0 : c->fp8_block ?
		(m->hidden + (size_t)c->fp8_block - 1) / (size_t)c->fp8_block : 1;
	m->cdt = c->combine_type == FABEP_MOE_FP32 ? FEP_K_F32 : FEP_K_BF16;
	m->crow_bytes = m->hidden * (c->combine_type == FABEP_MOE_FP32 ? 4 : 2);

	m->meta_bytes = 8 + 8 * (size_t)m->k;
	m->scale_off = m->meta_bytes;
	m->pay_off = FEP_ALIGN_UP(m->scale_off + 4 * m->nscale, 16);
	m->pmeta_bytes = m->scale_off + 4 * m->nscale;
	m->rec_bytes = FEP_ALIGN_UP(m->pay_off + m->row_bytes, 16);
	/* the combine slot stride must be whole rows (one index space) */
	m->chdr_rows = (FEP_EP_HDR + m->crow_bytes - 1) / m->crow_bytes;
	m->cslot_rows = m->chdr_rows + (size_t)c->max_tokens;
	hdr = m->cslot_rows * m->crow_bytes;
	while (hdr % 64) {  /* keep slots 64-byte aligned: pad whole rows */
		m->cslot_rows++;
		hdr += m->crow_bytes;
	}
	m->cslot_bytes = hdr;
	m->choff = (m->chdr_rows * m->crow_bytes - FEP_EP_HDR) & ~(size_t)7;
	{
		size_t v = FEP_MOE_CHUNK_DEFAULT;

		if (fep_env_size("FABEP_MOE_CHUNK", 0, (size_t)1 << 40, &v) < 0) {
			if (!quiet)
				fep_err("fabep_moe: FABEP_MOE_CHUNK is not a size");
			return -EINVAL;
		}
		m->chunk_bytes = v;
	}
	if (env_mode("FABEP_MOE_PLACE", "always", quiet, &m->place_mode))
		return -EINVAL;
	/* the placed region holds twice a rank's rows of a balanced call
	 * (max_tokens * top_k), or all a rank can get if that is less; a
	 * call with more rows at a rank is not placed there.  Not for
	 * zero-copy (the rows stay in the slots).  FP8 rows' scales travel
	 * with the metadata (pmeta_bytes), not placed: a write of a row's
	 * few scales would cost what a row's write costs. */
	m->place_rows = 0;
	/* a placed run's metadata, the mark and a record's each, must fit
	 * the records' part of its slot, at least max_tokens records (not
	 * so for rows of a few values) */
	if (m->place_mode >= 0 && !m->zcopy && nranks > 1 &&
	    (1 + (size_t)c->max_tokens) * m->pmeta_bytes <=
	    (size_t)c->max_tokens * m->rec_bytes)
		m->place_rows = FEP_MIN((size_t)nranks * (size_t)c->max_tokens *
					(size_t)FEP_MIN(m->k, m->L),
					2 * (size_t)c->max_tokens * (size_t)m->k);
	m->dhdr_short = FEP_ALIGN_UP(FEP_EP_HDR + 4 * (size_t)m->L, 64);
	m->dcnt_bytes = m->place_rows ?
		FEP_ALIGN_UP(4 * (size_t)c->num_experts, 64) : 0;
	m->dhdr_bytes = m->dhdr_short + m->dcnt_bytes;
	m->hdr_recs = (m->dhdr_bytes + m->rec_bytes - 1) / m->rec_bytes;
	/* at least dcnt_bytes before it: dhdr_bytes fit, dcnt_bytes is
	 * a multiple of 64 */
	m->dhoff = (m->hdr_recs * m->rec_bytes - m->dhdr_short) & ~(size_t)63;
	/* the slot stride must be whole records (one gather index space) */
	m->dslot_recs = m->hdr_recs + (size_t)c->max_tokens;
	while ((m->dslot_recs * m->rec_bytes) % 64)
		m->dslot_recs++;
	m->dslot_bytes = m->dslot_recs * m->rec_bytes;
	if (env_mode("FABEP_MOE_COMBINE_ROWS", "fit", quiet, &m->crows_mode))
		return -EINVAL;
	if (env_mode("FABEP_MOE_LANES", "always", quiet, &m->lanes_mode))
		return -EINVAL;
	/* chunk 0 of a run is its header, then the records (rows) */
	m->dchunk_recs = m->chunk_bytes ?
		FEP_MAX((size_t)1, m->chunk_bytes / m->rec_bytes) :
		FEP_MAX((size_t)1, (size_t)c->max_tokens);
	m->dchunks = 1 + ((size_t)c->max_tokens + m->dchunk_recs - 1) / m->dchunk_recs;
	m->cchunk_rows = m->chunk_bytes ?
		FEP_MAX((size_t)1, m->chunk_bytes / m->crow_bytes) :
		FEP_MAX((size_t)1, (size_t)c->max_tokens);
	m->cchunks = 1 + ((size_t)c->max_tokens + m->cchunk_rows - 1) / m->cchunk_rows;
	if ((double)(2 * nranks) * (double)m->dslot_recs >= 2147483647.0 ||
	    (double)m->sets * (2 * nranks) * (double)m->dslot_bytes >= 1e18 ||
	    (double)nranks * (double)m->cslot_rows >= 2147483647.0 ||
	    (double)m->place_rows >= 2147483647.0)
		BAD("fabep_moe: max_tokens %d too large for %d ranks", c->max_tokens,
		    nranks);
	return 0;
#undef BAD
}

/* Heap bytes, in allocation order, each 64-aligned. */
static size_t ep_heap_need(const struct fabep_moe *m)
{
	size_t n = 0, R = (size_t)m->size, S = (size_t)m->sets;

	n += FEP_ALIGN_UP(24 * S, 64);                     /* counters */
	n += FEP_ALIGN_UP(S * 2 * R * m->dslot_bytes, 64); /* drecv */
	n += FEP_ALIGN_UP(S * R * m->cslot_bytes, 64);     /* crecv */
	n += FEP_ALIGN_UP((R - 1) * m->cslot_bytes + 1, 64); /* cstage */
	n += FEP_ALIGN_UP(S * m->place_rows * m->row_bytes, 64); /* dplace */
	return n + 64;
}

FEP_EXPORT size_t fabep_moe_heap_bytes(const fabep_moe_config_t *cfg, int nranks)
{
	struct fabep_moe m;
	fabep_moe_config_t c;

	if (!cfg || fep_struct_in("fabep_moe_heap_bytes", "fabep_moe_config_t",
				  &c, sizeof(c), FEP_MOE_CONFIG_SIZE0, cfg))
		return 0;
	memset(&m, 0, sizeof(m));
	if (ep_geometry(&m, &c, nranks, 1))
		return 0;
	return ep_heap_need(&m);
}

/* What the ranks compare at creation. */
struct ep_hello {
	int32_t status;
	int32_t token_type, input_type, combine_type;
	int32_t num_experts, top_k, max_tokens, fp8_block, buffer_sets, flags;
	uint64_t hidden;
	uint64_t chunk_bytes;
	uint64_t place_rows;
	struct fep_hb_hello hb;
};

static void ep_set_free(struct fep_ep_set *s)
{
	free(s->sent);
	free(s->ret_idx);
	free(s->xrun);
	free(s->crows);
	free(s->cexp);
	free(s->xidx);
	free(s->pidx);
	free(s->xw);
	free(s->fidx);
	free(s->fw);
	free(s->rcount);
	free(s->self_pay);
	free(s->tbase);
	free(s->cidx);
	free(s->cw);
	free(s->x);
	free(s->scales);
	free(s->gidx);
	free(s->psrc);
	free(s->pdst);
	free(s->src_info);
	free(s->weights);
	free(s->row_offsets);
	free(s->counts);
	free(s->expert_ids);
	free(s->row_index);
	free(s->placed);
}

static void ep_free(struct fabep_moe *m)
{
	int b;

	if (m->set)
		for (b = 0; b < m->sets; b++)
			ep_set_free(&m->set[b]);
	free(m->set);
	free(m->prev_ids);
	free(m->prev_w);
	free(m->old_ids);
	free(m->old_w);
	free(m->pack_pos);
	free(m->pack_tok);
	free(m->pack_base);
	free(m->dest);
	free(m->cursor);
	free(m->puts);
	free(m->rputs);
	free(m->posted);
	free(m->chunk_direct);
	free(m->run_first);
	free(m->place_ret);
	free(m->ecnt);
	free(m->rcur);
	free(m->rend);
	free(m->pbase);
	free(m->blk_start);
	free(m->blk_pre);
	free(m->dup_start);
	free(m->dup_pre);
	free(m->own_tok);
	free(m->fused);
	free(m->xblk);
	free(m->xnblk);
	free(m->xunw);
	free(m->pcol);
	free(m->pnext);
	free(m->pput);
	free(m->pdest);
	free(m->drows);
	free(m->pputs);
	free(m);
}

static int ep_alloc_host(struct fabep_moe *m)
{
	size_t R = (size_t)m->size, T = (size_t)m->cfg.max_tokens, L = (size_t)m->L;
	size_t T1 = T ? T : 1;
	int b, e;

	m->set = calloc((size_t)m->sets, sizeof(*m->set));
	m->prev_ids = malloc(T1 * (size_t)m->k * sizeof(int32_t));
	m->prev_w = malloc(T1 * (size_t)m->k * sizeof(float));
	m->old_ids = malloc(T1 * (size_t)m->k * sizeof(int32_t));
	m->old_w = malloc(T1 * (size_t)m->k * sizeof(float));
	m->pack_tok = malloc(T1 * R * sizeof(int32_t));
	m->pack_base = calloc(R + 1, sizeof(uint32_t));
	m->dest = malloc(T1 * (size_t)m->kk * sizeof(int32_t));
	m->pack_pos = malloc(T1 * (size_t)m->kk * sizeof(int32_t));
	m->cursor = calloc(R, sizeof(uint32_t));
	/* a chunk of a run gathered from the input slot is a put per range
	 * of its records: at most one per record sent */
	m->puts = calloc(R * FEP_MAX(m->dchunks, m->cchunks) + T1 * (size_t)m->kk + 1,
			 sizeof(*m->puts));
	m->posted = calloc(R, sizeof(size_t));
	m->chunk_direct = calloc(R * m->dchunks, 1);
	m->run_first = malloc(R * sizeof(int32_t));
	m->place_ret = calloc(R, sizeof(int));
	m->ecnt = calloc(R * L, sizeof(uint32_t));
	m->rcur = calloc(R * L, sizeof(uint32_t));
	m->rend = calloc(R * L, sizeof(uint32_t));
	m->pbase = calloc(R + 1, sizeof(uint32_t));
	/* blocks of rows to gather: at most one per (source, expert) */
	m->blk_start = calloc(R * L + 2 * L + 1, sizeof(uint32_t));
	m->blk_pre = calloc(R * L + 2 * L + 2, sizeof(uint32_t));
	/* rows a placed dispatch's receiver copies from a token's first
	 * row (place): at most one block per row of the placed region */
	m->dup_start = calloc(m->place_rows + 1, sizeof(uint32_t));
	m->dup_pre = calloc(m->place_rows + 2, sizeof(uint32_t));
	m->own_tok = malloc(T1 * sizeof(int32_t));
	m->fused = calloc(T1, 1);
	m->xblk = malloc(2 * R * L * sizeof(uint32_t));
	m->xnblk = calloc(R, sizeof(uint32_t));
	m->xunw = calloc(R, 1);
	m->pcol = calloc((size_t)m->cfg.num_experts, sizeof(uint64_t));
	m->pnext = calloc((size_t)m->cfg.num_experts, sizeof(uint64_t));
	m->pput = calloc((size_t)m->cfg.num_experts, sizeof(size_t));
	m->pdest = calloc(R, 1);
	m->drows = calloc(R, sizeof(uint32_t));
	m->pputs = calloc(T1 * (size_t)(m->k + m->kk) + R * (m->dchunks + 1) + 1,
			  sizeof(*m->pputs));
	if (!m->pcol || !m->pnext || !m->pput || !m->pdest || !m->drows || !m->pputs ||
	    !m->xblk || !m->xnblk || !m->xunw || !m->own_tok || !m->fused ||
	    !m->ecnt || !m->rcur || !m->rend || !m->pbase || !m->blk_start || !m->blk_pre ||
	    !m->dup_start || !m->dup_pre ||
	    !m->run_first || !m->place_ret || !m->chunk_direct || !m->posted || !m->puts || !m->cursor || !m->set || !m->prev_ids || !m->prev_w || !m->old_ids || !m->old_w || !m->pack_tok ||
	    !m->pack_base || !m->dest || !m->pack_pos)
		return -ENOMEM;
	m->timing = fep_log_level() >= FEP_LOG_DEBUG;
	for (b = 0; b < m->sets; b++) {
		struct fep_ep_set *s = &m->set[b];

		s->sent = calloc(R, sizeof(uint32_t));
		s->ret_idx = malloc(T1 * (size_t)m->kk * sizeof(int32_t));
		s->xrun = calloc(R, 1);
		s->crows = calloc(R, 1);
		s->cexp = calloc(R, sizeof(uint32_t));
		s->xidx = malloc(T1 * (size_t)m->k * sizeof(int32_t));
		s->pidx = malloc(T1 * (size_t)m->k * sizeof(int32_t));
		s->xw = malloc(T1 * (size_t)m->k * sizeof(float));
		s->fidx = malloc(T1 * (size_t)m->k * sizeof(int32_t));
		s->fw = malloc(T1 * (size_t)m->k * sizeof(float));
		s->rcount = calloc(R, sizeof(uint32_t));
		s->self_pay = malloc(T1 * sizeof(int32_t));
		s->tbase = calloc(R + 1, sizeof(uint32_t));
		s->cidx = malloc(R * T1 * (size_t)m->k * sizeof(int32_t));
		s->cw = malloc(R * T1 * (size_t)m->k * sizeof(float));
		s->row_offsets = calloc(L + 1, sizeof(uint32_t));
		s->counts = calloc(L, sizeof(uint32_t));
		s->expert_ids = calloc(L, sizeof(int32_t));
		s->placed = calloc(R, 1);
		if (!s->placed ||
		    !s->xrun || !s->crows || !s->cexp || !s->xidx || !s->pidx ||
		    !s->xw || !s->fidx || !s->fw ||
		    !s->sent || !s->ret_idx || !s->rcount || !s->self_pay || !s->tbase ||
		    !s->cidx || !s->cw || !s->row_offsets || !s->counts ||
		    !s->expert_ids)
			return -ENOMEM;
		for (e = 0; e < m->L; e++)
			s->expert_ids[e] = m->rank * m->L + e;
	}
	return 0;
}

/* fabep_comm_destroy's call for a handle still alive */
static void ep_destroy_link(struct fep_comm_handle *l)
{
	fabep_moe_destroy((fabep_moe_t *)((char *)l - offsetof(fabep_moe_t, link)));
}

FEP_EXPORT int fabep_moe_create(fabep_comm_t *comm, const fabep_moe_config_t *cfg,
				fabep_moe_t **out)
{
	struct fabep_moe *m;
	struct ep_hello me, *all = NULL;
	struct fep_hb_hello hb;
	fabep_moe_config_t c;
	fep_fabric_t *fab;
	size_t need, S, share;
	int r, ret, status = 0;

	if (!comm) {
		fep_err("fabep_moe_create: NULL communicator");
		return -EINVAL;
	}
	/* a failed communicator's peers cannot take part: refused at once */
	ret = fep_comm_usable(comm, "fabep_moe_create");
	if (ret)
		return ret;
	fab = comm->fab;
	/* Every local failure from here on still takes part in the exchange,
	 * so that every rank returns the same code and none waits for it. */
	all = calloc((size_t)comm->size, sizeof(*all));
	m = calloc(1, sizeof(*m));
	if (!all) {  /* nothing to exchange into: the peers' wait times out */
		fep_err("fabep_moe_create: out of memory before the exchange");
		free(m);
		return -ENOMEM;
	}
	if (!cfg || !out) {
		fep_err("fabep_moe_create: NULL %s", !cfg ? "configuration" :
			"output pointer");
		status = -EINVAL;
	}
	/* the caller's layout, checked and copied (a refused one takes part
	 * in the exchange as zeros) */
	if (cfg && !status)
		status = fep_struct_in("fabep_moe_create", "fabep_moe_config_t",
				       &c, sizeof(c), FEP_MOE_CONFIG_SIZE0, cfg);
	if (!cfg || status)
		memset(&c, 0, sizeof(c));
	cfg = &c;
	if (!m) {
		fep_err("fabep_moe_create: out of memory");
		status = status ? status : -ENOMEM;
	} else {
		m->comm = comm;
		m->rank = comm->rank;
		m->crowded = comm->fab->oversubscribed;
		/* runs leave from the input slot, gathered, where a chunk's
		 * writes need not each carry its signal (not remote CQ data)
		 * and one write takes several pieces */
		m->gather = fep_fab_signals_after_writes(comm->fab) &&
			    comm->fab->iov_max >= 2;
		share = fep_fab_queue_share(comm->fab);
		m->gather_writes = share > FEP_EP_GATHER_WRITES + FEP_EP_QUEUE_SPARE ?
				   share - FEP_EP_QUEUE_SPARE : FEP_EP_GATHER_WRITES;
		m->dfn = "fabep_moe_dispatch";
		m->cfn = "fabep_moe_combine";
		if (!status)
			status = ep_geometry(m, cfg, comm->size, 0);
		if (!status)
			status = ep_alloc_host(m);
	}

	/* every rank learns every rank's status and configuration */
	memset(&me, 0, sizeof(me));
	me.status = status;
	me.token_type = cfg->token_type;
	me.input_type = cfg->token_type == FABEP_MOE_FP8 ? cfg->input_type : 0;
	me.combine_type = cfg->combine_type;
	me.num_experts = cfg->num_experts;
	me.top_k = cfg->top_k;
	me.max_tokens = cfg->max_tokens;
	me.fp8_block = m && m->fp8 ? cfg->fp8_block : 0;
	me.buffer_sets = cfg->buffer_sets ? cfg->buffer_sets : 2;
	me.flags = (int32_t)cfg->flags;
	me.hidden = cfg->hidden;
	me.chunk_bytes = m ? m->chunk_bytes : 0;
	me.place_rows = m ? m->place_rows : 0;
	fep_hb_hello(fab, &me.hb);
	ret = fep_comm_allgather(comm, &me, all, sizeof(me));
	if (ret) {
		fep_err("fabep_moe_create: exchanging configurations: %s",
			fabep_strerror(ret));
		goto err;
	}
	for (r = 0; r < comm->size; r++)
		if (all[r].status) {
			if (r != comm->rank)
				fep_err("fabep_moe_create: rank %d failed: %s", r,
					fabep_strerror(all[r].status));
			ret = all[r].status;
			goto err;
		}
	for (r = 1; r < comm->size; r++) {
		struct ep_hello a = all[0], b = all[r];

		memset(&a.hb, 0, sizeof(a.hb));
		memset(&b.hb, 0, sizeof(b.hb));
		a.chunk_bytes = b.chunk_bytes = 0;
		a.place_rows = b.place_rows = 0;
		if (memcmp(&a, &b, sizeof(a))) {
			fep_err("fabep_moe_create: configurations differ: rank 0 has "
				"experts %d top_k %d hidden %llu max_tokens %d types "
				"%d/%d/%d block %d sets %d flags %d; rank %d has %d %d "
				"%llu %d %d/%d/%d %d %d %d", a.num_experts, a.top_k,
				(unsigned long long)a.hidden, a.max_tokens,
				a.token_type, a.input_type, a.combine_type,
				a.fp8_block, a.buffer_sets, a.flags, r, b.num_experts,
				b.top_k, (unsigned long long)b.hidden, b.max_tokens,
				b.token_type, b.input_type, b.combine_type,
				b.fp8_block, b.buffer_sets, b.flags);
			ret = -FABEP_ERR_MISMATCH;
			goto err;
		}
		if (all[r].chunk_bytes != all[0].chunk_bytes) {
			fep_err("fabep_moe_create: FABEP_MOE_CHUNK differs (rank 0 %llu, "
				"rank %d %llu)", (unsigned long long)all[0].chunk_bytes, r,
				(unsigned long long)all[r].chunk_bytes);
			ret = -FABEP_ERR_MISMATCH;
			goto err;
		}
		if (all[r].place_rows != all[0].place_rows) {
			fep_err("fabep_moe_create: FABEP_MOE_PLACE differs (rank 0 %s, "
				"rank %d %s)", all[0].place_rows ? "on" : "never", r,
				all[r].place_rows ? "on" : "never");
			ret = -FABEP_ERR_MISMATCH;
			goto err;
		}
	}
	ret = fep_hb_agree("fabep_moe_create", comm->size, &all[0].hb,
			   sizeof(*all), &hb);
	free(all);
	all = NULL;
	if (ret)
		goto err;

	/* the same choice on every rank, from the same heaps; the block
	 * opens with the counters (ep_heap_need's order) */
	need = ep_heap_need(m);
	S = (size_t)m->sets;
	ret = fep_comm_block(comm, &hb, need, 24 * S, &m->blk, &m->ctrs);
	if (ret == -FABEP_ERR_HEAP_FULL)
		fep_err("fabep_moe_create: the handle needs %zu heap bytes, %zu of "
			"%zu are in use and no block given back on every rank "
			"fits (fabep_moe_heap_bytes(); raise heap_size or "
			"FABEP_HEAP_SIZE)", need, fab->heap_used, fab->heap_size);
	if (ret)
		goto err;
	m->drecv = m->blk + FEP_ALIGN_UP(24 * S, 64);
	m->crecv = m->drecv + FEP_ALIGN_UP(S * 2 * (size_t)m->size * m->dslot_bytes, 64);
	m->cstage = m->crecv + FEP_ALIGN_UP(S * (size_t)m->size * m->cslot_bytes, 64);
	m->dplace = m->cstage + FEP_ALIGN_UP(((size_t)m->size - 1) * m->cslot_bytes + 1, 64);
	fep_comm_handle_add(comm, &m->link, ep_destroy_link);
	*out = m;
	return 0;
err:
	free(all);
	if (m)
		ep_free(m);
	return ret;
}

FEP_EXPORT int fabep_moe_destroy(fabep_moe_t *m)
{
	int ret;

	if (!m)
		return 0;
	/* a child of a fork after its communicator was made leaves it be */
	ret = fep_comm_forked(m->comm, "fabep_moe_destroy");
	if (ret)
		return ret;
	fep_comm_handle_del(&m->link);
	/* the block is free for a later handle once no peer can write to it
	 * any more: every call of this handle completed, none failed */
	fep_comm_block_free(m->comm, m->blk, m->ctrs, !m->unclean &&
			    !m->pending_recv && !m->pending_crecv);
	ep_free(m);
	return 0;
}

/* The communicator's failure first: its own error says more than the
 * handle's. */
int fep_ep_usable(struct fabep_moe *m, const char *what)
{
	int ret = fep_comm_usable(m->comm, what);

	if (ret || !m->unclean)
		return ret;
	fep_err("%s: the handle is unusable after an earlier failed wait or "
		"transfer, or a call that failed on this rank alone (destroy it)",
		what);
	return -FABEP_ERR_PEER_LOST;
}

int fep_ep_set_reserve(struct fabep_moe *m, struct fep_ep_set *s, size_t rows)
{
	size_t cap;
	void *x = NULL;
	float *sc = NULL, *w = NULL;
	int32_t *g = NULL, *si = NULL, *ri = NULL, *ps = NULL, *pd = NULL;
	int copy = !m->zcopy;  /* zero-copy: the rows stay in the slots */

	if (FEP_FAULT("ep_reserve", 0))
		return -ENOMEM;
	if (rows <= s->cap_rows)
		return 0;
	cap = FEP_MAX(rows, s->cap_rows + s->cap_rows / 2);
	if (copy) {
		x = fep_huge_alloc(cap * m->row_bytes + 64);
		ri = malloc(cap * sizeof(int32_t));
		ps = malloc(cap * sizeof(int32_t));
		pd = malloc(cap * sizeof(int32_t));
	}
	g = malloc(cap * sizeof(int32_t));
	si = malloc(cap * 3 * sizeof(int32_t));
	w = malloc(cap * sizeof(float));
	if (m->fp8 && copy)
		sc = malloc(cap * m->nscale * sizeof(float));
	if ((copy && (!x || !ri || !ps || !pd)) || !g || !si || !w ||
	    (m->fp8 && copy && !sc)) {
		free(x);
		free(ri);
		free(ps);
		free(pd);
		free(g);
		free(si);
		free(w);
		free(sc);
		fep_err("fabep_moe_dispatch: no memory for %zu received rows", cap);
		return -ENOMEM;
	}
	free(s->x);
	free(s->row_index);
	free(s->gidx);
	free(s->psrc);
	free(s->pdst);
	free(s->src_info);
	free(s->weights);
	free(s->scales);
	s->x = x;
	s->psrc = ps;
	s->pdst = pd;
	s->row_index = ri;
	s->ident_rows = 0;
	s->gidx = g;
	s->src_info = si;
	s->weights = w;
	s->scales = sc;
	s->cap_rows = cap;
	return 0;
}

int fep_ep_post(struct fabep_moe *m, size_t np, uint64_t *bytes, bool sender)
{
	size_t i;

	if (sender)
		return fep_ep_copy(m, m->puts, np, bytes);
	for (i = 0; i < np; i++)
		*bytes += m->puts[i].len;
	return np ? fep_ep_fab(m, fep_fab_put_recv_many(m->comm->fab, m->puts, np)) : 0;
}

/* The lanes of one batch on the pool's threads: each claims lanes until
 * none is left, then drives the channels that no lane holds until every
 * lane is done, so that the peers' copies into this rank's regions (whose
 * notices fill the regions' queues until this rank takes them) do not
 * wait for the slowest lane. */
#define FEP_EP_LANE_MSG 512
struct lane_run {
	fep_fabric_t *fab;
	const struct fep_put *puts;
	size_t n;
	int lanes;
	int next;      /* atomic: the next lane to claim */
	int done;      /* atomic: lanes finished */
	int err;       /* atomic: the first lane's error */
	char msg[FEP_EP_LANE_MSG]; /* its messages, from a worker's thread */
};

/* The first error of the run is kept; fabep_last_error is the thread's
 * own, so a worker's messages go to the caller through r->msg. */
static void lane_fail(struct lane_run *r, int ret, int tid)
{
	int none = 0;

	if (__atomic_compare_exchange_n(&r->err, &none, ret, false,
					__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) && tid)
		snprintf(r->msg, sizeof(r->msg), "%s", fabep_last_error());
}

static void lane_fn(void *arg, int tid, int nthreads)
{
	struct lane_run *r = arg;
	struct fep_backoff bo = { 0, 0 };
	int l, ret;

	(void)nthreads;
	if (tid)  /* what this worker logged before is not this call's */
		(void)fabep_last_error();
	while ((l = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED)) < r->lanes) {
		ret = fep_fab_copy_lane(r->fab, r->puts, r->n, l);
		if (ret)
			lane_fail(r, ret, tid);
		__atomic_fetch_add(&r->done, 1, __ATOMIC_RELEASE);
	}
	while (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE) < r->lanes) {
		ret = fep_fabric_progress_free(r->fab);
		if (ret)
			lane_fail(r, ret, tid);
		fep_backoff_step(&bo);
	}
}

/* Whether the copies of puts[0, np) fall in two lanes or more. */
static bool lanes_used(const fep_fabric_t *fab, const struct fep_put *puts,
		       size_t np)
{
	int first = -1, l;
	size_t i;

	for (i = 0; i < np; i++) {
		l = fep_fab_copy_lane_of(fab, &puts[i]);
		if (l < 0)
			continue;
		if (first >= 0 && l != first)
			return true;
		first = l;
	}
	return false;
}

int fep_ep_copy(struct fabep_moe *m, const struct fep_put *puts, size_t np,
		uint64_t *total)
{
	fep_fabric_t *fab = m->comm->fab;
	struct lane_run r;
	uint64_t bytes = 0;
	size_t i;
	int ret;

	for (i = 0; i < np; i++)
		bytes += puts[i].len;
	*total += bytes;
	if (!np)
		return 0;
	if (!fep_ep_lanes(m) || (!m->lanes_mode && bytes < FEP_EP_LANE_BYTES) ||
	    !lanes_used(fab, puts, np))
		return fep_ep_fab(m, fep_fab_put_copy_many(fab, puts, np));
	ret = fep_fab_copy_check(fab, puts, np);
	if (ret)
		return fep_ep_fab(m, ret);
	memset(&r, 0, sizeof(r));
	r.fab = fab;
	r.puts = puts;
	r.n = np;
	r.lanes = fep_fab_copy_lanes(fab);
	m->nlanes++;
	ret = fep_pool_run(m->comm->pool, lane_fn, &r);
	if (!ret)
		ret = r.err;
	if (ret && r.msg[0])
		fep_log_adopt(r.msg);
	if (!ret)
		ret = fep_fab_copy_signals(fab, puts, np);
	return fep_ep_fab(m, ret);
}

void fep_ep_idle(void *arg)
{
	struct fep_ep_idle *i = arg;

	if (!i->err)
		i->err = fep_fabric_progress(i->fab);
}

/* Several channels: every thread claims ranges and, before each claim,
 * progresses its channel (thread t: t, t + nthreads, ...), so the peers'
 * slices are copied on every thread while the work goes on; and any
 * channel whose thread has not progressed it over two of its claims.  The
 * caller takes claims too, so a worker that wakes after the last claim
 * skips the run (fep_pool_run). */
struct chan_run {
	fep_pool_range_fn fn;
	void *ctx;
	fep_fabric_t *fab;
	size_t n, step;
	size_t next;   /* atomic: the next range's start */
	int err;       /* atomic: the first progress error */
};

static void chan_run_fn(void *arg, int tid, int nthreads)
{
	struct chan_run *r = arg;
	struct fep_chan_watch cw;

	memset(&cw, 0, sizeof(cw));
	for (;;) {
		size_t r0;
		int ret = fep_fabric_progress_mine(r->fab, tid, nthreads, &cw, 1);

		if (ret) {
			int none = 0;

			__atomic_compare_exchange_n(&r->err, &none, ret, false,
						    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		}
		r0 = __atomic_fetch_add(&r->next, r->step, __ATOMIC_RELAXED);
		if (r0 >= r->n)
			return;
		r->fn(r->ctx, r0, FEP_MIN(r->n, r0 + r->step));
	}
}

int fep_ep_pool_run(fep_pool_t *pool, size_t n, size_t item_bytes,
		    int caller_idles, fep_pool_range_fn fn, void *ctx,
		    struct fep_ep_idle *idle)
{
	size_t grain = fep_pool_grain(n, item_bytes);
	int nth = fep_pool_threads(pool), ret;

	if (n && grain >= n) {  /* small: the caller's alone */
		fn(ctx, 0, n);
		return idle->err;
	}
	if (caller_idles && idle->fab->nchan > 1 && nth > 1 && n) {
		struct chan_run r = { fn, ctx, idle->fab, n, 0, 0, 0 };

		r.step = FEP_MAX((size_t)1, n / (4 * (size_t)nth));
		ret = fep_pool_run(pool, chan_run_fn, &r);
		return ret ? ret : r.err;
	}
	ret = caller_idles ?
		fep_pool_for_idle(pool, n, 1, fn, ctx, fep_ep_idle, idle) :
		fep_pool_for(pool, n, 1, fn, ctx);

	return ret ? ret : idle->err;
}

void fep_ep_hdr_write(void *p, uint64_t seq, int status, uint32_t count)
{
	struct fep_ep_hdr h;

	memset(&h, 0, sizeof(h));
	h.seq = seq;
	h.status = status;
	h.count = count;
	h.magic = FEP_EP_MAGIC;
	memcpy(p, &h, sizeof(h));
}

/* fep_ep_ready_chunks for r->hlast.  The run is produced back to front:
 * r->done counts the units complete at its end.  *posted counts the data
 * chunks already posted, from the last one back to chunk 2, then jumps to
 * r->chunks once the header has gone with chunk 1 (the first units, the
 * last to be complete).  Chunks past the run's units send no empty
 * writes: the header's write adds their signals to its own. */
static size_t ready_hlast(struct fep_put *out, const struct fep_ep_run *r,
			  size_t *posted)
{
	size_t full = (r->count + r->per - 1) / r->per;  /* chunks with units */
	size_t n = 0;

	while (*posted + 2 <= full) {
		size_t r0 = (full - 1 - *posted) * r->per;
		size_t r1 = FEP_MIN(r0 + r->per, r->count);

		if (r0 < r->count - r->done)
			return n;
		out[n].peer = r->peer;
		out[n].sig = r->sig;
		out[n].add = 1;
		out[n].dst = r->dst + (r->hdr + r0) * r->unit;
		out[n].src = r->stage + (r->hdr + r0) * r->unit;
		out[n].len = (r1 - r0) * r->unit;
		n++;
		(*posted)++;
	}
	if (*posted < r->chunks && r->done >= r->count) {
		out[n].peer = r->peer;
		out[n].sig = r->hsig;
		out[n].add = r->chunks - *posted;
		out[n].dst = r->dst + r->hoff;
		out[n].src = r->stage + r->hoff;
		out[n].len = (r->hdr + FEP_MIN(r->per, r->count)) * r->unit - r->hoff;
		n++;
		*posted = r->chunks;
	}
	return n;
}

size_t fep_ep_ready_chunks(struct fep_put *out, const struct fep_ep_run *r,
			   size_t *posted)
{
	size_t n = 0;

	if (r->hlast)
		return ready_hlast(out, r, posted);
	if (r->join && *posted < r->chunks) {
		if (r->done < r->count)
			return 0;
		/* the header reaches to the units; they follow it in stage,
		 * or are one range of the input slot (a direct chunk where
		 * the fabric does not gather is one range) */
		out[0].peer = r->peer;
		out[0].sig = r->hsig;
		out[0].add = 1;
		out[0].dst = r->dst + r->hoff;
		out[0].src = r->stage + r->hoff;
		out[0].len = r->hdr * r->unit - r->hoff;
		n = 1;
		if (r->count && r->direct && r->direct[1]) {
			out[1] = out[0];
			out[0].add = 0;
			out[1].dst = r->dst + r->hdr * r->unit;
			out[1].src = r->input + (r->hdr + (size_t)r->tok[0]) * r->unit;
			out[1].len = r->count * r->unit;
			n = 2;
		} else {
			out[0].len += r->count * r->unit;
		}
		*posted = r->chunks;
		return n;
	}
	while (*posted < r->chunks) {
		size_t j = *posted, r0 = 0, r1 = 0;

		out[n].peer = r->peer;
		out[n].sig = j ? r->sig : r->hsig;
		out[n].add = j && r->merge ? 0 : 1;
		if (j == 0) {  /* the header */
			out[n].dst = r->dst + r->hoff;
			out[n].src = r->stage + r->hoff;
			out[n].len = r->hlen;
		} else {
			r0 = (j - 1) * r->per;
			r1 = FEP_MIN(r0 + r->per, r->count);
			if (r1 > r0 && r1 > r->done)
				break;
			out[n].dst = r->dst + (r->hdr + r0) * r->unit;
			out[n].len = r1 > r0 ? (r1 - r0) * r->unit : 0;
			out[n].src = r->stage + (r->hdr + r0) * r->unit;
			/* from the input slot: one put per range of consecutive
			 * records there, the chunk's signal on the last (the
			 * fabric gathers them into writes of several pieces) */
			while (r1 > r0 && r->direct && r->direct[j]) {
				size_t b = fep_ep_range_end(r->tok, r0, r1);

				out[n].dst = r->dst + (r->hdr + r0) * r->unit;
				out[n].src = r->input +
					     (r->hdr + (size_t)r->tok[r0]) * r->unit;
				out[n].len = (b - r0) * r->unit;
				if (b == r1)
					break;
				out[n + 1] = out[n];  /* the next keeps the signal */
				out[n++].add = 0;
				r0 = b;
			}
		}
		n++;
		(*posted)++;
	}
	return n;
}

int fep_ep_wait(struct fabep_moe *m, const char *what, uint64_t ctr,
		uint64_t target, uint64_t slots, size_t stride, uint64_t seq)
{
	return fep_ep_wait_with(m, what, ctr, target, slots, stride, seq, NULL, NULL);
}

int fep_ep_wait_with(struct fabep_moe *m, const char *what, uint64_t ctr,
		     uint64_t target, uint64_t slots, size_t stride, uint64_t seq,
		     int (*work)(void *), void *work_ctx)
{
	if (m->size == 1)
		return work ? work(work_ctx) : 0;
	return fep_ep_fab(m, fep_comm_wait_with(m->comm, what, ctr, target, slots,
						stride, seq, work, work_ctx));
}

int fep_ep_settle(struct fabep_moe *m, const char *what)
{
	int ret;

	if (m->size == 1)
		return 0;
	ret = fep_ep_fab(m, fep_comm_agree(m->comm, 0));
	if (ret)
		fep_err("%s: after the refused call: %s", what, fabep_strerror(ret));
	return ret;
}

int fep_ep_settle_owed(struct fabep_moe *m, const char *what)
{
	if (!m->settle)
		return 0;
	m->settle = 0;
	return fep_ep_settle(m, what);
}

int fep_ep_check_hdrs(struct fabep_moe *m, const char *what, uint64_t base,
		      size_t stride, uint64_t seq, const uint32_t *expect,
		      int local_status, uint32_t *counts, uint64_t *signals,
		      int *refused)
{
	fep_fabric_t *fab = m->comm->fab;
	int r, agreed = 0, who = -1, ret = 0, sret = 0;

	for (r = 0; r < m->size; r++) {
		struct fep_ep_hdr h;
		int current;

		memcpy(&h, fep_heap_at(fab, base + (uint64_t)r * stride), sizeof(h));
		current = h.seq == seq && h.magic == FEP_EP_MAGIC;
		/* a dispatch header announces 0 record signals (merged into
		 * its own) or one per data chunk.  Every peer's count goes
		 * into the target, even past another error, so that the
		 * records' wait drains what was sent; one that is not this
		 * call's, or not a valid count, counts as what an unmerged
		 * sender sends. */
		if (signals && r != m->rank) {
			uint64_t n = m->dchunks - 1;  /* an unmerged sender's */

			if (current && (h.chunks == 0 || h.chunks == n))
				n = h.chunks;
			else if (current && !sret) {
				fep_err("%s: rank %d announced %u record signals "
					"(expected 0 or %zu)", what, r, h.chunks,
					m->dchunks - 1);
				sret = -FABEP_ERR_PROTOCOL;
			}
			*signals += n;
		}
		if (ret)
			continue;  /* past the first error: the signals only */
		if (!current) {
			fep_err("%s: rank %d's header holds call %llu (magic %llx), "
				"expected call %llu", what, r,
				(unsigned long long)h.seq, (unsigned long long)h.magic,
				(unsigned long long)seq);
			ret = -FABEP_ERR_PROTOCOL;
			continue;
		}
		if (r == m->rank && local_status)
			h.status = local_status;
		if (h.status) {
			if (h.status > 0 || h.status < -100000) {
				fep_err("%s: rank %d sent status %d", what, r, h.status);
				ret = -FABEP_ERR_PROTOCOL;
				continue;
			}
			if (!agreed) {
				agreed = h.status;
				who = r;
			}
			continue;
		}
		if (h.count > (uint32_t)m->cfg.max_tokens ||
		    (expect && h.count != expect[r])) {
			fep_err("%s: rank %d announced %u rows (expected %s%u)", what,
				r, h.count, expect ? "" : "at most ",
				expect ? expect[r] : (uint32_t)m->cfg.max_tokens);
			ret = -FABEP_ERR_PROTOCOL;
			continue;
		}
		if (counts)
			counts[r] = h.count;
	}
	if (ret)
		return ret;
	if (agreed && who != m->rank)
		fep_err("%s: rank %d rejected its input: %s", what, who,
			fabep_strerror(agreed));
	if (agreed && refused)
		*refused = 1;
	/* a sender's refusal is what every rank agrees on before a bad
	 * signal count */
	return agreed ? agreed : sret;
}

FEP_EXPORT int fabep_moe_timing(const fabep_moe_t *m, fabep_moe_timing_t *out)
{
	fabep_moe_timing_t t;
	size_t size;
	int ret;

	if (!m || !out) {
		fep_err("fabep_moe_timing: NULL %s", !m ? "handle" : "output");
		return -EINVAL;
	}
	ret = fep_struct_out_size("fabep_moe_timing", "fabep_moe_timing_t", out,
				  FEP_MOE_TIMING_SIZE0, &size);
	if (ret)
		return ret;
	memset(&t, 0, sizeof(t));
	t.dispatch_pack_ns = m->tm.d_pack;
	t.dispatch_put_ns = m->tm.d_put;
	t.dispatch_wait_ns = m->tm.d_wait;
	t.dispatch_build_ns = m->tm.d_build;
	t.combine_reduce_ns = m->tm.c_reduce;
	t.combine_put_ns = m->tm.c_put;
	t.combine_wait_ns = m->tm.c_wait;
	t.combine_sum_ns = m->tm.c_sum;
	t.dispatch_wire_bytes = m->tm.d_bytes;
	t.combine_wire_bytes = m->tm.c_bytes;
	fep_struct_out(out, size, &t, sizeof(t));
	return 0;
}
