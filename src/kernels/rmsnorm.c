/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * rmsnorm.c - RMSNorm of rows, x / sqrt(mean(x^2) + eps) * (gamma +
 * weight_offset), with optional residual add and output in fp32, bf16 or
 * FP8 e4m3 with one scale per row.  Semantics in kernels.h.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/simd.h"

#define ROW(p, dt, ld, r) ((char *)(p) + (r) * (ld) * fep_k_dtype_size(dt))
#define RMS_YBUF 8192
/* gamma + weight_offset and h * gamma are read and written at
 * the same index in one loop: 32 floats apart modulo 4 KiB, so that a
 * load does not wait on a store to the same address bits */
#define RMS_SKEW 32
#define CROW(p, dt, ld, r) ((const char *)(p) + (r) * (ld) * fep_k_dtype_size(dt))

/* A thread's scratch for the norms of rows up to RMS_YBUF values: gamma
 * + weight_offset (w, from 0), h * g of a row (w, from RMS_YBUF +
 * RMS_SKEW) and the FP8 signs of gamma in even/odd order (sgn).  About
 * 72 KiB: on the stack it would overflow a coroutine's or a musl
 * thread's stack (the caller's thread runs kernels too), so each thread
 * allocates its own at its first norm and frees it when it exits.
 * Without it (no memory) a norm takes the path of longer rows, which
 * keeps nothing and gives the same bits. */
struct rms_scratch {
	float w[2 * RMS_YBUF + RMS_SKEW];
	uint64_t sgn[RMS_YBUF / sizeof(uint64_t)];
};

static pthread_key_t rms_key;
static pthread_once_t rms_once = PTHREAD_ONCE_INIT;
static int rms_key_ok;
static __thread struct rms_scratch *rms_mine;

static void rms_key_init(void)
{
	rms_key_ok = !pthread_key_create(&rms_key, free);
}

static struct rms_scratch *rms_scratch(void)
{
	struct rms_scratch *sc = rms_mine;

	if (fep_test_fault.step && fep_fault_hit("rms_scratch"))
		return NULL;
	if (sc)
		return sc;
	pthread_once(&rms_once, rms_key_init);
	/* without the key nothing would free it at the thread's exit */
	if (!rms_key_ok)
		return NULL;
	sc = aligned_alloc(64, sizeof(*sc));
	if (sc && pthread_setspecific(rms_key, sc)) {
		free(sc);
		sc = NULL;
	}
	rms_mine = sc;
	return sc;
}

/* The sum of squares of a row, in the same order at every level, so
 * that every level gives the scalar reference's bits: RMS_LANES partial
 * sums, element i going to sum i % RMS_LANES with one fused
 * multiply-add (fmaf; the vector levels' lanes), then the partial sums
 * halved pairwise (sum j += sum j + w, w = 32, 16, 8, 4, 2, 1).  Each
 * partial sum is a chain of dependent multiply-adds, so their count
 * bounds the pass that reads the row in: 64 keep four AVX-512 (eight
 * AVX2) chains in flight, enough to cover the multiply-add's latency on
 * two or more units. */
#define RMS_LANES 64

static float rms_tree(float *p)
{
	size_t w, j;

	for (w = RMS_LANES / 2; w; w /= 2)
		for (j = 0; j < w; j++)
			p[j] += p[j + w];
	return p[0];
}

/* ---- scalar reference ---- */

static inline int rms_finite(float f)
{
	return (fep_f2u(f) & 0x7fffffffu) < 0x7f800000u;
}

/* h * (gamma + weight_offset) of value i of a row */
struct hg_ctx {
	const char *h;
	fep_k_dtype_t dt;
	const float *gamma;
	float wo;
};

static inline float hg_of(const struct hg_ctx *c, size_t i)
{
	return fep_ld1(c->h, c->dt, i) * (c->gamma[i] + c->wo);
}

/* A row holding a NaN (its sum of squares, and so inv, is a NaN) gets
 * the code 0x7f for every value at every level (kernels.h); whether this
 * row is one. */
static inline int fp8_nan_row(uint8_t *out, size_t n, float inv)
{
	if (inv == inv)
		return 0;
	memset(out, 0x7f, n);
	return 1;
}

/* The FP8 scale of a row from the largest |h * g| bits m (NaN and inf
 * above 0x7f800000), for the vector levels: since rounding is monotone
 * and inv > 0, the largest finite |y| = |(h * g) * inv| is fl(m * inv)
 * where m and that product are finite; otherwise the values are gone
 * through one by one, as the reference does. */
static float fp8_row_scale(const fep_k_rmsnorm_args_t *a, uint32_t m, float inv,
			   const struct hg_ctx *hc)
{
	float mx = fep_u2f(m) * inv;
	uint32_t amax;
	size_t i;

	if (m < 0x7f800000u && rms_finite(mx))
		amax = fep_f2u(mx);
	else
		for (amax = 0, i = 0; i < a->cols; i++)
			amax = FEP_MAX(amax, fep_absbits_finite(hg_of(hc, i) * inv));
	return fep_fp8_scale(fep_u2f(amax), a->scale_ub, a->pow2);
}

void fep_k_rmsnorm_scalar(const fep_k_rmsnorm_args_t *a, size_t r0, size_t r1)
{
	fep_k_dtype_t dt = a->in_dt;
	size_t r, i, n = a->cols;

	for (r = r0; r < r1; r++) {
		const char *x = CROW(a->in, dt, a->ld_in, r);
		char *res = a->residual ? ROW(a->residual, dt, a->ld_res, r) : NULL;
		const char *h = res ? res : x;
		float part[RMS_LANES] = { 0 }, inv;
		struct hg_ctx hc = { h, dt, a->gamma, a->weight_offset };

		for (i = 0; i < n; i++) {
			float v = fep_ld1(x, dt, i);

			if (res) {
				v += fep_ld1(res, dt, i);
				fep_st1(res, dt, i, v);
				v = fep_ld1(res, dt, i); /* rounded to dt */
			}
			part[i % RMS_LANES] = fmaf(v, v, part[i % RMS_LANES]);
		}
		inv = 1.0f / sqrtf(rms_tree(part) / (float)n + a->eps);
		if (a->out_dt != FEP_K_FP8) {
			char *out = ROW(a->out, a->out_dt, a->ld_out, r);

			for (i = 0; i < n; i++)
				fep_st1(out, a->out_dt, i, hg_of(&hc, i) * inv);
		} else {
			/* the definition, which the vector levels' shortcut
			 * (fp8_row_scale) must match */
			uint8_t *out = (uint8_t *)a->out + r * a->ld_out;
			uint32_t amax = 0;
			float s, c;

			for (i = 0; i < n; i++)
				amax = FEP_MAX(amax, fep_absbits_finite(hg_of(&hc, i) * inv));
			s = fep_fp8_scale(fep_u2f(amax), a->scale_ub, a->pow2);
			a->scales[r * a->ld_scales] = s;
			if (fp8_nan_row(out, n, inv))
				continue;
			c = inv * (1.0f / s);
			for (i = 0; i < n; i++)
				out[i] = fep_e4m3_enc(hg_of(&hc, i) * c);
		}
	}
}

/* ---- AVX2 ---- */

/* 8 values of dt at p + i (all there) as fp32 */
static FEP_INLINE FEP_T_AVX2 __m256 ld8_256(const void *p, fep_k_dtype_t dt,
					    size_t i)
{
	if (dt == FEP_K_F32)
		return _mm256_loadu_ps((const float *)p + i);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
		_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
}

/* h * g for the values [i, i + 8) (zeros past n); g is gamma +
 * weight_offset, precomputed (gw) or not (gw == NULL) */
static FEP_INLINE FEP_T_AVX2 __m256 hg256(const char *h, fep_k_dtype_t dt,
					  const float *gamma, const float *gw,
					  size_t i, size_t n, __m256 wo)
{
	__m256 g;

	if (i + 8 <= n) {
		g = gw ? _mm256_loadu_ps(gw + i) :
			 _mm256_add_ps(_mm256_loadu_ps(gamma + i), wo);
		return _mm256_mul_ps(ld8_256(h, dt, i), g);
	}
	g = _mm256_add_ps(fep256_load(gamma, FEP_K_F32, i, n - i), wo);
	return _mm256_mul_ps(fep256_load(h, dt, i, n - i), g);
}

/* (h * g) * v: v = inv gives the normalized row y, v = inv * (1 / s)
 * the values the FP8 codes encode */
