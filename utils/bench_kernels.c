/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bench_kernels.c - fabep_bench -o kernels: time each local compute kernel
 * on rows totalling -B bytes of input (default 64 MiB, well beyond the
 * last-level cache), with one thread and with all the pool's threads, and
 * print GB/s (bytes read + bytes written, per call) next to a memcpy that
 * moves the same number of bytes (copies half of them), timed in the same
 * run, alternating with the kernel, and the ratio of the two.
 *
 * Reaches the internal kernel API (kernels/kernels.h); links the
 * convenience library.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "bench.h"

#define MIB ((size_t)1 << 20)

struct kb {
	fep_pool_t *pool;
	size_t bytes;      /* input bytes per kernel */
	size_t hidden;
	/* arenas, allocated on the pool's node, first touched by its threads */
	char *in;          /* bytes * 2: inputs (and residual) */
	char *out;         /* bytes * 4: outputs (fp8 -> f32 is 4x) */
	char *msrc, *mdst; /* memcpy reference, bytes * 2 each */
	size_t in_sz, out_sz, m_sz;
	int32_t *idx;      /* row permutation / top-k indices */
	float *w, *scales, *gamma;
	size_t idx_n, sc_n;
};

struct kernel_desc;
typedef int (*kernel_fn)(struct kb *b, const struct kernel_desc *k);

