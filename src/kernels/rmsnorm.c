/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * rmsnorm.c - RMSNorm of rows, x / sqrt(mean(x^2) + eps) * (gamma +
 * weight_offset), with optional residual add and output in fp32, bf16 or
 * FP8 e4m3 with one scale per row.  Semantics in kernels.h.
 */
#include "config.h"

#include <errno.h>
#include <math.h>

#define FEP_KERNELS_IMPL
#include "kernels/kernels.h"

#define ROW(p, dt, ld, r) ((char *)(p) + (r) * (ld) * fep_k_dtype_size(dt))
#define RMS_YBUF 8192
#define CROW(p, dt, ld, r) ((const char *)(p) + (r) * (ld) * fep_k_dtype_size(dt))

/* ---- scalar reference ---- */

void fep_k_rmsnorm_scalar(const fep_k_rmsnorm_args_t *a, size_t r0, size_t r1)
{
	fep_k_dtype_t dt = a->in_dt;
	size_t r, i, n = a->cols;

	for (r = r0; r < r1; r++) {
		const char *x = CROW(a->in, dt, a->ld_in, r);
		char *res = a->residual ? ROW(a->residual, dt, a->ld_res, r) : NULL;
		const char *h = res ? res : x;
		float ss = 0.0f, inv;

		for (i = 0; i < n; i++) {
			float v = fep_ld1(x, dt, i);

			if (res) {
				v += fep_ld1(res, dt, i);
				fep_st1(res, dt, i, v);
				v = fep_ld1(res, dt, i); /* rounded to dt */
			}
			ss += v * v;
		}
		inv = 1.0f / sqrtf(ss / (float)n + a->eps);
		if (a->out_dt != FEP_K_FP8) {
			char *out = ROW(a->out, a->out_dt, a->ld_out, r);

			for (i = 0; i < n; i++)
				fep_st1(out, a->out_dt, i, fep_ld1(h, dt, i) * inv *
					(a->gamma[i] + a->weight_offset));
		} else {
			uint8_t *out = (uint8_t *)a->out + r * a->ld_out;
			uint32_t amax = 0;
			float s, is;

			for (i = 0; i < n; i++)
				amax = FEP_MAX(amax, fep_absbits_finite(fep_ld1(h, dt, i) *
					inv * (a->gamma[i] + a->weight_offset)));
			s = fep_fp8_scale(fep_u2f(amax), a->scale_ub, a->pow2);
			a->scales[r * a->ld_scales] = s;
			is = 1.0f / s;
			for (i = 0; i < n; i++)
				out[i] = fep_e4m3_enc(fep_ld1(h, dt, i) * inv *
					(a->gamma[i] + a->weight_offset) * is);
		}
	}
}

/* ---- AVX2 ---- */

FEP_T_AVX2 void fep_k_rmsnorm_avx2(const fep_k_rmsnorm_args_t *a, size_t r0, size_t r1)
{
	fep_k_dtype_t dt = a->in_dt;
	size_t r, i, n = a->cols;
	__m256 wo = _mm256_set1_ps(a->weight_offset);

	for (r = r0; r < r1; r++) {
		const char *x = CROW(a->in, dt, a->ld_in, r);
		char *res = a->residual ? ROW(a->residual, dt, a->ld_res, r) : NULL;
		const char *h = res ? res : x;
		__m256 acc = _mm256_setzero_ps(), vi;
		float inv;

		for (i = 0; i < n; i += 8) {
			size_t k = n - i;
			__m256 v = fep256_load(x, dt, i, k);

			if (res) {
				v = _mm256_add_ps(v, fep256_load(res, dt, i, k));
				fep256_store(res, dt, i, v, k);
				if (dt == FEP_K_BF16) /* the rounded value */
					v = fep256_load(res, dt, i, k);
			}
			acc = _mm256_fmadd_ps(v, v, acc);
		}
		inv = 1.0f / sqrtf(fep256_hsum(acc) / (float)n + a->eps);
		vi = _mm256_set1_ps(inv);
		if (a->out_dt != FEP_K_FP8) {
			char *out = ROW(a->out, a->out_dt, a->ld_out, r);

			for (i = 0; i < n; i += 8) {
				size_t k = n - i;
				__m256 g = _mm256_add_ps(fep256_load(a->gamma, FEP_K_F32, i, k), wo);
				fep256_store(out, a->out_dt, i, _mm256_mul_ps(_mm256_mul_ps(
					fep256_load(h, dt, i, k), vi), g), k);
			}
		} else {
			uint8_t *out = (uint8_t *)a->out + r * a->ld_out;
			__m256i m = _mm256_setzero_si256();
			__m256 is;
			float s;

			for (i = 0; i < n; i += 8) {
				size_t k = n - i;
				__m256 g = _mm256_add_ps(fep256_load(a->gamma, FEP_K_F32, i, k), wo);
				m = _mm256_max_epu32(m, fep256_absbits(_mm256_mul_ps(
					_mm256_mul_ps(fep256_load(h, dt, i, k), vi), g)));
			}
			s = fep_fp8_scale(fep_u2f(fep256_hmax_u32(m)), a->scale_ub, a->pow2);
			a->scales[r * a->ld_scales] = s;
			is = _mm256_set1_ps(1.0f / s);
			for (i = 0; i < n; i += 8) {
				size_t k = n - i;
				__m256 g = _mm256_add_ps(fep256_load(a->gamma, FEP_K_F32, i, k), wo);
				__m128i q = fep256_e4m3(_mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(
					fep256_load(h, dt, i, k), vi), g), is));

				if (k >= 8) {
					_mm_storel_epi64((__m128i *)(out + i), q);
				} else {
					uint8_t t[16];
					_mm_storeu_si128((__m128i *)t, q);
					memcpy(out + i, t, k);
				}
			}
		}
	}
}

