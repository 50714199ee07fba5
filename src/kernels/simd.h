/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * simd.h - for the kernel files only: the target attributes of the
 * vector levels and the vector helpers they share (loads and stores by
 * dtype, bf16 rounding, FP8 e4m3 encoding and decoding, prefetching).
 * The numeric rules they implement are in kernels.h.
 *
 * Layer: kernels.  Internal (not installed).
 */
#ifndef FEP_KERNELS_SIMD_H
#define FEP_KERNELS_SIMD_H

#include <immintrin.h>
#include <string.h>

#include "kernels/kernels.h"

#define FEP_T_AVX2 __attribute__((target("avx2,f16c,fma")))
/* avx512bf16 is in the target so the hardware bf16 conversion can be
 * used where the CPU has it (fep_k_hw_bf16); the compiler emits those
 * instructions only for the explicit intrinsics, which run only when the
 * flag is set, so the code stays valid on AVX-512 CPUs without BF16. */
#define FEP_T_AVX512 \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
/* AVX-512 with VBMI: only for the functions run where fep_k_vbmi (AVX-512
 * CPUs without it, as Cascade Lake, must meet none of its instructions) */
#define FEP_T_AVX512_VBMI \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")))
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

/* 32 values as fp32 bits in even/odd order (e: values 0, 2, .., 30; o:
 * 1, 3, .., 31) rounded to bf16 as fep256_bf16_rne_nn rounds them (no
 * NaN but one with zero low 16 bits, as the default NaN and any sum of
 * bf16 values are) -> their 32 words in order, e's into the low halves
 * and o's into the high halves, with no shuffle. */
static inline FEP_T_AVX512 __m512i fep512_bf16_eo_nn(__m512i e, __m512i o)
{
	const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);

	e = _mm512_add_epi32(_mm512_add_epi32(e, half),
			     _mm512_and_si512(_mm512_srli_epi32(e, 16), one));
	o = _mm512_add_epi32(_mm512_add_epi32(o, half),
			     _mm512_and_si512(_mm512_srli_epi32(o, 16), one));
	/* 0xca: A ? B : C, bitwise: the high halves of o, the low of e */
	return _mm512_ternarylogic_epi32(_mm512_set1_epi32((int)0xffff0000u), o,
					 _mm512_srli_epi32(e, 16), 0xca);
}

/* Lanes of v that are fp32 subnormals (exponent 0, mantissa != 0): the
 * hardware conversion flushes them, so they take the integer path. */
static inline FEP_T_AVX512 __mmask16 fep512_subnormals(__m512 v)
{
	return _mm512_fpclass_ps_mask(v, 0x20);  /* the denormal class */
}

/* 16 fp32 -> 16 bf16, RNE, NaN kept (quietened), subnormals kept. */
static inline FEP_T_AVX512 __m256i fep512_f32_to_bf16(__m512 v)
{
	if (fep_k_hw_bf16 && !fep512_subnormals(v))
		return (__m256i)_mm512_cvtneps_pbh(v);
	return _mm512_cvtepi32_epi16(fep512_bf16_bits(v));
}

/* 32 fp32 (a: first 16, b: next 16) -> 32 bf16 in order; sub: they may
 * be subnormal (the hardware's rounding flushes those: checked), 0 where
 * the caller knows none is. */
static inline FEP_T_AVX512 __m512i fep512_f32x2_to_bf16_sub(__m512 a, __m512 b,
							   int sub)
{
	if (fep_k_hw_bf16 &&
	    !(sub && (fep512_subnormals(a) | fep512_subnormals(b))))
		return (__m512i)_mm512_cvtne2ps_pbh(b, a);
	return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
		_mm512_packus_epi32(fep512_bf16_bits(a), fep512_bf16_bits(b)));
}

static inline FEP_T_AVX512 __m512i fep512_f32x2_to_bf16(__m512 a, __m512 b)
{
	return fep512_f32x2_to_bf16_sub(a, b, 1);
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
 * 64-byte aligned): bf16 goes out as one full 64-byte line, converted as
 * fep512_f32x2_to_bf16_sub with sub. */
