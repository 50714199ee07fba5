/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_ep.c - expert-parallel dispatch and combine, with forked ranks.
 *
 * Every rank generates every rank's input for a round (deterministic from
 * the seed, the source rank and the round), so it can compute on its own,
 * with the single-process reference below, what it must receive (rows in
 * expert-major order, offsets, source info, weights, scales) and what its
 * combine must return.  The toy expert multiplies a row by 1 + (e % 4) / 4.
 * Rows are read through row_index / row_stride / scale_stride, so the same
 * checks cover the default (copied, row_index the identity, checked) and
 * the FABEP_MOE_ZERO_COPY result.  Combine's bf16 output may differ from
 * the reference by one rounding per stage (check_out), and its row
 * callback must see each token once, with its finished row of out.
 */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fabep.h"
#include "harness.h"
#include "ep/ep.h"

/* R_CANCEL: top-k 3, each token's two large contributions cancel exactly
 * (weights +-2^7 or +-2^8 on experts of one expert scale) and leave a
 * small one; values chosen so that fp32 sums are exact in any order
 * (see cancel_token) */
/* R_DUP: every token names each of its experts twice (slots 2i, 2i + 1) */
/* R_ONE_FEW, R_ONE_IDLE: as R_ONE, but odd ranks send one token, none */
/* R_FULL: as R_RANDOM, but every rank sends max_tokens tokens */
enum { R_RANDOM, R_ONE, R_ZERO, R_NEG, R_CANCEL, R_DUP, R_ONE_FEW, R_ONE_IDLE,
       R_FULL };
#define R_ONE_ANY(r) ((r) == R_ONE || (r) == R_ONE_FEW || (r) == R_ONE_IDLE)
enum { B_NONE, B_RANGE, B_TOO_MANY, B_NULL_X };

struct params {
	int rounds, hidden, topk, experts, max_tokens;
	fabep_moe_type_t tt, it, ct;
	int block;
	int routing;
	int split;        /* send/recv halves with work between */
	int backward;     /* every other round: dispatch with the previous routing */
	int outstanding;  /* dispatch `sets` times, check BUSY, then combine all */
	int bad, bad_rank;
	int mismatch;     /* rank 1 asks for another hidden size (1), chunk
			   * (2), or for FABEP_MOE_PLACE=never alone (3) */
	int heap_small;
	int threads;
	int zcopy;        /* FABEP_MOE_ZERO_COPY */
	const char *chunk; /* FABEP_MOE_CHUNK (mismatch 2: only rank 1's) */
	int sendbuf;      /* tokens go through fabep_moe_send_buffer */
	const char *channels; /* FABEP_CHANNELS: the channels it must get */
	fabep_signal_t signal; /* 0: the automatic choice; else it must get it */
	int sender_copy;  /* it must get dispatch's sender copies under cqdata */
	int fused;        /* fused_round: fabep_moe_combine against the halves */
	int noweights;    /* dispatch with topk_weights NULL (all 1) */
	int refuse;       /* round 2: refused send halves on bad_rank (refuse_round) */
	int sets;         /* buffer_sets (0: the default) */
	int empty_null;   /* a rank with no tokens passes NULL x, ids, weights */
	int gather_writes; /* the handle's gather_writes instead of its own */
	int gathered;     /* every run to a peer must leave from the input
			   * slot, none staged (it must have more writes than
			   * FEP_EP_GATHER_WRITES) */
	const char *crows; /* FABEP_MOE_COMBINE_ROWS; "fit": some combine
			    * must send rows, "never" and "auto": none may */
	int ld_pad;       /* y's rows hidden + ld_pad apart (round_trip) */
	const char *place; /* FABEP_MOE_PLACE */
	int place_expect; /* 1: some source must place its rows, -1: none may */
	int place_cap;    /* the handle's place_rows instead of its own */
	int crowded;      /* the handle takes ranks to outnumber the CPUs
			   * (1) or not (-1), whatever this machine has */
	int lanes;        /* 1: some batch of copies must be made in lanes;
			   * -1: none may be */
	const char *lanes_env; /* FABEP_MOE_LANES */
	int slices;       /* some put must have gone in slices over the
			   * channels (cma_slices) */
	int mr_local;     /* act as if the provider needed registered local
			   * buffers (FI_MR_LOCAL, as verbs and efa do) */
	int keys;         /* each rank's heap under a key of its own, as
			   * verbs' and efa's provider keys are */
	size_t msg_max;   /* the largest message, below the provider's */
	int cq4;          /* 4 bytes of CQ data (verbs, efa), the handle
			   * behind a 160 MiB block: beyond what they name */
	size_t iov;       /* the most local pieces of a write, below the
			   * provider's iov_limit */
};

/* ---- an independent reference of the formats ---- */

static float bf16_to_f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static float e4m3_dec(uint8_t q)
{
	int s = q >> 7, e = (q >> 3) & 15, mt = q & 7;
	float v;

	if ((q & 0x7f) == 0x7f)
		return NAN;
	v = e ? ldexpf(1.0f + mt / 8.0f, e - 7) : ldexpf((float)mt, -9);
	return s ? -v : v;
}

static size_t tsize(fabep_moe_type_t t)
{
	return t == FABEP_MOE_FP32 ? 4 : t == FABEP_MOE_BF16 ? 2 : 1;
}

/* One rank's input of one round. */
struct input {
	size_t n;
	int32_t *ids;
	float *w;
	void *x;         /* caller's rows (input_type for FP8, else token type) */
	float *xs;       /* PREQUANT scales */
	float *xf;       /* reference values (fp32) */
};

static double urand(uint64_t *s)
{
	return (double)(fep_test_rand(s) >> 11) / 9007199254740992.0;
}

/* Token t's rows (and PREQUANT scales) of in. */
static void gen_row(const struct params *p, struct input *in, size_t t,
		    uint64_t *seed)
{
	size_t H = (size_t)p->hidden, h;
	size_t nsc = p->block ? (H + (size_t)p->block - 1) / (size_t)p->block : 1;
	fabep_moe_type_t xt = p->tt == FABEP_MOE_FP8 ? p->it : p->tt;

	for (h = 0; h < nsc; h++)
		in->xs[t * nsc + h] = (float)ldexp(1.0 + urand(seed), -(int)(fep_test_rand(seed) % 6));
	for (h = 0; h < H; h++) {
		float v = (float)(urand(seed) * 4.0 - 2.0);

		if (p->routing == R_CANCEL) {
			/* 8 significant bits, |v| in [1/4, 4): exact in bf16 */
			uint64_t r = fep_test_rand(seed);

			v = (float)ldexp(1.0 + (double)(r % 128) / 128.0,
					 (int)((r >> 7) % 4) - 2);
			if ((r >> 9) & 1)
				v = -v;
		}
		if (p->tt == FABEP_MOE_FP8_PREQUANT) {
			uint8_t q = (uint8_t)(fep_test_rand(seed) & 0xff);

			if ((q & 0x7f) == 0x7f)
				q = 0x3c;
			((uint8_t *)in->x)[t * H + h] = q;
			in->xf[t * H + h] = e4m3_dec(q) *
				in->xs[t * nsc + (p->block ? h / (size_t)p->block : 0)];
		} else if (xt == FABEP_MOE_BF16) {
			uint16_t b = f_to_bf16(v);

			((uint16_t *)in->x)[t * H + h] = b;
			in->xf[t * H + h] = bf16_to_f(b);
		} else {
			((float *)in->x)[t * H + h] = v;
			in->xf[t * H + h] = v;
		}
	}
}

/* R_CANCEL routing of token t (top-k 3, L = experts / size a multiple of
 * 4 and at least 8): a small term s (weight +-1/2 or +-1) and two large
 * ones, +A and -A (weights +-2^7 or +-2^8 and their negation, on two
 * experts of the same expert scale), in a random order of the k slots,
 * on one rank, on two (s apart), or on three.  Every partial sum an
 * expert rank can form holds s alone, +-A alone, A - A or s + A - A, so
 * each partial row is exact in bf16 and the token's sum is s.  The rows'
 * values (gen_row) have 8 significant bits and exponents -2..1, so every
 * term is a multiple of 2^-12 below 2^10, every sum of them one below
 * 2^11, exact in fp32 (24 bits), in any order: a combine that accumulates in fp32 and rounds
 * once per stage returns s exactly, one that rounds its running sum to
 * bf16 loses s into +-A for most orders. */
static void cancel_token(const struct params *p, int size, struct input *in,
			 size_t t, uint64_t *seed)
{
	int L = p->experts / size, mode, ds, d1, d2, i, is, role[3] = { 0, 1, 2 };
	int32_t e[3];
	float w[3], wa;
	size_t j;

	if (p->topk != 3 || L < 8 || L % 4)
		abort();  /* the test's parameters do not make the case */
	mode = (int)(fep_test_rand(seed) % (uint64_t)(size >= 3 ? 3 : size));
	ds = (int)(fep_test_rand(seed) % (uint64_t)size);
	d1 = d2 = ds;
	if (mode >= 1)
		d1 = d2 = (ds + 1 + (int)(fep_test_rand(seed) % (uint64_t)(size - 1))) % size;
	if (mode == 2)
		do
			d2 = (int)(fep_test_rand(seed) % (uint64_t)size);
		while (d2 == ds || d2 == d1);
	i = (int)(fep_test_rand(seed) % 4);
	is = (i + 1 + (int)(fep_test_rand(seed) % 3)) % 4 + 4 * (int)(fep_test_rand(seed) % 2);
	e[0] = ds * L + is;
	e[1] = d1 * L + i;
	e[2] = d2 * L + i + (d1 == d2 ? 4 : 0);
	w[0] = fep_test_rand(seed) & 1 ? 0.5f : 1.0f;
	if (fep_test_rand(seed) & 1)
		w[0] = -w[0];
	wa = fep_test_rand(seed) & 1 ? 128.0f : 256.0f;
	if (fep_test_rand(seed) & 1)
		wa = -wa;
	w[1] = wa;
	w[2] = -wa;
	for (j = 2; j > 0; j--) {  /* the roles in a random order */
		size_t o = (size_t)(fep_test_rand(seed) % (j + 1));
		int r = role[j];

		role[j] = role[o];
		role[o] = r;
	}
	for (j = 0; j < 3; j++) {
		in->ids[t * 3 + j] = e[role[j]];
		in->w[t * 3 + j] = w[role[j]];
	}
}

static void gen(const struct params *p, int size, int src, int round,
		struct input *in)
{
	uint64_t seed = 0x1234567ull + (uint64_t)src * 1000003ull +
			(uint64_t)round * 7919ull;
	size_t H = (size_t)p->hidden, k = (size_t)p->topk, t, j;
	size_t nsc = p->block ? (H + (size_t)p->block - 1) / (size_t)p->block : 1;
	fabep_moe_type_t xt = p->tt == FABEP_MOE_FP8 ? p->it : p->tt;
	int hot;

	fep_test_rand(&seed);
	in->n = (size_t)(fep_test_rand(&seed) % (uint64_t)(p->max_tokens + 1));
	if (R_ONE_ANY(p->routing))
		in->n = p->routing == R_ONE || src % 2 == 0 ? (size_t)p->max_tokens :
			p->routing == R_ONE_FEW ? 1 : 0;
	if (p->routing == R_FULL)
		in->n = (size_t)p->max_tokens;
	if (p->routing == R_ZERO && (src % 2 == 1 || size == 1))
		in->n = 0;
	hot = (int)(fep_test_rand(&seed) % (uint64_t)p->experts);
	in->ids = malloc((in->n + 1) * k * sizeof(int32_t));
	in->w = malloc((in->n + 1) * k * sizeof(float));
	in->x = malloc((in->n + 1) * H * tsize(xt));
	in->xs = malloc((in->n + 1) * nsc * sizeof(float));
	in->xf = malloc((in->n + 1) * H * sizeof(float));
	for (t = 0; t < in->n; t++) {
		if (p->routing == R_CANCEL)
			cancel_token(p, size, in, t, &seed);
		for (j = 0; j < k && p->routing != R_CANCEL; j++) {
			int32_t e = (int32_t)(fep_test_rand(&seed) % (uint64_t)p->experts);

			if (R_ONE_ANY(p->routing))
				e = j ? -1 : hot;
			else if (p->routing == R_DUP && j % 2)
				e = in->ids[t * k + j - 1];
			else if (p->routing == R_NEG && fep_test_rand(&seed) % 3 == 0)
				e = -1;
			in->ids[t * k + j] = e;
			in->w[t * k + j] = (float)(0.1 + urand(&seed));
			if (p->noweights)
				in->w[t * k + j] = 1.0f;  /* dispatch gets NULL */
		}
		gen_row(p, in, t, &seed);
	}
}

/* New rows for in's tokens (its routing kept), from another stream: what
 * a backward dispatch with the previous routing sends. */
static void gen_fresh_rows(const struct params *p, int src, int round,
			   struct input *in)
{
	uint64_t seed = 0xbac4a2dull + (uint64_t)src * 1000003ull +
			(uint64_t)round * 7919ull;
	size_t t;

	fep_test_rand(&seed);
	for (t = 0; t < in->n; t++)
		gen_row(p, in, t, &seed);
}

static void free_input(struct input *in)
{
	free(in->ids);
	free(in->w);
	free(in->x);
	free(in->xs);
	free(in->xf);
}

static float expert_scale(int e)
{
	return 1.0f + (float)(e % 4) / 4.0f;
}

/* The value of received row element h, dequantized. */
static float recv_val(const struct params *p, const fabep_moe_recv_t *rv,
		      size_t r, size_t h)
{
	size_t i = (size_t)rv->row_index[r];
	const char *row = (const char *)rv->x + i * rv->row_stride;

	switch (p->tt) {
	case FABEP_MOE_FP32: return ((const float *)row)[h];
	case FABEP_MOE_BF16: return bf16_to_f(((const uint16_t *)row)[h]);
	default:
		return e4m3_dec(((const uint8_t *)row)[h]) *
		       rv->scales[i * rv->scale_stride +
				  (p->block ? h / (size_t)p->block : 0)];
	}
}

/* FP8 error bound of element h of a token (scale of its block). */
static float fp8_bound(const struct params *p, const float *row, size_t h)
{
	size_t H = (size_t)p->hidden, b0 = 0, b1 = H, i;
	float amax = 0, sc;

	if (p->tt != FABEP_MOE_FP8)
		return 0;
	if (p->block) {
		b0 = h / (size_t)p->block * (size_t)p->block;
		b1 = b0 + (size_t)p->block < H ? b0 + (size_t)p->block : H;
	}
	for (i = b0; i < b1; i++)
		amax = fmaxf(amax, fabsf(row[i]));
	sc = amax > 0 ? amax / 448.0f : 1.0f;
	return fabsf(row[h]) / 15.0f + sc / 500.0f + 1e-30f;
}

/* Check what this rank received against the reference. */
static int check_recv(const struct params *p, int rank, int size,
		      struct input *all, const fabep_moe_recv_t *rv)
{
	int L = p->experts / size, e, s, j;
	size_t H = (size_t)p->hidden, k = (size_t)p->topk, r = 0, t, h;

	if (rv->local_experts != L || rv->first_expert != rank * L) {
		fprintf(stderr, "rank %d: local experts %d first %d\n", rank,
			rv->local_experts, rv->first_expert);
		return -1;
	}
	if (rv->rows && (!rv->row_index || rv->row_stride < H * tsize(p->tt) ||
			 (p->tt >= FABEP_MOE_FP8 &&
			  rv->scale_stride < rv->scales_per_row))) {
		fprintf(stderr, "rank %d: row_index %p, row_stride %zu, scale_stride "
			"%zu\n", rank, (const void *)rv->row_index, rv->row_stride,
			rv->scale_stride);
		return -1;
	}
	if (!p->zcopy) {
		/* the default: rows copied in order, contiguous */
		if (rv->rows && (rv->row_stride != H * tsize(p->tt) ||
				 (p->tt >= FABEP_MOE_FP8 &&
				  rv->scale_stride != rv->scales_per_row))) {
			fprintf(stderr, "rank %d: copied rows with stride %zu/%zu\n",
				rank, rv->row_stride, rv->scale_stride);
			return -1;
		}
		for (r = 0; r < rv->rows; r++)
			if (rv->row_index[r] != (int32_t)r) {
				fprintf(stderr, "rank %d: row_index[%zu] = %d\n", rank,
					r, rv->row_index[r]);
				return -1;
			}
		r = 0;
	}
	for (e = 0; e < L; e++) {
		int ge = rank * L + e;

		if (rv->row_offsets[e] != r || rv->expert_ids[e] != ge) {
			fprintf(stderr, "rank %d: expert %d offset %u (want %zu) id %d\n",
				rank, e, rv->row_offsets[e], r, rv->expert_ids[e]);
			return -1;
		}
		for (s = 0; s < size; s++)
			for (t = 0; t < all[s].n; t++)
				for (j = 0; j < p->topk; j++) {
					if (all[s].ids[t * k + (size_t)j] != ge)
						continue;
					if (r >= rv->rows) {
						fprintf(stderr, "rank %d: too few rows %zu\n",
							rank, rv->rows);
						return -1;
					}
					if (rv->src_info[3 * r] != s ||
					    rv->src_info[3 * r + 1] != (int)t ||
					    rv->src_info[3 * r + 2] != j ||
					    rv->weights[r] != all[s].w[t * k + (size_t)j]) {
						fprintf(stderr, "rank %d row %zu: src_info %d/%d/%d "
							"w %g, want %d/%zu/%d w %g\n", rank, r,
							rv->src_info[3 * r], rv->src_info[3 * r + 1],
							rv->src_info[3 * r + 2], rv->weights[r], s,
							t, j, all[s].w[t * k + (size_t)j]);
						return -1;
					}
					for (h = 0; h < H; h++) {
						float v = recv_val(p, rv, r, h);
						float want = all[s].xf[t * H + h];
						float tol = fp8_bound(p, all[s].xf + t * H, h);

						if (!(fabsf(v - want) <= tol)) {
							fprintf(stderr, "rank %d row %zu col %zu: "
								"%g, want %g (tol %g)\n", rank,
								r, h, v, want, tol);
							return -1;
						}
					}
					r++;
				}
		if (rv->expert_counts[e] != r - rv->row_offsets[e]) {
			fprintf(stderr, "rank %d: expert %d count %u\n", rank, e,
				rv->expert_counts[e]);
			return -1;
		}
	}
	if (rv->row_offsets[L] != r || rv->rows != r) {
		fprintf(stderr, "rank %d: %zu rows, want %zu\n", rank, rv->rows, r);
		return -1;
	}
	return 0;
}

/* The toy experts: y = x * expert_scale(e), in the combine type. */
static void *experts(const struct params *p, const fabep_moe_recv_t *rv)
{
	size_t H = (size_t)p->hidden + (size_t)p->ld_pad, r, h;
	void *y = malloc((rv->rows + 1) * H * 4);
	int e;

	for (e = 0; e < rv->local_experts; e++)
		for (r = rv->row_offsets[e]; r < rv->row_offsets[e + 1]; r++)
			for (h = 0; h < (size_t)p->hidden; h++) {
				float v = recv_val(p, rv, r, h) *
					  expert_scale(rv->expert_ids[e]);

				if (p->ct == FABEP_MOE_FP32)
					((float *)y)[r * H + h] = v;
				else
					((uint16_t *)y)[r * H + h] = f_to_bf16(v);
			}
	return y;
}

