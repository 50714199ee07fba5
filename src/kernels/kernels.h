/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * kernels.h - the local compute around every transfer: bf16 <-> fp32,
 * FP8 e4m3 quantization, RMSNorm, weighted top-k sums, n-way sums, row
 * permutes; and the NUMA-pinned worker pool that runs them.
 *
 * Layer: uses only util.  Internal (not installed).
 *
 * Every kernel exists three times with the same signature: _scalar (the
 * reference), _avx2 (AVX2 + F16C + FMA) and _avx512 (F/BW/VL/DQ).  The
 * level is chosen once, on first use, from the CPU's features; the
 * environment variable FABEP_ISA=scalar|avx2|avx512 forces a level no
 * higher than the CPU supports.  fep_k_ops() returns the chosen table.
 *
 * Every kernel works on a range [r0, r1) of rows (or, for the flat
 * element-wise kernels, of elements), so a pool can split the work:
 *   fep_k_ops()->fp8_quant(&args, r0, r1)        one thread, some rows
 *   fep_k_fp8_quant_mt(pool, &args, nrows)       every pool thread
 * The raw kernels trust their arguments; the _mt wrappers check them
 * (logging and returning -EINVAL) before any work, and accept pool ==
 * NULL (run on the calling thread).
 *
 * Numeric semantics (every level is bitwise equal to the scalar
 * reference unless said otherwise):
 *
 *  bf16: fp32 -> bf16 rounds to nearest even; NaN stays NaN (quietened:
 *    the top 16 bits with bit 6 set, sign and payload kept); subnormals
 *    are kept (no DAZ/FTZ).  The AVX-512 level uses vcvtne[2]ps2bf16
 *    where the CPU has AVX512_BF16 (same rounding and NaN rule) and the
 *    integer path for vectors holding fp32 subnormals, which that
 *    instruction flushes.  bf16 -> fp32 is exact.
 *
 *  Inputs may hold any bit pattern; the kernels do not depend on MXCSR
 *  except that FTZ/DAZ, if a caller sets them, apply to the fp32
 *  arithmetic (scale multiply, sums) at every level alike.
 *
 *  FP8 e4m3fn (OCP): bias 7, max 448 (0x7E/0xFE), NaN 0x7F/0xFF, no inf,
 *    subnormals m * 2^-9.  Encoding of a value v:
 *        q = e4m3(sat(v * (1 / scale)))
 *    i.e. v times the fp32 reciprocal of the scale (computed once per
 *    row or block; exactly v / scale when the scale is a power of two),
 *    saturated to +-448 (+-inf saturates too), then rounded to nearest
 *    even; NaN -> 0x7F (sign kept: 0xFF for negative NaN); -0 -> 0x80.
 *    Scale of a row or block: amax / 448 where amax is the largest
 *    |value| over the FINITE values of the block (NaN and +-inf are left
 *    out of amax; inf then saturates to +-448).  If scale_ub > 0 the
 *    scale is min(scale, scale_ub).  A block whose amax is 0 (all zero,
 *    or only non-finite values) gets FEP_FP8_ZERO_SCALE = 1.0f (finite,
 *    a power of two; its zeros encode as 0 anyway) before that clamp,
 *    so dequantization never sees a zero scale.  Every scale is then
 *    raised to at least FEP_FP8_MIN_SCALE = 2^-126, so 1 / scale
 *    is finite.  With pow2 the scale is finally rounded UP to a power of
 *    two (2^ceil(log2(scale)); this may exceed scale_ub by < 2x), so
 *    v / scale stays within 448.  In order:
 *        s = amax / 448;  if (s == 0) s = 1;  if (ub > 0) s = min(s, ub);
 *        s = max(s, FEP_FP8_MIN_SCALE);  if (pow2) s = 2^ceil(log2(s)).
 *    Dequantization: out = decode(q) * scale (fp32 multiply, then RNE to
 *    bf16 for bf16 output); 0x7F/0xFF decode to NaN.
 *    Scales layout: one fp32 per row (block == 0) at scales[r * ld_scales]
 *    or one per block at scales[r * ld_scales + b], b < ceil(cols/block).
 *
 *  RMSNorm (fp32 accumulation, the input's values widened to fp32):
 *      h   = in + residual        (if residual != NULL; h is rounded to
 *                                  the input dtype and written back into
 *                                  residual, and the norm uses that
 *                                  rounded h, so out == norm(residual))
 *      out = h * (1 / sqrt(mean(h^2) + eps)) * (gamma + weight_offset)
 *    Output fp32, bf16 (RNE) or FP8 with one scale per row computed
 *    from the fp32 normalized row as above.  Vector levels agree with the
 *    reference within a few fp32 ulps (different summation order), so
 *    they are compared with a tolerance, not bitwise.
 *
 *  Top-k sum: out[t] = sum_j w[t*k+j] * y[idx[t*k+j]] in fp32, j in
 *    order 0..k-1, rows with idx < 0 skipped (w may be NULL = all 1; a
 *    token with nothing routed gets zeros).  With weights the vector
 *    levels use FMA: within k fp32 ulps of the reference (w == NULL:
 *    bitwise equal).  k > 64 needs fp32 output.
 *
 *  n-way sum: out = ((in[0] + in[1]) + in[2]) + ... in fp32, in that
 *    order at every level (no FMA, no reassociation), then rounded to the
 *    dtype: bitwise equal across levels and ranks.
 *
 *  Permutes: gather dst[r] = src[idx[r]], scatter dst[idx[r]] = src[r],
 *    rows with idx < 0 skipped (destination untouched); row_bytes is any
 *    size, strides and addresses need no alignment.  Large calls
 *    (>= FEP_K_NT_BYTES written and rows >= 256 bytes) use non-temporal
 *    stores on the vector levels.  Scatter indices must be distinct.
 *
 * Non-temporal stores (AVX-512 level; AVX2 for conversions and permutes):
 * when one call writes at least FEP_K_NT_BYTES, full vectors of output go
 * past the caches (conversions, n-way sum, permutes, FP8 quantization,
 * dequantization and RMSNorm rows whose start is 64-byte aligned); smaller
 * outputs stay in cache for the next step.  Split over a pool, "one call"
 * is one worker's share.
 *
 * Threads: fep_pool_t below.  Raw kernels may run concurrently on disjoint
 * row ranges; they keep no state (the dispatch table is read-only once
 * chosen).  The top-k callback runs on the worker thread that wrote the row.
 */
#ifndef FEP_KERNELS_H
#define FEP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* ------------------------------------------------------------------ */
/* Types and constants                                                */
/* ------------------------------------------------------------------ */

typedef enum {
	FEP_K_F32 = 0,
	FEP_K_BF16 = 1,
	FEP_K_FP8 = 2, /* e4m3fn, with scales */
} fep_k_dtype_t;

#define FEP_FP8_MAX 448.0f
#define FEP_FP8_ZERO_SCALE 1.0f
#define FEP_FP8_MIN_SCALE 1.17549435e-38f /* 2^-126 */
/* Calls writing at least this many bytes use non-temporal stores. */
#define FEP_K_NT_BYTES ((size_t)4 << 20)

const char *fep_k_dtype_name(fep_k_dtype_t dt);
size_t fep_k_dtype_size(fep_k_dtype_t dt); /* 4, 2, 1 */

/* Scalar helpers shared by the kernels and the tests (the reference). */
uint16_t fep_f32_to_bf16(float f);
float fep_bf16_to_f32(uint16_t h);
uint8_t fep_f32_to_e4m3(float f);      /* already scaled; saturates, RNE */
float fep_e4m3_to_f32(uint8_t q);
/* Scale for a block with finite max |value| amax (see the rules above). */
float fep_fp8_scale(float amax, float scale_ub, int pow2);

/* ------------------------------------------------------------------ */
/* Kernel arguments                                                   */
/* ------------------------------------------------------------------ */

/* Leading dimensions (ld_*) are in ELEMENTS of the buffer's dtype
 * (bytes for FP8 data); ld >= cols. */

/* FP8 quantization: rows of bf16/fp32 -> e4m3 + scales. */
typedef struct fep_k_fp8_args {
	const void *in;
	fep_k_dtype_t in_dt;   /* FEP_K_F32 or FEP_K_BF16 */
	size_t ld_in;
	uint8_t *out;
	size_t ld_out;
	float *scales;
	size_t ld_scales;      /* >= 1 (per row) or >= ceil(cols / block) */
	size_t cols;
	int block;             /* 0: one scale per row; else a multiple of 16 (128) */
	float scale_ub;        /* > 0: upper bound of a scale; <= 0: none */
	int pow2;              /* round scales up to powers of two */
} fep_k_fp8_args_t;

/* FP8 dequantization: e4m3 + scales -> bf16/fp32 rows. */
typedef struct fep_k_fp8dq_args {
	const uint8_t *in;
	size_t ld_in;
	const float *scales;
	size_t ld_scales;
	int block;             /* as for quantization */
	void *out;
	fep_k_dtype_t out_dt;  /* FEP_K_F32 or FEP_K_BF16 */
	size_t ld_out;
	size_t cols;
} fep_k_fp8dq_args_t;

typedef struct fep_k_rmsnorm_args {
	const void *in;
	fep_k_dtype_t in_dt;   /* FEP_K_F32 or FEP_K_BF16 */
	size_t ld_in;
	void *residual;        /* NULL or rows of in_dt, updated in place */
	size_t ld_res;
	const float *gamma;    /* cols values */
	float eps;
	float weight_offset;   /* 0, or 1 for (1 + gamma) models */
	void *out;             /* may equal in (same dtype and ld) */
	fep_k_dtype_t out_dt;  /* F32, BF16 or FP8 */
	size_t ld_out;
	float *scales;         /* FP8 out: scales[r * ld_scales] */
	size_t ld_scales;
	float scale_ub;
	int pow2;
	size_t cols;
} fep_k_rmsnorm_args_t;

/* Called once per output row, after the row is written. */
typedef void (*fep_k_row_cb)(void *ctx, size_t row, void *out_row);

typedef struct fep_k_topk_args {
	const void *y;         /* rows of y_dt, read at idx */
	fep_k_dtype_t y_dt;    /* F32 or BF16 */
	size_t ld_y;
	const int32_t *idx;    /* [t * k + j]: row of y; < 0 = skip */
	const float *w;        /* [t * k + j]: weight; NULL = all 1 */
	int k;
	void *out;             /* must not overlap y */
	fep_k_dtype_t out_dt;  /* F32 or BF16 */
	size_t ld_out;
	size_t cols;
	fep_k_row_cb cb;       /* optional */
	void *cb_ctx;
} fep_k_topk_args_t;

typedef struct fep_k_sum_args {
	const void *const *in; /* n buffers */
	int n;                 /* >= 1 */
	fep_k_dtype_t dt;      /* F32 or BF16, in and out */
	void *out;             /* may be one of in[] exactly (no partial overlap) */
} fep_k_sum_args_t;

typedef struct fep_k_perm_args {
	const void *src;
	size_t src_stride;     /* bytes between rows */
	void *dst;
	size_t dst_stride;     /* bytes */
	size_t row_bytes;
	const int32_t *idx;    /* gather: src row of dst row r; scatter: dst row of src row r */
	int nt;                /* 0: stream when this range writes FEP_K_NT_BYTES;
				* 1: stream; -1: never (the _mt wrappers decide
				* by the whole call, not each thread's share) */
} fep_k_perm_args_t;

/* ------------------------------------------------------------------ */
/* The dispatch table                                                 */
/* ------------------------------------------------------------------ */

struct fep_k_ops {
	fabep_isa_t isa;
	/* flat element ranges [i0, i1) of in/out */
	void (*bf16_to_f32)(const uint16_t *in, float *out, size_t i0, size_t i1);
	void (*f32_to_bf16)(const float *in, uint16_t *out, size_t i0, size_t i1);
	void (*sum)(const fep_k_sum_args_t *a, size_t i0, size_t i1);
	/* row ranges [r0, r1) */
	void (*fp8_quant)(const fep_k_fp8_args_t *a, size_t r0, size_t r1);
	void (*fp8_dequant)(const fep_k_fp8dq_args_t *a, size_t r0, size_t r1);
	void (*rmsnorm)(const fep_k_rmsnorm_args_t *a, size_t r0, size_t r1);
	void (*topk_sum)(const fep_k_topk_args_t *a, size_t t0, size_t t1);
	void (*gather)(const fep_k_perm_args_t *a, size_t r0, size_t r1);
	void (*scatter)(const fep_k_perm_args_t *a, size_t r0, size_t r1);
};

/* The table chosen at start-up (first call; thread-safe, pthread_once). */
const struct fep_k_ops *fep_k_ops(void);
/* The table of one level, or NULL when the CPU lacks it (tests, bench). */
const struct fep_k_ops *fep_k_ops_isa(fabep_isa_t isa);
/* Set at start-up when the CPU has AVX512_BF16: the AVX-512 kernels then
 * convert fp32 -> bf16 with vcvtne[2]ps2bf16 (bitwise equal results; the
 * tests clear it to cover the integer path too). */
extern int fep_k_hw_bf16;
/* The highest level this CPU supports (ignores FABEP_ISA). */
fabep_isa_t fep_k_isa_max(void);
/* Parse "scalar"|"avx2"|"avx512"; -EINVAL otherwise. */
int fep_k_isa_parse(const char *s, fabep_isa_t *isa);

#define FEP_K_DECL(name, ...)                             \
	void fep_k_##name##_scalar(__VA_ARGS__);          \
	void fep_k_##name##_avx2(__VA_ARGS__);            \
	void fep_k_##name##_avx512(__VA_ARGS__)
FEP_K_DECL(bf16_to_f32, const uint16_t *in, float *out, size_t i0, size_t i1);
FEP_K_DECL(f32_to_bf16, const float *in, uint16_t *out, size_t i0, size_t i1);
FEP_K_DECL(sum, const fep_k_sum_args_t *a, size_t i0, size_t i1);
FEP_K_DECL(fp8_quant, const fep_k_fp8_args_t *a, size_t r0, size_t r1);
FEP_K_DECL(fp8_dequant, const fep_k_fp8dq_args_t *a, size_t r0, size_t r1);
FEP_K_DECL(rmsnorm, const fep_k_rmsnorm_args_t *a, size_t r0, size_t r1);
FEP_K_DECL(topk_sum, const fep_k_topk_args_t *a, size_t t0, size_t t1);
FEP_K_DECL(gather, const fep_k_perm_args_t *a, size_t r0, size_t r1);
FEP_K_DECL(scatter, const fep_k_perm_args_t *a, size_t r0, size_t r1);

/* Argument checks used by the _mt wrappers (log + -EINVAL). */
int fep_k_fp8_check(const fep_k_fp8_args_t *a);
int fep_k_fp8dq_check(const fep_k_fp8dq_args_t *a);
int fep_k_rmsnorm_check(const fep_k_rmsnorm_args_t *a);
int fep_k_topk_check(const fep_k_topk_args_t *a);
int fep_k_sum_check(const fep_k_sum_args_t *a);
int fep_k_perm_check(const fep_k_perm_args_t *a);

/* ------------------------------------------------------------------ */
/* Worker pool                                                        */
/* ------------------------------------------------------------------ */

typedef struct fep_pool fep_pool_t;

/*
 * Create a pool of `nthreads` threads (the caller counts as worker 0, so
 * nthreads - 1 threads are started; nthreads == 1 starts none) pinned to
 * the CPUs of NUMA node `numa_node`.
 *   nthreads <= 0: FABEP_THREADS if set, else max(1, cpus of the node
 *     that this process may use / local_ranks).  An explicit count above
 *     the node's CPUs is allowed (logged as a warning).
 *   numa_node < 0: fep_pool_default_node(-1).
 * Without NUMA support (numa_available() < 0) the node is 0 and the
 * threads run on the CPUs the process is allowed.  The calling thread is
 * never re-pinned.  Waiting workers spin briefly, then sleep on a futex.
 */
int fep_pool_create(int nthreads, int numa_node, int local_ranks,
		    fep_pool_t **pool);
void fep_pool_destroy(fep_pool_t *pool); /* NULL is ignored */
int fep_pool_threads(const fep_pool_t *pool); /* NULL: 1 */
int fep_pool_node(const fep_pool_t *pool);    /* NULL: -1 */

/* The node to use: FABEP_NUMA_NODE if set (and valid), else `nic_node`
 * if >= 0, else the node of the CPU the caller runs on (0 without NUMA).
 * Returns -EINVAL on a malformed FABEP_NUMA_NODE. */
int fep_pool_default_node(int nic_node);

/* Wake the sleeping workers without work: they spin for a while, ready
 * for a run that comes soon (a phase calls this on entry, so that waking
 * them overlaps its setup).  NULL is ignored. */
void fep_pool_wake(fep_pool_t *pool);

/* Run fn(ctx, tid, nthreads) on the caller (tid 0) and on every worker
 * that starts before the caller's fn returns, then wait for those; a
 * worker that starts later skips the run, so one that the host or the
 * kernel is slow to wake holds nobody up.  fn must therefore be a job
 * that the caller, with any of the workers, finishes (shared out by
 * claims and rescues, not by tid); each tid runs it at most once.  One
 * run at a time per pool (a communicator is used by one thread at a
 * time).  pool NULL: fn(ctx, 0, 1). */
typedef void (*fep_pool_fn)(void *ctx, int tid, int nthreads);
int fep_pool_run(fep_pool_t *pool, fep_pool_fn fn, void *ctx);

/* Call fn(ctx, r0, r1) over [0, n) on the workers, in contiguous ranges
 * that start at multiples of `grain` (grain 0 = 1) and cover every index
 * once.  The workers claim the ranges as they come (several each, about
 * a quarter of an even share at a time), so which worker runs which rows
 * is not fixed: a worker that starts late does less, and the call
 * returns once every range is done, without waiting for workers that
 * took none.  Every worker runs on the pool's node, so first touch by
 * fep_pool_for still places pages on the node that reads them. */
typedef void (*fep_pool_range_fn)(void *ctx, size_t r0, size_t r1);
int fep_pool_for(fep_pool_t *pool, size_t n, size_t grain,
		 fep_pool_range_fn fn, void *ctx);
/* fep_pool_for over the workers only, while the caller calls idle(ictx)
 * in a loop until every range is done (it drives the fabric meanwhile).
 * With one thread the caller runs fn over [0, n) itself and idle is not
 * called. */
int fep_pool_for_idle(fep_pool_t *pool, size_t n, size_t grain,
		      fep_pool_range_fn fn, void *ctx,
		      void (*idle)(void *), void *ictx);

/* Page-aligned memory on a NUMA node (node < 0 or no NUMA: local policy).
 * Not touched: the first writer places the pages. */
void *fep_numa_alloc(size_t size, int node);
void fep_numa_free(void *p, size_t size);
/* Allocate on the pool's node and zero it with the pool's threads, in
 * `nrows` rows of `row_bytes` (fep_pool_for: first touch on the pool's
 * node).  Free with fep_numa_free(p, nrows * row_bytes). */
void *fep_pool_alloc(fep_pool_t *pool, size_t nrows, size_t row_bytes);

/* ------------------------------------------------------------------ */
/* Threaded wrappers: check the arguments, then split rows over the pool */
/* ------------------------------------------------------------------ */

int fep_k_bf16_to_f32_mt(fep_pool_t *pool, const uint16_t *in, float *out,
			 size_t n);
int fep_k_f32_to_bf16_mt(fep_pool_t *pool, const float *in, uint16_t *out,
			 size_t n);
int fep_k_sum_mt(fep_pool_t *pool, const fep_k_sum_args_t *a, size_t n);
int fep_k_fp8_quant_mt(fep_pool_t *pool, const fep_k_fp8_args_t *a,
		       size_t rows);
int fep_k_fp8_dequant_mt(fep_pool_t *pool, const fep_k_fp8dq_args_t *a,
			 size_t rows);
int fep_k_rmsnorm_mt(fep_pool_t *pool, const fep_k_rmsnorm_args_t *a,
		     size_t rows);
int fep_k_topk_sum_mt(fep_pool_t *pool, const fep_k_topk_args_t *a,
		      size_t tokens);
int fep_k_gather_mt(fep_pool_t *pool, const fep_k_perm_args_t *a,
		    size_t rows);
int fep_k_scatter_mt(fep_pool_t *pool, const fep_k_perm_args_t *a,
		     size_t rows);
/* Gather the destination rows of nb blocks: block i is the rows
 * [start[i], start[i] + pre[i + 1] - pre[i]) (pre: prefix sums of the
 * block lengths, pre[0] = 0).  The rows are split evenly over the pool;
 * with idle, over its workers only while the caller calls idle(ictx) (as
 * fep_pool_for_idle). */
int fep_k_gather_blocks_mt(fep_pool_t *pool, const fep_k_perm_args_t *a,
			   const uint32_t *start, const uint32_t *pre, size_t nb,
			   void (*idle)(void *), void *ictx);


/* ------------------------------------------------------------------ */
/* For the kernel files only: target attributes and vector helpers    */
/* ------------------------------------------------------------------ */
#ifdef FEP_KERNELS_IMPL
#include <immintrin.h>
#include <string.h>

#define FEP_T_AVX2 __attribute__((target("avx2,f16c,fma")))
/* avx512bf16 is in the target so the hardware bf16 conversion can be
 * used where the CPU has it (fep_k_hw_bf16); the compiler emits those
 * instructions only for the explicit intrinsics, which run only when the
 * flag is set, so the code stays valid on AVX-512 CPUs without BF16. */
#define FEP_T_AVX512 \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
/* bodies specialized per dtype by the compiler (constant arguments) */
#define FEP_INLINE inline __attribute__((always_inline))

static inline uint32_t fep_f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float fep_u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* Scalar load/store of one value of dtype dt (F32 or BF16). */
static inline float fep_ld1(const void *p, fep_k_dtype_t dt, size_t i)
{
	if (dt == FEP_K_F32)
		return ((const float *)p)[i];
	return fep_u2f((uint32_t)((const uint16_t *)p)[i] << 16);
}

static inline uint16_t fep_bf16_rne(float f)
{
	uint32_t u = fep_f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline void fep_st1(void *p, fep_k_dtype_t dt, size_t i, float v)
{
	if (dt == FEP_K_F32)
		((float *)p)[i] = v;
	else
		((uint16_t *)p)[i] = fep_bf16_rne(v);
}

/* ---- AVX-512: 16 lanes ---- */
static inline FEP_T_AVX512 __m512i fep512_bf16_bits(__m512 v)
{
	__m512i u = _mm512_castps_si512(v);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16),
				       _mm512_set1_epi32(1));
	__m512i r = _mm512_srli_epi32(
		_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
		16);
	__mmask16 nan = _mm512_cmpgt_epi32_mask(
		_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
		_mm512_set1_epi32(0x7f800000));
	return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16),
				    _mm512_set1_epi32(0x40));
}

