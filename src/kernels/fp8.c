/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fp8.c - FP8 e4m3fn (OCP) quantization of rows with one fp32 scale per
 * row or per block, and dequantization to bf16/fp32.  The rules (scale,
 * saturation, NaN, zero blocks) are in kernels.h.
 */
#include "config.h"

#include <errno.h>
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/simd.h"

uint8_t fep_f32_to_e4m3(float f)
{
	return fep_e4m3_enc(f);
}

float fep_e4m3_to_f32(uint8_t q)
{
	uint32_t em = q & 0x7fu, sign = (uint32_t)(q & 0x80) << 24;

	if (em == 0x7f)
		return fep_u2f(0x7fc00000u | sign);
	if (em < 8) /* subnormal: m * 2^-9 */
		return fep_u2f(fep_f2u((float)em * (1.0f / 512.0f)) | sign);
	return fep_u2f(((em << 20) + (120u << 23)) | sign);
}

float fep_fp8_scale(float amax, float scale_ub, int pow2)
{
	float s = amax / FEP_FP8_MAX;
	uint32_t u;

	if (!(s > 0.0f))
		s = FEP_FP8_ZERO_SCALE;
	if (scale_ub > 0.0f && s > scale_ub)
		s = scale_ub;
	if (s < FEP_FP8_MIN_SCALE)
		s = FEP_FP8_MIN_SCALE;
	if (pow2) {
		u = fep_f2u(s);
		if (u & 0x7fffffu)
			u = (u + 0x800000u) & 0xff800000u;
		s = fep_u2f(u);
	}
	return s;
}

static inline size_t nblocks(size_t cols, int block)
{
	return block > 0 ? (cols + (size_t)block - 1) / (size_t)block : 1;
}

/* ---- scalar reference ---- */

void fep_k_fp8_quant_scalar(const fep_k_fp8_args_t *a, size_t r0, size_t r1)
{
	size_t bs = a->block > 0 ? (size_t)a->block : a->cols;
	size_t nb = nblocks(a->cols, a->block), r, b, i;

	for (r = r0; r < r1; r++) {
		const char *in = (const char *)a->in +
				 r * a->ld_in * fep_k_dtype_size(a->in_dt);
		uint8_t *out = a->out + r * a->ld_out;

		for (b = 0; b < nb; b++) {
			size_t c0 = b * bs, c1 = FEP_MIN(c0 + bs, a->cols);
			uint32_t amax = 0;
			float s, inv;

			for (i = c0; i < c1; i++)
				amax = FEP_MAX(amax, fep_absbits_finite(fep_ld1(in, a->in_dt, i)));
			s = fep_fp8_scale(fep_u2f(amax), a->scale_ub, a->pow2);
			inv = 1.0f / s;
			a->scales[r * a->ld_scales + b] = s;
			for (i = c0; i < c1; i++)
				out[i] = fep_e4m3_enc(fep_ld1(in, a->in_dt, i) * inv);
		}
	}
}

void fep_k_fp8_dequant_scalar(const fep_k_fp8dq_args_t *a, size_t r0, size_t r1)
{
	size_t bs = a->block > 0 ? (size_t)a->block : a->cols;
	size_t r, i;

	for (r = r0; r < r1; r++) {
		const uint8_t *in = a->in + r * a->ld_in;
		char *out = (char *)a->out + r * a->ld_out * fep_k_dtype_size(a->out_dt);
		const float *sc = a->scales + r * a->ld_scales;

		for (i = 0; i < a->cols; i++)
			fep_st1(out, a->out_dt, i, fep_e4m3_to_f32(in[i]) *
				sc[bs ? i / bs : 0]);
	}
}

/* ---- AVX2 ---- */

/* Row segments read twice (the amax pass, then the encoding pass from
 * cache): whole blocks of at most Q_SEG values, at most Q_SEGB blocks. */
#define Q_SEG 8192
#define Q_SEGB 64

static inline FEP_T_AVX2 uint32_t hmax256_epu16(__m256i v)
{
	__m128i b = _mm_max_epu16(_mm256_castsi256_si128(v),
				  _mm256_extracti128_si256(v, 1));

	/* phminposuw finds the least: of the complements */
	b = _mm_minpos_epu16(_mm_xor_si128(b, _mm_set1_epi32(-1)));
	return 0xffffu - ((uint32_t)_mm_cvtsi128_si32(b) & 0xffffu);
}

/* Largest finite |value| of in[c0, c1) as fp32 bits: the largest of
 * all, then, only if that is not finite, the largest finite one (*nf
 * set: the values hold inf or NaN). */
static FEP_T_AVX2 uint32_t amax256(const char *in, fep_k_dtype_t dt,
				   size_t c0, size_t c1, uint8_t *nf)
{
	uint32_t mx = 0;
	size_t i = c0;

	if (dt == FEP_K_BF16) {
		const uint16_t *p = (const uint16_t *)in;
		const __m256i abs = _mm256_set1_epi16(0x7fff);
		__m256i m0 = _mm256_setzero_si256(), m1 = m0;

		for (; i + 32 <= c1; i += 32) {
			m0 = _mm256_max_epu16(m0, _mm256_and_si256(
				_mm256_loadu_si256((const __m256i *)(p + i)), abs));
			m1 = _mm256_max_epu16(m1, _mm256_and_si256(
				_mm256_loadu_si256((const __m256i *)(p + i + 16)), abs));
		}
		mx = hmax256_epu16(_mm256_max_epu16(m0, m1));
		for (; i < c1; i++)
			mx = FEP_MAX(mx, (uint32_t)(p[i] & 0x7fffu));
		mx <<= 16;
	} else {
		const float *p = (const float *)in;
		const __m256i abs = _mm256_set1_epi32(0x7fffffff);
		__m256i m0 = _mm256_setzero_si256(), m1 = m0;

		for (; i + 16 <= c1; i += 16) {
			m0 = _mm256_max_epu32(m0, _mm256_and_si256(
				_mm256_loadu_si256((const __m256i *)(p + i)), abs));
			m1 = _mm256_max_epu32(m1, _mm256_and_si256(
				_mm256_loadu_si256((const __m256i *)(p + i + 8)), abs));
		}
		mx = fep256_hmax_u32(_mm256_max_epu32(m0, m1));
		for (; i < c1; i++)
			mx = FEP_MAX(mx, fep_f2u(p[i]) & 0x7fffffffu);
	}
	*nf = mx >= 0x7f800000u;
	if (mx < 0x7f800000u)
		return mx;
	for (mx = 0, i = c0; i < c1; i++)
		mx = FEP_MAX(mx, fep_absbits_finite(fep_ld1(in, dt, i)));
	return mx;
}