struct kernel_desc {
	const char *name;
	kernel_fn fn;
	fep_k_dtype_t dt;  /* input dtype */
	fep_k_dtype_t odt; /* output dtype */
	int param;         /* block / k / n / residual */
	size_t (*bytes)(const struct kb *b, const struct kernel_desc *k);
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static size_t rows_of(const struct kb *b, fep_k_dtype_t dt)
{
	return b->bytes / (b->hidden * fep_k_dtype_size(dt));
}

/* ---- the kernels, each one call over all rows ---- */

static int k_b2f(struct kb *b, const struct kernel_desc *k)
{
	return fep_k_bf16_to_f32_mt(b->pool, (const uint16_t *)b->in,
				    (float *)b->out, b->bytes / 2);
}

static int k_f2b(struct kb *b, const struct kernel_desc *k)
{
	return fep_k_f32_to_bf16_mt(b->pool, (const float *)b->in,
				    (uint16_t *)b->out, b->bytes / 4);
}

static int k_quant(struct kb *b, const struct kernel_desc *k)
{
	size_t h = b->hidden;
	fep_k_fp8_args_t a = {
		.in = b->in, .in_dt = k->dt, .ld_in = h, .out = (uint8_t *)b->out,
		.ld_out = h, .scales = b->scales,
		.ld_scales = k->param ? (h + k->param - 1) / k->param : 1,
		.cols = h, .block = k->param, .scale_ub = 0, .pow2 = 0,
	};
	return fep_k_fp8_quant_mt(b->pool, &a, rows_of(b, k->dt));
}

static int k_dequant(struct kb *b, const struct kernel_desc *k)
{
	size_t h = b->hidden;
	fep_k_fp8dq_args_t a = {
		.in = (const uint8_t *)b->in, .ld_in = h, .scales = b->scales,
		.ld_scales = k->param ? (h + k->param - 1) / k->param : 1,
		.block = k->param, .out = b->out, .out_dt = k->odt, .ld_out = h,
		.cols = h,
	};
	return fep_k_fp8_dequant_mt(b->pool, &a, rows_of(b, FEP_K_FP8));
}

static int k_rmsnorm(struct kb *b, const struct kernel_desc *k)
{
	size_t h = b->hidden, rows = rows_of(b, k->dt);
	fep_k_rmsnorm_args_t a = {
		.in = b->in, .in_dt = k->dt, .ld_in = h,
		.residual = k->param ? b->in + b->bytes : NULL, .ld_res = h,
		.gamma = b->gamma, .eps = 1e-6f, .weight_offset = 0.0f,
		.out = b->out, .out_dt = k->odt, .ld_out = h,
		.scales = b->scales, .ld_scales = 1, .cols = h,
	};
	return fep_k_rmsnorm_mt(b->pool, &a, rows);
}

static int k_topk(struct kb *b, const struct kernel_desc *k)
{
	size_t h = b->hidden, rows = rows_of(b, k->dt);
	fep_k_topk_args_t a = {
		.y = b->in, .y_dt = k->dt, .ld_y = h, .idx = b->idx, .w = b->w,
		.k = k->param, .out = b->out, .out_dt = k->odt, .ld_out = h,
		.cols = h,
	};
	return fep_k_topk_sum_mt(b->pool, &a, rows / (size_t)k->param);
}

static int k_sum(struct kb *b, const struct kernel_desc *k)
{
	const void *in[16];
	size_t each = b->bytes / (size_t)k->param, i;
	fep_k_sum_args_t a = { in, k->param, k->dt, b->out, 0 };

	for (i = 0; i < (size_t)k->param; i++)
		in[i] = b->in + i * each;
	return fep_k_sum_mt(b->pool, &a, each / fep_k_dtype_size(k->dt));
}

static int k_perm(struct kb *b, const struct kernel_desc *k)
{
	size_t rb = b->hidden * fep_k_dtype_size(k->dt);
	fep_k_perm_args_t a = { b->in, rb, b->out, rb, rb, b->idx, 0, NULL };

	if (k->param)
		return fep_k_scatter_mt(b->pool, &a, b->bytes / rb);
	return fep_k_gather_mt(b->pool, &a, b->bytes / rb);
}

/* ---- bytes read + written per call ---- */

static size_t by_conv(const struct kb *b, const struct kernel_desc *k)
{
	/* bf16 -> f32 writes twice the input, f32 -> bf16 half */
	return k->dt == FEP_K_BF16 ? b->bytes * 3 : b->bytes + b->bytes / 2;
}

static size_t by_quant(const struct kb *b, const struct kernel_desc *k)
{
	size_t rows = rows_of(b, k->dt);
	size_t nb = k->param ? (b->hidden + k->param - 1) / k->param : 1;

	return rows * b->hidden * (fep_k_dtype_size(k->dt) + 1) + rows * nb * 4;
}

static size_t by_dequant(const struct kb *b, const struct kernel_desc *k)
{
	size_t rows = rows_of(b, FEP_K_FP8);
	size_t nb = k->param ? (b->hidden + k->param - 1) / k->param : 1;

	return rows * b->hidden * (1 + fep_k_dtype_size(k->odt)) + rows * nb * 4;
}

static size_t by_norm(const struct kb *b, const struct kernel_desc *k)
{
	size_t rows = rows_of(b, k->dt), es = fep_k_dtype_size(k->dt);
	size_t n = rows * b->hidden * (es + fep_k_dtype_size(k->odt));

	if (k->param) /* residual read and written */
		n += 2 * rows * b->hidden * es;
	if (k->odt == FEP_K_FP8)
		n += rows * 4;
	return n + b->hidden * 4;
}

static size_t by_topk(const struct kb *b, const struct kernel_desc *k)
{
	size_t tokens = rows_of(b, k->dt) / (size_t)k->param;

	return tokens * (size_t)k->param * (b->hidden * fep_k_dtype_size(k->dt) + 8) +
	       tokens * b->hidden * fep_k_dtype_size(k->odt);
}

static size_t by_sum(const struct kb *b, const struct kernel_desc *k)
{
	return b->bytes + b->bytes / (size_t)k->param;
}

static size_t by_perm(const struct kb *b, const struct kernel_desc *k)
{
	size_t rb = b->hidden * fep_k_dtype_size(k->dt), rows = b->bytes / rb;

	return rows * (2 * rb + 4);
}

static const struct kernel_desc kernels[] = {
	{ "bf16_to_f32", k_b2f, FEP_K_BF16, FEP_K_F32, 0, by_conv },
	{ "f32_to_bf16", k_f2b, FEP_K_F32, FEP_K_BF16, 0, by_conv },
	{ "fp8_quant_bf16_row", k_quant, FEP_K_BF16, FEP_K_FP8, 0, by_quant },
	{ "fp8_quant_bf16_b128", k_quant, FEP_K_BF16, FEP_K_FP8, 128, by_quant },
	{ "fp8_quant_f32_b128", k_quant, FEP_K_F32, FEP_K_FP8, 128, by_quant },
	{ "fp8_dequant_bf16_b128", k_dequant, FEP_K_FP8, FEP_K_BF16, 128, by_dequant },
	{ "fp8_dequant_f32_row", k_dequant, FEP_K_FP8, FEP_K_F32, 0, by_dequant },
	{ "rmsnorm_bf16", k_rmsnorm, FEP_K_BF16, FEP_K_BF16, 0, by_norm },
	{ "rmsnorm_bf16_res", k_rmsnorm, FEP_K_BF16, FEP_K_BF16, 1, by_norm },
	{ "rmsnorm_bf16_fp8", k_rmsnorm, FEP_K_BF16, FEP_K_FP8, 0, by_norm },
	{ "rmsnorm_f32_f32", k_rmsnorm, FEP_K_F32, FEP_K_F32, 0, by_norm },
	{ "topk8_sum_bf16", k_topk, FEP_K_BF16, FEP_K_BF16, 8, by_topk },
	{ "topk8_sum_bf16_f32", k_topk, FEP_K_BF16, FEP_K_F32, 8, by_topk },
	{ "sum4_bf16", k_sum, FEP_K_BF16, FEP_K_BF16, 4, by_sum },
	{ "sum4_f32", k_sum, FEP_K_F32, FEP_K_F32, 4, by_sum },
	{ "gather_bf16", k_perm, FEP_K_BF16, FEP_K_BF16, 0, by_perm },
	{ "scatter_bf16", k_perm, FEP_K_BF16, FEP_K_BF16, 1, by_perm },
};

/* ---- memcpy reference, split over the same threads ---- */

struct mc_ctx {
	char *dst;
	const char *src;
};

static void mc_range(void *arg, size_t r0, size_t r1)
{
	struct mc_ctx *c = arg;

	memcpy(c->dst + r0, c->src + r0, r1 - r0);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_u64);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t rnd(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static void kb_free(struct kb *b)
{
	fep_numa_free(b->in, b->in_sz);
	fep_numa_free(b->out, b->out_sz);
	fep_numa_free(b->msrc, b->m_sz);
	fep_numa_free(b->mdst, b->m_sz);
	free(b->idx);
	free(b->w);
	free(b->scales);
	free(b->gamma);
	b->in = b->out = b->msrc = b->mdst = NULL;
	b->idx = NULL;
	b->w = b->scales = b->gamma = NULL;
}

/* Allocate and fill the arenas; first touch by the pool's threads. */
static int kb_setup(struct kb *b)
{
	size_t rows = b->bytes / (b->hidden * 2), i, n;
	uint64_t s = 0x1234567;
	uint16_t *h;

	/* whole pages (the pool's first touch goes a page a row) */
	b->in_sz = FEP_ALIGN_UP(b->bytes * 2, 4096);
	/* the FP8 dequantization reads bytes of codes: to f32 it writes
	 * four times that */
	b->out_sz = FEP_ALIGN_UP(b->bytes * 4, 4096);
	b->m_sz = FEP_ALIGN_UP(b->bytes * 2, 4096);
	b->in = fep_pool_alloc(b->pool, b->in_sz / 4096, 4096);
	b->out = fep_pool_alloc(b->pool, b->out_sz / 4096, 4096);
	b->msrc = fep_pool_alloc(b->pool, b->m_sz / 4096, 4096);
	b->mdst = fep_pool_alloc(b->pool, b->m_sz / 4096, 4096);
	b->idx_n = rows;
	/* a scale per row of FP8 codes (the most rows: a byte a value),
	 * per block of 128 of a row at most, and per row of the norm */
	b->sc_n = (b->bytes / b->hidden + 1) * ((b->hidden + 127) / 128 + 1);
	b->idx = malloc(b->idx_n * sizeof(*b->idx));
	b->w = malloc(b->idx_n * sizeof(*b->w));
	b->scales = malloc(b->sc_n * sizeof(*b->scales));
	b->gamma = malloc(b->hidden * sizeof(*b->gamma));
	if (!b->in || !b->out || !b->msrc || !b->mdst || !b->idx || !b->w ||
	    !b->scales || !b->gamma) {
		fprintf(stderr, "fabep_bench: kernels: out of memory for %zu MiB "
			"arenas\n", (b->in_sz + b->out_sz + 2 * b->m_sz) / MIB);
		kb_free(b);
		return -ENOMEM;
	}
	/* bf16 activations over the whole input arena (as fp32 they are
	 * pairs of bf16: finite, varied values either way) */
	h = (uint16_t *)b->in;
	n = b->in_sz / 2;
	for (i = 0; i < n; i++) {
		float v = ((float)(int)(rnd(&s) >> 40 & 0xffff) - 32768.0f) / 4096.0f;
		h[i] = fep_f32_to_bf16(v);
	}
	memset(b->msrc, 1, b->m_sz);
	for (i = 0; i < b->sc_n; i++)
		b->scales[i] = 0.01f;
	for (i = 0; i < b->hidden; i++)
		b->gamma[i] = 1.0f + (float)(i % 7) / 100.0f;
	for (i = 0; i < rows; i++) { /* a permutation: rows land scattered */
		b->idx[i] = (int32_t)i;
		b->w[i] = 0.125f;
	}
	for (i = rows; i > 1; i--) {
		size_t j = rnd(&s) % i;
		int32_t t = b->idx[i - 1];

		b->idx[i - 1] = b->idx[j];
		b->idx[j] = t;
	}
	return 0;
}

static void print_row(FILE *out, const struct bench_opts *o, const char *name,
		      int threads, size_t bytes, uint64_t ns, size_t ref_bytes,
		      uint64_t ref_ns)
{
	double gbps = (double)bytes / (double)ns;
	double ref = (double)ref_bytes / (double)ref_ns;

	if (o->machine)
		fprintf(out, "op: kernels kernel: %s isa: %s threads: %d bytes: %zu "
			"median_us: %.1f GBps: %.2f ref_GBps: %.2f ratio: %.3f\n",
			name, fabep_isa_name(fabep_isa()), threads, bytes,
			(double)ns / 1e3, gbps, ref, gbps / ref);
	else
		fprintf(out, "%-24s %-7s %7d %12zu %12.1f %8.2f %9.2f %6.2f\n",
			name, fabep_isa_name(fabep_isa()), threads, bytes,
			(double)ns / 1e3, gbps, ref, gbps / ref);
	fflush(out);
}

static int run_kernel(struct kb *b, const struct bench_opts *o,
		      const struct kernel_desc *k, int iters, int warmup,
		      FILE *out)
{
	uint64_t *t = calloc((size_t)iters, sizeof(*t));
	uint64_t *m = calloc((size_t)iters, sizeof(*m));
	size_t bytes = k->bytes(b, k);
	size_t copy = FEP_MIN(bytes / 2, b->m_sz);
	struct mc_ctx mc = { b->mdst, b->msrc };
	int i, ret = 0;

	if (!t || !m) {
		free(t);
		free(m);
		return -ENOMEM;
	}
	/* the memcpy moves the same bytes: it copies half of them */
	for (i = -warmup; i < iters; i++) {
		uint64_t t0 = now_ns(), t1, t2;

		ret = k->fn(b, k);
		t1 = now_ns();
		if (ret) {
			fprintf(stderr, "fabep_bench: kernel %s failed: %s\n",
				k->name, strerror(-ret));
			break;
		}
		fep_pool_for(b->pool, copy, 4096, mc_range, &mc);
		t2 = now_ns();
		if (i >= 0) {
			t[i] = t1 - t0;
			m[i] = t2 - t1;
		}
	}
	if (!ret)
		print_row(out, o, k->name, fep_pool_threads(b->pool), bytes,
			  median(t, iters), 2 * copy, median(m, iters));
	free(t);
	free(m);
	return ret;
}

int bench_kernels_check(const struct bench_opts *o, char *why, size_t len)
{
	size_t bytes = o->bytes ? o->bytes : 64 * MIB;
	size_t hidden = o->hidden > 0 ? (size_t)o->hidden : 7168, i, n;

	if (bytes / 16 / 4 < hidden) {
		snprintf(why, len, "-B %zu is below 16 rows of hidden %zu (%zu bytes)",
			 bytes, hidden, hidden * 4 * 16);
		return -EINVAL;
	}
	if (!o->kernel)
		return 0;
	for (i = 0; i < FEP_ARRAY_SIZE(kernels); i++)
		if (!strcmp(o->kernel, kernels[i].name))
			return 0;
	n = (size_t)snprintf(why, len, "no kernel '%s' for -K; one of:", o->kernel);
	for (i = 0; i < FEP_ARRAY_SIZE(kernels) && n < len; i++)
		n += (size_t)snprintf(why + n, len - n, " %s", kernels[i].name);
	return -EINVAL;
}

int bench_kernels(const struct bench_opts *o, FILE *out)
{
	int iters = o->iters > 0 ? o->iters : 11;
	int warmup = o->warmup >= 0 ? o->warmup : 2;
	int counts[2], ncounts = 0, c, ret = 0;
	fep_pool_t *all = NULL;
	char why[1024];
	struct kb b;
	size_t i;

	/* fabep_bench refuses these before it calls: a backstop */
	if (bench_kernels_check(o, why, sizeof(why))) {
		fprintf(stderr, "fabep_bench: kernels: %s\n", why);
		return -EINVAL;
	}
	memset(&b, 0, sizeof(b));
	b.bytes = o->bytes ? o->bytes : 64 * MIB;
	b.hidden = o->hidden > 0 ? (size_t)o->hidden : 7168;
	b.bytes = b.bytes / (b.hidden * 4 * 16) * (b.hidden * 4 * 16);

	/* -T N: 1 and N threads; default: 1 and the pool's default count */
	ret = fep_pool_create(o->threads > 0 ? o->threads : 0, -1, 1, &all);
	if (ret) {
		fprintf(stderr, "fabep_bench: kernels: pool: %s\n", strerror(-ret));
		return ret;
	}
	counts[ncounts++] = 1;
	if (fep_pool_threads(all) > 1)
		counts[ncounts++] = fep_pool_threads(all);

	if (!o->machine) {
		fprintf(out, "# %s -o kernels: isa %s (cpu max %s), input %zu MiB, "
			"hidden %zu, NUMA node %d, median of %d (+%d warm-up)\n"
			"# GBps = (bytes read + written) / time; ref = memcpy moving "
			"the same bytes, same threads, same run\n",
			"fabep_bench", fabep_isa_name(fabep_isa()),
			fabep_isa_name(fep_k_isa_max()), b.bytes / MIB, b.hidden,
			fep_pool_node(all), iters, warmup);
		fprintf(out, "%-24s %-7s %7s %12s %12s %8s %9s %6s\n", "kernel", "isa",
			"threads", "bytes", "median_us", "GBps", "ref_GBps", "ratio");
	}
	for (c = 0; c < ncounts && !ret; c++) {
		fep_pool_t *p = NULL;

		if (counts[c] == 1) {
			ret = fep_pool_create(1, fep_pool_node(all), 1, &p);
			if (ret)
				break;
		}
		b.pool = p ? p : all;
		ret = kb_setup(&b);
		if (ret) {
			fep_pool_destroy(p);
			break;
		}
		for (i = 0; i < FEP_ARRAY_SIZE(kernels) && !ret; i++) {
			if (o->kernel && strcmp(o->kernel, kernels[i].name))
				continue;
			ret = run_kernel(&b, o, &kernels[i], iters, warmup, out);
		}
		kb_free(&b);
		fep_pool_destroy(p);
	}
	fep_pool_destroy(all);
	return ret;
}