/* Lanes of v that are fp32 subnormals (exponent 0, mantissa != 0): the
 * hardware conversion flushes them, so they take the integer path. */
static inline FEP_T_AVX512 __mmask16 fep512_subnormals(__m512 v)
{
	__m512i u = _mm512_castps_si512(v);

	return _mm512_mask_test_epi32_mask(
		_mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)), u,
		_mm512_set1_epi32(0x007fffff));
}

/* 16 fp32 -> 16 bf16, RNE, NaN kept (quietened), subnormals kept. */
static inline FEP_T_AVX512 __m256i fep512_f32_to_bf16(__m512 v)
{
	if (fep_k_hw_bf16 && !fep512_subnormals(v))
		return (__m256i)_mm512_cvtneps_pbh(v);
	return _mm512_cvtepi32_epi16(fep512_bf16_bits(v));
}

/* 32 fp32 (a: first 16, b: next 16) -> 32 bf16 in order. */
static inline FEP_T_AVX512 __m512i fep512_f32x2_to_bf16(__m512 a, __m512 b)
{
	if (fep_k_hw_bf16 && !(fep512_subnormals(a) | fep512_subnormals(b)))
		return (__m512i)_mm512_cvtne2ps_pbh(b, a);
	return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
		_mm512_packus_epi32(fep512_bf16_bits(a), fep512_bf16_bits(b)));
}