/* ---- AVX-512 ---- */

static FEP_INLINE FEP_T_AVX512 void norm512(const fep_k_rmsnorm_args_t *a,
					    size_t r0, size_t r1,
					    const fep_k_dtype_t dt,
					    const fep_k_dtype_t odt)
{
	size_t r, i, n = a->cols;
	__m512 wo = _mm512_set1_ps(a->weight_offset);
	const float *gamma = a->gamma;
	int nt = (r1 - r0) * n * fep_k_dtype_size(odt) >= FEP_K_NT_BYTES;

	for (r = r0; r < r1; r++) {
		const char *x = CROW(a->in, dt, a->ld_in, r);
		char *res = a->residual ? ROW(a->residual, dt, a->ld_res, r) : NULL;
		const char *h = res ? res : x;
		__m512 acc = _mm512_setzero_ps(), acc1 = acc, vi;
		float inv;

		i = 0;
		if (!res) /* two chains, full vectors */
			for (; i + 32 <= n; i += 32) {
				__m512 v0 = fep512_load(x, dt, i, 0xffff);
				__m512 v1 = fep512_load(x, dt, i + 16, 0xffff);

				acc = _mm512_fmadd_ps(v0, v0, acc);
				acc1 = _mm512_fmadd_ps(v1, v1, acc1);
			}
		for (; i < n; i += 16) {
			__mmask16 k = fep512_mask(n - i);
			__m512 v = fep512_load(x, dt, i, k);

			if (res) {
				v = _mm512_add_ps(v, fep512_load(res, dt, i, k));
				if (dt == FEP_K_BF16) {
					__m256i b = fep512_f32_to_bf16(v);
					_mm256_mask_storeu_epi16((uint16_t *)res + i, k, b);
					v = _mm512_castsi512_ps(_mm512_slli_epi32(
						_mm512_cvtepu16_epi32(b), 16));
				} else {
					_mm512_mask_storeu_ps((float *)res + i, k, v);
				}
			}
			acc = _mm512_fmadd_ps(v, v, acc);
		}
		inv = 1.0f / sqrtf(_mm512_reduce_add_ps(_mm512_add_ps(acc, acc1)) /
				   (float)n + a->eps);
		vi = _mm512_set1_ps(inv);
		if (odt != FEP_K_FP8) {
			char *out = ROW(a->out, odt, a->ld_out, r);
			int ntr = nt && ((uintptr_t)out & 63) == 0;

			for (i = 0; i + 32 <= n; i += 32) {
				__m512 g0 = _mm512_add_ps(_mm512_loadu_ps(gamma + i), wo);
				__m512 g1 = _mm512_add_ps(_mm512_loadu_ps(gamma + i + 16), wo);

				fep512_store32(out, odt, i,
					_mm512_mul_ps(_mm512_mul_ps(fep512_load(h, dt, i, 0xffff),
								    vi), g0),
					_mm512_mul_ps(_mm512_mul_ps(fep512_load(h, dt, i + 16, 0xffff),
								    vi), g1), ntr);
			}
			for (; i < n; i += 16) {
				__mmask16 k = fep512_mask(n - i);
				__m512 g = _mm512_add_ps(_mm512_maskz_loadu_ps(k, gamma + i), wo);
				fep512_store(out, odt, i, _mm512_mul_ps(_mm512_mul_ps(
					fep512_load(h, dt, i, k), vi), g), k);
			}
		} else {
			/* the normalized row, kept between the amax and the
			 * encoding pass (32 KiB of stack; longer rows recompute) */
			float ybuf[RMS_YBUF] __attribute__((aligned(64)));
			uint8_t *out = (uint8_t *)a->out + r * a->ld_out;
			int ntr = nt && ((uintptr_t)out & 63) == 0;
			__m512i m = _mm512_setzero_si512();
			__m512 is;
			float s;

			if (n <= RMS_YBUF) { /* keep y for the encoding pass */
				for (i = 0; i < n; i += 16) {
					__mmask16 k = fep512_mask(n - i);
					__m512 g = _mm512_add_ps(_mm512_maskz_loadu_ps(k, gamma + i), wo);
					__m512 y = _mm512_mul_ps(_mm512_mul_ps(
						fep512_load(h, dt, i, k), vi), g);

					_mm512_store_ps(ybuf + i, y);
					m = _mm512_max_epu32(m, fep512_absbits(y));
				}
				s = fep_fp8_scale(fep_u2f((uint32_t)_mm512_reduce_max_epu32(m)),
						  a->scale_ub, a->pow2);
				a->scales[r * a->ld_scales] = s;
				is = _mm512_set1_ps(1.0f / s);
#define YB(j) fep512_e4m3_codes(_mm512_mul_ps(_mm512_load_ps(ybuf + i + (j)), is))
				for (i = 0; i + 64 <= n; i += 64) {
					__m512i q = fep512_pack4(YB(0), YB(16), YB(32), YB(48));

					if (ntr)
						_mm512_stream_si512((void *)(out + i), q);
					else
						_mm512_storeu_si512(out + i, q);
				}
#undef YB
				for (; i < n; i += 16)
					_mm_mask_storeu_epi8(out + i, fep512_mask(n - i),
						fep512_e4m3(_mm512_mul_ps(_mm512_load_ps(ybuf + i), is)));
				continue;
			}
			for (i = 0; i < n; i += 16) {
				__mmask16 k = fep512_mask(n - i);
				__m512 g = _mm512_add_ps(_mm512_maskz_loadu_ps(k, a->gamma + i), wo);
				m = _mm512_max_epu32(m, fep512_absbits(_mm512_mul_ps(
					_mm512_mul_ps(fep512_load(h, dt, i, k), vi), g)));
			}
			s = fep_fp8_scale(fep_u2f((uint32_t)_mm512_reduce_max_epu32(m)),
					  a->scale_ub, a->pow2);
			a->scales[r * a->ld_scales] = s;
			is = _mm512_set1_ps(1.0f / s);
#define Y16(j) fep512_e4m3_codes(_mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(    \
		fep512_load(h, dt, i + (j), 0xffff), vi),                      \
		_mm512_add_ps(_mm512_loadu_ps(a->gamma + i + (j)), wo)), is))
			for (i = 0; i + 64 <= n; i += 64) {
				__m512i q = fep512_pack4(Y16(0), Y16(16), Y16(32), Y16(48));

				if (ntr)
					_mm512_stream_si512((void *)(out + i), q);
				else
					_mm512_storeu_si512(out + i, q);
			}
#undef Y16
			for (; i < n; i += 16) {
				__mmask16 k = fep512_mask(n - i);
				__m512 g = _mm512_add_ps(_mm512_maskz_loadu_ps(k, a->gamma + i), wo);
				_mm_mask_storeu_epi8(out + i, k, fep512_e4m3(_mm512_mul_ps(
					_mm512_mul_ps(_mm512_mul_ps(fep512_load(h, dt, i, k), vi), g),
					is)));
			}
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
	struct n_ctx c = { a, fep_k_ops() };
	int ret = fep_k_rmsnorm_check(a);

	if (ret)
		return ret;
	return fep_pool_for(pool, rows, 1, norm_range, &c);
}
