/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * reduce.c - the weighted top-k sum of the combine (rows read through an
 * index list) and the n-way sum of the allreduce (fixed order, bitwise
 * equal at every level).  Semantics in kernels.h.
 */
#include "config.h"

#include <errno.h>

#include "kernels/kernels.h"
#include "kernels/simd.h"

/* ---- scalar reference ---- */

void fep_k_topk_sum_scalar(const fep_k_topk_args_t *a, size_t t0, size_t t1)
{
	size_t ys = fep_k_dtype_size(a->y_dt), os = fep_k_dtype_size(a->out_dt);
	size_t t, i;
	int j;

	for (t = t0; t < t1; t++) {
		const int32_t *idx = a->idx + t * (size_t)a->k;
		const float *w = a->w ? a->w + t * (size_t)a->k : NULL;
		char *out = (char *)a->out + t * a->ld_out * os;

		for (i = 0; i < a->cols; i++) {
			float acc = 0.0f;

			for (j = 0; j < a->k; j++) {
				const char *y;
				float v;

				if (idx[j] < 0)
					continue;
				y = (const char *)a->y + (size_t)idx[j] * a->ld_y * ys;
				v = fep_ld1(y, a->y_dt, i);
				acc += w ? w[j] * v : v;
			}
			fep_st1(out, a->out_dt, i, acc);
		}
		if (a->cb)
			a->cb(a->cb_ctx, t, out);
	}
}

void fep_k_sum_scalar(const fep_k_sum_args_t *a, size_t i0, size_t i1)
{
	size_t i;
	int j;

	for (i = i0; i < i1; i++) {
		float acc = fep_ld1(a->in[0], a->dt, i);

		for (j = 1; j < a->n; j++)
			acc += fep_ld1(a->in[j], a->dt, i);
		fep_st1(a->out, a->dt, i, acc);
	}
}

/* The rows of the next token (up to 64), prefetched into L2 while this
 * token is summed: its rows lie anywhere in y, so the hardware
 * prefetchers cannot find them, and each would start with a miss. */
static size_t topk_next_rows(const fep_k_topk_args_t *a, size_t t, size_t t1,
			     size_t ys, const char **pf)
{
	const int32_t *idx = a->idx + (t + 1) * (size_t)a->k;
	size_t n = 0;
	int j;

	if (t + 1 >= t1)
		return 0;
	for (j = 0; j < FEP_MIN(a->k, 64); j++)
		if (idx[j] >= 0)
			pf[n++] = (const char *)a->y + (size_t)idx[j] * a->ld_y * ys;
	return n;
}

static inline void topk_prefetch(const char *const *pf, size_t npf, size_t off,
				 size_t bytes, int l1)
{
	size_t r, o;

	for (r = 0; r < npf; r++)
		for (o = 0; o < bytes; o += 64)
			FEP_PF_LINE(pf[r] + off + o, l1);
}

/* Whether the top-k sum streams its rows (a->nt): not where the
 * callback or a second pass over k > 64 reads them. */
static int topk_nt(const fep_k_topk_args_t *a)
{
	return a->nt > 0 && !a->cb && a->k <= 64;
}

/* ---- AVX2 ---- */

/* 8 values to p + i: streamed when nt (p + i 32-byte aligned for fp32,
 * 16 for bf16). */
static inline FEP_T_AVX2 void topk_st8(void *p, fep_k_dtype_t dt, size_t i,
				       __m256 v, int nt)
{
	if (!nt)
		fep256_store(p, dt, i, v, 8);
	else if (dt == FEP_K_F32)
		_mm256_stream_ps((float *)p + i, v);
	else
		_mm_stream_si128((__m128i *)((uint16_t *)p + i),
				 fep256_f32_to_bf16(v));
}

/* 16 sums, e: columns i, i + 2, .., i + 14; o: i + 1, .., i + 15, to
 * out in order: fp32 interleaved back by unpacks, bf16 as the low and
 * high halves of the words (fep256_bf16_eo_nn), through the scalar
 * rule where a sum is a NaN.  nt: streamed (out 32-byte aligned). */
