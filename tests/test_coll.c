/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_coll.c - allreduce, allreduce + RMSNorm and allreduce + RMSNorm +
 * FP8 with forked ranks on shm, tcp, sockets, udp and net.
 *
 * Every rank generates every rank's input (deterministic per call), so it
 * computes the result in double precision by itself and compares:
 *   sum          within the rounding of the result to the dtype
 *   rmsnorm      within a few bf16 / fp32 ulps of the double reference
 *   FP8          the dequantized value within one FP8 step of the
 *                reference (after the scale_ub saturation), the scale
 *                within 2^-6 of max|y| / 448 (clamped)
 *   residual     the new residual within the dtype's rounding of
 *                sum + residual
 * and RMSNorm and FP8 outputs, scales and residuals bitwise equal to the
 * scalar reference kernels run on the whole input in one process (the
 * tolerances above bound that reference; the bits pin the library to it,
 * so a rounding that truncates fails here), and every rank folds its
 * outputs into a hash kept in shared memory, so the parent checks that
 * the outputs are bitwise equal on every rank.
 * Both paths are forced (FABEP_AR_ONESTAGE_MAX=0 / 1G) and automatic;
 * back-to-back runs make hundreds of calls with fresh data each, mixing
 * paths, ops and shapes, so a stale slot would show.
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fabep.h"
#include "harness.h"
#include "coll/coll.h"
#include "kernels/kernels.h"

enum { OP_SUM = 0, OP_NORM = 1, OP_FP8 = 2 };

struct ar_case {
	size_t rows, cols;
	int op;
	int res;        /* with a residual */
	float woff;
	float ub;       /* scale_ub */
	int inplace;    /* in == out (SUM, NORM) */
};

struct ar_run {
	const char *prov;
	fabep_ar_dtype_t dt;
	const char *os_max;   /* FABEP_AR_ONESTAGE_MAX, NULL: unset */
	const char *hv_max;   /* FABEP_AR_HALVING_MAX, NULL: unset */
	size_t max_rows, max_cols;
	const struct ar_case *cases;
	int ncases;
	int repeat;
	int threads;
	int threads0;         /* rank 0's threads, where not 0 */
	bool copies;          /* phase 1 staged and the results copied, not
				 written from the input and read (coll.h) */
	bool slices;          /* large puts must have gone in slices over the
				 channels (cma_slices) */
	bool mr_local;        /* as if the provider needed registered local
				 buffers (FI_MR_LOCAL, as verbs and efa do) */
	bool cq4;             /* 4 bytes of CQ data (verbs, efa), the handle
				 behind a block past the 128 MiB they name */
	bool keys;            /* each rank's heap under a key of its own, as
				 verbs' and efa's provider keys are */
	size_t msg_max;       /* the largest message, below the provider's */
};


/* One hash per rank, in memory shared with the parent. */
static uint64_t *g_hash;

static void share_init(void)
{
	if (!g_hash) {
		g_hash = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		ck_assert(g_hash != MAP_FAILED);
	}
	memset(g_hash, 0, 4096);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		h = (h ^ *b++) * 0x100000001b3ull;
	return h;
}

/* ---- independent scalar conversions (not the library's) ---- */

static uint16_t to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static double from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static double e4m3_value(uint8_t q)
{
	int s = q >> 7, e = (q >> 3) & 15, m = q & 7;
	double v;

	if ((q & 0x7f) == 0x7f)
		return NAN;
	v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
	return s ? -v : v;
}

/* One FP8 step at magnitude v (in units of the scale). */
static double e4m3_step(double v)
{
	if (v < ldexp(1.0, -6))
		return ldexp(1.0, -9);
	if (v >= 448)
		return 32;
	return ldexp(1.0, (int)floor(log2(v)) - 3);
}

/* Values of dtype dt at p[i]. */
static double ld(const void *p, fabep_ar_dtype_t dt, size_t i)
{
	return dt == FABEP_AR_BF16 ? from_bf16(((const uint16_t *)p)[i])
				   : (double)((const float *)p)[i];
}

static void fill(void *p, fabep_ar_dtype_t dt, size_t n, uint64_t seed,
		 double lo, double hi)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
	size_t i;

	fep_test_rand(&s);
	for (i = 0; i < n; i++) {
		double u = (double)(fep_test_rand(&s) >> 11) / 9007199254740992.0;
		float v = (float)(lo + (hi - lo) * u);

		if (dt == FABEP_AR_BF16)
			((uint16_t *)p)[i] = to_bf16(v);
		else
			((float *)p)[i] = v;
	}
}

#define FAILF(...)                                                    \
	do {                                                          \
		fprintf(stderr, "rank %d: ", rank);                   \
		fprintf(stderr, __VA_ARGS__);                         \
		fputc('\n', stderr);                                  \
		return 1;                                             \
	} while (0)

static int make_comm(const char *prov, size_t heap, int threads,
		     fabep_comm_t **comm)
{
	fabep_comm_attr_t a;

	fabep_comm_attr_init(&a);
	a.heap_size = heap;
	a.threads = threads;
	a.timeout_ms = 20000;
	return fabep_comm_create(&a, comm);
}

/* Create; 77 = skip (sockets warm-up timed out). */
static int open_comm(const struct ar_run *t, int rank, size_t heap,
		     fabep_comm_t **comm)
{
	int th = rank == 0 && t->threads0 ? t->threads0 : t->threads;
	int ret;

	fep_test_emulate(rank, t->mr_local, t->keys, t->msg_max, 0);
	if (t->cq4) {
		fep_test_cq4();
		heap += FEP_TEST_CQ4_FILLER;
	}
	ret = make_comm(t->prov, heap, th ? th : 1, comm);
	if (!ret && t->cq4 && fep_test_cq4_filler(*comm, rank))
		return 1;

	if (ret == -ETIMEDOUT && !strcmp(t->prov, "sockets")) {
		fprintf(stderr, "SKIP: rank %d: fabep_comm_create on sockets timed "
			"out (known intermittent warm-up failure)\n", rank);
		return 77;
	}
	if (ret) {
		fprintf(stderr, "rank %d: fabep_comm_create: %s\n", rank,
			fabep_strerror(ret));
		return 1;
	}
	return 0;
}

static const char *op_name(int op)
{
	return op == OP_SUM ? "allreduce" : op == OP_NORM ? "rmsnorm" : "rmsnorm_fp8";
}

/* The sums of the log-step path, in its order, in plain C: fp32
 * throughout, x_j + x_(M+j) for the ranks past the largest power of two
 * M, then a tree over 0..M-1 (pairs, then pairs of pairs), each sum
 * with the lower ranks' partial first; rounded to the dtype once. */
static void tree_sum(void **ins, int size, fep_k_dtype_t kdt, size_t n,
		     void *out)
{
	int M = 1, j, w;
	float p[64];
	size_t i;

	while (M * 2 <= size)
		M *= 2;
	for (i = 0; i < n; i++) {
		for (j = 0; j < size; j++)
			p[j] = kdt == FEP_K_BF16 ?
				(float)from_bf16(((const uint16_t *)ins[j])[i]) :
				((const float *)ins[j])[i];
		for (j = 0; j + M < size; j++)
			p[j] = p[j] + p[M + j];
		for (w = 1; w < M; w *= 2)
			for (j = 0; j < M; j += 2 * w)
				p[j] = p[j] + p[j + w];
		if (kdt == FEP_K_BF16)
			((uint16_t *)out)[i] = to_bf16(p[0]);
		else
			((float *)out)[i] = p[0];
	}
}