static inline FEP_T_AVX512 __m512 fep512_load(const void *p, fep_k_dtype_t dt,
					      size_t i, __mmask16 m)
{
	if (m == 0xffff) {
		if (dt == FEP_K_F32)
			return _mm512_loadu_ps((const float *)p + i);
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
			_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i))), 16));
	}
	if (dt == FEP_K_F32)
		return _mm512_maskz_loadu_ps(m, (const float *)p + i);
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
		_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
}

static inline FEP_T_AVX512 void fep512_store(void *p, fep_k_dtype_t dt,
					     size_t i, __m512 v, __mmask16 m)
{
	if (m == 0xffff) {
		if (dt == FEP_K_F32)
			_mm512_storeu_ps((float *)p + i, v);
		else
			_mm256_storeu_si256((__m256i *)((uint16_t *)p + i),
					    fep512_f32_to_bf16(v));
		return;
	}
	if (dt == FEP_K_F32)
		_mm512_mask_storeu_ps((float *)p + i, m, v);
	else
		_mm256_mask_storeu_epi16((uint16_t *)p + i, m,
					 fep512_f32_to_bf16(v));
}

/* Like fep512_store, but streaming (non-temporal) for full vectors when
 * nt: the caller guarantees p + i is 64-byte (fp32) or 32-byte (bf16)
 * aligned whenever nt is set, and issues _mm_sfence() when done. */
