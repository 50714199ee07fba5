/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bf16.c - bf16 <-> fp32 conversion: round to nearest even, NaN kept NaN,
 * subnormals kept.  Scalar reference, AVX2 and AVX-512 versions.
 */
#include "config.h"

#include <errno.h>

#include "kernels/kernels.h"
#include "kernels/simd.h"

uint16_t fep_f32_to_bf16(float f)
{
	return fep_bf16_rne(f);
}

float fep_bf16_to_f32(uint16_t h)
{
	return fep_u2f((uint32_t)h << 16);
}

/* ---- scalar reference ---- */

void fep_k_bf16_to_f32_scalar(const uint16_t *in, float *out, size_t i0,
			      size_t i1)
{
	size_t i;

	for (i = i0; i < i1; i++)
		out[i] = fep_bf16_to_f32(in[i]);
}

void fep_k_f32_to_bf16_scalar(const float *in, uint16_t *out, size_t i0,
			      size_t i1)
{
	size_t i;

	for (i = i0; i < i1; i++)
		out[i] = fep_bf16_rne(in[i]);
}

/* ---- AVX2 ---- */

FEP_T_AVX2 void fep_k_bf16_to_f32_avx2(const uint16_t *in, float *out,
				       size_t i0, size_t i1)
{
	int nt = (i1 - i0) * 4 >= FEP_K_NT_BYTES;
	size_t i = i0;

	if (nt)
		for (; i < i1 && ((uintptr_t)(out + i) & 31); i++)
			out[i] = fep_bf16_to_f32(in[i]);
	for (; i + 16 <= i1; i += 16) {
		__m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i)));
		__m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i + 8)));

		if (nt && !(i & 31))
			_mm_prefetch((const char *)(in + i) + FEP_K_NT_PF, _MM_HINT_T0);
		a = _mm256_slli_epi32(a, 16);
		b = _mm256_slli_epi32(b, 16);
		if (nt) {
			_mm256_stream_si256((__m256i *)(out + i), a);
			_mm256_stream_si256((__m256i *)(out + i + 8), b);
		} else {
			_mm256_storeu_si256((__m256i *)(out + i), a);
			_mm256_storeu_si256((__m256i *)(out + i + 8), b);
		}
	}
	for (; i < i1; i++)
		out[i] = fep_bf16_to_f32(in[i]);
	if (nt)
		_mm_sfence();
}

FEP_T_AVX2 void fep_k_f32_to_bf16_avx2(const float *in, uint16_t *out,
				       size_t i0, size_t i1)
{
	int nt = (i1 - i0) * 2 >= FEP_K_NT_BYTES;
	size_t i = i0;

	if (nt)
		for (; i < i1 && ((uintptr_t)(out + i) & 31); i++)
			out[i] = fep_bf16_rne(in[i]);
	for (; i + 16 <= i1; i += 16) {
		__m128i a = fep256_f32_to_bf16(_mm256_loadu_ps(in + i));
		__m128i b = fep256_f32_to_bf16(_mm256_loadu_ps(in + i + 8));
		__m256i r = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);

		if (nt) {
			_mm_prefetch((const char *)(in + i) + FEP_K_NT_PF, _MM_HINT_T0);
			_mm256_stream_si256((__m256i *)(out + i), r);
		} else {
			_mm256_storeu_si256((__m256i *)(out + i), r);
		}
	}
	for (; i < i1; i++)
		out[i] = fep_bf16_rne(in[i]);
	if (nt)
		_mm_sfence();
}

/* ---- AVX-512 ---- */

