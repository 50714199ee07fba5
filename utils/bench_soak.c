/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bench_soak.c - fabep_bench --soak SECONDS (-o soak): dispatch, combine
 * and allreduce over and over with fresh random routing and data every
 * round, every result checked, for as long as asked; then the rounds done,
 * the errors found (must be 0) and the resident memory (VmRSS) of every
 * rank after the warm-up and at the end (must not grow past a small
 * bound, counting only growth that allocated memory, VmData, shows too).
 *
 * Every rank generates every rank's input of a round from (round, source
 * rank), so it knows on its own what dispatch must deliver to it (rows in
 * expert-major order, then by source rank, token and k; weights; bf16 or
 * fp32 rows passed through exactly) and what its combine must return (the
 * toy expert e multiplies a row by 1 + (e % 4) / 4).  The allreduce sums
 * small integers in fp32 (exact), with a random shape per round.  A small
 * control allreduce per round carries rank 0's "stop" and "warm-up done"
 * and, at the end, every rank's error count and memory.
 *
 * Uses only the public API.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utils/common.h"
#include "utils/bench.h"
#include "utils/tool_data.h"

/* Allowed growth of VmRSS between the warm-up and the end, per rank, as
 * far as VmData grew too: a leak takes new memory (VmData) and writes it
 * (VmRSS); pages of memory allocated before the warm-up that count only
 * once first touched do not grow VmData: the symmetric heap's, as a
 * round's random token count first reaches a slot's far end (2 MiB at a
 * time with transparent huge pages), and tcp;ofi_rxm's buffers (about 10
 * MiB over 40 s at 8 ranks, bounded by what it allocated).  A leak of
 * even one small row per round exceeds 8 MiB within the shortest soak. */
#define SOAK_GROWTH_KB 8192

struct soak_cfg {
	fabep_moe_config_t moe;
	size_t ar_rows, ar_cols;
};

static void soak_config(const struct bench_opts *o, int nranks,
			struct soak_cfg *c)
{
	fabep_moe_config_init(&c->moe);
	c->moe.num_experts = o->experts > 0 ? o->experts : 4 * (nranks > 0 ? nranks : 1);
	/* the default -k, not a -k given, fits the experts (fabep_bench
	 * and soak_setup refuse one above them) */
	c->moe.top_k = o->topk > 0 ? o->topk : 3;
	if (o->topk <= 0 && c->moe.top_k > c->moe.num_experts)
		c->moe.top_k = c->moe.num_experts;
	c->moe.hidden = o->hidden > 0 ? (size_t)o->hidden : 256;
	c->moe.max_tokens = o->tokens > 0 ? o->tokens : 64;
	if (o->format && !strcmp(o->format, "fp32")) {
		c->moe.token_type = FABEP_MOE_FP32;
		c->moe.input_type = FABEP_MOE_FP32;
		c->moe.combine_type = FABEP_MOE_FP32;
	}
	c->ar_rows = o->rows > 0 ? (size_t)o->rows : 48;
	c->ar_cols = o->cols > 0 ? (size_t)o->cols : 1024;
}

/* [0] stop, [1] warm-up done, [2] errors, then for every rank r:
 * [4 + 3r] VmRSS after the warm-up, [5 + 3r] at the end, [6 + 3r] its
 * VmData's growth between them */
static size_t ctl_cols(int nranks)
{
	return 4 + 3 * (size_t)nranks;
}

size_t bench_soak_heap_bytes(const struct bench_opts *o, int nranks)
{
	struct soak_cfg c;

	soak_config(o, nranks, &c);
	return fabep_moe_heap_bytes(&c.moe, nranks) +
	       fabep_allreduce_heap_bytes(c.ar_rows, c.ar_cols, FABEP_AR_F32, nranks) +
	       fabep_allreduce_heap_bytes(1, ctl_cols(nranks), FABEP_AR_F32, nranks) +
	       (2u << 20);
}