static FEP_INLINE FEP_T_AVX2 void topk_st16_eo(char *out, const fep_k_dtype_t odt,
					      size_t i, __m256 e, __m256 o, int nt)
{
	if (odt == FEP_K_F32) {
		__m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
		__m256 v0 = _mm256_permute2f128_ps(lo, hi, 0x20);
		__m256 v1 = _mm256_permute2f128_ps(lo, hi, 0x31);
		float *p = (float *)out + i;

		if (nt) {
			_mm256_stream_ps(p, v0);
			_mm256_stream_ps(p + 8, v1);
		} else {
			_mm256_storeu_ps(p, v0);
			_mm256_storeu_ps(p + 8, v1);
		}
	} else if (_mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(e, e, _CMP_UNORD_Q),
						   _mm256_cmp_ps(o, o, _CMP_UNORD_Q)))) {
		float te[8], to[8];
		size_t j;

		_mm256_storeu_ps(te, e);
		_mm256_storeu_ps(to, o);
		for (j = 0; j < 8; j++) {
			fep_st1(out, FEP_K_BF16, i + 2 * j, te[j]);
			fep_st1(out, FEP_K_BF16, i + 2 * j + 1, to[j]);
		}
	} else {
		__m256i b = fep256_bf16_eo_nn(_mm256_castps_si256(e), _mm256_castps_si256(o));
		__m256i *p = (__m256i *)((uint16_t *)out + i);

		if (nt)
			_mm256_stream_si256(p, b);
		else
			_mm256_storeu_si256(p, b);
	}
}

/* One token's sum of nr bf16 rows (k <= 64, one chunk), 32 columns a
 * step: each vector of 16 values read as its 8 even values (the low
 * halves shifted up) and its 8 odd ones (the high halves masked), two
 * operations where widening the halves took four, and the sums put
 * back in order as they are stored.  Each column's sum is the same
 * chain of operations as the widening loop's (the same bits).
 * Returns the end of the whole steps. */
static FEP_INLINE FEP_T_AVX2 size_t topk_eo256(const fep_k_topk_args_t *a,
					       const char *const *rows, const float *wt,
					       int nr, char *out, const fep_k_dtype_t odt,
					       int nt, const char *const *pf, size_t npf)
{
	const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
	size_t i;
	int r, q;

	for (i = 0; i + 32 <= a->cols; i += 32) {
		__m256 e[2], o[2];

		topk_prefetch(pf, npf, i * 2, 64, 0);
		e[0] = e[1] = o[0] = o[1] = _mm256_setzero_ps();
		for (r = 0; r < nr; r++) {
			const __m256i *y = (const __m256i *)((const uint16_t *)rows[r] + i);

			#pragma GCC unroll 2
			for (q = 0; q < 2; q++) {
				__m256i x = _mm256_loadu_si256(y + q);
				__m256 ve = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
				__m256 vo = _mm256_castsi256_ps(_mm256_and_si256(x, hi));

				if (a->w) {
					__m256 wr = _mm256_set1_ps(wt[r]);

					e[q] = _mm256_fmadd_ps(wr, ve, e[q]);
					o[q] = _mm256_fmadd_ps(wr, vo, o[q]);
				} else {
					e[q] = _mm256_add_ps(e[q], ve);
					o[q] = _mm256_add_ps(o[q], vo);
				}
			}
		}
		topk_st16_eo(out, odt, i, e[0], o[0], nt);
		topk_st16_eo(out, odt, i + 16, e[1], o[1], nt);
	}
	return i;
}

/* The weighted sum of one chunk of rows (any dtype), 32 columns at a
 * time in four independent sums, adding to the chunks before it (j0 >
 * 0) through out.  Returns the end of the whole steps. */