/* The toy expert's output for value x of a token, as experts() makes it
 * (FP8 tokens: unrounded, their received values are not known here). */
static double expert_out(const struct params *p, float x, int e)
{
	float v = x * expert_scale(e);

	if (p->ct == FABEP_MOE_BF16 && p->tt != FABEP_MOE_FP8)
		return bf16_to_f(f_to_bf16(v));
	return v;
}

/*
 * Check combine's output against the reference, the sum over k of
 * c_k * y_k (c_k = w_k, or 1 unweighted) with the experts' y as they
 * were made.  The error allowed is what the documented arithmetic makes:
 *   fp32 output: fp32 sums, 1e-5 of sum |terms|;
 *   bf16 output: each expert rank d sums its terms in fp32 and rounds the
 *     partial row P_d once to bf16; the source sums its at most
 *     min(top_k, ranks) partial rows in fp32 and rounds once: at most
 *     u * (sum_d |P_d| + |sum|) with u = 2^-8 (bf16's unit roundoff),
 *     plus the fp32 sums' (k + 2) * 2^-23 of sum |terms|;
 *   FP8 tokens: their quantization (fp8_bound) for each term, and for
 *     bf16 output the expert's rounding of y (u of each term), which go
 *     into the partials.
 * A combine that rounds its running sum to bf16 exceeds this where terms
 * of one partial cancel, or add one rounding per term; R_CANCEL makes
 * every sum exact in fp32, and then the output must be exactly the sum.
 */
static int check_out(const struct params *p, int rank, int size,
		     const struct input *in, const void *out, int weighted)
{
	size_t H = (size_t)p->hidden, k = (size_t)p->topk, t, h, j;
	int L = p->experts / size, pr[FABEP_MOE_MAX_TOPK];
	double u = 1.0 / 256, ps[FABEP_MOE_MAX_TOPK];

	for (t = 0; t < in->n; t++)
		for (h = 0; h < H; h++) {
			double want = 0, mag = 0, qerr = 0, psum = 0, tol, e1, slop, v;
			int np = 0, q;

			for (j = 0; j < k; j++) {
				int32_t e = in->ids[t * k + j];
				double c, term;

				if (e < 0)
					continue;
				c = weighted ? in->w[t * k + j] : 1.0;
				term = c * expert_out(p, in->xf[t * H + h], e);
				for (q = 0; q < np && pr[q] != e / L; q++)
					;
				if (q == np) {
					pr[np] = e / L;
					ps[np++] = 0;
				}
				ps[q] += term;
				want += term;
				mag += fabs(term);
				qerr += fabs(c) * expert_scale(e) *
					fp8_bound(p, in->xf + t * H, h);
			}
			for (q = 0; q < np; q++)
				psum += fabs(ps[q]);
			slop = (double)(k + 2) * ldexp(1.0, -23) * mag;
			if (p->routing == R_CANCEL && weighted)
				tol = 0;
			else if (p->ct == FABEP_MOE_FP32)
				tol = qerr * 1.01 + 1e-5 * mag + 1e-6;
			else {
				e1 = qerr + (p->tt == FABEP_MOE_FP8 ? u * (mag + qerr) : 0);
				tol = (e1 + u * (psum + fabs(want) + 2 * (e1 + slop))) * 1.01 +
				      slop + 1e-6;
			}
			v = p->ct == FABEP_MOE_FP32 ? ((const float *)out)[t * H + h]
			    : bf16_to_f(((const uint16_t *)out)[t * H + h]);
			if (!(fabs(v - want) <= tol)) {
				fprintf(stderr, "rank %d: combine token %zu col %zu: %.9g, "
					"want %.9g (tol %.3g: %d partial rows, sum of their "
					"|values| %.9g, of the terms' %.9g)\n", rank, t, h, v,
					want, tol, np, psum, mag);
				return -1;
			}
		}
	return 0;
}

/* What the row callback of one combine saw: each token at most once, a
 * token below n, the row of out that belongs to it, and (copied at the
 * call) its values, which must be the final ones. */
struct rows_seen {
	size_t n, row_bytes;
	char *out;
	unsigned char *seen;
	char *snap;
	long calls;
	int bad;             /* the first fault: 1 token >= n, 2 twice, 3 row */
	size_t bad_token;
	void *bad_row;
};

static void rows_init(struct rows_seen *c, const struct params *p, size_t n,
		      void *out)
{
	memset(c, 0, sizeof(*c));
	c->n = n;
	c->row_bytes = (size_t)p->hidden * (p->ct == FABEP_MOE_FP32 ? 4 : 2);
	c->out = out;
	c->seen = calloc(n + 1, 1);
	c->snap = calloc(n + 1, c->row_bytes);
}

static void rows_fault(struct rows_seen *c, int why, size_t token, void *row)
{
	int none = 0;

	if (__atomic_compare_exchange_n(&c->bad, &none, why, 0, __ATOMIC_RELAXED,
					__ATOMIC_RELAXED)) {
		c->bad_token = token;
		c->bad_row = row;
	}
}

static void count_row(void *ctx, size_t token, void *row)
{
	struct rows_seen *c = ctx;

	__atomic_add_fetch(&c->calls, 1, __ATOMIC_RELAXED);
	if (token >= c->n) {
		rows_fault(c, 1, token, row);
		return;
	}
	if (__atomic_exchange_n(&c->seen[token], 1, __ATOMIC_RELAXED)) {
		rows_fault(c, 2, token, row);
		return;
	}
	if ((char *)row != c->out + token * c->row_bytes)  /* ld_out is hidden */
		rows_fault(c, 3, token, row);
	memcpy(c->snap + token * c->row_bytes, row, c->row_bytes);
}

/* After the combine: every token's row seen once, with its final values.
 * Frees c's buffers.  0 or -1 (logged). */
static int rows_check(struct rows_seen *c, int rank, int round)
{
	size_t t;
	int rc = -1;

	if (c->bad) {
		fprintf(stderr, "rank %d round %d: the row callback got token %zu "
			"row %p: %s (out %p, %zu tokens)\n", rank, round, c->bad_token,
			c->bad_row, c->bad == 1 ? "not a token of the call" :
			c->bad == 2 ? "a token seen twice" : "not the token's row of out",
			(void *)c->out, c->n);
		goto out;
	}
	if (c->calls != (long)c->n) {
		fprintf(stderr, "rank %d round %d: the row callback saw %ld rows of "
			"%zu\n", rank, round, c->calls, c->n);
		goto out;
	}
	for (t = 0; t < c->n; t++)
		if (memcmp(c->snap + t * c->row_bytes, c->out + t * c->row_bytes,
			   c->row_bytes)) {
			fprintf(stderr, "rank %d round %d: token %zu's row when the "
				"callback saw it differs from the row in out\n", rank,
				round, t);
			goto out;
		}
	rc = 0;
out:
	free(c->seen);
	free(c->snap);
	c->seen = NULL;
	c->snap = NULL;
	return rc;
}

/* Some local work between the halves. */
static double busy_work(size_t n)
{
	volatile double a = 0;
	size_t i;

	for (i = 0; i < n; i++)
		a += (double)i * 1e-9;
	return a;
}

static void fill_cfg(const struct params *p, fabep_moe_config_t *cfg)
{
	fabep_moe_config_init(cfg);
	cfg->num_experts = p->experts;
	cfg->top_k = p->topk;
	cfg->hidden = (size_t)p->hidden;
	cfg->max_tokens = p->max_tokens;
	cfg->token_type = p->tt;
	cfg->input_type = p->it;
	cfg->combine_type = p->ct;
	cfg->fp8_block = p->block;
	cfg->flags = p->zcopy ? FABEP_MOE_ZERO_COPY : 0;
	cfg->buffer_sets = p->sets;
}