static FEP_INLINE FEP_T_AVX2 __m256 hgv256(const char *h, fep_k_dtype_t dt,
					   const float *gamma, const float *gw,
					   size_t i, size_t n, __m256 v, __m256 wo)
{
	return _mm256_mul_ps(hg256(h, dt, gamma, gw, i, n, wo), v);
}

/* 16 fp32 values (y0, y1) to p + i as dt, streaming when nt and p + i
 * is 32-byte aligned; fast: no NaN but the default one (bf16 output
 * then takes the short rounding) */
static FEP_INLINE FEP_T_AVX2 void st16_256(void *p, fep_k_dtype_t dt, size_t i,
					   __m256 y0, __m256 y1, int nt, int fast)
{
	if (dt == FEP_K_F32) {
		float *o = (float *)p + i;

		if (nt && !((uintptr_t)o & 31)) {
			_mm256_stream_ps(o, y0);
			_mm256_stream_ps(o + 8, y1);
		} else {
			_mm256_storeu_ps(o, y0);
			_mm256_storeu_ps(o + 8, y1);
		}
	} else {
		__m256i b = fast ? _mm256_permute4x64_epi64(_mm256_packus_epi32(
			fep256_bf16_rne_nn(y0), fep256_bf16_rne_nn(y1)), 0xd8) :
			_mm256_set_m128i(fep256_f32_to_bf16(y1), fep256_f32_to_bf16(y0));
		__m256i *o = (__m256i *)((uint16_t *)p + i);

		if (nt && !((uintptr_t)o & 31))
			_mm256_stream_si256(o, b);
		else
			_mm256_storeu_si256(o, b);
	}
}

/* Values [i, i + 8) of fp32 h + residual for the sum of squares, all
 * there: the sum is written back to the residual (bf16 rows take
 * eo_sumsq256). */
static FEP_INLINE FEP_T_AVX2 __m256 res8_256(const char *x, char *res, size_t i)
{
	__m256 v = _mm256_add_ps(_mm256_loadu_ps((const float *)x + i),
				 _mm256_loadu_ps((const float *)res + i));

	_mm256_storeu_ps((float *)res + i, v);
	return v;
}

/* 32 bf16 values (x0: the first 16) squared into acc in even/odd
 * order: acc[0] holds the partial sums 0, 2, .., 14, acc[1] 1, 3, ..,
 * 15, acc[2] 16, 18, .., 30, acc[3] 17, 19, .., 31. */
static FEP_INLINE FEP_T_AVX2 void eo_sq32(__m256i x0, __m256i x1, __m256 *acc)
{
	const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
	__m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(x0, 16));
	__m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(x0, hi));
	__m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(x1, 16));
	__m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(x1, hi));

	acc[0] = _mm256_fmadd_ps(e0, e0, acc[0]);
	acc[1] = _mm256_fmadd_ps(o0, o0, acc[1]);
	acc[2] = _mm256_fmadd_ps(e1, e1, acc[2]);
	acc[3] = _mm256_fmadd_ps(o1, o1, acc[3]);
}

/* 16 bf16 values x plus 16 bf16 values r (one vector each), each sum
 * rounded to bf16 as fep256_f32_to_bf16 rounds it, in order: the sums
 * of the even values round into the low halves of the words, those of
 * the odd ones into the high halves, so that no widening or packing
 * shuffle is needed.  No NaN rule: a NaN sum of bf16 values is one of
 * them made quiet, or the default NaN, so its low 16 bits are zero, the
 * rounding leaves its high half as it is, and that half is what the
 * rule gives (quiet bit set). */
static FEP_INLINE FEP_T_AVX2 __m256i eo_add16(__m256i x, __m256i r)
{
	const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);

	return fep256_bf16_eo_nn(_mm256_castps_si256(_mm256_add_ps(
		_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
		_mm256_castsi256_ps(_mm256_slli_epi32(r, 16)))),
		_mm256_castps_si256(_mm256_add_ps(
		_mm256_castsi256_ps(_mm256_and_si256(x, hi)),
		_mm256_castsi256_ps(_mm256_and_si256(r, hi)))));
}

/* 32 bf16 values at x + i (all there) squared into acc as eo_sq32
 * does; with ga, their largest |h * g| bits into mm[0] (the even
 * values) and mm[1] (eo_sumsq256).
 * With res, the values are x + res rounded to bf16 (eo_add16), written
 * back to res. */
static FEP_INLINE FEP_T_AVX2 void eo_sq32_at(const uint16_t *x, uint16_t *res,
					     size_t i, const float *ga,
					     __m256 *acc, __m256i *mm)
{
	const __m256i a16 = _mm256_set1_epi32(0x7fff7fff);
	const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
	__m256i x0 = _mm256_loadu_si256((const __m256i *)(x + i));
	__m256i x1 = _mm256_loadu_si256((const __m256i *)(x + i + 16));
	size_t q;

	if (res) {
		x0 = eo_add16(x0, _mm256_loadu_si256((const __m256i *)(res + i)));
		x1 = eo_add16(x1, _mm256_loadu_si256((const __m256i *)(res + i + 16)));
		_mm256_storeu_si256((__m256i *)(res + i), x0);
		_mm256_storeu_si256((__m256i *)(res + i + 16), x1);
	}
	if (ga) {
		x0 = _mm256_and_si256(x0, a16);
		x1 = _mm256_and_si256(x1, a16);
		#pragma GCC unroll 2
		for (q = 0; q < 2; q++) {
			__m256i v = q ? x1 : x0;

			mm[0] = _mm256_max_epu32(mm[0], _mm256_castps_si256(
				_mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
					      _mm256_load_ps(ga + i + 16 * q))));
			mm[1] = _mm256_max_epu32(mm[1], _mm256_castps_si256(
				_mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)),
					      _mm256_load_ps(ga + i + 16 * q + 8))));
		}
	}
	eo_sq32(x0, x1, acc);
}

/* The sum of squares of a bf16 row as sumsq256, in even/odd order
 * (eo_sq32): values [0, 32) of each 64 into acc[0..3], [32, 64) into
 * acc[4..7]; the tree's first two steps pair the same sums, then the
 * partial sums are put back in order for the rest.  With res, of the
 * row plus res, rounded to bf16 and written back to res.  With
 * ga (|gamma + weight_offset| of [0, n32) in the even/odd order of
 * eo_gamma256), *m gets the largest |h * g| bits of [0, n32) too
 * (eo_sumsq512). */
static FEP_INLINE FEP_T_AVX2 float eo_sumsq256(const uint16_t *x, uint16_t *res,
					       size_t n, const float *ga, __m256i *m)
{
	__m256 acc[8], e, o, lo, hi;
	/* two maxima (of the even and of the odd values): with the eight
	 * sums, sixteen registers hold no more */
	__m256i mm[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
	size_t i, q;

	#pragma GCC unroll 8
	for (q = 0; q < 8; q++)
		acc[q] = _mm256_setzero_ps();
	for (i = 0; i + 64 <= n; i += 64) {
		eo_sq32_at(x, res, i, ga, acc, mm);
		eo_sq32_at(x, res, i + 32, ga, acc + 4, mm);
	}
	if (i + 32 <= n) {
		eo_sq32_at(x, res, i, ga, acc, mm);
		i += 32;
	}
	if (ga)
		*m = _mm256_max_epu32(mm[0], mm[1]);
	if (i < n) { /* zeros leave the sums as they are */
		uint16_t t[32] __attribute__((aligned(32))) = { 0 };
		__m256i t0, t1;

		memcpy(t, x + i, (n - i) * sizeof(*t));
		t0 = _mm256_load_si256((const __m256i *)t);
		t1 = _mm256_load_si256((const __m256i *)t + 1);
		if (res) {  /* 0 + 0 rounds to 0 */
			memcpy(t, res + i, (n - i) * sizeof(*t));
			t0 = eo_add16(t0, _mm256_load_si256((const __m256i *)t));
			t1 = eo_add16(t1, _mm256_load_si256((const __m256i *)t + 1));
			_mm256_store_si256((__m256i *)t, t0);
			_mm256_store_si256((__m256i *)t + 1, t1);
			memcpy(res + i, t, (n - i) * sizeof(*t));
		}
		if (i % 64)
			eo_sq32(t0, t1, acc + 4);
		else
			eo_sq32(t0, t1, acc);
	}
	/* w = 32, then w = 16: sums 0, 2, .., 14 (e) and 1, 3, .., 15 (o) */
	#pragma GCC unroll 4
	for (q = 0; q < 4; q++)
		acc[q] = _mm256_add_ps(acc[q], acc[q + 4]);
	e = _mm256_add_ps(acc[0], acc[2]);
	o = _mm256_add_ps(acc[1], acc[3]);
	/* in order: lo = sums 0..3 | 8..11, hi = 4..7 | 12..15 */
	lo = _mm256_unpacklo_ps(e, o);
	hi = _mm256_unpackhi_ps(e, o);
	return fep256_hsum(_mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20),
					 _mm256_permute2f128_ps(lo, hi, 0x31)));
}