static inline FEP_T_AVX512 void fep512_store32(void *p, fep_k_dtype_t dt,
					       size_t i, __m512 v0, __m512 v1,
					       int nt, int sub)
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
		__m512i b = fep512_f32x2_to_bf16_sub(v0, v1, sub);

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

/* Whether scaled values take the short FP8 encoding (the _fast helpers
 * below): none is a NaN or an inf (nonfinite false) and none needs the
 * clamp, since |v| * inv <= amax * inv (rounding is monotone) and every
 * value below 464 rounds to at most 448. */
static inline int fep_e4m3_short(int nonfinite, float amax, float inv)
{
	return !nonfinite && amax * inv < 464.0f;
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
	/* as fep256_e4m3_c: c + 2^(max(e, -6) + 20) in one rounding leaves
	 * the code in the sum's low bits; a NaN c gives a NaN sum, whose
	 * code comes out above 0x7f */
	__m512i e = _mm512_max_epu32(_mm512_and_si512(c, _mm512_set1_epi32(0x7f800000)),
				     _mm512_set1_epi32(0x3c800000));
	__m512i s = _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(e),
		_mm512_set1_ps(1048576.0f), _mm512_castsi512_ps(c)));

	return _mm512_add_epi32(_mm512_srli_epi32(s, 20), _mm512_sub_epi32(
		_mm512_and_si512(s, _mm512_set1_epi32(0x1f)), _mm512_set1_epi32(141 << 3)));
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

/* 16 * (code + 1128) of 16 magnitudes (fp32 bits, < 464, none a NaN),
 * in the low 16 bits of each lane: fep256_e4m3_c16 at twice the width. */
static inline FEP_T_AVX512 __m512i fep512_e4m3_c16(__m512i c)
{
	__m512i e = _mm512_max_epu32(_mm512_and_si512(c, _mm512_set1_epi32(0x7f800000)),
				     _mm512_set1_epi32(0x3c800000));
	__m512i s = _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(e),
		_mm512_set1_ps(1048576.0f), _mm512_castsi512_ps(c)));

	return _mm512_madd_epi16(s, _mm512_set1_epi32(0x00010010));
}

/* 32 magnitudes (fp32 bits, < 464, none a NaN; e: values 0, 2, .., 30,
 * o: values 1, 3, .., 31) -> 16 times their 32 codes in 16-bit lanes, in
 * order: the code sits in bits 4..11, to be shifted down (the codes,
 * fep512_e4m3_eo32) or up (into the high byte, fep512_e4m3_bf16w_hi). */
static inline FEP_T_AVX512 __m512i fep512_e4m3_eo32_x16(__m512i e, __m512i o)
{
	return _mm512_sub_epi16(_mm512_or_si512(fep512_e4m3_c16(e),
		_mm512_slli_epi32(fep512_e4m3_c16(o), 16)), _mm512_set1_epi16(16 * 1128));
}

/* 32 magnitudes as fep512_e4m3_eo32_x16 -> their 32 codes in 16-bit
 * lanes, in order */
static inline FEP_T_AVX512 __m512i fep512_e4m3_eo32(__m512i e, __m512i o)
{
	return _mm512_srli_epi16(fep512_e4m3_eo32_x16(e, o), 4);
}

/* 64 scaled fp32 values (four vectors, in order), every |v| below 464
 * and none a NaN -> 64 codes in order, with their signs: the codes as
 * 16 * (code + 1128) (fep512_e4m3_c16), packed to words, taken back to
 * the codes there, packed to bytes and the 128-bit lanes' dwords put
 * back in order (as fep512_pack4); the signs set through a mask. */