/* The largest finite |value| of 8 full blocks of 128 bf16 values at p,
 * p + 128, ..: as fp32 bits in amax[0, 8), with nf[] as amax256 sets
 * it.  As amax512_b128x16 at half the width: a block's 16-lane maximum
 * reduced alone (hmax256_epu16) takes about as many operations as its
 * loads and maxima; eight reduced together, each step pairing a block's
 * lanes with its neighbour's, take a fraction of that each.  A block
 * with a NaN or an inf (its maximum at or above 0x7f80) takes
 * amax256's second pass for its largest finite value. */
static FEP_T_AVX2 void amax256_b128x8(const uint16_t *p, float *amax, uint8_t *nf)
{
	const __m256i abs = _mm256_set1_epi16(0x7fff);
	__m256i m[8], t[4], u[2], w;
	__m128i y;
	uint16_t mx[8];
	int j, q;

	for (j = 0; j < 8; j++) {
		const __m256i *v = (const __m256i *)(p + 128 * j);
		__m256i a = _mm256_and_si256(_mm256_loadu_si256(v), abs);
		__m256i b = _mm256_and_si256(_mm256_loadu_si256(v + 1), abs);

		for (q = 2; q < 8; q += 2) {
			a = _mm256_max_epu16(a, _mm256_and_si256(_mm256_loadu_si256(v + q), abs));
			b = _mm256_max_epu16(b, _mm256_and_si256(_mm256_loadu_si256(v + q + 1),
								 abs));
		}
		m[j] = _mm256_max_epu16(a, b);
	}
	/* in each 128-bit lane: u16 2i block 2j, 2i + 1 block 2j + 1 */
	for (j = 0; j < 4; j++)
		t[j] = _mm256_max_epu16(_mm256_unpacklo_epi16(m[2 * j], m[2 * j + 1]),
					_mm256_unpackhi_epi16(m[2 * j], m[2 * j + 1]));
	/* u[j]: u16 i of each lane block 4j + i % 4 */
	for (j = 0; j < 2; j++)
		u[j] = _mm256_max_epu16(_mm256_unpacklo_epi32(t[2 * j], t[2 * j + 1]),
					_mm256_unpackhi_epi32(t[2 * j], t[2 * j + 1]));
	/* u16 i of each lane block i; then the two lanes */
	w = _mm256_max_epu16(_mm256_unpacklo_epi64(u[0], u[1]),
			     _mm256_unpackhi_epi64(u[0], u[1]));
	y = _mm_max_epu16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
	_mm256_storeu_ps(amax, _mm256_castsi256_ps(_mm256_slli_epi32(
		_mm256_cvtepu16_epi32(y), 16)));
	_mm_storeu_si128((__m128i *)mx, y);
	for (j = 0; j < 8; j++) {
		nf[j] = 0;
		if (mx[j] >= 0x7f80)
			amax[j] = fep_u2f(amax256((const char *)p, FEP_K_BF16,
						  128 * (size_t)j, 128 * (size_t)(j + 1),
						  &nf[j]));
	}
}

/* fep_fp8_scale of 8 maxima (finite, not negative) at once. */
static inline FEP_T_AVX2 __m256 scale256(__m256 amax, float ub, int pow2)
{
	__m256 s = _mm256_div_ps(amax, _mm256_set1_ps(FEP_FP8_MAX));

	s = _mm256_blendv_ps(_mm256_set1_ps(FEP_FP8_ZERO_SCALE), s,
			     _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ));
	if (ub > 0.0f)
		s = _mm256_min_ps(s, _mm256_set1_ps(ub));
	s = _mm256_max_ps(s, _mm256_set1_ps(FEP_FP8_MIN_SCALE));
	if (pow2) {
		__m256i u = _mm256_castps_si256(s);
		__m256i up = _mm256_and_si256(_mm256_add_epi32(u, _mm256_set1_epi32(0x800000)),
					      _mm256_set1_epi32((int)0xff800000u));
		__m256i exact = _mm256_cmpeq_epi32(_mm256_and_si256(u,
			_mm256_set1_epi32(0x7fffff)), _mm256_setzero_si256());

		s = _mm256_castsi256_ps(_mm256_blendv_epi8(up, u, exact));
	}
	return s;
}

static inline FEP_T_AVX2 void store256_nt(void *p, __m256i v, int nt)
{
	if (nt && !((uintptr_t)p & 31))
		_mm256_stream_si256((__m256i *)p, v);
	else
		_mm256_storeu_si256((__m256i *)p, v);
}

/* 32 values of dt at p times inv -> 32 codes; fast: the block holds no
 * inf or NaN and its largest |value| * inv is below 464 */
static FEP_INLINE FEP_T_AVX2 __m256i enc32_256(const char *p, fep_k_dtype_t dt,
					       __m256 inv, int fast)
{
	__m256 v[4];
	int q;

	if (dt == FEP_K_BF16) {
		__m256i x0 = _mm256_loadu_si256((const __m256i *)p);
		__m256i x1 = _mm256_loadu_si256((const __m256i *)p + 1);

		return fast ? fep256_e4m3_bf16x32_fast(x0, x1, inv) :
			      fep256_e4m3_bf16x32(x0, x1, inv);
	}
	#pragma GCC unroll 4
	for (q = 0; q < 4; q++)
		v[q] = _mm256_mul_ps(_mm256_loadu_ps((const float *)p + 8 * q), inv);
	return fep256_e4m3_x32(v, !fast);
}

/* The whole vectors of values [c0, c1) of one block to codes; fast as
 * for enc32_256, a constant where inlined below: the loop of the short
 * encoding then holds its constants in registers, where one loop with
 * both encodings held those of the long one too and built the short
 * one's anew in every iteration (AVX2 has 16 vector registers).
 * Returns the end of the whole vectors. */
static FEP_INLINE FEP_T_AVX2 size_t enc_run256(uint8_t *out, const char *in,
					       fep_k_dtype_t dt, size_t c0, size_t c1,
					       __m256 inv, const int fast, int nt,
					       fep_pf_t *pf)
{
	size_t i, es = fep_k_dtype_size(dt);

	for (i = c0; i + 32 <= c1; i += 32) {
		store256_nt(out + i, enc32_256(in + i * es, dt, inv, fast), nt);
		fep_pf_step(pf, 32 * es);
	}
	return i;
}