static FEP_INLINE FEP_T_AVX2 size_t topk_wide256(const fep_k_topk_args_t *a,
						 const char *const *rows, const float *wt,
						 int nr, char *out, int j0, int nt,
						 const char *const *pf, size_t npf)
{
	size_t i, ys = fep_k_dtype_size(a->y_dt);

	for (i = 0; i + 32 <= a->cols; i += 32) {
		__m256 s0, s1, s2, s3;
		int r;

		if (j0) {
			s0 = fep256_load(out, a->out_dt, i, 8);
			s1 = fep256_load(out, a->out_dt, i + 8, 8);
			s2 = fep256_load(out, a->out_dt, i + 16, 8);
			s3 = fep256_load(out, a->out_dt, i + 24, 8);
		} else {
			topk_prefetch(pf, npf, i * ys, 32 * ys, 0);
			s0 = s1 = s2 = s3 = _mm256_setzero_ps();
		}
		for (r = 0; r < nr; r++) {
			__m256 v0 = fep256_load(rows[r], a->y_dt, i, 8);
			__m256 v1 = fep256_load(rows[r], a->y_dt, i + 8, 8);
			__m256 v2 = fep256_load(rows[r], a->y_dt, i + 16, 8);
			__m256 v3 = fep256_load(rows[r], a->y_dt, i + 24, 8);

			if (a->w) {
				__m256 wr = _mm256_set1_ps(wt[r]);

				s0 = _mm256_fmadd_ps(wr, v0, s0);
				s1 = _mm256_fmadd_ps(wr, v1, s1);
				s2 = _mm256_fmadd_ps(wr, v2, s2);
				s3 = _mm256_fmadd_ps(wr, v3, s3);
			} else {
				s0 = _mm256_add_ps(s0, v0);
				s1 = _mm256_add_ps(s1, v1);
				s2 = _mm256_add_ps(s2, v2);
				s3 = _mm256_add_ps(s3, v3);
			}
		}
		topk_st8(out, a->out_dt, i, s0, nt);
		topk_st8(out, a->out_dt, i + 8, s1, nt);
		topk_st8(out, a->out_dt, i + 16, s2, nt);
		topk_st8(out, a->out_dt, i + 24, s3, nt);
	}
	return i;
}

FEP_T_AVX2 void fep_k_topk_sum_avx2(const fep_k_topk_args_t *a, size_t t0, size_t t1)
{
	size_t ys = fep_k_dtype_size(a->y_dt), os = fep_k_dtype_size(a->out_dt);
	const char *rows[64], *pf[64];
	float wt[64];
	size_t t, i, npf;
	int j, nr, nt = topk_nt(a);
	int eo = a->y_dt == FEP_K_BF16 && a->k <= 64;

	for (t = t0; t < t1; t++) {
		const int32_t *idx = a->idx + t * (size_t)a->k;
		char *out = (char *)a->out + t * a->ld_out * os;
		int j0 = 0, snt = nt && !((uintptr_t)out & 31);

		npf = topk_next_rows(a, t, t1, ys, pf);

		/* gather the row pointers in order, k in chunks of 64 */
		do {
			int jn = FEP_MIN(a->k, j0 + 64);

			nr = 0;
			for (j = j0; j < jn; j++) {
				if (idx[j] < 0)
					continue;
				rows[nr] = (const char *)a->y + (size_t)idx[j] * a->ld_y * ys;
				wt[nr++] = a->w ? a->w[t * (size_t)a->k + j] : 1.0f;
			}
			/* bf16 rows in one chunk: in even/odd order */
			if (!eo)
				i = topk_wide256(a, rows, wt, nr, out, j0, snt, pf, npf);
			else if (a->out_dt == FEP_K_F32)
				i = topk_eo256(a, rows, wt, nr, out, FEP_K_F32, snt, pf, npf);
			else
				i = topk_eo256(a, rows, wt, nr, out, FEP_K_BF16, snt, pf, npf);
			for (; i < a->cols; i += 8) {
				size_t n = a->cols - i;
				__m256 acc = j0 ? fep256_load(out, a->out_dt, i, n)
						: _mm256_setzero_ps();
				int r;

				/* a partial sum stored as bf16 would round twice:
				 * k > 64 with bf16 out goes through fp32 below */
				for (r = 0; r < nr; r++) {
					__m256 v = fep256_load(rows[r], a->y_dt, i, n);
					acc = a->w ? _mm256_fmadd_ps(_mm256_set1_ps(wt[r]), v, acc)
						   : _mm256_add_ps(acc, v);
				}
				fep256_store(out, a->out_dt, i, acc, n);
			}
			j0 = jn;
		} while (j0 < a->k);
		if (a->cb)
			a->cb(a->cb_ctx, t, out);
	}
	if (nt)
		_mm_sfence();
}

/* Values [i0, i1) of the sum, 8 at a time, partial vectors included. */
static FEP_T_AVX2 void sum256_part(const fep_k_sum_args_t *a, size_t i0, size_t i1)
{
	size_t i;
	int j;

	for (i = i0; i < i1; i += 8) {
		size_t n = i1 - i;
		__m256 acc = fep256_load(a->in[0], a->dt, i, n);

		for (j = 1; j < a->n; j++)
			acc = _mm256_add_ps(acc, fep256_load(a->in[j], a->dt, i, n));
		fep256_store(a->out, a->dt, i, acc, n);
	}
}