static inline FEP_T_AVX512 __m512i fep512_e4m3_f32x64_fast(__m512 v0, __m512 v1,
							   __m512 v2, __m512 v3)
{
	const __m512i abs = _mm512_set1_epi32(0x7fffffff);
	const __m512i off = _mm512_set1_epi16(16 * 1128);
	__m512i w0 = _mm512_packus_epi32(
		fep512_e4m3_c16(_mm512_and_si512(_mm512_castps_si512(v0), abs)),
		fep512_e4m3_c16(_mm512_and_si512(_mm512_castps_si512(v1), abs)));
	__m512i w1 = _mm512_packus_epi32(
		fep512_e4m3_c16(_mm512_and_si512(_mm512_castps_si512(v2), abs)),
		fep512_e4m3_c16(_mm512_and_si512(_mm512_castps_si512(v3), abs)));
	__m512i q = _mm512_permutexvar_epi32(
		_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
		_mm512_packus_epi16(_mm512_srli_epi16(_mm512_sub_epi16(w0, off), 4),
				    _mm512_srli_epi16(_mm512_sub_epi16(w1, off), 4)));
	__mmask64 neg = _mm512_kunpackd(
		_mm512_kunpackw(_mm512_movepi32_mask(_mm512_castps_si512(v3)),
				_mm512_movepi32_mask(_mm512_castps_si512(v2))),
		_mm512_kunpackw(_mm512_movepi32_mask(_mm512_castps_si512(v1)),
				_mm512_movepi32_mask(_mm512_castps_si512(v0))));

	return _mm512_mask_add_epi8(q, neg, q, _mm512_set1_epi8((char)0x80));
}

/* 32 magnitudes of bf16 values (one vector, sign bits clear), |v| * inv
 * < 464 and none a NaN or inf, -> 16 times their codes in 16-bit lanes,
 * in order (fep512_e4m3_eo32_x16) */
static inline FEP_T_AVX512 __m512i fep512_e4m3_bf16a_x16(__m512i a, __m512 inv)
{
	__m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
	__m512 od = _mm512_castsi512_ps(_mm512_and_si512(a, _mm512_set1_epi32((int)0xffff0000u)));

	return fep512_e4m3_eo32_x16(_mm512_castps_si512(_mm512_mul_ps(ev, inv)),
				    _mm512_castps_si512(_mm512_mul_ps(od, inv)));
}

/* 32 bf16 values (one vector), |v| * inv < 464 and none a NaN or inf,
 * -> their codes without sign in 16-bit lanes, in order */
static inline FEP_T_AVX512 __m512i fep512_e4m3_bf16w_fast(__m512i x, __m512 inv)
{
	return _mm512_srli_epi16(fep512_e4m3_bf16a_x16(_mm512_and_si512(x,
		_mm512_set1_epi32(0x7fff7fff)), inv), 4);
}

/* The sign bits of 64 bf16 values (two vectors), value i in bit i */
static inline FEP_T_AVX512 __mmask64 fep512_bf16_signs64(__m512i x0, __m512i x1)
{
	return _mm512_kunpackd(_mm512_movepi16_mask(x1), _mm512_movepi16_mask(x0));
}

/* 64 codes without sign in 16-bit lanes (w0: the first 32, in order)
 * -> 64 bytes in order: packed (codes are at most 0x7e), the lanes'
 * quarters put back in order, and the sign set (adding 0x80) where neg
 * has a bit. */
static inline FEP_T_AVX512 __m512i fep512_e4m3_join64(__m512i w0, __m512i w1,
						      __mmask64 neg)
{
	__m512i q = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
					     _mm512_packus_epi16(w0, w1));

	return _mm512_mask_add_epi8(q, neg, q, _mm512_set1_epi8((char)0x80));
}

/* 64 bf16 values (two vectors, no NaN) times inv -> 64 codes in order,
 * with the bf16 signs.  fast: a block known to need neither the clamp
 * nor the NaN rule (fep512_e4m3_bf16w_fast). */
static inline FEP_T_AVX512 __m512i fep512_e4m3_bf16x64(__m512i x0, __m512i x1,
						       __m512 inv, int fast)
{
	__m512i w0 = fast ? fep512_e4m3_bf16w_fast(x0, inv) : fep512_e4m3_bf16w(x0, inv);
	__m512i w1 = fast ? fep512_e4m3_bf16w_fast(x1, inv) : fep512_e4m3_bf16w(x1, inv);

	return fep512_e4m3_join64(w0, w1, fep512_bf16_signs64(x0, x1));
}