/* The single-process result of the scalar reference kernels (the
 * inputs summed in rank order, or where the call took the log-step
 * path in its tree order, then RMSNorm with the residual, then FP8 with
 * one scale per row), which every rank must return bit for bit: the
 * vector kernels are bitwise equal to these, and the reduction order is
 * the rank order on the one- and two-stage paths. */
static int check_exact(int rank, int size, const struct ar_run *t,
		       const struct ar_case *c, bool logstep, void **ins,
		       const void *res0,
		       const void *res, const void *gamma, const void *out,
		       const float *scales, const fabep_rmsnorm_params_t *p)
{
	fep_k_dtype_t kdt = t->dt == FABEP_AR_BF16 ? FEP_K_BF16 : FEP_K_F32;
	size_t es = fep_k_dtype_size(kdt), n = c->rows * c->cols;
	size_t os = c->op == OP_FP8 ? 1 : es, i;
	void *sum = malloc(n * es), *rres = malloc(n * es), *rout = malloc(n * os);
	float *g32 = malloc(c->cols * 4), *rsc = malloc(c->rows * 4);
	fep_k_sum_args_t sa = { (const void *const *)ins, size, kdt, sum, 0 };
	fep_k_rmsnorm_args_t na;
	int bad = 0;

	if (!sum || !rres || !rout || !g32 || !rsc) {
		free(sum); free(rres); free(rout); free(g32); free(rsc);
		FAILF("check_exact: out of memory");
	}
	if (logstep)
		tree_sum(ins, size, kdt, n, sum);
	else
		fep_k_sum_scalar(&sa, 0, n);
	for (i = 0; i < c->cols; i++)
		g32[i] = kdt == FEP_K_BF16 ? from_bf16(((const uint16_t *)gamma)[i])
					   : ((const float *)gamma)[i];
	memcpy(rres, res0, n * es);
	memset(&na, 0, sizeof(na));
	na.in = sum;
	na.in_dt = kdt;
	na.ld_in = na.ld_res = na.ld_out = na.cols = c->cols;
	na.residual = c->res ? rres : NULL;
	na.gamma = g32;
	na.eps = p->eps;
	na.weight_offset = p->weight_offset;
	na.out = rout;
	na.out_dt = c->op == OP_FP8 ? FEP_K_FP8 : kdt;
	na.scales = rsc;
	na.ld_scales = 1;
	na.scale_ub = c->op == OP_FP8 ? p->scale_ub : 0.0f;
	fep_k_rmsnorm_scalar(&na, 0, c->rows);
	for (i = 0; i < n && !bad; i++)
		if (memcmp((const char *)out + i * os, (char *)rout + i * os, os)) {
			fprintf(stderr, "rank %d: %s %zu x %zu (ub %g, woff %g%s): "
				"[%zu][%zu] differs from the scalar reference "
				"(0x%x, want 0x%x)\n", rank, op_name(c->op), c->rows,
				c->cols, (double)c->ub, (double)c->woff,
				c->res ? ", residual" : "", i / c->cols, i % c->cols,
				os == 1 ? ((const uint8_t *)out)[i] : os == 2 ?
				((const uint16_t *)out)[i] : ((const uint32_t *)out)[i],
				os == 1 ? ((uint8_t *)rout)[i] : os == 2 ?
				((uint16_t *)rout)[i] : ((uint32_t *)rout)[i]);
			bad = 1;
		}
	if (!bad && c->op == OP_FP8 && memcmp(scales, rsc, c->rows * 4)) {
		fprintf(stderr, "rank %d: rmsnorm_fp8 %zu x %zu: scales differ "
			"from the scalar reference\n", rank, c->rows, c->cols);
		bad = 1;
	}
	if (!bad && c->res && memcmp(res, rres, n * es)) {
		fprintf(stderr, "rank %d: %s %zu x %zu: residual differs from "
			"the scalar reference\n", rank, op_name(c->op), c->rows,
			c->cols);
		bad = 1;
	}
	free(sum); free(rres); free(rout); free(g32); free(rsc);
	return bad;
}

/* One call of one case, checked against the double reference and the
 * scalar kernels' bits. */