FEP_T_AVX2 void fep_k_sum_avx2(const fep_k_sum_args_t *a, size_t i0, size_t i1)
{
	size_t es = fep_k_dtype_size(a->dt), i = i0;
	int nt = fep_k_stream(a->nt, 1, (i1 - i0) * es), j;

	if (nt) { /* align the output to 32 bytes for streaming stores */
		uintptr_t mis = (uintptr_t)((char *)a->out + i * es) & 31;

		if (mis % es) {
			nt = 0;
		} else if (mis) {
			size_t end = i + FEP_MIN((32 - mis) / es, i1 - i);

			sum256_part(a, i, end);
			i = end;
		}
	}
	if (a->dt == FEP_K_F32) {
		for (; i + 8 <= i1; i += 8) {
			__m256 acc = _mm256_loadu_ps((const float *)a->in[0] + i);

			for (j = 1; j < a->n; j++)
				acc = _mm256_add_ps(acc, _mm256_loadu_ps((const float *)a->in[j] + i));
			if (nt)
				_mm256_stream_ps((float *)a->out + i, acc);
			else
				_mm256_storeu_ps((float *)a->out + i, acc);
		}
	} else {
		for (; i + 16 <= i1; i += 16) {
			__m256 acc0 = fep256_load(a->in[0], a->dt, i, 8);
			__m256 acc1 = fep256_load(a->in[0], a->dt, i + 8, 8);
			__m256i r;

			for (j = 1; j < a->n; j++) {
				acc0 = _mm256_add_ps(acc0, fep256_load(a->in[j], a->dt, i, 8));
				acc1 = _mm256_add_ps(acc1, fep256_load(a->in[j], a->dt, i + 8, 8));
			}
			/* the full NaN rule only where a NaN is */
			if (_mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(acc0, acc0, _CMP_UNORD_Q),
							    _mm256_cmp_ps(acc1, acc1, _CMP_UNORD_Q))))
				r = _mm256_set_m128i(fep256_f32_to_bf16(acc1),
						     fep256_f32_to_bf16(acc0));
			else
				r = _mm256_permute4x64_epi64(_mm256_packus_epi32(
					fep256_bf16_rne_nn(acc0), fep256_bf16_rne_nn(acc1)), 0xd8);
			if (nt)
				_mm256_stream_si256((__m256i *)((uint16_t *)a->out + i), r);
			else
				_mm256_storeu_si256((__m256i *)((uint16_t *)a->out + i), r);
		}
	}
	sum256_part(a, i, i1);
	if (nt)
		_mm_sfence();
}

/* ---- AVX-512 ---- */

