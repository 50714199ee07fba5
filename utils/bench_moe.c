/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bench_moe.c - fabep_bench -o dispatch|combine|moe: latency and rate of
 * expert-parallel dispatch and combine, next to the raw fabep_put rate for
 * the same bytes per destination, measured in the same run.
 *
 * Every rank makes -t random tokens routed to -k distinct experts of -e;
 * the toy expert returns its input row (so a combine with weights w gives
 * sum(w) * x).  Timed on every rank, each iteration taking its slowest
 * rank's time: dispatch (dispatch_send + recv), combine (send + recv), or
 * both (moe).  Bytes are what rank 0 puts to other ranks in the timed
 * phases (payload, scales, metadata, headers); the reference puts the same
 * number of bytes to each peer with fabep_put and waits with fabep_flush,
 * with warm, live and cold caches (ref_puts).  Uses only the public API.
 *
 * Beside the whole phase, from fabep_moe_timing() of the same calls: the
 * wire time (posting the puts and waiting for the peers' runs) and the
 * local work (pack + build, or reduce + final sum), the latter next to a
 * memcpy of the same bytes (half of what the local work reads and writes)
 * on the pool's thread count, every rank at once; and the floor, the
 * least local traffic of the phase at that memcpy rate, with the best
 * ratio to the live reference it leaves (ceiling_live); and the overlap
 * bound, the live put timed while the pool's other threads copy the
 * floor's bytes (ceiling_overlap).
 * FABEP_BENCH_ZERO_COPY=1 creates the handle with FABEP_MOE_ZERO_COPY.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "utils/common.h"
#include "util/util.h"
#include "utils/bench.h"
#include "utils/tool_data.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void bench_cfg(const struct bench_opts *o, fabep_moe_config_t *cfg)
{
	fabep_moe_config_init(cfg);
	cfg->num_experts = o->experts > 0 ? o->experts : 256;
	cfg->top_k = o->topk > 0 ? o->topk : 8;
	cfg->hidden = o->hidden > 0 ? (size_t)o->hidden : 7168;
	cfg->max_tokens = o->tokens > 0 ? o->tokens : 128;
	{
		const char *z = getenv("FABEP_BENCH_ZERO_COPY");

		if (z && *z && strcmp(z, "0"))
			cfg->flags |= FABEP_MOE_ZERO_COPY;
	}
	if (o->format && !strcmp(o->format, "fp8")) {
		cfg->token_type = FABEP_MOE_FP8;
		cfg->input_type = FABEP_MOE_BF16;
		cfg->fp8_block = 128;
	} else if (o->format && !strcmp(o->format, "fp8pre")) {
		/* FP8 the caller quantized (as a fused norm + quantize kernel
		 * would produce), scales per 128 values */
		cfg->token_type = FABEP_MOE_FP8_PREQUANT;
		cfg->fp8_block = 128;
	} else if (o->format && !strcmp(o->format, "fp32")) {
		cfg->token_type = FABEP_MOE_FP32;
		cfg->combine_type = FABEP_MOE_FP32;
	}
}

size_t bench_moe_heap_bytes(const struct bench_opts *o, int nranks)
{
	fabep_moe_config_t cfg;
	size_t rec;

	bench_cfg(o, &cfg);
	/* the handle, plus the reference's send run and one run per source */
	rec = cfg.hidden * 8 + 16 * (size_t)cfg.top_k + 64;
	return fabep_moe_heap_bytes(&cfg, nranks) +
	       ((size_t)nranks + 1) * ((size_t)cfg.max_tokens * rec + 256) +
	       6 * (size_t)nranks * 8 * (size_t)(o->iters > 0 ? o->iters : 20) +
	       (4u << 20);
}

/* Every rank's n words v to rank 0: each rank's part of buf (size * n
 * words) is its own, signalled on ctr; rank 0 waits for round `round`
 * (1, 2, ...) of that counter, and then holds every part in buf. */
static int to_root(fabep_comm_t *comm, fabep_off_t buf, fabep_off_t ctr,
		   uint64_t round, const uint64_t *v, long n)
{
	int rank = fabep_comm_rank(comm), size = fabep_comm_size(comm), ret;
	size_t len = (size_t)n * 8;
	fabep_off_t part = buf + (uint64_t)rank * len;

	memcpy(fabep_heap_ptr(comm, part), v, len);
	if (rank) {
		ret = fabep_put_signal(comm, 0, part, part, len, ctr, 1);
		return ret ? ret : fabep_flush(comm);
	}
	return fabep_wait(comm, ctr, round * ((uint64_t)size - 1));
}

/* Rank 0 keeps the slowest rank's time t[i] of each iteration (round
 * `round` of ctr): a phase is done when its last rank is (a rank that
 * leaves the barrier late may have moved its peers' data before its clock
 * started, so one rank's times alone under- or overstate it). */
static int slowest(fabep_comm_t *comm, fabep_off_t buf, fabep_off_t ctr,
		   uint64_t round, uint64_t *t, long n)
{
	const uint64_t *b = fabep_heap_ptr(comm, buf);
	int r, ret;
	long i;

	if (n <= 0)
		return 0;
	ret = to_root(comm, buf, ctr, round, t, n);
	if (ret || fabep_comm_rank(comm))
		return ret;
	for (r = 1; r < fabep_comm_size(comm); r++)
		for (i = 0; i < n; i++)
			if (b[(size_t)r * (size_t)n + (size_t)i] > t[i])
				t[i] = b[(size_t)r * (size_t)n + (size_t)i];
	return 0;
}

/* Rank 0 learns whether every rank's check passed: round `round` of ctr
 * (one per call), a word per rank in `words`. */
int bench_gather_ok(fabep_comm_t *comm, fabep_off_t words, fabep_off_t ctr,
		    uint64_t round, int mine, int *all_ok)
{
	const uint64_t *w = fabep_heap_ptr(comm, words);
	uint64_t f = (uint64_t)(mine ? 2 : 1);
	int r, ret = to_root(comm, words, ctr, round, &f, 1);

	if (ret || fabep_comm_rank(comm))
		return ret;
	*all_ok = 1;
	for (r = 0; r < fabep_comm_size(comm); r++)
		if (__atomic_load_n(&w[r], __ATOMIC_ACQUIRE) != 2)
			*all_ok = 0;
	return 0;
}

/* How a reference round finds its buffers. */
struct ref_mode {
	char *evict;          /* cold: written before each round (evsz bytes) */
	size_t evsz;
	/* live: before each round the sender rewrites its source (src_len
	 * bytes) and each receiver reads what every peer p put into its
	 * region last round (rlen[p] bytes at dst_base + p * slot), as a
	 * layer makes its tokens and consumes what it received */
	int live;
	size_t src_len;
	const size_t *rlen;
	fabep_off_t dst_base;
	size_t slot;
	/* overlap: while this thread puts and flushes, the memcpy team's
	 * helpers copy ov_n bytes (the pool's workers doing the local work
	 * while the calling thread drives the fabric); the round ends when
	 * both are done */
	char *ov_dst;
	const char *ov_src;
	size_t ov_n;
};

static void mc_go(char *dst, const char *src, size_t n, int helpers_only);
static void mc_join(void);

/* Read n bytes (what a consumer of received rows does to the cache). */
static uint64_t touch(const char *p, size_t n)
{
	uint64_t s = 0, v;
	size_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		memcpy(&v, p + i, 8);
		s += v;
	}
	return s;
}