static FEP_INLINE FEP_T_AVX2 void quant256(const fep_k_fp8_args_t *a,
					   size_t r0, size_t r1,
					   const fep_k_dtype_t dt)
{
	size_t es = fep_k_dtype_size(dt), cols = a->cols;
	size_t bs = a->block > 0 ? (size_t)a->block : cols;
	size_t nb = nblocks(cols, a->block), r, b0, i, j;
	size_t seg = a->block > 0 ? FEP_MIN((size_t)Q_SEGB,
					    FEP_MAX((size_t)1, Q_SEG / bs)) : 1;
	int nt = fep_k_stream(a->nt, fep_k_nt_quant(dt), (r1 - r0) * cols);
	float amax[Q_SEGB] __attribute__((aligned(32)));
	float invs[Q_SEGB] __attribute__((aligned(32)));
	uint8_t nf[Q_SEGB];
	float sc[8];

	for (r = r0; r < r1; r++) {
		const char *in = (const char *)a->in + r * a->ld_in * es;
		uint8_t *out = a->out + r * a->ld_out;

		for (b0 = 0; b0 < nb; b0 += seg) {
			size_t g = FEP_MIN(seg, nb - b0), s0 = b0 * bs;
			size_t s1 = FEP_MIN(s0 + g * bs, cols);
			fep_pf_t pf;

			/* the next segment, of this row or the next */
			if (s1 < cols)
				fep_pf_init(&pf, in + s1 * es,
					    (FEP_MIN(s1 + g * bs, cols) - s1) * es);
			else
				fep_pf_init(&pf, r + 1 < r1 ? in + a->ld_in * es : NULL,
					    FEP_MIN(g * bs, cols) * es);
			j = 0;
			/* full blocks of 128 bf16 values, 8 at once */
			if (dt == FEP_K_BF16 && bs == 128)
				for (; j + 8 <= g && (b0 + j + 8) * bs <= cols; j += 8)
					amax256_b128x8((const uint16_t *)in + (b0 + j) * bs,
						       amax + j, nf + j);
			for (; j < g; j++)
				amax[j] = fep_u2f(amax256(in, dt, (b0 + j) * bs,
							  FEP_MIN((b0 + j + 1) * bs, cols),
							  &nf[j]));
			for (; j % 8; j++)
				amax[j] = 0.0f;
			for (j = 0; j < g; j += 8) {
				__m256 s = scale256(_mm256_load_ps(amax + j), a->scale_ub,
						    a->pow2);

				_mm256_storeu_ps(sc, s);
				memcpy(a->scales + r * a->ld_scales + b0 + j, sc,
				       FEP_MIN((size_t)8, g - j) * sizeof(float));
				_mm256_store_ps(invs + j, _mm256_div_ps(_mm256_set1_ps(1.0f), s));
			}
			for (j = 0; j < g; j++) {
				size_t c0 = (b0 + j) * bs, c1 = FEP_MIN(c0 + bs, cols);
				__m256 inv = _mm256_set1_ps(invs[j]);
				int fast = fep_e4m3_short(nf[j], amax[j], invs[j]);

				i = fast ? enc_run256(out, in, dt, c0, c1, inv, 1, nt, &pf) :
					   enc_run256(out, in, dt, c0, c1, inv, 0, nt, &pf);
				if (i < c1) { /* through a zero-padded copy */
					float t[32] __attribute__((aligned(32))) = { 0 };
					uint8_t q[32];

					memcpy(t, in + i * es, (c1 - i) * es);
					_mm256_storeu_si256((__m256i *)q,
						enc32_256((const char *)t, dt, inv, fast));
					memcpy(out + i, q, c1 - i);
				}
			}
		}
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX2 void fep_k_fp8_quant_avx2(const fep_k_fp8_args_t *a, size_t r0, size_t r1)
{
	if (a->in_dt == FEP_K_BF16)
		quant256(a, r0, r1, FEP_K_BF16);
	else
		quant256(a, r0, r1, FEP_K_F32);
}

/* 16 codes at p times s -> 16 values of odt at out (full or stack copy) */
static FEP_INLINE FEP_T_AVX2 void deq16_256(__m128i q, __m256 k, __m256 s, int two,
					    void *out, const fep_k_dtype_t odt,
					    int nan_scale, int nt)
{
	__m256 lo, hi;

	fep256_e4m3_dec16(q, k, &lo, &hi);
	if (two) {
		lo = _mm256_mul_ps(lo, s);
		hi = _mm256_mul_ps(hi, s);
	}
	if (odt == FEP_K_F32) {
		if (nt && !((uintptr_t)out & 31)) {
			_mm256_stream_ps((float *)out, lo);
			_mm256_stream_ps((float *)out + 8, hi);
		} else {
			_mm256_storeu_ps((float *)out, lo);
			_mm256_storeu_ps((float *)out + 8, hi);
		}
	} else if (!nan_scale) {
		/* every NaN here is the default one: the short rounding */
		store256_nt(out, _mm256_permute4x64_epi64(_mm256_packus_epi32(
			fep256_bf16_rne_nn(lo), fep256_bf16_rne_nn(hi)), 0xd8), nt);
	} else {
		_mm_storeu_si128((__m128i *)out, fep256_f32_to_bf16(lo));
		_mm_storeu_si128((__m128i *)out + 1, fep256_f32_to_bf16(hi));
	}
}

/*
 * bf16 output by tables.  Every e4m3 value of exponent field E >= 1 is
 * its mantissa's value at E = 1 or 2 times 4^h, h = E >> 1 (E = 1 + 2h
 * odd, 2h even), and for a scale s of 2^-100 to 2^100 every product
 * v * s and its fp32 and bf16 roundings stay normal and finite, where
 * scaling by 4^h commutes with both roundings: the bf16 result is the
 * rounding of (v at E = 1 or 2) * s with 2h added to its exponent field
 * (h to its high byte), bit for bit what the scalar path gives.  So per
 * block, 16 such results (index: E's low bit, then the mantissa; the
 * even ones divided by 4, since h counts from E = 0 there) and 8
 * subnormal ones (E = 0: m * 2^-9 * s; index 15: the NaN, 0x7fc0, less
 * the 7 that h adds to the high byte) become byte tables, and 32 codes
 * take byte shuffles, a blend per byte half and an add: about 20
 * operations where decoding through fp32 takes 50.
 */
struct dq_lut {
	__m256i tl, th;  /* normal: low and high bytes, in both lanes */
	__m256i sl, sh;  /* subnormal and NaN */
};

/* 16 bf16 bit patterns (2 x 8 in 32-bit lanes, the low halves) -> their
 * 16 low bytes, then their 16 high bytes, each table in both lanes */
static inline FEP_T_AVX2 void lut_split(__m256i a, __m256i b, __m256i *lo,
					__m256i *hi)
{
	/* the 16 values in order, then low bytes to each lane's first 8
	 * bytes and high bytes to its last 8 */
	__m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
	__m256i x = _mm256_shuffle_epi8(w, _mm256_setr_epi8(
		0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
		0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));

	x = _mm256_permute4x64_epi64(x, 0xd8);  /* low bytes | high bytes */
	*lo = _mm256_permute2x128_si256(x, x, 0x00);
	*hi = _mm256_permute2x128_si256(x, x, 0x11);
}

/* The tables of scale s (2^-100 <= s <= 2^100) */
static inline FEP_T_AVX2 void lut_build(struct dq_lut *t, float sf)
{
	/* the values of codes E = 2 (index 0-7), E = 1 (8-15), E = 0 */
	const __m256 ve = _mm256_setr_ps(0x1p-5f, 0x1.2p-5f, 0x1.4p-5f, 0x1.6p-5f,
					 0x1.8p-5f, 0x1.ap-5f, 0x1.cp-5f, 0x1.ep-5f);
	const __m256 vo = _mm256_mul_ps(ve, _mm256_set1_ps(0.5f));
	const __m256 vs = _mm256_setr_ps(0.0f, 0x1p-9f, 0x2p-9f, 0x3p-9f,
					 0x4p-9f, 0x5p-9f, 0x6p-9f, 0x7p-9f);
	const __m256 s = _mm256_set1_ps(sf);
	/* E = 2 divided by 4: 2 off the exponent field (bits 7-14) */
	__m256i e = _mm256_sub_epi32(fep256_bf16_rne_nn(_mm256_mul_ps(ve, s)),
				     _mm256_set1_epi32(0x100));
	__m256i o = fep256_bf16_rne_nn(_mm256_mul_ps(vo, s));
	__m256i z = fep256_bf16_rne_nn(_mm256_mul_ps(vs, s));
	/* index 15 of the second table: the NaN; E = 15 adds 7 to the
	 * high byte */
	__m256i n = _mm256_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0x7fc0 - 0x700);

	lut_split(e, o, &t->tl, &t->th);
	lut_split(z, n, &t->sl, &t->sh);
}

/* 32 codes -> 32 bf16 values at out (with the tables of their scale) */
static inline FEP_T_AVX2 void lut_dec32(const struct dq_lut *t, const uint8_t *in,
					uint16_t *out, int nt)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	/* high nibble (sign, E >> 1) -> what it adds to the high byte */
	const __m256i hs = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, (char)0x80,
		(char)0x81, (char)0x82, (char)0x83, (char)0x84, (char)0x85, (char)0x86,
		(char)0x87, 0, 1, 2, 3, 4, 5, 6, 7, (char)0x80, (char)0x81, (char)0x82,
		(char)0x83, (char)0x84, (char)0x85, (char)0x86, (char)0x87);
	__m256i q = _mm256_loadu_si256((const __m256i *)in);
	__m256i j = _mm256_and_si256(q, m4);
	/* E = 0 (|code| 0-7) or the NaN (0x7f): |code| + 1 below 9 as a
	 * signed byte */
	__m256i sel = _mm256_cmpgt_epi8(_mm256_set1_epi8(9), _mm256_add_epi8(
		_mm256_and_si256(q, _mm256_set1_epi8(0x7f)), _mm256_set1_epi8(1)));
	__m256i lo = _mm256_blendv_epi8(_mm256_shuffle_epi8(t->tl, j),
					_mm256_shuffle_epi8(t->sl, j), sel);
	__m256i hi = _mm256_blendv_epi8(_mm256_shuffle_epi8(t->th, j),
					_mm256_shuffle_epi8(t->sh, j), sel);
	__m256i w0, w1;

	hi = _mm256_add_epi8(hi, _mm256_shuffle_epi8(hs, _mm256_and_si256(
		_mm256_srli_epi16(q, 4), m4)));
	w0 = _mm256_unpacklo_epi8(lo, hi);  /* codes 0-7 | 16-23 */
	w1 = _mm256_unpackhi_epi8(lo, hi);  /* 8-15 | 24-31 */
	store256_nt(out, _mm256_permute2x128_si256(w0, w1, 0x20), nt);
	store256_nt(out + 16, _mm256_permute2x128_si256(w0, w1, 0x31), nt);
}

