/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bench_coll.c - fabep_bench -o allreduce | arnorm: latency of the
 * allreduce calls, on every rank of a communicator (rank 0 prints).
 *
 *   allreduce  fabep_allreduce of [rows, cols]; the reference is the time
 *              to write the same bytes to one peer with fabep_put +
 *              fabep_flush, measured in the same run (ratio = ref / time:
 *              the fraction of a raw write the allreduce takes... inverted:
 *              above 1 means the allreduce is faster than a raw write).
 *   arnorm     fabep_allreduce_rmsnorm_fp8; the reference is the separate
 *              steps in the same run: fabep_allreduce to bf16, then an
 *              RMSNorm pass and an FP8 quantization pass with the same
 *              kernels and threads (ratio = separate / fused).
 *
 * --check: after each size's timed calls, one more call, whose result
 * every rank compares with a scalar reference made from every rank's
 * inputs (coll_check); rank 0 prints whether all ranks agreed.
 *
 * Rows: --rows N, else 1, 16, 128, 1024, 8192; cols: --cols, else 7168;
 * -f bf16 (default) or fp32.  Times are medians over -I calls (default
 * 200 below 1 MiB of input, 50 below 16 MiB, 20 above) after -w warm-up
 * calls (default a tenth, at least 3).  FABEP_AR_ONESTAGE_MAX forces a
 * path (0: two-stage, 1G: one-stage, or log-step from 4 ranks).
 *
 * This part reaches the communicator's thread pool and the kernels for the
 * separate steps, so fabep_bench links the convenience library.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utils/common.h"
#include "utils/bench.h"
#include "utils/tool_data.h"
#include "core/comm.h"
#include "kernels/kernels.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double median_us(uint64_t *t, long n)
{
	qsort(t, (size_t)n, sizeof(*t), cmp_u64);
	return (double)t[n / 2] / 1e3;
}

struct bc_bufs {
	size_t rows, cols, es;
	void *in, *sum, *normed, *gamma;
	uint8_t *q;
	float *scales, *gamma32;
};

/* Rank r's input value i (before rounding to the dtype): every rank can
 * make every rank's, for the check. */
static float coll_in(size_t i, int r)
{
	return (float)((i * 2654435761u + (size_t)r * 977u) % 2001) / 1000.0f - 1.0f;
}

static float coll_in_dt(size_t i, int r, int bf16)
{
	return bf16 ? bf2f(f2bf(coll_in(i, r))) : coll_in(i, r);
}

/*
 * --check: this rank's result of the last call against a scalar reference
 * in double from every rank's inputs.  allreduce: each sum within half a
 * unit in the last place of the dtype (bf16: 2^-8 of it; fp32: the
 * rounding of a sum of `size` terms).  arnorm: h = the sum rounded to the
 * dtype, y = h / sqrt(mean(h^2) + eps) * gamma; each row's scale within
 * 1e-4 of max|y| / 448, each dequantized code within FP8's rounding of y
 * (1/16 of |y|, or half the smallest subnormal step).  Prints the first
 * miss; returns 1 when all match.
 */