static int check_case(int rank, int size, fabep_allreduce_t *ar,
		      const struct ar_run *t, const struct ar_case *c,
		      uint64_t seed, void **ins, void *res0, void *res,
		      void *gamma, void *out, float *scales, double *hrow,
		      double *herr, uint64_t *hash)
{
	fabep_ar_dtype_t dt = t->dt;
	size_t es = dt == FABEP_AR_BF16 ? 2 : 4, n = c->rows * c->cols;
	size_t r, j;
	const void *in;
	fabep_rmsnorm_params_t p;
	double eps = 1e-5;
	size_t os;
	char want;
	bool logstep, half;
	int k, ret;

	for (k = 0; k < size; k++)
		fill(ins[k], dt, n, seed * 64 + (uint64_t)k, -2.0, 2.0);
	fill(gamma, dt, c->cols, seed * 64 + 63, c->woff ? -0.5 : 0.5,
	     c->woff ? 0.5 : 1.5);
	fill(res0, dt, n, seed * 64 + 62, -1.0, 1.0);
	memcpy(res, res0, n * es);
	in = ins[rank];
	fabep_rmsnorm_params_init(&p);
	p.gamma = gamma;
	p.eps = (float)eps;
	p.weight_offset = c->woff;
	p.scale_ub = c->ub;
	p.residual = c->res ? res : NULL;
	if (c->inplace) {
		memcpy(out, in, n * es);
		in = out;
	}
	if (c->op == OP_SUM)
		ret = fabep_allreduce(ar, in, out, c->rows, c->cols);
	else if (c->op == OP_NORM)
		ret = fabep_allreduce_rmsnorm(ar, in, c->rows, c->cols, &p, out);
	else
		ret = fabep_allreduce_rmsnorm_fp8(ar, in, c->rows, c->cols, &p,
						  out, scales);
	if (ret)
		FAILF("%s %zu x %zu: %s", op_name(c->op), c->rows, c->cols,
		      fabep_strerror(ret));
	/* the log-step path (allreduce.c): from 4 ranks, below the
	 * threshold, which the plain sum has of its own on 2 ranks */
	os = c->op == OP_SUM ? fabep_allreduce_sum_onestage_max(ar) :
			       fabep_allreduce_onestage_max(ar);
	/* and above the threshold, up to the halving mode's limit, that
	 * path's halving mode */
	half = ar->lay.rd_m && n * es > os &&
	       n * es <= (c->op == OP_SUM ? ar->hv_sum : ar->hv_max);
	logstep = size >= 4 && (n * es <= os || half);
	want = n * es <= os || half ? (logstep ? 'l' : 'o') : 't';
	if (size > 1 && ar->path != want)
		FAILF("%s %zu x %zu (threshold %zu): took path '%c', not '%c'",
		      op_name(c->op), c->rows, c->cols, os, ar->path, want);
	if (c->op != OP_SUM &&
	    check_exact(rank, size, t, c, logstep, ins, res0, res, gamma, out,
			scales, &p))
		return 1;

	for (r = 0; r < c->rows; r++) {
		double ss = 0, inv, amax = 0, sc = 0;
		size_t jmax = 0;

		/* h = sum (+ residual), in double, with the roundings of the
		 * documented semantics: the sum is a tensor of the dtype, and
		 * so is h = sum + residual */
		for (j = 0; j < c->cols; j++) {
			size_t i = r * c->cols + j;
			double s = 0, sabs = 0, h, tol, sr;

			for (k = 0; k < size; k++) {
				s += ld(ins[k], dt, i);
				sabs += fabs(ld(ins[k], dt, i));
			}
			sr = dt == FABEP_AR_BF16 ? from_bf16(to_bf16((float)s)) : s;
			h = sr;
			if (c->res)
				h = dt == FABEP_AR_BF16 ?
					from_bf16(to_bf16((float)sr + (float)ld(res0, dt, i))) :
					sr + ld(res0, dt, i);
			hrow[j] = h;
			ss += h * h;
			/* what the dtype rounding allows (fp32: the fp32 sums) */
			tol = dt == FABEP_AR_BF16 ? ldexp(fabs(s) + fabs(h), -8)
						  : ldexp(sabs + fabs(h) + 1, -21);
			herr[j] = dt == FABEP_AR_BF16 ? ldexp(fabs(h), -12)
						      : ldexp(sabs + fabs(h) + 1, -21);
			if (c->op == OP_SUM && fabs(ld(out, dt, i) - s) > tol)
				FAILF("allreduce %zu x %zu: [%zu][%zu] = %.9g, want %.9g",
				      c->rows, c->cols, r, j, ld(out, dt, i), s);
			if (c->op != OP_SUM && c->res &&
			    fabs(ld(res, dt, i) - h) > tol)
				FAILF("%s %zu x %zu: residual [%zu][%zu] = %.9g, want %.9g",
				      op_name(c->op), c->rows, c->cols, r, j,
				      ld(res, dt, i), h);
		}
		if (c->op == OP_SUM)
			continue;
		inv = 1.0 / sqrt(ss / (double)c->cols + eps);
		for (j = 0; j < c->cols; j++) {
			double g = fabs(ld(gamma, dt, j) + c->woff);

			herr[j] = 2 * herr[j] * inv * g;
			hrow[j] = hrow[j] * inv * (ld(gamma, dt, j) + c->woff);
			if (fabs(hrow[j]) > amax) {
				amax = fabs(hrow[j]);
				jmax = j;
			}
		}
		if (c->op == OP_NORM) {
			for (j = 0; j < c->cols; j++) {
				double y = hrow[j], got = ld(out, dt, r * c->cols + j);
				double tol = (dt == FABEP_AR_BF16 ? ldexp(fabs(y), -7)
								  : 1e-6 * fabs(y)) + herr[j];

				if (!(fabs(got - y) <= tol))
					FAILF("rmsnorm %zu x %zu: [%zu][%zu] = %.9g, want %.9g",
					      c->rows, c->cols, r, j, got, y);
			}
			continue;
		}
		sc = amax / 448.0;
		if (sc == 0)
			sc = 1;
		if (c->ub > 0 && sc > c->ub)
			sc = c->ub;
		if (!(fabs(scales[r] - sc) <= ldexp(sc, -10) +
						 (amax > 0 ? sc * herr[jmax] / amax : 0)))
			FAILF("fp8 %zu x %zu: scale of row %zu = %.9g, want %.9g",
			      c->rows, c->cols, r, (double)scales[r], sc);
		for (j = 0; j < c->cols; j++) {
			double s = scales[r];
			double y = fmax(-448 * s, fmin(448 * s, hrow[j]));
			double got = e4m3_value(((uint8_t *)out)[r * c->cols + j]) * s;
			double tol = e4m3_step(fmax(fabs(y), fabs(got)) / s) * s +
				     ldexp(fabs(y), -16) + herr[j];

			if (!(fabs(got - y) <= tol))
				FAILF("fp8 %zu x %zu (ub %g, woff %g%s): [%zu][%zu] = %.9g "
				      "(code 0x%02x, scale %g), want %.9g", c->rows,
				      c->cols, (double)c->ub, (double)c->woff,
				      c->res ? ", residual" : "", r, j, got,
				      ((uint8_t *)out)[r * c->cols + j], s, y);
		}
	}
	*hash = fnv(*hash, out, c->op == OP_FP8 ? n : n * es);
	if (c->op == OP_FP8)
		*hash = fnv(*hash, scales, c->rows * 4);
	if (c->res)
		*hash = fnv(*hash, res, n * es);
	return 0;
}

static int run_rank(int rank, int size, void *arg)
{
	const struct ar_run *t = arg;
	size_t es = t->dt == FABEP_AR_BF16 ? 2 : 4;
	size_t n = t->max_rows * t->max_cols, heap, os_sum;
	fabep_comm_t *comm;
	fabep_allreduce_t *ar;
	void *ins[8], *res0, *res, *gamma, *out;
	float *scales;
	double *hrow;
	uint64_t hash = 0xcbf29ce484222325ull;
	int i, k, rep, ret;

	if (t->os_max)
		setenv("FABEP_AR_ONESTAGE_MAX", t->os_max, 1);
	else
		unsetenv("FABEP_AR_ONESTAGE_MAX");
	if (t->hv_max)
		setenv("FABEP_AR_HALVING_MAX", t->hv_max, 1);
	else
		unsetenv("FABEP_AR_HALVING_MAX");
	heap = fabep_allreduce_heap_bytes(t->max_rows, t->max_cols, t->dt, size);
	if (!heap)
		FAILF("fabep_allreduce_heap_bytes returned 0");
	ret = open_comm(t, rank, heap + (1u << 20), &comm);
	if (ret)
		return ret;
	ret = fabep_allreduce_create(comm, t->max_rows, t->max_cols, t->dt, &ar);
	if (ret)
		FAILF("fabep_allreduce_create: %s", fabep_strerror(ret));
	if (t->copies)
		ar->direct = ar->rd = false;
	if (t->mr_local && (ar->direct || ar->rd))
		FAILF("FI_MR_LOCAL, but the handle writes from the input (%d) "
		      "or reads into the output (%d)", ar->direct, ar->rd);
	/* the plain sum's own threshold: 1 MiB on 2 ranks, unless set */
	os_sum = t->os_max || size != 2 ? fabep_allreduce_onestage_max(ar) :
		 (size_t)1 << 20;
	if (fabep_allreduce_sum_onestage_max(ar) != os_sum)
		FAILF("the plain sum's threshold is %zu, not %zu",
		      fabep_allreduce_sum_onestage_max(ar), os_sum);
	for (k = 0; k < size; k++)
		ins[k] = malloc(n * es);
	res0 = malloc(n * es);
	res = malloc(n * es);
	gamma = malloc(t->max_cols * es);
	out = malloc(n * es);
	scales = malloc(t->max_rows * sizeof(float));
	hrow = malloc(2 * t->max_cols * sizeof(double));
	for (rep = 0; rep < t->repeat; rep++)
		for (i = 0; i < t->ncases; i++) {
			ret = check_case(rank, size, ar, t, &t->cases[i],
					 (uint64_t)rep * 1000 + (uint64_t)i, ins, res0,
					 res, gamma, out, scales, hrow,
					 hrow + t->max_cols, &hash);
			if (ret) {
				fprintf(stderr, "rank %d: (call %d of case %d, %s, "
					"threshold %zu)\n", rank, rep, i, t->prov,
					fabep_allreduce_onestage_max(ar));
				return ret;
			}
		}
	g_hash[rank] = hash;
	if (t->slices && (!comm->fab->cma_slices || !comm->fab->cma_sliced)) {
		fprintf(stderr, "rank %d: cma_slices %d, %llu puts sliced\n", rank,
			comm->fab->cma_slices,
			(unsigned long long)comm->fab->cma_sliced);
		return 1;
	}
	fabep_allreduce_destroy(ar);
	ret = fabep_comm_destroy(comm);
	for (k = 0; k < size; k++)
		free(ins[k]);
	free(res0);
	free(res);
	free(gamma);
	free(out);
	free(scales);
	free(hrow);
	return ret ? 1 : 0;
}