/* A field of /proc/self/status in KiB, "VmRSS:" or "VmData:" (0 if
 * unknown). */
static long status_kb(const char *key)
{
	char line[256];
	size_t kl = strlen(key);
	long kb = 0;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl)) {
			kb = strtol(line + kl, NULL, 10);
			break;
		}
	fclose(f);
	return kb;
}

/* One source rank's input of a round. */
struct src_in {
	size_t n;
	int32_t *ids;   /* [max_tokens, k] */
	float *w;
	void *x;        /* [max_tokens, H] of the token type */
	float *xf;      /* the same values, fp32 */
};

struct soak {
	struct soak_cfg c;
	int rank, size, fp32;
	size_t H, k;
	struct src_in *in;  /* [size] */
	void *y, *out;
	float *arin, *arout;
	uint64_t errors;
	int reported;
	/* the handles and control buffers of bench_soak's steps */
	fabep_moe_t *moe;
	fabep_allreduce_t *ar, *ctl;  /* the checked one; the control one */
	fabep_moe_recv_t rv;
	float *cin, *cout;            /* [nctl] */
	size_t es, nctl;
};

static void gen(struct soak *S, int src, uint64_t round)
{
	struct src_in *in = &S->in[src];
	uint64_t s = 0x50a4ull ^ (round * 0x9e3779b97f4a7c15ull) ^
		     ((uint64_t)src * 0xbf58476d1ce4e5b9ull);
	int E = S->c.moe.num_experts;
	size_t t, j, h;

	rnd(&s);
	rnd(&s);
	in->n = (size_t)(rnd(&s) % (uint64_t)(S->c.moe.max_tokens + 1));
	for (t = 0; t < in->n; t++) {
		for (j = 0; j < S->k; j++) {
			/* one in five slots not routed */
			int32_t e = (int32_t)(rnd(&s) % (uint64_t)(E + E / 4 + 1));

			in->ids[t * S->k + j] = e >= E ? -1 : e;
			in->w[t * S->k + j] = (float)(rnd(&s) % 1000 + 1) / 1000.0f;
		}
		for (h = 0; h < S->H; h++) {
			float v = (float)((int)(rnd(&s) % 2001) - 1000) / 256.0f;

			if (S->fp32) {
				((float *)in->x)[t * S->H + h] = v;
				in->xf[t * S->H + h] = v;
			} else {
				uint16_t b = f2bf(v);

				((uint16_t *)in->x)[t * S->H + h] = b;
				in->xf[t * S->H + h] = bf2f(b);
			}
		}
	}
}

static float expert_scale(int e)
{
	return 1.0f + (float)(e % 4) / 4.0f;
}