static int coll_check(const struct bc_bufs *b, size_t rows, int size, int arnorm,
		      int rank, const char *op)
{
	int bf16 = b->es == 2, s;
	double *h = malloc(b->cols * sizeof(double));
	float lut[256];
	size_t r, j;
	int ok = 1;

	if (!h) {
		fprintf(stderr, "%s: rank %d: --check: out of memory\n", tool_name, rank);
		return 0;
	}
	e4m3_lut(lut);
	for (r = 0; r < rows && ok; r++) {
		double ss = 0, amax = 0, inv, scale;

		for (j = 0; j < b->cols; j++) {
			double sum = 0;

			for (s = 0; s < size; s++)
				sum += coll_in_dt(r * b->cols + j, s, bf16);
			h[j] = sum;
			if (arnorm && bf16)
				h[j] = bf2f(f2bf((float)sum));
			ss += h[j] * h[j];
		}
		if (!arnorm) {
			for (j = 0; j < b->cols && ok; j++) {
				size_t at = r * b->cols + j;
				double got = bf16 ? bf2f(((const uint16_t *)b->sum)[at])
						  : ((const float *)b->sum)[at];
				double tol = bf16 ? fabs(h[j]) / 256 * 1.001 + 1e-6
						  : 1e-6 * size * size + 1e-6 * fabs(h[j]);

				if (!(fabs(got - h[j]) <= tol)) {
					fprintf(stderr, "%s: rank %d: --check: %s row %zu col %zu: "
						"%.9g, want %.9g\n", tool_name, rank, op, r, j,
						got, h[j]);
					ok = 0;
				}
			}
			continue;
		}
		inv = 1.0 / sqrt(ss / (double)b->cols + 1e-6);
		for (j = 0; j < b->cols; j++) {
			h[j] = h[j] * inv * b->gamma32[j];  /* y */
			amax = fabs(h[j]) > amax ? fabs(h[j]) : amax;
		}
		scale = b->scales[r];
		if (amax > 0 && !(fabs(scale - amax / 448) <= 1e-4 * amax / 448)) {
			fprintf(stderr, "%s: rank %d: --check: %s row %zu: scale %.9g, "
				"want %.9g\n", tool_name, rank, op, r, scale, amax / 448);
			ok = 0;
		}
		for (j = 0; j < b->cols && ok; j++) {
			uint8_t c = b->q[r * b->cols + j];
			double got = lut[c] * scale;
			double tol = fabs(h[j]) / 16 + scale / 1024 + 1e-4 * amax;

			if ((c & 0x7f) == 0x7f || !(fabs(got - h[j]) <= tol)) {
				fprintf(stderr, "%s: rank %d: --check: %s row %zu col %zu: "
					"code 0x%02x x scale %.6g = %.6g, want %.6g\n",
					tool_name, rank, op, r, j, c, scale, got, h[j]);
				ok = 0;
			}
		}
	}
	free(h);
	return ok;
}

/* The separate steps: allreduce to dtype rows, RMSNorm pass, FP8 pass. */
static int separate(fabep_comm_t *comm, fabep_allreduce_t *ar,
		    struct bc_bufs *b, fep_k_dtype_t dt, size_t rows)
{
	fep_k_rmsnorm_args_t na;
	fep_k_fp8_args_t qa;
	int ret;

	ret = fabep_allreduce(ar, b->in, b->sum, rows, b->cols);
	if (ret)
		return ret;
	memset(&na, 0, sizeof(na));
	na.in = b->sum;
	na.in_dt = dt;
	na.ld_in = b->cols;
	na.gamma = b->gamma32;
	na.eps = 1e-6f;
	na.out = b->normed;
	na.out_dt = dt;
	na.ld_out = b->cols;
	na.cols = b->cols;
	ret = fep_k_rmsnorm_mt(comm->pool, &na, rows);
	if (ret)
		return ret;
	memset(&qa, 0, sizeof(qa));
	qa.in = b->normed;
	qa.in_dt = dt;
	qa.ld_in = b->cols;
	qa.out = b->q;
	qa.ld_out = b->cols;
	qa.scales = b->scales;
	qa.ld_scales = 1;
	qa.cols = b->cols;
	return fep_k_fp8_quant_mt(comm->pool, &qa, rows);
}

/* Raw write of `bytes` to the next rank, then flush; both ranks of a pair
 * finish each round with a barrier so the writer never runs ahead. */
static int raw_write(fabep_comm_t *comm, fabep_off_t src, fabep_off_t dst,
		     size_t bytes, uint64_t *ns)
{
	int rank = fabep_comm_rank(comm), size = fabep_comm_size(comm);
	uint64_t t0;
	int ret;

	ret = fabep_barrier(comm);
	if (ret)
		return ret;
	t0 = tool_now_ns();
	if (size > 1 && bytes) {
		ret = fabep_put(comm, (rank + 1) % size, dst, src, bytes);
		if (!ret)
			ret = fabep_flush(comm);
		if (ret)
			return ret;
	}
	*ns = tool_now_ns() - t0;
	return 0;
}

static const size_t def_rows[] = { 1, 16, 128, 1024, 8192 };

long bench_coll_iters(const struct bench_opts *o, size_t bytes)
{
	return o->iters > 0 ? o->iters :
	       bytes < (1u << 20) ? 200 : bytes < (16u << 20) ? 50 : 20;
}

long bench_coll_warmup(const struct bench_opts *o, long iters)
{
	return o->warmup >= 0 ? o->warmup : iters / 10 > 3 ? iters / 10 : 3;
}

int bench_coll_fits(size_t rows, size_t cols, size_t es)
{
	size_t max = (size_t)1 << BENCH_COLL_MAX_LOG2;

	return rows && cols && es && cols <= max / es && rows <= max / es / cols;
}

