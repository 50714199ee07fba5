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
	if (tool_env_on("FABEP_BENCH_ZERO_COPY"))
		cfg->flags |= FABEP_MOE_ZERO_COPY;
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
	       7 * (size_t)nranks * 8 * (size_t)bench_moe_iters(o, (int)cfg.max_tokens) +
	       (4u << 20);
}

int bench_moe_check(const struct bench_opts *o, int nranks, char *why,
		    size_t len)
{
	fabep_moe_config_t cfg;
	size_t heap;

	bench_cfg(o, &cfg);
	if (!fabep_moe_heap_bytes(&cfg, nranks)) {
		snprintf(why, len, "-o %s: fabep makes no MoE handle of hidden %zu, "
			 "top-%d of %d experts, %d token%s, -f %s on %d ranks "
			 "(fabep_moe_create(3) gives the limits)", o->op,
			 cfg.hidden, cfg.top_k, cfg.num_experts, cfg.max_tokens,
			 cfg.max_tokens == 1 ? "" : "s",
			 o->format ? o->format : "bf16", nranks);
		return -EINVAL;
	}
	heap = bench_moe_heap_bytes(o, nranks);
	if (heap > ((size_t)1 << 40)) {
		snprintf(why, len, "-o %s: hidden %zu and %d tokens on %d ranks need "
			 "a heap of %zu bytes, more than fabep's 1 TiB", o->op,
			 cfg.hidden, cfg.max_tokens, nranks, heap);
		return -E2BIG;
	}
	return 0;
}

int bench_moe_iters(const struct bench_opts *o, int tokens)
{
	return o->iters > 0 ? o->iters : tokens <= 8 ? 200 : 20;
}

int bench_moe_warmup(const struct bench_opts *o, int tokens)
{
	return o->warmup >= 0 ? o->warmup : tokens <= 8 ? 20 : 3;
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
 * `round`, 1 to BENCH_ROUNDS, on its own word of ctrs): a phase is done
 * when its last rank is (a rank that leaves the barrier late may have
 * moved its peers' data before its clock started, so one rank's times
 * alone under- or overstate it).  Each round counts on a word of its
 * own: the ranks post their rounds one after the other without waiting,
 * and on a shared word a fast rank's later rounds would make up the count
 * of a round whose slow rank's times had not come. */
