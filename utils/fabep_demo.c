/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fabep_demo - a small MoE layer over fabep: N local ranks (forked, shm
 * by default), random tokens and routing, a toy expert per rank, every
 * dispatch and combine checked against a single-process reference, and a
 * table of latency and bandwidth.  Uses only the public API.
 *
 *   fabep_demo [-n RANKS] [-t TOKENS] [-H HIDDEN] [-k TOPK] [-e EXPERTS]
 *              [-I LAYERS] [-p PROVIDER]   (the tools' common options)
 *
 * Exit status 0 only when every rank's results were correct, 2 for a bad
 * command line.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fabep.h"
#include "utils/common.h"
#include "utils/tool_data.h"

struct demo {
	int ranks, tokens, hidden, topk, experts, layers, cores;
	const char *provider;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Rank src's input of a layer: every rank can make every rank's. */
struct input {
	size_t n;
	int32_t *ids;
	float *w;
	uint16_t *x;
};

static void free_input(struct input *in)
{
	free(in->ids);
	free(in->w);
	free(in->x);
}

/* 0, or -ENOMEM with nothing held */
static int gen(const struct demo *d, int src, int layer, struct input *in)
{
	uint64_t s = 0xdeadbeefull ^ ((uint64_t)src << 20) ^ (uint64_t)layer * 7919u;
	size_t t, j, h, k = (size_t)d->topk, H = (size_t)d->hidden;

	rnd(&s);
	in->n = (size_t)(rnd(&s) % (uint64_t)(d->tokens + 1));
	in->ids = malloc((in->n + 1) * k * sizeof(int32_t));
	in->w = malloc((in->n + 1) * k * sizeof(float));
	in->x = malloc((in->n + 1) * H * 2);
	if (!in->ids || !in->w || !in->x) {
		free_input(in);
		return -ENOMEM;
	}
	for (t = 0; t < in->n; t++) {
		for (j = 0; j < k; j++) {
			in->ids[t * k + j] = rnd(&s) % 8 == 0 ? -1 :
				(int32_t)(rnd(&s) % (uint64_t)d->experts);
			in->w[t * k + j] = (float)(rnd(&s) % 1000) / 1000.0f;
		}
		for (h = 0; h < H; h++)
			in->x[t * H + h] = f2bf((float)((int)(rnd(&s) % 2001) - 1000) / 500.0f);
	}
	return 0;
}

/* The toy expert e: y = x * (1 + e / 8) */
static float expert_scale(int e)
{
	return 1.0f + (float)e / 8.0f;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Check the received rows of this rank against the reference. */
static int check_recv(const struct demo *d, int rank, int size,
		      const struct input *all, const fabep_moe_recv_t *rv)
{
	size_t k = (size_t)d->topk, H = (size_t)d->hidden, r = 0, t;
	int L = d->experts / size, e, s;

	for (e = 0; e < L; e++) {
		if (rv->row_offsets[e] != r)
			return -1;
		for (s = 0; s < size; s++)
			for (t = 0; t < all[s].n; t++)
				for (size_t j = 0; j < k; j++)
					if (all[s].ids[t * k + j] == rank * L + e) {
						if (r >= rv->rows || rv->src_info[3 * r] != s ||
						    rv->src_info[3 * r + 1] != (int)t ||
						    memcmp((const uint16_t *)rv->x + r * H,
							   all[s].x + t * H, H * 2))
							return -1;
						r++;
					}
	}
	return rv->rows == r ? 0 : -1;
}

static int check_out(const struct demo *d, const struct input *in,
		     const uint16_t *out)
{
	size_t k = (size_t)d->topk, H = (size_t)d->hidden, t, h, j;

	for (t = 0; t < in->n; t++)
		for (h = 0; h < H; h++) {
			double want = 0, mag = 0;

			for (j = 0; j < k; j++) {
				int32_t e = in->ids[t * k + j];

				if (e < 0)
					continue;
				want += in->w[t * k + j] * expert_scale(e) * bf2f(in->x[t * H + h]);
				mag += fabs(in->w[t * k + j] * expert_scale(e) * bf2f(in->x[t * H + h]));
			}
			if (!(fabs(bf2f(out[t * H + h]) - want) <= mag * 4.0 / 256 + 1e-6))
				return -1;
		}
	return 0;
}

/* MoE layer config of the demo; the communicator's heap is sized by it. */
static void demo_cfg(const struct demo *d, fabep_moe_config_t *cfg)
{
	fabep_moe_config_init(cfg);
	cfg->num_experts = d->experts;
	cfg->top_k = d->topk;
	cfg->hidden = (size_t)d->hidden;
	cfg->max_tokens = d->tokens;
}

/* One rank (tool_run made its communicator): 0 when every result of
 * this rank was correct.  A rank that fails returns at once; the
 * launcher then stops the others, which would wait for it. */
static int demo_rank(fabep_comm_t *comm, const struct tool_opts *o, void *arg)
{
	const struct demo *d = arg;
	fabep_moe_config_t cfg;
	fabep_moe_t *moe = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	struct input *all;
	uint64_t *td, *tc;
	double bytes_d = 0, bytes_c = 0;
	int rank, size, layer, s, ret, bad = 0;
	size_t H = (size_t)d->hidden;

	(void)o;
	demo_cfg(d, &cfg);
	rank = fabep_comm_rank(comm);
	size = fabep_comm_size(comm);
	ret = fabep_moe_create(comm, &cfg, &moe);
	if (ret) {
		fprintf(stderr, "fabep_demo: rank %d: fabep_moe_create: %s\n", rank,
			fabep_strerror(ret));
		return ret;
	}
	all = calloc((size_t)size, sizeof(*all));
	td = calloc((size_t)d->layers, sizeof(*td));
	tc = calloc((size_t)d->layers, sizeof(*tc));
	if (!all || !td || !tc) {
		fprintf(stderr, "fabep_demo: rank %d: out of memory\n", rank);
		bad = 1;
	}
	for (layer = 0; layer < d->layers && !bad; layer++) {
		uint16_t *y, *out;
		uint64_t t0;
		size_t r;
		int e;

		for (s = 0; s < size && !bad; s++)
			if (gen(d, s, layer, &all[s])) {
				fprintf(stderr, "fabep_demo: rank %d: out of memory\n",
					rank);
				while (--s >= 0)
					free_input(&all[s]);
				bad = 1;
			}
		if (bad)
			break;
		/* time the phase, not the ranks' skew in making their inputs */
		ret = fabep_barrier(comm);
		if (ret) {
			fprintf(stderr, "fabep_demo: rank %d: barrier: %s\n", rank,
				fabep_strerror(ret));
			bad = 1;
			break;
		}
		t0 = now_ns();
		ret = fabep_moe_dispatch(moe, all[rank].x, NULL, all[rank].n,
					 all[rank].ids, all[rank].w, &rv);
		td[layer] = now_ns() - t0;
		if (ret || check_recv(d, rank, size, all, &rv)) {
			fprintf(stderr, "fabep_demo: rank %d layer %d: dispatch %s\n",
				rank, layer, ret ? fabep_strerror(ret) : "result wrong");
			bad = 1;
			break;
		}
		for (r = 0; r < rv.rows; r++)
			if (rv.src_info[3 * r] != rank)
				bytes_d += (double)H * 2;
		y = malloc((rv.rows + 1) * H * 2);
		out = malloc((all[rank].n + 1) * H * 2);
		if (!y || !out) {
			fprintf(stderr, "fabep_demo: rank %d: out of memory\n", rank);
			free(y);
			free(out);
			bad = 1;
			break;
		}
		for (e = 0; e < rv.local_experts; e++)
			for (r = rv.row_offsets[e]; r < rv.row_offsets[e + 1]; r++)
				for (size_t h = 0; h < H; h++)
					y[r * H + h] = f2bf(bf2f(((const uint16_t *)rv.x)[r * H + h]) *
							    expert_scale(rv.expert_ids[e]));
		ret = fabep_barrier(comm);
		if (ret) {
			fprintf(stderr, "fabep_demo: rank %d: barrier: %s\n", rank,
				fabep_strerror(ret));
			bad = 1;
			free(y);
			free(out);
			break;
		}
		t0 = now_ns();
		ret = fabep_moe_combine(moe, y, H, 0, out, H, NULL, NULL);
		tc[layer] = now_ns() - t0;
		if (ret || check_out(d, &all[rank], out)) {
			fprintf(stderr, "fabep_demo: rank %d layer %d: combine %s\n",
				rank, layer, ret ? fabep_strerror(ret) : "result wrong");
			bad = 1;
		}
		bytes_c += (double)all[rank].n * (double)H * 2;
		free(y);
		free(out);
		for (s = 0; s < size; s++)
			free_input(&all[s]);
	}
	if (!bad && rank == 0) {
		double md, mnd, mc, mnc;

		qsort(td, (size_t)d->layers, sizeof(*td), cmp_u64);
		qsort(tc, (size_t)d->layers, sizeof(*tc), cmp_u64);
		md = (double)td[d->layers / 2] / 1e3;
		mnd = (double)td[0] / 1e3;
		mc = (double)tc[d->layers / 2] / 1e3;
		mnc = (double)tc[0] / 1e3;
		printf("# fabep_demo: %d rank%s on %d core%s, %s (signal %s), "
		       "%d layer%s\n"
		       "# up to %d tokens per rank, hidden %d, top-%d of %d experts, "
		       "bf16\n# every result checked against a single-process "
		       "reference\n", size, size == 1 ? "" : "s", d->cores,
		       d->cores == 1 ? "" : "s", fabep_comm_provider(comm),
		       fabep_signal_name(fabep_comm_signal(comm)), d->layers,
		       d->layers == 1 ? "" : "s", d->tokens, d->hidden, d->topk,
		       d->experts);
		printf("%-9s %10s %10s %9s %9s\n", "phase", "median_us", "min_us",
		       "KB/layer", "MB/s");
		printf("%-9s %10.1f %10.1f %9.1f %9.1f\n", "dispatch", md, mnd,
		       bytes_d / d->layers / 1e3, md > 0 ? bytes_d / d->layers / md : 0);
		printf("%-9s %10.1f %10.1f %9.1f %9.1f\n", "combine", mc, mnc,
		       bytes_c / d->layers / 1e3, mc > 0 ? bytes_c / d->layers / mc : 0);
		if (size > d->cores)
			printf("# more ranks than cores: they take turns, so times "
			       "include waiting for the core\n");
		fflush(stdout);
	}
	free(all);
	free(td);
	free(tc);
	fabep_moe_destroy(moe);
	return bad ? -EIO : 0;
}

/* the largest -e (tool_parse) */
#define DEMO_MAX_EXPERTS (1 << 20)

static const int demo_accept[] = { 'n', 't', 'H', 'k', 'e', 'I', 'p', 'V', 'h', 0 };

static const struct tool_help demo_help[] = {
	{ 'n', NULL, "fork N local ranks, 1 to 64 (default 4, or the cores this "
		     "process may use if fewer); each bound to its share of the "
		     "cores when they are enough (FABEP_BIND=none: unbound)" },
	{ 't', NULL, "the most tokens a rank sends per layer; each rank sends a "
		     "random number from 0 to N (default 64)" },
	{ 'H', NULL, "hidden size, elements per token row (default 1024)" },
	{ 'k', NULL, "experts per token, at most 32 (default 4)" },
	{ 'e', NULL, "experts in all, rounded up to a multiple of the ranks "
		     "(down where that would pass 1048576; default 16)" },
	{ 'I', "LAYERS", "MoE layers (dispatch + expert + combine) to run "
			 "(default 50)" },
	{ 'p', NULL, "libfabric provider (default: FABEP_PROVIDER, else fabep's "
		     "choice: shm where libfabric offers it, which it does not "
		     "where /dev/shm is small, as in a container by default)" },
	{ 0, NULL, NULL },
};

static const struct tool_desc demo_desc = {
	.name = "fabep_demo",
	.args = NULL,
	.summary = "Run a small MoE layer over fabep: local ranks, random tokens "
		   "and routing, a toy expert per rank, every dispatch and combine "
		   "checked against a single-process reference; print the latency "
		   "and bandwidth of each.",
	.accept = demo_accept,
	.help = demo_help,
	.max_args = 0,
	.ranks_min = 1,
	.ranks_max = 64,
	.epilog = "Exit status: 0 every result correct, 1 a rank failed or a "
		  "result was wrong, 2 bad command line.\n",
};

int main(int argc, char **argv)
{
	struct demo d = { 4, 64, 1024, 4, 16, 50, 1, NULL };
	struct tool_opts o;
	fabep_comm_attr_t attr;
	fabep_moe_config_t cfg;
	int ret;

	tool_parse(&demo_desc, argc, argv, &o);
	/* no more ranks than cores unless told: a rank waiting for one
	 * that has no core makes the table show the scheduler */
	d.cores = tool_cores();
	if (d.ranks > d.cores)
		d.ranks = d.cores;
	if (o.nranks)  /* 1 to 64 (demo_desc) */
		d.ranks = o.nranks;
	if (o.tokens)
		d.tokens = o.tokens;
	if (o.hidden)
		d.hidden = o.hidden;
	if (o.topk)
		d.topk = o.topk;
	if (o.experts)
		d.experts = o.experts;
	if (o.iters)
		d.layers = o.iters;
	if (o.provider)
		d.provider = o.provider;
	if (d.experts % d.ranks) {
		/* up, unless that passes the largest -e: then down */
		int up = (d.experts + d.ranks - 1) / d.ranks * d.ranks;

		d.experts = up <= DEMO_MAX_EXPERTS ? up : d.experts / d.ranks * d.ranks;
		fprintf(stderr, "fabep_demo: experts rounded %s to %d (a multiple of "
			"%d ranks)\n", d.experts == up ? "up" : "down", d.experts,
			d.ranks);
	}
	if (d.topk > d.experts)
		tool_usage_error(&demo_desc, "-k %d is more than the %d experts%s",
				 d.topk, d.experts, o.topk ? "" : " (the default -k 4)");
	fabep_comm_attr_init(&attr);
	attr.provider = d.provider;
	attr.threads = 1;
	demo_cfg(&d, &cfg);
	attr.heap_size = fabep_moe_heap_bytes(&cfg, d.ranks) + (4u << 20);
	o.nranks = d.ranks;
	o.provider = d.provider;
	/* a backstop for a rank that hangs in the tool itself: the library
	 * gives up on a silent peer after FABEP_TIMEOUT_MS */
	ret = tool_run(&demo_desc, &o, &attr, 300 + d.layers, demo_rank, &d);
	/* every rank's verdict (its exit status), not rank 0's alone */
	/* a wrong result and a failure to run alike: the ranks' messages
	 * above say which */
	printf("result: %s\n", ret ? "failed (see the messages above)" : "correct");
	return ret ? 1 : 0;
}