FEP_T_AVX512 void fep_k_bf16_to_f32_avx512(const uint16_t *in, float *out,
					   size_t i0, size_t i1)
{
	int nt = (i1 - i0) * 4 >= FEP_K_NT_BYTES;
	size_t i = i0;

	if (nt && ((uintptr_t)(out + i) & 63)) {
		size_t n = (64 - ((uintptr_t)(out + i) & 63)) / 4;
		__mmask16 m;

		if (((uintptr_t)(out + i) & 3) == 0) {
			n = FEP_MIN(n, i1 - i);
			m = fep512_mask(n);
			_mm512_mask_storeu_ps(out + i, m, fep512_load(in, FEP_K_BF16, i, m));
			i += n;
		} else {
			nt = 0; /* misaligned floats: no streaming */
		}
	}
	for (; i + 32 <= i1; i += 32) {
		__m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(in + i)));
		__m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(in + i + 16)));

		if (nt)
			_mm_prefetch((const char *)(in + i) + FEP_K_NT_PF, _MM_HINT_T0);
		a = _mm512_slli_epi32(a, 16);
		b = _mm512_slli_epi32(b, 16);
		if (nt) {
			_mm512_stream_si512((void *)(out + i), a);
			_mm512_stream_si512((void *)(out + i + 16), b);
		} else {
			_mm512_storeu_si512(out + i, a);
			_mm512_storeu_si512(out + i + 16, b);
		}
	}
	for (; i < i1; i += 16) {
		__mmask16 m = fep512_mask(i1 - i);
		_mm512_mask_storeu_ps(out + i, m, fep512_load(in, FEP_K_BF16, i, m));
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX512 void fep_k_f32_to_bf16_avx512(const float *in, uint16_t *out,
					   size_t i0, size_t i1)
{
	int nt = (i1 - i0) * 2 >= FEP_K_NT_BYTES;
	size_t i = i0;

	if (nt && ((uintptr_t)(out + i) & 63)) {
		if (((uintptr_t)(out + i) & 1) == 0) {
			size_t n = (64 - ((uintptr_t)(out + i) & 63)) / 2;

			for (; n && i < i1; n--, i++)
				out[i] = fep_bf16_rne(in[i]);
		} else {
			nt = 0;
		}
	}
	for (; i + 32 <= i1; i += 32) {
		__m512i r = fep512_f32x2_to_bf16(_mm512_loadu_ps(in + i),
						 _mm512_loadu_ps(in + i + 16));

		if (nt) {
			_mm_prefetch((const char *)(in + i) + FEP_K_NT_PF, _MM_HINT_T0);
			_mm_prefetch((const char *)(in + i + 16) + FEP_K_NT_PF,
				     _MM_HINT_T0);
			_mm512_stream_si512((void *)(out + i), r);
		} else {
			_mm512_storeu_si512(out + i, r);
		}
	}
	for (; i < i1; i += 16) {
		__mmask16 m = fep512_mask(i1 - i);
		_mm256_mask_storeu_epi16(out + i, m,
			fep512_f32_to_bf16(_mm512_maskz_loadu_ps(m, in + i)));
	}
	if (nt)
		_mm_sfence();
}

/* ---- threaded wrappers ---- */

struct conv_ctx {
	const void *in;
	void *out;
	const struct fep_k_ops *ops;
};

static void b2f_range(void *arg, size_t i0, size_t i1)
{
	struct conv_ctx *c = arg;
	c->ops->bf16_to_f32(c->in, c->out, i0, i1);
}

static void f2b_range(void *arg, size_t i0, size_t i1)
{
	struct conv_ctx *c = arg;
	c->ops->f32_to_bf16(c->in, c->out, i0, i1);
}

/* The kernels stream their stores when the range they get writes
 * FEP_K_NT_BYTES; a pool hands out quarters of a thread's share, so a
 * call large enough to give every thread that much is split in pieces
 * of at least that size. */
static size_t conv_grain(fep_pool_t *pool, size_t n, size_t osize)
{
	size_t g = FEP_K_NT_BYTES / osize;

	return n >= g * (size_t)fep_pool_threads(pool) ? g : 1024;
}

int fep_k_bf16_to_f32_mt(fep_pool_t *pool, const uint16_t *in, float *out,
			 size_t n)
{
	struct conv_ctx c = { in, out, fep_k_ops() };

	if (n && (!in || !out)) {
		fep_err("bf16_to_f32: NULL buffer");
		return -EINVAL;
	}
	return fep_pool_for(pool, n, conv_grain(pool, n, 4), b2f_range, &c);
}

int fep_k_f32_to_bf16_mt(fep_pool_t *pool, const float *in, uint16_t *out,
			 size_t n)
{
	struct conv_ctx c = { in, out, fep_k_ops() };

	if (n && (!in || !out)) {
		fep_err("f32_to_bf16: NULL buffer");
		return -EINVAL;
	}
	return fep_pool_for(pool, n, conv_grain(pool, n, 2), f2b_range, &c);
}