#define BENCH_ROUNDS 8
static int slowest(fabep_comm_t *comm, fabep_off_t buf, fabep_off_t ctrs,
		   uint64_t round, uint64_t *t, long n)
{
	const uint64_t *b = fabep_heap_ptr(comm, buf);
	int r, ret;
	long i;

	if (n <= 0)
		return 0;
	ret = to_root(comm, buf, ctrs + 8 * (round - 1), 1, t, n);
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

/* One run of bench_moe: its configuration, the tokens, the per-iteration
 * times and the byte counts its steps share. */
struct moe_bench {
	fabep_comm_t *comm;
	const struct bench_opts *o;
	int rank, size, do_d, do_c, sbuf, pre, fp8, L;
	int do_pull;          /* FABEP_BENCH_PULL: the pull reference */
	fabep_moe_config_t cfg;
	fabep_moe_t *moe;
	fabep_moe_recv_t rv;
	fabep_moe_timing_t tm;
	long iters, warmup, citers;
	long expert_us;       /* FABEP_BENCH_EXPERT_US */
	long slow_us, slow_rank; /* FABEP_BENCH_SLOW_US, FABEP_BENCH_SLOW_RANK */
	/* every rank's median call (rank 0, from the phase's times): the
	 * least, the median rank's, the largest, and the rank with it */
	uint64_t rk_min, rk_med, rk_max;
	int rk_at;
	size_t n, H, k, elt, rec, nsc, slot, crow;
	size_t maxrun, bytes, xbytes, xqbytes, evsz, ptl;
	size_t recs_all, dtok_all, lbytes, fbytes;
	uint64_t seed;
	uint64_t *lat, *ref, *wire, *loc, *mcp, *cref, *lref, *oref, *pull;
	uint64_t *putt;       /* rank 0's put part of wire */
	size_t *plen, *rlen, *dbytes, *cbytes;
	uint8_t *xq;          /* fp8pre: the tokens' codes [n, H] */
	char *x0;             /* the tokens as made, rewritten before each call */
	float *xs;            /* fp8pre: their scales [n, nsc] */
	float lut[256];
	char *evict, *mbuf, *seen;
	struct ref_mode lrm;  /* the live reference's buffers */
	int32_t *ids;
	float *w;
	uint16_t *x, *outb, *y;
	fabep_off_t rsrc, rdst, flags, fctr, tbuf, tctr, lens, lctr;
	int ok, all_ok;
};

static void pause_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* FABEP_BENCH_SLOW_US on FABEP_BENCH_SLOW_RANK: that rank's clock runs
 * on for the pause after each timed call has returned, as a rank slow
 * in its own work would; the next call's barrier absorbs it, so the
 * others' times stay what they are. */
static void mb_slow(const struct moe_bench *s)
{
	if (s->slow_us && s->rank == s->slow_rank)
		pause_us(s->slow_us);
}

/* The configuration from the options and the environment, and the
 * handle; nothing to free on failure. */
static int mb_setup(struct moe_bench *s)
{
	fabep_moe_config_t *cfg = &s->cfg;
	int ret;

	bench_cfg(s->o, cfg);
	s->sbuf = tool_env_on("FABEP_BENCH_SEND_BUFFER") &&
		  cfg->token_type != FABEP_MOE_FP8;
	s->do_pull = tool_env_on("FABEP_BENCH_PULL");
	if (fep_env_long("FABEP_BENCH_EXPERT_US", 0, 10000000, &s->expert_us) < 0 ||
	    fep_env_long("FABEP_BENCH_SLOW_US", 0, 10000000, &s->slow_us) < 0 ||
	    fep_env_long("FABEP_BENCH_SLOW_RANK", 0, s->size - 1, &s->slow_rank) < 0)
		return -EINVAL;  /* logged */
	s->n = (size_t)cfg->max_tokens;
	s->H = cfg->hidden;
	s->k = (size_t)cfg->top_k;
	s->L = cfg->num_experts / (s->size > 0 ? s->size : 1);
	if (cfg->num_experts % s->size || cfg->top_k > cfg->num_experts) {
		fprintf(stderr, "%s: -e %d experts must be a multiple of %d ranks and "
			"at least -k %d\n", tool_name, cfg->num_experts, s->size,
			cfg->top_k);
		return -EINVAL;
	}
	ret = fabep_moe_create(s->comm, cfg, &s->moe);
	if (ret) {
		if (ret == -FABEP_ERR_HEAP_FULL && !s->rank)
			fprintf(stderr, "%s: set FABEP_HEAP_SIZE=%zu\n", tool_name,
				bench_moe_heap_bytes(s->o, s->size));
		return tool_fail("fabep_moe_create", ret);
	}
	s->pre = cfg->token_type == FABEP_MOE_FP8_PREQUANT;
	s->fp8 = cfg->token_type == FABEP_MOE_FP8 || s->pre;
	s->nsc = s->fp8 ? (s->H + 127) / 128 : 0;
	s->elt = cfg->token_type == FABEP_MOE_FP32 ? 4 :
		cfg->token_type == FABEP_MOE_BF16 ? 2 : 1;
	s->rec = (8 + 8 * s->k + 4 * s->nsc + 15) / 16 * 16 + s->elt * s->H;
	s->crow = s->H * (cfg->combine_type == FABEP_MOE_FP32 ? 4 : 2);
	return 0;
}

/* The host buffers: tokens, routing, outputs and per-iteration times. */
static int mb_alloc(struct moe_bench *s)
{
	size_t n = s->n, H = s->H, k = s->k, ni = (size_t)s->iters + 1;
	size_t size = (size_t)s->size;

	s->ids = malloc(n * k * sizeof(*s->ids) + 1);
	s->w = malloc(n * k * sizeof(*s->w) + 1);
	s->x = malloc(n * H * 4 + 4);
	s->xq = malloc(n * H + 1);
	s->xs = malloc(n * ((H + 127) / 128) * sizeof(float) + 4);
	e4m3_lut(s->lut);
	s->outb = malloc(n * H * 4 + 4);
	s->lat = calloc(ni, sizeof(*s->lat));
	s->wire = calloc(ni, sizeof(*s->wire));
	s->putt = calloc(ni, sizeof(*s->putt));
	s->loc = calloc(ni, sizeof(*s->loc));
	s->mcp = calloc(ni, sizeof(*s->mcp));
	s->ref = calloc(ni, sizeof(*s->ref));
	s->cref = calloc(ni, sizeof(*s->cref));
	s->lref = calloc(ni, sizeof(*s->lref));
	s->oref = calloc(ni, sizeof(*s->oref));
	s->pull = calloc(ni, sizeof(*s->pull));
	s->plen = calloc(size, sizeof(*s->plen));
	s->rlen = calloc(size, sizeof(*s->rlen));
	s->dbytes = calloc(size, sizeof(*s->dbytes));
	s->seen = calloc(size, 1);
	s->cbytes = calloc(size, sizeof(*s->cbytes));
	s->xbytes = n * H * (s->cfg.token_type == FABEP_MOE_FP32 ? 4 : 2);
	s->xqbytes = s->pre ? n * H + n * s->nsc * sizeof(float) : 0;
	s->x0 = malloc(s->xbytes + s->xqbytes + 1);
	if (!s->x0 || !s->xq || !s->xs || !s->cbytes || !s->cref || !s->lref ||
	    !s->oref || !s->pull || !s->rlen || !s->plen || !s->ids || !s->w || !s->x ||
	    !s->outb || !s->lat || !s->ref || !s->dbytes || !s->seen ||
	    !s->wire || !s->putt || !s->loc || !s->mcp)
		return -ENOMEM;
	return 0;
}

/* Random tokens, distinct experts per token and their weights; the bytes
 * dispatch puts to each peer; a copy of the tokens to remake them from. */
static void mb_make_tokens(struct moe_bench *s)
{
	size_t n = s->n, H = s->H, k = s->k, nsc = s->nsc, t, j, h;
	int d;

	for (t = 0; t < n; t++) {
		size_t nd = 0;

		memset(s->seen, 0, (size_t)s->size);
		for (j = 0; j < k; j++) {
			int32_t ex;
			size_t q;

			do {
				ex = (int32_t)(rnd(&s->seed) % (uint64_t)s->cfg.num_experts);
				for (q = 0; q < j && s->ids[t * k + q] != ex; q++)
					;
			} while (q < j);
			s->ids[t * k + j] = ex;
			s->w[t * k + j] = (float)(rnd(&s->seed) % 1000) / 1000.0f + 0.01f;
			d = ex / s->L;
			if (!s->seen[d]) {
				s->seen[d] = 1;
				nd++;
				if (d != s->rank)
					s->dbytes[d] += s->rec;
			}
		}
		s->recs_all += nd;  /* records packed, self included */
		for (h = 0; h < H; h++) {
			float v = (float)((int)(rnd(&s->seed) % 2001) - 1000) / 500.0f;

			if (s->pre) {  /* a code and its value (exact in bf16) */
				int c = (int)(rnd(&s->seed) % 254);

				c += c >= 0x7f;
				s->xq[t * H + h] = (uint8_t)c;
				if (h % 128 == 0)
					s->xs[t * nsc + h / 128] = 1.0f / 64;
				v = s->lut[c] / 64;
			}
			if (s->cfg.token_type == FABEP_MOE_FP32)
				((float *)s->x)[t * H + h] = v;
			else
				s->x[t * H + h] = f2bf(v);
		}
	}
	for (d = 0; d < s->size; d++)
		if (d != s->rank) {
			s->dbytes[d] += 64;
			s->maxrun = s->dbytes[d] > s->maxrun ? s->dbytes[d] : s->maxrun;
		}
	/* the layer before makes the tokens just before each call, as the
	 * live reference rewrites its source: a copy to remake them from */
	memcpy(s->x0, s->x, s->xbytes);
	if (s->pre) {
		memcpy(s->x0 + s->xbytes, s->xq, n * H);
		memcpy(s->x0 + s->xbytes + n * H, s->xs, n * nsc * sizeof(float));
	}
}

/* The symmetric-heap buffers of the references and the gathers. */
static int mb_heap(struct moe_bench *s)
{
	fabep_comm_t *comm = s->comm;
	size_t size = (size_t)s->size;
	int ret;

	s->slot = s->n * (s->rec + s->H * 4) + 256;
	if ((ret = fabep_heap_alloc(comm, s->slot, 64, &s->rsrc)) ||
	    (ret = fabep_heap_alloc(comm, s->slot * size, 64, &s->rdst)) ||
	    (ret = fabep_heap_alloc(comm, 8 * size, 64, &s->flags)) ||
	    (ret = fabep_heap_alloc(comm, 8, 64, &s->fctr)) ||
	    (ret = fabep_heap_alloc(comm, 7 * size * 8 * (size_t)s->iters, 64,
				    &s->tbuf)) ||
	    (ret = fabep_heap_alloc(comm, 16 * size, 64, &s->lens)) ||
	    (ret = fabep_heap_alloc(comm, 8, 64, &s->lctr)) ||
	    (ret = fabep_heap_alloc(comm, 8 * BENCH_ROUNDS, 64, &s->tctr))) {
		if (!s->rank)
			fprintf(stderr, "%s: set FABEP_HEAP_SIZE=%zu\n", tool_name,
				bench_moe_heap_bytes(s->o, s->size));
		tool_fail("fabep_heap_alloc", ret);
	}
	return ret;
}

/* Remake the tokens before a call (untimed): in the send buffer when the
 * caller makes them there, else in its own buffers.  Sets the input. */
static int mb_prep_input(struct moe_bench *s, const void **din,
			 const float **dsc)
{
	size_t n = s->n, H = s->H, nsc = s->nsc, t;

	*din = s->pre ? (const void *)s->xq : (const void *)s->x;
	*dsc = s->pre ? s->xs : NULL;
	if (s->sbuf) {
		/* the caller makes its tokens in the send buffer (untimed) */
		void *bx;
		float *bs;
		size_t st, sst, rb = H * s->elt;
		int ret = fabep_moe_send_buffer(s->moe, &bx, &st, &bs, &sst);

		if (ret)
			return ret;
		for (t = 0; t < n; t++) {
			memcpy((char *)bx + t * st, (const char *)*din + t * rb, rb);
			if (s->pre)
				memcpy(bs + t * sst, s->xs + t * nsc, nsc * sizeof(float));
		}
		*din = bx;
		*dsc = s->pre ? bs : NULL;
	} else if (s->pre) {
		memcpy(s->xq, s->x0 + s->xbytes, n * H);
		memcpy(s->xs, s->x0 + s->xbytes + n * H, n * nsc * sizeof(float));
	} else {
		memcpy(s->x, s->x0, s->xbytes);
	}
	return 0;
}

/* The toy expert: y = x, in the combine type. */
static int mb_expert(struct moe_bench *s)
{
	const fabep_moe_recv_t *rv = &s->rv;
	size_t H = s->H, h;

	free(s->y);
	s->y = malloc(rv->rows * s->crow + 4);
	if (!s->y)
		return -ENOMEM;
	if (s->fp8) {
		for (size_t r = 0; r < rv->rows; r++) {
			const uint8_t *q = (const uint8_t *)rv->x +
				(size_t)rv->row_index[r] * rv->row_stride;
			const float *sc = rv->scales +
				(size_t)rv->row_index[r] * rv->scale_stride;

			for (h = 0; h < H; h++)
				s->y[r * H + h] = f2bf(s->lut[q[h]] * sc[h / 128]);
		}
	} else {
		for (size_t r = 0; r < rv->rows; r++)
			memcpy((char *)s->y + r * s->crow, (const char *)rv->x +
			       (size_t)rv->row_index[r] * rv->row_stride, s->crow);
	}
	return 0;
}

/* After the first dispatch: the bytes combine puts to each peer, and the
 * bytes read and written locally by the timed parts and at the floor. */
static int mb_count_bytes(struct moe_bench *s)
{
	const fabep_moe_recv_t *rv = &s->rv;
	size_t n = s->n, H = s->H, crow = s->crow;
	int rank = s->rank, d;
	/* combine bytes: one row per distinct token of each peer */
	char *tk = calloc((size_t)s->size * n + 1, 1);

	if (!tk)
		return -ENOMEM;
	for (size_t r = 0; r < rv->rows; r++) {
		int src = rv->src_info[3 * r];
		size_t tt = (size_t)rv->src_info[3 * r + 1];

		if (src != rank && !tk[(size_t)src * n + tt]) {
			tk[(size_t)src * n + tt] = 1;
			s->cbytes[src] += crow;
		}
	}
	for (d = 0; d < s->size; d++)
		if (d != rank)
			s->cbytes[d] += 64;
	for (size_t q = 0; q < (size_t)s->size * n; q++)
		s->dtok_all += tk[q] ? 1 : 0;
	/* tokens received from this rank itself */
	for (size_t r = 0; r < rv->rows; r++)
		if (rv->src_info[3 * r] == rank &&
		    !tk[(size_t)rank * n + (size_t)rv->src_info[3 * r + 1]]) {
			tk[(size_t)rank * n + (size_t)rv->src_info[3 * r + 1]] = 1;
			s->dtok_all++;
		}
	/* bytes read + written locally: lbytes by the timed
	 * parts as fabep does them (combine by partial rows, not
	 * FABEP_MOE_COMBINE_ROWS' rows), fbytes the least any
	 * implementation moves (the floor) */
	{
		/* the caller's rows; copying every received row
		 * into expert-major order; reading every expert
		 * output once and writing every output row once */
		size_t in_row = H * (s->cfg.token_type == FABEP_MOE_FP32 ? 4 : 2);
		size_t xmajor = s->cfg.flags & FABEP_MOE_ZERO_COPY ? 0 :
			2 * rv->rows * (s->elt * H + 4 * s->nsc);
		size_t reduce = (rv->rows + n) * crow;

		if (s->do_d) {  /* pack: rows in, records out */
			s->lbytes += s->recs_all * (s->rec + in_row) + xmajor;
			s->fbytes += xmajor;
			if (s->cfg.token_type == FABEP_MOE_FP8)
				s->fbytes += n * (in_row + H + 4 * s->nsc);
		}
		if (s->do_c) {  /* plus the partials, out and in */
			s->lbytes += reduce + (s->dtok_all + s->recs_all) * crow;
			s->fbytes += reduce;
		}
	}
	s->ptl = rv->rows;
	free(tk);
	return 0;
}

/* out[t] = sum_k w_k * x[t] within the format's error; clears s->ok. */
static void mb_check(struct moe_bench *s)
{
	const fabep_moe_config_t *cfg = &s->cfg;
	size_t n = s->n, H = s->H, k = s->k, t, j, h;
	const uint16_t *x = s->x, *outb = s->outb;

	for (t = 0; t < n && s->ok; t++) {
		float sw = 0, amax = 0;

		for (j = 0; j < k; j++)
			sw += s->w[t * k + j];
		for (h = 0; h < H; h++)
			amax = fmaxf(amax, fabsf(cfg->token_type == FABEP_MOE_FP32 ?
				((const float *)x)[t * H + h] : bf2f(x[t * H + h])));
		for (h = 0; h < H; h++) {
			float xv = cfg->token_type == FABEP_MOE_FP32 ?
				((const float *)x)[t * H + h] : bf2f(x[t * H + h]);
			float v = cfg->combine_type == FABEP_MOE_FP32 ?
				((const float *)outb)[t * H + h] : bf2f(outb[t * H + h]);
			float tol = sw * fabsf(xv) * 0.03f + 1e-6f;

			if (cfg->token_type == FABEP_MOE_FP8)
				tol += sw * (fabsf(xv) / 15 + amax / 448 / 500);
			if (!(fabsf(v - sw * xv) <= tol)) {
				fprintf(stderr, "%s: rank %d token %zu col %zu: "
					"%g, want %g\n", tool_name, s->rank, t,
					h, v, sw * xv);
				s->ok = 0;
				break;
			}
		}
	}
}

/* One iteration (it < 0: warm-up): dispatch, the toy expert, combine,
 * their times and, on the last, the check.  *failed tells a call's
 * failure (to report) from running out of memory (not reported). */
static int mb_iteration(struct moe_bench *s, long it, int *failed)
{
	const void *din;
	const float *dsc;
	uint64_t t0;
	int ret;

	*failed = 1;
	ret = mb_prep_input(s, &din, &dsc);
	if (!ret)
		ret = fabep_barrier(s->comm);
	if (ret)
		return ret;
	t0 = tool_now_ns();
	ret = fabep_moe_dispatch(s->moe, din, dsc, s->n, s->ids, s->w, &s->rv);
	if (ret)
		return ret;
	if (s->do_d)
		mb_slow(s);
	if (s->do_d && it >= 0) {
		s->lat[it] = tool_now_ns() - t0;
		fabep_moe_timing(s->moe, &s->tm);
		s->wire[it] = s->tm.dispatch_put_ns + s->tm.dispatch_wait_ns;
		s->putt[it] = s->tm.dispatch_put_ns;
		s->loc[it] = s->tm.dispatch_pack_ns + s->tm.dispatch_build_ns;
	}
	*failed = 0;
	ret = mb_expert(s);
	if (!ret && it == -s->warmup)
		ret = mb_count_bytes(s);
	if (ret)
		return ret;
	*failed = 1;
	if (s->expert_us)  /* the expert's compute: fabep's threads idle */
		pause_us(s->expert_us);
	ret = fabep_barrier(s->comm);
	if (ret)
		return ret;
	t0 = tool_now_ns();
	ret = fabep_moe_combine(s->moe, s->y, s->H, 0, s->outb, s->H, NULL, NULL);
	if (ret)
		return ret;
	if (s->do_c)
		mb_slow(s);
	if (it >= 0) {
		s->lat[it] = (s->do_d ? s->lat[it] : 0) +
			(s->do_c ? tool_now_ns() - t0 : 0);
		fabep_moe_timing(s->moe, &s->tm);
		if (!s->do_d)
			s->wire[it] = s->loc[it] = s->putt[it] = 0;
		if (s->do_c) {
			s->wire[it] += s->tm.combine_put_ns + s->tm.combine_wait_ns;
			s->putt[it] += s->tm.combine_put_ns;
			s->loc[it] += s->tm.combine_reduce_ns + s->tm.combine_sum_ns;
		}
	}
	if (s->o->check && it == s->iters - 1)
		mb_check(s);
	return 0;
}

/* Rank 0, after slowest() of the phase's times (buf holds every rank's
 * n times): each rank's median, and of those the least, the median
 * rank's and the largest, with the lowest rank that has it.  A phase
 * waits for its last rank, so one rank far above the others (a slow
 * core, host or link) sets every iteration's time.  Without memory
 * for it (or times), rk_at stays -1 (reported as unknown, the run goes
 * on). */
static void rank_spread(struct moe_bench *s, fabep_off_t buf, long n)
{
	const uint64_t *b = fabep_heap_ptr(s->comm, buf);
	uint64_t *v = n > 0 ? malloc((size_t)n * sizeof(*v)) : NULL;
	uint64_t *med = malloc((size_t)s->size * sizeof(*med));
	int r;

	s->rk_at = -1;  /* unknown: printed as such */
	if (!v || !med) {
		free(v);
		free(med);
		return;
	}
	for (r = 0; r < s->size; r++) {
		memcpy(v, b + (size_t)r * (size_t)n, (size_t)n * sizeof(*v));
		qsort(v, (size_t)n, sizeof(*v), cmp_u64);
		med[r] = v[n / 2];
		if (r == 0 || med[r] > s->rk_max) {
			s->rk_max = med[r];
			s->rk_at = r;
		}
	}
	qsort(med, (size_t)s->size, sizeof(*med), cmp_u64);
	s->rk_min = med[0];
	s->rk_med = med[(s->size - 1) / 2];  /* lower middle: of 2, not the max */
	free(v);
	free(med);
}

/* --no-ref: each iteration's slowest rank, and each rank's median, of
 * the phase alone.  *failed as for mb_iteration. */
static int mb_slowest(struct moe_bench *s, int *failed)
{
	int ret;

	*failed = 1;
	s->citers = 0;
	ret = slowest(s->comm, s->tbuf, s->tctr, 1, s->lat, s->iters);
	if (!ret && !s->rank)
		rank_spread(s, s->tbuf, s->iters);
	return ret;
}

/* The reference: the same bytes to each peer with fabep_put, with warm
 * caches (the same source and destination every round: both stay in the
 * caches of whoever copies), live ones (the sender rewrites its source
 * and the receiver reads what arrived, as in the phase's loop), then cold
 * ones: every rank first writes a buffer of twice the last-level cache
 * (64 to 256 MiB), as the phases find their inputs after the rest of a
 * layer's traffic.  Then each iteration's slowest rank, phase and
 * references alike.  *failed as for mb_iteration. */
static int mb_refs(struct moe_bench *s, int *failed)
{
	fabep_comm_t *comm = s->comm;
	fabep_off_t dst = s->rdst + (uint64_t)s->rank * s->slot;
	int ret, e, d;

	*failed = 0;
	for (e = 1; e < s->size; e++) {
		int peer = (s->rank + e) % s->size;

		s->plen[peer] = (s->do_d ? s->dbytes[peer] : 0) +
			(s->do_c ? s->cbytes[peer] : 0);
	}
	{
		long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
		size_t ev = l3 > 0 ? 2 * (size_t)l3 : 0;

		if (ev > ((size_t)256 << 20))
			ev = (size_t)256 << 20;
		s->evsz = ev > ((size_t)64 << 20) ? ev : ((size_t)64 << 20);
	}
	s->citers = s->iters < 20 ? s->iters : 20;
	s->evict = malloc(s->evsz);
	if (!s->evict)
		return -ENOMEM;
	*failed = 1;
	ret = ref_puts(comm, dst, s->rsrc, s->plen, s->warmup, s->iters, NULL,
		       s->ref);
	if (!ret)
		ret = swap_lens(comm, s->lens, s->lctr, s->plen, s->rlen);
	s->lrm.live = 1;
	for (d = 0; d < s->size; d++)
		s->lrm.src_len = s->plen[d] > s->lrm.src_len ? s->plen[d] :
			s->lrm.src_len;
	s->lrm.rlen = s->rlen;
	s->lrm.dst_base = s->rdst;
	s->lrm.slot = s->slot;
	if (!ret)
		ret = ref_puts(comm, dst, s->rsrc, s->plen, s->warmup, s->iters,
			       &s->lrm, s->lref);
	if (!ret) {
		struct ref_mode rm = { 0 };

		rm.evict = s->evict;
		rm.evsz = s->evsz;
		ret = ref_puts(comm, dst, s->rsrc, s->plen, s->warmup, s->citers,
			       &rm, s->cref);
	}
	/* phase and references alike: each iteration's slowest rank */
	{
		uint64_t part = (uint64_t)s->size * 8 * (uint64_t)s->iters;

		if (!ret)
			ret = slowest(comm, s->tbuf, s->tctr, 1, s->lat, s->iters);
		if (!ret && !s->rank)
			rank_spread(s, s->tbuf, s->iters);
		if (!ret)
			ret = slowest(comm, s->tbuf + part, s->tctr, 2, s->ref,
				      s->iters);
		if (!ret)
			ret = slowest(comm, s->tbuf + 2 * part, s->tctr, 3, s->cref,
				      s->citers);
		if (!ret)
			ret = slowest(comm, s->tbuf + 3 * part, s->tctr, 4, s->lref,
				      s->iters);
	}
	return ret;
}

/* memcpy of half the local bytes (a memcpy reads and writes each), on as
 * many threads as the communicator's pool, every rank at once: the memory
 * rate the local work could have; then the overlap bound.  *failed as
 * for mb_iteration. */
static int mb_memcpy(struct moe_bench *s, int *failed)
{
	fabep_comm_t *comm = s->comm;
	uint64_t part = (uint64_t)s->size * 8 * (uint64_t)s->iters, t0;
	size_t lbytes = s->lbytes;
	long it;
	int ret = 0;

	*failed = 0;
	s->mbuf = malloc(lbytes + 128);
	if (!s->mbuf)
		return -ENOMEM;
	*failed = 1;
	memset(s->mbuf, 1, lbytes + 128);
	mc_start(fabep_comm_threads(comm));
	for (it = -s->warmup; it < s->iters; it++) {
		ret = fabep_barrier(comm);
		if (ret)
			break;
		t0 = tool_now_ns();
		mc_round(s->mbuf + lbytes / 2 + 64, s->mbuf, lbytes / 2);
		if (it >= 0)
			s->mcp[it] = tool_now_ns() - t0;
	}
	/* the overlap bound: the live put while the pool's other threads
	 * copy the floor's bytes (half of them: a copy reads and writes),
	 * every rank at once */
	if (!ret && s->fbytes) {
		struct ref_mode rm = s->lrm;

		rm.ov_n = (s->fbytes < lbytes ? s->fbytes : lbytes) / 2;
		rm.ov_src = s->mbuf;
		rm.ov_dst = s->mbuf + lbytes / 2 + 64;
		ret = ref_puts(comm, s->rdst + (uint64_t)s->rank * s->slot, s->rsrc,
			       s->plen, s->warmup, s->iters, &rm, s->oref);
	}
	mc_stop();
	if (ret)
		return ret;
	ret = slowest(comm, s->tbuf + 4 * part, s->tctr, 5, s->mcp, s->iters);
	if (!ret && s->fbytes)
		ret = slowest(comm, s->tbuf + 5 * part, s->tctr, 6, s->oref,
			      s->iters);
	return ret;
}

/* Add up n bytes of a window as floats, into 1024 sums (the source's
 * sum reading its rows once, from the cache). */
static float win_sum(const char *b, size_t n, float *restrict acc)
{
	size_t j, i, nf = n / 4;

	for (j = 0; j < nf; j += 1024) {
		const float *f = (const float *)(const void *)(b + 4 * j);
		size_t m = nf - j < 1024 ? nf - j : 1024;

		for (i = 0; i < m; i++)
			acc[i] += f[i];
	}
	return acc[0];
}

/* The pull reference for combine: every rank at once reads, from each
 * peer, the rows its tokens have there (one read of one row each, as a
 * source fetching its tokens' rows straight from the expert rank's
 * outputs would) into a window of about 1 MiB that stays in cache, and
 * adds up each window once it is in; caches flushed before each round,
 * as for the cold put.  Against the phase, which writes the rows into
 * the source's memory and then reads them back for its sum.  *failed as
 * for mb_iteration.  Only with FABEP_BENCH_PULL: on shm it has lost to
 * the phase at every size measured (docs/performance.md).  Its round of
 * tctr follows mb_memcpy's last. */
static int mb_pull(struct moe_bench *s, int *failed)
{
	fabep_comm_t *comm = s->comm;
	int rank = s->rank, size = s->size, e, ret = 0;
	size_t L = (size_t)s->cfg.num_experts / (size_t)size, i;
	size_t crow = s->crow, slot = s->slot;
	size_t wrows = ((size_t)1 << 20) / crow ? ((size_t)1 << 20) / crow : 1;
	size_t *prow = calloc((size_t)size, sizeof(*prow));
	float *acc = calloc(1024, sizeof(*acc));
	fabep_off_t win = s->rdst + (uint64_t)rank * slot;
	volatile float sink = 0;
	long it;

	*failed = 0;
	if (!prow || !acc) {
		free(prow);
		free(acc);
		return -ENOMEM;
	}
	*failed = 1;
	if (wrows * crow > slot)
		wrows = slot / crow ? slot / crow : 1;
	for (i = 0; i < s->n * s->k; i++)
		if (s->ids[i] >= 0 && (size_t)s->ids[i] / L != (size_t)rank)
			prow[(size_t)s->ids[i] / L]++;
	for (it = -s->warmup; it < s->citers && !ret; it++) {
		uint64_t t0;

		memset(s->evict, (int)(it & 0x7f), s->evsz);
		ret = fabep_barrier(comm);
		if (ret)
			break;
		t0 = tool_now_ns();
		for (e = 1; e < size && !ret; e++) {
			int peer = (rank + e) % size;
			size_t r = 0;

			/* this rank's part of the peer's region: the rows the
			 * peer holds for it, wrapped within one slot */
			while (r < prow[peer] && !ret) {
				size_t w = wrows < prow[peer] - r ? wrows : prow[peer] - r, j;

				for (j = 0; j < w && !ret; j++)
					ret = fabep_get(comm, peer, win + j * crow,
							s->rdst + (uint64_t)rank * slot +
							((r + j) * crow) % (slot - crow + 1),
							crow);
				if (!ret)
					ret = fabep_flush(comm);
				if (!ret)
					sink += win_sum(fabep_heap_ptr(comm, win), w * crow, acc);
				r += w;
			}
		}
		if (!ret && it >= 0)
			s->pull[it] = tool_now_ns() - t0;
	}
	(void)sink;
	free(prow);
	free(acc);
	if (!ret)
		ret = slowest(comm, s->tbuf + 6 * (uint64_t)size * 8 * (uint64_t)s->iters,
			      s->tctr, s->fbytes ? 7 : 6, s->pull, s->citers);
	return ret;
}

/* Each rank's median call in us (rank_spread), or -1 where rank 0 could
 * not gather them. */
static double rk_us(const struct moe_bench *s, uint64_t ns)
{
	return s->rk_at >= 0 ? (double)ns / 1e3 : -1;
}

/* The table's "# ranks:" line, where rank_spread has the figures. */
static void mb_rank_line(const struct moe_bench *s, FILE *out)
{
	if (s->rk_at >= 0)
		fprintf(out, "# ranks: each rank's median call took %.1f to %.1f "
			"us (the median rank's %.1f); rank %d took longest\n",
			rk_us(s, s->rk_min), rk_us(s, s->rk_max),
			rk_us(s, s->rk_med), s->rk_at);
}

/* Rank 0's figures under --no-ref (s->lat sorted): the phase's times,
 * rate, rank 0's wire and local parts and the ranks' spread, without
 * the references' columns. */
static void mb_report_alone(struct moe_bench *s, FILE *out)
{
	const struct bench_opts *o = s->o;
	fabep_comm_t *comm = s->comm;
	long iters = s->iters;
	const char *fmt = o->format ? o->format : "bf16";
	const char *chk = !o->check ? "off" : s->all_ok ? "ok" : "failed";
	const char *mode = s->cfg.flags & FABEP_MOE_ZERO_COPY ? "zcopy" : "copy";
	double med = (double)s->lat[iters / 2] / 1e3, mn = (double)s->lat[0] / 1e3;
	double gbps = med > 0 ? (double)s->bytes / (med * 1e3) : 0;
	double wmed, lmed, pmed;

	qsort(s->wire, (size_t)iters, sizeof(*s->wire), cmp_u64);
	qsort(s->putt, (size_t)iters, sizeof(*s->putt), cmp_u64);
	qsort(s->loc, (size_t)iters, sizeof(*s->loc), cmp_u64);
	wmed = (double)s->wire[iters / 2] / 1e3;
	pmed = (double)s->putt[iters / 2] / 1e3;
	lmed = (double)s->loc[iters / 2] / 1e3;
	if (o->machine) {
		fprintf(out, "op: %s provider: %s ranks: %d tokens: %zu hidden: %zu "
			"topk: %zu experts: %d format: %s bytes: %zu median_us: %.1f "
			"min_us: %.1f GBps: %.3f mode: %s wire_us: %.1f local_us: %.1f "
			"local_bytes: %zu rows: %zu input: %s channels: %d check: %s "
			"put_us: %.1f signal: %s rank_min_us: %.1f rank_median_us: "
			"%.1f rank_max_us: %.1f slowest_rank: %d refs: none\n", o->op,
			fabep_comm_provider(comm), s->size, s->n, s->H, s->k,
			s->cfg.num_experts, fmt, s->bytes, med, mn, gbps, mode, wmed,
			lmed, s->lbytes, s->ptl, s->sbuf ? "send_buffer" : "caller",
			fabep_comm_channels(comm), chk, pmed,
			fabep_signal_name(fabep_comm_signal(comm)),
			rk_us(s, s->rk_min), rk_us(s, s->rk_med),
			rk_us(s, s->rk_max), s->rk_at);
	} else {
		fprintf(out, "# %s -o %s --no-ref: provider %s, %d rank%s, %d "
			"thread%s, %d channel%s, rank 0's figures; bytes = what "
			"rank 0 put to other ranks; no references measured\n",
			tool_name, o->op, fabep_comm_provider(comm), s->size,
			s->size == 1 ? "" : "s", fabep_comm_threads(comm),
			fabep_comm_threads(comm) == 1 ? "" : "s",
			fabep_comm_channels(comm),
			fabep_comm_channels(comm) == 1 ? "" : "s");
		fprintf(out, "%-9s %-5s %7s %8s %4s %7s %12s %11s %11s %8s %6s\n",
			"op", "fmt", "tokens", "hidden", "topk", "exp", "bytes",
			"median_us", "min_us", "GB/s", "check");
		fprintf(out, "%-9s %-5s %7zu %8zu %4zu %7d %12zu %11.1f %11.1f "
			"%8.3f %6s\n", o->op, fmt, s->n, s->H, s->k,
			s->cfg.num_experts, s->bytes, med, mn, gbps, chk);
		mb_rank_line(s, out);
		fprintf(out, "# mode %s: wire (puts + waits) median %.1f us, of "
			"which posting %.1f; local work median %.1f us for %zu "
			"bytes moved\n", mode, wmed, pmed, lmed, s->lbytes);
	}
	fflush(out);
}

/* Rank 0's figures: medians of each iteration's slowest rank, rates,
 * ratios, the floor and the overlap bound, one line (-m) or a table. */
static void mb_report(struct moe_bench *s, FILE *out)
{
	const struct bench_opts *o = s->o;
	fabep_comm_t *comm = s->comm;
	long iters = s->iters, citers = s->citers;
	size_t bytes = s->bytes, lbytes = s->lbytes, fbytes = s->fbytes;
	const char *fmt = o->format ? o->format : "bf16";
	const char *chk = !o->check ? "off" : s->all_ok ? "ok" : "failed";
	const char *mode = s->cfg.flags & FABEP_MOE_ZERO_COPY ? "zcopy" : "copy";
	double med, mn, rmed, gbps, rgbps, wmed, lmed, mmed, cmed, cgbps;
	double lvmed, lgbps, fmed, ceil_live, omed, ceil_ov, pmed;

	qsort(s->lat, (size_t)iters, sizeof(*s->lat), cmp_u64);
	if (o->no_ref) {
		mb_report_alone(s, out);
		return;
	}
	qsort(s->ref, (size_t)iters, sizeof(*s->ref), cmp_u64);
	qsort(s->cref, (size_t)citers, sizeof(*s->cref), cmp_u64);
	qsort(s->lref, (size_t)iters, sizeof(*s->lref), cmp_u64);
	qsort(s->wire, (size_t)iters, sizeof(*s->wire), cmp_u64);
	qsort(s->putt, (size_t)iters, sizeof(*s->putt), cmp_u64);
	qsort(s->loc, (size_t)iters, sizeof(*s->loc), cmp_u64);
	qsort(s->mcp, (size_t)iters, sizeof(*s->mcp), cmp_u64);
	qsort(s->oref, (size_t)iters, sizeof(*s->oref), cmp_u64);
	qsort(s->pull, (size_t)citers, sizeof(*s->pull), cmp_u64);
	pmed = s->do_pull && s->do_c && s->size > 1 ?
		(double)s->pull[citers / 2] / 1e3 : 0;
	wmed = (double)s->wire[iters / 2] / 1e3;
	lmed = (double)s->loc[iters / 2] / 1e3;
	mmed = (double)s->mcp[iters / 2] / 1e3;
	med = (double)s->lat[iters / 2] / 1e3;
	mn = (double)s->lat[0] / 1e3;
	rmed = (double)s->ref[iters / 2] / 1e3;
	gbps = med > 0 ? (double)bytes / (med * 1e3) : 0;
	rgbps = rmed > 0 ? (double)bytes / (rmed * 1e3) : 0;
	cmed = (double)s->cref[citers / 2] / 1e3;
	cgbps = cmed > 0 ? (double)bytes / (cmed * 1e3) : 0;
	lvmed = (double)s->lref[iters / 2] / 1e3;
	lgbps = lvmed > 0 ? (double)bytes / (lvmed * 1e3) : 0;
	/* the floor: the least local traffic at the memcpy rate; no
	 * implementation beats the larger of it and the live write */
	fmed = lbytes ? mmed * (double)fbytes / (double)lbytes : 0;
	ceil_live = lvmed > 0 ? lvmed / (fmed > lvmed ? fmed : lvmed) : 0;
	/* the overlap bound: the write and the floor's traffic at
	 * once, sharing the machine as a phase's do; it does not
	 * charge what must come before the write or after it */
	omed = fbytes ? (double)s->oref[iters / 2] / 1e3 : lvmed;
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
			"put_us: %.1f signal: %s pull_us: %.1f rank_min_us: %.1f "
			"rank_median_us: %.1f rank_max_us: %.1f slowest_rank: %d\n",
			o->op,
			fabep_comm_provider(comm), s->size, s->n, s->H, s->k,
			s->cfg.num_experts, fmt, bytes, med, mn, gbps, rgbps,
			rgbps > 0 ? gbps / rgbps : 0, mode, rmed, wmed,
			wmed > 0 ? rmed / wmed : 0, lmed, lbytes, mmed,
			lmed > 0 ? mmed / lmed : 0, s->ptl,
			s->sbuf ? "send_buffer" : "caller", cmed, cgbps,
			cgbps > 0 ? gbps / cgbps : 0, lvmed, lgbps,
			lgbps > 0 ? gbps / lgbps : 0, fbytes, fmed, ceil_live,
			omed, ceil_ov, fabep_comm_channels(comm), chk,
			(double)s->putt[iters / 2] / 1e3,
			fabep_signal_name(fabep_comm_signal(comm)), pmed,
			rk_us(s, s->rk_min), rk_us(s, s->rk_med),
			rk_us(s, s->rk_max), s->rk_at);
	else {
		fprintf(out, "# %s -o %s: provider %s, %d rank%s, %d thread%s, "
			"%d channel%s, rank 0's figures; bytes = what rank 0 "
			"put to other ranks; ref = fabep_put of the same bytes "
			"(one write per peer, on one channel)\n", tool_name,
			o->op, fabep_comm_provider(comm), s->size,
			s->size == 1 ? "" : "s", fabep_comm_threads(comm),
			fabep_comm_threads(comm) == 1 ? "" : "s",
			fabep_comm_channels(comm),
			fabep_comm_channels(comm) == 1 ? "" : "s");
		fprintf(out, "%-9s %-5s %7s %8s %4s %7s %12s %11s %11s %8s %8s "
			"%6s %6s\n", "op", "fmt", "tokens", "hidden", "topk",
			"exp", "bytes", "median_us", "min_us", "GB/s", "ref_GB/s",
			"ratio", "check");
		fprintf(out, "%-9s %-5s %7zu %8zu %4zu %7d %12zu %11.1f %11.1f "
			"%8.3f %8.3f %6.3f %6s\n", o->op, fmt, s->n, s->H, s->k,
			s->cfg.num_experts, bytes, med, mn, gbps, rgbps,
			rgbps > 0 ? gbps / rgbps : 0, chk);
		mb_rank_line(s, out);
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
		if (pmed > 0)
			fprintf(out, "# pull reference (caches flushed; every rank "
				"reads its tokens' rows from the peers, a row a "
				"read, into a window that stays in cache, and adds "
				"each window up): %.1f us\n", pmed);
	}
	fflush(out);
}