/* 32 bf16 values (one vector), |v| * inv < 464 and none a NaN or inf,
 * -> 256 * code | sign in each 16-bit lane, in order: 16 times the code
 * shifted into the lane's high byte, and the sign bit of the bf16 value
 * (x ^ |x|) set in the same operation (for VBMI's byte permute,
 * fep512_e4m3_bf16x64_vbmi). */
static FEP_INLINE FEP_T_AVX512 __m512i fep512_e4m3_bf16w_hi(__m512i x, __m512 inv)
{
	__m512i a = _mm512_and_si512(x, _mm512_set1_epi32(0x7fff7fff));

	/* 0xf6: A | (B ^ C) */
	return _mm512_ternarylogic_epi32(_mm512_slli_epi16(
		fep512_e4m3_bf16a_x16(a, inv), 4), x, a, 0xf6);
}

/* 64 bf16 values (two vectors), |v| * inv < 464 and none a NaN or inf,
 * -> 64 codes in order, with the bf16 signs, with VBMI: the high bytes
 * of fep512_e4m3_bf16w_hi's lanes taken in order by one vpermt2b, where
 * without VBMI a pack, a qword permute and the signs through a mask take
 * six operations (fep512_e4m3_join64). */
static FEP_INLINE FEP_T_AVX512_VBMI __m512i fep512_e4m3_bf16x64_vbmi(__m512i x0, __m512i x1,
								  __m512 inv)
{
	/* byte 2i + 1 of the first vector, then of the second (+ 64) */
	const __m512i odd = _mm512_set_epi8(
		127, 125, 123, 121, 119, 117, 115, 113, 111, 109, 107, 105, 103, 101, 99, 97,
		95, 93, 91, 89, 87, 85, 83, 81, 79, 77, 75, 73, 71, 69, 67, 65,
		63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
		31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);

	return _mm512_permutex2var_epi8(fep512_e4m3_bf16w_hi(x0, inv), odd,
					fep512_e4m3_bf16w_hi(x1, inv));
}

static inline FEP_T_AVX512 __m128i fep512_e4m3(__m512 v)
{
	return _mm512_cvtepi32_epi8(fep512_e4m3_codes(v));
}

/* 64 bytes to p, streamed where nt (p then 64-byte aligned: a test per
 * store would cost the FP8 norm's encoding loop 5 %) */
static inline FEP_T_AVX512 void fep512_st64(void *p, __m512i v, int nt)
{
	if (nt)
		_mm512_stream_si512((__m512i *)p, v);
	else
		_mm512_storeu_si512(p, v);
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

/* FP8 e4m3 codes without sign of 8 magnitudes c (fp32 bits, at most 448,
 * not NaN): adding M = 2^(max(e, -6) + 20), e the exponent of c, leaves
 * c rounded (to nearest even, by the fp32 add) to the e4m3 step 2^(e-3)
 * (2^-9 below 2^-6) in the low bits of the sum, whose exponent field
 * is that of M: code = (sum >> 20) - (141 << 3) + (sum & 0x1f). */
static inline FEP_T_AVX2 __m256i fep256_e4m3_c(__m256i c)
{
	/* 2^max(e, -6), times 2^20 (exactly) and plus c in one rounding */
	__m256i e = _mm256_max_epu32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f800000)),
				     _mm256_set1_epi32(0x3c800000));
	__m256i s = _mm256_castps_si256(_mm256_fmadd_ps(_mm256_castsi256_ps(e),
		_mm256_set1_ps(1048576.0f), _mm256_castsi256_ps(c)));

	return _mm256_add_epi32(_mm256_srli_epi32(s, 20), _mm256_sub_epi32(
		_mm256_and_si256(s, _mm256_set1_epi32(0x1f)), _mm256_set1_epi32(141 << 3)));
}

/* 8 scaled values -> 8 codes (fep_e4m3_enc) in int32 lanes: |v| is
 * clamped to 448 (inf too; a NaN becomes 448 and then 0x7e | 1). */
static inline FEP_T_AVX2 __m256i fep256_e4m3_codes(__m256 v)
{
	__m256i u = _mm256_castps_si256(v);
	__m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
	__m256i code = fep256_e4m3_c(_mm256_min_epu32(a, _mm256_set1_epi32(0x43e00000)));
	__m256i hi = _mm256_or_si256(
		_mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80)),
		_mm256_and_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)),
				 _mm256_set1_epi32(1)));

	return _mm256_or_si256(code, hi);
}

