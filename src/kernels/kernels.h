/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * kernels.h - the local compute around every transfer: bf16 <-> fp32,
 * FP8 e4m3 quantization, RMSNorm, weighted top-k sums, n-way sums, row
 * permutes: their API, semantics and dispatch table, and the threaded
 * wrappers over the worker pool (kernels/pool.h).  The vector helpers
 * shared by the kernel files are in kernels/simd.h.
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
 *      inv = 1 / sqrt(mean(h^2) + eps)
 *      out = (h * (gamma + weight_offset)) * inv    (in that order)
 *    Output fp32, bf16 (RNE) or FP8 with one scale per row computed
 *    as above from amax, the largest finite |out|, and codes
 *    e4m3((h * (gamma + weight_offset)) * (inv * (1 / scale))).  Since
 *    rounding is monotone and inv > 0, amax is the largest |h * (gamma +
 *    weight_offset)| times inv (where both are finite): the vector
 *    levels take it in the pass of the sum of squares, and encode in a
 *    second pass over the row in cache.  The sum of squares has one
 *    order at every level (64 partial sums, element i into sum i % 64
 *    with a fused multiply-add, then halved pairwise), so every level is
 *    bitwise equal to the reference, FP8 codes and scales included.  A
 *    row that holds a NaN (its sum of squares, and so inv, is a NaN)
 *    gives the FP8 code 0x7F for every value: the sign of a NaN made
 *    from NaNs follows the operand order, which differs between the
 *    levels' paths (and with them between splits of a call's rows over
 *    threads), and no value of such a row is a number.  For the same
 *    reason the NaNs of such a row's fp32 and bf16 output, and the NaN
 *    that x + residual writes back where both are NaN, may carry either
 *    operand's payload and sign, by level and by column.
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
 * Non-temporal stores (vector levels):
 * when one call writes at least FEP_K_NT_BYTES, full aligned vectors of
 * output go past the caches (conversions, n-way sum, permutes, FP8
 * quantization (of bf16 not on AMD's CPUs: fep_k_nt_quant), dequantization
 * (not on AMD's CPUs: fep_k_nt_fp8) and
 * RMSNorm); smaller outputs stay in cache for the next step.  The
 * argument structs' nt overrides the choice (1 stream, -1 never); the
 * _mt wrappers set it from the whole call, so that a call split over a
 * pool streams as one call would, and split the conversions into pieces
 * of at least FEP_K_NT_BYTES.  The
 * top-k sum streams only when asked (nt > 0): its rows are mostly read
 * again soon (combine streams the runs other ranks copy out).
 *
 * Kernels that read a row twice (the scale's pass, then the pass that
 * writes) prefetch the next row or block group into L2 during the second
 * pass, so that the memory stays busy while they work from cache; the
 * single-pass ones that stream prefetch their input FEP_K_NT_PF ahead.
 *
 * Threads: fep_pool_t (kernels/pool.h).  Raw kernels may run
 * concurrently on disjoint row ranges; they keep no state (the dispatch
 * table is read-only once chosen).  The top-k callback runs on the worker thread that wrote the row.
 */
#ifndef FEP_KERNELS_H
#define FEP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/pool.h"
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
/* Single-pass kernels whose stores stream (the conversions, FP8
 * dequantization) prefetch their input this many bytes ahead: with
 * streaming stores the Xeons' loads stalled on each line (the hardware
 * did not fetch ahead of them), and 2 KiB ahead the kernels ran 1.3 to
 * 3 times as fast at 1 and 2 threads; with plain stores it changes
 * nothing (docs/performance.md). */
#define FEP_K_NT_PF 2048

const char *fep_k_dtype_name(fep_k_dtype_t dt);
/* Bytes of a value of dt: 4, 2, 1 (0 for no dtype).  Inline, so that
 * a kernel instantiated for one dtype gets its strides and prefetch
 * steps as constants. */
static inline size_t fep_k_dtype_size(fep_k_dtype_t dt)
{
	switch (dt) {
	case FEP_K_F32: return 4;
	case FEP_K_BF16: return 2;
	case FEP_K_FP8: return 1;
	}
	return 0;
}

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
	int nt;                /* 0: stream when this range writes FEP_K_NT_BYTES;
				* 1: stream; -1: never (the _mt wrappers decide
				* by the whole call, not each thread's share) */
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
	int nt;                /* 0: stream when this range writes FEP_K_NT_BYTES;
				* 1: stream; -1: never (the _mt wrappers decide
				* by the whole call, not each thread's share) */
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
	int nt;                /* 0: stream when this range writes FEP_K_NT_BYTES;
				* 1: stream; -1: never (the _mt wrappers decide
				* by the whole call, not each thread's share) */
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
	int nt;                /* >0: streaming stores; 0 or <0: plain ones (a
				* sum is mostly read again soon, by the caller
				* or the next step); never with cb or k > 64
				* (out is read back); rows not aligned for the
				* vector stores are written plainly */
} fep_k_topk_args_t;

typedef struct fep_k_sum_args {
	const void *const *in; /* n buffers */
	int n;                 /* >= 1 */
	fep_k_dtype_t dt;      /* F32 or BF16, in and out */
	void *out;             /* may be one of in[] exactly (no partial overlap) */
	int nt;                /* 0: stream when this range writes FEP_K_NT_BYTES;
				* 1: stream; -1: never (the _mt wrappers decide
				* by the whole call, not each thread's share) */
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
	/* gather only: entry r copies row idx[r] of src to row didx[r] of
	 * dst (NULL: to row r).  Entries in the order of their source rows
	 * read a row that goes to several places once from memory, the
	 * later copies from the cache; the didx must not repeat. */
	const int32_t *didx;
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
/* Set at start-up when the CPU has AVX512_VBMI: the AVX-512 FP8
 * quantization of bf16 rows packs its codes with one byte permute
 * (vpermt2b) and sets the signs with one logic operation per 32 values,
 * where without it a pack, a qword permute and the sign bits through a
 * mask take six operations per 64 (bitwise equal results; the tests
 * clear it to cover both). */
extern int fep_k_vbmi;
/* Whether FP8 conversions that write at least a byte for every two they
 * read stream large outputs (FEP_K_NT_BYTES): dequantization, and the
 * quantization of bf16 (fep_k_nt_quant).  Not on AMD's CPUs, where those
 * streaming stores cost more than they save (Zen 5, AVX-512 and AVX2, 1
 * and 2 threads: dequantization 0.5-0.6 of memcpy's rate against 0.8-0.9
 * with plain ones, bf16 quantization 0.5-0.7 against 0.6-0.9;
 * docs/performance.md); on Intel's they gain. */
extern int fep_k_nt_fp8;
/* Whether the AVX-512 top-k sum prefetches the next token's rows, and
 * the row gather (both levels) the next row it copies, with PREFETCHT0
 * rather than PREFETCHT1: on AMD's CPUs, where T1 of rows read soon
 * after gained little (Zen 5, 1 thread: the top-k sum 0.64-0.69 of
 * memcpy's rate with T1, 0.75-0.88 with T0; the gather 0.73-0.74 with
 * T1, 0.80-0.84 with T0); on Intel's T1 (the lent Xeon: the top-k sum
 * no faster with T0 at 1 thread, where it is at memcpy's rate already;
 * the gather above memcpy's rate with T1).  The AVX2 top-k sum keeps T1
 * (Zen 5 under AVX2: 0.74-0.76 with T1, 0.71-0.72 with T0), and so do
 * the two-pass kernels' next-row prefetches (fep_pf_t), which T0 moved
 * within the noise; docs/performance.md. */
extern int fep_k_pf_l1;
/* Whether FP8 quantization of dt streams large outputs: fp32 input, a
 * byte written for four read, everywhere; bf16 input where fep_k_nt_fp8. */
static inline int fep_k_nt_quant(fep_k_dtype_t dt)
{
	return dt != FEP_K_BF16 || fep_k_nt_fp8;
}
/* Whether a kernel's range that writes bytes streams them (the rule
 * above): the arguments' nt where set (1 stream, -1 never), else where
 * the CPU's choice for that kernel allows (may) and bytes reach
 * FEP_K_NT_BYTES.  The _mt wrappers decide once by the whole call's
 * bytes and pass the result down as nt, 1 or -1. */
static inline int fep_k_stream(int nt, int may, size_t bytes)
{
	return nt ? nt > 0 : may && bytes >= FEP_K_NT_BYTES;
}
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
 * block lengths, pre[0] = 0); with a->didx, the blocks are of entries
 * of idx and didx.  The rows are split evenly over the pool;
 * with idle, over its workers only while the caller calls idle(ictx) (as
 * fep_pool_for_idle). */
int fep_k_gather_blocks_mt(fep_pool_t *pool, const fep_k_perm_args_t *a,
			   const uint32_t *start, const uint32_t *pre, size_t nb,
			   void (*idle)(void *), void *ictx);

#endif /* FEP_KERNELS_H */
