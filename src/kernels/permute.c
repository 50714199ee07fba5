/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * permute.c - row gather and scatter by index list (the permutes of
 * dispatch and combine).  Large calls stream their output with
 * non-temporal stores.
 */
#include "config.h"

#include <errno.h>

#include "kernels/kernels.h"
#include "kernels/simd.h"

#define PERM_NT_MIN_ROW 256
/* entries a gather looks ahead for the next other row to prefetch */
#define PERM_PF_LOOK 64

static inline int perm_nt(const fep_k_perm_args_t *a, size_t r0, size_t r1)
{
	return a->row_bytes >= PERM_NT_MIN_ROW &&
	       fep_k_stream(a->nt, 1, (r1 - r0) * a->row_bytes);
}

/* ---- scalar reference ---- */

/* the destination row of gather entry r */
static inline size_t perm_dst(const fep_k_perm_args_t *a, size_t r)
{
	return a->didx ? (size_t)a->didx[r] : r;
}

void fep_k_gather_scalar(const fep_k_perm_args_t *a, size_t r0, size_t r1)
{
	size_t r;

	for (r = r0; r < r1; r++)
		if (a->idx[r] >= 0)
			memcpy((char *)a->dst + perm_dst(a, r) * a->dst_stride,
			       (const char *)a->src + (size_t)a->idx[r] * a->src_stride,
			       a->row_bytes);
}

void fep_k_scatter_scalar(const fep_k_perm_args_t *a, size_t r0, size_t r1)
{
	size_t r;

	for (r = r0; r < r1; r++)
		if (a->idx[r] >= 0)
			memcpy((char *)a->dst + (size_t)a->idx[r] * a->dst_stride,
			       (const char *)a->src + r * a->src_stride, a->row_bytes);
}

/* ---- the vector levels' row loops, over their streaming copy ---- */

/* n bytes from s to d past the caches; pf: a cursor for a prefetch,
 * advanced as the bytes go */
typedef void (*copy_nt_fn)(char *d, const char *s, size_t n, fep_pf_t *pf);

/* gather: row r (or didx[r]) from row idx[r] of src, prefetching the
 * next other row read (anywhere in src: a jump the prefetchers cannot
 * follow) while this one is copied; scatter: row r to row idx[r] of
 * dst, read in order */
static void permute_rows(const fep_k_perm_args_t *a, size_t r0, size_t r1,
			 int gather, copy_nt_fn copy)
{
	size_t r;

	if (!perm_nt(a, r0, r1)) {
		(gather ? fep_k_gather_scalar : fep_k_scatter_scalar)(a, r0, r1);
		return;
	}
	for (r = r0; r < r1; r++) {
		const char *src = (const char *)a->src;
		char *dst = (char *)a->dst;
		fep_pf_t pf = { NULL, 0, 0, 0 };
		size_t q = r + 1;

		if (a->idx[r] < 0)
			continue;
		if (gather) {
			/* a bounded look: an index list of one row repeated
			 * must not make the loop quadratic */
			while (q < r1 && q < r + PERM_PF_LOOK &&
			       (a->idx[q] < 0 || a->idx[q] == a->idx[r]))
				q++;
			if (q == r + PERM_PF_LOOK)
				q = r1;
			fep_pf_init(&pf, q < r1 ? src + (size_t)a->idx[q] * a->src_stride :
					 NULL, a->row_bytes);
			copy(dst + perm_dst(a, r) * a->dst_stride,
			     src + (size_t)a->idx[r] * a->src_stride,
			     a->row_bytes, &pf);
		} else {
			copy(dst + (size_t)a->idx[r] * a->dst_stride, src + r * a->src_stride,
			     a->row_bytes, &pf);
		}
	}
	_mm_sfence();
}

/* The next row's prefetch as n more bytes are copied (n a constant
 * multiple of 64): into L2 (fep_pf_step), or, where l1 (a constant),
 * into L1 with the n / 64 lines behind one test, which may prefetch a
 * few lines past the row's end (harmless).  A test per line took T0's
 * gain away on Zen 5 (docs/performance.md). */
static FEP_INLINE void perm_pf(fep_pf_t *pf, size_t n, const int l1)
{
	size_t k;

	if (!l1) {
		fep_pf_step(pf, n);
		return;
	}
	if (pf->done < pf->len) {
		for (k = 0; k < n; k += 64)
			FEP_PF_LINE(pf->p + pf->done + k, l1);
		pf->done += n;
	}
}