/* 32 scaled values (v[0..3]) -> 32 codes in order.  The magnitudes are
 * encoded in int32 lanes and packed to bytes; the signs are packed with
 * signed saturation (which keeps them) and put back as bytes; with
 * nan, NaNs become 0x7e | 1 (without, there must be none). */
static inline FEP_T_AVX2 __m256i fep256_e4m3_x32(const __m256 *v, int nan)
{
	const __m256i abs = _mm256_set1_epi32(0x7fffffff);
	const __m256i lim = _mm256_set1_epi32(0x43e00000);
	__m256i u[4], c[4], x, sg;
	int q;

	#pragma GCC unroll 4
	for (q = 0; q < 4; q++) {
		u[q] = _mm256_castps_si256(v[q]);
		c[q] = fep256_e4m3_c(_mm256_min_epu32(_mm256_and_si256(u[q], abs), lim));
	}
	x = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]),
				_mm256_packus_epi32(c[2], c[3]));
	sg = _mm256_packs_epi16(_mm256_packs_epi32(u[0], u[1]),
				_mm256_packs_epi32(u[2], u[3]));
	x = _mm256_or_si256(x, _mm256_and_si256(sg, _mm256_set1_epi8((char)0x80)));
	if (nan) {
		const __m256i inf = _mm256_set1_epi32(0x7f800000);
		__m256i n[4];

		#pragma GCC unroll 4
		for (q = 0; q < 4; q++)
			n[q] = _mm256_cmpgt_epi32(_mm256_and_si256(u[q], abs), inf);
		x = _mm256_or_si256(x, _mm256_and_si256(_mm256_packs_epi16(
			_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3])),
			_mm256_set1_epi8(1)));
	}
	return _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 4 x 8 codes (int32 lanes, each <= 0xff) -> 32 bytes in order */
static inline FEP_T_AVX2 __m256i fep256_pack4(__m256i a, __m256i b,
					      __m256i c, __m256i d)
{
	__m256i x = _mm256_packus_epi16(_mm256_packus_epi32(a, b),
					_mm256_packus_epi32(c, d));

	return _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 scaled values -> 8 codes in the low 64 bits */
static inline FEP_T_AVX2 __m128i fep256_e4m3(__m256 v)
{
	__m256i code = fep256_e4m3_codes(v);

	code = _mm256_packus_epi32(code, code);
	code = _mm256_packus_epi16(code, code);
	return _mm_unpacklo_epi32(_mm256_castsi256_si128(code),
				  _mm256_extracti128_si256(code, 1));
}

/* 16 bf16 values (one vector) times inv (> 0) -> their 16 codes in
 * 16-bit lanes, in order: the even values are the low halves shifted
 * up, the odd ones the high halves masked (no widening shuffle); the
 * magnitudes are encoded, then the bf16 sign bits and NaNs (0x7e | 1)
 * put back. */
static inline FEP_T_AVX2 __m256i fep256_e4m3_bf16x16(__m256i x, __m256 inv)
{
	const __m256i lim = _mm256_set1_epi32(0x43e00000);
	__m256i xa = _mm256_and_si256(x, _mm256_set1_epi16(0x7fff));
	__m256 ev = _mm256_castsi256_ps(_mm256_slli_epi32(xa, 16));
	__m256 od = _mm256_castsi256_ps(_mm256_and_si256(xa, _mm256_set1_epi32((int)0xffff0000u)));
	__m256i ce = fep256_e4m3_c(_mm256_min_epu32(_mm256_castps_si256(
		_mm256_mul_ps(ev, inv)), lim));
	__m256i co = fep256_e4m3_c(_mm256_min_epu32(_mm256_castps_si256(
		_mm256_mul_ps(od, inv)), lim));
	__m256i hi = _mm256_or_si256(
		_mm256_srli_epi16(_mm256_and_si256(x, _mm256_set1_epi16((short)0x8000)), 8),
		_mm256_and_si256(_mm256_cmpgt_epi16(xa, _mm256_set1_epi16(0x7f80)),
				 _mm256_set1_epi16(1)));

	return _mm256_or_si256(_mm256_or_si256(ce, _mm256_slli_epi32(co, 16)), hi);
}

/* 32 bf16 values (two vectors) times inv -> 32 codes in order */
static inline FEP_T_AVX2 __m256i fep256_e4m3_bf16x32(__m256i x0, __m256i x1,
						     __m256 inv)
{
	return _mm256_permute4x64_epi64(_mm256_packus_epi16(
		fep256_e4m3_bf16x16(x0, inv), fep256_e4m3_bf16x16(x1, inv)), 0xd8);
}

/* 16 * (code + 1128) of 8 magnitudes (fp32 bits, < 464, none a NaN):
 * fep256_e4m3_c without its last subtraction, which the caller makes
 * once per two vectors in 16-bit lanes (below 464 every value rounds to
 * at most 448, code 0x7e, so no clamp is needed).  The sum's low 16
 * bits are its mantissa field, at most 16, and its high 16 bits its
 * exponent field << 7, at most 155 << 7, so one multiply-add of the
 * 16-bit halves, low * 16 + high, adds the exponent field << 3 and the
 * mantissa, times 16, where fep256_e4m3_c needs a shift, a mask and an
 * add. */
static inline FEP_T_AVX2 __m256i fep256_e4m3_c16(__m256i c)
{
	__m256i e = _mm256_max_epu32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f800000)),
				     _mm256_set1_epi32(0x3c800000));
	__m256i s = _mm256_castps_si256(_mm256_fmadd_ps(_mm256_castsi256_ps(e),
		_mm256_set1_ps(1048576.0f), _mm256_castsi256_ps(c)));

	return _mm256_madd_epi16(s, _mm256_set1_epi32(0x00010010));
}

