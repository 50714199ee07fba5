/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fabep_mpi_bench - the MPI baseline fabep_bench compares with: what a
 * user without fabep runs for the same work, with the same shapes and the
 * same routing.
 *
 *   dispatch   an MPI_Alltoallv token dispatcher: each token once per
 *              destination rank (however many of its top-k experts live
 *              there) as a record of metadata (token index, local expert
 *              ids, router weights) and the bf16 row; counts exchanged
 *              with MPI_Alltoall first; the receiver builds the
 *              expert-major rows and the per-expert offsets, as
 *              fabep_moe_dispatch returns them.
 *   combine    the way back: each expert rank sums, per source token, the
 *              weighted rows of the token's experts on it (fp32), sends
 *              one bf16 row per token with MPI_Alltoallv, and the source
 *              sums its partial rows into the output (fp32, then bf16).
 *              The expert is the identity, as in fabep_bench.
 *   allreduce  MPI_Allreduce (MPI_SUM) of [rows, cols] fp32.
 *   arnorm     MPI_Allreduce of [rows, cols] fp32, then RMSNorm
 *              (eps 1e-6, gamma) and FP8 e4m3 quantization with a scale
 *              per row, every rank on every row.
 *
 * The tokens and the routing come from the generator and seeds of
 * fabep_bench's dispatch (utils/bench_moe.c), so both route alike.  An
 * iteration takes its slowest rank's time; the median is printed, one
 * "key: value" line per row (-m) or a table.  Only MPI and libc: it
 * builds with `mpicc -O2 fabep_mpi_bench.c -o fabep_mpi_bench -lm`.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "(built outside fabep's tree)"
#endif
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <getopt.h>