static void mb_free(struct moe_bench *s)
{
	fabep_moe_destroy(s->moe);
	free(s->ids);
	free(s->w);
	free(s->x);
	free(s->x0);
	free(s->xq);
	free(s->xs);
	free(s->outb);
	free(s->y);
	free(s->lat);
	free(s->ref);
	free(s->cref);
	free(s->lref);
	free(s->oref);
	free(s->pull);
	free(s->plen);
	free(s->rlen);
	free(s->evict);
	free(s->wire);
	free(s->putt);
	free(s->loc);
	free(s->mcp);
	free(s->mbuf);
	free(s->dbytes);
	free(s->seen);
	free(s->cbytes);
}

int bench_moe(fabep_comm_t *comm, const struct bench_opts *o, FILE *out)
{
	struct moe_bench s = {
		.comm = comm, .o = o, .ok = 1, .all_ok = 1,
		.rank = fabep_comm_rank(comm), .size = fabep_comm_size(comm),
		.do_d = strcmp(o->op, "combine") != 0,
		.do_c = strcmp(o->op, "dispatch") != 0,
		.rv = { .size = sizeof(s.rv) },
		.tm = { .size = sizeof(s.tm) },
		.iters = bench_moe_iters(o, o->tokens > 0 ? o->tokens : 128),
		.warmup = bench_moe_warmup(o, o->tokens > 0 ? o->tokens : 128),
	};
	long it;
	int ret, failed = 0, d;

	s.seed = 0x5eedull + (uint64_t)s.rank * 0x9e3779b97f4a7c15ull;
	ret = mb_setup(&s);
	if (ret)
		return ret;  /* reported */
	ret = mb_alloc(&s);
	if (ret)
		goto out;
	mb_make_tokens(&s);
	ret = mb_heap(&s);  /* reported */
	if (ret)
		goto out;
	for (it = -s.warmup; it < s.iters && !ret; it++)
		ret = mb_iteration(&s, it, &failed);
	if (!ret)
		ret = o->no_ref ? mb_slowest(&s, &failed) : mb_refs(&s, &failed);
	if (!ret && !o->no_ref)
		ret = mb_memcpy(&s, &failed);
	if (!ret && !o->no_ref && s.do_pull && s.do_c && s.size > 1)
		ret = mb_pull(&s, &failed);
	if (ret)
		goto out;
	for (d = 0; d < s.size; d++)
		if (d != s.rank) {
			if (s.do_d)
				s.bytes += s.dbytes[d];
			if (s.do_c)
				s.bytes += s.cbytes[d];
		}
	failed = 1;
	ret = bench_gather_ok(comm, s.flags, s.fctr, 1, s.ok, &s.all_ok);
	if (ret)
		goto out;
	if (!s.rank) {
		mb_report(&s, out);
		if (o->check && !s.all_ok)
			ret = -FABEP_ERR_PEER;
	}
	failed = 0;
out:
	if (ret && failed)
		tool_fail(o->op, ret);
	mb_free(&s);
	return ret;
}