static int make(const struct params *p, int rank, int size, fabep_comm_t **comm,
		fabep_moe_t **moe, fabep_moe_config_t *cfg)
{
	fabep_comm_attr_t a;
	int ret;

	fill_cfg(p, cfg);
	fabep_comm_attr_init(&a);
	if (p->channels)
		setenv("FABEP_CHANNELS", p->channels, 1);
	a.threads = p->threads ? p->threads : fep_test_threads(1);
	a.signal = p->signal;
	a.heap_size = fabep_moe_heap_bytes(cfg, size) + (1u << 20);
	if (p->heap_small)
		a.heap_size = 1u << 20;
	fep_test_emulate(rank, p->mr_local, p->keys, p->msg_max, p->iov);
	if (p->cq4) {
		fep_test_cq4();
		a.heap_size += FEP_TEST_CQ4_FILLER;
	}
	ret = fabep_comm_create(&a, comm);
	if (ret) {
		fprintf(stderr, "rank %d: fabep_comm_create: %s\n", rank, fabep_strerror(ret));
		/* a timeout; or a strategy asked for that is not offered here */
		return ret == -ETIMEDOUT ||
		       (p->signal && ret == -FABEP_ERR_NO_SIGNAL) ? 77 : 1;
	}
	/* the configuration the case is about, not another one */
	if (p->mr_local && fep_fab_ptr_ok((*comm)->fab)) {
		fprintf(stderr, "rank %d: writes may leave from unregistered "
			"memory, though the case asks for FI_MR_LOCAL\n", rank);
		return 1;
	}
	if (p->iov && (*comm)->fab->iov_max != p->iov) {
		fprintf(stderr, "rank %d: writes of up to %zu pieces, though the "
			"case asks for %zu\n", rank, (*comm)->fab->iov_max, p->iov);
		return 1;
	}
	if ((p->channels && fabep_comm_channels(*comm) != atoi(p->channels)) ||
	    (p->signal && fabep_comm_signal(*comm) != p->signal) ||
	    (p->sender_copy && !(*comm)->fab->sender_copy)) {
		fprintf(stderr, "rank %d: signal %s, %d channels%s; the case asks "
			"for %s, %s channels%s\n", rank,
			fabep_signal_name(fabep_comm_signal(*comm)),
			fabep_comm_channels(*comm),
			(*comm)->fab->sender_copy ? ", the sender's copies" : "",
			p->signal ? fabep_signal_name(p->signal) : "any strategy",
			p->channels ? p->channels : "any",
			p->sender_copy ? ", the sender's copies" : "");
		return 1;
	}
	if (p->chunk && (p->mismatch != 2 || rank == 1))
		setenv("FABEP_MOE_CHUNK", p->chunk, 1);
	if (p->crows)
		setenv("FABEP_MOE_COMBINE_ROWS", p->crows, 1);
	if (p->place)
		setenv("FABEP_MOE_PLACE", p->place, 1);
	if (p->lanes_env)
		setenv("FABEP_MOE_LANES", p->lanes_env, 1);
	if (p->mismatch == 3 && rank == 1)
		setenv("FABEP_MOE_PLACE", "never", 1);
	if (p->mismatch == 1 && rank == 1)
		cfg->hidden++;
	if (p->cq4 && fep_test_cq4_filler(*comm, rank))
		return 1;
	ret = fabep_moe_create(*comm, cfg, moe);
	if (p->mismatch || p->heap_small) {
		int want = p->mismatch ? -FABEP_ERR_MISMATCH : -FABEP_ERR_HEAP_FULL;

		if (ret != want) {
			fprintf(stderr, "rank %d: fabep_moe_create gave %d (%s), want %d\n",
				rank, ret, fabep_strerror(ret), want);
			return 1;
		}
		return 2;  /* expected failure: the caller stops here */
	}
	if (ret) {
		fprintf(stderr, "rank %d: fabep_moe_create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	if (p->gather_writes)
		(*moe)->gather_writes = (size_t)p->gather_writes;
	if (p->crowded)  /* auto places only where ranks do not crowd */
		(*moe)->crowded = p->crowded > 0;
	if (p->place_cap)  /* fewer rows fit: more calls are not placed */
		(*moe)->place_rows = FEP_MIN((*moe)->place_rows, (size_t)p->place_cap);
	if (p->gathered && (!(*moe)->gather ||
			    (*moe)->gather_writes <= FEP_EP_GATHER_WRITES)) {
		fprintf(stderr, "rank %d: runs %s, at most %zu writes each; the "
			"case asks for more than %d\n", rank, (*moe)->gather ?
			"gathered" : "not gathered", (*moe)->gather_writes,
			FEP_EP_GATHER_WRITES);
		return 1;
	}
	return 0;
}

/* p->gathered: no chunk of this dispatch's runs was staged. */
static int check_gathered(const struct params *p, fabep_moe_t *m, int rank,
			  int round)
{
	size_t j;
	int d;

	for (d = 0; p->gathered && d < m->size; d++)
		for (j = 1; d != rank && j < m->dchunks; j++)
			if (!m->chunk_direct[(size_t)d * m->dchunks + j]) {
				fprintf(stderr, "rank %d round %d: chunk %zu of the "
					"run to rank %d was staged (%u records, at "
					"most %zu writes)\n", rank, round, j, d,
					m->set[m->dlast].sent[d],
					m->gather_writes);
				return 1;
			}
	return 0;
}

/* The rows dispatch takes: me's own, or (p->sendbuf) a copy of them in
 * the send buffer.  0 or 1 (logged). */
static int send_input(const struct params *p, fabep_moe_t *moe, int rank,
		      const struct input *me, const void **x, const float **xs)
{
	void *bx;
	float *bs;
	size_t st, sst, t, eb;
	int ret;

	*x = me->x;
	*xs = me->xs;
	if (!p->sendbuf)
		return 0;
	ret = fabep_moe_send_buffer(moe, &bx, &st, &bs, &sst);
	if (p->tt == FABEP_MOE_FP8) {
		if (ret != -ENOTSUP) {
			fprintf(stderr, "rank %d: send_buffer for FP8 gave %d\n", rank, ret);
			return 1;
		}
		return 0;
	}
	if (ret) {
		fprintf(stderr, "rank %d: send_buffer: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	eb = p->tt == FABEP_MOE_FP32 ? 4 : p->tt == FABEP_MOE_BF16 ? 2 : 1;
	for (t = 0; t < me->n; t++) {
		memcpy((char *)bx + t * st, (const char *)me->x + t * (size_t)p->hidden * eb,
		       (size_t)p->hidden * eb);
		if (p->tt == FABEP_MOE_FP8_PREQUANT) {
			size_t ns = p->block ? ((size_t)p->hidden + (size_t)p->block - 1) /
					       (size_t)p->block : 1;

			memcpy(bs + t * sst, me->xs + t * ns, ns * 4);
		}
	}
	*x = bx;
	*xs = p->tt == FABEP_MOE_FP8_PREQUANT ? bs : NULL;
	return 0;
}

/* One full round: dispatch, check, experts, combine, check.  A backward
 * round dispatches new rows with the previous round's routing (topk_ids
 * NULL) and sums them back unweighted. */
/* Combines of this rank's dispatches that asked some rank for rows
 * (p->crows). */
static long rows_taken;
/* sources whose rows came placed, over the rank's dispatches */
static long placed_seen;

static void count_placed(fabep_moe_t *m)
{
	const struct fep_ep_set *s = &m->set[m->dlast];
	int src;

	for (src = 0; src < m->size; src++)
		placed_seen += s->placed[src];
}

static int round_trip(const struct params *p, fabep_moe_t *moe, int rank,
		      int size, int round, int backward)
{
	struct input *all = calloc((size_t)size, sizeof(*all));
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	struct rows_seen rs;
	void *y = NULL, *out = NULL;
	int s, ret, rc = 1, weighted = !backward;
	struct input *me;
	const void *sx;
	const float *sxs;
	const float *w;

	memset(&rs, 0, sizeof(rs));
	for (s = 0; s < size; s++) {
		gen(p, size, s, backward ? round - 1 : round, &all[s]);
		if (backward)
			gen_fresh_rows(p, s, round, &all[s]);
	}
	me = &all[rank];
	w = p->noweights ? NULL : me->w;
	if (send_input(p, moe, rank, me, &sx, &sxs))
		goto out;
	if (p->empty_null && !me->n) {
		sx = NULL;
		sxs = NULL;
		w = NULL;
		free(me->ids);
		me->ids = NULL;
	}
	if (p->split) {
		ret = fabep_moe_dispatch_send(moe, sx, sxs, me->n,
					      backward ? NULL : me->ids,
					      backward ? NULL : w);
		busy_work(20000);
		if (!ret)
			ret = fabep_moe_dispatch_recv(moe, &rv);
	} else {
		ret = fabep_moe_dispatch(moe, sx, sxs, me->n,
					 backward ? NULL : me->ids,
					 backward ? NULL : w, &rv);
	}
	if (ret) {
		fprintf(stderr, "rank %d round %d: dispatch: %s\n", rank, round,
			fabep_strerror(ret));
		goto out;
	}
	if (check_gathered(p, moe, rank, round) ||
	    check_recv(p, rank, size, all, &rv))
		goto out;
	if (p->crows)
		rows_taken += moe->set[moe->dlast].nx;
	count_placed(moe);
	y = experts(p, &rv);
	out = malloc((me->n + 1) * (size_t)p->hidden * 4);
	rows_init(&rs, p, me->n, out);
	if (p->split) {
		ret = fabep_moe_combine_send(moe, y, (size_t)(p->hidden + p->ld_pad),
					     weighted ? 0 : FABEP_MOE_UNWEIGHTED);
		busy_work(20000);
		if (!ret)
			ret = fabep_moe_combine_recv(moe, out, (size_t)p->hidden,
						     count_row, &rs);
	} else {
		ret = fabep_moe_combine(moe, y, (size_t)(p->hidden + p->ld_pad),
					weighted ? 0 : FABEP_MOE_UNWEIGHTED, out,
					(size_t)p->hidden, count_row, &rs);
	}
	if (ret) {
		fprintf(stderr, "rank %d round %d: combine: %s\n", rank, round,
			fabep_strerror(ret));
		goto out;
	}
	if (rows_check(&rs, rank, round))
		goto out;
	if (check_out(p, rank, size, me, out, weighted))
		goto out;
	rc = 0;
out:
	for (s = 0; s < size; s++)
		free_input(&all[s]);
	free(all);
	free(y);
	free(out);
	free(rs.seen);
	free(rs.snap);
	return rc;
}

/* Bad input on one rank: every rank gets the same code, then recovers. */
static int bad_round(const struct params *p, fabep_moe_t *moe, int rank,
		     int size, int round)
{
	struct input in;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	int ret, want;
	size_t n;
	const void *x;

	gen(p, size, rank, round, &in);
	n = in.n;
	x = in.x;
	want = p->bad == B_RANGE ? -ERANGE : p->bad == B_TOO_MANY ? -EMSGSIZE : -EINVAL;
	if (rank == p->bad_rank) {
		if (p->bad == B_RANGE) {
			if (!n)
				n = 1;
			in.ids[0] = p->experts;
		} else if (p->bad == B_TOO_MANY) {
			n = (size_t)p->max_tokens + 1;
			free(in.ids);
			in.ids = calloc(n * (size_t)p->topk, sizeof(int32_t));
		} else {
			n = 1;
			x = NULL;
		}
	}
	ret = fabep_moe_dispatch(moe, x, in.xs, n, in.ids, in.w, &rv);
	free_input(&in);
	if (ret != want) {
		fprintf(stderr, "rank %d: bad input on rank %d gave %d (%s), want %d\n",
			rank, p->bad_rank, ret, fabep_strerror(ret), want);
		return 1;
	}
	return 0;
}

#define WANT(call, want, what)                                               \
	do {                                                                 \
		int got_ = (call);                                           \
		if (got_ != (want)) {                                        \
			fprintf(stderr, "rank %d: %s gave %d (%s), want %d\n", \
				rank, what, got_, fabep_strerror(got_), (want)); \
			goto out;                                            \
		}                                                            \
	} while (0)

/*
 * Send halves refused for their input on bad_rank, whose caller then does
 * what callers do after an error: nothing more for that call.  The
 * refusing rank's send half returns the code and owes no receive half;
 * every other rank's send half succeeds and its receive half returns the
 * same code.  Then, with the halves: a dispatch (checked), its combine
 * refused on bad_rank (NULL expert outputs, or unknown flags where it
 * received no rows), the same combine again (the refusal did not use the
 * dispatch up; checked), and a dispatch refused on bad_rank for its
 * backward (topk_ids NULL and a different n), after which the next
 * round's checks run as always.
 */
/* Shared by the ranks of a refuse case (run maps it before they fork):
 * the refused send halves bad_rank has returned from. */
static volatile uint32_t *refuse_mark;

/* A refused send half waits for the peers' send halves only, never for
 * their receive halves (a caller computes between the halves): the
 * other ranks enter theirs only once bad_rank's has returned, or fail
 * after 20 s. */
static int refuse_await(int rank, uint32_t step, const char *what)
{
	int i;

	for (i = 0; i < 20000; i++) {
		if (__atomic_load_n(refuse_mark, __ATOMIC_ACQUIRE) >= step)
			return 0;
		usleep(1000);
	}
	fprintf(stderr, "rank %d: the refused %s did not return before the "
		"peers' receive halves\n", rank, what);
	return 1;
}

static int refuse_round(const struct params *p, fabep_moe_t *moe, int rank,
			int size, int round)
{
	struct input *all = calloc((size_t)size, sizeof(*all));
	size_t H = (size_t)p->hidden;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	void *y = NULL, *out = NULL;
	int32_t *bad_ids = NULL;
	int s, rc = 1, bad = rank == p->bad_rank;
	struct input *me;

	for (s = 0; s < size; s++)
		gen(p, size, s, round, &all[s]);
	me = &all[rank];
	/* 1. dispatch: an expert id out of range on bad_rank */
	if (bad) {
		size_t n = me->n ? me->n : 1;

		bad_ids = calloc(n * (size_t)p->topk, sizeof(int32_t));
		bad_ids[n * (size_t)p->topk - 1] = p->experts;
		WANT(fabep_moe_dispatch_send(moe, me->x, me->xs, n, bad_ids, me->w),
		     -ERANGE, "refused dispatch_send");
		__atomic_store_n(refuse_mark, 1, __ATOMIC_RELEASE);
	} else {
		WANT(fabep_moe_dispatch_send(moe, me->x, me->xs, me->n, me->ids, me->w),
		     0, "dispatch_send beside a refused one");
		if (refuse_await(rank, 1, "dispatch_send"))
			goto out;
		WANT(fabep_moe_dispatch_recv(moe, &rv), -ERANGE,
		     "dispatch_recv of a call refused on another rank");
	}
	/* 2. the next dispatch works everywhere */
	WANT(fabep_moe_dispatch_send(moe, me->x, me->xs, me->n, me->ids, me->w), 0,
	     "dispatch_send after the refused one");
	WANT(fabep_moe_dispatch_recv(moe, &rv), 0, "dispatch_recv after the refused one");
	if (check_recv(p, rank, size, all, &rv))
		goto out;
	y = experts(p, &rv);
	out = malloc((me->n + 1) * H * 4);
	/* 3. its combine, refused on bad_rank */
	if (bad) {
		WANT(fabep_moe_combine_send(moe, rv.rows ? NULL : y, H,
					    rv.rows ? 0 : 0x80u),
		     -EINVAL, "refused combine_send");
		__atomic_store_n(refuse_mark, 2, __ATOMIC_RELEASE);
	} else {
		WANT(fabep_moe_combine_send(moe, y, H, 0), 0,
		     "combine_send beside a refused one");
		if (refuse_await(rank, 2, "combine_send"))
			goto out;
		WANT(fabep_moe_combine_recv(moe, out, H, NULL, NULL), -EINVAL,
		     "combine_recv of a call refused on another rank");
	}
	/* 4. the same combine again: the dispatch is still there */
	WANT(fabep_moe_combine_send(moe, y, H, 0), 0, "combine_send again");
	WANT(fabep_moe_combine_recv(moe, out, H, NULL, NULL), 0, "combine_recv again");
	if (check_out(p, rank, size, me, out, 1))
		goto out;
	/* 4b. a dispatch refused on bad_rank for a NaN weight of a routed
	 * slot (one token, a zero row) */
	if (bad) {
		int32_t ids1[FABEP_MOE_MAX_TOPK];
		float w1[FABEP_MOE_MAX_TOPK];
		void *x1 = calloc(H, 8);
		int j, got;

		for (j = 0; j < p->topk; j++) {
			ids1[j] = j;
			w1[j] = j ? 1.0f : NAN;
		}
		got = fabep_moe_dispatch_send(moe, x1, NULL, 1, ids1, w1);
		free(x1);
		WANT(got, -EINVAL, "dispatch_send with a NaN weight");
	} else {
		WANT(fabep_moe_dispatch_send(moe, me->x, me->xs, me->n, me->ids, me->w),
		     0, "dispatch_send beside a NaN weight");
		WANT(fabep_moe_dispatch_recv(moe, &rv), -EINVAL,
		     "dispatch_recv of a call with a NaN weight on another rank");
	}
	/* 4c. a combine whose weighting differs on bad_rank: every rank
	 * fails with -FABEP_ERR_MISMATCH, and its dispatch is gone */
	WANT(fabep_moe_dispatch(moe, me->x, me->xs, me->n, me->ids, me->w, &rv), 0,
	     "dispatch before a mismatched combine");
	free(y);
	y = experts(p, &rv);
	/* and writes no row of out (none is summed early, fused, either) */
	memset(out, 0xa5, (me->n + 1) * H * 4);
	WANT(fabep_moe_combine(moe, y, H, bad ? FABEP_MOE_UNWEIGHTED : 0, out, H,
			       NULL, NULL), -FABEP_ERR_MISMATCH,
	     "combine with FABEP_MOE_UNWEIGHTED on one rank");
	{
		size_t i;

		for (i = 0; i < (me->n + 1) * H * 4; i++)
			if (((uint8_t *)out)[i] != 0xa5) {
				fprintf(stderr, "rank %d: the mismatched combine "
					"wrote byte %zu of out\n", rank, i);
				goto out;
			}
	}
	WANT(fabep_moe_combine(moe, y, H, 0, out, H, NULL, NULL), -EINVAL,
	     "combine after the mismatched one");
	/* 5. a backward refused on bad_rank (its n differs from the previous
	 * call's); the next round follows */
	if (bad) {
		WANT(fabep_moe_dispatch_send(moe, me->x, me->xs, me->n + 1, NULL, NULL),
		     -EINVAL, "refused backward dispatch_send");
	} else {
		WANT(fabep_moe_dispatch_send(moe, me->x, me->xs, me->n, NULL, NULL), 0,
		     "backward dispatch_send beside a refused one");
		WANT(fabep_moe_dispatch_recv(moe, &rv), -EINVAL,
		     "backward dispatch_recv of a call refused on another rank");
	}
	rc = 0;
out:
	for (s = 0; s < size; s++)
		free_input(&all[s]);
	free(all);
	free(bad_ids);
	free(y);
	free(out);
	return rc;
}

/* buffer_sets dispatches in a row, a refused one, then the combines. */
/* With one dispatch outstanding, a dispatch refused everywhere (the
 * last rank passes more than max_tokens, the others none): the refused
 * call leaves no set taken, so the next one must be admitted, not
 * answered BUSY, and no routing kept.  0, or 1 (logged). */
static int refuse_between(const struct params *p, fabep_moe_t *moe, int rank,
			  int size)
{
	size_t n = rank == size - 1 ? (size_t)p->max_tokens + 1 : 0;
	int32_t *ids = calloc(n + 1, (size_t)p->topk * sizeof(*ids));
	void *x = calloc(n + 1, (size_t)p->hidden * 4);
	float *xs = calloc((n + 1) * (size_t)p->hidden, sizeof(*xs));
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	int ret = -ENOMEM;

	if (ids && x && xs)
		ret = fabep_moe_dispatch(moe, x, xs, n, ids, NULL, &rv);
	free(ids);
	free(x);
	free(xs);
	if (ret == 0 || ret == -FABEP_ERR_BUSY || ret == -ENOMEM) {
		fprintf(stderr, "rank %d: the dispatch refused between two "
			"outstanding ones gave %d (%s)\n", rank, ret,
			ret ? fabep_strerror(ret) : "accepted");
		return 1;
	}
	return 0;
}

static int outstanding_rounds(const struct params *p, fabep_moe_t *moe,
			      int rank, int size, int round)
{
	struct input all[2][8];
	fabep_moe_recv_t rv[2] = { { .size = sizeof(rv[0]) }, { .size = sizeof(rv[1]) } };
	fabep_moe_recv_t extra = { .size = sizeof(extra) };
	void *y[2] = { NULL, NULL }, *out = NULL;
	int s, i, ret, rc = 1;

	/* the second dispatch, after the refused one, repeats the first's
	 * routing by topk_ids NULL: the refused call's is not kept */
	for (i = 0; i < 2; i++)
		for (s = 0; s < size; s++)
			gen(p, size, s, round, &all[i][s]);
	for (i = 0; i < 2; i++) {
		struct input *me = &all[i][rank];
		const void *sx;
		const float *sxs;

		if (i == 1 && refuse_between(p, moe, rank, size))
			goto out;
		if (send_input(p, moe, rank, me, &sx, &sxs))
			goto out;
		ret = fabep_moe_dispatch(moe, sx, sxs, me->n, i ? NULL : me->ids,
					 p->noweights || i ? NULL : me->w, &rv[i]);
		if (ret) {
			fprintf(stderr, "rank %d: outstanding dispatch %d: %s\n", rank,
				i, fabep_strerror(ret));
			goto out;
		}
	}
	ret = fabep_moe_dispatch(moe, all[0][rank].x, all[0][rank].xs,
				 all[0][rank].n, all[0][rank].ids, all[0][rank].w,
				 &extra);
	if (ret != -FABEP_ERR_BUSY) {
		fprintf(stderr, "rank %d: third dispatch gave %d, want BUSY\n", rank, ret);
		goto out;
	}
	if (p->sendbuf && p->tt != FABEP_MOE_FP8 &&
	    (ret = fabep_moe_send_buffer(moe, NULL, NULL, NULL, NULL)) != -FABEP_ERR_BUSY) {
		fprintf(stderr, "rank %d: send_buffer gave %d, want BUSY\n", rank, ret);
		goto out;
	}
	/* both results are still intact */
	for (i = 0; i < 2; i++)
		if (check_recv(p, rank, size, all[i], &rv[i]))
			goto out;
	out = malloc(((size_t)p->max_tokens + 1) * (size_t)p->hidden * 4);
	for (i = 0; i < 2; i++) {
		y[i] = experts(p, &rv[i]);
		ret = fabep_moe_combine(moe, y[i], (size_t)p->hidden, 0, out,
					(size_t)p->hidden, NULL, NULL);
		if (ret) {
			fprintf(stderr, "rank %d: outstanding combine %d: %s\n", rank,
				i, fabep_strerror(ret));
			goto out;
		}
		if (check_out(p, rank, size, &all[i][rank], out, 1))
			goto out;
	}
	rc = 0;
out:
	for (i = 0; i < 2; i++) {
		free(y[i]);
		for (s = 0; s < size; s++)
			free_input(&all[i][s]);
	}
	free(out);
	return rc;
}

/* fabep_moe_combine, whose own run sums into out the tokens whose rows
 * have all come, against the halves, which sum after the wait: the same
 * tokens, routing and expert rows must give the same bits (and the
 * reference's values).  Rank 0 starts its combine late_ms late, so
 * that the peers' rows come during its own run.  Returns the tokens this
 * rank's own run summed into out (>= 0), or -1 (logged). */
static long fused_round(const struct params *p, fabep_moe_t *moe, int rank,
			int size, int round, unsigned late_ms)
{
	struct input *all = calloc((size_t)size, sizeof(*all));
	size_t H = (size_t)p->hidden, elt = p->ct == FABEP_MOE_FP32 ? 4 : 2;
	size_t ld_y = H + (size_t)p->ld_pad;  /* as experts() lays y out */
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	void *y = NULL, *y2 = NULL, *out = NULL, *out2 = NULL;
	struct rows_seen rs;
	long fused = -1;
	struct input *me;
	int s, ret;

	memset(&rs, 0, sizeof(rs));
	for (s = 0; s < size; s++)
		gen(p, size, s, round, &all[s]);
	me = &all[rank];
	ret = fabep_moe_dispatch(moe, me->x, me->xs, me->n, me->ids,
				 p->noweights ? NULL : me->w, &rv);
	if (ret || check_recv(p, rank, size, all, &rv)) {
		fprintf(stderr, "rank %d round %d: dispatch: %s\n", rank, round,
			fabep_strerror(ret));
		goto out;
	}
	if (p->crows)
		rows_taken += moe->set[moe->dlast].nx;
	count_placed(moe);
	y = experts(p, &rv);
	out = calloc(me->n + 1, H * elt);
	out2 = calloc(me->n + 1, H * elt);
	rows_init(&rs, p, me->n, out);
	if (!rank)
		usleep(late_ms * 1000u);
	ret = fabep_moe_combine(moe, y, ld_y, 0, out, H, count_row, &rs);
	if (ret) {
		fprintf(stderr, "rank %d round %d: combine: %s\n", rank, round,
			fabep_strerror(ret));
		goto out;
	}
	if (rows_check(&rs, rank, round) || check_out(p, rank, size, me, out, 1))
		goto out;
	fused = (long)moe->tm.c_fused;
	/* the same call again (previous routing), combined by the halves */
	ret = fabep_moe_dispatch(moe, me->x, me->xs, me->n, NULL, NULL, &rv);
	if (!ret) {
		y2 = experts(p, &rv);
		ret = fabep_moe_combine_send(moe, y2, ld_y, 0);
	}
	if (!ret)
		ret = fabep_moe_combine_recv(moe, out2, H, NULL, NULL);
	if (ret || moe->tm.c_fused) {
		fprintf(stderr, "rank %d round %d: the halves: %s, %llu tokens "
			"fused\n", rank, round, fabep_strerror(ret),
			(unsigned long long)moe->tm.c_fused);
		fused = -1;
	} else if (memcmp(out, out2, me->n * H * elt)) {
		fprintf(stderr, "rank %d round %d: fabep_moe_combine (%ld tokens "
			"fused) and the halves differ\n", rank, round, fused);
		fused = -1;
	}
out:
	for (s = 0; s < size; s++)
		free_input(&all[s]);
	free(all);
	free(y);
	free(y2);
	free(out);
	free(out2);
	free(rs.seen);
	free(rs.snap);
	return fused;
}

static int ep_rank(int rank, int size, void *arg)
{
	const struct params *p = arg;
	fabep_comm_t *comm = NULL;
	fabep_moe_t *moe = NULL;
	fabep_moe_config_t cfg;
	int round, ret, rc = 1;
	long fused = 0, f = 0;
	/* rank 0's lateness in the fused rounds: doubled after a round whose
	 * own run summed nothing, for the peers' combines can take longer
	 * than it (sanitizers, more ranks than CPUs) */
	unsigned late_ms = 20;

	ret = make(p, rank, size, &comm, &moe, &cfg);
	if (ret == 2) {
		rc = 0;
		goto done;
	}
	if (ret)
		return ret == 77 ? 77 : 1;
	for (round = 1; p->fused && round <= p->rounds; round++) {
		if (round > 1 && !f && late_ms < 1280)
			late_ms *= 2;
		if ((f = fused_round(p, moe, rank, size, round, late_ms)) < 0)
			goto done;
		fused += f;
	}
	if (p->fused && !rank && !fused) {
		fprintf(stderr, "rank 0: its own run summed no token into out in "
			"%d rounds, the last one started %u ms late\n", p->rounds,
			late_ms);
		goto done;
	}
	for (round = 1; !p->fused && round <= p->rounds; round++) {
		if (p->bad && round == 2)
			ret = bad_round(p, moe, rank, size, round);
		else if (p->refuse && round == 2)
			ret = refuse_round(p, moe, rank, size, round);
		else if (p->outstanding && round % 3 == 0)
			ret = outstanding_rounds(p, moe, rank, size, round);
		else
			ret = round_trip(p, moe, rank, size, round,
					 p->backward && round % 2 == 0);
		if (ret)
			goto done;
	}
	/* the kind of combine the case is about */
	if (p->crows && size > 1 && (!strcmp(p->crows, "fit") ? !rows_taken :
				     rows_taken > 0)) {
		fprintf(stderr, "rank %d: FABEP_MOE_COMBINE_ROWS=%s, and %ld "
			"combines took rows\n", rank, p->crows, rows_taken);
		goto done;
	}
	/* and the kind of dispatch */
	if (p->place_expect && size > 1 &&
	    (p->place_expect > 0 ? !placed_seen : placed_seen > 0)) {
		fprintf(stderr, "rank %d: FABEP_MOE_PLACE=%s, and %ld sources "
			"placed their rows here\n", rank, p->place ? p->place : "",
			placed_seen);
		goto done;
	}
	/* and the way its copies went */
	if (p->lanes && size > 1 && (p->lanes > 0 ? !moe->nlanes : moe->nlanes > 0)) {
		fprintf(stderr, "rank %d: FABEP_MOE_LANES=%s, and %llu batches of "
			"copies were made in lanes (%d threads, %d channels)\n", rank,
			p->lanes_env ? p->lanes_env : "", (unsigned long long)moe->nlanes,
			fabep_comm_threads(comm), fabep_comm_channels(comm));
		goto done;
	}
	if (p->slices && size > 1 && (!comm->fab->cma_slices ||
				      !comm->fab->cma_sliced)) {
		fprintf(stderr, "rank %d: cma_slices %d, %llu puts sliced (%d "
			"threads, %d channels)\n", rank, comm->fab->cma_slices,
			(unsigned long long)comm->fab->cma_sliced,
			fabep_comm_threads(comm), fabep_comm_channels(comm));
		goto done;
	}
	rc = 0;
done:
	fabep_moe_destroy(moe);
	ret = fabep_comm_destroy(comm);
	return rc ? rc : ret ? 1 : 0;
}

static void run(const char *prov, int size, struct params *p)
{
	int status[8], r;

	fep_test_on_provider(prov);
	if (p->refuse && !refuse_mark) {
		void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

		ck_assert_msg(m != MAP_FAILED, "mmap: %s", strerror(errno));
		refuse_mark = m;
	}
	if (refuse_mark)
		*refuse_mark = 0;
	fep_test_run_ranks_status(size, 120, ep_rank, p, status);
	if (!strcmp(prov, "sockets") && status[0] == 77)
		fep_test_skip("sockets: fabep_comm_create timed out (known "
			      "intermittent warm-up failure)");
	if (p->signal && status[0] == 77)
		fep_test_skip("%s does not offer signal strategy %s here", prov,
			      fabep_signal_name(p->signal));
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == 0, "%s, %d ranks: rank %d exited %d: %s",
			      prov, size, r, status[r], fep_test_rank_said(r));
}

/* defaults first, a test's own values override them */
#pragma GCC diagnostic ignored "-Woverride-init"
#define P(...) ((struct params){ .rounds = 1, .hidden = 100, .topk = 2,     \
	.experts = 8, .max_tokens = 16, .tt = FABEP_MOE_BF16,                  \
	.it = FABEP_MOE_BF16, .ct = FABEP_MOE_BF16, __VA_ARGS__ })

#define EP_TEST(name, prov, n, ...)                          \
	START_TEST(name) { struct params p_ = P(__VA_ARGS__); run(prov, n, &p_); } END_TEST

/* shapes and formats */
EP_TEST(one_rank, "shm", 1, .rounds = 20, .topk = 3, .experts = 5)
EP_TEST(shm2_bf16_many, "shm", 2, .rounds = 300, .hidden = 33, .topk = 4, .experts = 8)
EP_TEST(shm3_fp32_neg, "shm", 3, .rounds = 100, .tt = FABEP_MOE_FP32,
	.ct = FABEP_MOE_FP32, .routing = R_NEG, .topk = 5, .experts = 9)
EP_TEST(shm4_one_expert, "shm", 4, .rounds = 30, .routing = R_ONE, .topk = 3)
EP_TEST(shm4_zero, "shm", 4, .rounds = 50, .routing = R_ZERO, .topk = 8, .experts = 16)
/* ranks with no tokens pass NULL for everything (no previous routing) */
EP_TEST(shm3_zero_null, "shm", 3, .rounds = 6, .routing = R_ZERO, .topk = 3,
	.experts = 6, .empty_null = 1, .split = 1, .backward = 1)
EP_TEST(shm8_random, "shm", 8, .rounds = 20, .topk = 8, .experts = 32, .hidden = 1)
EP_TEST(shm2_top1_h1, "shm", 2, .rounds = 100, .topk = 1, .hidden = 1, .experts = 2)
EP_TEST(shm2_fp8_tok, "shm", 2, .rounds = 60, .tt = FABEP_MOE_FP8,
	.it = FABEP_MOE_FP32, .ct = FABEP_MOE_FP32, .routing = R_NEG)
EP_TEST(shm3_fp8_block, "shm", 3, .rounds = 30, .tt = FABEP_MOE_FP8,
	.block = 128, .hidden = 300, .topk = 4, .experts = 12)
EP_TEST(shm2_fp8_pre, "shm", 2, .rounds = 40, .tt = FABEP_MOE_FP8_PREQUANT,
	.block = 16, .hidden = 100, .ct = FABEP_MOE_FP32)
EP_TEST(shm2_big_2880, "shm", 2, .rounds = 4, .hidden = 2880, .topk = 4,
	.experts = 32, .max_tokens = 32, .threads = 2)
EP_TEST(shm2_big_7168, "shm", 2, .rounds = 3, .hidden = 7168, .topk = 8,
	.experts = 16, .max_tokens = 24, .threads = 2, .tt = FABEP_MOE_FP8,
	.block = 128)
EP_TEST(shm3_split_backward, "shm", 3, .rounds = 40, .experts = 6, .split = 1, .backward = 1,
	.routing = R_NEG)
EP_TEST(shm2_outstanding, "shm", 2, .rounds = 30, .outstanding = 1)
/* pipelined runs: many chunks per run, later ones empty (FABEP_MOE_CHUNK) */
EP_TEST(shm3_chunks, "shm", 3, .rounds = 60, .hidden = 300, .topk = 4,
	.experts = 12, .max_tokens = 40, .routing = R_NEG, .chunk = "1", .threads = 2)
EP_TEST(shm4_chunks_fp8, "shm", 4, .rounds = 30, .tt = FABEP_MOE_FP8, .block = 128,
	.hidden = 1000, .topk = 6, .experts = 16, .max_tokens = 33, .chunk = "5000",
	.split = 1, .backward = 1)
EP_TEST(shm2_chunks_zero, "shm", 2, .rounds = 40, .routing = R_ZERO, .topk = 2,
	.max_tokens = 50, .chunk = "700", .zcopy = 1, .outstanding = 1)
/* runs gathered from the input slot and staged side by side: about 135
 * records to each peer in about 74 ranges, past what one chunk of
 * FEP_EP_GATHER_WRITES writes of 4 pieces gathers (shm) in some rounds
 * and not in others; chunked, every chunk gathers (cma: one thread) */
EP_TEST(shm4_gather_stage, "shm", 4, .rounds = 20, .hidden = 8, .topk = 2,
	.experts = 16, .max_tokens = 300, .split = 1,
	.gather_writes = FEP_EP_GATHER_WRITES)
EP_TEST(shm4_gather_chunks, "shm", 4, .rounds = 20, .hidden = 8, .topk = 2,
	.experts = 16, .max_tokens = 300, .chunk = "2000", .backward = 1,
	.gather_writes = FEP_EP_GATHER_WRITES)
/* under cma a run takes up to this rank's share of the target's queue
 * (fep_fab_queue_share): runs of up to about 800 records in up to about
 * 400 ranges, each gathered, none staged */
EP_TEST(shm3_gather_many, "shm", 3, .rounds = 8, .hidden = 8, .topk = 2,
	.experts = 12, .max_tokens = 2000, .signal = FABEP_SIGNAL_CMA,
	.gathered = 1, .backward = 1)
/* tokens put in the send buffer (no copy in dispatch) */
EP_TEST(sb_shm3_bf16, "shm", 3, .rounds = 60, .topk = 4, .experts = 12,
	.routing = R_NEG, .sendbuf = 1, .chunk = "3000", .split = 1, .backward = 1)
EP_TEST(sb_shm2_fp32_zc, "shm", 2, .rounds = 40, .tt = FABEP_MOE_FP32,
	.ct = FABEP_MOE_FP32, .sendbuf = 1, .zcopy = 1, .outstanding = 1)
EP_TEST(sb_shm4_pre, "shm", 4, .rounds = 30, .tt = FABEP_MOE_FP8_PREQUANT,
	.block = 16, .ct = FABEP_MOE_FP32, .topk = 3, .sendbuf = 1, .outstanding = 1)
EP_TEST(sb_shm2_fp8, "shm", 2, .rounds = 10, .tt = FABEP_MOE_FP8, .block = 128,
	.hidden = 256, .sendbuf = 1)
/* headers posted before packing (runs of 64 KiB and more), copy and
 * zero-copy, with ranks holding no tokens and -1 ids */
EP_TEST(shm3_early_copy, "shm", 3, .rounds = 6, .hidden = 4096, .topk = 4,
	.experts = 12, .max_tokens = 40, .routing = R_NEG, .threads = 2)
EP_TEST(zc_shm4_early, "shm", 4, .rounds = 4, .hidden = 2048, .topk = 8,
	.experts = 16, .max_tokens = 64, .zcopy = 1, .tt = FABEP_MOE_FP32,
	.ct = FABEP_MOE_FP32)
EP_TEST(sb_shm2_big, "shm", 2, .rounds = 3, .hidden = 7168, .topk = 8,
	.experts = 16, .max_tokens = 24, .threads = 2, .sendbuf = 1)
EP_TEST(tcp3_chunks, "tcp", 3, .rounds = 10, .experts = 9, .routing = R_NEG,
	.topk = 4, .hidden = 128, .max_tokens = 30, .chunk = "1000")
/* channels: runs of 128 KiB and more split over several endpoints,
 * progressed by the pool's threads (threads 2) or the caller alone */
EP_TEST(chan_shm2_big, "shm", 2, .rounds = 4, .hidden = 7168, .topk = 8,
	.experts = 16, .max_tokens = 48, .threads = 2, .channels = "4",
	.split = 1, .backward = 1)
EP_TEST(chan_shm3_fp8_zc, "shm", 3, .rounds = 4, .hidden = 4096, .topk = 6,
	.experts = 12, .max_tokens = 40, .threads = 1, .channels = "3",
	.tt = FABEP_MOE_FP8, .block = 128, .zcopy = 1, .outstanding = 1)
EP_TEST(chan_tcp2_chunks, "tcp", 2, .rounds = 4, .hidden = 4096, .topk = 4,
	.experts = 8, .max_tokens = 32, .threads = 2, .channels = "2",
	.chunk = "200000", .routing = R_NEG)
/* auto strategy with two channels asked for: cqdata, dispatch with the
 * sender's copies (plain writes, reaped, then zero-byte writes with CQ
 * data), combine with the receivers' */
EP_TEST(sender_copy_shm3, "shm", 3, .rounds = 6, .hidden = 4096, .topk = 8,
	.experts = 12, .max_tokens = 40, .threads = 2, .channels = "2",
	.sender_copy = 1, .routing = R_NEG, .split = 1)
/* cma over channels (every rank's puts on its own channel): dispatch's
 * sender copies, combine's receiver copies, small runs as one write with
 * CQ data; the caller alone progressing them, or the pool's threads */
EP_TEST(cma_chan_shm4, "shm", 4, .rounds = 6, .hidden = 4096, .topk = 8,
	.experts = 16, .max_tokens = 48, .threads = 1, .channels = "4",
	.signal = FABEP_SIGNAL_CMA, .routing = R_NEG, .split = 1, .backward = 1)
EP_TEST(cma_chan_shm3_fused, "shm", 3, .rounds = 6, .hidden = 2880, .topk = 8,
	.experts = 12, .max_tokens = 40, .threads = 2, .channels = "3",
	.signal = FABEP_SIGNAL_CMA, .fused = 1, .outstanding = 1)
/* cma with a channel per thread: the sender's copies of one batch made
 * on every thread, a lane (channel) each, the signals after them on the
 * rank's own channel; records by the halves and backward, and placed
 * rows with combine's rows */
EP_TEST(lanes_shm4, "shm", 4, .rounds = 6, .hidden = 7168, .topk = 8,
	.experts = 16, .max_tokens = 48, .threads = 2, .channels = "2",
	.signal = FABEP_SIGNAL_CMA, .routing = R_NEG, .split = 1, .backward = 1,
	.lanes = 1)
EP_TEST(lanes_shm3_place_rows, "shm", 3, .rounds = 6, .hidden = 7168,
	.topk = 4, .experts = 12, .max_tokens = 48, .threads = 3,
	.channels = "3", .signal = FABEP_SIGNAL_CMA, .place = "always",
	.place_expect = 1, .crows = "fit", .lanes = 1)
/* cma with a channel per thread and more channels than a target's
 * senders (4 ranks of 4 threads): combine's large runs of partial rows
 * go in slices over every channel, which the receivers' threads copy;
 * dispatch keeps the sender's copies (lanes) */
EP_TEST(cma_slices_shm4, "shm", 4, .rounds = 6, .hidden = 7168, .topk = 8,
	.experts = 16, .max_tokens = 48, .threads = 4, .channels = "4",
	.signal = FABEP_SIGNAL_CMA, .routing = R_NEG, .split = 1, .backward = 1,
	.crows = "never", .lanes = 1, .slices = 1)
/* FABEP_MOE_LANES: always for batches of a few KiB, never for the
 * large ones */
EP_TEST(lanes_always_shm4_small, "shm", 4, .rounds = 8, .hidden = 200,
	.topk = 3, .experts = 16, .max_tokens = 16, .threads = 2,
	.channels = "2", .signal = FABEP_SIGNAL_CMA, .routing = R_NEG,
	.split = 1, .crows = "fit", .lanes_env = "always", .lanes = 1)
EP_TEST(lanes_never_shm4, "shm", 4, .rounds = 3, .hidden = 7168, .topk = 8,
	.experts = 16, .max_tokens = 48, .threads = 2, .channels = "2",
	.signal = FABEP_SIGNAL_CMA, .lanes_env = "never", .lanes = -1)
/* combine's final sum in the own run (rank 0 late): the same bits as
 * the halves, on threads with channels, with one channel, on tcp */
EP_TEST(fused_shm2, "shm", 2, .rounds = 8, .hidden = 2880, .topk = 8,
	.experts = 16, .max_tokens = 48, .threads = 2, .fused = 1)
EP_TEST(fused_shm3_fp32, "shm", 3, .rounds = 8, .hidden = 300, .topk = 4,
	.experts = 12, .max_tokens = 40, .threads = 2, .channels = "1",
	.tt = FABEP_MOE_FP32, .ct = FABEP_MOE_FP32, .routing = R_NEG, .fused = 1)
EP_TEST(fused_tcp2, "tcp", 2, .rounds = 6, .hidden = 1024, .topk = 4,
	.experts = 8, .max_tokens = 32, .threads = 2, .fused = 1)
/* combine runs as rows (FABEP_MOE_COMBINE_ROWS=fit: wherever they fit),
 * weighted and not (backward), by the halves, fused, chunked, with y's
 * rows apart (one write a row), over channels, on tcp (written from y,
 * reaped before the send half returns); and never */
EP_TEST(rows_shm3_split, "shm", 3, .rounds = 40, .topk = 4, .experts = 12,
	.routing = R_NEG, .split = 1, .backward = 1, .crows = "fit")
EP_TEST(rows_shm4_ld, "shm", 4, .rounds = 20, .topk = 8, .experts = 16,
	.hidden = 300, .max_tokens = 40, .ld_pad = 5, .backward = 1,
	.crows = "fit")
EP_TEST(rows_shm4_ld_fused, "shm", 4, .rounds = 10, .topk = 8, .experts = 16,
	.hidden = 300, .max_tokens = 40, .ld_pad = 5, .threads = 2, .fused = 1,
	.crows = "fit")
EP_TEST(rows_shm3_fused, "shm", 3, .rounds = 8, .hidden = 2880, .topk = 4,
	.experts = 12, .max_tokens = 40, .threads = 2, .fused = 1,
	.crows = "fit")
EP_TEST(rows_shm3_chunks_fp8, "shm", 3, .rounds = 20, .tt = FABEP_MOE_FP8,
	.block = 128, .hidden = 300, .topk = 4, .experts = 12, .max_tokens = 40,
	.chunk = "1000", .ct = FABEP_MOE_FP32, .crows = "fit")
EP_TEST(rows_cma_chan_shm4_zc, "shm", 4, .rounds = 6, .hidden = 4096,
	.topk = 3, .experts = 16, .max_tokens = 48, .threads = 1,
	.channels = "4", .signal = FABEP_SIGNAL_CMA, .zcopy = 1, .split = 1,
	.outstanding = 1, .crows = "fit")
EP_TEST(rows_tcp3, "tcp", 3, .rounds = 10, .topk = 4, .experts = 12,
	.hidden = 128, .max_tokens = 30, .routing = R_NEG, .split = 1,
	.backward = 1, .crows = "fit")
EP_TEST(rows_never_shm3, "shm", 3, .rounds = 10, .topk = 2, .experts = 24,
	.crows = "never")
/* auto: no rows for a dispatch of one token (its partial row is one
 * write with its signal) */
EP_TEST(rows_auto_shm3_one_token, "shm", 3, .rounds = 16, .topk = 2,
	.experts = 12, .max_tokens = 1, .crows = "auto")
/* As if the provider needed registered local buffers (FI_MR_LOCAL, as
 * verbs and efa do): nothing may be written from the caller's memory, so
 * combine's rows go through the stage and nothing reads y in the post;
 * every write from outside the heap fails (-EFAULT) */
EP_TEST(mrl_rows_shm3_split, "shm", 3, .rounds = 20, .topk = 4, .experts = 12,
	.routing = R_NEG, .split = 1, .backward = 1, .crows = "fit",
	.mr_local = 1)
EP_TEST(mrl_rows_tcp3, "tcp", 3, .rounds = 8, .topk = 4, .experts = 12,
	.hidden = 128, .max_tokens = 30, .routing = R_NEG, .split = 1,
	.backward = 1, .crows = "fit", .mr_local = 1)
EP_TEST(mrl_rows_shm4_ld_fused, "shm", 4, .rounds = 10, .topk = 8,
	.experts = 16, .hidden = 300, .max_tokens = 40, .ld_pad = 5,
	.threads = 2, .fused = 1, .crows = "fit", .mr_local = 1)
EP_TEST(mrl_lanes_shm3_place_rows, "shm", 3, .rounds = 4, .hidden = 7168,
	.topk = 4, .experts = 12, .max_tokens = 48, .threads = 3,
	.channels = "3", .signal = FABEP_SIGNAL_CMA, .place = "always",
	.place_expect = 1, .crows = "fit", .lanes = 1, .mr_local = 1)
EP_TEST(mrl_sb_shm3_fp8_zc, "shm", 3, .rounds = 20, .tt = FABEP_MOE_FP8,
	.block = 128, .hidden = 300, .topk = 4, .experts = 12, .sendbuf = 1,
	.zcopy = 1, .mr_local = 1)
EP_TEST(mrl_place_tcp3_delivery, "tcp", 3, .rounds = 6, .topk = 4,
	.experts = 12, .max_tokens = 16, .signal = FABEP_SIGNAL_DELIVERY,
	.place = "always", .place_expect = 1, .mr_local = 1)
/* 4 bytes of remote CQ data (verbs, efa) and the handle's block past the
 * 128 MiB they name: its counters, in a slot near the heap's start, are
 * still named, with every strategy that signals through CQ data */
/* Each rank's heap under its own key (verbs' and efa's provider keys
 * differ between ranks): tcp drops a write whose key is not its
 * target's, sockets refuses it; channels, placed rows and the halves
 * over tcp */
EP_TEST(keys_tcp3, "tcp", 3, .rounds = 8, .topk = 4, .experts = 12,
	.hidden = 128, .max_tokens = 30, .routing = R_NEG, .split = 1,
	.backward = 1, .crows = "fit", .keys = 1)
EP_TEST(keys_tcp3_chan, "tcp", 3, .rounds = 6, .topk = 4, .experts = 12,
	.max_tokens = 16, .threads = 2, .channels = "2", .keys = 1)
EP_TEST(keys_tcp3_place_delivery, "tcp", 3, .rounds = 6, .topk = 4,
	.experts = 12, .max_tokens = 16, .signal = FABEP_SIGNAL_DELIVERY,
	.place = "always", .place_expect = 1, .keys = 1)
EP_TEST(keys_tcp2_delivery, "tcp", 2, .rounds = 6, .topk = 2,
	.experts = 8, .signal = FABEP_SIGNAL_DELIVERY, .split = 1, .keys = 1)
EP_TEST(keys_sockets2, "sockets", 2, .rounds = 4, .topk = 2, .experts = 8,
	.keys = 1)
/* Messages of at most 4 KiB (a provider's max_msg_size): every put of
 * rows goes as several writes, a signalled one's head before its tail,
 * under each strategy; rows of 7168 bf16 are 14 KiB. */
EP_TEST(msg4k_shm3_cqdata, "shm", 3, .rounds = 6, .hidden = 7168,
	.topk = 4, .experts = 12, .max_tokens = 24, .split = 1,
	.signal = FABEP_SIGNAL_CQDATA, .msg_max = 4096)
EP_TEST(msg4k_shm3_cma_place, "shm", 3, .rounds = 6, .hidden = 7168,
	.topk = 4, .experts = 12, .max_tokens = 24, .threads = 2,
	.signal = FABEP_SIGNAL_CMA, .place = "always", .place_expect = 1,
	.crows = "fit", .msg_max = 4096)
EP_TEST(msg4k_tcp3, "tcp", 3, .rounds = 4, .hidden = 7168, .topk = 4,
	.experts = 12, .max_tokens = 16, .routing = R_NEG, .backward = 1,
	.msg_max = 4096)
EP_TEST(msg4k_tcp2_delivery_fp8, "tcp", 2, .rounds = 6, .hidden = 7168,
	.topk = 2, .experts = 8, .max_tokens = 16, .tt = FABEP_MOE_FP8,
	.block = 128, .signal = FABEP_SIGNAL_DELIVERY, .msg_max = 4096)
EP_TEST(msg4k_shm2_delivery_fp8, "shm", 2, .rounds = 6, .hidden = 7168,
	.topk = 2, .experts = 8, .max_tokens = 16, .tt = FABEP_MOE_FP8,
	.block = 128, .signal = FABEP_SIGNAL_DELIVERY, .msg_max = 4096)
EP_TEST(cq4_tcp3, "tcp", 3, .rounds = 10, .topk = 4, .experts = 12,
	.routing = R_NEG, .split = 1, .backward = 1, .cq4 = 1)
EP_TEST(cq4_shm3_cqdata, "shm", 3, .rounds = 10, .topk = 4, .experts = 12,
	.signal = FABEP_SIGNAL_CQDATA, .chunk = "1000", .cq4 = 1)
EP_TEST(cq4_shm4_cma, "shm", 4, .rounds = 10, .topk = 8, .experts = 16,
	.hidden = 300, .max_tokens = 40, .threads = 2, .channels = "2",
	.signal = FABEP_SIGNAL_CMA, .crows = "fit", .cq4 = 1)
/* Writes of one or two local pieces (a provider's iov_limit below shm's
 * and tcp's 4): under remote CQ data a small call's runs no longer join
 * their headers (1) or just do (2), and where the signals follow the
 * writes no run is gathered from the input slot (1); a write of more
 * pieces is refused (-EINVAL), so a path that ignores the limit fails */
EP_TEST(iov1_tcp3, "tcp", 3, .rounds = 10, .topk = 4, .experts = 12,
	.hidden = 128, .max_tokens = 30, .routing = R_NEG, .split = 1,
	.backward = 1, .crows = "fit", .iov = 1)
EP_TEST(iov2_tcp3_chunks, "tcp", 3, .rounds = 10, .experts = 9,
	.routing = R_NEG, .topk = 4, .hidden = 128, .max_tokens = 30,
	.chunk = "1000", .iov = 2)
EP_TEST(iov1_shm4_cma_place, "shm", 4, .rounds = 10, .topk = 4,
	.experts = 8, .max_tokens = 32, .threads = 2, .channels = "2",
	.signal = FABEP_SIGNAL_CMA, .place = "always", .place_expect = 1,
	.crows = "fit", .iov = 1)
EP_TEST(iov1_shm3_delivery_gather, "shm", 3, .rounds = 8, .hidden = 8,
	.topk = 2, .experts = 12, .max_tokens = 300, .split = 1,
	.signal = FABEP_SIGNAL_DELIVERY, .backward = 1, .iov = 1)
/* zero-copy receive: the same reference, rows read in place */
EP_TEST(zc_one_rank, "shm", 1, .rounds = 10, .topk = 3, .experts = 5, .zcopy = 1)
EP_TEST(zc_shm2_bf16, "shm", 2, .rounds = 100, .hidden = 33, .topk = 4,
	.experts = 8, .zcopy = 1)
EP_TEST(zc_shm3_fp32_neg_split, "shm", 3, .rounds = 40, .tt = FABEP_MOE_FP32,
	.ct = FABEP_MOE_FP32, .routing = R_NEG, .topk = 5, .experts = 9,
	.split = 1, .backward = 1, .zcopy = 1)
EP_TEST(zc_shm4_fp8_block, "shm", 4, .rounds = 20, .tt = FABEP_MOE_FP8,
	.block = 128, .hidden = 300, .topk = 4, .experts = 12, .zcopy = 1)
EP_TEST(zc_shm2_fp8_pre, "shm", 2, .rounds = 20, .tt = FABEP_MOE_FP8_PREQUANT,
	.block = 16, .ct = FABEP_MOE_FP32, .zcopy = 1)
EP_TEST(zc_shm2_big_7168, "shm", 2, .rounds = 2, .hidden = 7168, .topk = 8,
	.experts = 16, .max_tokens = 24, .threads = 2, .tt = FABEP_MOE_FP8,
	.block = 128, .zcopy = 1)
EP_TEST(zc_shm2_fp8_tok, "shm", 2, .rounds = 20, .tt = FABEP_MOE_FP8,
	.it = FABEP_MOE_FP32, .ct = FABEP_MOE_FP32, .routing = R_NEG, .zcopy = 1)
EP_TEST(zc_shm2_outstanding, "shm", 2, .rounds = 12, .outstanding = 1, .zcopy = 1)
EP_TEST(zc_tcp2_fp8, "tcp", 2, .rounds = 10, .tt = FABEP_MOE_FP8, .block = 128,
	.hidden = 256, .split = 1, .zcopy = 1)
/* combine's sums in fp32, rounded once per stage: terms that cancel
 * exactly leave a small one, which must come back exact (R_CANCEL) */
EP_TEST(cancel_shm3, "shm", 3, .rounds = 6, .hidden = 64, .topk = 3,
	.experts = 24, .routing = R_CANCEL)
EP_TEST(cancel_shm4_fp32_tok, "shm", 4, .rounds = 4, .hidden = 48, .topk = 3,
	.experts = 32, .routing = R_CANCEL, .tt = FABEP_MOE_FP32, .split = 1,
	.zcopy = 1, .chunk = "1000")
/* topk_weights NULL (all 1) with top-k > 1; backward rounds send new rows */
EP_TEST(shm3_noweights, "shm", 3, .rounds = 12, .topk = 4, .experts = 12,
	.routing = R_NEG, .noweights = 1, .split = 1, .backward = 1)
EP_TEST(shm2_noweights_top5, "shm", 2, .rounds = 9, .topk = 5, .noweights = 1,
	.outstanding = 1)
/* 5, 6 and 7 ranks, top-k 7 */
EP_TEST(shm5_top7, "shm", 5, .rounds = 4, .hidden = 40, .topk = 7,
	.experts = 10, .routing = R_NEG, .split = 1, .backward = 1)
EP_TEST(shm6_top7_fp8, "shm", 6, .rounds = 3, .hidden = 200, .topk = 7,
	.experts = 12, .max_tokens = 12, .tt = FABEP_MOE_FP8, .block = 128)
EP_TEST(shm7_top7_fp32, "shm", 7, .rounds = 3, .hidden = 24, .topk = 7,
	.experts = 21, .tt = FABEP_MOE_FP32, .ct = FABEP_MOE_FP32, .zcopy = 1)
/* an expert named twice by a token: one row per (token, k), each with
 * its weight, and combine sums both */
EP_TEST(shm3_dup, "shm", 3, .rounds = 6, .topk = 4, .experts = 6,
	.routing = R_DUP, .split = 1)
EP_TEST(zc_shm2_dup_fp8, "shm", 2, .rounds = 6, .topk = 5, .experts = 6,
	.routing = R_DUP, .zcopy = 1, .tt = FABEP_MOE_FP8, .ct = FABEP_MOE_FP32)
/* caller-quantized FP8 with one scale per token and per 128 values; bf16
 * tokens with an fp32 combine and fp32 tokens with a bf16 one */
EP_TEST(pre_shm2_token, "shm", 2, .rounds = 8, .tt = FABEP_MOE_FP8_PREQUANT,
	.block = 0, .topk = 3, .split = 1, .backward = 1, .zcopy = 1)
EP_TEST(pre_shm3_b128, "shm", 3, .rounds = 6, .tt = FABEP_MOE_FP8_PREQUANT,
	.block = 128, .hidden = 300, .topk = 4, .experts = 12,
	.ct = FABEP_MOE_FP32, .routing = R_NEG, .split = 1, .backward = 1)
EP_TEST(shm2_bf16_fp32, "shm", 2, .rounds = 8, .ct = FABEP_MOE_FP32,
	.topk = 4, .routing = R_NEG, .outstanding = 1)
EP_TEST(shm3_fp32_bf16, "shm", 3, .rounds = 8, .tt = FABEP_MOE_FP32,
	.topk = 5, .experts = 9, .split = 1, .backward = 1)
/* errors */
EP_TEST(bad_range, "shm", 3, .rounds = 3, .experts = 12, .bad = B_RANGE, .bad_rank = 1)
EP_TEST(bad_too_many, "shm", 4, .rounds = 3, .bad = B_TOO_MANY, .bad_rank = 3)
EP_TEST(bad_null, "shm", 2, .rounds = 3, .bad = B_NULL_X, .bad_rank = 0)
EP_TEST(mismatch, "shm", 3, .mismatch = 1, .experts = 3)
EP_TEST(mismatch_chunk, "shm", 3, .mismatch = 2, .experts = 3, .chunk = "4096")
EP_TEST(mismatch_place, "shm", 3, .mismatch = 3, .experts = 3)
EP_TEST(heap_full, "shm", 2, .heap_small = 1, .max_tokens = 4096, .hidden = 7168)
/* other providers */
EP_TEST(tcp3_random, "tcp", 3, .rounds = 30, .experts = 9, .routing = R_NEG, .topk = 4)
EP_TEST(tcp2_fp8, "tcp", 2, .rounds = 10, .tt = FABEP_MOE_FP8, .block = 128,
	.hidden = 256, .split = 1)
EP_TEST(tcp2_bad, "tcp", 2, .rounds = 3, .bad = B_RANGE, .bad_rank = 1)
/* refused send halves: the refusing rank owes nothing, all go on */
EP_TEST(refuse_shm3, "shm", 3, .rounds = 4, .experts = 12, .topk = 3,
	.refuse = 1, .bad_rank = 1)
EP_TEST(refuse_shm2_one_set, "shm", 2, .rounds = 4, .refuse = 1, .bad_rank = 0,
	.sets = 1, .zcopy = 1)
EP_TEST(refuse_tcp3_chunks, "tcp", 3, .rounds = 3, .experts = 9, .topk = 4,
	.refuse = 1, .bad_rank = 2, .chunk = "1000", .routing = R_NEG)
EP_TEST(sockets2_small, "sockets", 2, .rounds = 5, .hidden = 16)

/* placed dispatch (FABEP_MOE_PLACE=always: every send with tokens):
 * sources write their rows into the receivers' expert-major results;
 * ranks without tokens this round send records, so calls mix both */
EP_TEST(place_shm3_split, "shm", 3, .rounds = 40, .topk = 4, .experts = 12,
	.max_tokens = 24, .split = 1, .backward = 1, .place = "always",
	.place_expect = 1)
/* top-2 of 12 experts on 3 ranks, about 1.16 rows a record: every row
 * placed (the sender writes a token's row once per expert of the
 * receiver); top-4 above, about 1.7: each token's row once, copied by
 * the receiver to its further experts there */
EP_TEST(place_shm3_rows, "shm", 3, .rounds = 8, .routing = R_FULL, .topk = 2,
	.experts = 12, .hidden = 256, .max_tokens = 24, .place = "always",
	.place_expect = 1)
/* each token names each of its experts twice: placed once, at its
 * first slot of the receiver, and copied to its other three there */
EP_TEST(place_shm3_dup, "shm", 3, .rounds = 8, .routing = R_DUP, .topk = 4,
	.experts = 12, .hidden = 256, .max_tokens = 24, .place = "always",
	.place_expect = 1)
/* FP8 rows placed, their scales with the records' metadata: blocks
 * of 128 over 300 values (a short last block), each token's row once
 * (top-4 of 12 on 3 ranks) with the halves and the backward pass; the
 * caller's scales, blocks of 16, every row placed (top-2 of 12); one
 * scale a token */
EP_TEST(place_shm3_fp8_block, "shm", 3, .rounds = 20, .tt = FABEP_MOE_FP8,
	.block = 128, .hidden = 300, .topk = 4, .experts = 12, .max_tokens = 24,
	.split = 1, .backward = 1, .place = "always", .place_expect = 1)
EP_TEST(place_shm3_fp8_pre_rows, "shm", 3, .rounds = 8, .routing = R_FULL,
	.tt = FABEP_MOE_FP8_PREQUANT, .block = 16, .hidden = 256, .topk = 2,
	.experts = 12, .max_tokens = 24, .ct = FABEP_MOE_FP32, .place = "always",
	.place_expect = 1)
EP_TEST(place_shm4_fp8_tok, "shm", 4, .rounds = 12, .tt = FABEP_MOE_FP8,
	.it = FABEP_MOE_FP32, .topk = 3, .experts = 8, .max_tokens = 20,
	.place = "always", .place_expect = 1)
/* several chunks per run: the placed batch adds all their signals;
 * outstanding dispatches in both sets */
EP_TEST(place_shm4_chunks, "shm", 4, .rounds = 12, .topk = 3, .experts = 8,
	.hidden = 256, .max_tokens = 20, .chunk = "2000", .outstanding = 1,
	.place = "always", .place_expect = 1)
/* tcp: its remote CQ data makes every write its own signal, so only
 * the delivery strategy places */
EP_TEST(place_tcp3_delivery, "tcp", 3, .rounds = 10, .topk = 4, .experts = 12,
	.max_tokens = 16, .signal = FABEP_SIGNAL_DELIVERY, .place = "always",
	.place_expect = 1)
/* a rank refuses its input in round 2: that call places nothing */
EP_TEST(place_shm3_refuse, "shm", 3, .rounds = 4, .experts = 12, .topk = 3,
	.refuse = 1, .bad_rank = 1, .place = "always", .place_expect = 1)
/* rows past the placed region, or past the writes a peer's queue takes:
 * records as always */
EP_TEST(place_shm3_full, "shm", 3, .rounds = 10, .topk = 4, .experts = 12,
	.place = "always", .place_cap = 1, .place_expect = -1)
EP_TEST(place_shm4_writes, "shm", 4, .rounds = 10, .topk = 4, .experts = 8,
	.max_tokens = 32, .place = "always", .gather_writes = 6, .place_expect = 1)
EP_TEST(place_never_shm3, "shm", 3, .rounds = 6, .topk = 4, .experts = 12,
	.place = "never", .place_expect = -1)
/* auto: a call places from 64 KiB of records, whatever its rows per
 * record (a placed token goes once to a rank, and the receiver copies
 * it to its further experts there): every token to one expert (a row a
 * record), and top-4 of 12 experts on 3 ranks (about 1.7 rows a
 * record) */
EP_TEST(place_auto_shm3_one, "shm", 3, .rounds = 12, .routing = R_ONE,
	.topk = 2, .experts = 12, .hidden = 1024, .max_tokens = 40,
	.place = "auto", .place_expect = 1,
	.crowded = -1)
EP_TEST(place_auto_shm3_spread, "shm", 3, .rounds = 8, .routing = R_FULL,
	.topk = 4, .experts = 12, .hidden = 1024, .max_tokens = 40,
	.place = "auto", .place_expect = 1,
	.crowded = -1)
/* auto: FP8 rows (each run's records and scales a few KiB past the
 * early headers' 64 KiB) */
EP_TEST(place_auto_shm3_fp8, "shm", 3, .rounds = 8, .routing = R_FULL,
	.tt = FABEP_MOE_FP8, .block = 128, .topk = 4, .experts = 12,
	.hidden = 2048, .max_tokens = 40, .place = "auto", .place_expect = 1,
	.crowded = -1)
/* auto: no run of more than 2 rows a record (top-8 of 16 experts on
 * 2 ranks, about 4), whose receiver would copy most rows anyway */
EP_TEST(place_auto_shm2_dense, "shm", 2, .rounds = 8, .routing = R_FULL,
	.topk = 8, .experts = 16, .hidden = 1024, .max_tokens = 40,
	.signal = FABEP_SIGNAL_CMA, .place = "auto", .place_expect = -1,
	.crowded = -1)
/* auto where ranks outnumber the CPUs: a placed source would wait for
 * every header, so for ranks that are not running; records leave at
 * once */
EP_TEST(place_auto_shm3_crowded, "shm", 3, .rounds = 6, .routing = R_FULL,
	.topk = 4, .experts = 12, .hidden = 1024, .max_tokens = 40,
	.place = "auto", .place_expect = -1, .crowded = 1)
/* auto: a call below 64 KiB of records cannot place, and its headers
 * carry no counts of every rank; without them from rank 1 (one token)
 * no rank places, though the others' calls are large and of a row a
 * record */
EP_TEST(place_auto_shm3_few, "shm", 3, .rounds = 8, .routing = R_ONE_FEW,
	.topk = 2, .experts = 12, .hidden = 1024, .max_tokens = 40,
	.place = "auto", .place_expect = -1)
/* an idle rank (no tokens) carries every rank's counts: the others place */
EP_TEST(place_auto_shm3_idle, "shm", 3, .rounds = 8, .routing = R_ONE_IDLE,
	.topk = 2, .experts = 12, .hidden = 1024, .max_tokens = 40,
	.place = "auto", .place_expect = 1,
	.crowded = -1)

/* A random run for the fep_ep_ready_chunks models below: room for up
 * to 40 units in chunks of per, a header of 1 to 3 units, count units
 * to send; the rest of *r zeroed. */
static void run_shape(uint64_t *seed, struct fep_ep_run *r, size_t unit)
{
	size_t max = 1 + fep_test_rand(seed) % 40;

	memset(r, 0, sizeof(*r));
	r->per = 1 + fep_test_rand(seed) % 12;
	r->hdr = 1 + fep_test_rand(seed) % 3;
	r->count = fep_test_rand(seed) % (max + 1);
	r->unit = unit;
	r->dst = 1000;
	r->stage = 5000;
	r->chunks = 1 + (max + r->per - 1) / r->per;
}

/* fep_ep_ready_chunks with the header last (combine's runs, produced back
 * to front: the last block is reduced first): against a model of the
 * receiver's slot, for random run sizes, chunk sizes and progress steps.
 * Every unit and the header land exactly once, nothing leaves before it
 * is complete, chunks after the first leave as soon as they are complete,
 * the header leaves in the last write, and the adds sum to the chunks the
 * receiver counts. */
START_TEST(ready_hlast)
{
	uint64_t seed = 0x5eed1a57ull;
	int iter;

	for (iter = 0; iter < 4000; iter++) {
		size_t per, hdr, count, unit = 8;
		struct fep_ep_run r;
		struct fep_put out[64];
		unsigned char hits[64];
		size_t posted = 0, adds = 0, writes = 0, i, n;
		int hdr_seen = 0;

		run_shape(&seed, &r, unit);
		per = r.per;
		hdr = r.hdr;
		count = r.count;
		r.peer = 1;
		r.sig = r.hsig = 77;
		r.hlen = 64;
		r.hlast = 1;
		memset(hits, 0, sizeof(hits));
		while (posted < r.chunks) {
			ck_assert_uint_le(r.done, count);
			n = fep_ep_ready_chunks(out, &r, &posted);
			for (i = 0; i < n; i++) {
				size_t u0, u1, u;

				ck_assert_msg(!hdr_seen, "a write after the header");
				ck_assert_int_eq(out[i].peer, 1);
				ck_assert_uint_eq(out[i].sig, 77);
				ck_assert_uint_ge(out[i].add, 1);
				ck_assert_uint_eq(out[i].dst - r.dst, out[i].src - r.stage);
				ck_assert_uint_eq((out[i].dst - r.dst) % unit, 0);
				ck_assert_uint_eq(out[i].len % unit, 0);
				u0 = (out[i].dst - r.dst) / unit;
				u1 = u0 + out[i].len / unit;
				ck_assert_uint_le(u1, hdr + count);
				/* complete (produced back to front: done counts
				 * the units at the run's end) before it leaves */
				if (u0 == 0) {
					ck_assert_uint_eq(r.done, count);
					hdr_seen = 1;
				} else {
					ck_assert_uint_ge(u0, hdr + count - r.done);
				}
				for (u = u0; u < u1; u++)
					hits[u]++;
				adds += out[i].add;
				writes++;
			}
			/* every complete chunk but the first has left */
			if (!hdr_seen) {
				size_t j;

				for (j = 1; j * per < count; j++)
					if (j * per >= count - r.done)
						ck_assert_msg(hits[hdr + j * per] == 1,
							      "count %zu per %zu done %zu: "
							      "chunk at %zu complete but not "
							      "posted", count, per, r.done,
							      j * per);
			}
			if (r.done < count)
				r.done += 1 + fep_test_rand(&seed) % (2 * per);
			if (r.done > count)
				r.done = count;
			ck_assert_uint_le(writes, r.chunks);
		}
		ck_assert_msg(hdr_seen, "no header");
		ck_assert_uint_eq(adds, r.chunks);
		for (i = 0; i < hdr + count; i++)
			ck_assert_msg(hits[i] == 1, "count %zu per %zu: unit %zu "
				      "written %u times", count, per, i, hits[i]);
		/* chunks beyond the units cost no empty writes */
		ck_assert_uint_eq(writes, count > per ? (count + per - 1) / per : 1);
		/* nothing more once done */
		ck_assert_uint_eq(fep_ep_ready_chunks(out, &r, &posted), 0);
	}
}
END_TEST

/* fep_ep_ready_chunks with the header first (dispatch's runs): against a
 * model of the receiver's slot, for random run sizes, chunk sizes and
 * progress steps, chunks sent from the input slot (random rising token
 * lists) or staged, with the signal merged into the header's or not.
 * Every unit and the header land exactly once, from the stage or, in a
 * chunk sent from the input slot, from its token's record there; the
 * header leaves first and the chunks in order, each once complete; such
 * a chunk is one put per range of consecutive tokens, its signal on the
 * last; each chunk adds 1 on its counter (0 when merged: the header's
 * signal stands for them) and the header 1 on its own. */
START_TEST(ready_head)
{
	uint64_t seed = 0x4eadf157ull;
	int iter;

	for (iter = 0; iter < 4000; iter++) {
		size_t per, hdr, count, unit = 8;
		struct fep_ep_run r;
		struct fep_put out[128];
		uint8_t direct[64], signalled[64];
		int32_t tok[64], t;
		unsigned char hits[64], nputs[64], adds[64];
		size_t posted = 0, last = 0, i, j, n, u;
		uint64_t hadds = 0;

		run_shape(&seed, &r, unit);
		per = r.per;
		hdr = r.hdr;
		count = r.count;
		r.peer = 2;
		r.input = 90000;
		r.sig = 77;
		r.hsig = 88;
		r.hlen = hdr * unit;
		r.merge = (int)(fep_test_rand(&seed) % 2);
		t = (int32_t)(fep_test_rand(&seed) % 3);
		for (i = 0; i < count; i++) {
			tok[i] = t;
			t += 1 + (fep_test_rand(&seed) % 3 ? 0 :
				  (int32_t)(fep_test_rand(&seed) % 4));
		}
		for (j = 0; j < r.chunks; j++)
			direct[j] = j && fep_test_rand(&seed) % 2;
		if (fep_test_rand(&seed) % 4) {
			r.direct = direct;
			r.tok = tok;
		}
		memset(hits, 0, sizeof(hits));
		memset(nputs, 0, sizeof(nputs));
		memset(adds, 0, sizeof(adds));
		memset(signalled, 0, sizeof(signalled));
		while (posted < r.chunks) {
			n = fep_ep_ready_chunks(out, &r, &posted);
			for (i = 0; i < n; i++) {
				const struct fep_put *p = &out[i];
				size_t u0, u1;

				ck_assert_int_eq(p->peer, 2);
				ck_assert_uint_eq((p->dst - r.dst) % unit, 0);
				ck_assert_uint_eq(p->len % unit, 0);
				u0 = (p->dst - r.dst) / unit;
				u1 = u0 + p->len / unit;
				j = u0 < hdr ? 0 : 1 + (u0 - hdr) / per;
				ck_assert_msg(j >= last && j < r.chunks,
					      "chunk %zu after chunk %zu", j, last);
				last = j;
				ck_assert_msg(!signalled[j], "a put of chunk %zu after "
					      "its signal", j);
				if (j == 0) {  /* the header */
					ck_assert_uint_eq(u0, 0);
					ck_assert_uint_eq(p->len, r.hlen);
					ck_assert_uint_eq(p->src, r.stage);
					ck_assert_uint_eq(p->sig, 88);
					ck_assert_uint_eq(p->add, 1);
					hadds += p->add;
					signalled[0] = 1;
				} else {
					size_t c1 = FEP_MIN(j * per, count);

					ck_assert_uint_eq(p->sig, 77);
					ck_assert_uint_le(p->add, 1);
					/* within its chunk, and complete */
					ck_assert_uint_le(u1, hdr + FEP_MAX(c1, (j - 1) * per));
					ck_assert_uint_le(c1, r.done);
					for (u = u0; u < u1; u++) {
						uint64_t want = r.direct && direct[j] ?
							r.input + (hdr + (size_t)tok[u - hdr]) * unit :
							r.stage + u * unit;

						ck_assert_uint_eq(p->src + (u - u0) * unit, want);
					}
					nputs[j]++;
					adds[j] += (unsigned char)p->add;
					signalled[j] = p->add || (r.merge && u1 ==
						hdr + FEP_MAX(c1, (j - 1) * per));
				}
				for (u = u0; u < u1; u++)
					hits[u]++;
			}
			if (r.done < count)
				r.done += 1 + fep_test_rand(&seed) % (2 * per);
			if (r.done > count)
				r.done = count;
		}
		for (i = 0; i < hdr + count; i++)
			ck_assert_msg(hits[i] == 1, "count %zu per %zu: unit %zu "
				      "written %u times", count, per, i, hits[i]);
		ck_assert_uint_eq(hadds, 1);
		for (j = 1; j < r.chunks; j++) {
			size_t r0 = (j - 1) * per, r1 = FEP_MIN(r0 + per, count);
			size_t ranges = 1, b;

			ck_assert_msg(signalled[j], "chunk %zu: not all sent", j);
			ck_assert_uint_eq(adds[j], (r.merge ? 0u : 1u));
			if (r.direct && direct[j] && r1 > r0)
				for (b = r0 + 1; b < r1; b++)
					ranges += tok[b] != tok[b - 1] + 1;
			ck_assert_uint_eq(nputs[j], ranges);
		}
		/* nothing more once done */
		ck_assert_uint_eq(fep_ep_ready_chunks(out, &r, &posted), 0);
	}
}
END_TEST

/* A dispatch that returns with its rows still queued holds its receiver
 * on tcp, whose writes move only while the sender progresses: rank 0
 * sends 2048 rows of 7168 bf16 (29 MB, more than sockets buffer) to rank
 * 1, which sends nothing, so rank 0's wait ends at once; rank 0 then
 * calls nothing until rank 1's dispatch has returned (a file says so),
 * as a server computing its experts.  Then the same for combine, the
 * other way: rank 1 returns the rows to rank 0 and calls nothing until
 * rank 0's combine has returned, and rank 0 checks what came back. */
/* A folder of marks that ranks leave for each other (files). */
struct marks {
	char dir[64];
};

static void marks_make(struct marks *d, const char *name)
{
	snprintf(d->dir, sizeof(d->dir), "/tmp/%s.XXXXXX", name);
	ck_assert_ptr_nonnull(mkdtemp(d->dir));
}

/* Remove the marks and their folder. */
static void marks_remove(struct marks *d)
{
	DIR *dir = opendir(d->dir);
	struct dirent *e;
	char path[340];

	while (dir && (e = readdir(dir))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", d->dir, e->d_name);
		unlink(path);
	}
	if (dir)
		closedir(dir);
	rmdir(d->dir);
}

static int wait_file(const char *path, int seconds)
{
	struct timespec ts = { 0, 1000000L };
	int i;

	for (i = 0; i < seconds * 1000; i++) {
		if (access(path, F_OK) == 0)
			return 0;
		nanosleep(&ts, NULL);
	}
	return -1;
}

/* After a call named @what: mark it done for @rank; the rank @waiter then
 * makes no call until its peer has marked the same (a file), and says so
 * if that does not come. */
static int drain_mark(const struct marks *d, const char *what, int rank,
		      int waiter)
{
	char path[96];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s%d", d->dir, what, rank);
	if (!(f = fopen(path, "w"))) {
		fprintf(stderr, "rank %d: %s: %s\n", rank, path, strerror(errno));
		return -1;
	}
	fclose(f);
	if (rank != waiter)
		return 0;
	snprintf(path, sizeof(path), "%s/%s%d", d->dir, what, !rank);
	if (wait_file(path, 30) == 0)
		return 0;
	fprintf(stderr, "rank %d: rank %d's %s call did not return while rank "
		"%d made no call\n", rank, !rank, what, rank);
	return -1;
}

static int drain_rank(int rank, int size, void *arg)
{
	const struct marks *d = arg;
	const size_t n = 2048, H = 7168;
	fabep_comm_attr_t a;
	fabep_moe_config_t cfg;
	fabep_comm_t *comm = NULL;
	fabep_moe_t *moe = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	uint16_t *x = NULL, *y = NULL, *out = NULL;
	int32_t *ids = NULL;
	size_t t, h;
	int ret, rc = 1;

	(void)size;
	fabep_moe_config_init(&cfg);
	cfg.num_experts = 2;
	cfg.top_k = 1;
	cfg.hidden = H;
	cfg.max_tokens = n;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 20000;
	a.heap_size = fabep_moe_heap_bytes(&cfg, 2) + (1u << 20);
	if ((ret = fabep_comm_create(&a, &comm)) ||
	    (ret = fabep_moe_create(comm, &cfg, &moe))) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		goto out;
	}
	x = malloc(n * H * 2);
	y = malloc(n * H * 2 + 2);
	out = malloc(n * H * 2);
	ids = malloc(n * sizeof(*ids));
	if (!x || !y || !out || !ids)
		goto out;
	for (t = 0; t < n; t++) {
		ids[t] = 1;  /* every token to rank 1's expert */
		for (h = 0; h < H; h++)
			x[t * H + h] = (uint16_t)(0x3f80 + (t * 7 + h) % 127);  /* exact in bf16 */
	}
	ret = fabep_moe_dispatch(moe, x, NULL, rank == 0 ? n : 0, ids, NULL, &rv);
	if (ret) {
		fprintf(stderr, "rank %d: dispatch: %s\n", rank, fabep_strerror(ret));
		goto out;
	}
	/* no fabep call on rank 0 until rank 1 has its rows */
	if (drain_mark(d, "dispatch", rank, 0))
		goto out;
	if (rank == 1 && rv.rows != n) {
		fprintf(stderr, "rank 1: %zu rows, want %zu\n", rv.rows, n);
		goto out;
	}
	for (t = 0; t < rv.rows; t++)  /* the toy expert: y = x */
		memcpy(y + t * H, (const uint8_t *)rv.x + (size_t)rv.row_index[t] *
		       rv.row_stride, H * 2);
	ret = fabep_moe_combine(moe, y, H, 0, out, H, NULL, NULL);
	if (ret) {
		fprintf(stderr, "rank %d: combine: %s\n", rank, fabep_strerror(ret));
		goto out;
	}
	/* the way back: rank 1 returns 29 MB to rank 0 only, then makes no
	 * call until rank 0's combine has returned */
	if (drain_mark(d, "combine", rank, 1))
		goto out;
	if (rank == 0 && memcmp(out, x, n * H * 2)) {
		fprintf(stderr, "rank 0: the combined rows differ from the tokens\n");
		goto out;
	}
	rc = 0;
out:
	free(x);
	free(y);
	free(out);
	free(ids);
	fabep_moe_destroy(moe);
	ret = fabep_comm_destroy(comm);
	return rc ? rc : ret ? 1 : 0;
}