static void run(const char *prov, int size, struct ar_run *t)
{
	int status[8], r;

	fep_test_on_provider(prov);
	t->prov = prov;
	share_init();
	fep_test_run_ranks_status(size, 120, run_rank, t, status);
	if (status[0] == 77)
		fep_test_skip("%s: communicator creation timed out", prov);
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == 0, "%s, %d ranks, threshold %s: rank %d "
			      "exited %d: %s", prov, size, t->os_max ? t->os_max : "auto",
			      r, status[r], fep_test_rank_said(r));
	for (r = 1; r < size; r++)
		ck_assert_msg(g_hash[r] == g_hash[0], "%s, %d ranks: outputs of "
			      "rank %d differ from rank 0's", prov, size, r);
}

/* ---- the cases ---- */

#define ALLOPS(rows, cols)                                            \
	{ rows, cols, OP_SUM, 0, 0, 0, 0 },                           \
	{ rows, cols, OP_SUM, 0, 0, 0, 1 },                           \
	{ rows, cols, OP_FP8, 0, 0, 0, 0 },                           \
	{ rows, cols, OP_FP8, 1, 1, 0, 0 },                           \
	{ rows, cols, OP_FP8, 1, 0, 0.004f, 0 },                      \
	{ rows, cols, OP_NORM, 0, 1, 0, 1 },                          \
	{ rows, cols, OP_NORM, 1, 0, 0, 0 }

static const struct ar_case wide[] = {
	ALLOPS(1, 7168), ALLOPS(5, 7168), ALLOPS(40, 7168),
};
static const struct ar_case narrow[] = {
	ALLOPS(1, 1), ALLOPS(3, 1), ALLOPS(2000, 1),
	ALLOPS(1, 100), ALLOPS(7, 100), ALLOPS(3000, 100),
};
static const struct ar_case mixed[] = {
	{ 17, 100, OP_FP8, 1, 1, 0, 0 },
	{ 0, 100, OP_SUM, 0, 0, 0, 0 },
	{ 1, 100, OP_SUM, 0, 0, 0, 1 },
	{ 90, 100, OP_FP8, 0, 0, 0, 0 },
	{ 2, 60, OP_NORM, 1, 0, 0, 0 },
	{ 100, 100, OP_SUM, 0, 0, 0, 0 },
	{ 5, 100, OP_FP8, 1, 0, 0.004f, 0 },
	{ 64, 99, OP_NORM, 0, 1, 0, 1 },
};

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void run_cases_as(const char *prov, int size, fabep_ar_dtype_t dt,
			 const char *os_max, const struct ar_case *cases,
			 int ncases, int repeat, bool copies)
{
	struct ar_run t = { .dt = dt, .os_max = os_max, .cases = cases,
			    .ncases = ncases, .repeat = repeat,
			    .threads = fep_test_threads(1), .copies = copies };
	int i;

	for (i = 0; i < ncases; i++) {
		if (cases[i].rows > t.max_rows)
			t.max_rows = cases[i].rows;
		if (cases[i].cols > t.max_cols)
			t.max_cols = cases[i].cols;
	}
	if (size == 2)
		t.threads = 2;
	run(prov, size, &t);
}

static void run_cases(const char *prov, int size, fabep_ar_dtype_t dt,
		      const char *os_max, const struct ar_case *cases, int ncases,
		      int repeat)
{
	run_cases_as(prov, size, dt, os_max, cases, ncases, repeat, false);
}

START_TEST(shm_wide_auto) { run_cases("shm", 2, FABEP_AR_BF16, NULL, wide, N(wide), 1); } END_TEST
START_TEST(shm_wide_two) { run_cases("shm", 3, FABEP_AR_BF16, "0", wide, N(wide), 1); } END_TEST
START_TEST(shm_wide_one) { run_cases("shm", 4, FABEP_AR_BF16, "1G", wide, N(wide), 1); } END_TEST
START_TEST(shm_narrow_auto) { run_cases("shm", 3, FABEP_AR_BF16, NULL, narrow, N(narrow), 1); } END_TEST
START_TEST(shm_narrow_two) { run_cases("shm", 4, FABEP_AR_BF16, "0", narrow, N(narrow), 1); } END_TEST
START_TEST(shm_fp32_two) { run_cases("shm", 2, FABEP_AR_F32, "0", narrow, N(narrow), 1); } END_TEST
START_TEST(shm_fp32_one) { run_cases("shm", 3, FABEP_AR_F32, "1G", mixed, N(mixed), 2); } END_TEST
START_TEST(shm_1rank) { run_cases("shm", 1, FABEP_AR_BF16, NULL, mixed, N(mixed), 2); } END_TEST
START_TEST(shm_8ranks) { run_cases("shm", 8, FABEP_AR_BF16, "2k", mixed, N(mixed), 3); } END_TEST
/* The log-step path (from 4 ranks): with the fold of the ranks past a
 * power of two, mixed with two-stage calls back to back (5 ranks,
 * threshold 4k), every call (7 ranks, fp32), on tcp */
START_TEST(shm_logstep5) { run_cases("shm", 5, FABEP_AR_BF16, "4k", mixed, N(mixed), 6); } END_TEST
START_TEST(shm_logstep7) { run_cases("shm", 7, FABEP_AR_F32, "1G", mixed, N(mixed), 1); } END_TEST
START_TEST(tcp_logstep) { run_cases("tcp", 4, FABEP_AR_BF16, "4k", mixed, N(mixed), 2); } END_TEST
/* The log-step path's halving mode (from 4 ranks, above the threshold
 * up to FABEP_AR_HALVING_MAX): rows of 7168 on 4 ranks, 1 row doubling,
 * 5 and 40 rows halving; on 5 ranks (the fold) back to back with both
 * modes and the two-stage path (fp32 rows of 100: up to 5 doubling, 17
 * halving, from 64 two-stage) */
START_TEST(shm_halving_wide)
{
	struct ar_run t = { .dt = FABEP_AR_BF16, .hv_max = "1M", .cases = wide,
			    .ncases = N(wide), .repeat = 1,
			    .threads = fep_test_threads(1), .max_rows = 40,
			    .max_cols = 7168 };

	run("shm", 4, &t);
}
END_TEST
START_TEST(shm_halving_mix)
{
	struct ar_run t = { .dt = FABEP_AR_F32, .os_max = "2k", .hv_max = "16k",
			    .cases = mixed, .ncases = N(mixed), .repeat = 6,
			    .threads = fep_test_threads(1), .max_rows = 100,
			    .max_cols = 100 };

	run("shm", 5, &t);
}
END_TEST
/* threshold 4k: rows <= 20 of 100 bf16 go one-stage, the rest two-stage */
START_TEST(shm_b2b) { run_cases("shm", 3, FABEP_AR_BF16, "4k", mixed, N(mixed), 40); } END_TEST
/* The staged phase 1 and the copied results, which this machine's shm
 * (fewer than three threads a rank) would not take. */
START_TEST(shm_copies) { run_cases_as("shm", 3, FABEP_AR_F32, "4k", mixed, N(mixed), 2, true); } END_TEST
/* As if the provider needed registered local buffers (FI_MR_LOCAL):
 * phase 1 staged and the results copied, on every path (one-stage,
 * two-stage, log-step, halving), over channels too; every write from
 * outside the heap would fail (-EFAULT) */