static FEP_INLINE FEP_T_AVX2 void dequant256(const fep_k_fp8dq_args_t *a,
					     size_t r0, size_t r1,
					     const fep_k_dtype_t odt)
{
	size_t bs = a->block > 0 ? (size_t)a->block : a->cols;
	size_t os = fep_k_dtype_size(odt), r, i, c0;
	int nt = fep_k_stream(a->nt, fep_k_nt_fp8, (r1 - r0) * a->cols * os);

	for (r = r0; r < r1; r++) {
		const uint8_t *in = a->in + r * a->ld_in;
		char *out = (char *)a->out + r * a->ld_out * os;
		const float *sc = a->scales + r * a->ld_scales;

		/* bs is a multiple of 16: a vector never spans blocks */
		for (c0 = 0; c0 < a->cols; c0 += bs) {
			size_t c1 = FEP_MIN(c0 + bs, a->cols);
			float sf = *sc++;
			__m256 s = _mm256_set1_ps(sf);
			int ns = sf != sf;
			/* 2^8 * scale is exact below 2^119: one multiply */
			int two = !(fabsf(sf) < 0x1p119f);
			__m256 k = _mm256_set1_ps(two ? 256.0f : sf * 256.0f);

			i = c0;
			/* blocks of 64 values or more: the tables pay */
			if (odt == FEP_K_BF16 && c1 - c0 >= 64 &&
			    sf >= 0x1p-100f && sf <= 0x1p100f) {
				struct dq_lut t;

				lut_build(&t, sf);
				for (; i + 32 <= c1; i += 32) {
					if (nt && !(i & 63))
						_mm_prefetch((const char *)in + i + FEP_K_NT_PF,
							     _MM_HINT_T0);
					lut_dec32(&t, in + i, (uint16_t *)out + i, nt);
				}
			}
			for (; i + 16 <= c1; i += 16)
				deq16_256(_mm_loadu_si128((const __m128i *)(in + i)), k, s,
					  two, out + i * os, odt, ns, nt);
			if (i < c1) {
				uint8_t q[16] = { 0 };
				float t[16];

				memcpy(q, in + i, c1 - i);
				deq16_256(_mm_loadu_si128((const __m128i *)q), k, s, two, t,
					  odt, ns, 0);
				memcpy(out + i * os, t, (c1 - i) * os);
			}
		}
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX2 void fep_k_fp8_dequant_avx2(const fep_k_fp8dq_args_t *a, size_t r0, size_t r1)
{
	if (a->out_dt == FEP_K_BF16)
		dequant256(a, r0, r1, FEP_K_BF16);
	else
		dequant256(a, r0, r1, FEP_K_F32);
}

/* ---- AVX-512 ---- */

/* 32 codes -> 32 values times k (lo: the first 16), through fp16 as
 * fep256_e4m3_dec16 (kernels.h) explains: with k = 2^8 the values
 * exactly, with k = 2^8 * scale (when that is exact) the values times
 * the scale in one rounding; 0x7f/0xff -> +-0x7fc00000. */
static inline FEP_T_AVX512 void dec512(__m256i q, __m512 k, __m512 *lo, __m512 *hi)
{
	__m512i h = _mm512_slli_epi16(_mm512_cvtepu8_epi16(q), 7);
	__mmask32 nan;

	/* sign: bit 14 -> bit 15 */
	h = _mm512_add_epi16(h, _mm512_and_si512(h, _mm512_set1_epi16(0x4000)));
	nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7fff)),
				      _mm512_set1_epi16(0x3f80));
	h = _mm512_mask_blend_epi16(nan, h, _mm512_xor_si512(h,
		_mm512_set1_epi16(0x3f80 ^ 0x7e00)));
	*lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), k);
	*hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), k);
}