START_TEST(tcp2_drain)
{
	struct marks d;
	int status[2];

	fep_test_on_provider("tcp");
	marks_make(&d, "fep_drain");
	fep_test_run_ranks_status(2, 120, drain_rank, &d, status);
	marks_remove(&d);
	ck_assert_msg(status[0] == 0 && status[1] == 0,
		      "ranks exited %d and %d", status[0], status[1]);
}
END_TEST

/* Heap blocks given back by destroy and reused by a later creation, on
 * every rank alike (the heap has room for one and a half MoE handles A):
 *   1. A, destroyed, then A again: the space of the first (no room for two);
 *   2. an allreduce handle in that space, then A again, whose counters
 *      start from zero though the allreduce's advanced there;
 *   3. rank 0 destroys A, rank 1 keeps it: a small handle S takes fresh
 *      space on both (A's is not free everywhere) and works;
 *   4. A and S given back everywhere: a handle B larger than A fits (the
 *      two merge, or are taken back at the heap's end);
 *   5. S destroyed after a dispatch_send without its dispatch_recv: the
 *      next S lies elsewhere (its send buffer, in the heap, says where),
 *      where after a complete call it lies in the same place;
 *   6. a dispatch that times out on rank 0 (rank 1 makes none): later
 *      calls of the handle fail at once with -FABEP_ERR_PEER_LOST, and
 *      its space is never reused, so A no longer fits anywhere and every
 *      rank gets -FABEP_ERR_HEAP_FULL. */