size_t bench_coll_heap_bytes(const struct bench_opts *o, int nranks)
{
	size_t cols = o->cols > 0 ? (size_t)o->cols : 7168, rows = 8192;
	int fp32 = o->format && !strcmp(o->format, "fp32");
	fabep_ar_dtype_t adt = fp32 ? FABEP_AR_F32 : FABEP_AR_BF16;

	if (o->rows > 0)
		rows = (size_t)o->rows;
	return fabep_allreduce_heap_bytes(rows, cols, adt, nranks) +
	       (strcmp(o->op, "arnorm") ? 2 * rows * cols * (fp32 ? 4 : 2) : 0) +
	       ((size_t)1 << 20);
}

/* One run of bench_coll: the handle, the buffers and the verdict words
 * its steps share. */
struct bc_run {
	fabep_comm_t *comm;
	const struct bench_opts *o;
	int arnorm, rank, size;
	fabep_ar_dtype_t adt;
	fep_k_dtype_t dt;
	fabep_allreduce_t *ar;
	fabep_rmsnorm_params_t p;
	fabep_off_t wsrc, wdst, okw, okc;
	struct bc_bufs b;
	size_t maxr;
};

/* The handle and the heap buffers for rows up to maxr. */
static int bc_setup(struct bc_run *R)
{
	fabep_comm_t *comm = R->comm;
	const struct bench_opts *o = R->o;
	size_t maxr = R->maxr, cols = R->b.cols, es = R->b.es;
	int ret;

	ret = fabep_allreduce_create(comm, maxr, cols, R->adt, &R->ar);
	if (ret) {
		if (ret == -FABEP_ERR_HEAP_FULL && R->rank == 0)
			fprintf(stderr, "%s: -o %s: the heap is too small: the handle "
				"needs %zu bytes; set FABEP_HEAP_SIZE\n", tool_name,
				o->op, fabep_allreduce_heap_bytes(maxr, cols, R->adt,
								  R->size));
		return tool_fail("fabep_allreduce_create", ret);
	}
	if (!R->arnorm) {
		/* the raw-write reference: source and destination in the heap */
		ret = fabep_heap_alloc(comm, maxr * cols * es, 64, &R->wsrc);
		if (!ret)
			ret = fabep_heap_alloc(comm, maxr * cols * es, 64, &R->wdst);
		if (ret) {
			if (R->rank == 0)
				fprintf(stderr, "%s: -o allreduce: the raw-write reference "
					"needs 2 x %zu more heap bytes; set FABEP_HEAP_SIZE\n",
					tool_name, maxr * cols * es);
			return tool_fail("fabep_heap_alloc", ret);
		}
	}
	if (o->check) {  /* a word per rank and a counter: the verdicts */
		ret = fabep_heap_alloc(comm, (size_t)R->size * 8, 64, &R->okw);
		if (!ret)
			ret = fabep_heap_alloc(comm, 8, 64, &R->okc);
		if (ret)
			return tool_fail("fabep_heap_alloc", ret);
	}
	return 0;
}

/* The host buffers, this rank's input and the norm's weights. */
static int bc_fill(struct bc_run *R)
{
	struct bc_bufs *b = &R->b;
	size_t maxr = R->maxr, i;

	b->in = calloc(maxr * b->cols, b->es);
	b->sum = calloc(maxr * b->cols, b->es);
	b->normed = calloc(maxr * b->cols, b->es);
	b->gamma = calloc(b->cols, b->es);
	b->gamma32 = calloc(b->cols, sizeof(float));
	b->q = calloc(maxr * b->cols, 1);
	b->scales = calloc(maxr, sizeof(float));
	if (!b->in || !b->sum || !b->normed || !b->gamma || !b->gamma32 || !b->q ||
	    !b->scales)
		return tool_fail("allocating buffers", -ENOMEM);
	for (i = 0; i < maxr * b->cols; i++) {
		if (R->adt == FABEP_AR_BF16)
			((uint16_t *)b->in)[i] = f2bf(coll_in(i, R->rank));
		else
			((float *)b->in)[i] = coll_in(i, R->rank);
	}
	for (i = 0; i < b->cols; i++) {
		b->gamma32[i] = 1.0f + (float)(i % 17) / 64.0f;
		if (R->adt == FABEP_AR_BF16)
			((uint16_t *)b->gamma)[i] = fep_f32_to_bf16(b->gamma32[i]);
		else
			((float *)b->gamma)[i] = b->gamma32[i];
	}
	fabep_rmsnorm_params_init(&R->p);
	R->p.gamma = b->gamma;
	R->p.eps = 1e-6f;
	return 0;
}