START_TEST(mrl_shm)
{
	struct ar_run t = { .dt = FABEP_AR_F32, .os_max = "4k", .cases = mixed,
			    .ncases = N(mixed), .repeat = 2, .threads = 2,
			    .max_rows = 100, .max_cols = 100, .mr_local = true };

	fep_test_use_signal("shm", FABEP_SIGNAL_CMA);
	setenv("FABEP_CHANNELS", "2", 1);
	run("shm", 3, &t);
	t.dt = FABEP_AR_BF16;
	t.hv_max = "16k";
	run("shm", 5, &t);
}
END_TEST
/* 4 bytes of remote CQ data (verbs, efa) and the handle's block past the
 * 128 MiB they name: its counters, in a slot near the heap's start, are
 * still named (one-, two-stage and log-step paths) */
START_TEST(cq4_shm)
{
	struct ar_run t = { .dt = FABEP_AR_BF16, .os_max = "4k", .cases = mixed,
			    .ncases = N(mixed), .repeat = 2, .threads = 1,
			    .max_rows = 100, .max_cols = 100, .cq4 = true };

	fep_test_use_signal("shm", FABEP_SIGNAL_CQDATA);
	run("shm", 5, &t);
}
END_TEST
START_TEST(cq4_tcp)
{
	struct ar_run t = { .dt = FABEP_AR_F32, .os_max = "4k", .cases = mixed,
			    .ncases = N(mixed), .repeat = 2, .threads = 1,
			    .max_rows = 100, .max_cols = 100, .cq4 = true };

	run("tcp", 3, &t);
}
END_TEST
START_TEST(mrl_tcp)
{
	struct ar_run t = { .dt = FABEP_AR_BF16, .os_max = "4k", .cases = mixed,
			    .ncases = N(mixed), .repeat = 2,
			    .threads = fep_test_threads(1), .max_rows = 100,
			    .max_cols = 100, .mr_local = true };

	run("tcp", 4, &t);
}
END_TEST
/* Each rank's heap under its own key (verbs' and efa's provider keys
 * differ between ranks): tcp drops a write whose key is not its
 * target's; every path, with 2 channels on 3 ranks */
START_TEST(keys_tcp)
{
	struct ar_run t = { .dt = FABEP_AR_F32, .os_max = "4k", .cases = mixed,
			    .ncases = N(mixed), .repeat = 2, .threads = 1,
			    .max_rows = 100, .max_cols = 100, .keys = true };

	run("tcp", 5, &t);
	t.dt = FABEP_AR_BF16;
	t.threads = 2;
	setenv("FABEP_CHANNELS", "2", 1);
	run("tcp", 3, &t);
}
END_TEST
/* Messages of at most 4 KiB (a provider's max_msg_size): rows of 1 to
 * 100 fp32 columns and their headers go as several writes, and the
 * results' reads (cma, one endpoint) as several reads, on every path;
 * then over 2 channels, and on tcp */
START_TEST(msg4k)
{
	struct ar_run t = { .dt = FABEP_AR_F32, .os_max = "4k", .cases = mixed,
			    .ncases = N(mixed), .repeat = 2, .threads = 2,
			    .max_rows = 100, .max_cols = 100, .msg_max = 4096 };

	fep_test_use_signal("shm", FABEP_SIGNAL_CMA);
	setenv("FABEP_CHANNELS", "1", 1);
	run("shm", 5, &t);
	setenv("FABEP_CHANNELS", "2", 1);
	run("shm", 3, &t);
	unsetenv("FABEP_CHANNELS");
	unsetenv("FABEP_SIGNAL");
	t.dt = FABEP_AR_BF16;
	t.threads = 1;
	run("tcp", 3, &t);
}
END_TEST
/* cma over channels (each rank's writes from its input, and its
 * signals, on its own channel), the reads on the first */
START_TEST(shm_cma_channels)
{
	fep_test_use_signal("shm", FABEP_SIGNAL_CMA);
	setenv("FABEP_CHANNELS", "3", 1);
	run_cases("shm", 4, FABEP_AR_F32, "4k", mixed, N(mixed), 2);
}
END_TEST
/* cma with a channel per thread and more channels than senders (4 ranks
 * of 4 threads, 4 channels): the large puts go in slices over every
 * channel, with every rank posting to every other at once, which must
 * neither hang nor lose a slice: the two-stage path, then the log-step
 * one, whose rounds' messages are sliced too. */
START_TEST(shm_cma_slices)
{
	struct ar_run t = { .dt = FABEP_AR_F32, .os_max = "0", .cases = wide,
			    .ncases = N(wide), .repeat = 2, .threads = 4,
			    .max_rows = 40, .max_cols = 7168, .slices = true };

	fep_test_use_signal("shm", FABEP_SIGNAL_CMA);
	setenv("FABEP_CHANNELS", "4", 1);
	run("shm", 4, &t);
	t.os_max = "1G";
	t.repeat = 1;
	run("shm", 4, &t);
}
END_TEST
/* Ranks with different thread counts: each rank's own choice of the
 * allgather (reads or written results) must be the same on all. */
START_TEST(shm_uneven_threads)
{
	struct ar_run t = { .dt = FABEP_AR_F32, .os_max = "4k", .cases = mixed,
			    .ncases = N(mixed), .repeat = 2, .threads = 1,
			    .threads0 = 4, .max_rows = 100, .max_cols = 100 };

	run("shm", 3, &t);
}
END_TEST
START_TEST(tcp_auto) { run_cases("tcp", 3, FABEP_AR_BF16, "4k", mixed, N(mixed), 3); } END_TEST
START_TEST(tcp_wide_two) { run_cases("tcp", 2, FABEP_AR_BF16, "0", wide, 7, 1); } END_TEST
START_TEST(sockets_mixed) { run_cases("sockets", 2, FABEP_AR_BF16, "4k", mixed, N(mixed), 1); } END_TEST

/* ---- errors: every rank returns the same code ---- */

struct err_run {
	const char *prov;
	int which;
};

/* Whether out, the sum of err_rank's inputs over rows of 8, is wrong
 * (printed). */
static int err_sum_bad(int rank, int size, const uint16_t *out, size_t rows,
		       const char *what)
{
	for (size_t j = 0; j < rows * 8; j++) {
		double want = 0;

		for (int k = 0; k < size; k++)
			want += (double)(j % 7) + k;
		if (from_bf16(out[j]) != want)
			FAILF("%s: out[%zu] = %g, want %g", what, j,
			      from_bf16(out[j]), want);
	}
	return 0;
}