#define REUSE_FAIL(...) do { char m_[256];                                 \
	snprintf(m_, sizeof(m_), __VA_ARGS__);                                 \
	fprintf(stderr, "rank %d: %s\n", rank, m_); goto out; } while (0)

static int reuse_moe(fabep_comm_t *comm, const struct params *p, int rank,
		     int size, int rounds, fabep_moe_t **moe)
{
	fabep_moe_config_t cfg;
	int ret, r;

	fill_cfg(p, &cfg);
	ret = fabep_moe_create(comm, &cfg, moe);
	if (ret)
		return ret;
	for (r = 1; r <= rounds; r++)
		if (round_trip(p, *moe, rank, size, r, 0))
			return -EIO;
	return 0;
}

/* Where a new handle lies in the heap: its first send buffer. */
static void *reuse_where(fabep_moe_t *moe)
{
	void *x = NULL;

	fabep_moe_send_buffer(moe, &x, NULL, NULL, NULL);
	return x;
}

static int reuse_ar(fabep_comm_t *comm, int rank, int size)
{
	fabep_allreduce_t *ar = NULL;
	float in[64 * 8], out[64 * 8];
	int ret, i, c;

	ret = fabep_allreduce_create(comm, 64, 8, FABEP_AR_F32, &ar);
	for (c = 0; !ret && c < 3; c++) {
		for (i = 0; i < 64 * 8; i++)
			in[i] = (float)(rank + 1) * (float)(i % 13 + c);
		ret = fabep_allreduce(ar, in, out, 3 + 20 * (size_t)c, 8);
		for (i = 0; !ret && i < (3 + 20 * c) * 8; i++)
			if (out[i] != (float)(size * (size + 1) / 2) * (float)(i % 13 + c))
				ret = -EIO;
	}
	fabep_allreduce_destroy(ar);
	return ret;
}