/* iters timed rounds (after warmup) of fabep_put of len[peer] bytes to
 * every peer and a flush, the buffers prepared as rm says.  Times in ns
 * go to t. */
static int ref_puts(fabep_comm_t *comm, fabep_off_t dst, fabep_off_t src,
		    const size_t *len, long warmup, long iters,
		    const struct ref_mode *rm, uint64_t *t)
{
	int rank = fabep_comm_rank(comm), size = fabep_comm_size(comm), e, ret;
	volatile uint64_t sink = 0;
	uint64_t t0;
	long it;

	for (it = -warmup; it < iters; it++) {
		if (rm && rm->evict)
			memset(rm->evict, (int)(it & 0x7f), rm->evsz);
		if (rm && rm->live) {
			memset(fabep_heap_ptr(comm, src), (int)(it & 0x7f), rm->src_len);
			for (e = 0; e < size; e++)
				if (e != rank)
					sink += touch(fabep_heap_ptr(comm, rm->dst_base +
								     (uint64_t)e * rm->slot),
						      rm->rlen[e]);
		}
		ret = fabep_barrier(comm);
		if (ret)
			return ret;
		t0 = tool_now_ns();
		if (rm && rm->ov_n)
			mc_go(rm->ov_dst, rm->ov_src, rm->ov_n, 1);
		for (e = 1; e < size; e++) {
			int peer = (rank + e) % size;

			ret = fabep_put(comm, peer, dst, src, len[peer]);
			if (ret)
				break;
		}
		if (!ret)
			ret = fabep_flush(comm);
		if (rm && rm->ov_n)
			mc_join();  /* even on error: the helpers must be idle */
		if (ret)
			return ret;
		if (it >= 0)
			t[it] = tool_now_ns() - t0;
	}
	(void)sink;
	return 0;
}

/* rlen[p] = what peer p's len says it puts to this rank (lens: size words
 * of the heap, ctr its counter; every rank's len first). */
static int swap_lens(fabep_comm_t *comm, fabep_off_t lens, fabep_off_t ctr,
		     const size_t *len, size_t *rlen)
{
	int rank = fabep_comm_rank(comm), size = fabep_comm_size(comm), p, ret;
	uint64_t *w = fabep_heap_ptr(comm, lens), *mine = w + size;

	for (p = 0; p < size; p++)
		mine[p] = len[p];
	for (p = 0; p < size; p++) {
		if (p == rank)
			continue;
		ret = fabep_put_signal(comm, p, lens + 8 * (uint64_t)rank,
				       lens + 8 * ((uint64_t)size + (uint64_t)p), 8,
				       ctr, 1);
		if (ret)
			return ret;
	}
	ret = fabep_flush(comm);
	if (!ret)
		ret = fabep_wait(comm, ctr, (uint64_t)size - 1);
	for (p = 0; !ret && p < size; p++)
		rlen[p] = p == rank ? 0 : (size_t)__atomic_load_n(&w[p], __ATOMIC_ACQUIRE);
	return ret;
}

/* The memcpy reference: a team of nt threads (this one and nt - 1
 * started once), each copying its share of the bytes when told, so a
 * round's time holds no thread start. */