/* The call under test on rows x cols. */
static int bc_fused(struct bc_run *R, size_t rows)
{
	struct bc_bufs *b = &R->b;

	return R->arnorm ? fabep_allreduce_rmsnorm_fp8(R->ar, b->in, rows, b->cols,
						       &R->p, b->q, b->scales)
			 : fabep_allreduce(R->ar, b->in, b->sum, rows, b->cols);
}

/* Times the call and its reference on rows, warm + iters rounds, into
 * t and tr.  Fused and reference interleaved, so drift hits both alike,
 * in alternating order (the first step after a barrier runs slower on a
 * loaded machine); each timed step starts from a barrier, so neither
 * absorbs the peers' lag. */
static int bc_time(struct bc_run *R, size_t rows, size_t bytes, long warm,
		   long iters, uint64_t *t, uint64_t *tr)
{
	long k;
	int ret;

	for (k = -warm; k < iters; k++) {
		uint64_t tf = 0, tw = 0;
		int step;

		for (step = 0; step < 2; step++) {
			int fused = (step == 0) == ((k & 1) == 0);
			uint64_t t0;

			ret = fabep_barrier(R->comm);
			if (ret)
				return tool_fail("fabep_barrier", ret);
			t0 = tool_now_ns();
			if (fused) {
				ret = bc_fused(R, rows);
				tf = tool_now_ns() - t0;
			} else if (R->arnorm) {
				ret = separate(R->comm, R->ar, &R->b, R->dt, rows);
				tw = tool_now_ns() - t0;
			} else {
				ret = raw_write(R->comm, R->wsrc, R->wdst, bytes, &tw);
			}
			if (ret)
				return tool_fail(fused ? R->o->op : R->arnorm ?
						 "separate steps" : "raw write", ret);
		}
		if (k >= 0) {
			t[k] = tf;
			tr[k] = tw;
		}
	}
	return 0;
}

/* One more call on rows, its result checked on every rank; the verdict
 * (rank 0's view of all ranks) in *all_ok.  seq numbers the gathers. */
static int bc_check(struct bc_run *R, size_t rows, uint64_t seq, int *all_ok)
{
	int ret = fabep_barrier(R->comm);

	if (!ret)
		ret = bc_fused(R, rows);
	if (ret)
		return tool_fail(R->o->op, ret);
	ret = bench_gather_ok(R->comm, R->okw, R->okc, seq,
			      coll_check(&R->b, rows, R->size, R->arnorm, R->rank,
					 R->o->op), all_ok);
	if (ret)
		return tool_fail("gathering the checks", ret);
	return 0;
}

/* Rank 0's header of the table (not with -m). */
/* The one-stage threshold of the operation timed: the plain sum has its
 * own on 2 ranks (fabep_allreduce(3)). */
static size_t bc_threshold(const struct bc_run *R)
{
	return R->arnorm ? fabep_allreduce_onestage_max(R->ar) :
			   fabep_allreduce_sum_onestage_max(R->ar);
}

static void bc_header(struct bc_run *R, FILE *out)
{
	const struct bench_opts *o = R->o;
	fabep_comm_t *comm = R->comm;

	fprintf(out, "# %s -o %s: %d ranks, provider %s, signal %s, %d threads, "
		"%s, %s up to %zu bytes per rank\n", tool_name, o->op,
		R->size, fabep_comm_provider(comm),
		fabep_signal_name(fabep_comm_signal(comm)),
		fabep_comm_threads(comm), R->adt == FABEP_AR_BF16 ? "bf16" : "fp32",
		R->size >= 4 ? "log-step" : "one-stage", bc_threshold(R));
	fprintf(out, "# ref: %s\n", R->arnorm ?
		"allreduce, then separate RMSNorm and FP8 passes (ratio = ref / fused)" :
		"fabep_put + fabep_flush of the same bytes to one peer (ratio = ref / allreduce)");
	fprintf(out, "%-9s %6s %6s %11s %6s %-10s %12s %14s %7s %6s\n", "op",
		"rows", "cols", "bytes", "iters", "path", "median_us",
		"ref_median_us", "ratio", "check");
}

/* Times, checks and (rank 0) prints one row count; *failed set when
 * rank 0 sees a check fail. */