/* ---- AVX2 ---- */

/* copy_nt_fn, its prefetch into L1 where l1 (a constant) */
static FEP_INLINE FEP_T_AVX2 void copy_nt256(char *d, const char *s, size_t n,
					    fep_pf_t *pf, const int l1)
{
	size_t head = (32 - ((uintptr_t)d & 31)) & 31, i;

	head = FEP_MIN(head, n);
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	for (i = 0; i + 128 <= n; i += 128) {
		__m256i x0 = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i x1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
		__m256i x2 = _mm256_loadu_si256((const __m256i *)(s + i + 64));
		__m256i x3 = _mm256_loadu_si256((const __m256i *)(s + i + 96));
		_mm256_stream_si256((__m256i *)(d + i), x0);
		_mm256_stream_si256((__m256i *)(d + i + 32), x1);
		_mm256_stream_si256((__m256i *)(d + i + 64), x2);
		_mm256_stream_si256((__m256i *)(d + i + 96), x3);
		perm_pf(pf, 128, l1);
	}
	for (; i + 32 <= n; i += 32)
		_mm256_stream_si256((__m256i *)(d + i),
				    _mm256_loadu_si256((const __m256i *)(s + i)));
	memcpy(d + i, s + i, n - i);
}

static FEP_T_AVX2 void copy_nt_avx2(char *d, const char *s, size_t n, fep_pf_t *pf)
{
	copy_nt256(d, s, n, pf, 0);
}

static FEP_T_AVX2 void copy_nt_avx2_l1(char *d, const char *s, size_t n, fep_pf_t *pf)
{
	copy_nt256(d, s, n, pf, 1);
}

FEP_T_AVX2 void fep_k_gather_avx2(const fep_k_perm_args_t *a, size_t r0, size_t r1)
{
	permute_rows(a, r0, r1, 1, fep_k_pf_l1 ? copy_nt_avx2_l1 : copy_nt_avx2);
}

FEP_T_AVX2 void fep_k_scatter_avx2(const fep_k_perm_args_t *a, size_t r0, size_t r1)
{
	permute_rows(a, r0, r1, 0, copy_nt_avx2);
}

/* ---- AVX-512 ---- */

/* copy_nt_fn, its prefetch into L1 where l1 (a constant) */
static FEP_INLINE FEP_T_AVX512 void copy_nt512(char *d, const char *s, size_t n,
					      fep_pf_t *pf, const int l1)
{
	size_t head = (64 - ((uintptr_t)d & 63)) & 63, i;

	head = FEP_MIN(head, n);
	if (head) {
		__mmask64 m = (__mmask64)(((unsigned __int128)1 << head) - 1);
		_mm512_mask_storeu_epi8(d, m, _mm512_maskz_loadu_epi8(m, s));
	}
	d += head;
	s += head;
	n -= head;
	for (i = 0; i + 256 <= n; i += 256) {
		__m512i x0 = _mm512_loadu_si512(s + i);
		__m512i x1 = _mm512_loadu_si512(s + i + 64);
		__m512i x2 = _mm512_loadu_si512(s + i + 128);
		__m512i x3 = _mm512_loadu_si512(s + i + 192);
		_mm512_stream_si512((void *)(d + i), x0);
		_mm512_stream_si512((void *)(d + i + 64), x1);
		_mm512_stream_si512((void *)(d + i + 128), x2);
		_mm512_stream_si512((void *)(d + i + 192), x3);
		perm_pf(pf, 256, l1);
	}
	for (; i + 64 <= n; i += 64)
		_mm512_stream_si512((void *)(d + i), _mm512_loadu_si512(s + i));
	if (i < n) {
		__mmask64 m = (__mmask64)(((unsigned __int128)1 << (n - i)) - 1);
		_mm512_mask_storeu_epi8(d + i, m, _mm512_maskz_loadu_epi8(m, s + i));
	}
}

static FEP_T_AVX512 void copy_nt_avx512(char *d, const char *s, size_t n, fep_pf_t *pf)
{
	copy_nt512(d, s, n, pf, 0);
}

static FEP_T_AVX512 void copy_nt_avx512_l1(char *d, const char *s, size_t n, fep_pf_t *pf)
{
	copy_nt512(d, s, n, pf, 1);
}