static inline FEP_T_AVX512 void fep512_store_nt(void *p, fep_k_dtype_t dt,
						size_t i, __m512 v, __mmask16 m,
						int nt)
{
	if (nt && m == 0xffff) {
		if (dt == FEP_K_F32)
			_mm512_stream_ps((float *)p + i, v);
		else
			_mm256_stream_si256((__m256i *)((uint16_t *)p + i),
					    fep512_f32_to_bf16(v));
		return;
	}
	fep512_store(p, dt, i, v, m);
}

/* Store 32 values (v0 then v1) at p + i, streaming when nt (p + i then
 * 64-byte aligned): bf16 goes out as one full 64-byte line. */
static inline FEP_T_AVX512 void fep512_store32(void *p, fep_k_dtype_t dt,
					       size_t i, __m512 v0, __m512 v1,
					       int nt)
{
	if (dt == FEP_K_F32) {
		if (nt) {
			_mm512_stream_ps((float *)p + i, v0);
			_mm512_stream_ps((float *)p + i + 16, v1);
		} else {
			_mm512_storeu_ps((float *)p + i, v0);
			_mm512_storeu_ps((float *)p + i + 16, v1);
		}
	} else {
		__m512i b = fep512_f32x2_to_bf16(v0, v1);

		if (nt)
			_mm512_stream_si512((void *)((uint16_t *)p + i), b);
		else
			_mm512_storeu_si512((uint16_t *)p + i, b);
	}
}

