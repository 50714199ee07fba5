/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz_ep_slots.c - what peers write into a rank's MoE receive slots
 * (src/ep): the dispatch slot headers and token records (sequence, magic,
 * status, count, token index, local expert ids, weights), checked by
 * fep_ep_check_hdrs (layout.c) and build (dispatch.c) before anything is
 * gathered; and the combine slot headers, whose counts must equal what
 * this rank sent.
 *
 * The handle is made by the real fabep_moe_create on a fake communicator:
 * a heap in plain memory, sized exactly (so ASan sees any access past
 * it), and a bootstrap of one process that answers for every rank.
 *
 * Input: geometry bytes (ranks, rank, experts per rank, top_k, hidden,
 * max_tokens, token type and flags), then per source rank a header mode
 * byte (valid header with a fuzzed count / fully fuzzed header; record
 * signals 0 or from the mode's high bits; rows per expert fuzzed, or
 * counted from the records) and count, then the bytes of the records,
 * then the combine counts.
 *
 * The verdict is checked against an independent reading of the layout's
 * rules (ref_dispatch, ref_combine): every bound on what a peer wrote
 * must be refused with -FABEP_ERR_PROTOCOL, a sender's error status
 * agreed, and valid slots accepted.
 */
#include "../src/ep/dispatch.c"

#include "fuzz.h"

#define FUZZ_MAX_SIZE 4

/* A bootstrap whose allgather copies this rank's block to every rank's:
 * every rank agrees with this one. */