struct mc_team {
	int nt, started;
	char *dst;
	const char *src;
	size_t n, per;
	int first;            /* 1: the caller takes no share (mc_go) */
	pthread_t th[64];
	int id[64];
	_Atomic unsigned gen, done;
	_Atomic int quit;
};

static struct mc_team g_mc;

static void mc_share(struct mc_team *t, int i)
{
	size_t off = (size_t)(i - t->first) * t->per;

	if (off < t->n)
		memcpy(t->dst + off, t->src + off,
		       t->per < t->n - off ? t->per : t->n - off);
}

static void *mc_thread(void *arg)
{
	struct mc_team *t = &g_mc;
	int i = *(const int *)arg;
	unsigned seen = 0, g, spins = 0;

	for (;;) {
		while ((g = atomic_load(&t->gen)) == seen) {
			if (atomic_load(&t->quit))
				return NULL;
			if (++spins > 64)
				sched_yield();  /* more threads than cores */
		}
		spins = 0;
		seen = g;
		mc_share(t, i);
		atomic_fetch_add(&t->done, 1);
	}
}

/* Start nt - 1 helpers (as many as can be started). */
static void mc_start(int nt)
{
	struct mc_team *t = &g_mc;
	int i;

	t->nt = nt < 1 ? 1 : nt > 64 ? 64 : nt;
	t->started = 1;
	atomic_init(&t->gen, 0);
	atomic_init(&t->done, 0);
	atomic_init(&t->quit, 0);
	for (i = 1; i < t->nt; i++) {
		t->id[i] = i;
		if (pthread_create(&t->th[i], NULL, mc_thread, &t->id[i]))
			break;
		t->started = i + 1;
	}
}

/* Start a round: copy n bytes from src to dst in 64-byte aligned shares,
 * one per thread of the team, or (helpers_only) one per started helper,
 * the calling thread left free; with no helper started, the caller copies
 * everything here.  mc_join() waits for the helpers. */
static void mc_go(char *dst, const char *src, size_t n, int helpers_only)
{
	struct mc_team *t = &g_mc;
	int i, ways;

	t->first = helpers_only && t->started > 1;
	ways = t->first ? t->started - 1 : t->nt;
	t->dst = dst;
	t->src = src;
	t->n = n;
	t->per = (n / (size_t)ways + 63) / 64 * 64;
	atomic_store(&t->done, 0);
	atomic_fetch_add(&t->gen, 1);
	if (t->first)
		return;
	mc_share(t, 0);
	for (i = t->started; i < t->nt; i++)
		mc_share(t, i);  /* the shares of helpers that did not start */
}

static void mc_join(void)
{
	struct mc_team *t = &g_mc;
	int i;

	for (i = 0; atomic_load(&t->done) < (unsigned)(t->started - 1); i++)
		if (i > 64)
			sched_yield();
}

/* One round on every thread of the team, the caller's share included. */
static void mc_round(char *dst, const char *src, size_t n)
{
	mc_go(dst, src, n, 0);
	mc_join();
}

static void mc_stop(void)
{
	struct mc_team *t = &g_mc;
	int i;

	atomic_store(&t->quit, 1);
	for (i = 1; i < t->started; i++)
		pthread_join(t->th[i], NULL);
	t->started = 0;
}