static int bc_one(struct bc_run *R, FILE *out, size_t i, size_t rows,
		  int *failed)
{
	const struct bench_opts *o = R->o;
	fabep_comm_t *comm = R->comm;
	size_t cols = R->b.cols, bytes = rows * cols * R->b.es;
	long iters = bench_coll_iters(o, bytes);
	long warm = bench_coll_warmup(o, iters);
	const char *path = R->size > 1 && bytes > bc_threshold(R) ?
			   "two-stage" : R->size >= 4 ? "log-step" : "one-stage";
	const char *chk = "off";
	uint64_t *t, *tr;
	double med, ref;
	int ret;

	t = calloc((size_t)iters, sizeof(*t));
	tr = calloc((size_t)iters, sizeof(*tr));
	if (!t || !tr) {
		ret = tool_fail("allocating timings", -ENOMEM);
		goto out;
	}
	ret = bc_time(R, rows, bytes, warm, iters, t, tr);
	if (ret)
		goto out;
	med = median_us(t, iters);
	ref = median_us(tr, iters);
	if (o->check) {
		int all_ok = 0;

		ret = bc_check(R, rows, (uint64_t)i + 1, &all_ok);
		if (ret)
			goto out;
		chk = R->rank || all_ok ? "ok" : "failed";
		*failed |= !R->rank && !all_ok;
	}
	if (R->rank == 0) {
		if (o->machine)
			fprintf(out, "op: %s provider: %s signal: %s ranks: %d "
				"threads: %d dtype: %s rows: %zu cols: %zu bytes: %zu "
				"iters: %ld path: %s median_us: %.2f "
				"ref_median_us: %.2f ratio: %.3f check: %s\n", o->op,
				fabep_comm_provider(comm),
				fabep_signal_name(fabep_comm_signal(comm)), R->size,
				fabep_comm_threads(comm),
				R->adt == FABEP_AR_BF16 ? "bf16" : "fp32", rows, cols,
				bytes, iters, path, med, ref, med > 0 ? ref / med : 0,
				chk);
		else
			fprintf(out, "%-9s %6zu %6zu %11zu %6ld %-10s %12.2f %14.2f "
				"%7.3f %6s\n", o->op, rows, cols, bytes, iters, path,
				med, ref, med > 0 ? ref / med : 0, chk);
		fflush(out);
	}
out:
	free(t);
	free(tr);
	return ret;
}

int bench_coll(fabep_comm_t *comm, const struct bench_opts *o, FILE *out)
{
	struct bc_run R;
	size_t rows_list[8], nrows, i;
	int failed = 0;
	int ret;

	memset(&R, 0, sizeof(R));
	R.comm = comm;
	R.o = o;
	R.arnorm = !strcmp(o->op, "arnorm");
	R.rank = fabep_comm_rank(comm);
	R.size = fabep_comm_size(comm);
	R.adt = FABEP_AR_BF16;
	R.dt = FEP_K_BF16;
	if (o->format && !strcmp(o->format, "fp32")) {
		R.adt = FABEP_AR_F32;
		R.dt = FEP_K_F32;
	} else if (o->format && strcmp(o->format, "bf16")) {
		fprintf(stderr, "%s: -o %s takes -f bf16 or fp32\n", tool_name, o->op);
		return -EINVAL;
	}
	R.b.es = R.adt == FABEP_AR_BF16 ? 2 : 4;
	R.b.cols = o->cols > 0 ? (size_t)o->cols : 7168;
	if (o->rows > 0) {
		rows_list[0] = (size_t)o->rows;
		nrows = 1;
	} else {
		nrows = sizeof(def_rows) / sizeof(def_rows[0]);
		memcpy(rows_list, def_rows, sizeof(def_rows));
	}
	for (i = 0; i < nrows; i++)
		R.maxr = rows_list[i] > R.maxr ? rows_list[i] : R.maxr;

	ret = bc_setup(&R);
	if (!ret)
		ret = bc_fill(&R);
	if (ret)
		goto out;
	if (R.rank == 0 && !o->machine)
		bc_header(&R, out);
	for (i = 0; i < nrows; i++) {
		ret = bc_one(&R, out, i, rows_list[i], &failed);
		if (ret)
			goto out;
	}
	ret = fabep_barrier(comm);
	if (ret)
		ret = tool_fail("fabep_barrier", ret);
	else if (failed)
		ret = -FABEP_ERR_PEER;  /* rank 0: a check failed (printed) */
out:
	free(R.b.in);
	free(R.b.sum);
	free(R.b.normed);
	free(R.b.gamma);
	free(R.b.gamma32);
	free(R.b.q);
	free(R.b.scales);
	fabep_allreduce_destroy(R.ar);
	return ret;
}