/* The sum of squares of a row (rms_tree's order) and, with res, the
 * residual add. */
static FEP_INLINE FEP_T_AVX2 float sumsq256(const char *x, char *res,
					    fep_k_dtype_t dt, size_t n)
{
	__m256 acc[8];
	size_t i, q;

	if (dt == FEP_K_BF16)
		return eo_sumsq256((const uint16_t *)x, (uint16_t *)res, n, NULL, NULL);
	#pragma GCC unroll 8
	for (q = 0; q < 8; q++)
		acc[q] = _mm256_setzero_ps();
	/* lanes of acc[q]: partial sums 8q..8q+7 */
	for (i = 0; i + 64 <= n; i += 64)
		#pragma GCC unroll 8
		for (q = 0; q < 8; q++) {
			__m256 v = res ? res8_256(x, res, i + 8 * q) :
					 ld8_256(x, dt, i + 8 * q);

			acc[q] = _mm256_fmadd_ps(v, v, acc[q]);
		}
	#pragma GCC unroll 8
	for (q = 0; q < 8; q++) {
		size_t k = i + 8 * q;
		__m256 v;

		if (k >= n)
			break;
		v = fep256_load(x, dt, k, n - k);
		if (res) {
			v = _mm256_add_ps(v, fep256_load(res, dt, k, n - k));
			fep256_store(res, dt, k, v, n - k);
		}
		acc[q] = _mm256_fmadd_ps(v, v, acc[q]);
	}
	/* w = 32, 16, 8, then the lanes' 4, 2, 1 */
	#pragma GCC unroll 4
	for (q = 0; q < 4; q++)
		acc[q] = _mm256_add_ps(acc[q], acc[q + 4]);
	return fep256_hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[2]),
					 _mm256_add_ps(acc[1], acc[3])));
}

/* Codes of (h * g) * c for a row to out, h * g from ybuf (natural
 * order) or, ybuf NULL, recomputed; nan: the values may hold NaNs (inf
 * and values to saturate are handled either way).  It prefetches the
 * next row, as eo_enc256 does. */
static FEP_INLINE FEP_T_AVX2 void enc_row256(uint8_t *out, const float *ybuf,
					     const char *h, fep_k_dtype_t dt,
					     const float *gamma, const float *gw,
					     size_t n, __m256 vc, __m256 wo,
					     int nan, int nt, fep_pf_t *px, fep_pf_t *pr)
{
	size_t i, q, es = fep_k_dtype_size(dt);

	for (i = 0; i + 32 <= n; i += 32) {
		__m256 v[4];
		__m256i c;

		if (ybuf)
			#pragma GCC unroll 4
			for (q = 0; q < 4; q++)
				v[q] = _mm256_mul_ps(_mm256_load_ps(ybuf + i + 8 * q), vc);
		else
			#pragma GCC unroll 4
			for (q = 0; q < 4; q++)
				v[q] = hgv256(h, dt, gamma, gw, i + 8 * q, n, vc, wo);
		c = nan ? fep256_e4m3_x32(v, 1) : fep256_e4m3_x32(v, 0);
		if (nt && !((uintptr_t)(out + i) & 31))
			_mm256_stream_si256((__m256i *)(out + i), c);
		else
			_mm256_storeu_si256((__m256i *)(out + i), c);
		fep_pf_step(px, 32 * es);
		fep_pf_step(pr, 32 * es);
	}
	if (i < n) {
		__m256 v[4];
		uint8_t t[32];

		#pragma GCC unroll 4
		for (q = 0; q < 4; q++)
			v[q] = i + 8 * q < n ? hgv256(h, dt, gamma, gw, i + 8 * q, n, vc, wo) :
					       _mm256_setzero_ps();
		_mm256_storeu_si256((__m256i *)t, fep256_e4m3_x32(v, 1));
		memcpy(out + i, t, n - i);
	}
}

/* FP8 output of bf16 rows, the first n32 = n & ~31 values in even/odd
 * order: 16 bf16 values (one vector) are read as two fp32 vectors
 * without a widening shuffle, the even values (low halves shifted up)
 * and the odd ones (high halves masked), as fep256_e4m3_bf16x16 does.
 * For each 16 values, ga holds gamma + weight_offset of the 8 even
 * then of the 8 odd ones (for FP8, with gs, their absolute values).
 * |h * g| = |h| * |g| and the code's magnitude of (h * g) * c is that
 * of (|h| * |g|) * c exactly (c > 0; NaN rows take the general path),
 * so the amax and the encoding need no sign, and the encoding pass gets
 * the signs, sign(h) ^ sign(g), from the bf16 sign bits as
 * _mm256_packs_epi16 of 32 values orders them, xor gs (the sign bytes
 * of g in that order). */
static FEP_T_AVX2 void eo_gamma256(const float *gamma, float wo, size_t n32,
				   float *ga, uint8_t *gs)
{
	const __m256 vw = _mm256_set1_ps(wo);
	const __m256 mag = _mm256_castsi256_ps(_mm256_set1_epi32(gs ? 0x7fffffff : -1));
	size_t i;
	int k;

	/* Per call and per thread's share of the rows, so vector code: a
	 * scalar pass cost as much as several rows. */
	for (i = 0; i < n32; i += 32) {
		__m256 g[4];
		__m256i p, q;

		for (k = 0; k < 4; k++)
			g[k] = _mm256_add_ps(_mm256_loadu_ps(gamma + i + 8 * k), vw);
		/* per 16 values: the 8 even, then the 8 odd ones (for FP8,
		 * their absolute values); the in-lane shuffle leaves the
		 * pairs of each 128-bit lane apart, the qword permute puts
		 * them in order */
		for (k = 0; k < 4; k += 2) {
			__m256 e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(
				_mm256_shuffle_ps(g[k], g[k + 1], 0x88)), 0xd8));
			__m256 o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(
				_mm256_shuffle_ps(g[k], g[k + 1], 0xdd)), 0xd8));

			_mm256_storeu_ps(ga + i + 8 * k, _mm256_and_ps(e, mag));
			_mm256_storeu_ps(ga + i + 8 * k + 8, _mm256_and_ps(o, mag));
		}
		if (!gs)
			continue;
		/* byte j of 32: its lane (j / 16), the vector (j / 8 % 2:
		 * the first or second 16 values), the word in that lane
		 * (j % 8).  The signs as 0 / -1 words, packed to bytes, come
		 * out as dwords of four values 0-3, 16-19, 8-11, 24-27 | 4-7,
		 * 20-23, 12-15, 28-31; the dword permute puts them in that
		 * order. */
		p = _mm256_packs_epi32(_mm256_srai_epi32(_mm256_castps_si256(g[0]), 31),
				       _mm256_srai_epi32(_mm256_castps_si256(g[2]), 31));
		q = _mm256_packs_epi32(_mm256_srai_epi32(_mm256_castps_si256(g[1]), 31),
				       _mm256_srai_epi32(_mm256_castps_si256(g[3]), 31));
		p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p, q),
						_mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
		_mm256_storeu_si256((__m256i *)(gs + i),
				    _mm256_and_si256(p, _mm256_set1_epi8((char)0x80)));
	}
}

/* The largest |h * g| bits of [0, n32) of a bf16 row in even/odd
 * order (NaN and inf included), for rows whose first pass was the
 * residual add. */
static FEP_INLINE FEP_T_AVX2 __m256i eo_hgmax256(const uint16_t *h, size_t n32,
						 const float *ga)
{
	const __m256i a16 = _mm256_set1_epi32(0x7fff7fff);
	const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
	__m256i m[4];
	size_t i, q;

	#pragma GCC unroll 4
	for (q = 0; q < 4; q++)
		m[q] = _mm256_setzero_si256();
	for (i = 0; i < n32; i += 32)
		#pragma GCC unroll 2
		for (q = 0; q < 2; q++) {
			size_t k = i + 16 * q;
			__m256i xa = _mm256_and_si256(_mm256_loadu_si256(
				(const __m256i *)(h + k)), a16);

			m[2 * q] = _mm256_max_epu32(m[2 * q], _mm256_castps_si256(
				_mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(xa, 16)),
					      _mm256_load_ps(ga + k))));
			m[2 * q + 1] = _mm256_max_epu32(m[2 * q + 1], _mm256_castps_si256(
				_mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(xa, hi)),
					      _mm256_load_ps(ga + k + 8))));
		}
	return _mm256_max_epu32(_mm256_max_epu32(m[0], m[1]),
				_mm256_max_epu32(m[2], m[3]));
}