/* 16 magnitudes (fp32 bits, < 464, none a NaN; e: values 0, 2, .., 14,
 * o: values 1, 3, .., 15) -> their 16 codes in 16-bit lanes, in order */
static inline FEP_T_AVX2 __m256i fep256_e4m3_eo16(__m256i e, __m256i o)
{
	return _mm256_srli_epi16(_mm256_sub_epi16(_mm256_or_si256(fep256_e4m3_c16(e),
		_mm256_slli_epi32(fep256_e4m3_c16(o), 16)), _mm256_set1_epi16(16 * 1128)), 4);
}

/* 16 bf16 values, |v| * inv < 464 and none a NaN, -> 16 codes without
 * sign in 16-bit lanes (fep256_e4m3_bf16x16 for blocks known to need
 * neither the clamp nor the NaN rule). */
static inline FEP_T_AVX2 __m256i fep256_e4m3_bf16x16_fast(__m256i x, __m256 inv)
{
	__m256 ev = _mm256_castsi256_ps(_mm256_srli_epi32(_mm256_slli_epi32(x, 17), 1));
	__m256 od = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(0x7fff0000)));
	return fep256_e4m3_eo16(_mm256_castps_si256(_mm256_mul_ps(ev, inv)),
				_mm256_castps_si256(_mm256_mul_ps(od, inv)));
}

/* 32 bf16 values (two vectors; as above) times inv -> 32 codes in
 * order; the signs are the bf16 ones, packed with signed saturation. */
static inline FEP_T_AVX2 __m256i fep256_e4m3_bf16x32_fast(__m256i x0, __m256i x1,
							  __m256 inv)
{
	__m256i q = _mm256_packus_epi16(fep256_e4m3_bf16x16_fast(x0, inv),
					fep256_e4m3_bf16x16_fast(x1, inv));
	__m256i sg = _mm256_and_si256(_mm256_packs_epi16(x0, x1),
				      _mm256_set1_epi8((char)0x80));

	return _mm256_permute4x64_epi64(_mm256_or_si256(q, sg), 0xd8);
}