static int err_rank(int rank, int size, void *arg)
{
	const struct err_run *e = arg;
	struct ar_run t = { .prov = e->prov, .threads = fep_test_threads(1) };
	fabep_comm_t *comm;
	fabep_allreduce_t *ar;
	uint16_t in[64 * 8], out[64 * 8], gamma[8];
	uint8_t q[64 * 8];
	float sc[64];
	fabep_rmsnorm_params_t p = { .size = sizeof(p), .gamma = gamma,
				    .eps = 1e-5f };
	int ret, i;

	unsetenv("FABEP_AR_ONESTAGE_MAX");
	ret = open_comm(&t, rank, 4u << 20, &comm);
	if (ret)
		return ret;
	for (i = 0; i < 64 * 8; i++)
		in[i] = to_bf16((float)(i % 7) + (float)rank);
	for (i = 0; i < 8; i++)
		gamma[i] = to_bf16(1.0f);

	if (e->which == 2) {
		/* rows on one rank past the threshold of 64 bytes (3 rows of
		 * 8 bf16 take the log-step path's doubling mode; 60 take the
		 * two-stage path without the halving mode, else the halving
		 * mode; 65, past the maximum, the two-stage path): every rank
		 * gets the same error, and the handle works on, whether or not
		 * a rank took the two-stage path while the others took the
		 * log-step one (the log-step counters are put back in step).
		 * Last, both modes of the log-step path with different rows
		 * (59 and 60). */
		static const size_t odd[5] = { 60, 65, 60, 65, 59 };
		static const size_t even[5] = { 3, 3, 3, 3, 60 };
		static const char *const hv[5] = { "0", "0", NULL, NULL, NULL };
		static const int want[5] = { -FABEP_ERR_MISMATCH, -EINVAL,
					     -FABEP_ERR_MISMATCH, -EINVAL,
					     -FABEP_ERR_MISMATCH };

		for (i = 0; i < 5; i++) {
			setenv("FABEP_AR_ONESTAGE_MAX", "64", 1);
			if (hv[i])
				setenv("FABEP_AR_HALVING_MAX", hv[i], 1);
			ret = fabep_allreduce_create(comm, 64, 8, FABEP_AR_BF16, &ar);
			unsetenv("FABEP_AR_ONESTAGE_MAX");
			unsetenv("FABEP_AR_HALVING_MAX");
			if (ret)
				FAILF("create: %s", fabep_strerror(ret));
			if ((ret = fabep_allreduce(ar, in, out, 3, 8)) ||
			    (ret = fabep_allreduce(ar, in, out, 60, 8)))
				FAILF("good calls: %s", fabep_strerror(ret));
			if (ar->path != (hv[i] ? 't' : 'l'))
				FAILF("60 rows took path '%c' (halving max %s)",
				      ar->path, hv[i] ? hv[i] : "default");
			ret = fabep_allreduce(ar, in, out, rank == 1 ? odd[i] : even[i], 8);
			if (ret != want[i])
				FAILF("rows %zu on rank 1, %zu on the others: %s",
				      odd[i], even[i], fabep_strerror(ret));
			/* twice: the log-step path's both parities */
			for (int j = 0; j < 2; j++) {
				memset(out, 0, 3 * 8 * sizeof(*out));
				ret = fabep_allreduce(ar, in, out, 3, 8);
				if (ret)
					FAILF("call %d after rows %zu on rank 1, %zu on "
					      "the others: %s", j + 1, odd[i], even[i],
					      fabep_strerror(ret));
				if (err_sum_bad(rank, size, out, 3, "after a mismatch"))
					return 1;
			}
			fabep_allreduce_destroy(ar);
		}
		/* a new handle works, and one that takes its heap block
		 * back after it (the log-step counters start from 0 again) */
		for (i = 0; i < 2; i++) {
			int j;

			/* the first makes three calls (a slot of each parity
			 * left behind from a later call than the first),
			 * the second one */
			ret = fabep_allreduce_create(comm, 64, 8, FABEP_AR_BF16, &ar);
			for (j = 0; !ret && j < 3 - 2 * i; j++)
				ret = fabep_allreduce(ar, in, out, 3, 8);
			if (ret)
				FAILF("a new handle (%d): %s", i, fabep_strerror(ret));
			if (err_sum_bad(rank, size, out, 3, "a new handle"))
				return 1;
			fabep_allreduce_destroy(ar);
		}
		goto done;
	}
	if (e->which == 3) {
		/* 2 ranks, default thresholds: 8 rows of 7168 bf16 (112 KiB)
		 * take the one-stage path in a plain sum and the two-stage
		 * path in a normalizing call, so ranks whose operations
		 * differ take different paths: both must see the mismatch,
		 * and the handle work on for either operation */
		enum { R8 = 8, C = 7168 };
		uint16_t *big = malloc(2 * R8 * C * sizeof(*big)), *bout = big + R8 * C;
		uint16_t *g = malloc(C * sizeof(*g));
		uint8_t *bq = malloc(R8 * C);
		fabep_rmsnorm_params_t bp = p;
		size_t j;

		if (!big || !g || !bq)
			FAILF("out of memory");
		for (j = 0; j < R8 * C; j++)
			big[j] = to_bf16((float)(j % 7) + (float)rank);
		for (j = 0; j < C; j++)
			g[j] = to_bf16(1.0f);
		bp.gamma = g;
		ret = fabep_allreduce_create(comm, 16, C, FABEP_AR_BF16, &ar);
		if (ret)
			FAILF("create: %s", fabep_strerror(ret));
		if (R8 * C * 2 > fabep_allreduce_sum_onestage_max(ar) ||
		    R8 * C * 2 <= fabep_allreduce_onestage_max(ar))
			FAILF("thresholds %zu / %zu do not split 8 rows",
			      fabep_allreduce_onestage_max(ar),
			      fabep_allreduce_sum_onestage_max(ar));
		for (i = 0; i < 2; i++) {
			ret = rank == i ? fabep_allreduce(ar, big, bout, R8, C) :
			      fabep_allreduce_rmsnorm_fp8(ar, big, R8, C, &bp, bq, sc);
			if (ret != -FABEP_ERR_MISMATCH)
				FAILF("sum on rank %d, FP8 on the other: %s", i,
				      fabep_strerror(ret));
			memset(bout, 0, R8 * C * sizeof(*bout));
			ret = fabep_allreduce(ar, big, bout, R8, C);
			if (ret)
				FAILF("a sum after the mismatch: %s",
				      fabep_strerror(ret));
			for (j = 0; j < R8 * C; j++)
				if (from_bf16(bout[j]) != (double)(2 * (j % 7) + 1))
					FAILF("sum after the mismatch: [%zu] = %g, "
					      "want %zu", j, from_bf16(bout[j]),
					      2 * (j % 7) + 1);
			ret = fabep_allreduce_rmsnorm_fp8(ar, big, R8, C, &bp, bq, sc);
			if (ret)
				FAILF("FP8 after the mismatch: %s",
				      fabep_strerror(ret));
		}
		fabep_allreduce_destroy(ar);
		free(big);
		free(g);
		free(bq);
		goto done;
	}
	if (e->which == 4) {
		/* 4 ranks, default thresholds, fp32 rows of 256 (1 KiB): the
		 * doubling threshold is one for both operations (32 KiB here),
		 * so at 24 rows ranks whose operations differ take the same
		 * path, see the mismatch and keep a usable handle; the halving
		 * limits are not (64 KiB for the plain sum, 32 KiB for the
		 * norms), so at 48 rows a plain sum takes the halving mode and
		 * a norm the two-stage path: every rank sees the mismatch, and
		 * the handle works on (as where rows differ) */
		enum { R = 64, C = 256 };
		float *fin = malloc(2 * R * C * sizeof(*fin)), *fout = fin + R * C;
		float *fg = malloc(C * sizeof(*fg));
		fabep_rmsnorm_params_t fp = p;
		size_t j;

		if (!fin || !fg)
			FAILF("out of memory");
		for (j = 0; j < R * C; j++)
			fin[j] = (float)(j % 7) + (float)rank;
		for (j = 0; j < C; j++)
			fg[j] = 1.0f;
		fp.gamma = fg;
		ret = fabep_allreduce_create(comm, R, C, FABEP_AR_F32, &ar);
		if (ret)
			FAILF("create: %s", fabep_strerror(ret));
		if (fabep_allreduce_onestage_max(ar) != 32 * 1024 ||
		    fabep_allreduce_sum_onestage_max(ar) != 32 * 1024)
			FAILF("thresholds %zu / %zu, want 32 KiB for both",
			      fabep_allreduce_onestage_max(ar),
			      fabep_allreduce_sum_onestage_max(ar));
		if ((ret = fabep_allreduce(ar, fin, fout, 48, C)) || ar->path != 'l')
			FAILF("a sum of 48 rows: %s, path '%c'", fabep_strerror(ret),
			      ar->path);
		if ((ret = fabep_allreduce_rmsnorm(ar, fin, 48, C, &fp, fout)) ||
		    ar->path != 't')
			FAILF("a norm of 48 rows: %s, path '%c'", fabep_strerror(ret),
			      ar->path);
		ret = rank == 0 ? fabep_allreduce(ar, fin, fout, 24, C) :
		      fabep_allreduce_rmsnorm(ar, fin, 24, C, &fp, fout);
		if (ret != -FABEP_ERR_MISMATCH)
			FAILF("24 rows, sum on rank 0, norm on the others: %s",
			      fabep_strerror(ret));
		ret = fabep_allreduce(ar, fin, fout, 24, C);
		if (ret)
			FAILF("a sum after the mismatch on one path: %s",
			      fabep_strerror(ret));
		for (j = 0; j < 24 * C; j++)
			if (fout[j] != (float)(4 * (j % 7) + 6))
				FAILF("sum after the mismatch: [%zu] = %g, want %zu",
				      j, (double)fout[j], 4 * (j % 7) + 6);
		ret = rank == 0 ? fabep_allreduce(ar, fin, fout, 48, C) :
		      fabep_allreduce_rmsnorm(ar, fin, 48, C, &fp, fout);
		if (ret != -FABEP_ERR_MISMATCH)
			FAILF("48 rows, sum (halving) on rank 0, norm (two-stage) "
			      "on the others: %s", fabep_strerror(ret));
		for (i = 0; i < 2; i++) {
			memset(fout, 0, 24 * C * sizeof(*fout));
			ret = fabep_allreduce(ar, fin, fout, 24, C);
			if (ret)
				FAILF("call %d after the mismatch across paths: %s",
				      i + 1, fabep_strerror(ret));
			for (j = 0; j < 24 * C; j++)
				if (fout[j] != (float)(4 * (j % 7) + 6))
					FAILF("sum after the mismatch across paths: "
					      "[%zu] = %g, want %zu", j,
					      (double)fout[j], 4 * (j % 7) + 6);
		}
		fabep_allreduce_destroy(ar);
		/* and a new handle works */
		ret = fabep_allreduce_create(comm, R, C, FABEP_AR_F32, &ar);
		if (ret || (ret = fabep_allreduce(ar, fin, fout, 48, C)))
			FAILF("a new handle: %s", fabep_strerror(ret));
		for (j = 0; j < 48 * C; j++)
			if (fout[j] != (float)(4 * (j % 7) + 6))
				FAILF("a new handle's sum: [%zu] = %g", j, (double)fout[j]);
		fabep_allreduce_destroy(ar);
		free(fin);
		free(fg);
		goto done;
	}
	if (e->which == 0) {
		/* creation: shapes differ, then a heap that is too small */
		ret = fabep_allreduce_create(comm, rank == 1 ? 32 : 64, 8,
					     FABEP_AR_BF16, &ar);
		if (ret != -FABEP_ERR_MISMATCH)
			FAILF("create with differing shapes: %s", fabep_strerror(ret));
		ret = fabep_allreduce_create(comm, 1u << 20, 7168, FABEP_AR_BF16, &ar);
		if (ret != -FABEP_ERR_HEAP_FULL)
			FAILF("create past the heap: %s", fabep_strerror(ret));
		/* a shape past 2^40 bytes: no heap size could hold it */
		ret = fabep_allreduce_create(comm, 1u << 20, 1u << 20, FABEP_AR_F32, &ar);
		if (ret != -EOVERFLOW ||
		    fabep_allreduce_heap_bytes(1u << 20, 1u << 20, FABEP_AR_F32, size))
			FAILF("create past 2^40 bytes: %s, heap bytes %zu",
			      fabep_strerror(ret), fabep_allreduce_heap_bytes(1u << 20,
				      1u << 20, FABEP_AR_F32, size));
		ret = fabep_allreduce_create(comm, 64, 8, (fabep_ar_dtype_t)7, &ar);
		if (ret != -EINVAL)
			FAILF("create with a bad dtype: %s", fabep_strerror(ret));
		/* a threshold set on one rank only: refused on every rank,
		 * naming the variable */
		if (rank == 1)
			setenv("FABEP_AR_ONESTAGE_MAX", "64", 1);
		ret = fabep_allreduce_create(comm, 64, 8, FABEP_AR_BF16, &ar);
		unsetenv("FABEP_AR_ONESTAGE_MAX");
		if (ret != -FABEP_ERR_MISMATCH)
			FAILF("create with FABEP_AR_ONESTAGE_MAX on rank 1 only: %s",
			      fabep_strerror(ret));
		if (!strstr(fabep_last_error(), "FABEP_AR_ONESTAGE_MAX"))
			FAILF("the mismatch of thresholds does not name "
			      "FABEP_AR_ONESTAGE_MAX: %s", fabep_last_error());
		goto done;
	}
	ret = fabep_allreduce_create(comm, 64, 8, FABEP_AR_BF16, &ar);
	if (ret)
		FAILF("create: %s", fabep_strerror(ret));
	for (i = 0; i < 2; i++) {
		/* once one-stage (rows 3), once two-stage (rows 60) */
		size_t rows = i ? 60 : 3;

		ret = fabep_allreduce(ar, in, out, rank == 1 ? rows + 1 : rows, 8);
		if (ret != -FABEP_ERR_MISMATCH)
			FAILF("rows differ: %s", fabep_strerror(ret));
		ret = fabep_allreduce(ar, in, out, rows, rank == size - 1 ? 7 : 8);
		if (ret != -FABEP_ERR_MISMATCH)
			FAILF("cols differ: %s", fabep_strerror(ret));
		ret = rank == 0 ? fabep_allreduce(ar, in, out, rows, 8)
				: fabep_allreduce_rmsnorm_fp8(ar, in, rows, 8, &p, q, sc);
		if (ret != -FABEP_ERR_MISMATCH)
			FAILF("ops differ: %s", fabep_strerror(ret));
		/* the norm's scalars on the last rank only: eps, weight_offset,
		 * scale_ub; each refused on every rank and named */
		for (int j = 0; j < 3; j++) {
			fabep_rmsnorm_params_t d = p;

			if (rank == size - 1 && j == 0)
				d.eps = 1e-6f;
			else if (rank == size - 1 && j == 1)
				d.weight_offset = 1.0f;
			else if (rank == size - 1)
				d.scale_ub = 0.5f;
			ret = fabep_allreduce_rmsnorm_fp8(ar, in, rows, 8, &d, q, sc);
			if (ret != -FABEP_ERR_MISMATCH)
				FAILF("norm scalar %d differs on rank %d: %s", j,
				      size - 1, fabep_strerror(ret));
			if (!strstr(fabep_last_error(), "eps, weight_offset or scale_ub"))
				FAILF("norm scalar %d: the message does not say "
				      "which: %s", j, fabep_last_error());
		}
		/* what means the same is the same: -0 as 0, no bound as no
		 * bound, and scale_ub is not the bf16 norm's */
		{
			fabep_rmsnorm_params_t d = p;

			if (rank == size - 1) {
				d.weight_offset = -0.0f;
				d.scale_ub = -1.0f;
			}
			ret = fabep_allreduce_rmsnorm_fp8(ar, in, rows, 8, &d, q, sc);
			if (ret)
				FAILF("FP8 norm, -0 offset and no bound on one rank: %s",
				      fabep_strerror(ret));
			if (rank == size - 1)
				d.scale_ub = 0.5f;
			ret = fabep_allreduce_rmsnorm(ar, in, rows, 8, &d, out);
			if (ret)
				FAILF("bf16 norm, scale_ub on one rank: %s",
				      fabep_strerror(ret));
			/* a NaN bound: the bf16 norm's to ignore, the FP8
			 * norm's to refuse, on every rank */
			d = p;
			d.scale_ub = NAN;
			ret = fabep_allreduce_rmsnorm(ar, in, rows, 8, &d, out);
			if (ret)
				FAILF("bf16 norm, NaN scale_ub: %s", fabep_strerror(ret));
			if (rank != size - 1)
				d.scale_ub = p.scale_ub;
			ret = fabep_allreduce_rmsnorm_fp8(ar, in, rows, 8, &d, q, sc);
			if (ret != -EINVAL)
				FAILF("FP8 norm, NaN scale_ub on rank %d: %s", size - 1,
				      fabep_strerror(ret));
		}
		ret = fabep_allreduce(ar, in, out, rank == size - 1 ? 65 : rows, 8);
		if (ret != -EINVAL)
			FAILF("rows above the maximum on one rank: %s",
			      fabep_strerror(ret));
		ret = fabep_allreduce(ar, rank == 1 ? NULL : in, out, rows, 8);
		if (ret != -EINVAL)
			FAILF("NULL input on one rank: %s", fabep_strerror(ret));
		ret = fabep_allreduce_rmsnorm_fp8(ar, in, rows, 8, &p, q,
						  rank == 0 ? NULL : sc);
		if (ret != -EINVAL)
			FAILF("NULL scales on one rank: %s", fabep_strerror(ret));
		/* and the handle still works, with the right result */
		memset(out, 0, sizeof(out));
		ret = fabep_allreduce(ar, in, out, rows, 8);
		if (ret)
			FAILF("good call after errors: %s", fabep_strerror(ret));
		if (err_sum_bad(rank, size, out, rows, "after errors"))
			return 1;
	}
	fabep_allreduce_destroy(ar);
	if (fabep_allreduce(NULL, in, out, 1, 8) != -EINVAL)
		FAILF("NULL handle accepted");
done:
	ret = fabep_comm_destroy(comm);
	return ret ? 1 : 0;
}