/* bf16 output of [0, n32) of a bf16 row in even/odd order (ga signed),
 * for rows with no NaN but the default one (fep256_bf16_rne_nn): the
 * rounded even values are the low halves of the output words and the
 * odd ones the high halves, so the words come out in order.  32 values
 * an iteration: the prefetch steps are then whole lines, a test and a
 * prefetch each, where steps of 32 bytes took the cursor's general loop
 * and as many scalar instructions as vector ones. */
static FEP_INLINE FEP_T_AVX2 void eo_bf16_256(uint16_t *out, const uint16_t *h,
					      size_t n32, const float *ga, __m256 vi,
					      int nt, fep_pf_t *px, fep_pf_t *pr)
{
	const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
	size_t i, j, q;

	for (i = 0; i < n32; i += 32) {
		#pragma GCC unroll 2
		for (q = 0; q < 2; q++) {
			__m256i x, ye, yo, b;

			j = i + 16 * q;
			x = _mm256_loadu_si256((const __m256i *)(h + j));
			ye = _mm256_castps_si256(_mm256_mul_ps(_mm256_mul_ps(
				_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
				_mm256_load_ps(ga + j)), vi));
			yo = _mm256_castps_si256(_mm256_mul_ps(_mm256_mul_ps(
				_mm256_castsi256_ps(_mm256_and_si256(x, hi)),
				_mm256_load_ps(ga + j + 8)), vi));
			b = fep256_bf16_eo_nn(ye, yo);
			if (nt && !((uintptr_t)(out + j) & 31))
				_mm256_stream_si256((__m256i *)(out + j), b);
			else
				_mm256_storeu_si256((__m256i *)(out + j), b);
		}
		fep_pf_step(px, 64);
		fep_pf_step(pr, 64);
	}
}

/* The encoding pass of [0, n32) of a bf16 row in even/odd order, for
 * rows whose |h * g| * c are all below 464 (no clamp) and finite: the
 * magnitudes (|h| * |g|) * c, the signs from h and gs.  It prefetches
 * the next row. */
static FEP_INLINE FEP_T_AVX2 void eo_enc256(uint8_t *out, const uint16_t *h,
					    size_t n32, const float *ga,
					    const uint8_t *gs, __m256 vc, int nt,
					    fep_pf_t *px, fep_pf_t *pr)
{
	const __m256i a16 = _mm256_set1_epi32(0x7fff7fff);
	const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
	size_t i, q;

	for (i = 0; i < n32; i += 32) {
		__m256i x[2], c[2], sg;

		#pragma GCC unroll 2
		for (q = 0; q < 2; q++) {
			__m256i xa;

			x[q] = _mm256_loadu_si256((const __m256i *)(h + i + 16 * q));
			xa = _mm256_and_si256(x[q], a16);
			c[q] = fep256_e4m3_eo16(
				_mm256_castps_si256(_mm256_mul_ps(_mm256_mul_ps(
					_mm256_castsi256_ps(_mm256_slli_epi32(xa, 16)),
					_mm256_load_ps(ga + i + 16 * q)), vc)),
				_mm256_castps_si256(_mm256_mul_ps(_mm256_mul_ps(
					_mm256_castsi256_ps(_mm256_and_si256(xa, hi)),
					_mm256_load_ps(ga + i + 16 * q + 8)), vc)));
		}
		sg = _mm256_and_si256(_mm256_xor_si256(_mm256_packs_epi16(x[0], x[1]),
			_mm256_loadu_si256((const __m256i *)(gs + i))),
			_mm256_set1_epi8((char)0x80));
		c[0] = _mm256_permute4x64_epi64(_mm256_or_si256(
			_mm256_packus_epi16(c[0], c[1]), sg), 0xd8);
		if (nt && !((uintptr_t)(out + i) & 31))
			_mm256_stream_si256((__m256i *)(out + i), c[0]);
		else
			_mm256_storeu_si256((__m256i *)(out + i), c[0]);
		fep_pf_step(px, 64);
		fep_pf_step(pr, 64);
	}
}

static FEP_INLINE FEP_T_AVX2 void norm256(const fep_k_rmsnorm_args_t *a,
					  size_t r0, size_t r1,
					  const fep_k_dtype_t dt,
					  const fep_k_dtype_t odt)
{
	size_t r, i, n = a->cols, es = fep_k_dtype_size(dt);
	const __m256 wo = _mm256_set1_ps(a->weight_offset);
	const float *gamma = a->gamma, *gw = NULL;
	int nt = fep_k_stream(a->nt, 1, (r1 - r0) * n * fep_k_dtype_size(odt));
	/* gamma + weight_offset, once per call; for FP8 output of the
	 * general path also h * g, kept between the amax and the encoding
	 * pass (longer rows recompute it) */
	struct rms_scratch *sc = n <= RMS_YBUF ? rms_scratch() : NULL;
	float *gbuf = sc ? sc->w : NULL, *ybuf = sc ? sc->w + RMS_YBUF + RMS_SKEW : NULL;
	int keep = sc != NULL, gnan = 0;
	/* bf16 to FP8 in even/odd order (eo_gamma256): gbuf holds |g| in
	 * that order, gsgn the signs */
	int eo = dt == FEP_K_BF16 && odt != FEP_K_F32 && keep && r1 - r0 > 1;
	size_t n32 = n & ~(size_t)31;
	uint8_t *gsgn = sc ? (uint8_t *)sc->sgn : NULL;

	if (eo)
		eo_gamma256(gamma, a->weight_offset, n32, gbuf,
			    odt == FEP_K_FP8 ? gsgn : NULL);
	/* a NaN in gamma (or the offset) would reach the output with its
	 * payload, which the short bf16 rounding does not handle; vector
	 * code, as eo_gamma256 */
	if (!eo && keep && r1 - r0 > 1)
		gw = gbuf;
	{
		__m256 un = _mm256_setzero_ps();

		for (i = 0; i + 8 <= n; i += 8) {
			__m256 g = _mm256_add_ps(_mm256_loadu_ps(gamma + i), wo);

			if (gw)
				_mm256_storeu_ps(gbuf + i, g);
			un = _mm256_or_ps(un, _mm256_cmp_ps(g, g, _CMP_UNORD_Q));
		}
		gnan = _mm256_movemask_ps(un) != 0;
		for (; i < n; i++) {
			float g = gamma[i] + a->weight_offset;

			if (gw)
				gbuf[i] = g;
			gnan |= g != g;
		}
	}
	for (r = r0; r < r1; r++) {
		const char *x = CROW(a->in, dt, a->ld_in, r);
		char *res = a->residual ? ROW(a->residual, dt, a->ld_res, r) : NULL;
		const char *h = res ? res : x;
		__m256 vi;
		float inv;
		fep_pf_t px, pr;

		/* the next row's input (and residual), while this one is
		 * worked on from cache */
		fep_pf_init(&px, r + 1 < r1 ? x + a->ld_in * es : NULL, n * es);
		fep_pf_init(&pr, res && r + 1 < r1 ? res + a->ld_res * es : NULL, n * es);
		__m256i mhg = _mm256_setzero_si256();
		/* FP8 output of bf16 rows gets the largest |h * g| in the
		 * pass of the sum of squares */
		float ss = eo && odt == FEP_K_FP8 && !res ?
			   eo_sumsq256((const uint16_t *)x, NULL, n, gbuf, &mhg) :
			   sumsq256(x, res, dt, n);

		inv = 1.0f / sqrtf(ss / (float)n + a->eps);
		vi = _mm256_set1_ps(inv);
		if (odt != FEP_K_FP8) {
			char *out = ROW(a->out, odt, a->ld_out, r);
			/* a NaN in h makes ss a NaN; other NaNs are default */
			int fast = !gnan && ss == ss;

			i = 0;
			if (eo && fast) {
				eo_bf16_256((uint16_t *)out, (const uint16_t *)h, n32, gbuf, vi,
					    nt, &px, &pr);
				i = n32;
			}
			for (; i + 16 <= n; i += 16) {
				st16_256(out, odt, i, hgv256(h, dt, gamma, eo ? NULL : gw, i, n, vi, wo),
					 hgv256(h, dt, gamma, eo ? NULL : gw, i + 8, n, vi, wo), nt, fast);
				fep_pf_step(&px, 16 * es);
				fep_pf_step(&pr, 16 * es);
			}
			for (; i < n; i += 8)
				fep256_store(out, odt, i, hgv256(h, dt, gamma, eo ? NULL : gw, i, n,
								  vi, wo), n - i);
		} else {
			/* the largest |h * g| (NaN and inf above the finite
			 * values) gives the scale (fp8_row_scale); the codes are
			 * of (h * g) * c, c = inv * (1 / s), from h * g kept in ybuf
			 * (rows up to 32 KiB of the general path) or recomputed */
			uint8_t *out = (uint8_t *)a->out + r * a->ld_out;
			__m256i m = eo && !res ? mhg : _mm256_setzero_si256();
			struct hg_ctx hc = { h, dt, gamma, a->weight_offset };
			int kept = keep && !eo;
			uint32_t mb;
			__m256 vc;
			float s, c;

			i = 0;
			if (eo) {
				if (res)
					m = eo_hgmax256((const uint16_t *)h, n32, gbuf);
				i = n32;
			} else if (kept) {
				__m256i m1 = m;

				for (; i + 16 <= n; i += 16) {
					__m256 hg0 = hg256(h, dt, gamma, gw, i, n, wo);
					__m256 hg1 = hg256(h, dt, gamma, gw, i + 8, n, wo);

					_mm256_store_ps(ybuf + i, hg0);
					_mm256_store_ps(ybuf + i + 8, hg1);
					m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(hg0),
						_mm256_set1_epi32(0x7fffffff)));
					m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_castps_si256(hg1),
						_mm256_set1_epi32(0x7fffffff)));
				}
				m = _mm256_max_epu32(m, m1);
			}
			for (; i < n; i += 8) {
				__m256 hg = hg256(h, dt, gamma, eo ? NULL : gw, i, n, wo);

				if (kept)
					_mm256_store_ps(ybuf + i, hg);
				m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(hg),
					_mm256_set1_epi32(0x7fffffff)));
			}
			mb = fep256_hmax_u32(m);
			s = fp8_row_scale(a, mb, inv, &hc);
			a->scales[r * a->ld_scales] = s;
			if (fp8_nan_row(out, n, inv))
				continue;
			c = inv * (1.0f / s);
			vc = _mm256_set1_ps(c);
			if (eo && fep_e4m3_short(mb >= 0x7f800000u, fep_u2f(mb), c)) {
				const uint16_t *hw = (const uint16_t *)h;

				eo_enc256(out, hw, n32, gbuf, gsgn, vc, nt, &px, &pr);
				if (n32 < n)
					enc_row256(out + n32, NULL, (const char *)(hw + n32), dt,
						   gamma + n32, NULL, n - n32, vc, wo, 1, nt,
						   &px, &pr);
				continue;
			}
			enc_row256(out, kept ? ybuf : NULL, h, dt, gamma,
				   eo ? NULL : gw, n, vc, wo,
				   !(mb < 0x7f800000u && rms_finite(c)), nt, &px, &pr);
		}
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX2 void fep_k_rmsnorm_avx2(const fep_k_rmsnorm_args_t *a, size_t r0, size_t r1)
{
	if (a->in_dt == FEP_K_BF16) {
		if (a->out_dt == FEP_K_BF16)
			norm256(a, r0, r1, FEP_K_BF16, FEP_K_BF16);
		else if (a->out_dt == FEP_K_F32)
			norm256(a, r0, r1, FEP_K_BF16, FEP_K_F32);
		else
			norm256(a, r0, r1, FEP_K_BF16, FEP_K_FP8);
	} else {
		if (a->out_dt == FEP_K_BF16)
			norm256(a, r0, r1, FEP_K_F32, FEP_K_BF16);
		else if (a->out_dt == FEP_K_F32)
			norm256(a, r0, r1, FEP_K_F32, FEP_K_F32);
		else
			norm256(a, r0, r1, FEP_K_F32, FEP_K_FP8);
	}
}