FEP_T_AVX512 void fep_k_gather_avx512(const fep_k_perm_args_t *a, size_t r0, size_t r1)
{
	permute_rows(a, r0, r1, 1, fep_k_pf_l1 ? copy_nt_avx512_l1 : copy_nt_avx512);
}

FEP_T_AVX512 void fep_k_scatter_avx512(const fep_k_perm_args_t *a, size_t r0, size_t r1)
{
	permute_rows(a, r0, r1, 0, copy_nt_avx512);
}

/* ---- checks and threaded wrappers ---- */

int fep_k_perm_check(const fep_k_perm_args_t *a)
{
	if (!a || !a->src || !a->dst || !a->idx) {
		fep_err("permute: NULL argument");
		return -EINVAL;
	}
	if (a->src_stride < a->row_bytes || a->dst_stride < a->row_bytes) {
		fep_err("permute: stride (src %zu, dst %zu) below the row size %zu",
			a->src_stride, a->dst_stride, a->row_bytes);
		return -EINVAL;
	}
	return 0;
}

struct p_ctx {
	const fep_k_perm_args_t *a;
	const struct fep_k_ops *ops;
	int scatter;
};

static void perm_range(void *arg, size_t r0, size_t r1)
{
	struct p_ctx *c = arg;

	if (c->scatter)
		c->ops->scatter(c->a, r0, r1);
	else
		c->ops->gather(c->a, r0, r1);
}

/* Whether the whole call streams (one decision for all threads' shares). */
static fep_k_perm_args_t perm_whole(const fep_k_perm_args_t *a, size_t rows)
{
	fep_k_perm_args_t b = *a;

	if (!b.nt)
		b.nt = fep_k_stream(0, 1, rows * b.row_bytes) ? 1 : -1;
	return b;
}

int fep_k_gather_mt(fep_pool_t *pool, const fep_k_perm_args_t *a, size_t rows)
{
	fep_k_perm_args_t b;
	struct p_ctx c = { &b, fep_k_ops(), 0 };
	int ret = fep_k_perm_check(a);

	if (ret)
		return ret;
	b = perm_whole(a, rows);
	return fep_pool_for(pool, rows, 1, perm_range, &c);
}

/* Scatter rows to distinct destinations (indices must not repeat, else
 * which copy lands is unspecified). */
int fep_k_scatter_mt(fep_pool_t *pool, const fep_k_perm_args_t *a, size_t rows)
{
	fep_k_perm_args_t b;
	struct p_ctx c = { &b, fep_k_ops(), 1 };
	int ret = fep_k_perm_check(a);

	if (ret)
		return ret;
	b = perm_whole(a, rows);
	return fep_pool_for(pool, rows, 1, perm_range, &c);
}

struct pb_ctx {
	const fep_k_perm_args_t *a;
	const struct fep_k_ops *ops;
	const uint32_t *start, *pre;
	size_t nb;
};

/* Rows [o0, o1) of the blocks taken end to end. */
static void blocks_range(void *arg, size_t o0, size_t o1)
{
	const struct pb_ctx *c = arg;
	size_t lo = 0, hi = c->nb;

	while (hi - lo > 1) {  /* the last block with pre <= o0 */
		size_t mid = (lo + hi) / 2;

		if (c->pre[mid] <= o0)
			lo = mid;
		else
			hi = mid;
	}
	for (; o0 < o1 && lo < c->nb; lo++) {
		size_t e = FEP_MIN(o1, (size_t)c->pre[lo + 1]);

		if (e > o0)
			c->ops->gather(c->a, c->start[lo] + (o0 - c->pre[lo]),
				       c->start[lo] + (e - c->pre[lo]));
		o0 = FEP_MAX(o0, e);
	}
}

int fep_k_gather_blocks_mt(fep_pool_t *pool, const fep_k_perm_args_t *a,
			   const uint32_t *start, const uint32_t *pre, size_t nb,
			   void (*idle)(void *), void *ictx)
{
	fep_k_perm_args_t b;
	struct pb_ctx c = { &b, fep_k_ops(), start, pre, nb };
	size_t rows = nb ? pre[nb] : 0, grain;
	int ret = fep_k_perm_check(a);

	if (ret)
		return ret;
	if (!rows)
		return 0;
	b = perm_whole(a, rows);
	grain = fep_pool_grain(rows, a->row_bytes);
	return idle ? fep_pool_for_idle(pool, rows, grain, blocks_range, &c, idle, ictx)
		    : fep_pool_for(pool, rows, grain, blocks_range, &c);
}