static int reuse_rank(int rank, int size, void *arg)
{
	const struct marks *d = arg;
	struct params pa = P(.hidden = 2880, .max_tokens = 48, .topk = 4),
		      pb = P(.hidden = 2880, .max_tokens = 64, .topk = 4),
		      ps = P(.hidden = 100, .max_tokens = 16);
	fabep_moe_config_t ca, cb, cs;
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_moe_t *moe = NULL, *small = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	struct input in;
	char path[96];
	size_t na;
	int ret, rc = 1, i;

	fill_cfg(&pa, &ca);
	fill_cfg(&pb, &cb);
	fill_cfg(&ps, &cs);
	na = fabep_moe_heap_bytes(&ca, size);
	/* B: more than A, more than is left beside A and S, less than the
	 * heap's room for handles */
	if (!(fabep_moe_heap_bytes(&cb, size) > na / 2 + (1u << 20) &&
	      fabep_moe_heap_bytes(&cb, size) > na &&
	      fabep_moe_heap_bytes(&cb, size) < na + na / 2 &&
	      fabep_moe_heap_bytes(&cs, size) < na / 4 &&
	      fabep_allreduce_heap_bytes(64, 8, FABEP_AR_F32, size) < na))
		REUSE_FAIL("the sizes do not make the case: A %zu B %zu S %zu", na,
			   fabep_moe_heap_bytes(&cb, size),
			   fabep_moe_heap_bytes(&cs, size));
	fabep_comm_attr_init(&a);
	a.threads = fep_test_threads(1);
	a.timeout_ms = 2000;
	a.heap_size = na + na / 2 + (1u << 20);
	if ((ret = fabep_comm_create(&a, &comm)))
		REUSE_FAIL("comm: %s", fabep_strerror(ret));

	/* 1. */
	if ((ret = reuse_moe(comm, &pa, rank, size, 2, &moe)))
		REUSE_FAIL("A: %s", fabep_strerror(ret));
	fabep_moe_destroy(moe);
	moe = NULL;
	if ((ret = reuse_moe(comm, &pa, rank, size, 2, &moe)))
		REUSE_FAIL("A after A's destroy: %s", fabep_strerror(ret));
	fabep_moe_destroy(moe);
	moe = NULL;
	/* 2. */
	if ((ret = reuse_ar(comm, rank, size)))
		REUSE_FAIL("allreduce in A's space: %s", fabep_strerror(ret));
	if ((ret = reuse_moe(comm, &pa, rank, size, 3, &moe)))
		REUSE_FAIL("A after the allreduce: %s", fabep_strerror(ret));
	/* 3. */
	if (rank == 0) {
		fabep_moe_destroy(moe);
		moe = NULL;
	}
	if ((ret = reuse_moe(comm, &ps, rank, size, 3, &small)))
		REUSE_FAIL("S beside a handle that rank 1 keeps: %s",
			   fabep_strerror(ret));
	fabep_moe_destroy(moe);
	moe = NULL;
	fabep_moe_destroy(small);
	small = NULL;
	/* 4. */
	if ((ret = reuse_moe(comm, &pb, rank, size, 2, &moe)))
		REUSE_FAIL("B in the space of A and S: %s", fabep_strerror(ret));
	fabep_moe_destroy(moe);
	moe = NULL;
	/* 5. */
	for (i = 0; i < 2; i++) {
		void *was;

		fabep_moe_destroy(small);
		small = NULL;
		if ((ret = reuse_moe(comm, &ps, rank, size, 0, &small)))
			REUSE_FAIL("S: %s", fabep_strerror(ret));
		was = reuse_where(small);
		gen(&ps, size, rank, 1, &in);
		ret = fabep_moe_dispatch_send(small, in.x, NULL, in.n, in.ids, in.w);
		if (!ret && i == 0)
			ret = fabep_moe_dispatch_recv(small, &rv);
		free_input(&in);
		if (ret)
			REUSE_FAIL("S's dispatch: %s", fabep_strerror(ret));
		fabep_moe_destroy(small);
		small = NULL;
		if ((ret = reuse_moe(comm, &ps, rank, size, 0, &small)))
			REUSE_FAIL("S after S: %s", fabep_strerror(ret));
		if (!was || (reuse_where(small) == was) != (i == 0))
			REUSE_FAIL("S after S %s: %s space", i ? "with a send half "
				   "never received" : "with a complete dispatch",
				   i ? "the same" : "other");
	}
	fabep_moe_destroy(small);
	small = NULL;
	/* 6. */
	if ((ret = reuse_moe(comm, &pa, rank, size, 1, &moe)))
		REUSE_FAIL("A before the timeout: %s", fabep_strerror(ret));
	snprintf(path, sizeof(path), "%s/timedout", d->dir);
	if (rank == 0) {
		FILE *f;

		gen(&pa, size, rank, 1, &in);
		ret = fabep_moe_dispatch(moe, in.x, NULL, in.n, in.ids, in.w, &rv);
		free_input(&in);
		if (ret != -ETIMEDOUT)
			REUSE_FAIL("the lone dispatch gave %d (%s), want a timeout",
				   ret, fabep_strerror(ret));
		/* the ranks' calls are out of step: the handle refuses more,
		 * at once */
		gen(&pa, size, rank, 2, &in);
		ret = fabep_moe_dispatch(moe, in.x, NULL, in.n, in.ids, in.w, &rv);
		free_input(&in);
		if (ret != -FABEP_ERR_PEER_LOST)
			REUSE_FAIL("a dispatch after the timeout gave %d (%s)", ret,
				   fabep_strerror(ret));
		ret = fabep_moe_combine(moe, NULL, 0, 0, NULL, 0, NULL, NULL);
		if (ret != -FABEP_ERR_PEER_LOST)
			REUSE_FAIL("a combine after the timeout gave %d (%s)", ret,
				   fabep_strerror(ret));
		if (!(f = fopen(path, "w")))
			REUSE_FAIL("%s: %s", path, strerror(errno));
		fclose(f);
	} else if (wait_file(path, 60)) {
		REUSE_FAIL("rank 0's dispatch did not time out");
	}
	fabep_moe_destroy(moe);
	moe = NULL;
	ret = fabep_moe_create(comm, &ca, &moe);
	if (ret != -FABEP_ERR_HEAP_FULL)
		REUSE_FAIL("A after a failed call's destroy gave %d (%s), want "
			   "-FABEP_ERR_HEAP_FULL", ret, fabep_strerror(ret));
	moe = NULL;
	rc = 0;
out:
	fabep_moe_destroy(moe);
	fabep_moe_destroy(small);
	ret = fabep_comm_destroy(comm);
	/* rank 0's communicator failed at its timeout: its destroy says no
	 * goodbye, and the others' report it */
	return rc ? rc : ret && rank == 0 ? 1 : 0;
}