/* ---- AVX-512 ---- */

/* Values [i, i + 16) of fp32 in + residual (mask k): the sum is
 * written back to the residual (bf16 rows take eo_sumsq512). */
static FEP_INLINE FEP_T_AVX512 __m512 res512(const char *x, char *res, size_t i,
					     __mmask16 k)
{
	__m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, (const float *)x + i),
				 _mm512_maskz_loadu_ps(k, (const float *)res + i));

	_mm512_mask_storeu_ps((float *)res + i, k, v);
	return v;
}

/* 16 scaled values, none a NaN, -> 16 codes (fep512_e4m3_codes) */
static inline FEP_T_AVX512 __m512i yb_fast(__m512 v)
{
	return _mm512_ternarylogic_epi32(fep512_e4m3_mag(v), _mm512_srli_epi32(
		_mm512_castps_si512(v), 24), _mm512_set1_epi32(0x80), 0xf8);
}

/* 32 bf16 values v squared into ae (the even ones) and ao (the odd);
 * with ga (the |gamma + weight_offset| of these values, eo_gamma512),
 * their largest |h * g| bits into m0 and m1 too. */
static FEP_INLINE FEP_T_AVX512 void eo_sq32_512(__m512i v, const float *ga,
						__m512 *ae, __m512 *ao,
						__m512i *m0, __m512i *m1)
{
	__m512 ev, od;

	if (ga)
		v = _mm512_and_si512(v, _mm512_set1_epi32(0x7fff7fff));
	ev = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
	od = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
	*ae = _mm512_fmadd_ps(ev, ev, *ae);
	*ao = _mm512_fmadd_ps(od, od, *ao);
	if (ga) {
		*m0 = _mm512_max_epu32(*m0, _mm512_castps_si512(
			_mm512_mul_ps(ev, _mm512_load_ps(ga))));
		*m1 = _mm512_max_epu32(*m1, _mm512_castps_si512(
			_mm512_mul_ps(od, _mm512_load_ps(ga + 16))));
	}
}

/* 32 bf16 values x plus 32 bf16 values r (one vector each), rounded to
 * bf16 as eo_add16 does (the NaN rule holds without a step of its
 * own), in order. */
static FEP_INLINE FEP_T_AVX512 __m512i eo_add32_512(__m512i x, __m512i r)
{
	const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);

	return fep512_bf16_eo_nn(_mm512_castps_si512(_mm512_add_ps(
		_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
		_mm512_castsi512_ps(_mm512_slli_epi32(r, 16)))),
		_mm512_castps_si512(_mm512_add_ps(
		_mm512_castsi512_ps(_mm512_and_si512(x, hi)),
		_mm512_castsi512_ps(_mm512_and_si512(r, hi)))));
}

/* 32 bf16 values at x + i, the tail's n of them where n < 32; with
 * res, x + res (eo_add32_512), written back to res. */
static FEP_INLINE FEP_T_AVX512 __m512i eo_ld32_512(const uint16_t *x, uint16_t *res,
						   size_t i, size_t n)
{
	__mmask32 k = n >= 32 ? (__mmask32)-1 : (__mmask32)((1u << n) - 1);
	__m512i v = n >= 32 ? _mm512_loadu_si512(x + i) : _mm512_maskz_loadu_epi16(k, x + i);

	if (!res)
		return v;
	/* a tail's lanes past n: 0 + 0, which rounds to 0 */
	v = eo_add32_512(v, n >= 32 ? _mm512_loadu_si512(res + i) :
			    _mm512_maskz_loadu_epi16(k, res + i));
	if (n >= 32)
		_mm512_storeu_si512(res + i, v);
	else
		_mm512_mask_storeu_epi16(res + i, k, v);
	return v;
}

/* The sum of squares of a bf16 row up to the tree's step w = 8 (with
 * res, of the row plus res, rounded to bf16 and written back to res),
 * in even/odd order as eo_sumsq256: 32 values per vector,
 * a0 holds the partial sums 0, 2, .., 30 and a1 1, 3, .., 31 (values
 * [0, 32) of each 64), a2 and a3 32, 34, .., 62 and 33, 35, .., 63, so
 * the step w = 32 adds a2 to a0 and a3 to a1, and w = 16 lanes l and
 * l + 8 of each.  With ga (|gamma +
 * weight_offset| of [0, n64) in the even/odd order of eo_gamma512),
 * *m gets the largest |h * g| bits of [0, n64) too: the FP8 output's
 * amax comes with the pass that reads the row in, not in a pass of its
 * own (|h| squares to the same bits as h). */