static FEP_INLINE FEP_T_AVX512 void topk512(const fep_k_topk_args_t *a,
					    size_t t0, size_t t1,
					    const fep_k_dtype_t ydt,
					    const fep_k_dtype_t odt)
{
	size_t ys = fep_k_dtype_size(ydt), os = fep_k_dtype_size(odt);
	const char *rows[64], *pf[64];
	float wt[64];
	size_t t, i, npf;
	int j, nr, nt = topk_nt(a);

	for (t = t0; t < t1; t++) {
		const int32_t *idx = a->idx + t * (size_t)a->k;
		char *out = (char *)a->out + t * a->ld_out * os;
		int j0 = 0;
		int snt = nt && !((uintptr_t)out & (odt == FEP_K_F32 ? 63 : 31));

		npf = topk_next_rows(a, t, t1, ys, pf);

		do {
			int jn = FEP_MIN(a->k, j0 + 64);

			nr = 0;
			for (j = j0; j < jn; j++) {
				if (idx[j] < 0)
					continue;
				rows[nr] = (const char *)a->y + (size_t)idx[j] * a->ld_y * ys;
				wt[nr++] = a->w ? a->w[t * (size_t)a->k + j] : 1.0f;
			}
			/* 64 columns at a time in four independent sums, so
			 * the adds of one row do not wait on each other */
			for (i = 0; i + 64 <= a->cols; i += 64) {
				__m512 s0, s1, s2, s3;
				int r;

				if (!j0)
					topk_prefetch(pf, npf, i * ys, 64 * ys,
						      fep_k_pf_l1);
				if (j0) {
					s0 = fep512_load(out, odt, i, 0xffff);
					s1 = fep512_load(out, odt, i + 16, 0xffff);
					s2 = fep512_load(out, odt, i + 32, 0xffff);
					s3 = fep512_load(out, odt, i + 48, 0xffff);
				} else {
					s0 = s1 = s2 = s3 = _mm512_setzero_ps();
				}
				for (r = 0; r < nr; r++) {
					__m512 v0 = fep512_load(rows[r], ydt, i, 0xffff);
					__m512 v1 = fep512_load(rows[r], ydt, i + 16, 0xffff);
					__m512 v2 = fep512_load(rows[r], ydt, i + 32, 0xffff);
					__m512 v3 = fep512_load(rows[r], ydt, i + 48, 0xffff);

					if (a->w) {
						__m512 wr = _mm512_set1_ps(wt[r]);

						s0 = _mm512_fmadd_ps(wr, v0, s0);
						s1 = _mm512_fmadd_ps(wr, v1, s1);
						s2 = _mm512_fmadd_ps(wr, v2, s2);
						s3 = _mm512_fmadd_ps(wr, v3, s3);
					} else {
						s0 = _mm512_add_ps(s0, v0);
						s1 = _mm512_add_ps(s1, v1);
						s2 = _mm512_add_ps(s2, v2);
						s3 = _mm512_add_ps(s3, v3);
					}
				}
				fep512_store_nt(out, odt, i, s0, 0xffff, snt);
				fep512_store_nt(out, odt, i + 16, s1, 0xffff, snt);
				fep512_store_nt(out, odt, i + 32, s2, 0xffff, snt);
				fep512_store_nt(out, odt, i + 48, s3, 0xffff, snt);
			}
			for (; i < a->cols; i += 16) {
				__mmask16 m = fep512_mask(a->cols - i);
				__m512 acc = j0 ? fep512_load(out, odt, i, m)
						: _mm512_setzero_ps();
				int r;

				for (r = 0; r < nr; r++) {
					__m512 v = fep512_load(rows[r], ydt, i, m);
					acc = a->w ? _mm512_fmadd_ps(_mm512_set1_ps(wt[r]), v, acc)
						   : _mm512_add_ps(acc, v);
				}
				fep512_store(out, odt, i, acc, m);
			}
			j0 = jn;
		} while (j0 < a->k);
		if (a->cb)
			a->cb(a->cb_ctx, t, out);
	}
	if (nt)
		_mm_sfence();
}

FEP_T_AVX512 void fep_k_topk_sum_avx512(const fep_k_topk_args_t *a, size_t t0, size_t t1)
{
	if (a->y_dt == FEP_K_BF16) {
		if (a->out_dt == FEP_K_BF16)
			topk512(a, t0, t1, FEP_K_BF16, FEP_K_BF16);
		else
			topk512(a, t0, t1, FEP_K_BF16, FEP_K_F32);
	} else {
		if (a->out_dt == FEP_K_BF16)
			topk512(a, t0, t1, FEP_K_F32, FEP_K_BF16);
		else
			topk512(a, t0, t1, FEP_K_F32, FEP_K_F32);
	}
}

FEP_T_AVX512 void fep_k_sum_avx512(const fep_k_sum_args_t *a, size_t i0, size_t i1)
{
	size_t es = fep_k_dtype_size(a->dt);
	int nt = fep_k_stream(a->nt, 1, (i1 - i0) * es);
	size_t i = i0;
	int j;

	if (nt) { /* align the output to 64 bytes for streaming stores */
		uintptr_t mis = (uintptr_t)((char *)a->out + i * es) & 63;

		if (mis % es) {
			nt = 0;
		} else if (mis) {
			size_t end = i + FEP_MIN((64 - mis) / es, i1 - i);

			for (; i < end; i += 16) {
				__mmask16 m = fep512_mask(end - i);
				__m512 acc = fep512_load(a->in[0], a->dt, i, m);

				for (j = 1; j < a->n; j++)
					acc = _mm512_add_ps(acc, fep512_load(a->in[j], a->dt, i, m));
				fep512_store(a->out, a->dt, i, acc, m);
			}
			i = end;
		}
	}
	if (a->dt == FEP_K_F32) {
		for (; i + 16 <= i1; i += 16) {
			__m512 acc = _mm512_loadu_ps((const float *)a->in[0] + i);

			for (j = 1; j < a->n; j++)
				acc = _mm512_add_ps(acc, _mm512_loadu_ps((const float *)a->in[j] + i));
			if (nt)
				_mm512_stream_ps((float *)a->out + i, acc);
			else
				_mm512_storeu_ps((float *)a->out + i, acc);
		}
	} else {
		for (; i + 32 <= i1; i += 32) {
			__m512 acc0 = fep512_load(a->in[0], a->dt, i, 0xffff);
			__m512 acc1 = fep512_load(a->in[0], a->dt, i + 16, 0xffff);
			__m512i r;

			for (j = 1; j < a->n; j++) {
				acc0 = _mm512_add_ps(acc0, fep512_load(a->in[j], a->dt, i, 0xffff));
				acc1 = _mm512_add_ps(acc1, fep512_load(a->in[j], a->dt, i + 16, 0xffff));
			}
			r = fep512_f32x2_to_bf16(acc0, acc1);
			if (nt)
				_mm512_stream_si512((void *)((uint16_t *)a->out + i), r);
			else
				_mm512_storeu_si512((uint16_t *)a->out + i, r);
		}
	}
	for (; i < i1; i += 16) {
		__mmask16 m = fep512_mask(i1 - i);
		__m512 acc = fep512_load(a->in[0], a->dt, i, m);

		for (j = 1; j < a->n; j++)
			acc = _mm512_add_ps(acc, fep512_load(a->in[j], a->dt, i, m));
		fep512_store(a->out, a->dt, i, acc, m);
	}
	if (nt)
		_mm_sfence();
}