static inline FEP_T_AVX512 __mmask16 fep512_mask(size_t n)
{
	return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* ---- AVX2: 8 lanes; partial vectors go through a stack copy ---- */
static inline FEP_T_AVX2 __m128i fep256_f32_to_bf16(__m256 v)
{
	__m256i u = _mm256_castps_si256(v);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16),
				       _mm256_set1_epi32(1));
	__m256i r = _mm256_srli_epi32(
		_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
		16);
	__m256i nan = _mm256_cmpgt_epi32(
		_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
		_mm256_set1_epi32(0x7f800000));
	__m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16),
				    _mm256_set1_epi32(0x40));
	r = _mm256_blendv_epi8(r, q, nan);
	return _mm_packus_epi32(_mm256_castsi256_si128(r),
				_mm256_extracti128_si256(r, 1));
}

static inline FEP_T_AVX2 __m256 fep256_load(const void *p, fep_k_dtype_t dt,
					    size_t i, size_t n)
{
	if (n >= 8) {
		if (dt == FEP_K_F32)
			return _mm256_loadu_ps((const float *)p + i);
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
			_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
	} else {
		float t[8] = { 0 };
		size_t j;

		for (j = 0; j < n; j++)
			t[j] = fep_ld1(p, dt, i + j);
		return _mm256_loadu_ps(t);
	}
}