static FEP_INLINE FEP_T_AVX512 __m256 eo_sumsq512(const uint16_t *x, uint16_t *res,
						  size_t n, size_t n64, const float *ga,
						  __m512i *m)
{
	__m512 a[4];
	__m512i m0 = _mm512_setzero_si512(), m1 = m0;
	__m256 e, o, lo, up;
	size_t i, q;

	a[0] = a[1] = a[2] = a[3] = _mm512_setzero_ps();
	/* plain loads but for the tail: on AMD's Zen 5 a masked load that
	 * misses the caches is not overlapped with the loads after it, and
	 * this pass is the one that brings the row in */
	for (i = 0; i + 64 <= n; i += 64) {
		eo_sq32_512(eo_ld32_512(x, res, i, 32), ga && i < n64 ? ga + i : NULL,
			    &a[0], &a[1], &m0, &m1);
		eo_sq32_512(eo_ld32_512(x, res, i + 32, 32),
			    ga && i < n64 ? ga + i + 32 : NULL, &a[2], &a[3], &m0, &m1);
	}
	/* the values past the last whole 64 (past n64 too: no amax), up to
	 * 32 into a[0], a[1], the rest into a[2], a[3] */
	#pragma GCC unroll 2
	for (q = 0; q < 2; q++, i += 32) {
		if (i >= n)
			break;
		eo_sq32_512(eo_ld32_512(x, res, i, n - i), NULL, &a[2 * q],
			    &a[2 * q + 1], &m0, &m1);
	}
	if (ga)
		*m = _mm512_max_epu32(m0, m1);
	a[0] = _mm512_add_ps(a[0], a[2]);  /* w = 32 */
	a[1] = _mm512_add_ps(a[1], a[3]);
	e = _mm256_add_ps(_mm512_castps512_ps256(a[0]), _mm256_castpd_ps(
		_mm512_extractf64x4_pd(_mm512_castps_pd(a[0]), 1)));
	o = _mm256_add_ps(_mm512_castps512_ps256(a[1]), _mm256_castpd_ps(
		_mm512_extractf64x4_pd(_mm512_castps_pd(a[1]), 1)));
	/* in order: lo = sums 0..3 | 8..11, up = 4..7 | 12..15 */
	lo = _mm256_unpacklo_ps(e, o);
	up = _mm256_unpackhi_ps(e, o);
	return _mm256_add_ps(_mm256_permute2f128_ps(lo, up, 0x20),
			     _mm256_permute2f128_ps(lo, up, 0x31));
}

/* The sum of squares of a row (with res, the residual add) up to the
 * tree's step w = 8: lanes j of the result are the sums j (after
 * w = 16) plus j + 8. */
static FEP_INLINE FEP_T_AVX512 __m256 sumsq8_512(const char *x, char *res,
						 fep_k_dtype_t dt, size_t n)
{
	__m512 acc[4];
	size_t i, q;

	if (dt == FEP_K_BF16)
		return eo_sumsq512((const uint16_t *)x, (uint16_t *)res, n, 0, NULL, NULL);
	/* lanes of acc[q]: partial sums 16q..16q+15 of rms_tree */
	#pragma GCC unroll 4
	for (q = 0; q < 4; q++)
		acc[q] = _mm512_setzero_ps();
	if (res)
		for (i = 0; i + 64 <= n; i += 64)
			#pragma GCC unroll 4
			for (q = 0; q < 4; q++) {
				__m512 v = res512(x, res, i + 16 * q, 0xffff);

				acc[q] = _mm512_fmadd_ps(v, v, acc[q]);
			}
	else
		for (i = 0; i + 64 <= n; i += 64)
			#pragma GCC unroll 4
			for (q = 0; q < 4; q++) {
				__m512 v = fep512_load(x, dt, i + 16 * q, 0xffff);

				acc[q] = _mm512_fmadd_ps(v, v, acc[q]);
			}
	#pragma GCC unroll 4
	for (q = 0; q < 4; q++) {
		__mmask16 k;
		__m512 v;

		if (i + 16 * q >= n)
			break;
		k = fep512_mask(n - i - 16 * q);
		v = res ? res512(x, res, i + 16 * q, k) : fep512_load(x, dt, i + 16 * q, k);
		acc[q] = _mm512_fmadd_ps(v, v, acc[q]);
	}
	/* the tree's steps w = 32, 16, 8 */
	acc[0] = _mm512_add_ps(acc[0], acc[2]);
	acc[1] = _mm512_add_ps(acc[1], acc[3]);
	acc[0] = _mm512_add_ps(acc[0], acc[1]);
	return _mm256_add_ps(_mm512_castps512_ps256(acc[0]), _mm256_castpd_ps(
		_mm512_extractf64x4_pd(_mm512_castps_pd(acc[0]), 1)));
}

/* FP8 and bf16 output of bf16 rows in even/odd order, as the AVX2
 * kernel does (eo_gamma256) at twice the width: a vector of 32 bf16
 * values is read as the 16 even ones (low halves shifted up) and the
 * 16 odd ones (high halves masked).  For each 32 values ga holds gamma
 * + weight_offset of the even then of the odd ones (for FP8, with gs,
 * their absolute values, and gs their signs, one bit per value in
 * order, 64 to a word). */
static FEP_T_AVX512 void eo_gamma512(const float *gamma, float wo, size_t n32,
				     float *ga, uint64_t *gs)
{
	const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18,
					     20, 22, 24, 26, 28, 30);
	const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
	const __m512 vw = _mm512_set1_ps(wo);
	const __m512i mag = _mm512_set1_epi32(gs ? 0x7fffffff : -1);
	size_t i;

	/* per call and per thread's share of the rows, so vector code: a
	 * scalar pass cost as much as several rows */
	for (i = 0; i < n32; i += 32) {
		__m512 a = _mm512_add_ps(_mm512_loadu_ps(gamma + i), vw);
		__m512 b = _mm512_add_ps(_mm512_loadu_ps(gamma + i + 16), vw);

		_mm512_storeu_si512(ga + i, _mm512_and_si512(mag, _mm512_castps_si512(
			_mm512_permutex2var_ps(a, ie, b))));
		_mm512_storeu_si512(ga + i + 16, _mm512_and_si512(mag, _mm512_castps_si512(
			_mm512_permutex2var_ps(a, io, b))));
		if (gs) {  /* n32 a multiple of 64 here */
			uint64_t bits = (uint64_t)_mm512_movepi32_mask(_mm512_castps_si512(a)) |
					(uint64_t)_mm512_movepi32_mask(_mm512_castps_si512(b)) << 16;

			if (i % 64 == 0)
				gs[i / 64] = bits;
			else
				gs[i / 64] |= bits << 32;
		}
	}
}

/* The largest |h * g| bits of [0, n64) of a bf16 row in even/odd
 * order (NaN and inf included), for rows whose first pass was the
 * residual add. */
static FEP_INLINE FEP_T_AVX512 __m512i eo_hgmax512(const uint16_t *h, size_t n64,
						   const float *ga)
{
	const __m512i a16 = _mm512_set1_epi32(0x7fff7fff);
	const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
	__m512i m0 = _mm512_setzero_si512(), m1 = m0;
	size_t i;

	for (i = 0; i < n64; i += 32) {
		__m512i xa = _mm512_and_si512(_mm512_loadu_si512(h + i), a16);

		m0 = _mm512_max_epu32(m0, _mm512_castps_si512(_mm512_mul_ps(
			_mm512_castsi512_ps(_mm512_slli_epi32(xa, 16)),
			_mm512_load_ps(ga + i))));
		m1 = _mm512_max_epu32(m1, _mm512_castps_si512(_mm512_mul_ps(
			_mm512_castsi512_ps(_mm512_and_si512(xa, hi)),
			_mm512_load_ps(ga + i + 16))));
	}
	return _mm512_max_epu32(m0, m1);
}

/* The encoding pass of [0, n64) of a bf16 row in even/odd order, for
 * rows whose |h * g| * c are all below 464 (no clamp) and finite: the
 * magnitudes (|h| * |g|) * c, 64 codes packed to bytes, the 128-bit
 * lanes' quarters put back in order, the signs, sign(h) ^ sign(g), set
 * through a mask.  It prefetches the next row. */