/* 16 codes -> 16 values times k (lo: the first 8): with k = 2^8 the
 * values exactly, with k = 2^8 * scale (when that is exact) the values
 * times the scale in one rounding.  e4m3
 * magnitudes are fp16 bit patterns shifted by 7 (fp16 has one more
 * exponent bit, bias 15 instead of 7: every e4m3 value, subnormals
 * included, is its fp16 reading times 2^8), which vcvtph2ps converts
 * exactly; 0x7f/0xff become the fp16 NaN 0x7e00 (fp32 0x7fc00000). */
static inline FEP_T_AVX2 void fep256_e4m3_dec16(__m128i q, __m256 k, __m256 *lo,
					      __m256 *hi)
{
	__m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(q), 7);
	__m256i nan;

	/* sign: bit 14 -> bit 15 */
	h = _mm256_add_epi16(h, _mm256_and_si256(h, _mm256_set1_epi16(0x4000)));
	nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
				 _mm256_set1_epi16(0x3f80));
	h = _mm256_xor_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x3f80 ^ 0x7e00)));
	*lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), k);
	*hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), k);
}

/* fp32 -> bf16 bits (int32 lanes), round to nearest even, for values
 * that are not NaN or are the default NaN (+-0x7fc00000, which this
 * turns into 0x7fc0 like the full rule does). */
static inline FEP_T_AVX2 __m256i fep256_bf16_rne_nn(__m256 v)
{
	__m256i u = _mm256_castps_si256(v);

	return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u,
		_mm256_set1_epi32(0x7fff)), _mm256_and_si256(_mm256_srli_epi32(u, 16),
							      _mm256_set1_epi32(1))), 16);
}

/* fep512_bf16_eo_nn for 16 values (e: 0, 2, .., 14; o: 1, 3, .., 15) */
static inline FEP_T_AVX2 __m256i fep256_bf16_eo_nn(__m256i e, __m256i o)
{
	const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);

	e = _mm256_add_epi32(_mm256_add_epi32(e, half),
			     _mm256_and_si256(_mm256_srli_epi32(e, 16), one));
	o = _mm256_add_epi32(_mm256_add_epi32(o, half),
			     _mm256_and_si256(_mm256_srli_epi32(o, 16), one));
	return _mm256_or_si256(_mm256_srli_epi32(e, 16),
			       _mm256_and_si256(o, _mm256_set1_epi32((int)0xffff0000u)));
}

/* A prefetch cursor over the next row (into L2):
 * a kernel that reads its rows twice (a pass for the scale, a pass that
 * writes) brings in the next row while it works on this one from cache,
 * so the memory stays busy during both passes. */
typedef struct fep_pf {
	const char *p;  /* NULL: nothing to prefetch */
	size_t len, done, want;
} fep_pf_t;

static inline void fep_pf_init(fep_pf_t *pf, const void *p, size_t len)
{
	pf->p = p;
	pf->len = p ? len : 0;
	pf->done = pf->want = 0;
}

/* A prefetch of the line at p into L1 (l1) or into L2.  The hint is an
 * immediate of the instruction, so the choice is a branch, folded where
 * l1 is a constant.  A macro, not an inline function: GCC 12 lost the
 * prefetches of such a function inlined into the gather's copy loops. */
#define FEP_PF_LINE(p, l1)                                                   \
	((l1) ? _mm_prefetch((const char *)(p), _MM_HINT_T0) :               \
		_mm_prefetch((const char *)(p), _MM_HINT_T1))

/* Advance the cursor by n bytes, issuing a prefetch per 64 bytes.  A
 * step of whole lines (n a constant multiple of 64, the vector loops')
 * is a test and a prefetch per line: this runs once per vector of the
 * loops it serves, beside a handful of vector operations. */
static inline void fep_pf_step(fep_pf_t *pf, size_t n)
{
	size_t k;

	pf->want += n;
	if (__builtin_constant_p(n) && n % 64 == 0) {
		for (k = 0; k < n; k += 64)
			if (pf->done < pf->len) {
				_mm_prefetch(pf->p + pf->done, _MM_HINT_T1);
				pf->done += 64;
			}
		return;
	}
	while (pf->done < pf->want && pf->done < pf->len) {
		_mm_prefetch(pf->p + pf->done, _MM_HINT_T1);
		pf->done += 64;
	}
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

#endif /* FEP_KERNELS_SIMD_H */