static int fake_allgather(fep_boot_t *b, const void *in, void *out, size_t len)
{
	int r;

	for (r = 0; r < b->size; r++)
		memcpy((char *)out + (size_t)r * len, in, len);
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

/* Every row build placed must point into the slots of set b. */
static void fuzz_check_result(struct fabep_moe *m, int b, struct fep_ep_set *s)
{
	size_t r, rows = 0;
	int e;

	for (e = 0; e < m->L; e++) {
		FUZZ_CHECK(s->row_offsets[e + 1] - s->row_offsets[e] == s->counts[e]);
		rows += s->counts[e];
	}
	FUZZ_CHECK(rows == s->rows);
	for (r = 0; r < s->rows; r++) {
		int32_t src = s->src_info[3 * r], t = s->src_info[3 * r + 1];
		int32_t j = s->src_info[3 * r + 2];

		FUZZ_CHECK(src >= 0 && src < m->size);
		FUZZ_CHECK(t >= 0 && t < m->cfg.max_tokens);
		FUZZ_CHECK(j >= 0 && j < m->k);
	}
	(void)b;
}

#define REF_PROTOCOL 1

/* The record signals the peers' dispatch headers of set b announce: 0
 * or one per data chunk; dchunks - 1 for a header that is not this
 * call's or announces neither (the records' wait then drains what an
 * unmerged sender sends). */
static uint64_t ref_signals(struct fabep_moe *m, int b, uint64_t seq)
{
	uint64_t sum = 0;
	int r;

	for (r = 0; r < m->size; r++) {
		struct fep_ep_hdr h;

		if (r == m->rank)
			continue;
		memcpy(&h, fep_heap_at(m->comm->fab, fep_ep_dhdr(m, b, r)), sizeof(h));
		if (h.seq == seq && h.magic == FEP_EP_MAGIC &&
		    (h.chunks == 0 || h.chunks == m->dchunks - 1))
			sum += h.chunks;
		else
			sum += m->dchunks - 1;
	}
	return sum;
}

/* What check_hdrs + build must make of set b's dispatch slots, from the
 * rules alone: REF_PROTOCOL when a peer broke one (header sequence or
 * magic, a status that is no error code, a count past max_tokens, record
 * signals neither 0 nor one per data chunk, more rows announced than
 * count * top_k, a record's token index or expert id out of range,
 * records that do not bring the rows per expert their header announced,
 * more rows than max_tokens from a peer that asks for them back as rows),
 * else the status of the lowest failing rank, else 0.  A failing rank's
 * status comes before a peer's bad record signals. */
static int ref_dispatch(struct fabep_moe *m, int b, uint64_t seq)
{
	fep_fabric_t *fab = m->comm->fab;
	uint32_t cnt[FUZZ_MAX_SIZE], fl[FUZZ_MAX_SIZE], ann[4], got[4], all[4];
	int r, j, e, agreed = 0, bad_signals = 0, placed[FUZZ_MAX_SIZE];
	uint64_t rows = 0;
	size_t i;

	for (r = 0; r < m->size; r++) {
		struct fep_ep_hdr h;

		memcpy(&h, fep_heap_at(fab, fep_ep_dhdr(m, b, r)), sizeof(h));
		if (h.seq != seq || h.magic != FEP_EP_MAGIC)
			return REF_PROTOCOL;
		if (r != m->rank && h.chunks != 0 && h.chunks != m->dchunks - 1)
			bad_signals = 1;
		if (h.status) {
			if (h.status > 0 || h.status < -100000)
				return REF_PROTOCOL;
			if (!agreed)
				agreed = h.status;
			continue;
		}
		if (h.count > (uint32_t)m->cfg.max_tokens)
			return REF_PROTOCOL;
		cnt[r] = h.count;
		fl[r] = h.flags;
	}
	if (agreed)
		return agreed;
	if (bad_signals)
		return REF_PROTOCOL;
	for (r = 0; r < m->size; r++) {
		uint64_t sum = 0;

		memcpy(ann, (uint8_t *)fep_heap_at(fab, fep_ep_dhdr(m, b, r)) +
		       FEP_EP_HDR, 4 * (size_t)m->L);
		for (e = 0; e < m->L; e++)
			sum += ann[e];
		if (sum > (uint64_t)cnt[r] * (uint64_t)m->k)
			return REF_PROTOCOL;
		/* a peer that asks for its rows back as rows (its combine
		 * slot here holds max_tokens rows) sends no more */
		if (r != m->rank && (fl[r] & FEP_EP_HDR_ROWS) &&
		    sum > (uint64_t)m->cfg.max_tokens)
			return REF_PROTOCOL;
		rows += sum;
		/* where the header says every rank's rows per expert follow
		 * (and the handle has room for them), this rank's are those
		 * above */
		if (m->place_rows && (fl[r] & FEP_EP_HDR_COUNTS)) {
			memcpy(all, (uint8_t *)fep_heap_at(fab, fep_ep_dhdr(m, b, r)) -
			       m->dcnt_bytes + 4 * (size_t)m->L * (size_t)m->rank,
			       4 * (size_t)m->L);
			if (memcmp(all, ann, 4 * (size_t)m->L))
				return REF_PROTOCOL;
		}
	}
	/* a source that placed its rows (flag, all rows in the region, its
	 * mark with the call's stamp first) sends metadata records alone */
	for (r = 0; r < m->size; r++) {
		const uint8_t *slot = fep_heap_at(fab, fep_ep_dslot(m, b, r));
		struct fep_ep_hdr h;
		int32_t mk[2];

		memcpy(&h, slot + m->dhoff, sizeof(h));
		memcpy(mk, slot + m->hdr_recs * m->rec_bytes, sizeof(mk));
		placed[r] = r != m->rank && (h.flags & FEP_EP_HDR_PLACE) &&
			    rows <= m->place_rows && mk[0] == FEP_EP_PLACED_MARK &&
			    mk[1] == (int32_t)(uint32_t)seq;
	}
	for (r = 0; r < m->size; r++) {
		const uint8_t *slot = fep_heap_at(fab, fep_ep_dslot(m, b, r));

		memcpy(ann, slot + m->dhoff + FEP_EP_HDR, 4 * (size_t)m->L);
		memset(got, 0, sizeof(got));
		for (i = 0; i < cnt[r]; i++) {
			const uint8_t *rec = placed[r] ?
				slot + m->hdr_recs * m->rec_bytes + (1 + i) * m->meta_bytes :
				slot + (m->hdr_recs + i) * m->rec_bytes;
			int32_t t, id;

			memcpy(&t, rec, 4);
			if (t < 0 || t >= m->cfg.max_tokens)
				return REF_PROTOCOL;
			for (j = 0; j < m->k; j++) {
				memcpy(&id, rec + 8 + 4 * (size_t)j, 4);
				if (id < -1 || id >= m->cfg.num_experts)
					return REF_PROTOCOL;
				if (id / m->L == m->rank && id >= 0)
					got[id - m->rank * m->L]++;
			}
		}
		for (e = 0; e < m->L; e++)
			if (got[e] != ann[e])
				return REF_PROTOCOL;
	}
	return 0;
}

/* The same for set b's combine slots: each count must be what this rank
 * sent to that rank. */
static int ref_combine(struct fabep_moe *m, int b, uint64_t seq,
		       const uint32_t *sent)
{
	int r, agreed = 0;

	for (r = 0; r < m->size; r++) {
		struct fep_ep_hdr h;

		memcpy(&h, fep_heap_at(m->comm->fab, fep_ep_chdr(m, b, r)), sizeof(h));
		if (h.seq != seq || h.magic != FEP_EP_MAGIC)
			return REF_PROTOCOL;
		if (h.status) {
			if (h.status > 0 || h.status < -100000)
				return REF_PROTOCOL;
			if (!agreed)
				agreed = h.status;
			continue;
		}
		if (h.count != sent[r])
			return REF_PROTOCOL;
	}
	return agreed;
}

/* ret as the reference wants it */
static int ref_agrees(int ref, int ret)
{
	return ref == REF_PROTOCOL ? ret == -FABEP_ERR_PROTOCOL : ret == ref;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
	struct fuzz_in in = { data, n };
	fabep_moe_config_t cfg;
	struct fabep_comm comm;
	struct fep_fabric *fab;
	fep_boot_t boot;
	struct fabep_moe *m = NULL;
	struct fep_ep_set *s;
	uint8_t tt;
	size_t need, got, i;
	uint64_t seq = 7, sigs = 0;
	uint8_t modes[FUZZ_MAX_SIZE];
	int size, rank, r, b = 0, ret, ref;

	memset(&comm, 0, sizeof(comm));
	memset(&boot, 0, sizeof(boot));
	size = 1 + fuzz_u8(&in) % FUZZ_MAX_SIZE;
	rank = fuzz_u8(&in) % size;
	fabep_moe_config_init(&cfg);
	cfg.num_experts = size * (1 + fuzz_u8(&in) % 4);
	cfg.top_k = 1 + fuzz_u8(&in) % 4;
	cfg.hidden = 1 + fuzz_u8(&in) % 48;
	cfg.max_tokens = fuzz_u8(&in) % 9;
	tt = fuzz_u8(&in);
	cfg.token_type = (fabep_moe_type_t)(tt % 4);
	cfg.input_type = FABEP_MOE_BF16;
	cfg.combine_type = (tt & 4) ? FABEP_MOE_FP32 : FABEP_MOE_BF16;
	cfg.fp8_block = (tt & 8) && cfg.hidden >= 16 ? 16 : 0;
	cfg.buffer_sets = 1 + (tt >> 4) % 2;
#ifdef FABEP_MOE_ZERO_COPY
	if (tt & 32)
		cfg.flags |= FABEP_MOE_ZERO_COPY;
#endif
	need = fabep_moe_heap_bytes(&cfg, size);
	if (!need)
		return 0;

	fab = calloc(1, sizeof(*fab));
	if (!fab)
		abort();
	fab->heap_size = need;
	fab->heap = malloc(need);
	if (!fab->heap)
		abort();
	memset(fab->heap, 0, need);
	fab->rank = rank;
	fab->size = size;
	boot.rank = rank;
	boot.size = size;
	boot.allgather = fake_allgather;
	comm.rank = rank;
	comm.size = size;
	comm.boot = &boot;
	comm.fab = fab;
	comm.timeout_ms = 1000;
	/* the live handles' list, empty, as fabep_comm_create leaves it */
	comm.handles.prev = comm.handles.next = &comm.handles;
	ret = fabep_moe_create(&comm, &cfg, &m);
	FUZZ_CHECK(ret == 0);

	/* The dispatch slots of set b, as peers would have left them. */
	s = &m->set[b];
	s->seq = seq;
	for (r = 0; r < size; r++) {
		uint8_t *slot = fep_heap_at(fab, fep_ep_dhdr(m, b, r));  /* header */
		const uint8_t *p;

		modes[r] = fuzz_u8(&in);
		if (modes[r] & 1) {
			p = fuzz_bytes(&in, FEP_EP_HDR, &got);
			memcpy(slot, p, got);
		} else {
			uint32_t chunks = (uint32_t)modes[r] >> 4;
			uint32_t fl = (modes[r] & 16) ? FEP_EP_HDR_COUNTS : 0;

			fep_ep_hdr_write(slot, seq, (modes[r] & 2) ? -(int)fuzz_u8(&in) : 0,
					 (modes[r] & 4) ? fuzz_u32(&in) : fuzz_u8(&in) % 10);
			memcpy(slot + offsetof(struct fep_ep_hdr, chunks), &chunks, 4);
			memcpy(slot + offsetof(struct fep_ep_hdr, flags), &fl, 4);
		}
		if (!(modes[r] & 8)) {  /* rows per expert: fuzzed */
			p = fuzz_bytes(&in, 4 * (size_t)m->L, &got);
			memcpy(slot + FEP_EP_HDR, p, got);
		}
	}
	for (r = 0; r < size; r++) {
		uint8_t *recs = (uint8_t *)fep_heap_at(fab, fep_ep_dslot(m, b, r)) +
				m->hdr_recs * m->rec_bytes;
		const uint8_t *p;

		for (i = 0; i < (size_t)cfg.max_tokens && in.n; i++) {
			/* the metadata of each record: token, pad, ids, weights */
			p = fuzz_bytes(&in, m->meta_bytes, &got);
			memcpy(recs + i * m->rec_bytes, p, got);
		}
	}
	for (r = 0; r < size; r++) {  /* rows per expert: what the records hold */
		uint8_t *slot = fep_heap_at(fab, fep_ep_dslot(m, b, r));
		uint32_t cnt[4 * FUZZ_MAX_SIZE], hc;
		int32_t e;
		int j;

		if (!(modes[r] & 8))
			continue;
		memset(cnt, 0, sizeof(cnt));
		memcpy(&hc, slot + m->dhoff + offsetof(struct fep_ep_hdr, count), 4);
		for (i = 0; i < (size_t)cfg.max_tokens && i < hc; i++)
			for (j = 0; j < m->k; j++) {
				memcpy(&e, slot + (m->hdr_recs + i) * m->rec_bytes + 8 +
				       4 * (size_t)j, 4);
				if (e >= rank * m->L && e < (rank + 1) * m->L)
					cnt[e - rank * m->L]++;
			}
		memcpy(slot + m->dhoff + FEP_EP_HDR, cnt, 4 * (size_t)m->L);
	}
	for (r = 0; m->place_rows && r < size; r++) {  /* every rank's rows */
		uint8_t *hd = fep_heap_at(fab, fep_ep_dhdr(m, b, r));
		uint8_t *all = hd - m->dcnt_bytes + 4 * (size_t)m->L * (size_t)rank;

		if (modes[r] & 64) {  /* fuzzed */
			const uint8_t *p = fuzz_bytes(&in, 4 * (size_t)m->L, &got);

			memcpy(all, p, got);
		} else {
			memcpy(all, hd + FEP_EP_HDR, 4 * (size_t)m->L);
		}
	}

	ref = ref_dispatch(m, b, seq);
	ret = fep_ep_check_hdrs(m, "fuzz dispatch", fep_ep_dhdr(m, b, 0),
				m->dslot_bytes, seq, NULL, 0, s->rcount, &sigs, NULL);
	FUZZ_CHECK(ret <= 0);
	/* the records' target, whatever the verdict */
	FUZZ_CHECK(sigs == ref_signals(m, b, seq));
	if (!ret) {
		for (r = 0; r < size; r++)
			FUZZ_CHECK(s->rcount[r] <= (uint32_t)cfg.max_tokens);
		ret = build_begin(m, b, s);
		if (!ret && m->zcopy) {  /* the records' wait places the own */
			struct place_ctx o = { m, s, fep_heap_at(fab, fep_ep_dslot(m, b, 0)), NULL };

			ret = place_own(&o);
		}
		if (!ret)
			ret = build_end(m, b, s);
		FUZZ_CHECK(ret <= 0);
		/* rows are reserved only as the bounds allow: at most
		 * max_tokens * top_k from each rank */
		FUZZ_CHECK(s->cap_rows <= (size_t)size * (size_t)cfg.max_tokens *
					  (size_t)m->k);
		if (!ret)
			fuzz_check_result(m, b, s);
	}
	FUZZ_CHECK(ref_agrees(ref, ret));

	/* The combine slots: counts must be what this rank sent. */
	for (r = 0; r < size; r++) {
		uint8_t *slot = fep_heap_at(fab, fep_ep_chdr(m, b, r));
		uint8_t mode = fuzz_u8(&in);

		s->sent[r] = fuzz_u8(&in) % (uint32_t)(cfg.max_tokens + 1);
		if (mode & 1) {
			const uint8_t *p = fuzz_bytes(&in, FEP_EP_HDR, &got);

			memcpy(slot, p, got);
		} else {
			fep_ep_hdr_write(slot, seq, (mode & 2) ? -(int)fuzz_u8(&in) : 0,
					 (mode & 4) ? fuzz_u32(&in) : s->sent[r]);
		}
	}
	ref = ref_combine(m, b, seq, s->sent);
	ret = fep_ep_check_hdrs(m, "fuzz combine", fep_ep_chdr(m, b, 0),
				m->cslot_bytes, seq, s->sent, 0, s->rcount, NULL, NULL);
	FUZZ_CHECK(ret <= 0);
	FUZZ_CHECK(ref_agrees(ref, ret));
	if (!ret)
		for (r = 0; r < size; r++)
			FUZZ_CHECK(s->rcount[r] == s->sent[r]);

	fabep_moe_destroy(m);
	free(fab->heap);
	free(fab);
	return 0;
}