/* The largest of 32 unsigned 16-bit lanes. */
static inline FEP_T_AVX512 uint32_t hmax512_epu16(__m512i v)
{
	__m256i a = _mm256_max_epu16(_mm512_castsi512_si256(v),
				     _mm512_extracti64x4_epi64(v, 1));
	__m128i b = _mm_max_epu16(_mm256_castsi256_si128(a),
				  _mm256_extracti128_si256(a, 1));

	/* phminposuw finds the least: of the complements */
	b = _mm_minpos_epu16(_mm_xor_si128(b, _mm_set1_epi32(-1)));
	return 0xffffu - ((uint32_t)_mm_cvtsi128_si32(b) & 0xffffu);
}

/* Largest finite |value| of in[c0, c1) as fp32 bits; *nan gets bit 0
 * when the values hold a NaN, bit 1 when they hold a NaN or an inf. */
static FEP_T_AVX512 uint32_t amax512(const char *in, fep_k_dtype_t dt,
				     size_t c0, size_t c1, uint8_t *nan)
{
	size_t i = c0;

	if (dt == FEP_K_BF16) { /* on the 16-bit values: 32 per vector */
		const uint16_t *p = (const uint16_t *)in;
		const __m512i abs = _mm512_set1_epi16(0x7fff);
		const __m512i inf = _mm512_set1_epi16(0x7f80);
		__m512i m0 = _mm512_setzero_si512(), m1 = m0;
		uint32_t mx;

		/* the largest of all, then, only if that is not finite, the
		 * largest finite one in a second pass */
		for (; i + 64 <= c1; i += 64) {
			m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(p + i), abs));
			m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(p + i + 32), abs));
		}
		for (; i < c1; i += 32) {
			size_t n = FEP_MIN((size_t)32, c1 - i);
			__mmask32 k = n >= 32 ? 0xffffffffu : (1u << n) - 1;

			m0 = _mm512_max_epu16(m0, _mm512_and_si512(
				_mm512_maskz_loadu_epi16(k, p + i), abs));
		}
		mx = hmax512_epu16(_mm512_max_epu16(m0, m1));
		*nan = (uint8_t)((mx > 0x7f80) | (mx >= 0x7f80) << 1);
		if (mx < 0x7f80)
			return mx << 16;
		m0 = _mm512_setzero_si512();
		for (i = c0; i < c1; i += 32) {
			size_t n = FEP_MIN((size_t)32, c1 - i);
			__mmask32 k = n >= 32 ? 0xffffffffu : (1u << n) - 1;
			__m512i x = _mm512_and_si512(_mm512_maskz_loadu_epi16(k, p + i), abs);

			m0 = _mm512_mask_max_epu16(m0, _mm512_cmplt_epu16_mask(x, inf), m0, x);
		}
		return hmax512_epu16(m0) << 16;
	} else {
		const float *p = (const float *)in;
		const __m512i abs = _mm512_set1_epi32(0x7fffffff);
		const __m512i inf = _mm512_set1_epi32(0x7f800000);
		__m512i m0 = _mm512_setzero_si512(), m1 = m0;
		uint32_t mx;

		/* as for bf16: the largest of all, then the largest finite
		 * one only where that is not finite */
		for (; i + 32 <= c1; i += 32) {
			m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(p + i), abs));
			m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(p + i + 16), abs));
		}
		for (; i < c1; i += 16)
			m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_maskz_loadu_epi32(
				fep512_mask(c1 - i), p + i), abs));
		mx = (uint32_t)_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
		*nan = (uint8_t)((mx > 0x7f800000u) | (mx >= 0x7f800000u) << 1);
		if (mx < 0x7f800000u)
			return mx;
		m0 = _mm512_setzero_si512();
		for (i = c0; i < c1; i += 16) {
			__m512i x = _mm512_and_si512(_mm512_maskz_loadu_epi32(
				fep512_mask(c1 - i), p + i), abs);
			m0 = _mm512_mask_max_epu32(m0, _mm512_cmplt_epu32_mask(x, inf), m0, x);
		}
		return (uint32_t)_mm512_reduce_max_epu32(m0);
	}
}

/* The largest |value| of each of nb (1..16) bf16 blocks of 128 values
 * at p, p + 128, ..: as fp32 bits in amax[0, nb), with nan[] as
 * amax512 sets it.  One block's 32-lane maximum reduced alone takes
 * about as many operations as the block's loads and maxima; sixteen
 * reduced together, a halving of the lanes per step with a block's
 * lanes paired with its neighbour's, take a quarter of that each.  A
 * block with a NaN or an inf (its maximum at or above 0x7f80) takes
 * amax512's second pass for its largest finite value. */