/* ---- checks and threaded wrappers ---- */

int fep_k_topk_check(const fep_k_topk_args_t *a)
{
	if (!a || !a->y || !a->idx || !a->out) {
		fep_err("topk_sum: NULL argument");
		return -EINVAL;
	}
	if ((a->y_dt != FEP_K_F32 && a->y_dt != FEP_K_BF16) ||
	    (a->out_dt != FEP_K_F32 && a->out_dt != FEP_K_BF16)) {
		fep_err("topk_sum: dtypes must be fp32 or bf16 (y %d, out %d)",
			(int)a->y_dt, (int)a->out_dt);
		return -EINVAL;
	}
	if (a->k < 1 || a->ld_y < a->cols || a->ld_out < a->cols) {
		fep_err("topk_sum: k %d < 1 or leading dimension below cols %zu",
			a->k, a->cols);
		return -EINVAL;
	}
	if (a->k > 64 && a->out_dt != FEP_K_F32) {
		fep_err("topk_sum: k %d > 64 needs fp32 output", a->k);
		return -EINVAL;
	}
	return 0;
}

int fep_k_sum_check(const fep_k_sum_args_t *a)
{
	int j;

	if (!a || !a->in || !a->out || a->n < 1) {
		fep_err("sum: NULL argument or n < 1");
		return -EINVAL;
	}
	if (a->dt != FEP_K_F32 && a->dt != FEP_K_BF16) {
		fep_err("sum: dtype %d is not fp32 or bf16", (int)a->dt);
		return -EINVAL;
	}
	for (j = 0; j < a->n; j++) {
		if (!a->in[j]) {
			fep_err("sum: input %d is NULL", j);
			return -EINVAL;
		}
	}
	return 0;
}

struct r_ctx {
	const void *a;
	const struct fep_k_ops *ops;
};

static void topk_range(void *arg, size_t r0, size_t r1)
{
	struct r_ctx *c = arg;
	c->ops->topk_sum(c->a, r0, r1);
}

static void sum_range(void *arg, size_t r0, size_t r1)
{
	struct r_ctx *c = arg;
	c->ops->sum(c->a, r0, r1);
}

int fep_k_topk_sum_mt(fep_pool_t *pool, const fep_k_topk_args_t *a, size_t tokens)
{
	struct r_ctx c = { a, fep_k_ops() };
	int ret = fep_k_topk_check(a);

	if (ret)
		return ret;
	return fep_pool_for(pool, tokens, 1, topk_range, &c);
}

int fep_k_sum_mt(fep_pool_t *pool, const fep_k_sum_args_t *a, size_t n)
{
	fep_k_sum_args_t b;
	struct r_ctx c = { &b, fep_k_ops() };
	int ret = fep_k_sum_check(a);

	if (ret)
		return ret;
	/* streaming stores by what the whole call writes */
	b = *a;
	if (!b.nt)
		b.nt = fep_k_stream(0, 1, n * fep_k_dtype_size(b.dt)) ? 1 : -1;
	return fep_pool_for(pool, n, 1024, sum_range, &c);
}