static inline FEP_T_AVX2 void fep256_store(void *p, fep_k_dtype_t dt, size_t i,
					   __m256 v, size_t n)
{
	if (n >= 8) {
		if (dt == FEP_K_F32)
			_mm256_storeu_ps((float *)p + i, v);
		else
			_mm_storeu_si128((__m128i *)((uint16_t *)p + i),
					 fep256_f32_to_bf16(v));
	} else {
		float t[8];
		size_t j;

		_mm256_storeu_ps(t, v);
		for (j = 0; j < n; j++)
			fep_st1(p, dt, i + j, t[j]);
	}
}

static inline FEP_T_AVX2 float fep256_hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
			      _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline FEP_T_AVX2 float fep256_hmax(__m256 v)
{
	__m128 s = _mm_max_ps(_mm256_castps256_ps128(v),
			      _mm256_extractf128_ps(v, 1));
	s = _mm_max_ps(s, _mm_movehl_ps(s, s));
	s = _mm_max_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* ---- FP8 e4m3 encode of already scaled values (see fep_f32_to_e4m3) ---- */
static inline uint8_t fep_e4m3_enc(float f)
{
	uint32_t u = fep_f2u(f), a = u & 0x7fffffffu;
	uint32_t sign = (u >> 24) & 0x80u, code;

	if (a > 0x7f800000u)
		return (uint8_t)(sign | 0x7f);
	if (a >= 0x43e00000u) /* >= 448, inf included: saturate */
		return (uint8_t)(sign | 0x7e);
	if (a < 0x3c800000u) { /* < 2^-6: subnormal, m * 2^-9, RNE */
		float t = fep_u2f(a) * 512.0f + 8388608.0f;
		code = fep_f2u(t) - 0x4b000000u;
	} else {
		code = ((a + 0x7ffffu + ((a >> 20) & 1)) >> 20) - (120u << 3);
	}
	return (uint8_t)(sign | code);
}

/* Largest finite |value| as bits (non-finite counted as 0). */
static inline uint32_t fep_absbits_finite(float f)
{
	uint32_t a = fep_f2u(f) & 0x7fffffffu;
	return a < 0x7f800000u ? a : 0;
}

/* Codes without sign of 16 magnitudes (fp32 bits, |v| clamped to at
 * most 448, or a NaN): round to nearest even on 3 mantissa bits, or below
 * 2^-6 to a multiple of 2^-9 (c * 512 is exact, so one FMA is mul + add);
 * a NaN gives a code above 0x7f. */
static inline FEP_T_AVX512 __m512i fep512_e4m3_of_mag(__m512i c)
{
	__m512i nrm = _mm512_srli_epi32(_mm512_add_epi32(
		_mm512_add_epi32(c, _mm512_set1_epi32(0x7ffff - (960 << 20))),
		_mm512_and_si512(_mm512_srli_epi32(c, 20), _mm512_set1_epi32(1))),
		20);
	__m512 t = _mm512_fmadd_ps(_mm512_castsi512_ps(c), _mm512_set1_ps(512.0f),
				   _mm512_set1_ps(8388608.0f));

	return _mm512_mask_sub_epi32(nrm,
		_mm512_cmplt_epu32_mask(c, _mm512_set1_epi32(0x3c800000)),
		_mm512_castps_si512(t), _mm512_set1_epi32(0x4b000000));
}

/* 16 scaled values -> 16 codes in int32 lanes.  Same results as
 * fep_e4m3_enc: |v| >= 448 is clamped to 448 first (saturation). */
static inline FEP_T_AVX512 __m512i fep512_e4m3_codes(__m512 v)
{
	__m512i u = _mm512_castps_si512(v);
	__m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
	/* min(448, |v|) keeps NaN (vminps returns its second operand when
	 * either is NaN); a NaN then yields a code above 0x7f, cut to 0x7f */
	__m512i code = _mm512_min_epu32(fep512_e4m3_of_mag(_mm512_castps_si512(
		_mm512_min_ps(_mm512_set1_ps(448.0f), _mm512_castsi512_ps(a)))),
		_mm512_set1_epi32(0x7f));

	/* code | ((u >> 24) & 0x80) */
	return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(u, 24),
					 _mm512_set1_epi32(0x80), 0xf8);
}