static FEP_T_AVX512 void amax512_b128x16(const uint16_t *p, size_t nb,
					 float *amax, uint8_t *nan)
{
	const __m512i abs = _mm512_set1_epi16(0x7fff);
	/* u16 j * 2 of the result: the maximum of block j, which the steps
	 * leave in the low u16 of qword (j % 8 < 4 ? 0 : 1) of 128-bit lane
	 * j % 4 of y[j / 8] (index + 32 for y[1]) */
	const __m512i gat = _mm512_set_epi16(
		0, 60, 0, 52, 0, 44, 0, 36, 0, 56, 0, 48, 0, 40, 0, 32,
		0, 28, 0, 20, 0, 12, 0, 4, 0, 24, 0, 16, 0, 8, 0, 0);
	__m512i m[16], t[8], u[4], y[2], mx;
	__mmask16 hi;
	size_t j;

	for (j = 0; j < 16; j++) {
		const uint16_t *q;

		if (j >= nb) {
			m[j] = _mm512_setzero_si512();
			continue;
		}
		q = p + 128 * j;
		m[j] = _mm512_max_epu16(
			_mm512_max_epu16(_mm512_and_si512(_mm512_loadu_si512(q), abs),
					 _mm512_and_si512(_mm512_loadu_si512(q + 32), abs)),
			_mm512_max_epu16(_mm512_and_si512(_mm512_loadu_si512(q + 64), abs),
					 _mm512_and_si512(_mm512_loadu_si512(q + 96), abs)));
	}
	/* 512 -> 256 bits a block: lanes 0-1 block 2i, 2-3 block 2i + 1 */
	for (j = 0; j < 8; j++)
		t[j] = _mm512_max_epu16(_mm512_shuffle_i64x2(m[2 * j], m[2 * j + 1], 0x44),
					_mm512_shuffle_i64x2(m[2 * j], m[2 * j + 1], 0xee));
	/* -> 128: lane l block 4i + l */
	for (j = 0; j < 4; j++)
		u[j] = _mm512_max_epu16(_mm512_shuffle_i64x2(t[2 * j], t[2 * j + 1], 0x88),
					_mm512_shuffle_i64x2(t[2 * j], t[2 * j + 1], 0xdd));
	/* -> 64: qword 0 of lane l block 8i + l, qword 1 block 8i + 4 + l;
	 * then -> 16, in each qword's low u16 */
	for (j = 0; j < 2; j++) {
		__m512i w = _mm512_max_epu16(_mm512_unpacklo_epi64(u[2 * j], u[2 * j + 1]),
					     _mm512_unpackhi_epi64(u[2 * j], u[2 * j + 1]));

		w = _mm512_max_epu16(w, _mm512_srli_epi64(w, 32));
		y[j] = _mm512_max_epu16(w, _mm512_srli_epi32(w, 16));
	}
	mx = _mm512_maskz_permutex2var_epi16(0x55555555u, y[0], gat, y[1]);
	_mm512_mask_storeu_ps(amax, (__mmask16)((1u << nb) - 1),
			      _mm512_castsi512_ps(_mm512_slli_epi32(mx, 16)));
	memset(nan, 0, nb);
	hi = _mm512_cmpge_epu32_mask(mx, _mm512_set1_epi32(0x7f80)) &
	     (__mmask16)((1u << nb) - 1);
	for (; hi; hi &= (__mmask16)(hi - 1)) {
		j = (size_t)__builtin_ctz(hi);
		amax[j] = fep_u2f(amax512((const char *)p, FEP_K_BF16, 128 * j,
					  128 * (j + 1), &nan[j]));
	}
}

/* fep_fp8_scale of 16 maxima (finite, not negative) at once. */
static inline FEP_T_AVX512 __m512 scale512(__m512 amax, float ub, int pow2)
{
	__m512 s = _mm512_div_ps(amax, _mm512_set1_ps(FEP_FP8_MAX));

	s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_NGT_UQ),
			       _mm512_set1_ps(FEP_FP8_ZERO_SCALE));
	if (ub > 0.0f)
		s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(s, _mm512_set1_ps(ub),
							     _CMP_GT_OQ),
				       _mm512_set1_ps(ub));
	s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(s, _mm512_set1_ps(FEP_FP8_MIN_SCALE),
						     _CMP_LT_OQ),
			       _mm512_set1_ps(FEP_FP8_MIN_SCALE));
	if (pow2) {
		__m512i u = _mm512_castps_si512(s);

		u = _mm512_mask_and_epi32(u, _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffff)),
			_mm512_add_epi32(u, _mm512_set1_epi32(0x800000)),
			_mm512_set1_epi32((int)0xff800000u));
		s = _mm512_castsi512_ps(u);
	}
	return s;
}

/* 64 bf16 values of the short encoding without VBMI (fep512_e4m3_bf16x64) */
static FEP_INLINE FEP_T_AVX512 __m512i e4m3_bf16x64_short(__m512i x0, __m512i x1, __m512 inv)
{
	return fep512_e4m3_bf16x64(x0, x1, inv, 1);
}

/* g whole bf16 blocks of 128 at p (g <= 64) to out, each by its inv,
 * every block free of NaN and inf with its largest |value| * inv below
 * 464 (the short encoding); out streams where nt (out then 64-byte
 * aligned).  Built with and without VBMI (fep_k_vbmi), ENC the encoder
 * of 64 values.  The prefetch state f goes in and comes back by value:
 * with its address passed out of line, the compiler keeps it in memory
 * in every loop of quant512 and reloads and stores it after each store
 * to out (which may alias it), a chain through memory per 64 values. */
#define QUANT_B128_FAST(name, target, ENC)                                     \
static target fep_pf_t name(const uint16_t *p, uint8_t *out, size_t g,        \
			    const float *invs, int nt, fep_pf_t f)              \
{                                                                              \
	size_t j;                                                              \
                                                                               \
	for (j = 0; j < g; j++, p += 128, out += 128) {                        \
		__m512 inv = _mm512_set1_ps(invs[j]);                          \
                                                                               \
		fep512_st64(out, ENC(_mm512_loadu_si512(p),                    \
				     _mm512_loadu_si512(p + 32), inv), nt);    \
		fep512_st64(out + 64, ENC(_mm512_loadu_si512(p + 64),          \
					  _mm512_loadu_si512(p + 96), inv), nt); \
		fep_pf_step(&f, 256);                                          \
	}                                                                      \
	return f;                                                              \
}
QUANT_B128_FAST(quant512_b128_fast, FEP_T_AVX512, e4m3_bf16x64_short)
QUANT_B128_FAST(quant512_b128_fast_vbmi, FEP_T_AVX512_VBMI, fep512_e4m3_bf16x64_vbmi)
#undef QUANT_B128_FAST

/* The whole 64s of values [i, c1) of a bf16 block of the short
 * encoding to out, with VBMI; the prefetch state by value
 * (QUANT_B128_FAST). */
static FEP_T_AVX512_VBMI fep_pf_t quant512_run_vbmi(const uint16_t *p, uint8_t *out,
						    size_t i, size_t c1, __m512 inv,
						    int nt, fep_pf_t f)
{
	for (; i + 64 <= c1; i += 64) {
		fep512_st64(out + i, fep512_e4m3_bf16x64_vbmi(_mm512_loadu_si512(p + i),
			_mm512_loadu_si512(p + i + 32), inv), nt);
		fep_pf_step(&f, 128);
	}
	return f;
}

