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
 * Rows: --rows N, else 1, 16, 128, 1024, 8192; cols: --cols, else 7168;
 * -f bf16 (default) or fp32.  Times are medians over -I calls (default
 * 200 below 1 MiB of input, 50 below 16 MiB, 20 above) after -w warm-up
 * calls (default a tenth, at least 3).  FABEP_AR_ONESTAGE_MAX forces a
 * path (0: two-stage, 1G: one-stage).
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

int bench_coll(fabep_comm_t *comm, const struct bench_opts *o, FILE *out)
{
	size_t rows_list[8], nrows, maxr = 0, i;
	int arnorm = !strcmp(o->op, "arnorm");
	int rank = fabep_comm_rank(comm), size = fabep_comm_size(comm);
	fabep_ar_dtype_t adt = FABEP_AR_BF16;
	fep_k_dtype_t dt = FEP_K_BF16;
	fabep_allreduce_t *ar = NULL;
	fabep_rmsnorm_params_t p;
	fabep_off_t wsrc = 0, wdst = 0;
	struct bc_bufs b;
	uint64_t *t = NULL, *tr = NULL;
	int ret;

	memset(&b, 0, sizeof(b));
	if (o->format && !strcmp(o->format, "fp32")) {
		adt = FABEP_AR_F32;
		dt = FEP_K_F32;
	} else if (o->format && strcmp(o->format, "bf16")) {
		fprintf(stderr, "%s: -o %s takes -f bf16 or fp32\n", tool_name, o->op);
		return -EINVAL;
	}
	b.es = adt == FABEP_AR_BF16 ? 2 : 4;
	b.cols = o->cols > 0 ? (size_t)o->cols : 7168;
	if (o->rows > 0) {
		rows_list[0] = (size_t)o->rows;
		nrows = 1;
	} else {
		nrows = sizeof(def_rows) / sizeof(def_rows[0]);
		memcpy(rows_list, def_rows, sizeof(def_rows));
	}
	for (i = 0; i < nrows; i++)
		maxr = rows_list[i] > maxr ? rows_list[i] : maxr;

	ret = fabep_allreduce_create(comm, maxr, b.cols, adt, &ar);
	if (ret) {
		if (ret == -FABEP_ERR_HEAP_FULL && rank == 0)
			fprintf(stderr, "%s: -o %s: the heap is too small: the handle "
				"needs %zu bytes; set FABEP_HEAP_SIZE\n", tool_name,
				o->op, fabep_allreduce_heap_bytes(maxr, b.cols, adt, size));
		return tool_fail("fabep_allreduce_create", ret);
	}
	if (!arnorm) {
		/* the raw-write reference: source and destination in the heap */
		ret = fabep_heap_alloc(comm, maxr * b.cols * b.es, 64, &wsrc);
		if (!ret)
			ret = fabep_heap_alloc(comm, maxr * b.cols * b.es, 64, &wdst);
		if (ret) {
			if (rank == 0)
				fprintf(stderr, "%s: -o allreduce: the raw-write reference "
					"needs 2 x %zu more heap bytes; set FABEP_HEAP_SIZE\n",
					tool_name, maxr * b.cols * b.es);
			ret = tool_fail("fabep_heap_alloc", ret);
			goto out;
		}
	}
	b.in = calloc(maxr * b.cols, b.es);
	b.sum = calloc(maxr * b.cols, b.es);
	b.normed = calloc(maxr * b.cols, b.es);
	b.gamma = calloc(b.cols, b.es);
	b.gamma32 = calloc(b.cols, sizeof(float));
	b.q = calloc(maxr * b.cols, 1);
	b.scales = calloc(maxr, sizeof(float));
	if (!b.in || !b.sum || !b.normed || !b.gamma || !b.gamma32 || !b.q ||
	    !b.scales) {
		ret = tool_fail("allocating buffers", -ENOMEM);
		goto out;
	}
	for (i = 0; i < maxr * b.cols; i++) {
		float v = (float)((i * 2654435761u + (size_t)rank * 977u) % 2001) / 1000.0f - 1.0f;

		if (adt == FABEP_AR_BF16)
			((uint16_t *)b.in)[i] = fep_f32_to_bf16(v);
		else
			((float *)b.in)[i] = v;
	}
	for (i = 0; i < b.cols; i++) {
		b.gamma32[i] = 1.0f + (float)(i % 17) / 64.0f;
		if (adt == FABEP_AR_BF16)
			((uint16_t *)b.gamma)[i] = fep_f32_to_bf16(b.gamma32[i]);
		else
			((float *)b.gamma)[i] = b.gamma32[i];
	}
	memset(&p, 0, sizeof(p));
	p.gamma = b.gamma;
	p.eps = 1e-6f;

	if (rank == 0 && !o->machine) {
		fprintf(out, "# %s -o %s: %d ranks, provider %s, signal %s, %d threads, "
			"%s, one-stage up to %zu bytes per rank\n", tool_name, o->op,
			size, fabep_comm_provider(comm),
			fabep_signal_name(fabep_comm_signal(comm)),
			fabep_comm_threads(comm), adt == FABEP_AR_BF16 ? "bf16" : "fp32",
			fabep_allreduce_onestage_max(ar));
		fprintf(out, "# ref: %s\n", arnorm ?
			"allreduce, then separate RMSNorm and FP8 passes (ratio = ref / fused)" :
			"fabep_put + fabep_flush of the same bytes to one peer (ratio = ref / allreduce)");
		fprintf(out, "%-9s %6s %6s %11s %6s %-10s %12s %14s %7s\n", "op", "rows",
			"cols", "bytes", "iters", "path", "median_us", "ref_median_us",
			"ratio");
	}
	for (i = 0; i < nrows; i++) {
		size_t rows = rows_list[i], bytes = rows * b.cols * b.es;
		long iters = o->iters > 0 ? o->iters :
			     bytes < (1u << 20) ? 200 : bytes < (16u << 20) ? 50 : 20;
		long warm = o->warmup >= 0 ? o->warmup : (iters / 10 > 3 ? iters / 10 : 3);
		const char *path = size == 1 || bytes <= fabep_allreduce_onestage_max(ar) ?
				   "one-stage" : "two-stage";
		double med, ref;
		long k;

		t = calloc((size_t)iters, sizeof(*t));
		tr = calloc((size_t)iters, sizeof(*tr));
		if (!t || !tr) {
			ret = tool_fail("allocating timings", -ENOMEM);
			goto out;
		}
		/* fused and reference interleaved, so drift hits both alike,
		 * in alternating order (the first step after a barrier was seen
		 * to run slower on a loaded machine); each timed step starts
		 * from a barrier, so neither absorbs the peers' lag */
		for (k = -warm; k < iters; k++) {
			uint64_t tf = 0, tw = 0;
			int step;

			for (step = 0; step < 2; step++) {
				int fused = (step == 0) == ((k & 1) == 0);
				uint64_t t0;

				ret = fabep_barrier(comm);
				if (ret) {
					ret = tool_fail("fabep_barrier", ret);
					goto out;
				}
				t0 = tool_now_ns();
				if (fused) {
					ret = arnorm ? fabep_allreduce_rmsnorm_fp8(ar, b.in, rows,
										   b.cols, &p, b.q,
										   b.scales)
						     : fabep_allreduce(ar, b.in, b.sum, rows,
								       b.cols);
					tf = tool_now_ns() - t0;
				} else if (arnorm) {
					ret = separate(comm, ar, &b, dt, rows);
					tw = tool_now_ns() - t0;
				} else {
					ret = raw_write(comm, wsrc, wdst, bytes, &tw);
				}
				if (ret) {
					ret = tool_fail(fused ? o->op : arnorm ? "separate steps" :
							"raw write", ret);
					goto out;
				}
			}
			if (k >= 0) {
				t[k] = tf;
				tr[k] = tw;
			}
		}
		med = median_us(t, iters);
		ref = median_us(tr, iters);
		if (rank == 0) {
			if (o->machine)
				fprintf(out, "op: %s, provider: %s, signal: %s, ranks: %d, "
					"threads: %d, dtype: %s, rows: %zu, cols: %zu, bytes: %zu, "
					"iters: %ld, path: %s, median_us: %.2f, "
					"ref_median_us: %.2f, ratio: %.3f\n", o->op,
					fabep_comm_provider(comm),
					fabep_signal_name(fabep_comm_signal(comm)), size,
					fabep_comm_threads(comm),
					adt == FABEP_AR_BF16 ? "bf16" : "fp32", rows, b.cols,
					bytes, iters, path, med, ref, med > 0 ? ref / med : 0);
			else
				fprintf(out, "%-9s %6zu %6zu %11zu %6ld %-10s %12.2f %14.2f %7.3f\n",
					o->op, rows, b.cols, bytes, iters, path, med, ref,
					med > 0 ? ref / med : 0);
			fflush(out);
		}
		free(t);
		free(tr);
		t = tr = NULL;
	}
	ret = fabep_barrier(comm);
	if (ret)
		ret = tool_fail("fabep_barrier", ret);
out:
	free(t);
	free(tr);
	free(b.in);
	free(b.sum);
	free(b.normed);
	free(b.gamma);
	free(b.gamma32);
	free(b.q);
	free(b.scales);
	fabep_allreduce_destroy(ar);
	return ret;
}