static uint64_t rnd(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static uint16_t f2bf(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static float bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* e4m3fn, round to nearest even, saturated to +-448 (finite inputs). */
static uint8_t f2e4m3(float v)
{
	uint32_t u, s;
	float a;

	memcpy(&u, &v, 4);
	s = (u >> 24) & 0x80;
	a = fabsf(v);
	if (a >= 448.0f)
		return (uint8_t)(s | 0x7e);
	if (a < 0.015625f) {  /* subnormal: steps of 2^-9, to nearest even */
		float m = (a * 512.0f + 8388608.0f) - 8388608.0f;

		return (uint8_t)(s | (uint32_t)m);
	}
	memcpy(&u, &a, 4);
	u += 0x7ffffu + ((u >> 20) & 1);
	{
		uint32_t e = (u >> 23) - 127 + 7, m = (u >> 20) & 7;

		if (e > 15 || (e == 15 && m == 7))
			return (uint8_t)(s | 0x7e);
		return (uint8_t)(s | (e << 3) | m);
	}
}

struct opts {
	const char *op;
	int tokens, hidden, topk, experts, iters, warmup, machine;
	size_t rows[8];
	int nrows;
	int cols;
};

static int rank, size;

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The slowest rank's time of each iteration; the median (rank 0). */
static double median_max(double *t, int n)
{
	double *all = malloc((size_t)n * sizeof(*all)), m;

	MPI_Reduce(t, all, n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	if (rank) {
		free(all);
		return 0;
	}
	qsort(all, (size_t)n, sizeof(*all), cmp_d);
	m = n % 2 ? all[n / 2] : (all[n / 2 - 1] + all[n / 2]) / 2;
	free(all);
	return m;
}

/* ---- dispatch and combine ---- */

struct moe {
	int n, H, k, E, L;
	size_t meta, rec;          /* record: metadata then the row */
	int32_t *ids;
	float *w;
	uint16_t *x;
	/* dispatch */
	int *scnt, *sdsp, *rcnt, *rdsp;   /* bytes */
	int *tok_of;               /* send order: token per record */
	char *sbuf, *rbuf;
	int nrecv;                 /* records received */
	int *row_off;              /* [L + 1] */
	uint16_t *rows;            /* expert-major rows [total, H] */
	int32_t *src_row;          /* per row: the record it came from */
	float *src_w;              /* per row: its weight */
	int *rec_rows, *rec_nrows; /* per record: first of its rows (list) */
	int *rowlist;
	/* combine */
	uint16_t *cs, *cr;         /* partial rows by record, sent / received */
	int *ccnt, *cdsp, *crcnt, *crdsp;
	uint16_t *out;
	float *acc;
};

static int moe_setup(struct moe *m, const struct opts *o)
{
	uint64_t seed = 0x5eedull + (uint64_t)rank * 0x9e3779b97f4a7c15ull;
	char *seen;
	int t, j, h, d;

	m->n = o->tokens;
	m->H = o->hidden;
	m->k = o->topk;
	m->E = o->experts;
	m->L = m->E / size;
	m->meta = (8 + 8 * (size_t)m->k + 15) / 16 * 16;
	m->rec = m->meta + 2 * (size_t)m->H;
	m->ids = malloc((size_t)m->n * m->k * sizeof(*m->ids));
	m->w = malloc((size_t)m->n * m->k * sizeof(*m->w));
	m->x = malloc((size_t)m->n * m->H * 2);
	seen = calloc((size_t)size, 1);
	m->scnt = calloc((size_t)size, sizeof(int));
	m->sdsp = calloc((size_t)size + 1, sizeof(int));
	m->rcnt = calloc((size_t)size, sizeof(int));
	m->rdsp = calloc((size_t)size + 1, sizeof(int));
	m->ccnt = calloc((size_t)size, sizeof(int));
	m->cdsp = calloc((size_t)size + 1, sizeof(int));
	m->crcnt = calloc((size_t)size, sizeof(int));
	m->crdsp = calloc((size_t)size + 1, sizeof(int));
	m->tok_of = malloc(((size_t)m->n * m->k + 1) * sizeof(int));
	m->row_off = calloc((size_t)m->L + 1, sizeof(int));
	m->out = malloc((size_t)m->n * m->H * 2 + 2);
	m->acc = malloc((size_t)m->H * sizeof(float));
	if (!m->ids || !m->w || !m->x || !seen || !m->scnt || !m->sdsp ||
	    !m->rcnt || !m->rdsp || !m->ccnt || !m->cdsp || !m->crcnt ||
	    !m->crdsp || !m->tok_of || !m->row_off || !m->out || !m->acc)
		return -1;
	/* as fabep_bench's dispatch makes them: distinct experts per token,
	 * a weight after each, then the row */
	for (t = 0; t < m->n; t++) {
		for (j = 0; j < m->k; j++) {
			int32_t ex;
			int q;

			do {
				ex = (int32_t)(rnd(&seed) % (uint64_t)m->E);
				for (q = 0; q < j && m->ids[t * m->k + q] != ex; q++)
					;
			} while (q < j);
			m->ids[t * m->k + j] = ex;
			m->w[t * m->k + j] = (float)(rnd(&seed) % 1000) / 1000.0f + 0.01f;
		}
		for (h = 0; h < m->H; h++) {
			float v = (float)((int)(rnd(&seed) % 2001) - 1000) / 500.0f;

			m->x[(size_t)t * m->H + h] = f2bf(v);
		}
	}
	/* the largest send: every token to every rank */
	m->sbuf = malloc((size_t)m->n * size * m->rec + 1);
	m->cs = NULL;
	m->cr = malloc((size_t)m->n * size * m->H * 2 + 2);
	free(seen);
	(void)d;
	return m->sbuf && m->cr ? 0 : -1;
}

/* One dispatch: count, exchange counts, pack, MPI_Alltoallv, build the
 * expert-major rows. */
static int moe_dispatch(struct moe *m)
{
	int t, j, d, nrec = 0, total = 0, e, r;
	int *fill = calloc((size_t)size, sizeof(int));
	size_t rcvbytes;

	memset(m->scnt, 0, (size_t)size * sizeof(int));
	for (t = 0; t < m->n; t++) {
		uint64_t mask[4] = { 0 };  /* up to 256 ranks */

		for (j = 0; j < m->k; j++) {
			d = m->ids[t * m->k + j] / m->L;
			if (!(mask[d >> 6] & (1ull << (d & 63)))) {
				mask[d >> 6] |= 1ull << (d & 63);
				m->scnt[d] += (int)m->rec;
			}
		}
	}
	MPI_Alltoall(m->scnt, 1, MPI_INT, m->rcnt, 1, MPI_INT, MPI_COMM_WORLD);
	m->sdsp[0] = m->rdsp[0] = 0;
	for (d = 0; d < size; d++) {
		m->sdsp[d + 1] = m->sdsp[d] + m->scnt[d];
		m->rdsp[d + 1] = m->rdsp[d] + m->rcnt[d];
	}
	/* pack, destination by destination in token order */
	for (t = 0; t < m->n; t++) {
		uint64_t mask[4] = { 0 };

		for (j = 0; j < m->k; j++) {
			d = m->ids[t * m->k + j] / m->L;
			if (!(mask[d >> 6] & (1ull << (d & 63)))) {
				char *p = m->sbuf + m->sdsp[d] + (size_t)fill[d] * m->rec;
				int32_t *hd = (int32_t *)p, nl = 0, q;

				mask[d >> 6] |= 1ull << (d & 63);
				hd[0] = t;
				for (q = 0; q < m->k; q++)
					if (m->ids[t * m->k + q] / m->L == d) {
						hd[2 + 2 * nl] = m->ids[t * m->k + q] % m->L;
						memcpy(&hd[3 + 2 * nl], &m->w[t * m->k + q], 4);
						nl++;
					}
				hd[1] = nl;
				memcpy(p + m->meta, &m->x[(size_t)t * m->H], 2 * (size_t)m->H);
				fill[d]++;
			}
		}
	}
	rcvbytes = (size_t)m->rdsp[size];
	m->rbuf = realloc(m->rbuf, rcvbytes + 1);
	if (!m->rbuf)
		return -1;
	MPI_Alltoallv(m->sbuf, m->scnt, m->sdsp, MPI_BYTE, m->rbuf, m->rcnt,
		      m->rdsp, MPI_BYTE, MPI_COMM_WORLD);
	/* expert-major: count, offsets, copy */
	nrec = (int)(rcvbytes / m->rec);
	m->nrecv = nrec;
	memset(m->row_off, 0, ((size_t)m->L + 1) * sizeof(int));
	for (r = 0; r < nrec; r++) {
		int32_t *hd = (int32_t *)(m->rbuf + (size_t)r * m->rec);

		for (j = 0; j < hd[1]; j++)
			m->row_off[hd[2 + 2 * j] + 1]++;
	}
	for (e = 0; e < m->L; e++)
		m->row_off[e + 1] += m->row_off[e];
	total = m->row_off[m->L];
	m->rows = realloc(m->rows, (size_t)total * m->H * 2 + 2);
	m->src_row = realloc(m->src_row, ((size_t)total + 1) * sizeof(int32_t));
	m->src_w = realloc(m->src_w, ((size_t)total + 1) * sizeof(float));
	m->rec_rows = realloc(m->rec_rows, ((size_t)nrec + 1) * sizeof(int));
	m->rec_nrows = realloc(m->rec_nrows, ((size_t)nrec + 1) * sizeof(int));
	m->rowlist = realloc(m->rowlist, ((size_t)total + 1) * sizeof(int));
	if (!m->rows || !m->src_row || !m->src_w || !m->rec_rows ||
	    !m->rec_nrows || !m->rowlist)
		return -1;
	{
		int *pos = malloc(((size_t)m->L + 1) * sizeof(int)), nl = 0;

		memcpy(pos, m->row_off, (size_t)m->L * sizeof(int));
		for (r = 0; r < nrec; r++) {
			const char *p = m->rbuf + (size_t)r * m->rec;
			const int32_t *hd = (const int32_t *)p;

			m->rec_rows[r] = nl;
			m->rec_nrows[r] = hd[1];
			for (j = 0; j < hd[1]; j++) {
				int row = pos[hd[2 + 2 * j]]++;

				memcpy(&m->rows[(size_t)row * m->H], p + m->meta,
				       2 * (size_t)m->H);
				m->src_row[row] = r;
				memcpy(&m->src_w[row], &hd[3 + 2 * j], 4);
				m->rowlist[nl++] = row;
			}
		}
		free(pos);
	}
	free(fill);
	return 0;
}

/* One combine of the identity expert's rows (m->rows). */
static int moe_combine(struct moe *m)
{
	int r, j, d, h, t;
	size_t row = 2 * (size_t)m->H;
	int *fill = calloc((size_t)size, sizeof(int));

	m->cs = realloc(m->cs, (size_t)m->nrecv * row + 2);
	if (!m->cs || !fill)
		return -1;
	/* per received record, the weighted sum of its rows, in record
	 * order: segment d goes back to rank d */
	for (r = 0; r < m->nrecv; r++) {
		float *acc = m->acc;

		for (h = 0; h < m->H; h++)
			acc[h] = 0;
		for (j = 0; j < m->rec_nrows[r]; j++) {
			int rw = m->rowlist[m->rec_rows[r] + j];
			const uint16_t *y = &m->rows[(size_t)rw * m->H];
			float wt = m->src_w[rw];

			for (h = 0; h < m->H; h++)
				acc[h] += wt * bf2f(y[h]);
		}
		for (h = 0; h < m->H; h++)
			m->cs[(size_t)r * m->H + h] = f2bf(acc[h]);
	}
	for (d = 0; d < size; d++) {
		m->ccnt[d] = (int)(m->rcnt[d] / m->rec * row);
		m->crcnt[d] = (int)(m->scnt[d] / m->rec * row);
		m->cdsp[d + 1] = m->cdsp[d] + m->ccnt[d];
		m->crdsp[d + 1] = m->crdsp[d] + m->crcnt[d];
	}
	MPI_Alltoallv(m->cs, m->ccnt, m->cdsp, MPI_BYTE, m->cr, m->crcnt,
		      m->crdsp, MPI_BYTE, MPI_COMM_WORLD);
	/* the source: sum each token's partial rows (segments in token
	 * order, as packed) */
	{
		float *acc = malloc((size_t)m->n * m->H * sizeof(float));

		if (!acc)
			return -1;
		memset(acc, 0, (size_t)m->n * m->H * sizeof(float));
		for (t = 0; t < m->n; t++) {
			uint64_t mask[4] = { 0 };

			for (j = 0; j < m->k; j++) {
				d = m->ids[t * m->k + j] / m->L;
				if (!(mask[d >> 6] & (1ull << (d & 63)))) {
					const uint16_t *p;
					float *a = &acc[(size_t)t * m->H];

					mask[d >> 6] |= 1ull << (d & 63);
					p = (const uint16_t *)((const char *)m->cr + m->crdsp[d] +
							       (size_t)fill[d]++ * row);
					for (h = 0; h < m->H; h++)
						a[h] += bf2f(p[h]);
				}
			}
		}
		for (t = 0; t < m->n; t++)
			for (h = 0; h < m->H; h++)
				m->out[(size_t)t * m->H + h] = f2bf(acc[(size_t)t * m->H + h]);
		free(acc);
	}
	free(fill);
	return 0;
}

/* combine's result against a direct sum: out[t] = sum_j w[t,j] * x[t]
 * (the identity expert), within bf16 rounding of the stages. */
static int moe_check(const struct moe *m)
{
	int t, j, h, bad = 0;

	for (t = 0; t < m->n && !bad; t++) {
		float ws = 0;

		for (j = 0; j < m->k; j++)
			ws += m->w[t * m->k + j];
		for (h = 0; h < m->H; h++) {
			float want = ws * bf2f(m->x[(size_t)t * m->H + h]);
			float got = bf2f(m->out[(size_t)t * m->H + h]);

			if (fabsf(got - want) > 0.03f * fabsf(want) + 1e-2f) {
				bad = 1;
				break;
			}
		}
	}
	return bad;
}

static double now(void)
{
	return MPI_Wtime();
}

static int run_moe(const struct opts *o, const char *op)
{
	struct moe m;
	int it, n = o->iters, do_d = !strcmp(op, "dispatch"), bad, anybad;
	double *t = calloc((size_t)n, sizeof(double)), med, t0;

	memset(&m, 0, sizeof(m));
	if (!t || moe_setup(&m, o)) {
		fprintf(stderr, "fabep_mpi_bench: out of memory\n");
		return 1;
	}
	for (it = -o->warmup; it < n; it++) {
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = now();
		if (moe_dispatch(&m))
			return 1;
		if (do_d && it >= 0)
			t[it] = now() - t0;
		if (!do_d) {
			MPI_Barrier(MPI_COMM_WORLD);
			t0 = now();
			if (moe_combine(&m))
				return 1;
			if (it >= 0)
				t[it] = now() - t0;
		}
	}
	if (do_d && moe_combine(&m))
		return 1;
	bad = moe_check(&m);
	MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	med = median_max(t, n);
	if (!rank) {
		if (o->machine)
			printf("op: %s impl: mpi ranks: %d tokens: %d hidden: %d topk: %d "
			       "experts: %d median_us: %.1f check: %s\n", op, size,
			       o->tokens, o->hidden, o->topk, o->experts, med * 1e6,
			       anybad ? "failed" : "ok");
		else
			printf("%-9s %6d %7d %12.1f  %s\n", op, size, o->tokens,
			       med * 1e6, anybad ? "CHECK FAILED" : "ok");
	}
	free(t);
	return anybad;
}

/* ---- allreduce, allreduce + RMSNorm + FP8 ---- */

static int run_coll(const struct opts *o, const char *op, size_t rows)
{
	size_t cols = (size_t)o->cols, i, j, len = rows * cols;
	int arnorm = !strcmp(op, "arnorm"), n = o->iters, it;
	float *in = malloc(len * sizeof(float) + 4), *sum = malloc(len * sizeof(float) + 4);
	float *gamma = malloc(cols * sizeof(float) + 4), *sc = malloc(rows * sizeof(float) + 4);
	uint8_t *q = malloc(len + 1);
	double *t = calloc((size_t)n, sizeof(double)), med, t0;

	if (!in || !sum || !gamma || !sc || !q || !t) {
		fprintf(stderr, "fabep_mpi_bench: out of memory\n");
		return 1;
	}
	for (i = 0; i < len; i++)
		in[i] = (float)((int)((i * 7 + (size_t)rank * 13) % 2001) - 1000) / 1000.0f;
	for (j = 0; j < cols; j++)
		gamma[j] = 0.5f + (float)(j % 100) / 100.0f;
	for (it = -o->warmup; it < n; it++) {
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = now();
		MPI_Allreduce(in, sum, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		if (arnorm) {
			for (i = 0; i < rows; i++) {
				const float *x = &sum[i * cols];
				float ss = 0, amax = 0, inv, s, rs;

				for (j = 0; j < cols; j++)
					ss += x[j] * x[j];
				inv = 1.0f / sqrtf(ss / (float)cols + 1e-6f);
				for (j = 0; j < cols; j++) {
					float y = fabsf(x[j] * inv * gamma[j]);

					amax = y > amax ? y : amax;
				}
				s = amax > 0 ? amax / 448.0f : 1.0f;
				rs = 1.0f / s;
				sc[i] = s;
				for (j = 0; j < cols; j++)
					q[i * cols + j] = f2e4m3(x[j] * inv * gamma[j] * rs);
			}
		}
		if (it >= 0)
			t[it] = now() - t0;
	}
	med = median_max(t, n);
	if (!rank) {
		if (o->machine)
			printf("op: %s impl: mpi ranks: %d rows: %zu cols: %zu dtype: fp32 "
			       "median_us: %.1f\n", op, size, rows, cols, med * 1e6);
		else
			printf("%-9s %6d %7zu %12.1f\n", op, size, rows, med * 1e6);
	}
	free(in);
	free(sum);
	free(gamma);
	free(sc);
	free(q);
	free(t);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: fabep_mpi_bench [OPTIONS]   (under mpirun)\n"
		"The MPI baseline of fabep_bench: an MPI_Alltoallv token dispatcher\n"
		"and combiner of fabep_bench's routing, MPI_Allreduce, and\n"
		"MPI_Allreduce followed by RMSNorm + FP8 quantization.\n\n"
		"  -o, --op PART      dispatch, combine, allreduce, arnorm (default dispatch)\n"
		"  -t, --tokens N     tokens per rank (default 128)\n"
		"  -H, --hidden N     hidden size (default 7168)\n"
		"  -k, --topk N       experts per token (default 8)\n"
		"  -e, --experts N    experts in all, a multiple of the ranks (default 256)\n"
		"      --rows LIST    allreduce, arnorm: rows, comma-separated (default 16,128,1024)\n"
		"      --cols N       allreduce, arnorm: columns (default 7168)\n"
		"  -I, --iterations N timed iterations (default 20)\n"
		"  -w, --warmup N     warm-up iterations (default 3)\n"
		"  -m, --machine      one \"key: value\" line per row\n"
		"  -V, --version      print the version\n"
		"  -h, --help         this help\n"
		"Exit status: 0 success, 1 a failure or a wrong combine result,\n"
		"2 bad command line.\n");
}

/* A whole number from lo to INT_MAX: 0, else 1 (a bad command line). */
static int int_arg(const char *s, long lo, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < lo || v > INT_MAX)
		return 1;
	*out = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "op", required_argument, NULL, 'o' },
		{ "tokens", required_argument, NULL, 't' },
		{ "hidden", required_argument, NULL, 'H' },
		{ "topk", required_argument, NULL, 'k' },
		{ "experts", required_argument, NULL, 'e' },
		{ "rows", required_argument, NULL, 'R' },
		{ "cols", required_argument, NULL, 'C' },
		{ "iterations", required_argument, NULL, 'I' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "machine", no_argument, NULL, 'm' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { "dispatch", 128, 7168, 8, 256, 20, 3, 0, { 16, 128, 1024 },
			  3, 7168 };
	int c, ret = 0, i, bad = 0;

	while ((c = getopt_long(argc, argv, "o:t:H:k:e:I:w:mVh", lo, NULL)) != -1) {
		char *end = NULL;

		switch (c) {
		case 'o': o.op = optarg; break;
		case 't': bad |= int_arg(optarg, 1, &o.tokens); break;
		case 'H': bad |= int_arg(optarg, 1, &o.hidden); break;
		case 'k': bad |= int_arg(optarg, 1, &o.topk); break;
		case 'e': bad |= int_arg(optarg, 1, &o.experts); break;
		case 'C': bad |= int_arg(optarg, 1, &o.cols); break;
		case 'I': bad |= int_arg(optarg, 1, &o.iters); break;
		case 'w': bad |= int_arg(optarg, 0, &o.warmup); break;
		case 'R': {
			char *s = optarg;

			/* 1 to 8 values, each a whole positive number */
			for (o.nrows = 0;; s = end + 1) {
				long v;

				errno = 0;
				v = strtol(s, &end, 10);
				if (end == s || errno || v < 1 || o.nrows == 8 ||
				    (*end && *end != ',')) {
					bad = 1;
					break;
				}
				o.rows[o.nrows++] = (size_t)v;
				if (!*end)
					break;
			}
			break;
		}
		case 'm': o.machine = 1; break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("fabep_mpi_bench: %s\n", PACKAGE_VERSION); return 0;
		default: bad = 1; break;
		}
	}
	if (bad || optind < argc || (strcmp(o.op, "dispatch") && strcmp(o.op, "combine") &&
				     strcmp(o.op, "allreduce") && strcmp(o.op, "arnorm"))) {
		usage(stderr);
		return 2;
	}
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	/* the routing's shape binds dispatch and combine; the allreduce
	 * and arnorm take any rank count */
	if ((!strcmp(o.op, "dispatch") || !strcmp(o.op, "combine")) &&
	    (o.experts % size || o.topk > o.experts || size > 256)) {
		if (!rank)
			fprintf(stderr, "fabep_mpi_bench: -e %d experts must be a multiple "
				"of %d ranks (at most 256) and at least -k %d\n",
				o.experts, size, o.topk);
		MPI_Finalize();
		return 2;
	}
	if (!rank && !o.machine)
		printf("%-9s %6s %7s %12s\n", "op", "ranks",
		       strcmp(o.op, "dispatch") && strcmp(o.op, "combine") ? "rows" : "tokens",
		       "median_us");
	if (!strcmp(o.op, "dispatch") || !strcmp(o.op, "combine"))
		ret = run_moe(&o, o.op);
	else
		for (i = 0; i < o.nrows && !ret; i++)
			ret = run_coll(&o, o.op, o.rows[i]);
	MPI_Finalize();
	return ret;
}