/* 16 scaled values, none a NaN, -> 16 codes without sign in int32
 * lanes: the magnitudes of fep512_e4m3_codes.  vrangeps gives
 * min(|v|, 448) with the sign cleared in one op; it would turn a NaN
 * into 448, so blocks with a NaN take fep512_e4m3_codes. */
static inline FEP_T_AVX512 __m512i fep512_e4m3_mag(__m512 v)
{
	return fep512_e4m3_of_mag(_mm512_castps_si512(
		_mm512_range_ps(v, _mm512_set1_ps(448.0f), 0x0a)));
}

/* 32 bf16 values (one vector, no NaN) times inv -> their codes without
 * sign in 16-bit lanes, in order.  The even values are the low halves
 * shifted up, the odd ones the high halves masked: no widening shuffle. */
static inline FEP_T_AVX512 __m512i fep512_e4m3_bf16w(__m512i x, __m512 inv)
{
	__m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
	__m512 od = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));

	return _mm512_or_si512(fep512_e4m3_mag(_mm512_mul_ps(ev, inv)),
			       _mm512_slli_epi32(fep512_e4m3_mag(_mm512_mul_ps(od, inv)), 16));
}

/* 64 bf16 values (two vectors, no NaN) times inv -> 64 codes in order:
 * packed to bytes (codes are at most 0x7e), the lanes' quarters put back
 * in order, and the signs set from the bf16 sign bits through a mask
 * (adding 0x80). */