int bench_moe(fabep_comm_t *comm, const struct bench_opts *o, FILE *out)
{
	int rank = fabep_comm_rank(comm), size = fabep_comm_size(comm);
	int do_d = strcmp(o->op, "combine") != 0, do_c = strcmp(o->op, "dispatch") != 0;
	fabep_moe_config_t cfg;
	fabep_moe_t *moe = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	long iters = o->iters > 0 ? o->iters : 20;
	long warmup = o->warmup >= 0 ? o->warmup : 3, it, citers;
	size_t n, H, k, t, j, h, elt, rec, maxrun = 0, *dbytes = NULL;
	size_t bytes = 0, nsc, slot, *cbytes = NULL;
	uint64_t seed = 0x5eedull + (uint64_t)rank * 0x9e3779b97f4a7c15ull;
	uint64_t *lat = NULL, *ref = NULL, *wire = NULL, *loc = NULL, *mcp = NULL, t0;
	uint64_t *putt = NULL;  /* rank 0's put part of wire */
	uint64_t *cref = NULL, *lref = NULL, *oref = NULL;
	size_t *plen = NULL, *rlen = NULL;
	const void *din;
	int sbuf, pre, fp8;
	long expert_us = 0;  /* FABEP_BENCH_EXPERT_US */
	uint8_t *xq = NULL;   /* fp8pre: the tokens' codes [n, H] */
	char *x0 = NULL;      /* the tokens as made, rewritten before each call */
	size_t xbytes, xqbytes;
	float *xs = NULL;     /* fp8pre: their scales [n, nsc] */
	float lut[256];
	char *evict = NULL;
	size_t evsz = 0;
	struct ref_mode lrm = { 0 };  /* the live reference's buffers */
	fabep_moe_timing_t tm = { .size = sizeof(tm) };
	size_t recs_all = 0, dtok_all = 0, ptl = 0, lbytes = 0, fbytes = 0;
	char *mbuf = NULL;
	int32_t *ids = NULL;
	float *w = NULL;
	uint16_t *x = NULL, *outb = NULL, *y = NULL;
	fabep_off_t rsrc, rdst, flags, fctr, tbuf, tctr, lens, lctr;
	int ret, ok = 1, all_ok = 1, e, d, L;
	char *seen = NULL;

	bench_cfg(o, &cfg);
	{
		const char *e = getenv("FABEP_BENCH_SEND_BUFFER");

		sbuf = e && *e && strcmp(e, "0") && cfg.token_type != FABEP_MOE_FP8;
		if (fep_env_long("FABEP_BENCH_EXPERT_US", 0, 10000000, &expert_us) < 0)
			return -EINVAL;  /* logged */
	}
	n = (size_t)cfg.max_tokens;
	H = cfg.hidden;
	k = (size_t)cfg.top_k;
	L = cfg.num_experts / (size > 0 ? size : 1);
	if (cfg.num_experts % size || cfg.top_k > cfg.num_experts) {
		fprintf(stderr, "%s: -e %d experts must be a multiple of %d ranks and "
			"at least -k %d\n", tool_name, cfg.num_experts, size, cfg.top_k);
		return -EINVAL;
	}
	ret = fabep_moe_create(comm, &cfg, &moe);
	if (ret) {
		if (ret == -FABEP_ERR_HEAP_FULL && !rank)
			fprintf(stderr, "%s: set FABEP_HEAP_SIZE=%zu\n", tool_name,
				bench_moe_heap_bytes(o, size));
		return tool_fail("fabep_moe_create", ret);
	}
	pre = cfg.token_type == FABEP_MOE_FP8_PREQUANT;
	fp8 = cfg.token_type == FABEP_MOE_FP8 || pre;
	nsc = fp8 ? (H + 127) / 128 : 0;
	elt = cfg.token_type == FABEP_MOE_FP32 ? 4 : cfg.token_type == FABEP_MOE_BF16 ? 2 : 1;
	rec = (8 + 8 * k + 4 * nsc + 15) / 16 * 16 + elt * H;

	ids = malloc(n * k * sizeof(*ids) + 1);
	w = malloc(n * k * sizeof(*w) + 1);
	x = malloc(n * H * 4 + 4);
	xq = malloc(n * H + 1);
	xs = malloc(n * ((H + 127) / 128) * sizeof(float) + 4);
	e4m3_lut(lut);
	outb = malloc(n * H * 4 + 4);
	lat = calloc((size_t)iters + 1, sizeof(*lat));
	wire = calloc((size_t)iters + 1, sizeof(*wire));
	putt = calloc((size_t)iters + 1, sizeof(*putt));
	loc = calloc((size_t)iters + 1, sizeof(*loc));
	mcp = calloc((size_t)iters + 1, sizeof(*mcp));
	ref = calloc((size_t)iters + 1, sizeof(*ref));
	cref = calloc((size_t)iters + 1, sizeof(*cref));
	lref = calloc((size_t)iters + 1, sizeof(*lref));
	oref = calloc((size_t)iters + 1, sizeof(*oref));
	plen = calloc((size_t)size, sizeof(*plen));
	rlen = calloc((size_t)size, sizeof(*rlen));
	dbytes = calloc((size_t)size, sizeof(*dbytes));
	seen = calloc((size_t)size, 1);
	cbytes = calloc((size_t)size, sizeof(*cbytes));
	xbytes = n * H * (cfg.token_type == FABEP_MOE_FP32 ? 4 : 2);
	xqbytes = pre ? n * H + n * nsc * sizeof(float) : 0;
	x0 = malloc(xbytes + xqbytes + 1);
	if (!x0 || !xq || !xs || !cbytes || !cref || !lref || !oref || !rlen || !plen || !ids || !w || !x || !outb || !lat || !ref || !dbytes || !seen ||
	    !wire || !putt || !loc || !mcp) {
		ret = -ENOMEM;
		goto out;
	}
	/* tokens, distinct experts per token, weights */
	for (t = 0; t < n; t++) {
		size_t nd = 0;

		memset(seen, 0, (size_t)size);
		for (j = 0; j < k; j++) {
			int32_t ex;
			size_t q;

			do {
				ex = (int32_t)(rnd(&seed) % (uint64_t)cfg.num_experts);
				for (q = 0; q < j && ids[t * k + q] != ex; q++)
					;
			} while (q < j);
			ids[t * k + j] = ex;
			w[t * k + j] = (float)(rnd(&seed) % 1000) / 1000.0f + 0.01f;
			d = ex / L;
			if (!seen[d]) {
				seen[d] = 1;
				nd++;
				if (d != rank)
					dbytes[d] += rec;
			}
		}
		recs_all += nd;  /* records packed, self included */
		for (h = 0; h < H; h++) {
			float v = (float)((int)(rnd(&seed) % 2001) - 1000) / 500.0f;

			if (pre) {  /* a code and its value (exact in bf16) */
				int c = (int)(rnd(&seed) % 254);

				c += c >= 0x7f;
				xq[t * H + h] = (uint8_t)c;
				if (h % 128 == 0)
					xs[t * nsc + h / 128] = 1.0f / 64;
				v = lut[c] / 64;
			}
			if (cfg.token_type == FABEP_MOE_FP32)
				((float *)x)[t * H + h] = v;
			else
				x[t * H + h] = f2bf(v);
		}
	}
	for (d = 0; d < size; d++)
		if (d != rank) {
			dbytes[d] += 64;
			maxrun = dbytes[d] > maxrun ? dbytes[d] : maxrun;
		}
	/* the layer before makes the tokens just before each call, as the
	 * live reference rewrites its source: a copy to remake them from */
	memcpy(x0, x, xbytes);
	if (pre) {
		memcpy(x0 + xbytes, xq, n * H);
		memcpy(x0 + xbytes + n * H, xs, n * nsc * sizeof(float));
	}
	slot = n * (rec + H * 4) + 256;
	if ((ret = fabep_heap_alloc(comm, slot, 64, &rsrc)) ||
	    (ret = fabep_heap_alloc(comm, slot * (size_t)size, 64, &rdst)) ||
	    (ret = fabep_heap_alloc(comm, 8 * (size_t)size, 64, &flags)) ||
	    (ret = fabep_heap_alloc(comm, 8, 64, &fctr)) ||
	    (ret = fabep_heap_alloc(comm, 6 * (size_t)size * 8 * (size_t)iters, 64,
				    &tbuf)) ||
	    (ret = fabep_heap_alloc(comm, 16 * (size_t)size, 64, &lens)) ||
	    (ret = fabep_heap_alloc(comm, 8, 64, &lctr)) ||
	    (ret = fabep_heap_alloc(comm, 8, 64, &tctr))) {
		if (!rank)
			fprintf(stderr, "%s: set FABEP_HEAP_SIZE=%zu\n", tool_name,
				bench_moe_heap_bytes(o, size));
		tool_fail("fabep_heap_alloc", ret);
		goto out;
	}

	for (it = -warmup; it < iters; it++) {
		size_t crow = H * (cfg.combine_type == FABEP_MOE_FP32 ? 4 : 2);
		const float *dsc = pre ? xs : NULL;

		din = pre ? (const void *)xq : (const void *)x;
		if (sbuf) {
			/* the caller makes its tokens in the send buffer (untimed) */
			void *bx;
			float *bs;
			size_t st, sst, rb = H * elt;

			ret = fabep_moe_send_buffer(moe, &bx, &st, &bs, &sst);
			if (ret)
				goto fail_call;
			for (t = 0; t < n; t++) {
				memcpy((char *)bx + t * st, (const char *)din + t * rb, rb);
				if (pre)
					memcpy(bs + t * sst, xs + t * nsc, nsc * sizeof(float));
			}
			din = bx;
			dsc = pre ? bs : NULL;
		} else if (pre) {
			memcpy(xq, x0 + xbytes, n * H);
			memcpy(xs, x0 + xbytes + n * H, n * nsc * sizeof(float));
		} else {
			memcpy(x, x0, xbytes);
		}
		ret = fabep_barrier(comm);
		if (ret)
			goto fail_call;
		t0 = tool_now_ns();
		ret = fabep_moe_dispatch(moe, din, dsc, n, ids, w, &rv);
		if (ret)
			goto fail_call;
		if (do_d && it >= 0) {
			lat[it] = tool_now_ns() - t0;
			fabep_moe_timing(moe, &tm);
			wire[it] = tm.dispatch_put_ns + tm.dispatch_wait_ns;
			putt[it] = tm.dispatch_put_ns;
			loc[it] = tm.dispatch_pack_ns + tm.dispatch_build_ns;
		}
		/* toy expert: y = x, in the combine type */
		free(y);
		y = malloc(rv.rows * crow + 4);
		if (!y) {
			ret = -ENOMEM;
			goto out;
		}
		if (fp8) {
			for (size_t r = 0; r < rv.rows; r++) {
				const uint8_t *q = (const uint8_t *)rv.x +
					(size_t)rv.row_index[r] * rv.row_stride;
				const float *sc = rv.scales +
					(size_t)rv.row_index[r] * rv.scale_stride;

				for (h = 0; h < H; h++)
					y[r * H + h] = f2bf(lut[q[h]] * sc[h / 128]);
			}
		} else {
			for (size_t r = 0; r < rv.rows; r++)
				memcpy((char *)y + r * crow, (const char *)rv.x +
				       (size_t)rv.row_index[r] * rv.row_stride, crow);
		}
		if (it == -warmup) {
			/* combine bytes: one row per distinct token of each peer */
			char *tk = calloc((size_t)size * n + 1, 1);

			if (!tk) {
				ret = -ENOMEM;
				goto out;
			}
			for (size_t r = 0; r < rv.rows; r++) {
				int s = rv.src_info[3 * r];
				size_t tt = (size_t)rv.src_info[3 * r + 1];

				if (s != rank && !tk[(size_t)s * n + tt]) {
					tk[(size_t)s * n + tt] = 1;
					cbytes[s] += crow;
				}
			}
			for (d = 0; d < size; d++)
				if (d != rank)
					cbytes[d] += 64;
			for (size_t q = 0; q < (size_t)size * n; q++)
				dtok_all += tk[q] ? 1 : 0;
			/* tokens received from this rank itself */
			for (size_t r = 0; r < rv.rows; r++)
				if (rv.src_info[3 * r] == rank &&
				    !tk[(size_t)rank * n + (size_t)rv.src_info[3 * r + 1]]) {
					tk[(size_t)rank * n + (size_t)rv.src_info[3 * r + 1]] = 1;
					dtok_all++;
				}
			/* bytes read + written locally: lbytes by the timed
			 * parts as fabep does them, fbytes the least any
			 * implementation moves (the floor) */
			{
				/* the caller's rows; copying every received row
				 * into expert-major order; reading every expert
				 * output once and writing every output row once */
				size_t in_row = H * (cfg.token_type == FABEP_MOE_FP32 ? 4 : 2);
				size_t xmajor = cfg.flags & FABEP_MOE_ZERO_COPY ? 0 :
					2 * rv.rows * (elt * H + 4 * nsc);
				size_t reduce = (rv.rows + n) * crow;

				if (do_d) {  /* pack: rows in, records out */
					lbytes += recs_all * (rec + in_row) + xmajor;
					fbytes += xmajor;
					if (cfg.token_type == FABEP_MOE_FP8)
						fbytes += n * (in_row + H + 4 * nsc);
				}
				if (do_c) {  /* plus the partials, out and in */
					lbytes += reduce + (dtok_all + recs_all) * crow;
					fbytes += reduce;
				}
			}
			ptl = rv.rows;
			free(tk);
		}
		if (expert_us) {  /* the expert's compute: fabep's threads idle */
			struct timespec ts = { expert_us / 1000000,
					       (expert_us % 1000000) * 1000 };

			nanosleep(&ts, NULL);
		}
		ret = fabep_barrier(comm);
		if (ret)
			goto fail_call;
		t0 = tool_now_ns();
		ret = fabep_moe_combine(moe, y, H, 0, outb, H, NULL, NULL);
		if (ret)
			goto fail_call;
		if (it >= 0) {
			lat[it] = (do_d ? lat[it] : 0) + (do_c ? tool_now_ns() - t0 : 0);
			fabep_moe_timing(moe, &tm);
			if (!do_d)
				wire[it] = loc[it] = putt[it] = 0;
			if (do_c) {
				wire[it] += tm.combine_put_ns + tm.combine_wait_ns;
				putt[it] += tm.combine_put_ns;
				loc[it] += tm.combine_reduce_ns + tm.combine_sum_ns;
			}
		}
		if (o->check && it == iters - 1) {
			/* out[t] = sum_k w_k * x[t] within the format's error */
			for (t = 0; t < n && ok; t++) {
				float sw = 0, amax = 0;

				for (j = 0; j < k; j++)
					sw += w[t * k + j];
				for (h = 0; h < H; h++)
					amax = fmaxf(amax, fabsf(cfg.token_type == FABEP_MOE_FP32 ?
						((float *)x)[t * H + h] : bf2f(x[t * H + h])));
				for (h = 0; h < H; h++) {
					float xv = cfg.token_type == FABEP_MOE_FP32 ?
						((float *)x)[t * H + h] : bf2f(x[t * H + h]);
					float v = cfg.combine_type == FABEP_MOE_FP32 ?
						((float *)outb)[t * H + h] : bf2f(outb[t * H + h]);
					float tol = sw * fabsf(xv) * 0.03f + 1e-6f;

					if (cfg.token_type == FABEP_MOE_FP8)
						tol += sw * (fabsf(xv) / 15 + amax / 448 / 500);
					if (!(fabsf(v - sw * xv) <= tol)) {
						fprintf(stderr, "%s: rank %d token %zu col %zu: "
							"%g, want %g\n", tool_name, rank, t,
							h, v, sw * xv);
						ok = 0;
						break;
					}
				}
			}
		}
	}
	/* the reference: the same bytes to each peer with fabep_put, with
	 * warm caches (the same source and destination every round: both
	 * stay in the caches of whoever copies), live ones (the sender
	 * rewrites its source and the receiver reads what arrived, as in the
	 * phase's loop), then cold ones: every rank first writes a buffer of
	 * twice the last-level cache (64 to 256 MiB), as the phases find
	 * their inputs after the rest of a layer's traffic */
	for (e = 1; e < size; e++) {
		int peer = (rank + e) % size;

		plen[peer] = (do_d ? dbytes[peer] : 0) + (do_c ? cbytes[peer] : 0);
	}
	{
		long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
		size_t ev = l3 > 0 ? 2 * (size_t)l3 : 0;

		if (ev > ((size_t)256 << 20))
			ev = (size_t)256 << 20;
		evsz = ev > ((size_t)64 << 20) ? ev : ((size_t)64 << 20);
	}
	citers = iters < 20 ? iters : 20;
	evict = malloc(evsz);
	if (!evict) {
		ret = -ENOMEM;
		goto out;
	}
	ret = ref_puts(comm, rdst + (uint64_t)rank * slot, rsrc, plen, warmup,
		       iters, NULL, ref);
	if (!ret)
		ret = swap_lens(comm, lens, lctr, plen, rlen);
	lrm.live = 1;
	for (d = 0; d < size; d++)
		lrm.src_len = plen[d] > lrm.src_len ? plen[d] : lrm.src_len;
	lrm.rlen = rlen;
	lrm.dst_base = rdst;
	lrm.slot = slot;
	if (!ret)
		ret = ref_puts(comm, rdst + (uint64_t)rank * slot, rsrc, plen, warmup,
			       iters, &lrm, lref);
	if (!ret) {
		struct ref_mode rm = { 0 };

		rm.evict = evict;
		rm.evsz = evsz;
		ret = ref_puts(comm, rdst + (uint64_t)rank * slot, rsrc, plen, warmup,
			       citers, &rm, cref);
	}
	/* phase and references alike: each iteration's slowest rank */
	{
		uint64_t part = (uint64_t)size * 8 * (uint64_t)iters;

		if (!ret)
			ret = slowest(comm, tbuf, tctr, 1, lat, iters);
		if (!ret)
			ret = slowest(comm, tbuf + part, tctr, 2, ref, iters);
		if (!ret)
			ret = slowest(comm, tbuf + 2 * part, tctr, 3, cref, citers);
		if (!ret)
			ret = slowest(comm, tbuf + 3 * part, tctr, 4, lref, iters);
	}
	if (ret)
		goto fail_call;
	/* memcpy of half the local bytes (a memcpy reads and writes each),
	 * on as many threads as the communicator's pool, every rank at once:
	 * the memory rate the local work could have */
	mbuf = malloc(lbytes + 128);
	if (!mbuf) {
		ret = -ENOMEM;
		goto out;
	}
	memset(mbuf, 1, lbytes + 128);
	mc_start(fabep_comm_threads(comm));
	for (it = -warmup; it < iters; it++) {
		ret = fabep_barrier(comm);
		if (ret)
			break;
		t0 = tool_now_ns();
		mc_round(mbuf + lbytes / 2 + 64, mbuf, lbytes / 2);
		if (it >= 0)
			mcp[it] = tool_now_ns() - t0;
	}
	/* the overlap bound: the live put while the pool's other threads
	 * copy the floor's bytes (half of them: a copy reads and writes),
	 * every rank at once */
	if (!ret && fbytes) {
		struct ref_mode rm = lrm;

		rm.ov_n = (fbytes < lbytes ? fbytes : lbytes) / 2;
		rm.ov_src = mbuf;
		rm.ov_dst = mbuf + lbytes / 2 + 64;
		ret = ref_puts(comm, rdst + (uint64_t)rank * slot, rsrc, plen, warmup,
			       iters, &rm, oref);
	}
	mc_stop();
	if (ret)
		goto fail_call;
	ret = slowest(comm, tbuf + 4 * (uint64_t)size * 8 * (uint64_t)iters, tctr,
		      5, mcp, iters);
	if (!ret && fbytes)
		ret = slowest(comm, tbuf + 5 * (uint64_t)size * 8 * (uint64_t)iters,
			      tctr, 6, oref, iters);
	if (ret)
		goto fail_call;
	for (d = 0; d < size; d++)
		if (d != rank) {
			if (do_d)
				bytes += dbytes[d];
			if (do_c)
				bytes += cbytes[d];
		}
	ret = bench_gather_ok(comm, flags, fctr, 1, ok, &all_ok);
	if (ret)
		goto fail_call;
	if (!rank) {
		const char *fmt = o->format ? o->format : "bf16";
		const char *chk = !o->check ? "off" : all_ok ? "ok" : "failed";
		const char *mode = cfg.flags & FABEP_MOE_ZERO_COPY ? "zcopy" : "copy";
		double med, mn, rmed, gbps, rgbps, wmed, lmed, mmed, cmed, cgbps;
		double lvmed, lgbps, fmed, ceil_live, omed, ceil_ov;

		qsort(lat, (size_t)iters, sizeof(*lat), cmp_u64);
		qsort(ref, (size_t)iters, sizeof(*ref), cmp_u64);
		qsort(cref, (size_t)citers, sizeof(*cref), cmp_u64);
		qsort(lref, (size_t)iters, sizeof(*lref), cmp_u64);
		qsort(wire, (size_t)iters, sizeof(*wire), cmp_u64);
		qsort(putt, (size_t)iters, sizeof(*putt), cmp_u64);
		qsort(loc, (size_t)iters, sizeof(*loc), cmp_u64);
		qsort(mcp, (size_t)iters, sizeof(*mcp), cmp_u64);
		qsort(oref, (size_t)iters, sizeof(*oref), cmp_u64);
		wmed = (double)wire[iters / 2] / 1e3;
		lmed = (double)loc[iters / 2] / 1e3;
		mmed = (double)mcp[iters / 2] / 1e3;
		med = (double)lat[iters / 2] / 1e3;
		mn = (double)lat[0] / 1e3;
		rmed = (double)ref[iters / 2] / 1e3;
		gbps = med > 0 ? (double)bytes / (med * 1e3) : 0;
		rgbps = rmed > 0 ? (double)bytes / (rmed * 1e3) : 0;
		cmed = (double)cref[citers / 2] / 1e3;
		cgbps = cmed > 0 ? (double)bytes / (cmed * 1e3) : 0;
		lvmed = (double)lref[iters / 2] / 1e3;
		lgbps = lvmed > 0 ? (double)bytes / (lvmed * 1e3) : 0;
		/* the floor: the least local traffic at the memcpy rate; no
		 * implementation beats the larger of it and the live write */
		fmed = lbytes ? mmed * (double)fbytes / (double)lbytes : 0;
		ceil_live = lvmed > 0 ? lvmed / (fmed > lvmed ? fmed : lvmed) : 0;
		/* the overlap bound: the write and the floor's traffic at
		 * once, sharing the machine as a phase's do; it does not
		 * charge what must come before the write or after it */
		omed = fbytes ? (double)oref[iters / 2] / 1e3 : lvmed;
		ceil_ov = lvmed > 0 ? lvmed / (omed > lvmed ? omed : lvmed) : 0;
		if (o->machine)
			fprintf(out, "op: %s provider: %s ranks: %d tokens: %zu hidden: %zu "
				"topk: %zu experts: %d format: %s bytes: %zu median_us: %.1f "
				"min_us: %.1f GBps: %.3f ref_GBps: %.3f ratio: %.3f "
				"mode: %s ref_us: %.1f wire_us: %.1f wire_ratio: %.3f "
				"local_us: %.1f local_bytes: %zu memcpy_us: %.1f "
				"local_vs_memcpy: %.3f rows: %zu input: %s ref_cold_us: %.1f "
				"ref_cold_GBps: %.3f ratio_cold: %.3f ref_live_us: %.1f "
				"ref_live_GBps: %.3f ratio_live: %.3f floor_bytes: %zu "
				"floor_us: %.1f ceiling_live: %.3f overlap_us: %.1f "
				"ceiling_overlap: %.3f channels: %d check: %s "
				"put_us: %.1f signal: %s\n", o->op,
				fabep_comm_provider(comm), size, n, H, k,
				cfg.num_experts, fmt, bytes, med, mn, gbps, rgbps,
				rgbps > 0 ? gbps / rgbps : 0, mode, rmed, wmed,
				wmed > 0 ? rmed / wmed : 0, lmed, lbytes, mmed,
				lmed > 0 ? mmed / lmed : 0, ptl,
				sbuf ? "send_buffer" : "caller", cmed, cgbps,
				cgbps > 0 ? gbps / cgbps : 0, lvmed, lgbps,
				lgbps > 0 ? gbps / lgbps : 0, fbytes, fmed, ceil_live,
				omed, ceil_ov, fabep_comm_channels(comm), chk,
				(double)putt[iters / 2] / 1e3,
				fabep_signal_name(fabep_comm_signal(comm)));
		else {
			fprintf(out, "# %s -o %s: provider %s, %d ranks, %d threads, "
				"%d channels, rank 0's figures; bytes = what rank 0 "
				"put to other ranks; ref = fabep_put of the same bytes "
				"(one write per peer, on one channel)\n", tool_name,
				o->op, fabep_comm_provider(comm), size,
				fabep_comm_threads(comm), fabep_comm_channels(comm));
			fprintf(out, "%-9s %-5s %7s %6s %4s %5s %12s %11s %11s %8s %8s "
				"%6s %6s\n", "op", "fmt", "tokens", "hidden", "topk",
				"exp", "bytes", "median_us", "min_us", "GB/s", "ref_GB/s",
				"ratio", "check");
			fprintf(out, "%-9s %-5s %7zu %6zu %4zu %5d %12zu %11.1f %11.1f "
				"%8.3f %8.3f %6.3f %6s\n", o->op, fmt, n, H, k,
				cfg.num_experts, bytes, med, mn, gbps, rgbps,
				rgbps > 0 ? gbps / rgbps : 0, chk);
			fprintf(out, "# mode %s: wire (puts + waits) median %.1f us, "
				"ratio to ref %.3f; local work median %.1f us for %zu "
				"bytes moved, memcpy of half of them %.1f us (%.3f of "
				"memcpy's rate)\n", mode, wmed, wmed > 0 ? rmed / wmed : 0,
				lmed, lbytes, mmed, lmed > 0 ? mmed / lmed : 0);
			fprintf(out, "# live reference (source rewritten, received "
				"bytes read before each put): %.1f us, %.3f GB/s, ratio "
				"%.3f\n", lvmed, lgbps, lgbps > 0 ? gbps / lgbps : 0);
			fprintf(out, "# cold-cache reference (caches flushed before each "
				"put): %.1f us, %.3f GB/s, ratio %.3f\n", cmed, cgbps,
				cgbps > 0 ? gbps / cgbps : 0);
			fprintf(out, "# floor: the least local traffic of this phase "
				"(%zu bytes) at the memcpy rate takes %.1f us; no "
				"implementation exceeds ratio %.3f to the live "
				"reference here\n", fbytes, fmed, ceil_live);
			fprintf(out, "# overlap: the live put while the pool's other "
				"threads copy the floor's bytes takes %.1f us; even a "
				"phase that overlapped all its local work with the wire "
				"would not exceed ratio %.3f here\n", omed, ceil_ov);
		}
		fflush(out);
		if (o->check && !all_ok)
			ret = -FABEP_ERR_PEER;
	}
	goto out;
fail_call:
	tool_fail(o->op, ret);
out:
	fabep_moe_destroy(moe);
	free(ids);
	free(w);
	free(x);
	free(x0);
	free(xq);
	free(xs);
	free(outb);
	free(y);
	free(lat);
	free(ref);
	free(cref);
	free(lref);
	free(oref);
	free(plen);
	free(rlen);
	free(evict);
	free(wire);
	free(putt);
	free(loc);
	free(mcp);
	free(mbuf);
	free(dbytes);
	free(seen);
	free(cbytes);
	return ret;
}