/*
 * Counter slots running out, with 4 bytes of remote CQ data (cqdata) and
 * the handles' blocks past the 128 MiB they name: every slot taken by a
 * live handle, the next creation fails with -ERANGE on every rank
 * (nothing taken); a handle destroyed gives its slot back, zeroed for
 * the next one, which then works.
 */
static int slots_rank(int rank, int size, void *arg)
{
	enum { MAXH = FEP_CS_MAX + 1 };
	fabep_moe_t **h = calloc(MAXH, sizeof(*h));
	fabep_moe_config_t cfg;
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	uint16_t x[2 * 16], out[2 * 16];
	int32_t ids[2 * 2] = { 0, 1, 2, 3 };
	int i, n = 0, ret, rc = 1;

	(void)arg;
	fep_test_cq4();
	fabep_moe_config_init(&cfg);
	cfg.num_experts = 2 * size;
	cfg.top_k = 2;
	cfg.hidden = 16;
	cfg.max_tokens = 2;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.signal = FABEP_SIGNAL_CQDATA;
	a.heap_size = FEP_TEST_CQ4_FILLER +
		      (size_t)MAXH * fabep_moe_heap_bytes(&cfg, size) + (2u << 20);
	for (i = 0; i < 2 * 16; i++)
		x[i] = 0x3f80; /* 1.0 */
	if ((ret = fabep_comm_create(&a, &comm))) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		goto out;
	}
	if (fep_test_cq4_filler(comm, rank))
		goto out;
	if (comm->fab->cs_n != FEP_CS_MAX) {
		fprintf(stderr, "rank %d: %d counter slots\n", rank, comm->fab->cs_n);
		goto out;
	}
	for (n = 0; n < MAXH; n++) {
		ret = fabep_moe_create(comm, &cfg, &h[n]);
		if (ret)
			break;
	}
	if (n != FEP_CS_MAX || ret != -ERANGE) {
		fprintf(stderr, "rank %d: %d handles, then %s\n", rank, n,
			fabep_strerror(ret));
		goto out;
	}
	/* the first, the last and one between still work; that one, given
	 * back with its counters moved on, and a new one in its slot works */
	for (i = 0; i < 3; i++) {
		int k = i == 0 ? 0 : i == 1 ? 3 : n - 1;

		if ((ret = fabep_moe_dispatch(h[k], x, NULL, 2, ids, NULL, &rv)) ||
		    (ret = fabep_moe_combine(h[k], rv.x, 16, 0, out, 16, NULL,
					     NULL)) ||
		    out[0] != 0x4000) {
			fprintf(stderr, "rank %d: handle %d: %s, %#x\n", rank, k,
				fabep_strerror(ret), out[0]);
			goto out;
		}
	}
	fabep_moe_destroy(h[3]);
	if ((ret = fabep_moe_create(comm, &cfg, &h[3])) ||
	    (ret = fabep_moe_dispatch(h[3], x, NULL, 2, ids, NULL, &rv)) ||
	    (ret = fabep_moe_combine(h[3], rv.x, 16, 0, out, 16, NULL, NULL)) ||
	    out[0] != 0x4000) {
		fprintf(stderr, "rank %d: a slot given back: %s, %#x\n", rank,
			fabep_strerror(ret), out[0]);
		goto out;
	}
	rc = 0;
out:
	for (i = 0; i < n; i++)
		fabep_moe_destroy(h[i]);
	free(h);
	if (fabep_comm_destroy(comm))
		rc = 1;
	return rc;
}

FEP_TEST_RANKS_CASE(cq4_shm2_slots, "shm", 2, 120, slots_rank, NULL)

START_TEST(shm2_heap_reuse)
{
	struct marks d;
	int ret;

	fep_test_on_provider("shm");
	marks_make(&d, "fep_reuse");
	ret = fep_test_run_ranks(2, 120, reuse_rank, &d);
	marks_remove(&d);
	ck_assert_msg(ret == 0, "%s", fep_test_ranks_failed());
}
END_TEST

/* Copy mode: the rows a dispatch receives, 2 MiB and more here (about
 * 512 rows of 14 KiB a rank), lie in memory advised as huge pages
 * (fep_huge_alloc), which the expert-major copy into them needs on
 * guests whose page walks are dear; checked after a round trip that the
 * reference checks.  77: smaps says nothing of the mapping. */
static int huge_rank(int rank, int size, void *arg)
{
	struct params p = P(.hidden = 7168, .max_tokens = 64, .topk = 8,
			    .experts = 16);
	fabep_moe_config_t cfg;
	fabep_comm_t *comm = NULL;
	fabep_moe_t *moe = NULL;
	int ret, rc = 1, b, seen = 0;

	(void)arg;
	ret = make(&p, rank, size, &comm, &moe, &cfg);
	if (ret)
		return ret == 77 ? 77 : 1;
	if (round_trip(&p, moe, rank, size, 1, 0))
		goto out;
	for (b = 0; b < moe->sets; b++) {
		const struct fep_ep_set *s = &moe->set[b];
		int hg;

		if (!s->x || s->cap_rows * moe->row_bytes < FEP_HUGE_PAGE)
			continue;
		seen++;
		hg = fep_test_smaps_hg(s->x);
		if (hg < 0) {
			rc = 77;
			goto out;
		}
		if (!hg) {
			fprintf(stderr, "rank %d: set %d's %zu received rows (%zu "
				"bytes) are not advised as huge pages\n", rank, b,
				s->cap_rows, s->cap_rows * moe->row_bytes);
			goto out;
		}
	}
	if (!seen) {
		fprintf(stderr, "rank %d: no set received 2 MiB of rows\n", rank);
		goto out;
	}
	rc = 0;
out:
	fabep_moe_destroy(moe);
	ret = fabep_comm_destroy(comm);
	return rc ? rc : ret ? 1 : 0;
}

START_TEST(shm2_recv_huge)
{
	int status[2], r;

	fep_test_on_provider("shm");
	if (!fep_test_have_thp())
		fep_test_skip("this kernel has no transparent huge pages");
	ck_assert_int_eq(fep_test_run_ranks_status(2, 120, huge_rank, NULL, status), 0);
	if (status[0] == 77 || status[1] == 77)
		fep_test_skip("/proc/self/smaps gives no VmFlags here");
	for (r = 0; r < 2; r++)
		ck_assert_msg(status[r] == 0, "rank %d: status %d: %s", r, status[r],
			      fep_test_rank_said(r));
}
END_TEST

/* Every signal strategy that each provider offers (skipped where it
 * lacks one; fep_test_add_signal_cases), a short run each: round trips
 * in bf16 and in FP8 with 128-blocks, checked against the reference;
 * then every rank's dispatch_send is followed by a handle's creation
 * before its dispatch_recv.  The creation's exchange must not hold a
 * peer whose send half needs this rank's progress (delivery: a write's
 * completion comes through the target's progress), then more round
 * trips on the new handle. */
static int signals_rank(int rank, int size, void *arg)
{
	const fabep_signal_t *sig = arg;
	struct params pb = P(.rounds = 3, .topk = 3, .experts = 6),
		      p8 = P(.rounds = 2, .topk = 2, .experts = 6, .hidden = 256,
			     .tt = FABEP_MOE_FP8, .block = 128);
	fabep_moe_config_t cb, c8;
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_moe_t *moe = NULL, *next = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	struct input in;
	int ret, r, rc = 1;

	fill_cfg(&pb, &cb);
	fill_cfg(&p8, &c8);
	fabep_comm_attr_init(&a);
	a.threads = fep_test_threads(1);
	a.heap_size = 2 * fabep_moe_heap_bytes(&cb, size) +
		      fabep_moe_heap_bytes(&c8, size) + (1u << 20);
	ret = fabep_comm_create(&a, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: fabep_comm_create: %s\n", rank,
			fabep_strerror(ret));
		return ret == -ETIMEDOUT ? 77 : 1;
	}
	if (fabep_comm_signal(comm) != *sig) {
		fprintf(stderr, "rank %d: signal %s, want %s\n", rank,
			fabep_signal_name(fabep_comm_signal(comm)),
			fabep_signal_name(*sig));
		goto out;
	}
	if ((ret = fabep_moe_create(comm, &c8, &moe))) {
		fprintf(stderr, "rank %d: FP8 handle: %s\n", rank, fabep_strerror(ret));
		goto out;
	}
	for (r = 1; r <= p8.rounds; r++)
		if (round_trip(&p8, moe, rank, size, r, 0))
			goto out;
	fabep_moe_destroy(moe);
	if ((ret = fabep_moe_create(comm, &cb, &moe))) {
		fprintf(stderr, "rank %d: bf16 handle: %s\n", rank, fabep_strerror(ret));
		goto out;
	}
	for (r = 1; r <= pb.rounds; r++)
		if (round_trip(&pb, moe, rank, size, r, 0))
			goto out;
	gen(&pb, size, rank, r, &in);
	ret = fabep_moe_dispatch_send(moe, in.x, NULL, in.n, in.ids, in.w);
	free_input(&in);
	if (ret) {
		fprintf(stderr, "rank %d: dispatch_send: %s\n", rank, fabep_strerror(ret));
		goto out;
	}
	if ((ret = fabep_moe_create(comm, &cb, &next))) {
		fprintf(stderr, "rank %d: a handle's creation between the halves: "
			"%s\n", rank, fabep_strerror(ret));
		goto out;
	}
	if ((ret = fabep_moe_dispatch_recv(moe, &rv))) {
		fprintf(stderr, "rank %d: dispatch_recv after the creation: %s\n",
			rank, fabep_strerror(ret));
		goto out;
	}
	for (r = 1; r <= 2; r++)
		if (round_trip(&pb, next, rank, size, r, 0))
			goto out;
	rc = 0;
out:
	fabep_moe_destroy(next);
	fabep_moe_destroy(moe);
	ret = fabep_comm_destroy(comm);
	return rc ? rc : ret ? 1 : 0;
}

START_TEST(moe)
{
	fabep_signal_t sig;
	const char *prov = fep_test_signal_case(_i, &sig);
	int size = strcmp(prov, "sockets") ? 3 : 2, status[3], r;

	fep_test_run_ranks_status(size, 120, signals_rank, &sig, status);
	if (!strcmp(prov, "sockets") && status[0] == 77)
		fep_test_skip("sockets: fabep_comm_create timed out (known "
			      "intermittent warm-up failure)");
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == 0, "%s, %s, %d ranks: rank %d exited %d: %s",
			      prov, fabep_signal_name(sig), size, r, status[r],
			      fep_test_rank_said(r));
}
END_TEST

/* ---- headers and records written by a lying peer ---- */

/*
 * Rank LIAR_RANK does not call dispatch (or combine) but writes, with
 * the public put + signal, what a broken or hostile peer could into the
 * receive slots of every other rank, and signals as a real run does; the
 * others call fabep_moe_dispatch (fabep_moe_combine) and must return
 * -FABEP_ERR_PROTOCOL with a message naming the liar and the bound, and
 * neither crash nor hang.  One case per bound that dispatch.c, layout.c
 * and combine.c check on what peers wrote.
 */
enum {
	LIE_COUNT,        /* header: more records than max_tokens */
	LIE_MAGIC,        /* header: not a header (magic) */
	LIE_SEQ,          /* header: another call's */
	LIE_STATUS,       /* header: a status that is no error code */
	LIE_ROWS,         /* header: more rows than count * top_k */
	LIE_CHUNKS,       /* header: record signals neither 0 nor all chunks */
	LIE_ALLROWS,      /* header: every rank's rows per expert (placed
			   * dispatch) disagree with the receiver's */
	LIE_TOKEN,        /* record: token index past max_tokens */
	LIE_EXPERT,       /* record: expert id past num_experts */
	LIE_MORE,         /* records: more rows for an expert than announced */
	LIE_FEWER,        /* records: fewer rows than announced */
	LIE_C_COUNT,      /* combine header: not the count this rank sent */
	LIE_C_SEQ,        /* combine header: another call's */
	LIE_N
};

static const char *const lie_names[LIE_N] = {
	"count", "magic", "seq", "status", "rows", "chunks", "all rows", "token",
	"expert",
	"more",
	"fewer", "combine count", "combine seq"
};

/* What the receivers must log (after "rank LIAR_RANK"). */
static const char *const lie_logs[LIE_N] = {
	"announced 9 rows (expected at most 8)", "'s header holds call",
	"'s header holds call", "sent status 5", "announced 3 rows for 1 tokens",
	"record signals (expected 0 or",
	"announced other rows for this rank's experts", "sent token index 8", "sent expert 6", "sent more rows for expert",
	"sent 1 rows fewer for expert", "announced", "'s header holds call"
};

#define LIAR_RANK 2
#define LIE_TOPK 2
#define LIE_EXPERTS 6
#define LIE_TOKENS 8

struct lie_capture {
	FILE *f;
	int saved;
};

static void lie_capture_begin(struct lie_capture *c)
{
	fflush(stderr);
	c->f = tmpfile();
	c->saved = c->f ? dup(2) : -1;
	if (c->f)
		dup2(fileno(c->f), 2);
}

/* Restore stderr; whether the captured text holds both strings. */
static int lie_capture_end(struct lie_capture *c, const char *a, const char *b)
{
	char buf[8192];
	size_t n = 0;
	int found = 0;

	fflush(stderr);
	if (!c->f)
		return 0;
	dup2(c->saved, 2);
	close(c->saved);
	rewind(c->f);
	n = fread(buf, 1, sizeof(buf) - 1, c->f);
	buf[n] = '\0';
	fclose(c->f);
	{
		const char *p = buf;

		while ((p = strstr(p, a)) && !found) {
			const char *eol = strchr(p, '\n');

			found = strstr(p, b) && (!eol || strstr(p, b) < eol);
			p++;
		}
	}
	if (!found)
		fprintf(stderr, "log without \"%s ... %s\":\n%s", a, b, buf);
	return found;
}

/* The liar's run to receiver r (L local experts each) in its staging,
 * then written into r's slot for the liar with the signals a run adds. */