static FEP_INLINE FEP_T_AVX512 void quant512(const fep_k_fp8_args_t *a,
					     size_t r0, size_t r1,
					     const fep_k_dtype_t dt)
{
	size_t bs = a->block > 0 ? (size_t)a->block : a->cols;
	size_t nb = nblocks(a->cols, a->block), r, b, i;
	int nt = fep_k_stream(a->nt, fep_k_nt_quant(dt), (r1 - r0) * a->cols);
	float amax[64], invs[64];
	uint8_t nan[64];
	size_t es = fep_k_dtype_size(dt);
	fep_pf_t pf = { NULL, 0, 0, 0 };

	for (r = r0; r < r1; r++) {
		const char *in = (const char *)a->in +
				 r * a->ld_in * fep_k_dtype_size(dt);
		uint8_t *out = a->out + r * a->ld_out;
		int ntr = nt && ((uintptr_t)out & 63) == 0;

		for (b = 0; b < nb; b++) {
			size_t c0 = b * bs, c1 = FEP_MIN(c0 + bs, a->cols);
			int ntb = ntr && !(c0 & 63);  /* out + c0 aligned */
			__m512 inv;

			/* scales of up to 64 blocks at a time: their divisions
			 * overlap instead of stalling each block's encoding */
			if (b % 64 == 0) {
				size_t g = FEP_MIN(nb - b, (size_t)64), j;
				size_t s1 = FEP_MIN((b + g) * bs, a->cols);

				/* the next group, of this row or the next, comes
				 * in while this one is encoded from cache */
				if (s1 < a->cols)
					fep_pf_init(&pf, in + s1 * es,
						    (FEP_MIN(s1 + g * bs, a->cols) - s1) * es);
				else
					fep_pf_init(&pf, r + 1 < r1 ? in + a->ld_in * es : NULL,
						    FEP_MIN(g * bs, a->cols) * es);

				j = 0;
				/* full blocks of 128 bf16 values, 8 or more at once */
				if (dt == FEP_K_BF16 && bs == 128)
					for (; j + 8 <= g && (b + j + 8) * bs <= a->cols; j += 16) {
						size_t k = FEP_MIN((size_t)16, FEP_MIN(g - j,
							a->cols / bs - b - j));

						amax512_b128x16((const uint16_t *)in + (b + j) * bs,
								k, amax + j, nan + j);
						if (k < 16) {
							j += k;
							break;
						}
					}
				for (; j < g; j++)
					amax[j] = fep_u2f(amax512(in, dt, (b + j) * bs,
							  FEP_MIN((b + j + 1) * bs, a->cols),
							  &nan[j]));
				for (j = 0; j < g; j += 16) {
					__mmask16 k = fep512_mask(g - j);
					__m512 sc = scale512(_mm512_maskz_loadu_ps(k, amax + j),
							     a->scale_ub, a->pow2);

					_mm512_mask_storeu_ps(a->scales + r * a->ld_scales + b + j,
							      k, sc);
					_mm512_storeu_ps(invs + j, _mm512_div_ps(
						_mm512_set1_ps(1.0f), sc));
				}
				/* a group of whole bf16 blocks of 128 that all take
				 * the short encoding (the common case) goes in one
				 * loop, without a block's checks and branches */
				if (dt == FEP_K_BF16 && bs == 128 && (b + g) * bs <= a->cols) {
					int all = 1;

					for (j = 0; j < g && all; j++)
						all = fep_e4m3_short(nan[j], amax[j], invs[j]);
					if (all) {
						pf = (fep_k_vbmi ? quant512_b128_fast_vbmi :
						      quant512_b128_fast)((const uint16_t *)in + b * bs,
									  out + b * bs, g, invs,
									  ntr, pf);
						b += g - 1;
						continue;
					}
				}
			}
			inv = _mm512_set1_ps(invs[b % 64]);
			i = c0;
			if (dt == FEP_K_BF16 && !(nan[b % 64] & 1)) {  /* a NaN: below */
				const uint16_t *p = (const uint16_t *)in;
				int fast = fep_e4m3_short(nan[b % 64], amax[b % 64], invs[b % 64]);

				if (fast && fep_k_vbmi) {
					pf = quant512_run_vbmi(p, out, i, c1, inv, ntb, pf);
					i += (c1 - i) & ~(size_t)63;
				}
				for (; i + 64 <= c1; i += 64) {
					__m512i x0 = _mm512_loadu_si512(p + i);
					__m512i x1 = _mm512_loadu_si512(p + i + 32);
					__m512i q = fep512_e4m3_bf16x64(x0, x1, inv, fast);

					fep512_st64(out + i, q, ntb);
					fep_pf_step(&pf, 64 * es);
				}
			}
			if (dt == FEP_K_F32 &&
			    fep_e4m3_short(nan[b % 64], amax[b % 64], invs[b % 64])) {
				const float *p = (const float *)in;

				/* no NaN or inf, no value to clamp */
				for (; i + 64 <= c1; i += 64) {
					__m512i q = fep512_e4m3_f32x64_fast(
						_mm512_mul_ps(_mm512_loadu_ps(p + i), inv),
						_mm512_mul_ps(_mm512_loadu_ps(p + i + 16), inv),
						_mm512_mul_ps(_mm512_loadu_ps(p + i + 32), inv),
						_mm512_mul_ps(_mm512_loadu_ps(p + i + 48), inv));

					fep512_st64(out + i, q, ntb);
					fep_pf_step(&pf, 64 * es);
				}
			}
			for (; i + 64 <= c1; i += 64) {
				__m512i q0 = fep512_e4m3_codes(_mm512_mul_ps(
					fep512_load(in, dt, i, 0xffff), inv));
				__m512i q1 = fep512_e4m3_codes(_mm512_mul_ps(
					fep512_load(in, dt, i + 16, 0xffff), inv));
				__m512i q2 = fep512_e4m3_codes(_mm512_mul_ps(
					fep512_load(in, dt, i + 32, 0xffff), inv));
				__m512i q3 = fep512_e4m3_codes(_mm512_mul_ps(
					fep512_load(in, dt, i + 48, 0xffff), inv));
				fep512_st64(out + i, fep512_pack4(q0, q1, q2, q3), ntb);
				fep_pf_step(&pf, 64 * es);
			}
			for (; i < c1; i += 16) {
				__mmask16 k = fep512_mask(c1 - i);
				_mm_mask_storeu_epi8(out + i, k, fep512_e4m3(_mm512_mul_ps(
					fep512_load(in, dt, i, k), inv)));
			}
		}
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX512 void fep_k_fp8_quant_avx512(const fep_k_fp8_args_t *a, size_t r0, size_t r1)
{
	if (a->in_dt == FEP_K_BF16)
		quant512(a, r0, r1, FEP_K_BF16);
	else
		quant512(a, r0, r1, FEP_K_F32);
}

static FEP_INLINE FEP_T_AVX512 void dequant512(const fep_k_fp8dq_args_t *a,
					       size_t r0, size_t r1,
					       const fep_k_dtype_t odt)
{
	size_t bs = a->block > 0 ? (size_t)a->block : a->cols;
	size_t os = fep_k_dtype_size(odt), r, i, c0;
	int nt = fep_k_stream(a->nt, fep_k_nt_fp8, (r1 - r0) * a->cols * os);

	for (r = r0; r < r1; r++) {
		const uint8_t *in = a->in + r * a->ld_in;
		char *out = (char *)a->out + r * a->ld_out * os;
		const float *sc = a->scales + r * a->ld_scales;
		int ntr = nt && ((uintptr_t)out & 63) == 0;

		for (c0 = 0; c0 < a->cols; c0 += bs) {
			size_t c1 = FEP_MIN(c0 + bs, a->cols);
			float sf = *sc++;
			/* 2^8 * scale is exact below 2^119: one multiply */
			int two = !(fabsf(sf) < 0x1p119f);
			__m512 s = _mm512_set1_ps(sf);
			__m512 k = _mm512_set1_ps(two ? 256.0f : sf * 256.0f);
			/* no product is subnormal where |scale| >= 2^-117 (the
			 * least code is 2^-9): no check for the bf16 rounding */
			int sub = !(fabsf(sf) >= 0x1p-117f);
			int ntb = ntr && !(c0 & 31);

			/* 32 at a time: bf16 output leaves as whole lines */
			for (i = c0; i + 32 <= c1; i += 32) {
				__m512 v0, v1;

				if (nt && !(i & 63))
					_mm_prefetch((const char *)in + i + FEP_K_NT_PF,
						     _MM_HINT_T0);
				dec512(_mm256_loadu_si256((const __m256i *)(in + i)), k, &v0, &v1);
				if (two) {
					v0 = _mm512_mul_ps(v0, s);
					v1 = _mm512_mul_ps(v1, s);
				}
				fep512_store32(out, odt, i, v0, v1, ntb, sub);
			}
			for (; i < c1; i += 16) {
				__mmask16 m = fep512_mask(c1 - i);
				__m512 v, v1;

				dec512(_mm256_zextsi128_si256(_mm_maskz_loadu_epi8(m, in + i)),
				       k, &v, &v1);
				fep512_store(out, odt, i, two ? _mm512_mul_ps(v, s) : v, m);
			}
		}
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX512 void fep_k_fp8_dequant_avx512(const fep_k_fp8dq_args_t *a, size_t r0, size_t r1)
{
	if (a->out_dt == FEP_K_BF16)
		dequant512(a, r0, r1, FEP_K_BF16);
	else
		dequant512(a, r0, r1, FEP_K_F32);
}

/* ---- checks and threaded wrappers ---- */

int fep_k_fp8_check(const fep_k_fp8_args_t *a)
{
	if (!a || !a->in || !a->out || !a->scales) {
		fep_err("fp8_quant: NULL argument");
		return -EINVAL;
	}
	if (a->in_dt != FEP_K_F32 && a->in_dt != FEP_K_BF16) {
		fep_err("fp8_quant: input dtype %d is not fp32 or bf16", (int)a->in_dt);
		return -EINVAL;
	}
	if (a->block < 0 || a->block % 16) {
		fep_err("fp8_quant: block %d is not 0 or a positive multiple of 16",
			a->block);
		return -EINVAL;
	}
	if (a->ld_in < a->cols || a->ld_out < a->cols ||
	    a->ld_scales < nblocks(a->cols, a->block)) {
		fep_err("fp8_quant: leading dimension too small (cols %zu, ld_in %zu, "
			"ld_out %zu, ld_scales %zu)", a->cols, a->ld_in, a->ld_out,
			a->ld_scales);
		return -EINVAL;
	}
	if (a->scale_ub != a->scale_ub) {
		fep_err("fp8_quant: scale_ub is NaN");
		return -EINVAL;
	}
	return 0;
}

int fep_k_fp8dq_check(const fep_k_fp8dq_args_t *a)
{
	if (!a || !a->in || !a->out || !a->scales) {
		fep_err("fp8_dequant: NULL argument");
		return -EINVAL;
	}
	if (a->out_dt != FEP_K_F32 && a->out_dt != FEP_K_BF16) {
		fep_err("fp8_dequant: output dtype %d is not fp32 or bf16",
			(int)a->out_dt);
		return -EINVAL;
	}
	if (a->block < 0 || a->block % 16) {
		fep_err("fp8_dequant: block %d is not 0 or a positive multiple of 16",
			a->block);
		return -EINVAL;
	}
	if (a->ld_in < a->cols || a->ld_out < a->cols ||
	    a->ld_scales < nblocks(a->cols, a->block)) {
		fep_err("fp8_dequant: leading dimension too small");
		return -EINVAL;
	}
	return 0;
}

struct q_ctx {
	const void *args;
	const struct fep_k_ops *ops;
};

static void quant_range(void *arg, size_t r0, size_t r1)
{
	struct q_ctx *c = arg;
	c->ops->fp8_quant(c->args, r0, r1);
}

static void dequant_range(void *arg, size_t r0, size_t r1)
{
	struct q_ctx *c = arg;
	c->ops->fp8_dequant(c->args, r0, r1);
}

/* Streaming stores are chosen by what the whole call writes: split over
 * many threads, each share may be small while the call is not. */
int fep_k_fp8_quant_mt(fep_pool_t *pool, const fep_k_fp8_args_t *a, size_t rows)
{
	fep_k_fp8_args_t b;
	struct q_ctx c = { &b, fep_k_ops() };
	int ret = fep_k_fp8_check(a);

	if (ret)
		return ret;
	b = *a;
	if (!b.nt)
		b.nt = fep_k_stream(0, fep_k_nt_quant(b.in_dt), rows * b.cols) ? 1 : -1;
	return fep_pool_for(pool, rows, 1, quant_range, &c);
}

int fep_k_fp8_dequant_mt(fep_pool_t *pool, const fep_k_fp8dq_args_t *a,
			 size_t rows)
{
	fep_k_fp8dq_args_t b;
	struct q_ctx c = { &b, fep_k_ops() };
	int ret = fep_k_fp8dq_check(a);

	if (ret)
		return ret;
	b = *a;
	if (!b.nt)
		b.nt = fep_k_stream(0, fep_k_nt_fp8, rows * b.cols *
				    fep_k_dtype_size(b.out_dt)) ? 1 : -1;
	return fep_pool_for(pool, rows, 1, dequant_range, &c);
}