static inline FEP_T_AVX512 __m512i fep512_e4m3_bf16x64(__m512i x0, __m512i x1, __m512 inv)
{
	__m512i q = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
		_mm512_packus_epi16(fep512_e4m3_bf16w(x0, inv), fep512_e4m3_bf16w(x1, inv)));
	__mmask64 k = _mm512_kunpackd(_mm512_movepi16_mask(x1), _mm512_movepi16_mask(x0));

	return _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8((char)0x80));
}

static inline FEP_T_AVX512 __m128i fep512_e4m3(__m512 v)
{
	return _mm512_cvtepi32_epi8(fep512_e4m3_codes(v));
}

/* 4 x 16 codes (int32 lanes, each <= 0xff) -> 64 bytes in order */
static inline FEP_T_AVX512 __m512i fep512_pack4(__m512i a, __m512i b,
						__m512i c, __m512i d)
{
	__m512i x = _mm512_packus_epi16(_mm512_packus_epi32(a, b),
					_mm512_packus_epi32(c, d));
	return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13,
							  2, 6, 10, 14, 3, 7, 11, 15), x);
}

/* abs bits with non-finite lanes zeroed */
static inline FEP_T_AVX512 __m512i fep512_absbits(__m512 v)
{
	__m512i a = _mm512_and_si512(_mm512_castps_si512(v),
				     _mm512_set1_epi32(0x7fffffff));
	return _mm512_maskz_mov_epi32(
		_mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x7f800000)), a);
}

/* 8 scaled values -> 8 codes in the low 64 bits */
static inline FEP_T_AVX2 __m128i fep256_e4m3(__m256 v)
{
	__m256i u = _mm256_castps_si256(v);
	__m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
	__m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24),
					_mm256_set1_epi32(0x80));
	__m256i nrm = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_add_epi32(
		_mm256_add_epi32(a, _mm256_set1_epi32(0x7ffff)),
		_mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1))),
		20), _mm256_set1_epi32(120 << 3));
	__m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_castsi256_ps(a),
					       _mm256_set1_ps(512.0f)),
				 _mm256_set1_ps(8388608.0f));
	__m256i sub = _mm256_sub_epi32(_mm256_castps_si256(t),
				       _mm256_set1_epi32(0x4b000000));
	__m256i code = _mm256_blendv_epi8(nrm, sub,
		_mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), a));
	code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7e),
		_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43dfffff)));
	code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f),
		_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)));
	code = _mm256_or_si256(code, sign);
	code = _mm256_packus_epi32(code, code);
	code = _mm256_packus_epi16(code, code);
	return _mm_unpacklo_epi32(_mm256_castsi256_si128(code),
				  _mm256_extracti128_si256(code, 1));
}

static inline FEP_T_AVX2 __m256i fep256_absbits(__m256 v)
{
	__m256i a = _mm256_and_si256(_mm256_castps_si256(v),
				     _mm256_set1_epi32(0x7fffffff));
	return _mm256_and_si256(a, _mm256_cmpgt_epi32(
		_mm256_set1_epi32(0x7f800000), a));
}

static inline FEP_T_AVX2 uint32_t fep256_hmax_u32(__m256i v)
{
	__m128i s = _mm_max_epu32(_mm256_castsi256_si128(v),
				  _mm256_extracti128_si256(v, 1));
	s = _mm_max_epu32(s, _mm_shuffle_epi32(s, 0x4e));
	s = _mm_max_epu32(s, _mm_shuffle_epi32(s, 0xb1));
	return (uint32_t)_mm_cvtsi128_si32(s);
}

#endif /* FEP_KERNELS_IMPL */

#endif /* FEP_KERNELS_H */