static void soak_error(struct soak *S, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void soak_error(struct soak *S, const char *fmt, ...)
{
	va_list ap;

	S->errors++;
	if (S->reported++ >= 10)
		return;
	fprintf(stderr, "%s: soak: rank %d: ", tool_name, S->rank);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* What dispatch delivered, against the inputs; then the toy experts. */
static int check_recv(struct soak *S, uint64_t round, const fabep_moe_recv_t *rv)
{
	int L = S->c.moe.num_experts / S->size, e, s;
	size_t r = 0, t, j, h, H = S->H, k = S->k;
	size_t es = S->fp32 ? 4 : 2;

	if (rv->local_experts != L || rv->first_expert != S->rank * L) {
		soak_error(S, "round %llu: local experts %d first %d",
			   (unsigned long long)round, rv->local_experts, rv->first_expert);
		return -1;
	}
	for (e = 0; e < L; e++) {
		int ge = S->rank * L + e;

		if (rv->row_offsets[e] != r || rv->expert_ids[e] != ge) {
			soak_error(S, "round %llu: expert %d offset %u (want %zu) id %d",
				   (unsigned long long)round, e, rv->row_offsets[e], r,
				   rv->expert_ids[e]);
			return -1;
		}
		for (s = 0; s < S->size; s++) {
			const struct src_in *in = &S->in[s];

			for (t = 0; t < in->n; t++)
				for (j = 0; j < k; j++) {
					if (in->ids[t * k + j] != ge)
						continue;
					if (r >= rv->rows) {
						soak_error(S, "round %llu: only %zu rows",
							   (unsigned long long)round, rv->rows);
						return -1;
					}
					if (rv->src_info[3 * r] != s ||
					    rv->src_info[3 * r + 1] != (int32_t)t ||
					    rv->src_info[3 * r + 2] != (int32_t)j ||
					    rv->weights[r] != in->w[t * k + j] ||
					    memcmp((const char *)rv->x + r * H * es,
						   (const char *)in->x + t * H * es, H * es)) {
						soak_error(S, "round %llu: row %zu (source %d "
							   "token %zu k %zu) differs",
							   (unsigned long long)round, r, s, t, j);
						return -1;
					}
					for (h = 0; h < H; h++) {
						float v = in->xf[t * H + h] * expert_scale(ge);

						if (S->fp32)
							((float *)S->y)[r * H + h] = v;
						else
							((uint16_t *)S->y)[r * H + h] = f2bf(v);
					}
					r++;
				}
		}
		if (rv->expert_counts[e] != r - rv->row_offsets[e]) {
			soak_error(S, "round %llu: expert %d count %u",
				   (unsigned long long)round, e, rv->expert_counts[e]);
			return -1;
		}
	}
	if (rv->row_offsets[L] != r || rv->rows != r) {
		soak_error(S, "round %llu: %zu rows, want %zu",
			   (unsigned long long)round, rv->rows, r);
		return -1;
	}
	return 0;
}

static void check_out(struct soak *S, uint64_t round)
{
	const struct src_in *in = &S->in[S->rank];
	size_t t, j, h, H = S->H, k = S->k;
	double rel = S->fp32 ? 1e-5 : 4.0 / 256;

	for (t = 0; t < in->n; t++)
		for (h = 0; h < H; h++) {
			double want = 0, mag = 0, v;

			for (j = 0; j < k; j++) {
				int32_t e = in->ids[t * k + j];
				double c;

				if (e < 0)
					continue;
				c = in->w[t * k + j] * expert_scale(e);
				want += c * in->xf[t * H + h];
				mag += fabs(c * in->xf[t * H + h]);
			}
			v = S->fp32 ? ((const float *)S->out)[t * H + h]
				    : bf2f(((const uint16_t *)S->out)[t * H + h]);
			if (!(fabs(v - want) <= rel * mag + 1e-6)) {
				soak_error(S, "round %llu: combine token %zu col %zu: "
					   "%g, want %g", (unsigned long long)round, t,
					   h, v, want);
				return;
			}
		}
}

/* Input of rank r for the allreduce of a round: small integers. */
static float ar_val(uint64_t round, int r, size_t i)
{
	uint64_t x = (round * 1000003u + (uint64_t)r * 7919u + i * 31u) * 0x9e3779b97f4a7c15ull;

	return (float)((int)((x >> 40) % 17) - 8);
}

/* The configuration and the handles; on failure the caller frees. */
static int soak_setup(struct soak *S, fabep_comm_t *comm,
		      const struct bench_opts *o)
{
	int ret;

	S->rank = fabep_comm_rank(comm);
	S->size = fabep_comm_size(comm);
	soak_config(o, S->size, &S->c);
	if (S->c.moe.num_experts % S->size) {
		fprintf(stderr, "%s: soak: -e %d experts is not a multiple of %d ranks\n",
			tool_name, S->c.moe.num_experts, S->size);
		return -EINVAL;
	}
	if (S->c.moe.top_k > S->c.moe.num_experts) {
		fprintf(stderr, "%s: soak: -k %d is more than the -e %d experts\n",
			tool_name, S->c.moe.top_k, S->c.moe.num_experts);
		return -EINVAL;
	}
	S->fp32 = S->c.moe.token_type == FABEP_MOE_FP32;
	S->H = S->c.moe.hidden;
	S->k = (size_t)S->c.moe.top_k;
	S->es = S->fp32 ? 4 : 2;
	S->nctl = ctl_cols(S->size);

	ret = fabep_moe_create(comm, &S->c.moe, &S->moe);
	if (ret) {
		if (ret == -FABEP_ERR_HEAP_FULL && !S->rank)
			fprintf(stderr, "%s: soak: set FABEP_HEAP_SIZE=%zu\n", tool_name,
				bench_soak_heap_bytes(o, S->size));
		return tool_fail("fabep_moe_create", ret);
	}
	ret = fabep_allreduce_create(comm, S->c.ar_rows, S->c.ar_cols, FABEP_AR_F32,
				     &S->ar);
	if (!ret)
		ret = fabep_allreduce_create(comm, 1, S->nctl, FABEP_AR_F32, &S->ctl);
	if (ret) {
		if (ret == -FABEP_ERR_HEAP_FULL && !S->rank)
			fprintf(stderr, "%s: soak: set FABEP_HEAP_SIZE=%zu\n", tool_name,
				bench_soak_heap_bytes(o, S->size));
		tool_fail("fabep_allreduce_create", ret);
	}
	return ret;
}

/* Every buffer at its largest, once: the loop allocates nothing. */
static int soak_alloc(struct soak *S)
{
	size_t es = S->es;
	int r;

	S->in = calloc((size_t)S->size, sizeof(*S->in));
	if (!S->in)
		return -ENOMEM;
	for (r = 0; r < S->size; r++) {
		size_t mt = (size_t)S->c.moe.max_tokens + 1;

		S->in[r].ids = calloc(mt * S->k, sizeof(int32_t));
		S->in[r].w = calloc(mt * S->k, sizeof(float));
		S->in[r].x = calloc(mt * S->H, es);
		S->in[r].xf = calloc(mt * S->H, sizeof(float));
		if (!S->in[r].ids || !S->in[r].w || !S->in[r].x || !S->in[r].xf)
			return -ENOMEM;
	}
	/* at most max_tokens * k rows from each rank */
	S->y = calloc(((size_t)S->c.moe.max_tokens * S->k * (size_t)S->size + 1) *
		      S->H, es);
	S->out = calloc(((size_t)S->c.moe.max_tokens + 1) * S->H, es);
	S->arin = calloc(S->c.ar_rows * S->c.ar_cols, sizeof(float));
	S->arout = calloc(S->c.ar_rows * S->c.ar_cols, sizeof(float));
	S->cin = calloc(S->nctl, sizeof(float));
	S->cout = calloc(S->nctl, sizeof(float));
	if (!S->y || !S->out || !S->arin || !S->arout || !S->cin || !S->cout)
		return -ENOMEM;
	return 0;
}

/* One round's dispatch and combine, whole or split by parity, checked. */
static int soak_moe_round(struct soak *S, uint64_t round)
{
	struct src_in *in;
	int r, ret, split;

	for (r = 0; r < S->size; r++)
		gen(S, r, round);
	in = &S->in[S->rank];
	split = round % 2 == 0;
	if (split) {
		ret = fabep_moe_dispatch_send(S->moe, in->x, NULL, in->n, in->ids,
					      in->w);
		if (!ret)
			ret = fabep_moe_dispatch_recv(S->moe, &S->rv);
	} else {
		ret = fabep_moe_dispatch(S->moe, in->x, NULL, in->n, in->ids, in->w,
					 &S->rv);
	}
	if (ret)
		return tool_fail("fabep_moe_dispatch", ret);
	if (check_recv(S, round, &S->rv)) /* still combine, so every rank stays in step */
		memset(S->y, 0, S->rv.rows * S->H * S->es);
	if (split) {
		ret = fabep_moe_combine_send(S->moe, S->y, S->H, 0);
		if (!ret)
			ret = fabep_moe_combine_recv(S->moe, S->out, S->H, NULL, NULL);
	} else {
		ret = fabep_moe_combine(S->moe, S->y, S->H, 0, S->out, S->H, NULL, NULL);
	}
	if (ret)
		return tool_fail("fabep_moe_combine", ret);
	check_out(S, round);
	return 0;
}

/* One round's allreduce: a fresh shape every round, the same on all
 * ranks, checked against the plain sum. */
static int soak_ar_round(struct soak *S, uint64_t round)
{
	size_t rows, cols, n, i;
	int r, ret;

	{
		uint64_t s = round * 0x2545F4914F6CDD1Dull + 1;

		rnd(&s);
		rows = (size_t)(rnd(&s) % (S->c.ar_rows + 1));
		cols = 1 + (size_t)(rnd(&s) % S->c.ar_cols);
	}
	n = rows * cols;
	for (i = 0; i < n; i++)
		S->arin[i] = ar_val(round, S->rank, i);
	ret = fabep_allreduce(S->ar, S->arin, S->arout, rows, cols);
	if (ret)
		return tool_fail("fabep_allreduce", ret);
	for (i = 0; i < n; i++) {
		float want = 0;

		for (r = 0; r < S->size; r++)
			want += ar_val(round, r, i);
		if (S->arout[i] != want) {
			soak_error(S, "round %llu: allreduce %zu x %zu element "
				   "%zu: %g, want %g", (unsigned long long)round,
				   rows, cols, i, (double)S->arout[i], (double)want);
			break;
		}
	}
	return 0;
}

/* The summary: every rank's errors and memory, printed by rank 0;
 * -EIO for errors, -ENOMEM for growth past the bound. */
static int soak_summary(struct soak *S, fabep_comm_t *comm,
			const struct bench_opts *o, FILE *out, uint64_t round,
			uint64_t t_start, long rss0, long rss1, long dgrow)
{
	size_t nctl = S->nctl;
	float *cin = S->cin, *cout = S->cout;
	uint64_t errors_all;
	long growth_max = 0;
	int r, ret, ok;

	memset(cin, 0, nctl * sizeof(float));
	cin[2] = (float)S->errors;
	cin[4 + 3 * S->rank] = (float)rss0;
	cin[5 + 3 * S->rank] = (float)rss1;
	cin[6 + 3 * S->rank] = (float)dgrow;
	ret = fabep_allreduce(S->ctl, cin, cout, 1, nctl);
	if (ret)
		return tool_fail("fabep_allreduce (summary)", ret);
	errors_all = (uint64_t)cout[2];
	for (r = 0; r < S->size; r++) {
		long g = (long)cout[5 + 3 * r] - (long)cout[4 + 3 * r];

		if (g > (long)cout[6 + 3 * r])
			g = (long)cout[6 + 3 * r];
		if (r == 0 || g > growth_max)
			growth_max = g;
	}
	ok = errors_all == 0 && growth_max <= SOAK_GROWTH_KB;
	if (S->rank == 0) {
		double el = (double)(tool_now_ns() - t_start) / 1e9;

		if (o->machine) {
			fprintf(out, "op: soak seconds: %.1f ranks: %d provider: %s "
				"rounds: %llu errors: %llu", el, S->size,
				fabep_comm_provider(comm), (unsigned long long)round,
				(unsigned long long)errors_all);
			for (r = 0; r < S->size; r++)
				fprintf(out, " rss_kb_%d: %.0f/%.0f vmdata_growth_kb_%d: %.0f",
					r, (double)cout[4 + 3 * r], (double)cout[5 + 3 * r],
					r, (double)cout[6 + 3 * r]);
			fprintf(out, " rss_growth_kb: %ld growth_bound_kb: %d result: %s\n",
				growth_max, SOAK_GROWTH_KB, ok ? "ok" : "FAIL");
		} else {
			fprintf(out, "soak: %.1f s, %llu rounds (each: dispatch + combine "
				"+ allreduce, all checked), %llu errors\n", el,
				(unsigned long long)round, (unsigned long long)errors_all);
			for (r = 0; r < S->size; r++)
				fprintf(out, "soak: rank %d VmRSS %.0f kB after warm-up, "
					"%.0f kB at the end (VmData %+.0f kB)\n", r,
					(double)cout[4 + 3 * r], (double)cout[5 + 3 * r],
					(double)cout[6 + 3 * r]);
			fprintf(out, "soak: largest growth %ld kB (VmRSS as far as "
				"VmData grew too; bound %d kB): %s\n",
				growth_max, SOAK_GROWTH_KB, ok ? "ok" : "FAILED");
		}
		fflush(out);
	}
	return ok ? 0 : errors_all ? -EIO : -ENOMEM;
}

static void soak_free(struct soak *S)
{
	int r;

	if (S->in)
		for (r = 0; r < S->size; r++) {
			free(S->in[r].ids);
			free(S->in[r].w);
			free(S->in[r].x);
			free(S->in[r].xf);
		}
	free(S->in);
	free(S->y);
	free(S->out);
	free(S->arin);
	free(S->arout);
	free(S->cin);
	free(S->cout);
	fabep_moe_destroy(S->moe);
	fabep_allreduce_destroy(S->ar);
	fabep_allreduce_destroy(S->ctl);
}

int bench_soak(fabep_comm_t *comm, const struct bench_opts *o, FILE *out)
{
	struct soak S;
	uint64_t round = 0, t_start, t_end, t_warm;
	long rss0 = 0, rss1 = 0, data0 = 0;
	int ret, warm_done = 0;
	double secs = o->soak_s > 0 ? o->soak_s : 10;

	memset(&S, 0, sizeof(S));
	S.rv.size = sizeof(S.rv);
	ret = soak_setup(&S, comm, o);
	if (!ret)
		ret = soak_alloc(&S);
	if (ret)
		goto out;

	if (S.rank == 0 && !o->machine) {
		fprintf(out, "# %s --soak %g: %d ranks, provider %s, signal %s; moe %d "
			"experts top-%d hidden %zu up to %d tokens (%s); allreduce up "
			"to %zu x %zu fp32\n", tool_name, secs, S.size,
			fabep_comm_provider(comm), fabep_signal_name(fabep_comm_signal(comm)),
			S.c.moe.num_experts, S.c.moe.top_k, S.H, S.c.moe.max_tokens,
			S.fp32 ? "fp32" : "bf16", S.c.ar_rows, S.c.ar_cols);
		fflush(out);
	}
	t_start = tool_now_ns();
	t_end = t_start + (uint64_t)(secs * 1e9);
	/* memory is measured from a tenth of the run (at least 20 rounds) */
	t_warm = t_start + (uint64_t)(secs * 1e8);

	for (;;) {
		round++;
		ret = soak_moe_round(&S, round);
		if (!ret)
			ret = soak_ar_round(&S, round);
		if (ret)
			goto out;

		/* rank 0 says when the warm-up is over and when to stop */
		memset(S.cin, 0, S.nctl * sizeof(float));
		if (S.rank == 0) {
			uint64_t now = tool_now_ns();

			S.cin[0] = now >= t_end && warm_done;
			S.cin[1] = now >= t_warm && round >= 20;
		}
		ret = fabep_allreduce(S.ctl, S.cin, S.cout, 1, S.nctl);
		if (ret) {
			tool_fail("fabep_allreduce (control)", ret);
			goto out;
		}
		if (S.cout[1] != 0 && !warm_done) {
			warm_done = 1;
			rss0 = status_kb("VmRSS:");
			data0 = status_kb("VmData:");
		}
		if (S.cout[0] != 0)
			break;
	}
	rss1 = status_kb("VmRSS:");
	ret = soak_summary(&S, comm, o, out, round, t_start, rss0, rss1,
			   status_kb("VmData:") - data0);
out:
	soak_free(&S);
	return ret;
}