static void run_err(const char *prov, int size, int which)
{
	struct err_run e = { prov, which };
	int status[8], r;

	fep_test_on_provider(prov);
	fep_test_run_ranks_status(size, 60, err_rank, &e, status);
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == 0, "%s errors %d: rank %d exited %d: %s",
			      prov, which, r, status[r], fep_test_rank_said(r));
}

/* Every signal strategy that each provider offers (skipped where it
 * lacks one; fep_test_add_signal_cases): the mixed cases, one-stage and
 * two-stage, a short run each. */
START_TEST(ar)
{
	fabep_signal_t sig;
	const char *prov = fep_test_signal_case(_i, &sig);

	/* 4 ranks: the log-step path below the threshold */
	run_cases(prov, strcmp(prov, "sockets") ? 4 : 2, FABEP_AR_BF16, "4k",
		  mixed, N(mixed), 1);
}
END_TEST

START_TEST(err_calls_shm) { run_err("shm", 3, 1); } END_TEST
START_TEST(err_calls_logstep) { run_err("shm", 5, 1); } END_TEST
START_TEST(err_paths_differ) { run_err("shm", 5, 2); } END_TEST
START_TEST(err_create_shm) { run_err("shm", 3, 0); } END_TEST
START_TEST(err_ops_paths_differ) { run_err("shm", 2, 3); } END_TEST
START_TEST(err_ops_halving_differ) { run_err("shm", 4, 4); } END_TEST
START_TEST(err_calls_tcp) { run_err("tcp", 2, 1); } END_TEST