static FEP_INLINE FEP_T_AVX512 void eo_enc512(uint8_t *out, const uint16_t *h,
					      size_t n64, const float *ga,
					      const uint64_t *gs, __m512 vc, int nt,
					      fep_pf_t *px, fep_pf_t *pr)
{
	const __m512i a16 = _mm512_set1_epi32(0x7fff7fff);
	const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
	size_t i;
	int q;

	for (i = 0; i < n64; i += 64) {
		__m512i x[2], c[2];
		__mmask64 k;

		#pragma GCC unroll 2
		for (q = 0; q < 2; q++) {
			__m512i xa;

			x[q] = _mm512_loadu_si512(h + i + 32 * q);
			xa = _mm512_and_si512(x[q], a16);
			c[q] = fep512_e4m3_eo32(
				_mm512_castps_si512(_mm512_mul_ps(_mm512_mul_ps(
					_mm512_castsi512_ps(_mm512_slli_epi32(xa, 16)),
					_mm512_load_ps(ga + i + 32 * q)), vc)),
				_mm512_castps_si512(_mm512_mul_ps(_mm512_mul_ps(
					_mm512_castsi512_ps(_mm512_and_si512(xa, hi)),
					_mm512_load_ps(ga + i + 32 * q + 16)), vc)));
		}
		k = fep512_bf16_signs64(x[0], x[1]) ^ gs[i / 64];
		fep512_st64(out + i, fep512_e4m3_join64(c[0], c[1], k), nt);
		fep_pf_step(px, 128);
		fep_pf_step(pr, 128);
	}
}

/* bf16 output of [0, n32) of a bf16 row in even/odd order (ga signed):
 * the hardware conversion of the even and odd values interleaved back
 * in order by one word permute, or without it (or with subnormals,
 * which it flushes) the rounded even values as the low halves of the
 * output words and the odd ones as the high halves. */
static FEP_INLINE FEP_T_AVX512 void eo_bf16_512(uint16_t *out, const uint16_t *h,
						size_t n32, const float *ga, __m512 vi,
						int nt, fep_pf_t *px, fep_pf_t *pr)
{
	const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
	const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11,
					     26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
					     5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
	/* read once: a store to out could alias the global for all the
	 * compiler knows */
	const int hw = fep_k_hw_bf16;
	size_t i;

	for (i = 0; i < n32; i += 32) {
		__m512i x = _mm512_loadu_si512(h + i), b;
		__m512 ye = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(
			_mm512_slli_epi32(x, 16)), _mm512_load_ps(ga + i)), vi);
		__m512 yo = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(
			_mm512_and_si512(x, hi)), _mm512_load_ps(ga + i + 16)), vi);

		if (hw && _kortestz_mask16_u8(fep512_subnormals(ye), fep512_subnormals(yo)))
			b = _mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(yo, ye));
		else
			b = _mm512_or_si512(fep512_bf16_bits(ye),
					    _mm512_slli_epi32(fep512_bf16_bits(yo), 16));
		fep512_st64(out + i, b, nt);
		fep_pf_step(px, 64);
		fep_pf_step(pr, 64);
	}
}

/* Codes of (h * g) * c of [i0, n) of a row (i0 a multiple of 64) to
 * out: the general encoding (NaN, clamp). */
static FEP_INLINE FEP_T_AVX512 void enc_row512(uint8_t *out, const char *h,
					       fep_k_dtype_t dt, const float *gamma,
					       __m512 wo, __m512 vc,
					       size_t i0, size_t n, int nt,
					       fep_pf_t *px, fep_pf_t *pr)
{
	size_t i, es = fep_k_dtype_size(dt);

#define Y16(j) fep512_e4m3_codes(_mm512_mul_ps(_mm512_mul_ps(                 \
		fep512_load(h, dt, i + (j), 0xffff),                           \
		_mm512_add_ps(_mm512_loadu_ps(gamma + i + (j)), wo)), vc))
	for (i = i0; i + 64 <= n; i += 64) {
		__m512i q = fep512_pack4(Y16(0), Y16(16), Y16(32), Y16(48));

		fep_pf_step(px, 64 * es);
		fep_pf_step(pr, 64 * es);
		fep512_st64(out + i, q, nt);
	}
#undef Y16
	for (; i < n; i += 16) {
		__mmask16 k = fep512_mask(n - i);
		__m512 g = _mm512_add_ps(_mm512_maskz_loadu_ps(k, gamma + i), wo);

		_mm_mask_storeu_epi8(out + i, k, fep512_e4m3(_mm512_mul_ps(
			_mm512_mul_ps(fep512_load(h, dt, i, k), g), vc)));
	}
}