static int lie_dispatch(fabep_comm_t *comm, struct fabep_moe *m, int lie, int r)
{
	uint8_t *st = fep_heap_at(comm->fab, fep_ep_dstage(m, 0, r));
	uint64_t dst = fep_ep_dslot(m, 0, m->rank);
	struct fep_ep_hdr h;
	uint32_t rows[8];
	int32_t meta[2 + 2 * LIE_TOPK];
	float one = 1.0f;
	uint8_t *hd = st + m->dhoff;
	size_t len = m->hdr_recs * m->rec_bytes;  /* the header's records */
	int ret;

	memset(st, 0, m->dslot_bytes);
	memset(&h, 0, sizeof(h));
	memset(rows, 0, sizeof(rows));
	h.seq = 1;
	h.magic = FEP_EP_MAGIC;
	h.count = 1;
	h.chunks = (uint32_t)(m->dchunks - 1);  /* as it signals below */
	rows[0] = 1;  /* one row for r's first expert */
	meta[0] = 0;  /* token 0, stamp, ids, weights */
	meta[1] = 1;
	meta[2] = r * m->L;
	meta[3] = -1;
	memcpy(&meta[4], &one, 4);
	memcpy(&meta[5], &one, 4);
	switch (lie) {
	case LIE_COUNT: h.count = LIE_TOKENS + 1; break;
	case LIE_MAGIC: h.magic ^= 1; break;
	case LIE_SEQ: h.seq = 2; break;
	case LIE_STATUS: h.status = 5; break;
	case LIE_ROWS: rows[0] = LIE_TOPK + 1; break;
	case LIE_CHUNKS: h.chunks = (uint32_t)m->dchunks + 5; break;
	case LIE_TOKEN: meta[0] = LIE_TOKENS; break;
	case LIE_EXPERT: meta[2] = LIE_EXPERTS; break;
	case LIE_MORE: meta[3] = meta[2]; break;
	case LIE_FEWER: meta[2] = -1; break;
	}
	if (m->place_rows) {  /* every rank's counts: r's the same, or not */
		h.flags = FEP_EP_HDR_COUNTS;
		if (lie != LIE_ALLROWS)
			memcpy(hd - m->dcnt_bytes + 4 * (size_t)m->L * (size_t)r,
			       rows, 4 * (size_t)m->L);
	}
	memcpy(hd, &h, sizeof(h));
	memcpy(hd + FEP_EP_HDR, rows, 4 * (size_t)m->L);
	memcpy(st + m->hdr_recs * m->rec_bytes, meta, sizeof(meta));
	if (lie >= LIE_TOKEN)
		len = (m->hdr_recs + 1) * m->rec_bytes;
	/* the header (and record) on the header counter, the records'
	 * chunks on theirs */
	ret = fep_fab_put_signal(comm->fab, r, dst, fep_ep_dstage(m, 0, r), len,
				 fep_ep_hctr(m, 0), 1);
	if (!ret)
		ret = fep_fab_put_signal(comm->fab, r, dst, fep_ep_dstage(m, 0, r), 64,
					 fep_ep_dctr(m, 0), m->dchunks - 1);
	return ret;
}

/* The liar's combine header to receiver r: count or call wrong. */
static int lie_combine(fabep_comm_t *comm, struct fabep_moe *m, int lie, int r)
{
	struct fep_ep_set *s = &m->set[0];
	uint8_t *st = fep_heap_at(comm->fab, fep_ep_cstage(m, r) + m->choff);
	/* the kind of run r asked for (rows or partial rows), one unit more */
	uint32_t fl = s->crows[r] ? FEP_EP_HDR_ROWS : 0, count = s->rcount[r];
	size_t i;

	if (fl)
		for (count = 0, i = 0; i < s->rows; i++)
			count += s->src_info[3 * i] == r;
	fep_ep_hdr_write(st, lie == LIE_C_SEQ ? s->seq + 1 : s->seq, 0, count + 1);
	memcpy(st + offsetof(struct fep_ep_hdr, flags), &fl, 4);
	return fep_fab_put_signal(comm->fab, r, fep_ep_chdr(m, 0, m->rank),
				  fep_ep_cstage(m, r) + m->choff, FEP_EP_HDR,
				  fep_ep_cctr(m, 0), m->cchunks);
}

static int lie_case(fabep_comm_t *comm, int rank, int size, int lie)
{
	fabep_moe_config_t cfg;
	fabep_moe_t *moe = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	struct lie_capture cap;
	struct params p = P(.topk = LIE_TOPK, .experts = LIE_EXPERTS,
			    .max_tokens = LIE_TOKENS, .hidden = 16);
	struct input in;
	char who[32];
	void *y = NULL;
	uint16_t out[LIE_TOKENS * 16];
	int r, ret, rc = 1;

	fill_cfg(&p, &cfg);
	gen(&p, size, rank, 1 + lie, &in);
	ret = fabep_moe_create(comm, &cfg, &moe);
	if (ret) {
		fprintf(stderr, "rank %d: %s: create: %s\n", rank, lie_names[lie],
			fabep_strerror(ret));
		goto out;
	}
	snprintf(who, sizeof(who), "rank %d", LIAR_RANK);
	if (lie == LIE_ALLROWS && !moe->place_rows) {  /* no such counts */
		rc = 0;
		goto out;
	}
	if (lie >= LIE_C_COUNT) {  /* a true dispatch first */
		ret = fabep_moe_dispatch(moe, in.x, NULL, in.n, in.ids, in.w, &rv);
		if (ret) {
			fprintf(stderr, "rank %d: %s: dispatch: %s\n", rank,
				lie_names[lie], fabep_strerror(ret));
			goto out;
		}
		y = calloc(rv.rows + 1, 16 * 2);
	}
	if (rank == LIAR_RANK) {
		struct fabep_moe *m = moe;

		for (r = 0; r < size; r++)
			if (r != rank && (ret = lie >= LIE_C_COUNT ?
					  lie_combine(comm, m, lie, r) :
					  lie_dispatch(comm, m, lie, r)))
				goto out;
		/* take in what the others write here */
		ret = lie >= LIE_C_COUNT ?
			fep_comm_wait(comm, "liar", fep_ep_cctr(m, 0),
				      (uint64_t)(size - 1) * m->cchunks,
				      UINT64_MAX, 0, 0) :
			fep_comm_wait(comm, "liar", fep_ep_hctr(m, 0),
				      (uint64_t)(size - 1), UINT64_MAX, 0, 0);
		if (!ret && lie < LIE_C_COUNT) {
			/* the record signals the others' headers announce */
			uint64_t want = 0;
			struct fep_ep_hdr h;

			for (r = 0; r < size; r++) {
				if (r == rank)
					continue;
				memcpy(&h, fep_heap_at(comm->fab, fep_ep_dhdr(m, 0, r)),
				       sizeof(h));
				want += h.chunks;
			}
			ret = fep_comm_wait(comm, "liar", fep_ep_dctr(m, 0),
					    want, UINT64_MAX, 0, 0);
		}
		if (ret)
			goto out;
	} else {
		lie_capture_begin(&cap);
		ret = lie >= LIE_C_COUNT ?
			fabep_moe_combine(moe, y, 16, 0, out, 16, NULL, NULL) :
			fabep_moe_dispatch(moe, in.x, NULL, in.n, in.ids, in.w, &rv);
		if (!lie_capture_end(&cap, who, lie_logs[lie]) ||
		    ret != -FABEP_ERR_PROTOCOL) {
			fprintf(stderr, "rank %d: lie \"%s\" gave %d (%s), want %d\n",
				rank, lie_names[lie], ret, fabep_strerror(ret),
				-FABEP_ERR_PROTOCOL);
			goto out;
		}
	}
	rc = 0;
out:
	if (fabep_barrier(comm))
		rc = 1;
	fabep_moe_destroy(moe);
	free_input(&in);
	free(y);
	return rc;
}

static int liar_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_moe_config_t cfg;
	struct params p = P(.topk = LIE_TOPK, .experts = LIE_EXPERTS,
			    .max_tokens = LIE_TOKENS, .hidden = 16);
	int lie, rc = 0, ret;

	(void)arg;
	fill_cfg(&p, &cfg);
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 10000;
	a.heap_size = 2 * fabep_moe_heap_bytes(&cfg, size) + (1u << 20);
	ret = fabep_comm_create(&a, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: fabep_comm_create: %s\n", rank,
			fabep_strerror(ret));
		return 1;
	}
	for (lie = 0; lie < LIE_N && !rc; lie++)
		rc = lie_case(comm, rank, size, lie);
	ret = fabep_comm_destroy(comm);
	return rc || ret;
}

FEP_TEST_RANKS_CASE(shm3_lying_peer, "shm", 3, 120, liar_rank, NULL)

/* Unknown config flags: no heap size, and fabep_moe_timing's NULL checks. */
START_TEST(bad_flags)
{
	fabep_moe_config_t c;
	fabep_moe_timing_t t = { .size = sizeof(t) };

	fabep_moe_config_init(&c);
	c.num_experts = 4;
	c.top_k = 2;
	c.hidden = 16;
	c.max_tokens = 8;
	ck_assert_uint_gt(fabep_moe_heap_bytes(&c, 2), 0);
	c.flags = FABEP_MOE_ZERO_COPY;
	ck_assert_uint_gt(fabep_moe_heap_bytes(&c, 2), 0);
	c.flags = 0x100;
	ck_assert_uint_eq(fabep_moe_heap_bytes(&c, 2), 0);
	ck_assert_int_eq(fabep_moe_timing(NULL, &t), -EINVAL);
	/* FABEP_MOE_COMBINE_ROWS: its three values, and nothing else */
	c.flags = 0;
	setenv("FABEP_MOE_COMBINE_ROWS", "fit", 1);
	ck_assert_uint_gt(fabep_moe_heap_bytes(&c, 2), 0);
	setenv("FABEP_MOE_COMBINE_ROWS", "never", 1);
	ck_assert_uint_gt(fabep_moe_heap_bytes(&c, 2), 0);
	setenv("FABEP_MOE_COMBINE_ROWS", "always", 1);
	ck_assert_uint_eq(fabep_moe_heap_bytes(&c, 2), 0);
	unsetenv("FABEP_MOE_COMBINE_ROWS");
	/* FABEP_MOE_LANES: its three values, the heap unchanged, and
	 * nothing else */
	{
		size_t on = fabep_moe_heap_bytes(&c, 2);

		setenv("FABEP_MOE_LANES", "always", 1);
		ck_assert_uint_eq(fabep_moe_heap_bytes(&c, 2), on);
		setenv("FABEP_MOE_LANES", "never", 1);
		ck_assert_uint_eq(fabep_moe_heap_bytes(&c, 2), on);
		setenv("FABEP_MOE_LANES", "fit", 1);
		ck_assert_uint_eq(fabep_moe_heap_bytes(&c, 2), 0);
		unsetenv("FABEP_MOE_LANES");
	}
	/* FABEP_MOE_PLACE: never takes no placed region, always the same
	 * as auto, nothing else */
	{
		size_t on = fabep_moe_heap_bytes(&c, 2);

		setenv("FABEP_MOE_PLACE", "never", 1);
		ck_assert_uint_lt(fabep_moe_heap_bytes(&c, 2), on);
		ck_assert_uint_gt(fabep_moe_heap_bytes(&c, 2), 0);
		setenv("FABEP_MOE_PLACE", "always", 1);
		ck_assert_uint_eq(fabep_moe_heap_bytes(&c, 2), on);
		setenv("FABEP_MOE_PLACE", "fit", 1);
		ck_assert_uint_eq(fabep_moe_heap_bytes(&c, 2), 0);
		unsetenv("FABEP_MOE_PLACE");
	}
}
END_TEST

/* FEP_EP_ONLY=substring runs only the tests whose names contain it. */
#define ADD(tc, t)                                                     \
	do {                                                           \
		const char *only_ = getenv("FEP_EP_ONLY");             \
		if (!only_ || strstr(#t, only_))                       \
			tcase_add_test(tc, t);                         \
	} while (0)

static Suite *ep_suite(void)
{
	Suite *s = suite_create("ep");
	TCase *tc = tcase_create("ep");

	tcase_set_timeout(tc, 180);
	ADD(tc, one_rank);
	ADD(tc, shm2_bf16_many);
	ADD(tc, shm3_fp32_neg);
	ADD(tc, shm4_one_expert);
	ADD(tc, shm4_zero);
	ADD(tc, shm3_zero_null);
	ADD(tc, shm8_random);
	ADD(tc, shm2_top1_h1);
	ADD(tc, shm2_fp8_tok);
	ADD(tc, shm3_fp8_block);
	ADD(tc, shm2_fp8_pre);
	ADD(tc, shm2_big_2880);
	ADD(tc, shm2_big_7168);
	ADD(tc, shm3_split_backward);
	ADD(tc, shm2_outstanding);
	ADD(tc, shm3_chunks);
	ADD(tc, shm4_chunks_fp8);
	ADD(tc, shm2_chunks_zero);
	ADD(tc, shm4_gather_stage);
	ADD(tc, shm4_gather_chunks);
	ADD(tc, shm3_gather_many);
	ADD(tc, tcp3_chunks);
	ADD(tc, sb_shm3_bf16);
	ADD(tc, sb_shm2_fp32_zc);
	ADD(tc, sb_shm4_pre);
	ADD(tc, sb_shm2_fp8);
	ADD(tc, sb_shm2_big);
	ADD(tc, shm3_early_copy);
	ADD(tc, zc_shm4_early);
	ADD(tc, bad_flags);
	ADD(tc, fused_shm2);
	ADD(tc, fused_shm3_fp32);
	ADD(tc, fused_tcp2);
	ADD(tc, rows_shm3_split);
	ADD(tc, rows_shm4_ld);
	ADD(tc, rows_shm4_ld_fused);
	ADD(tc, rows_shm3_fused);
	ADD(tc, rows_shm3_chunks_fp8);
	ADD(tc, rows_cma_chan_shm4_zc);
	ADD(tc, rows_tcp3);
	ADD(tc, rows_never_shm3);
	ADD(tc, rows_auto_shm3_one_token);
	ADD(tc, place_shm3_split);
	ADD(tc, place_shm3_rows);
	ADD(tc, place_shm3_dup);
	ADD(tc, place_shm3_fp8_block);
	ADD(tc, place_shm3_fp8_pre_rows);
	ADD(tc, place_shm4_fp8_tok);
	ADD(tc, place_shm4_chunks);
	ADD(tc, place_tcp3_delivery);
	ADD(tc, place_shm3_refuse);
	ADD(tc, place_shm3_full);
	ADD(tc, place_shm4_writes);
	ADD(tc, place_never_shm3);
	ADD(tc, place_auto_shm3_one);
	ADD(tc, place_auto_shm3_spread);
	ADD(tc, place_auto_shm3_fp8);
	ADD(tc, place_auto_shm2_dense);
	ADD(tc, place_auto_shm3_crowded);
	ADD(tc, place_auto_shm3_few);
	ADD(tc, place_auto_shm3_idle);
	ADD(tc, keys_tcp3);
	ADD(tc, keys_tcp3_chan);
	ADD(tc, keys_tcp3_place_delivery);
	ADD(tc, keys_tcp2_delivery);
	ADD(tc, keys_sockets2);
	ADD(tc, msg4k_shm3_cqdata);
	ADD(tc, msg4k_shm3_cma_place);
	ADD(tc, msg4k_tcp3);
	ADD(tc, msg4k_tcp2_delivery_fp8);
	ADD(tc, msg4k_shm2_delivery_fp8);
	ADD(tc, cq4_tcp3);
	ADD(tc, cq4_shm3_cqdata);
	ADD(tc, cq4_shm4_cma);
	ADD(tc, cq4_shm2_slots);
	ADD(tc, iov1_tcp3);
	ADD(tc, iov2_tcp3_chunks);
	ADD(tc, iov1_shm4_cma_place);
	ADD(tc, iov1_shm3_delivery_gather);
	ADD(tc, mrl_rows_shm3_split);
	ADD(tc, mrl_rows_tcp3);
	ADD(tc, mrl_rows_shm4_ld_fused);
	ADD(tc, mrl_lanes_shm3_place_rows);
	ADD(tc, mrl_sb_shm3_fp8_zc);
	ADD(tc, mrl_place_tcp3_delivery);
	ADD(tc, zc_one_rank);
	ADD(tc, zc_shm2_bf16);
	ADD(tc, zc_shm3_fp32_neg_split);
	ADD(tc, zc_shm4_fp8_block);
	ADD(tc, zc_shm2_fp8_pre);
	ADD(tc, zc_shm2_big_7168);
	ADD(tc, chan_shm2_big);
	ADD(tc, chan_shm3_fp8_zc);
	ADD(tc, chan_tcp2_chunks);
	ADD(tc, sender_copy_shm3);
	ADD(tc, cma_chan_shm4);
	ADD(tc, cma_chan_shm3_fused);
	ADD(tc, lanes_shm4);
	ADD(tc, cma_slices_shm4);
	ADD(tc, lanes_shm3_place_rows);
	ADD(tc, lanes_always_shm4_small);
	ADD(tc, lanes_never_shm4);
	ADD(tc, zc_shm2_fp8_tok);
	ADD(tc, zc_shm2_outstanding);
	ADD(tc, zc_tcp2_fp8);
	ADD(tc, bad_range);
	ADD(tc, bad_too_many);
	ADD(tc, bad_null);
	ADD(tc, mismatch);
	ADD(tc, mismatch_chunk);
	ADD(tc, mismatch_place);
	ADD(tc, heap_full);
	ADD(tc, tcp3_random);
	ADD(tc, tcp2_fp8);
	ADD(tc, tcp2_bad);
	ADD(tc, refuse_shm3);
	ADD(tc, refuse_shm2_one_set);
	ADD(tc, refuse_tcp3_chunks);
	ADD(tc, sockets2_small);
	ADD(tc, cancel_shm3);
	ADD(tc, cancel_shm4_fp32_tok);
	ADD(tc, shm3_noweights);
	ADD(tc, shm2_noweights_top5);
	ADD(tc, shm5_top7);
	ADD(tc, shm6_top7_fp8);
	ADD(tc, shm7_top7_fp32);
	ADD(tc, shm3_dup);
	ADD(tc, zc_shm2_dup_fp8);
	ADD(tc, pre_shm2_token);
	ADD(tc, pre_shm3_b128);
	ADD(tc, shm2_bf16_fp32);
	ADD(tc, shm3_fp32_bf16);
	suite_add_tcase(s, tc);
	/* the run schedule alone (no ranks) */
	tc = tcase_create("chunks");
	ADD(tc, ready_hlast);
	ADD(tc, ready_head);
	suite_add_tcase(s, tc);
	/* a sender's rows leave before its call returns (tcp) */
	tc = tcase_create("drain");
	tcase_set_timeout(tc, 180);
	ADD(tc, tcp2_drain);
	suite_add_tcase(s, tc);
	/* handles' heap space given back and reused */
	tc = tcase_create("reuse");
	tcase_set_timeout(tc, 180);
	ADD(tc, shm2_heap_reuse);
	ADD(tc, shm3_lying_peer);
	suite_add_tcase(s, tc);
	/* the received rows in huge pages */
	tc = tcase_create("pages");
	tcase_set_timeout(tc, 120);
	ADD(tc, shm2_recv_huge);
	suite_add_tcase(s, tc);
	/* every strategy of every provider */
	tc = tcase_create("signals");
	tcase_set_timeout(tc, 150);
	fep_test_add_signal_cases(tc, moe);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return fep_test_run_suite(ep_suite());
}