START_TEST(heap_bytes)
{
	size_t a, b;

	unsetenv("FABEP_AR_ONESTAGE_MAX");
	a = fabep_allreduce_heap_bytes(128, 7168, FABEP_AR_BF16, 2);
	b = fabep_allreduce_heap_bytes(8192, 7168, FABEP_AR_BF16, 2);
	ck_assert(a > 128 * 7168 * 2);
	ck_assert(b > a);
	/* every slot set holds at least the input of the largest call */
	ck_assert(b >= (size_t)8192 * 7168 * 2 * 2);
	ck_assert_uint_eq(fabep_allreduce_heap_bytes(0, 7168, FABEP_AR_BF16, 2), 0);
	ck_assert_uint_eq(fabep_allreduce_heap_bytes(8, 0, FABEP_AR_BF16, 2), 0);
	ck_assert_uint_eq(fabep_allreduce_heap_bytes(8, 8, (fabep_ar_dtype_t)5, 2), 0);
	ck_assert_uint_eq(fabep_allreduce_heap_bytes(8, 8, FABEP_AR_BF16, 0), 0);
	ck_assert_uint_eq(fabep_allreduce_heap_bytes((size_t)1 << 40, 1 << 20,
						     FABEP_AR_BF16, 2), 0);
}
END_TEST

static Suite *coll_suite(void)
{
	Suite *s = suite_create("coll");
	TCase *tc = tcase_create("allreduce");

	tcase_set_timeout(tc, 150);
	tcase_add_test(tc, heap_bytes);
	tcase_add_test(tc, shm_wide_auto);
	tcase_add_test(tc, shm_wide_two);
	tcase_add_test(tc, shm_wide_one);
	tcase_add_test(tc, shm_narrow_auto);
	tcase_add_test(tc, shm_narrow_two);
	tcase_add_test(tc, shm_fp32_two);
	tcase_add_test(tc, shm_fp32_one);
	tcase_add_test(tc, shm_1rank);
	tcase_add_test(tc, shm_8ranks);
	tcase_add_test(tc, shm_b2b);
	tcase_add_test(tc, shm_halving_wide);
	tcase_add_test(tc, shm_halving_mix);
	tcase_add_test(tc, shm_logstep5);
	tcase_add_test(tc, shm_logstep7);
	tcase_add_test(tc, tcp_logstep);
	tcase_add_test(tc, shm_copies);
	tcase_add_test(tc, mrl_shm);
	tcase_add_test(tc, mrl_tcp);
	tcase_add_test(tc, keys_tcp);
	tcase_add_test(tc, msg4k);
	tcase_add_test(tc, cq4_shm);
	tcase_add_test(tc, cq4_tcp);
	tcase_add_test(tc, shm_uneven_threads);
	tcase_add_test(tc, shm_cma_slices);
	tcase_add_test(tc, shm_cma_channels);
	tcase_add_test(tc, tcp_auto);
	tcase_add_test(tc, tcp_wide_two);
	tcase_add_test(tc, sockets_mixed);
	tcase_add_test(tc, err_calls_shm);
	tcase_add_test(tc, err_calls_logstep);
	tcase_add_test(tc, err_paths_differ);
	tcase_add_test(tc, err_create_shm);
	tcase_add_test(tc, err_ops_paths_differ);
	tcase_add_test(tc, err_ops_halving_differ);
	tcase_add_test(tc, err_calls_tcp);
	suite_add_tcase(s, tc);
	/* every strategy of every provider */
	tc = tcase_create("signals");
	tcase_set_timeout(tc, 150);
	fep_test_add_signal_cases(tc, ar);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return fep_test_run_suite(coll_suite());
}