static FEP_INLINE FEP_T_AVX512 void norm512(const fep_k_rmsnorm_args_t *a,
					    size_t r0, size_t r1,
					    const fep_k_dtype_t dt,
					    const fep_k_dtype_t odt)
{
	size_t r, i, n = a->cols, es = fep_k_dtype_size(dt);
	__m512 wo = _mm512_set1_ps(a->weight_offset);
	const float *gamma = a->gamma;
	int nt = fep_k_stream(a->nt, 1, (r1 - r0) * n * fep_k_dtype_size(odt));
	/* gamma + weight_offset once per call, and h * g for FP8 output of
	 * the general path */
	struct rms_scratch *sc = n <= RMS_YBUF ? rms_scratch() : NULL;
	float *gbuf = sc ? sc->w : NULL, *ybuf = sc ? sc->w + RMS_YBUF + RMS_SKEW : NULL;
	const float *gw = NULL;
	/* bf16 rows to FP8 or bf16 in even/odd order (eo_gamma512): gbuf
	 * holds gamma + weight_offset in that order, gsgn the FP8 signs;
	 * for FP8 even one row gains more than the order costs, for bf16
	 * only several */
	int eo = dt == FEP_K_BF16 && odt != FEP_K_F32 && sc &&
		 (r1 - r0 > 1 || odt == FEP_K_FP8);
	size_t n32 = n & ~(size_t)31, n64 = n & ~(size_t)63;
	uint64_t *gsgn = sc ? sc->sgn : NULL;

	if (eo)
		eo_gamma512(gamma, a->weight_offset, odt == FEP_K_FP8 ? n64 : n32, gbuf,
			    odt == FEP_K_FP8 ? gsgn : NULL);
	else if (odt == FEP_K_FP8 && sc && r1 - r0 > 1) {
		for (i = 0; i < n; i += 16) {
			__mmask16 k = fep512_mask(n - i);

			_mm512_mask_storeu_ps(gbuf + i, k, _mm512_add_ps(
				_mm512_maskz_loadu_ps(k, gamma + i), wo));
		}
		gw = gbuf;
	}
	for (r = r0; r < r1; r++) {
		const char *x = CROW(a->in, dt, a->ld_in, r);
		char *res = a->residual ? ROW(a->residual, dt, a->ld_res, r) : NULL;
		const char *h = res ? res : x;
		__m512 vi;
		__m512i mhg = _mm512_setzero_si512();
		__m256 t8;
		__m128 t4;
		float inv;
		fep_pf_t px, pr;

		/* the next row's input (and residual), while this one is
		 * worked on from cache */
		fep_pf_init(&px, r + 1 < r1 ? x + a->ld_in * es : NULL, n * es);
		fep_pf_init(&pr, res && r + 1 < r1 ? res + a->ld_res * es : NULL, n * es);
		/* the tree: w = 16, 8 there, then 4, 2, 1; FP8 output of
		 * bf16 rows gets the largest |h * g| in the same pass */
		t8 = eo && odt == FEP_K_FP8 && !res ?
		     eo_sumsq512((const uint16_t *)x, NULL, n, n64, gbuf, &mhg) :
		     sumsq8_512(x, res, dt, n);
		t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
		t4 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
		t4 = _mm_add_ss(t4, _mm_movehdup_ps(t4));
		inv = 1.0f / sqrtf(_mm_cvtss_f32(t4) / (float)n + a->eps);
		vi = _mm512_set1_ps(inv);
		if (odt != FEP_K_FP8) {
			char *out = ROW(a->out, odt, a->ld_out, r);
			int ntr = nt && ((uintptr_t)out & 63) == 0;

			i = 0;
			if (eo) {
				eo_bf16_512((uint16_t *)out, (const uint16_t *)h, n32, gbuf, vi,
					    ntr, &px, &pr);
				i = n32;
			}
			for (; i + 32 <= n; i += 32) {
				__m512 g0 = _mm512_add_ps(_mm512_loadu_ps(gamma + i), wo);
				__m512 g1 = _mm512_add_ps(_mm512_loadu_ps(gamma + i + 16), wo);

				fep512_store32(out, odt, i,
					_mm512_mul_ps(_mm512_mul_ps(fep512_load(h, dt, i, 0xffff),
								    g0), vi),
					_mm512_mul_ps(_mm512_mul_ps(fep512_load(h, dt, i + 16, 0xffff),
								    g1), vi), ntr, 1);
				fep_pf_step(&px, 32 * es);
				fep_pf_step(&pr, 32 * es);
			}
			for (; i < n; i += 16) {
				__mmask16 k = fep512_mask(n - i);
				__m512 g = _mm512_add_ps(_mm512_maskz_loadu_ps(k, gamma + i), wo);
				fep512_store(out, odt, i, _mm512_mul_ps(_mm512_mul_ps(
					fep512_load(h, dt, i, k), g), vi), k);
			}
		} else {
			/* the largest |h * g| (NaN and inf above the finite
			 * values) gives the scale (fp8_row_scale); the codes are
			 * of (h * g) * c, c = inv * (1 / s), from h * g kept in ybuf
			 * (rows of the general path up to 32 KiB) or recomputed */
			uint8_t *out = (uint8_t *)a->out + r * a->ld_out;
			int ntr = nt && ((uintptr_t)out & 63) == 0;
			__m512i m = eo && !res ? mhg : _mm512_setzero_si512();
			struct hg_ctx hc = { h, dt, gamma, a->weight_offset };
			int keep = gw != NULL; /* the general path's rows in ybuf */
			uint32_t mb;
			__m512 vc;
			float s, c;

			i = 0;
			if (eo) {
				if (res)
					m = eo_hgmax512((const uint16_t *)h, n64, gbuf);
				i = n64;
			} else if (keep) {
				__m512i m1 = m;

				for (; i + 32 <= n; i += 32) {
					__m512 hg0 = _mm512_mul_ps(fep512_load(h, dt, i, 0xffff),
								   _mm512_load_ps(gw + i));
					__m512 hg1 = _mm512_mul_ps(fep512_load(h, dt, i + 16, 0xffff),
								   _mm512_load_ps(gw + i + 16));

					_mm512_store_ps(ybuf + i, hg0);
					_mm512_store_ps(ybuf + i + 16, hg1);
					m = _mm512_max_epu32(m, _mm512_and_si512(
						_mm512_castps_si512(hg0),
						_mm512_set1_epi32(0x7fffffff)));
					m1 = _mm512_max_epu32(m1, _mm512_and_si512(
						_mm512_castps_si512(hg1),
						_mm512_set1_epi32(0x7fffffff)));
				}
				m = _mm512_max_epu32(m, m1);
			}
			for (; i < n; i += 16) {
				__mmask16 k = fep512_mask(n - i);
				__m512 hg = _mm512_mul_ps(fep512_load(h, dt, i, k), _mm512_add_ps(
					_mm512_maskz_loadu_ps(k, gamma + i), wo));

				if (keep)
					_mm512_store_ps(ybuf + i, hg);
				m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(hg),
					_mm512_set1_epi32(0x7fffffff)));
			}
			mb = (uint32_t)_mm512_reduce_max_epu32(m);
			s = fp8_row_scale(a, mb, inv, &hc);
			a->scales[r * a->ld_scales] = s;
			if (fp8_nan_row(out, n, inv))
				continue;
			c = inv * (1.0f / s);
			vc = _mm512_set1_ps(c);
			if (eo && fep_e4m3_short(mb >= 0x7f800000u, fep_u2f(mb), c)) {
				eo_enc512(out, (const uint16_t *)h, n64, gbuf, gsgn, vc, ntr,
					  &px, &pr);
				enc_row512(out, h, dt, gamma, wo, vc, n64, n, ntr, &px, &pr);
			} else if (keep) {
				/* finite h * g times a finite c: no NaN
				 * (vrangeps clamps the rest) */
				int fast = mb < 0x7f800000u && rms_finite(c);
				/* and no value to clamp either */
				int fast2 = fast && fep_e4m3_short(0, fep_u2f(mb), c);

#define YB(f, j) f(_mm512_mul_ps(_mm512_load_ps(ybuf + i + (j)), vc))
#define YV(j) _mm512_mul_ps(_mm512_load_ps(ybuf + i + (j)), vc)
				for (i = 0; i + 64 <= n; i += 64) {
					__m512i q = fast2 ?
						fep512_e4m3_f32x64_fast(YV(0), YV(16), YV(32), YV(48)) :
						fast ?
						fep512_pack4(YB(yb_fast, 0), YB(yb_fast, 16),
							     YB(yb_fast, 32), YB(yb_fast, 48)) :
						fep512_pack4(YB(fep512_e4m3_codes, 0),
							     YB(fep512_e4m3_codes, 16),
							     YB(fep512_e4m3_codes, 32),
							     YB(fep512_e4m3_codes, 48));

					fep_pf_step(&px, 64 * es);
					fep_pf_step(&pr, 64 * es);
					fep512_st64(out + i, q, ntr);
				}
#undef YB
#undef YV
				for (; i < n; i += 16)
					_mm_mask_storeu_epi8(out + i, fep512_mask(n - i),
						fep512_e4m3(_mm512_mul_ps(_mm512_load_ps(ybuf + i), vc)));
			} else
				enc_row512(out, h, dt, gamma, wo, vc, 0, n, ntr, &px, &pr);
		}
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX512 void fep_k_rmsnorm_avx512(const fep_k_rmsnorm_args_t *a, size_t r0, size_t r1)
{
	if (a->in_dt == FEP_K_BF16) {
		if (a->out_dt == FEP_K_BF16)
			norm512(a, r0, r1, FEP_K_BF16, FEP_K_BF16);
		else if (a->out_dt == FEP_K_F32)
			norm512(a, r0, r1, FEP_K_BF16, FEP_K_F32);
		else
			norm512(a, r0, r1, FEP_K_BF16, FEP_K_FP8);
	} else {
		if (a->out_dt == FEP_K_BF16)
			norm512(a, r0, r1, FEP_K_F32, FEP_K_BF16);
		else if (a->out_dt == FEP_K_F32)
			norm512(a, r0, r1, FEP_K_F32, FEP_K_F32);
		else
			norm512(a, r0, r1, FEP_K_F32, FEP_K_FP8);
	}
}

/* ---- checks and threaded wrapper ---- */

int fep_k_rmsnorm_check(const fep_k_rmsnorm_args_t *a)
{
	if (!a || !a->in || !a->out || !a->gamma) {
		fep_err("rmsnorm: NULL argument");
		return -EINVAL;
	}
	if (a->in_dt != FEP_K_F32 && a->in_dt != FEP_K_BF16) {
		fep_err("rmsnorm: input dtype %d is not fp32 or bf16", (int)a->in_dt);
		return -EINVAL;
	}
	if (a->out_dt != FEP_K_F32 && a->out_dt != FEP_K_BF16 &&
	    a->out_dt != FEP_K_FP8) {
		fep_err("rmsnorm: output dtype %d unknown", (int)a->out_dt);
		return -EINVAL;
	}
	if (a->out_dt == FEP_K_FP8 && (!a->scales || a->ld_scales < 1)) {
		fep_err("rmsnorm: FP8 output needs scales (ld_scales >= 1)");
		return -EINVAL;
	}
	if (a->cols == 0 || a->ld_in < a->cols || a->ld_out < a->cols ||
	    (a->residual && a->ld_res < a->cols)) {
		fep_err("rmsnorm: cols %zu is 0 or above a leading dimension", a->cols);
		return -EINVAL;
	}
	if (!(a->eps >= 0.0f) || isinf(a->eps)) {
		fep_err("rmsnorm: eps %g must be finite and >= 0", (double)a->eps);
		return -EINVAL;
	}
	if (a->scale_ub != a->scale_ub) {
		fep_err("rmsnorm: scale_ub is NaN");
		return -EINVAL;
	}
	return 0;
}

struct n_ctx {
	const fep_k_rmsnorm_args_t *a;
	const struct fep_k_ops *ops;
};

static void norm_range(void *arg, size_t r0, size_t r1)
{
	struct n_ctx *c = arg;
	c->ops->rmsnorm(c->a, r0, r1);
}

int fep_k_rmsnorm_mt(fep_pool_t *pool, const fep_k_rmsnorm_args_t *a, size_t rows)
{
	fep_k_rmsnorm_args_t b;
	struct n_ctx c = { &b, fep_k_ops() };
	int ret = fep_k_rmsnorm_check(a);

	if (ret)
		return ret;
	/* streaming stores by what the whole call writes */
	b = *a;
	if (!b.nt)
		b.nt = fep_k_stream(0, 1, rows * b.cols * fep_k_dtype_size(b.out_dt)) ?
		       1 : -1;
	return fep_pool_for(pool, rows, 1, norm_range, &c);
}
