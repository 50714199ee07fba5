/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_kernels.c - the compute kernels and the worker pool.
 *
 * The scalar references are checked against independent definitions
 * written here (a table of all 256 e4m3 codes built from the format's
 * definition, nearest-even bf16 by comparing neighbours, RMSNorm / sums in
 * double precision); every vector level is then checked against the
 * scalar reference on random rows of many shapes and on the edges (NaN,
 * +-inf, subnormals, values past +-448, zero rows and blocks, -0).
 * Conversions, FP8 codes and scales, RMSNorm, permutes and n-way sums
 * must be bitwise equal; weighted sums agree within fp32 tolerances
 * stated next to each check.  It prints the levels it tested and those
 * the CPU lacks (SKIPPED); FABEP_TEST_ISA=avx2|avx512 tests that level
 * only and exits 77 (skip) without it (tests/kernels_*.sh).
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include <numa.h>

#include "kernels/kernels.h"
#include "harness.h"

/* ---------------------------------------------------------------- */
/* helpers                                                          */
/* ---------------------------------------------------------------- */

/* Check's ck_assert records every passing check through a pipe in fork
 * mode (a system call each); the inner loops here check millions of
 * values, so they only call into Check on failure. */
#define EXPECT(cond, ...)                       \
	do {                                    \
		if (!(cond))                    \
			ck_abort_msg(__VA_ARGS__); \
	} while (0)
#define EXPECT1(cond) EXPECT(cond, "%s", #cond)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
	uint64_t x = rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng = x;
	return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 32);
}

static float rnd_unit(void) /* [-1, 1) */
{
	return (float)((double)rnd32() / 2147483648.0 - 1.0);
}

static uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* An activation-like value, with edge values mixed in when edges != 0. */
static float rnd_act(int edges)
{
	uint32_t r = rnd32() % 100;

	if (edges && r < 12) {
		switch (r) {
		case 0: return NAN;
		case 1: return -NAN;
		case 2: return INFINITY;
		case 3: return -INFINITY;
		case 4: return u2f(rnd32() & 0x807fffffu);  /* subnormal */
		case 5: return -0.0f;
		case 6: return 0.0f;
		case 7: return 1000.0f;
		case 8: return -3.0e5f;
		case 9: return 448.0f;
		case 10: return u2f(0x3a800000u);  /* 2^-10: fp8 tie at scale 1 */
		default: return 1e-30f;
		}
	}
	return rnd_unit() * ldexpf(1.0f, (int)(rnd32() % 16) - 8);
}

static const char *isa_name(fabep_isa_t i)
{
	return fabep_isa_name(i);
}

/* Both NaN, or the same bits. */
static int same_f32(float a, float b)
{
	return (isnan(a) && isnan(b)) || f2u(a) == f2u(b);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	ck_assert_ptr_nonnull(p);
	return p;
}

static const size_t shapes[] = { 1, 7, 100, 2880, 7168 };

/* What the detection set the kernels' CPU flags to, captured before the
 * tests change them: fep_k_hw_bf16 (the hardware bf16 conversion),
 * fep_k_vbmi (the FP8 quantization's VBMI packing) and fep_k_pf_l1 (the
 * top-k sum's and gather's prefetches into L1). */
static int cpu_bf16 = -1, cpu_vbmi = -1, cpu_pf_l1 = -1;

static void cpu_flags(void)
{
	if (cpu_bf16 < 0) {
		fep_k_isa_max(); /* runs the detection */
		cpu_bf16 = fep_k_hw_bf16;
		cpu_vbmi = fep_k_vbmi;
		cpu_pf_l1 = fep_k_pf_l1;
	}
}

static int hw_bf16_have(void)
{
	cpu_flags();
	return cpu_bf16;
}

static int vbmi_have(void)
{
	cpu_flags();
	return cpu_vbmi;
}

/* Run the body with a flag's path off, then on where the CPU has it, so
 * both paths are compared. */
#define FOR_FLAG(v, flag, have) \
	for (int v = 0; v <= (have) && (((flag) = v), 1); v++)
#define FOR_HW_BF16(hw) FOR_FLAG(hw, fep_k_hw_bf16, hw_bf16_have())
#define FOR_VBMI(v) FOR_FLAG(v, fep_k_vbmi, vbmi_have())
/* Both prefetch hints (any x86 CPU takes either), then the detected one
 * back for the tests after */
#define FOR_PF_L1(v) \
	for (int v = (cpu_flags(), 0); v <= 1 || ((fep_k_pf_l1 = cpu_pf_l1), 0); v++) \
		if ((fep_k_pf_l1 = v), 1)

/* The vector levels compared with the scalar reference: every level
 * this CPU has, or only FABEP_TEST_ISA's (set in main). */
static fabep_isa_t test_lo = FABEP_ISA_AVX2, test_hi = FABEP_ISA_SCALAR;

static fabep_isa_t next_level(fabep_isa_t isa)
{
	return isa == FABEP_ISA_SCALAR ? test_lo : (fabep_isa_t)(isa + 1);
}

#define FOR_VECTOR_LEVELS(isa)                                         \
	for (fabep_isa_t isa = test_lo; isa <= test_hi; isa = next_level(isa))
/* The scalar reference itself, then the vector levels. */
#define FOR_LEVELS(isa)                                                \
	for (fabep_isa_t isa = FABEP_ISA_SCALAR; isa <= test_hi;       \
	     isa = next_level(isa))

/* ---------------------------------------------------------------- */
/* ISA selection                                                    */
/* ---------------------------------------------------------------- */

START_TEST(test_isa_names)
{
	fabep_isa_t i;

	ck_assert_str_eq(fabep_isa_name(FABEP_ISA_SCALAR), "scalar");
	ck_assert_str_eq(fabep_isa_name(FABEP_ISA_AVX2), "avx2");
	ck_assert_str_eq(fabep_isa_name(FABEP_ISA_AVX512), "avx512");
	ck_assert_int_eq(fep_k_isa_parse("avx2", &i), 0);
	ck_assert_int_eq(i, FABEP_ISA_AVX2);
	ck_assert_int_eq(fep_k_isa_parse("sse", &i), -EINVAL);
	ck_assert_ptr_nonnull(fep_k_ops_isa(FABEP_ISA_SCALAR));
	ck_assert_ptr_nonnull(fep_k_ops_isa(fep_k_isa_max()));
	EXPECT1(fabep_isa() <= fep_k_isa_max());
	ck_assert_int_eq(fep_k_ops()->isa, fabep_isa());
	if (fep_k_isa_max() < FABEP_ISA_AVX512)
		ck_assert_ptr_null(fep_k_ops_isa(FABEP_ISA_AVX512));
	EXPECT1(hw_bf16_have() == (fep_k_isa_max() == FABEP_ISA_AVX512 &&
				   __builtin_cpu_supports("avx512bf16")));
	EXPECT1(vbmi_have() == (fep_k_isa_max() == FABEP_ISA_AVX512 &&
				__builtin_cpu_supports("avx512vbmi")));
	if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512dq") && !getenv("FABEP_ISA"))
		ck_assert_int_eq(fabep_isa(), FABEP_ISA_AVX512);
}
END_TEST

/* The vector tests compare every level this CPU has with scalar; a CPU
 * without AVX-512 leaves those kernels untested here: a skip, so the
 * suite's summary says so. */
START_TEST(test_isa_avx512_here)
{
	if (fep_k_isa_max() < FABEP_ISA_AVX512)
		fep_test_skip("no AVX-512 (BW, VL, DQ) on this CPU: the AVX-512 "
			      "kernels are not compared with scalar here");
	ck_assert_ptr_nonnull(fep_k_ops_isa(FABEP_ISA_AVX512));
}
END_TEST

/* Runs in a forked child (see main): first use sees FABEP_ISA. */
START_TEST(test_isa_env)
{
	setenv("FABEP_ISA", "scalar", 1);
	ck_assert_int_eq(fabep_isa(), FABEP_ISA_SCALAR);
	ck_assert_int_eq(fep_k_ops()->isa, FABEP_ISA_SCALAR);
	ck_assert_str_eq(fabep_isa_name(fabep_isa()), "scalar");
}
END_TEST

START_TEST(test_isa_env_bad)
{
	setenv("FABEP_ISA", "avx9000", 1);
	ck_assert_int_eq(fabep_isa(), fep_k_isa_max());
}
END_TEST

/* ---------------------------------------------------------------- */
/* bf16                                                             */
/* ---------------------------------------------------------------- */

/* Independent RNE: the nearer of the two bf16 neighbours, ties to even. */
static uint16_t ref_bf16(float f)
{
	uint32_t u = f2u(f);
	uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
	uint32_t rest = u & 0xffff;

	if (isnan(f))
		return (uint16_t)(lo | 0x40);
	if (rest < 0x8000)
		return lo;
	if (rest > 0x8000)
		return hi;
	return (lo & 1) ? hi : lo;
}

START_TEST(test_bf16_reference)
{
	static const struct { uint32_t in; uint16_t out; } fixed[] = {
		{ 0x3f800000, 0x3f80 }, /* 1 */
		{ 0x3f808000, 0x3f80 }, /* tie, even down */
		{ 0x3f818000, 0x3f82 }, /* tie, odd up */
		{ 0x3f808001, 0x3f81 },
		{ 0x7f7fffff, 0x7f80 }, /* max float rounds to inf */
		{ 0x7f800000, 0x7f80 }, /* inf */
		{ 0xff800000, 0xff80 },
		{ 0x7f800001, 0x7fc0 }, /* sNaN -> qNaN */
		{ 0xffc00000, 0xffc0 },
		{ 0x80000000, 0x8000 }, /* -0 */
		{ 0x00018000, 0x0002 }, /* subnormal tie up (odd) */
		{ 0x00008000, 0x0000 }, /* subnormal tie down */
	};
	size_t i;

	for (i = 0; i < FEP_ARRAY_SIZE(fixed); i++)
		EXPECT(fep_f32_to_bf16(u2f(fixed[i].in)) == fixed[i].out,
			      "bf16(%08x) = %04x, want %04x", fixed[i].in,
			      fep_f32_to_bf16(u2f(fixed[i].in)), fixed[i].out);
	for (i = 0; i < 200000; i++) {
		float f = u2f(rnd32());
		EXPECT(fep_f32_to_bf16(f) == ref_bf16(f), "bf16(%08x)", f2u(f));
	}
	for (i = 0; i < 65536; i++)
		EXPECT1(f2u(fep_bf16_to_f32((uint16_t)i)) == (uint32_t)i << 16);
}
END_TEST

static void check_conv(const struct fep_k_ops *v, const struct fep_k_ops *s,
		       size_t n, size_t off)
{
	float *f = xmalloc((n + off) * 4), *fs = xmalloc((n + off) * 4),
	      *fv = xmalloc((n + off) * 4);
	uint16_t *h = xmalloc((n + off) * 2), *hs = xmalloc((n + off) * 2),
		 *hv = xmalloc((n + off) * 2);
	size_t i;

	for (i = 0; i < n + off; i++) {
		uint32_t r = rnd32();
		/* random bits (every class), plus exact ties */
		f[i] = u2f((i & 3) == 0 ? ((r & 0xffff0000u) | 0x8000u) : r);
		h[i] = (uint16_t)rnd32();
	}
	memset(hs, 0xaa, (n + off) * 2);
	memset(hv, 0xaa, (n + off) * 2);
	memset(fs, 0xaa, (n + off) * 4);
	memset(fv, 0xaa, (n + off) * 4);
	s->f32_to_bf16(f, hs, off, off + n);
	v->f32_to_bf16(f, hv, off, off + n);
	EXPECT(!memcmp(hs, hv, (n + off) * 2), "%s f32_to_bf16 n=%zu off=%zu",
		      isa_name(v->isa), n, off);
	s->bf16_to_f32(h, fs, off, off + n);
	v->bf16_to_f32(h, fv, off, off + n);
	EXPECT(!memcmp(fs, fv, (n + off) * 4), "%s bf16_to_f32 n=%zu off=%zu",
		      isa_name(v->isa), n, off);
	free(f); free(fs); free(fv); free(h); free(hs); free(hv);
}

START_TEST(test_bf16_vector)
{
	const struct fep_k_ops *s = fep_k_ops_isa(FABEP_ISA_SCALAR);
	size_t k, off;

	FOR_HW_BF16(hw) FOR_VECTOR_LEVELS(isa) {
		const struct fep_k_ops *v = fep_k_ops_isa(isa);
		for (k = 0; k < FEP_ARRAY_SIZE(shapes); k++)
			for (off = 0; off < 3; off++)
				check_conv(v, s, shapes[k], off);
		/* large enough for the non-temporal path, misaligned */
		check_conv(v, s, FEP_K_NT_BYTES / 2 + 37, 5);
		check_conv(v, s, FEP_K_NT_BYTES / 2 + 64, 0);
	}
}
END_TEST

/* ---------------------------------------------------------------- */
/* FP8                                                              */
/* ---------------------------------------------------------------- */

/* All 256 e4m3fn codes, from the definition: bias 7, 3 mantissa bits,
 * exponent 0 subnormal, S.1111.111 NaN, no infinities. */
static float e4m3_table[256];

static void build_e4m3_table(void)
{
	int c;

	for (c = 0; c < 256; c++) {
		int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
		double v;

		if (e == 15 && m == 7)
			v = NAN;
		else if (e == 0)
			v = ldexp(m / 8.0, -6);
		else
			v = ldexp(1.0 + m / 8.0, e - 7);
		e4m3_table[c] = (float)(s ? -v : v);
	}
}

START_TEST(test_fp8_table)
{
	int c;

	build_e4m3_table();
	EXPECT1(e4m3_table[0x7e] == 448.0f && e4m3_table[0x01] == ldexpf(1, -9));
	for (c = 0; c < 256; c++) {
		float d = fep_e4m3_to_f32((uint8_t)c);

		EXPECT(same_f32(d, e4m3_table[c]) &&
			      signbit(d) == signbit(e4m3_table[c]),
			      "decode %02x = %a, want %a", c, d, e4m3_table[c]);
		if (isnan(e4m3_table[c]))
			continue;
		EXPECT(fep_f32_to_e4m3(e4m3_table[c]) == c,
			      "encode %a = %02x, want %02x", e4m3_table[c],
			      fep_f32_to_e4m3(e4m3_table[c]), c);
	}
	/* midpoints: ties to the even code, just off them to the nearer */
	for (c = 0; c < 0x7e; c++) {
		int sgn;
		for (sgn = 0; sgn < 2; sgn++) {
			int lo = c | (sgn << 7), hi = (c + 1) | (sgn << 7);
			float mid = (float)(((double)e4m3_table[lo] + e4m3_table[hi]) / 2);
			float away = sgn ? -INFINITY : INFINITY;

			EXPECT(fep_f32_to_e4m3(mid) == ((c & 1) ? hi : lo),
				      "tie %a -> %02x", mid, fep_f32_to_e4m3(mid));
			ck_assert_int_eq(fep_f32_to_e4m3(nextafterf(mid, away)), hi);
			ck_assert_int_eq(fep_f32_to_e4m3(nextafterf(mid, -away)), lo);
		}
	}
	/* saturation, NaN, tiny values */
	ck_assert_int_eq(fep_f32_to_e4m3(448.0f), 0x7e);
	ck_assert_int_eq(fep_f32_to_e4m3(464.0f), 0x7e);
	ck_assert_int_eq(fep_f32_to_e4m3(1e30f), 0x7e);
	ck_assert_int_eq(fep_f32_to_e4m3(INFINITY), 0x7e);
	ck_assert_int_eq(fep_f32_to_e4m3(-INFINITY), 0xfe);
	ck_assert_int_eq(fep_f32_to_e4m3(-500.0f), 0xfe);
	ck_assert_int_eq(fep_f32_to_e4m3(NAN), 0x7f);
	ck_assert_int_eq(fep_f32_to_e4m3(-NAN), 0xff);
	ck_assert_int_eq(fep_f32_to_e4m3(-0.0f), 0x80);
	ck_assert_int_eq(fep_f32_to_e4m3(ldexpf(1, -10)), 0x00);
	ck_assert_int_eq(fep_f32_to_e4m3(nextafterf(ldexpf(1, -10), 1)), 0x01);
	ck_assert_int_eq(fep_f32_to_e4m3(u2f(1)), 0x00);
	ck_assert_int_eq(fep_f32_to_e4m3(u2f(0x80000001u)), 0x80);
}
END_TEST

START_TEST(test_fp8_scale_rules)
{
	EXPECT1(fep_fp8_scale(448.0f, 0, 0) == 1.0f);
	EXPECT1(fep_fp8_scale(0.0f, 0, 0) == FEP_FP8_ZERO_SCALE);
	EXPECT1(fep_fp8_scale(0.0f, 0.25f, 0) == 0.25f);
	EXPECT1(fep_fp8_scale(896.0f, 1.5f, 0) == 1.5f);
	EXPECT1(fep_fp8_scale(896.0f, 3.0f, 0) == 2.0f);
	EXPECT1(fep_fp8_scale(1e-40f, 0, 0) == FEP_FP8_MIN_SCALE);
	EXPECT1(fep_fp8_scale(449.0f, 0, 1) == 2.0f);
	EXPECT1(fep_fp8_scale(448.0f, 0, 1) == 1.0f);
	EXPECT1(fep_fp8_scale(100.0f, 0, 1) == 0.25f);
	EXPECT1(isfinite(1.0f / fep_fp8_scale(1e-45f, 0, 1)));
	EXPECT1(fep_fp8_scale(3.4e38f, 0, 0) == 3.4e38f / 448.0f);
}
END_TEST

/* Every code through a vector row: scale 1 (448 in the block) makes the
 * kernel encode the values themselves; compare with the table. */
START_TEST(test_fp8_table_vector)
{
	enum { N = 1024 };
	float in[N];
	uint8_t want[N], out[N];
	float scale;
	size_t i, n = 0;
	int c;

	build_e4m3_table();
	for (c = 0; c < 256; c++) {
		if (isnan(e4m3_table[c]))
			continue;
		in[n] = e4m3_table[c];
		want[n++] = (uint8_t)c;
		if ((c & 0x7f) < 0x7e) { /* the tie above c */
			float mid = (float)(((double)e4m3_table[c] + e4m3_table[c + 1]) / 2);
			in[n] = mid;
			want[n++] = (uint8_t)((c & 1) ? c + 1 : c);
		}
	}
	in[n] = NAN; want[n++] = 0x7f;
	in[n] = -NAN; want[n++] = 0xff;
	in[n] = INFINITY; want[n++] = 0x7e;
	in[n] = -INFINITY; want[n++] = 0xfe;
	in[n] = 1e9f; want[n++] = 0x7e;   /* non-finite values do not count */
	EXPECT1(n <= N);
	FOR_LEVELS(isa) {
		fep_k_fp8_args_t a = {
			.in = in, .in_dt = FEP_K_F32, .ld_in = n, .out = out,
			.ld_out = n, .scales = &scale, .ld_scales = 1, .cols = n,
			.block = 0, .scale_ub = 0, .pow2 = 0,
		};
		/* 1e9 would set the scale: clamp it to 1 with scale_ub */
		a.scale_ub = 1.0f;
		memset(out, 0x55, sizeof(out));
		fep_k_ops_isa(isa)->fp8_quant(&a, 0, 1);
		EXPECT1(scale == 1.0f);
		for (i = 0; i < n; i++)
			EXPECT(out[i] == want[i], "%s: %a -> %02x want %02x",
				      isa_name(isa), in[i], out[i], want[i]);
	}
}
END_TEST

static void fill_rows(void *p, fep_k_dtype_t dt, size_t rows, size_t ld,
		      size_t cols, int edges)
{
	size_t r, i;

	for (r = 0; r < rows; r++) {
		int zero_row = edges && (r % 5 == 3);
		size_t zb = (rnd32() % 4 == 0) ? 128 * (rnd32() % 8) : (size_t)-1;

		for (i = 0; i < ld; i++) {
			float v = (i < cols && !zero_row) ? rnd_act(edges) : 0.0f;
			if (edges && i >= zb && i < zb + 128)
				v = (i & 1) ? -0.0f : 0.0f;  /* zero block */
			if (i >= cols)
				v = 12345.0f; /* padding must not be read */
			if (dt == FEP_K_F32)
				((float *)p)[r * ld + i] = v;
			else
				((uint16_t *)p)[r * ld + i] = fep_f32_to_bf16(v);
		}
	}
}

static void check_quant(fabep_isa_t isa, fep_k_dtype_t dt, size_t cols,
			int block, float ub, int pow2, int edges)
{
	const size_t rows = 6, ld = cols + 3;
	size_t nb = block ? (cols + block - 1) / block : 1, lds = nb + 1;
	static unsigned calls;
	void *in = xmalloc(rows * ld * 4);
	uint8_t *qs = xmalloc(rows * ld), *qv = xmalloc(rows * ld);
	float *ss = xmalloc(rows * lds * 4), *sv = xmalloc(rows * lds * 4);
	float *ds = xmalloc(rows * ld * 4), *dv = xmalloc(rows * ld * 4);
	fep_k_fp8_args_t a = {
		.in = in, .in_dt = dt, .ld_in = ld, .out = qs, .ld_out = ld,
		.scales = ss, .ld_scales = lds, .cols = cols, .block = block,
		.scale_ub = ub, .pow2 = pow2,
	};
	fep_k_fp8dq_args_t d = {
		.in = qs, .ld_in = ld, .scales = ss, .ld_scales = lds,
		.block = block, .out = ds, .out_dt = dt, .ld_out = ld, .cols = cols,
	};
	size_t r, i, b;

	fill_rows(in, dt, rows, ld, cols, edges);
	memset(qs, 0x33, rows * ld);
	memset(qv, 0x33, rows * ld);
	memset(ss, 0, rows * lds * 4);
	memset(sv, 0, rows * lds * 4);
	fep_k_ops_isa(FABEP_ISA_SCALAR)->fp8_quant(&a, 0, rows);
	a.out = qv;
	a.scales = sv;
	/* every other call with streaming stores asked for (the rows that
	 * start on a line), whatever the CPU's default */
	a.nt = d.nt = calls++ % 2 ? 1 : 0;
	fep_k_ops_isa(isa)->fp8_quant(&a, 0, rows);
	EXPECT(!memcmp(ss, sv, rows * lds * 4),
		      "%s quant scales dt=%s cols=%zu block=%d", isa_name(isa),
		      fep_k_dtype_name(dt), cols, block);
	for (i = 0; i < rows * ld; i++)
		EXPECT(qs[i] == qv[i], "%s quant dt=%s cols=%zu block=%d ub=%g "
			      "pow2=%d: [%zu] %02x vs %02x", isa_name(isa),
			      fep_k_dtype_name(dt), cols, block, ub, pow2, i, qs[i], qv[i]);
	/* the rules, on the reference's output */
	for (r = 0; r < rows; r++) {
		for (b = 0; b < nb; b++) {
			float s = ss[r * lds + b];
			EXPECT1(isfinite(s) && s > 0 && isfinite(1.0f / s));
			if (ub > 0 && !pow2)
				EXPECT1(s <= ub);
			if (pow2)
				EXPECT1((f2u(s) & 0x7fffff) == 0);
		}
		for (i = 0; i < cols; i++) {
			float x = dt == FEP_K_F32 ? ((float *)in)[r * ld + i]
				  : fep_bf16_to_f32(((uint16_t *)in)[r * ld + i]);
			uint8_t q = qs[r * ld + i];
			if (isnan(x))
				EXPECT1((q & 0x7f) == 0x7f);
			else
				EXPECT1((q & 0x7f) != 0x7f);
			if (isinf(x))
				EXPECT1((q & 0x7f) == 0x7e);
			if (!isnan(x))
				EXPECT1(!!signbit(x) == !!(q & 0x80));
		}
		EXPECT1(qs[r * ld + cols] == 0x33); /* padding untouched */
	}
	/* dequantization */
	for (i = 0; i < rows * ld * 4; i++)
		((uint8_t *)ds)[i] = ((uint8_t *)dv)[i] = 0x11;
	fep_k_ops_isa(FABEP_ISA_SCALAR)->fp8_dequant(&d, 0, rows);
	d.out = dv;
	fep_k_ops_isa(isa)->fp8_dequant(&d, 0, rows);
	EXPECT(!memcmp(ds, dv, rows * ld * fep_k_dtype_size(dt)),
		      "%s dequant dt=%s cols=%zu block=%d", isa_name(isa),
		      fep_k_dtype_name(dt), cols, block);
	for (r = 0; r < rows; r++) /* independent: table value times scale */
		for (i = 0; i < cols; i++) {
			float want = e4m3_table[qs[r * ld + i]] *
				     ss[r * lds + (block ? i / block : 0)];
			float got = dt == FEP_K_F32 ? ds[r * ld + i]
				    : fep_bf16_to_f32(((uint16_t *)ds)[r * ld + i]);
			if (dt == FEP_K_BF16)
				want = fep_bf16_to_f32(ref_bf16(want));
			EXPECT(same_f32(got, want), "dequant %a vs %a", got, want);
		}
	free(in); free(qs); free(qv); free(ss); free(sv); free(ds); free(dv);
}

START_TEST(test_fp8_vector)
{
	static const int blocks[] = { 0, 128, 16 };
	size_t k, b;
	int dt, pow2, edges;

	build_e4m3_table();
	FOR_HW_BF16(hw)
	FOR_VBMI(vbmi)
	FOR_LEVELS(isa)
		for (k = 0; k < FEP_ARRAY_SIZE(shapes); k++)
			for (b = 0; b < FEP_ARRAY_SIZE(blocks); b++)
				for (dt = 0; dt < 2; dt++)
					for (pow2 = 0; pow2 < 2; pow2++)
						for (edges = 0; edges < 2; edges++)
							check_quant(isa, (fep_k_dtype_t)dt,
								    shapes[k], blocks[b],
								    edges ? 0.01f : 0.0f,
								    pow2, edges);
}
END_TEST

/* N values of dt in blocks of 128, quantized by each level, with
 * streaming stores and plain ones, against the scalar reference: with
 * scales of 1 (every value as it is, where no block needs more), of 0.3
 * (every product rounded) and the scales the blocks' maxima give, and
 * powers of two. */
enum { QALL_N = 65536 };

static float ld_row(const void *p, fep_k_dtype_t dt, size_t i);

static void quant_all_levels(const void *in, fep_k_dtype_t dt, int pass)
{
	static const float ubs[] = { 1.0f, 0.3f, 0.0f };
	uint8_t *qs = xmalloc(QALL_N), *qv = aligned_alloc(64, QALL_N);
	float ss[QALL_N / 128], sv[QALL_N / 128];
	size_t i, u;
	int pow2, st;

	ck_assert_ptr_nonnull(qv);
	for (u = 0; u < FEP_ARRAY_SIZE(ubs); u++)
		for (pow2 = 0; pow2 < 2; pow2++)
			FOR_VECTOR_LEVELS(isa) for (st = 0; st < 2; st++) {
				fep_k_fp8_args_t a = {
					.in = in, .in_dt = dt, .ld_in = QALL_N,
					.out = qs, .ld_out = QALL_N, .scales = ss,
					.ld_scales = QALL_N / 128, .cols = QALL_N,
					.block = 128, .scale_ub = ubs[u], .pow2 = pow2,
				};

				fep_k_ops_isa(FABEP_ISA_SCALAR)->fp8_quant(&a, 0, 1);
				a.out = qv;
				a.scales = sv;
				a.nt = st ? 1 : -1;  /* streaming stores, and plain */
				memset(qv, 0xcc, QALL_N);
				fep_k_ops_isa(isa)->fp8_quant(&a, 0, 1);
				EXPECT1(!memcmp(ss, sv, sizeof(ss)));
				for (i = 0; i < QALL_N; i++)
					EXPECT(qs[i] == qv[i], "%s %s pass %d ub %g pow2 %d "
					       "nt %d: value %zu (%a, bits %08x) -> %02x, "
					       "scalar %02x", isa_name(isa),
					       dt == FEP_K_BF16 ? "bf16" : "fp32", pass,
					       ubs[u], pow2, st, i, ld_row(in, dt, i),
					       f2u(ld_row(in, dt, i)), qv[i], qs[i]);
			}
	free(qs);
	free(qv);
}

/* Every bf16 value, quantized by each level against the scalar
 * reference: in order (blocks of 128 hold one run of patterns, the NaN
 * patterns only four of them), then NaN-free and shuffled. */
START_TEST(test_fp8_bf16_all)
{
	uint16_t *in = xmalloc(QALL_N * 2);
	size_t i;
	int pass;

	for (pass = 0; pass < 2; pass++) {
		for (i = 0; i < QALL_N; i++)
			in[i] = (uint16_t)i;
		if (pass) {  /* no NaN, shuffled */
			for (i = 0; i < QALL_N; i++)
				if ((in[i] & 0x7fff) > 0x7f80)
					in[i] = (uint16_t)(rnd32() & 0x807f);
			for (i = QALL_N - 1; i > 0; i--) {
				size_t j = rnd32() % (i + 1);
				uint16_t t = in[i];

				in[i] = in[j];
				in[j] = t;
			}
		}
		FOR_VBMI(vbmi)
			quant_all_levels(in, FEP_K_BF16, pass);
	}
	free(in);
}
END_TEST

/* fp32 input, each level against the scalar reference: every bf16
 * pattern widened (NaN and inf among them, in order); then, NaN-free and
 * shuffled, the same with random low mantissa bits; then the e4m3 ties,
 * the midpoints of neighbouring codes and the floats either side of
 * them, both signs, in blocks whose largest value is 448 (scale 1: every
 * value encoded as it is) */
START_TEST(test_fp8_f32_all)
{
	float *in = xmalloc(QALL_N * 4);
	size_t i, nt = 0;
	float ties[6 * 126];
	int pass, c;

	build_e4m3_table();
	for (c = 0; c < 126; c++) {
		float mid = (e4m3_table[c] + e4m3_table[c + 1]) / 2;

		ties[nt++] = mid;
		ties[nt++] = nextafterf(mid, 0.0f);
		ties[nt++] = nextafterf(mid, INFINITY);
	}
	for (i = 0; i < 3 * 126; i++)
		ties[nt++] = -ties[i];
	for (pass = 0; pass < 3; pass++) {
		for (i = 0; i < QALL_N; i++)
			in[i] = u2f((uint32_t)i << 16);
		if (pass == 1) {
			for (i = 0; i < QALL_N; i++) {
				uint32_t b = ((uint32_t)i << 16) | (rnd32() & 0xffff);

				if ((b & 0x7fffffff) >= 0x7f800000)
					b &= 0x807fffff;
				in[i] = u2f(b);
			}
			for (i = QALL_N - 1; i > 0; i--) {
				size_t j = rnd32() % (i + 1);
				float t = in[i];

				in[i] = in[j];
				in[j] = t;
			}
		} else if (pass == 2) {
			for (i = 0; i < QALL_N; i++)
				in[i] = i % 128 ? ties[(i - i / 128 - 1) % nt] : 448.0f;
		}
		quant_all_levels(in, FEP_K_F32, pass);
	}
	free(in);
}
END_TEST

/* An all-zero row and block get the documented finite scale. */

/* Every code times scales at the edges (subnormal, the smallest normal,
 * near the largest float, where 2^8 * scale stops being finite, inf,
 * NaN, negative; and the range where bf16 output goes by tables, its
 * ends and just past them, with scales whose products round), to fp32
 * and bf16, in blocks of 32 and of 256: each level bitwise equal to the
 * scalar reference (NaN and NaN equal only where the scale is NaN). */
START_TEST(test_fp8_dequant_edges)
{
	static const float scl[] = { 1e-40f, 0x1p-126f, 0.01f, 1.0f, 3.0e38f,
				     0x1p118f, 0x1p119f, 0x1p120f, INFINITY, NAN,
				     -1.5f, 0.0f, 0x1p-100f, 0x1.fffffep-101f,
				     0x1p100f, 0x1.000002p100f, 0.3f, 3.0f,
				     0x1.555556p-2f, 0x1.fffffep-1f };
	static const int blocks[] = { 32, 256 };
	const size_t ns = FEP_ARRAY_SIZE(scl), cols = 256 * ns;
	uint8_t *q = xmalloc(cols);
	float *sc = xmalloc(8 * ns * 4), *rs = xmalloc(cols * 4);
	float *rv = aligned_alloc(64, cols * 4);  /* streamed when asked */
	size_t i, b;
	int dt, nt;

	ck_assert_ptr_nonnull(rv);
	/* all 256 codes (one block of 256, or 8 of 32) with each scale in
	 * turn */
	for (i = 0; i < cols; i++)
		q[i] = (uint8_t)(i % 256);
	for (b = 0; b < FEP_ARRAY_SIZE(blocks); b++)
	for (dt = 0; dt < 2; dt++) {
		size_t bs = (size_t)blocks[b], nb = cols / bs;
		fep_k_fp8dq_args_t d = {
			.in = q, .ld_in = cols, .scales = sc, .ld_scales = nb,
			.block = blocks[b], .out = rs, .out_dt = (fep_k_dtype_t)dt,
			.ld_out = cols, .cols = cols,
		};

		for (i = 0; i < nb; i++)
			sc[i] = scl[i * bs / 256];
		fep_k_ops_isa(FABEP_ISA_SCALAR)->fp8_dequant(&d, 0, 1);
		for (nt = -1; nt <= 1; nt += 2)
		FOR_HW_BF16(hw) FOR_VECTOR_LEVELS(isa) {
			d.out = rv;
			d.nt = nt;
			memset(rv, 0x5a, cols * 4);
			fep_k_ops_isa(isa)->fp8_dequant(&d, 0, 1);
			d.out = rs;
			for (i = 0; i < cols; i++) {
				float a = ld_row(rs, (fep_k_dtype_t)dt, i);
				float v = ld_row(rv, (fep_k_dtype_t)dt, i);
				int nan_scale = isnan(sc[i / bs]);

				EXPECT(nan_scale ? (isnan(a) && isnan(v)) :
				       (dt ? ((uint16_t *)rs)[i] == ((uint16_t *)rv)[i]
					   : f2u(a) == f2u(v)),
				       "%s dequant %s block %zu code %02zx scale %a: %a vs %a",
				       isa_name(isa), dt ? "bf16" : "fp32", bs, i % 256,
				       sc[i / bs], v, a);
			}
		}
	}
	free(q); free(sc); free(rs); free(rv);
}
END_TEST

START_TEST(test_fp8_zero_blocks)
{
	float in[256] = { 0 }, sc[2];
	uint8_t q[256];
	int i;

	in[5] = -0.0f;
	for (i = 128; i < 256; i++)
		in[i] = (float)(i - 128) / 64.0f; /* amax 127/64 */
	FOR_LEVELS(isa) {
		fep_k_fp8_args_t a = {
			.in = in, .in_dt = FEP_K_F32, .ld_in = 256, .out = q,
			.ld_out = 256, .scales = sc, .ld_scales = 2, .cols = 256,
			.block = 128,
		};
		fep_k_ops_isa(isa)->fp8_quant(&a, 0, 1);
		EXPECT1(sc[0] == FEP_FP8_ZERO_SCALE);
		EXPECT1(sc[1] == (127.0f / 64.0f) / 448.0f);
		ck_assert_int_eq(q[0], 0);
		ck_assert_int_eq(q[5], 0x80);
		ck_assert_int_eq(q[255], 0x7e);
		in[7] = NAN;  /* NaN does not count into amax */
		in[9] = INFINITY;
		fep_k_ops_isa(isa)->fp8_quant(&a, 0, 1);
		EXPECT1(sc[0] == FEP_FP8_ZERO_SCALE);
		ck_assert_int_eq(q[7], 0x7f);
		ck_assert_int_eq(q[9], 0x7e);
		in[7] = 0;
		in[9] = 0;
	}
}
END_TEST

/* ---------------------------------------------------------------- */
/* RMSNorm                                                          */
/* ---------------------------------------------------------------- */

static float ld_row(const void *p, fep_k_dtype_t dt, size_t i)
{
	return dt == FEP_K_F32 ? ((const float *)p)[i]
			       : fep_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* |got - want| within rel * |want| + abs. */
static int close_to(float got, float want, float rel, float abs_tol)
{
	if (isnan(want) || isnan(got))
		return isnan(want) && isnan(got);
	if (isinf(want) || isinf(got))
		return got == want;
	return fabsf(got - want) <= rel * fabsf(want) + abs_tol;
}

/* The scalar kernel on a (its residual, output and scales), then level
 * isa on the same input with residual rv (a copy of a's before the
 * run), output ov and scales sv.  Residual adds are element-wise: both
 * residuals must hold the same values (bits; NaNs as NaNs).  Without a
 * residual, level isa once more a row per call (the kernels choose
 * their path by the rows of a call) must give the same bytes.  The
 * caller compares the outputs. */
static void rmsnorm_both(fabep_isa_t isa, const fep_k_rmsnorm_args_t *a,
			 size_t rows, void *rv, void *ov, float *sv)
{
	fep_k_rmsnorm_args_t b = *a;
	size_t i, ob = rows * a->ld_out * fep_k_dtype_size(a->out_dt);

	fep_k_ops_isa(FABEP_ISA_SCALAR)->rmsnorm(a, 0, rows);
	b.residual = a->residual ? rv : NULL;
	b.out = ov;
	b.scales = sv;
	fep_k_ops_isa(isa)->rmsnorm(&b, 0, rows);
	if (a->residual)
		for (i = 0; i < rows * a->ld_res; i++)
			EXPECT(same_f32(ld_row(a->residual, a->in_dt, i),
					ld_row(rv, a->in_dt, i)),
			       "%s residual %zu", isa_name(isa), i);
	if (!a->residual) {
		uint8_t *o1 = xmalloc(ob);
		float *s1 = xmalloc(rows * a->ld_scales * sizeof(float));

		memcpy(o1, ov, ob);  /* bytes between rows (ld) as well */
		memcpy(s1, sv, rows * a->ld_scales * sizeof(float));
		b.out = o1;
		b.scales = s1;
		for (i = 0; i < rows; i++)
			fep_k_ops_isa(isa)->rmsnorm(&b, i, i + 1);
		if (a->out_dt == FEP_K_FP8) {
			EXPECT(!memcmp(o1, ov, ob), "%s: row by row, codes differ",
			       isa_name(isa));
			EXPECT(!memcmp(s1, sv, rows * a->ld_scales * sizeof(float)),
			       "%s: row by row, scales differ", isa_name(isa));
		} else {  /* NaNs as NaNs, as against the reference */
			for (i = 0; i < rows * a->ld_out; i++)
				if (!same_f32(ld_row(o1, a->out_dt, i), ld_row(ov, a->out_dt, i))) {
					EXPECT(0, "%s: row by row, value %zu differs",
					       isa_name(isa), i);
					break;
				}
		}
		free(o1);
		free(s1);
	}
}

static void check_rmsnorm(fabep_isa_t isa, fep_k_dtype_t in_dt,
			  fep_k_dtype_t out_dt, size_t cols, int with_res)
{
	const size_t rows = 5, ld = cols + 1;
	size_t es = fep_k_dtype_size(in_dt), os = fep_k_dtype_size(out_dt);
	void *in = xmalloc(rows * ld * es), *res0 = xmalloc(rows * ld * es);
	void *rs = xmalloc(rows * ld * es), *rv = xmalloc(rows * ld * es);
	void *os_ = xmalloc(rows * ld * os), *ov = xmalloc(rows * ld * os);
	float *gamma = xmalloc(cols * 4), ss[8], sv[8];
	fep_k_rmsnorm_args_t a = {
		.in = in, .in_dt = in_dt, .ld_in = ld, .residual = with_res ? rs : NULL,
		.ld_res = ld, .gamma = gamma, .eps = 1e-6f, .weight_offset = 1.0f,
		.out = os_, .out_dt = out_dt, .ld_out = ld, .scales = ss,
		.ld_scales = 1, .scale_ub = 0, .pow2 = 0, .cols = cols,
	};
	size_t r, i;

	fill_rows(in, in_dt, rows, ld, cols, 0);
	fill_rows(res0, in_dt, rows, ld, cols, 0);
	/* row 1 all zero (with its residual): out 0, finite scale */
	memset((char *)in + ld * es, 0, ld * es);
	memset((char *)res0 + ld * es, 0, ld * es);
	for (i = 0; i < cols; i++)
		gamma[i] = rnd_unit() * 0.5f;
	memcpy(rs, res0, rows * ld * es);
	memcpy(rv, res0, rows * ld * es);
	rmsnorm_both(isa, &a, rows, rv, ov, sv);
	for (r = 0; r < rows; r++) {
		const void *h = (const char *)(with_res ? rs : in) + r * ld * es;
		double acc = 0, inv;

		/* independent reference in double */
		for (i = 0; i < cols; i++) {
			double v = ld_row(h, in_dt, i);
			if (with_res) { /* residual = in + res0, rounded to dt */
				float x = ld_row((const char *)in + r * ld * es, in_dt, i) +
					  ld_row((const char *)res0 + r * ld * es, in_dt, i);
				if (in_dt == FEP_K_BF16)
					x = fep_bf16_to_f32(ref_bf16(x));
				EXPECT1(same_f32((float)v, x));
			}
			acc += v * v;
		}
		inv = 1.0 / sqrt(acc / cols + 1e-6);
		/* every level sums the squares in the reference's order:
		 * bitwise equal output and scales */
		if (out_dt == FEP_K_FP8)
			EXPECT(same_f32(sv[r], ss[r]), "%s scale %a %a",
				      isa_name(isa), sv[r], ss[r]);
		EXPECT(!memcmp((char *)os_ + r * ld * os, (char *)ov + r * ld * os,
			       cols * os), "%s rmsnorm %s -> %s cols=%zu res=%d row %zu "
		       "differs from the scalar reference", isa_name(isa),
		       fep_k_dtype_name(in_dt), fep_k_dtype_name(out_dt), cols,
		       with_res, r);
		for (i = 0; i < cols; i++) {
			double y = ld_row(h, in_dt, i) * inv * (gamma[i] + 1.0);
			float gs, gv;

			if (out_dt == FEP_K_FP8) {
				uint8_t qs = ((uint8_t *)os_)[r * ld + i];
				uint8_t qv = ((uint8_t *)ov)[r * ld + i];
				gs = e4m3_table[qs] * ss[r];
				gv = e4m3_table[qv] * sv[r];
				/* the scalar reference vs double: half a code step
				 * (2^-4 relative) plus the subnormal step */
				EXPECT(close_to(gs, (float)y, 0.0625f * 1.001f,
						       ss[r] * (1.0f / 1024.0f) * 1.001f),
					      "fp8 ref %a vs %a", gs, y);
				EXPECT(qs == qv, "%s fp8 code %02x vs %02x", isa_name(isa),
				       qs, qv);
				continue;
			}
			gs = ld_row((char *)os_ + r * ld * os, out_dt, i);
			gv = ld_row((char *)ov + r * ld * os, out_dt, i);
			if (out_dt == FEP_K_F32) {
				/* fp32 sums of up to 7168 squares: 1e-5 relative */
				EXPECT(close_to(gs, (float)y, 1e-5f, 1e-30f),
					      "ref %a vs %a", gs, y);
				EXPECT(close_to(gv, gs, 1e-5f, 1e-30f),
					      "%s rmsnorm cols=%zu %a vs %a", isa_name(isa),
					      cols, gv, gs);
			} else { /* one bf16 ulp */
				EXPECT(close_to(gs, (float)y, 1.0f / 128, 1e-30f),
					      "ref %a vs %a", gs, y);
				EXPECT(close_to(gv, gs, 1.0f / 128, 1e-30f),
					      "%s rmsnorm bf16 %a vs %a", isa_name(isa), gv, gs);
			}
		}
	}
	free(in); free(res0); free(rs); free(rv); free(os_); free(ov); free(gamma);
}

START_TEST(test_rmsnorm)
{
	size_t k;
	int idt, odt, res;

	build_e4m3_table();
	FOR_HW_BF16(hw)
	FOR_LEVELS(isa)
		for (k = 0; k < FEP_ARRAY_SIZE(shapes); k++)
			for (idt = 0; idt < 2; idt++)
				for (odt = 0; odt < 3; odt++)
					for (res = 0; res < 2; res++)
						check_rmsnorm(isa, (fep_k_dtype_t)idt,
							      (fep_k_dtype_t)odt,
							      shapes[k], res);
	/* rows longer than the AVX-512 kernel's FP8 row buffer */
	FOR_HW_BF16(hw)
	FOR_LEVELS(isa)
		for (idt = 0; idt < 2; idt++)
			check_rmsnorm(isa, (fep_k_dtype_t)idt, FEP_K_FP8, 9000, idt);
}
END_TEST

/* Rows that reach every branch of the vector FP8 and bf16 paths: signed
 * and zero gammas, zero, tiny (FP8 subnormal codes), overflowing and
 * non-finite values, NaN or inf in gamma, eps 0 (a zero row's inv is
 * inf), bf16 rounding ties, scale_ub (saturation) and pow2 scales.
 * Every level gives the scalar reference's bits (fp32 and bf16 NaNs
 * compared as NaNs where their payload is the compiler's choice; FP8
 * codes exactly, NaN codes included). */
static void check_rmsnorm_edges(fabep_isa_t isa, fep_k_dtype_t in_dt,
				fep_k_dtype_t out_dt, size_t cols, int with_res,
				int gcase, int scase)
{
	const size_t rows = 10, ld = cols + 3;
	size_t es = fep_k_dtype_size(in_dt), os = fep_k_dtype_size(out_dt);
	float *v = xmalloc(rows * ld * 4), *gamma = xmalloc(cols * 4);
	void *in = xmalloc(rows * ld * es), *rs = xmalloc(rows * ld * es);
	void *rv = xmalloc(rows * ld * es);
	void *o_s = xmalloc(rows * ld * os), *o_v = xmalloc(rows * ld * os);
	float ss[10], sv[10];
	fep_k_rmsnorm_args_t a = {
		.in = in, .in_dt = in_dt, .ld_in = ld, .residual = with_res ? rs : NULL,
		.ld_res = ld, .gamma = gamma, .eps = gcase == 0 ? 0.0f : 1e-6f,
		.weight_offset = gcase == 1 ? 1.0f : 0.0f,
		.out = o_s, .out_dt = out_dt, .ld_out = ld, .scales = ss,
		.ld_scales = 1, .scale_ub = scase == 1 ? 1e-3f : 0.0f,
		.pow2 = scase == 2, .cols = cols,
	};
	size_t r, i;

	for (i = 0; i < cols; i++) {
		/* mixed signs and zeros (0, 2), or near 0 with an offset of 1 */
		gamma[i] = gcase == 1 ? rnd_unit() * 0.5f : rnd_unit() * 2.0f;
		if (gcase != 1 && i % 13 == 5)
			gamma[i] = (i & 2) ? -0.0f : 0.0f;
		/* halfway between two bf16 values: with eps 0, row 7's
		 * inv is 1, so its bf16 output rounds these ties; at even
		 * and odd columns, which the even/odd kernels round apart */
		if (gcase == 0 && (i % 4 == 1 || i % 4 == 2))
			gamma[i] = u2f((f2u(gamma[i]) & 0xffff0000u) | 0x8000u);
	}
	if (gcase == 2) /* one huge gamma: that y overflows to inf */
		gamma[cols / 2] = -3.0e38f;
	if (gcase == 3)
		gamma[cols - 1] = NAN;
	for (r = 0; r < rows; r++)
		for (i = 0; i < ld; i++) {
			float x = rnd_act(0);

			if (i >= cols)
				x = 12345.0f;
			else if (r == 1)
				x = (i & 1) ? -0.0f : 0.0f;
			else if (r == 2 && i == cols / 3)
				x = INFINITY;
			else if (r == 3 && i == cols - 1)
				x = -NAN;
			else if (r == 4) /* one large value, the rest tiny */
				x = i == cols / 4 ? -1.0e4f : x * 1e-3f;
			else if (r == 5)
				x = i % 3 ? x * 1e-20f : 1e-30f;
			else if (r == 6 && i == 0)
				x = 3.0e38f;
			else if (r == 7)
				x = (rnd32() & 1) ? -1.0f : 1.0f;
			else if (r == 8) /* with the huge gamma, h * g is finite
					  * and y overflows */
				x = i == cols / 2 ? 0.75f : x * 1e-6f;
			else if (r == 9) /* magnitudes 2^-12..2^12: the sum of
					  * squares rounds at almost every
					  * add, so its order shows in inv */
				x = ldexpf(x, (int)(rnd32() % 25) - 12);
			v[r * ld + i] = x;
		}
	for (i = 0; i < rows * ld; i++) {
		if (in_dt == FEP_K_F32)
			((float *)in)[i] = v[i];
		else
			((uint16_t *)in)[i] = fep_f32_to_bf16(v[i]);
	}
	if (with_res) { /* residual: the input's values in reverse order */
		for (i = 0; i < rows * ld; i++)
			memcpy((char *)rs + i * es, (char *)in + (rows * ld - 1 - i) * es, es);
		memcpy(rv, rs, rows * ld * es);
	}
	rmsnorm_both(isa, &a, rows, rv, o_v, sv);
	for (r = 0; r < rows; r++) {
		if (out_dt == FEP_K_FP8)
			EXPECT(same_f32(sv[r], ss[r]), "%s scale row %zu: %a vs %a",
			       isa_name(isa), r, sv[r], ss[r]);
		for (i = 0; i < cols; i++) {
			size_t k = r * ld + i;

			if (out_dt == FEP_K_FP8) {
				uint8_t qs = ((uint8_t *)o_s)[k], qv = ((uint8_t *)o_v)[k];

				EXPECT(qs == qv,
				       "%s %s -> fp8 cols %zu res %d g %d s %d row %zu col %zu: "
				       "%02x vs %02x", isa_name(isa), fep_k_dtype_name(in_dt),
				       cols, with_res, gcase, scase, r, i, qv, qs);
			} else {
				float ys = ld_row(o_s, out_dt, k), yv = ld_row(o_v, out_dt, k);

				EXPECT(same_f32(yv, ys), "%s %s -> %s cols %zu res %d g %d "
				       "row %zu col %zu: %a vs %a", isa_name(isa),
				       fep_k_dtype_name(in_dt), fep_k_dtype_name(out_dt), cols,
				       with_res, gcase, r, i, yv, ys);
			}
		}
	}
	free(v); free(gamma); free(in); free(rs); free(rv); free(o_s); free(o_v);
}

START_TEST(test_rmsnorm_edges)
{
	static const size_t cols[] = { 7, 33, 96, 100, 2880, 7168, 9000 };
	size_t k;
	int idt, odt, res, g, s;

	FOR_HW_BF16(hw)
	FOR_VECTOR_LEVELS(isa)
		for (k = 0; k < FEP_ARRAY_SIZE(cols); k++)
			for (idt = 0; idt < 2; idt++)
				for (odt = 0; odt < 3; odt++)
					for (res = 0; res < 2; res++)
						for (g = 0; g < 4; g++)
							for (s = 0; s < (odt == 2 ? 3 : 1); s++)
								check_rmsnorm_edges(isa,
									(fep_k_dtype_t)idt,
									(fep_k_dtype_t)odt,
									cols[k], res, g, s);
}
END_TEST

/* Rows of the order test below with a value of the last partial
 * block of 64 each. */
static size_t tail_rows(size_t n)
{
	return n >= 64 ? n % 64 : 0;
}

/* The order of the sum of squares, which every level must follow
 * (kernels.h): rows of random values of magnitudes 2^-8..2^8, whose
 * sums of squares round at almost every add, so that any element
 * summed out of its place moves a row's sum, and with it the FP8 scale
 * and the fp32 output, more often than not; 16 rows a shape, of
 * lengths with every kind of head and tail of the 32- and 64-value
 * blocks. */
START_TEST(test_rmsnorm_order)
{
	static const size_t cols[] = { 7, 33, 64, 96, 100, 130, 2880, 7168, 9000 };
	const size_t rows = 16;
	size_t k, r, i;
	int idt, odt, res;

	FOR_VECTOR_LEVELS(isa)
	for (k = 0; k < FEP_ARRAY_SIZE(cols); k++)
		for (idt = 0; idt < 2; idt++)
			for (odt = 0; odt < 3; odt += 2)  /* fp32, FP8 */
				for (res = 0; res < 2; res++) {
					size_t n = cols[k], es = fep_k_dtype_size((fep_k_dtype_t)idt);
					size_t os = fep_k_dtype_size((fep_k_dtype_t)odt);
					size_t all = rows + tail_rows(n);
					float *gamma = xmalloc(n * 4), ss[16 + 63], sv[16 + 63];
					char *in = xmalloc(all * n * es);
					char *rs = xmalloc(all * n * es), *rv = xmalloc(all * n * es);
					char *o_s = xmalloc(all * n * os), *o_v = xmalloc(all * n * os);
					fep_k_rmsnorm_args_t a = {
						.in = in, .in_dt = (fep_k_dtype_t)idt, .ld_in = n,
						.residual = res ? rs : NULL, .ld_res = n,
						.gamma = gamma, .out = o_s,
						.out_dt = (fep_k_dtype_t)odt, .ld_out = n,
						.scales = ss, .ld_scales = 1, .cols = n,
					};

					for (i = 0; i < n; i++)
						gamma[i] = 1.0f;
					/* the residual adds zeros: h = x */
					memset(rs, 0, all * n * es);
					memset(rv, 0, all * n * es);
					for (i = 0; i < rows * n; i++) {
						float x = ldexpf(rnd_unit(), (int)(rnd32() % 17) - 8);

						if (idt == FEP_K_F32)
							((float *)in)[i] = x;
						else
							((uint16_t *)in)[i] = fep_f32_to_bf16(x);
					}
					/* after the random rows, one row a value p of
					 * the last partial block of 64 (tail_rows): 1 at
					 * p, 4096 at p - 64 (in p's partial sum before
					 * it: its square 2^24 absorbs the 1, a tie to
					 * even) and 1 at the partner p ^ 32 of p's block
					 * (which the tree's first step adds to p's sum,
					 * absorbed too), zeros elsewhere: sum 2^24.  p in
					 * the partner's sum instead gives 2^24 + 2. */
					for (r = 0; r < all - rows; r++) {
						size_t q = n - n % 64 + r, base = (rows + r) * n;

						for (i = 0; i < n; i++) {
							float x = i == q || i == (q ^ 32) ? 1.0f :
								  i == q - 64 ? 4096.0f : 0.0f;

							if (idt == FEP_K_F32)
								((float *)in)[base + i] = x;
							else
								((uint16_t *)in)[base + i] =
									fep_f32_to_bf16(x);
						}
					}
					rmsnorm_both(isa, &a, all, rv, o_v, sv);
					for (r = 0; r < all; r++)
						EXPECT(odt == FEP_K_FP8 ? same_f32(sv[r], ss[r]) &&
						       !memcmp(o_v + r * n, o_s + r * n, n) :
						       !memcmp(o_v + r * n * 4, o_s + r * n * 4, n * 4),
						       "%s %s -> %s res %d: %zu columns, row %zu "
						       "(16 on: the tail probes) differs from the "
						       "scalar reference", isa_name(isa),
						       fep_k_dtype_name((fep_k_dtype_t)idt),
						       fep_k_dtype_name((fep_k_dtype_t)odt), res, n, r);
					free(gamma); free(in); free(rs); free(rv); free(o_s); free(o_v);
				}
}
END_TEST

/* Without its scratch (no memory for it) a norm takes the path of longer
 * rows: the same bits, at every level. */
START_TEST(test_rmsnorm_no_scratch)
{
	static const size_t cols[] = { 100, 7168 };
	size_t k;
	int idt, odt, res, g;

	fep_test_fault = (struct fep_fault){ .step = "rms_scratch", .code = -ENOMEM };
	FOR_HW_BF16(hw)
	FOR_VECTOR_LEVELS(isa)
		for (k = 0; k < FEP_ARRAY_SIZE(cols); k++)
			for (idt = 0; idt < 2; idt++)
				for (odt = 0; odt < 3; odt++)
					for (res = 0; res < 2; res++)
						for (g = 0; g < 4; g += 3)
							check_rmsnorm_edges(isa,
								(fep_k_dtype_t)idt,
								(fep_k_dtype_t)odt,
								cols[k], res, g, 0);
	ck_assert_msg(test_lo > test_hi || fep_test_fault.hits > 0,
		      "no norm asked for its scratch");
	fep_test_fault.step = NULL;
}
END_TEST

/* The kernels run on the caller's thread too, whose stack may be small
 * (a coroutine's, a musl thread's): a norm of the longest rows that keep
 * their values, FP8 out, on a thread of 64 KiB of stack. */
struct small_stack_job {
	fabep_isa_t isa;
	fep_k_dtype_t out_dt;
	int done;
};

static void *small_stack_norm(void *arg)
{
	struct small_stack_job *j = arg;
	const size_t rows = 3, cols = 8192;
	uint16_t *in = xmalloc(rows * cols * 2);
	float *gamma = xmalloc(cols * 4), scales[3];
	uint8_t *out = xmalloc(rows * cols * 4);
	fep_k_rmsnorm_args_t a = {
		.in = in, .in_dt = FEP_K_BF16, .ld_in = cols, .gamma = gamma,
		.eps = 1e-6f, .out = out, .out_dt = j->out_dt, .ld_out = cols,
		.scales = scales, .ld_scales = 1, .cols = cols,
	};
	size_t i;

	for (i = 0; i < rows * cols; i++)
		in[i] = fep_f32_to_bf16(rnd_act(0));
	for (i = 0; i < cols; i++)
		gamma[i] = rnd_unit();
	fep_k_ops_isa(j->isa)->rmsnorm(&a, 0, rows);
	fep_k_ops_isa(j->isa)->rmsnorm(&a, 1, 2);
	j->done = 1;
	free(in); free(gamma); free(out);
	return NULL;
}

START_TEST(test_rmsnorm_small_stack)
{
	int odt;

	FOR_HW_BF16(hw)
	FOR_VECTOR_LEVELS(isa)
		for (odt = 0; odt < 3; odt += 2) {
			struct small_stack_job j = { isa, (fep_k_dtype_t)odt, 0 };
			pthread_attr_t at;
			pthread_t t;

			ck_assert_int_eq(pthread_attr_init(&at), 0);
			ck_assert_int_eq(pthread_attr_setstacksize(&at, 64 << 10), 0);
			ck_assert_int_eq(pthread_create(&t, &at, small_stack_norm, &j), 0);
			pthread_join(t, NULL);
			pthread_attr_destroy(&at);
			ck_assert_msg(j.done, "%s: the norm did not finish", isa_name(isa));
		}
}
END_TEST

START_TEST(test_rmsnorm_nan)
{
	float in[100], gamma[100], out[100], sc;
	uint8_t q[100];
	int i;

	for (i = 0; i < 100; i++) {
		in[i] = (float)i;
		gamma[i] = 1.0f;
	}
	in[17] = NAN;
	FOR_LEVELS(isa) {
		fep_k_rmsnorm_args_t a = {
			.in = in, .in_dt = FEP_K_F32, .ld_in = 100, .gamma = gamma,
			.eps = 1e-6f, .out = out, .out_dt = FEP_K_F32, .ld_out = 100,
			.scales = &sc, .ld_scales = 1, .cols = 100,
		};
		fep_k_ops_isa(isa)->rmsnorm(&a, 0, 1);
		for (i = 0; i < 100; i++)
			EXPECT1(isnan(out[i]));
		a.out = q;
		a.out_dt = FEP_K_FP8;
		fep_k_ops_isa(isa)->rmsnorm(&a, 0, 1);
		EXPECT1(sc == FEP_FP8_ZERO_SCALE);
		for (i = 0; i < 100; i++)
			ck_assert_int_eq(q[i], 0x7f);
	}
	/* bf16 rows to FP8 (the vector levels take their even/odd path for
	 * calls of two rows or more), NaNs of either sign in rows 1 and 2:
	 * every code of those rows 0x7f, and every row's codes and scale the
	 * same whether the rows come in one call or one by one */
	{
		enum { R = 4, C = 2880 };
		uint16_t *h = xmalloc(R * C * 2);
		float *g = xmalloc(C * 4), s1[R], s2[R];
		uint8_t *q1 = xmalloc(R * C), *q2 = xmalloc(R * C);
		size_t j;
		int r;

		for (j = 0; j < R * C; j++)
			h[j] = fep_f32_to_bf16(rnd_unit() * 4.0f);
		for (j = 0; j < C; j++)
			g[j] = rnd_unit();
		h[1 * C + 5] = 0xffc1;     /* negative quiet NaN */
		h[1 * C + 700] = 0x7fc3;
		h[2 * C + 2001] = 0xff81;  /* negative signalling NaN */
		FOR_LEVELS(isa) {
			fep_k_rmsnorm_args_t a = {
				.in = h, .in_dt = FEP_K_BF16, .ld_in = C, .gamma = g,
				.eps = 1e-6f, .out = q1, .out_dt = FEP_K_FP8, .ld_out = C,
				.scales = s1, .ld_scales = 1, .cols = C,
			};

			fep_k_ops_isa(isa)->rmsnorm(&a, 0, R);
			a.out = q2;
			a.scales = s2;
			for (r = 0; r < R; r++)
				fep_k_ops_isa(isa)->rmsnorm(&a, (size_t)r, (size_t)r + 1);
			EXPECT(!memcmp(q1, q2, R * C) && !memcmp(s1, s2, sizeof(s1)),
			       "%s: one call and row by row differ", isa_name(isa));
			for (j = C; j < 3 * C; j++)
				EXPECT(q1[j] == 0x7f, "%s: row %zu col %zu: %02x",
				       isa_name(isa), j / C, j % C, q1[j]);
		}
		free(h);
		free(g);
		free(q1);
		free(q2);
	}
}
END_TEST

/* ---------------------------------------------------------------- */
/* top-k sum, n-way sum                                             */
/* ---------------------------------------------------------------- */

struct cb_rec {
	size_t calls;
	size_t last;
};

static void count_cb(void *ctx, size_t row, void *out_row)
{
	struct cb_rec *c = ctx;
	c->calls++;
	c->last = row;
	(void)out_row;
}

/* nt: streaming stores asked for, no callback (rows at varying
 * alignments: ld is cols + 2) */
static void check_topk(fabep_isa_t isa, fep_k_dtype_t ydt, fep_k_dtype_t odt,
		       size_t cols, int k, int weighted, int nt)
{
	const size_t ny = 40, tokens = 9, ld = cols + 2;
	size_t ys = fep_k_dtype_size(ydt), os = fep_k_dtype_size(odt);
	void *y = xmalloc(ny * ld * ys);
	void *o1 = xmalloc(tokens * ld * os), *o2 = xmalloc(tokens * ld * os);
	int32_t *idx = xmalloc(tokens * k * 4);
	float *w = xmalloc(tokens * k * 4);
	struct cb_rec c1 = { 0, 0 }, c2 = { 0, 0 };
	fep_k_topk_args_t a = {
		.y = y, .y_dt = ydt, .ld_y = ld, .idx = idx, .w = weighted ? w : NULL,
		.k = k, .out = o1, .out_dt = odt, .ld_out = ld, .cols = cols,
		.cb = nt ? NULL : count_cb, .cb_ctx = &c1, .nt = nt,
	};
	size_t t, i;
	int j;

	fill_rows(y, ydt, ny, ld, cols, 0);
	for (t = 0; t < tokens * k; t++) {
		idx[t] = (rnd32() % 6 == 0) ? -1 : (int32_t)(rnd32() % ny);
		w[t] = rnd_unit();
	}
	for (j = 0; j < k; j++)
		idx[2 * k + j] = -1; /* token 2: nothing routed -> zeros */
	fep_k_ops_isa(FABEP_ISA_SCALAR)->topk_sum(&a, 0, tokens);
	a.out = o2;
	a.cb_ctx = &c2;
	fep_k_ops_isa(isa)->topk_sum(&a, 0, tokens);
	EXPECT1(nt ? !c1.calls && !c2.calls :
		c1.calls == tokens && c2.calls == tokens && c2.last == tokens - 1);
	for (t = 0; t < tokens; t++) {
		for (i = 0; i < cols; i++) {
			double want = 0, mag = 0;
			float g1 = ld_row((char *)o1 + t * ld * os, odt, i);
			float g2 = ld_row((char *)o2 + t * ld * os, odt, i);

			for (j = 0; j < k; j++) {
				int32_t r = idx[t * k + j];
				double v;

				if (r < 0)
					continue;
				v = ld_row((const char *)y + r * ld * ys, ydt, i) *
				    (double)(weighted ? w[t * k + j] : 1.0f);
				want += v;
				mag += fabs(v);
			}
			if (t == 2)
				EXPECT1(f2u(g1) == 0 && f2u(g2) == 0);
			/* fp32 accumulation of k terms: k ulps of the magnitude;
			 * bf16 output: plus one bf16 ulp */
			float tol = (float)(mag * (k + 1) * 6e-8) +
				    (odt == FEP_K_BF16 ? fabsf((float)want) / 128 +
				     (float)mag * 6e-8f * (k + 1) : 0);
			EXPECT(fabs(g1 - want) <= tol, "ref topk %a vs %a", g1, want);
			if (!weighted || isa == FABEP_ISA_SCALAR)
				EXPECT(same_f32(g1, g2), "%s topk unweighted",
					      isa_name(isa));
			else
				EXPECT(fabsf(g1 - g2) <= tol + fabsf(g1) / 128 *
					      (odt == FEP_K_BF16), "%s topk %a vs %a",
					      isa_name(isa), g2, g1);
		}
	}
	free(y); free(o1); free(o2); free(idx); free(w);
}

/* Sums that meet NaNs and infinities: each level's output bits are the
 * scalar reference's (the same operations in the same order, the same
 * NaN rule on the way to bf16).  Which of two different NaNs an
 * addition returns is the compiler's choice of operand order, so a
 * call holds one NaN pattern only: a signalling NaN in the rows
 * (unweighted), or a weight that is a NaN with low payload bits set
 * (weighted, the other weights powers of two, so each product is
 * exact and a fused multiply-add rounds as the reference's multiply
 * and add).  Infinities are positive: none cancels into the default
 * NaN. */
START_TEST(test_topk_special)
{
	static const size_t colss[] = { 100, 7168 };
	static const float pw[] = { 0.5f, 1.0f, 2.0f, 4.0f };
	const size_t ny = 24, tokens = 7;
	const int k = 8;
	size_t c, n, t;
	int ydt, odt, nt, wtd;

	FOR_HW_BF16(hw)
	for (c = 0; c < FEP_ARRAY_SIZE(colss); c++)
	for (ydt = 0; ydt < 2; ydt++)
	for (odt = 0; odt < 2; odt++)
	for (nt = 0; nt < 2; nt++)
	for (wtd = 0; wtd < 2; wtd++) {
		size_t cols = colss[c], ys = ydt ? 2 : 4, os = odt ? 2 : 4;
		void *y = xmalloc(ny * cols * ys);
		/* 64-byte aligned rows (7168 columns): streaming stores */
		size_t ob = FEP_ALIGN_UP(tokens * cols * os, 64);
		void *o1 = aligned_alloc(64, ob), *o2 = aligned_alloc(64, ob);
		int32_t *idx = xmalloc(tokens * k * 4);
		float *w = xmalloc(tokens * k * 4);
		fep_k_topk_args_t a = {
			.y = y, .y_dt = (fep_k_dtype_t)ydt, .ld_y = cols, .idx = idx,
			.w = wtd ? w : NULL, .k = k, .out = o1,
			.out_dt = (fep_k_dtype_t)odt, .ld_out = cols, .cols = cols,
			.nt = nt ? 1 : -1,
		};

		ck_assert_ptr_nonnull(o1);
		ck_assert_ptr_nonnull(o2);
		fill_rows(y, a.y_dt, ny, cols, cols, 0);
		for (n = 0; n < ny * cols / 50; n++) {
			size_t at = rnd32() % (ny * cols);
			int nan = !wtd && n % 2;

			if (ydt)
				((uint16_t *)y)[at] = nan ? 0x7f81 : 0x7f80;
			else
				((float *)y)[at] = u2f(nan ? 0x7f800001u : 0x7f800000u);
		}
		for (t = 0; t < tokens * k; t++) {
			idx[t] = (rnd32() % 6 == 0) ? -1 : (int32_t)(rnd32() % ny);
			w[t] = rnd32() % 5 ? pw[rnd32() % 4] : u2f(0x7fc0ffffu);
		}
		fep_k_ops_isa(FABEP_ISA_SCALAR)->topk_sum(&a, 0, tokens);
		FOR_LEVELS(isa) {
			a.out = o2;
			memset(o2, 0xcc, tokens * cols * os);
			fep_k_ops_isa(isa)->topk_sum(&a, 0, tokens);
			EXPECT(!memcmp(o1, o2, tokens * cols * os),
			       "%s topk special y %s out %s cols %zu nt %d weighted %d",
			       isa_name(isa), ydt ? "bf16" : "fp32", odt ? "bf16" : "fp32",
			       cols, nt, wtd);
		}
		free(y); free(o1); free(o2); free(idx); free(w);
	}
}
END_TEST

START_TEST(test_topk)
{
	static const int ks[] = { 1, 2, 8, 70 };
	size_t s;
	unsigned kk;
	int ydt, odt, wt, nt;

	FOR_PF_L1(l1)
	FOR_HW_BF16(hw)
	FOR_LEVELS(isa)
		for (s = 0; s < FEP_ARRAY_SIZE(shapes); s++)
			for (kk = 0; kk < FEP_ARRAY_SIZE(ks); kk++)
				for (ydt = 0; ydt < 2; ydt++)
					for (odt = 0; odt < 2; odt++)
						for (wt = 0; wt < 4; wt++) {
							nt = wt >> 1;
							if (ks[kk] > 64 && (odt || shapes[s] > 100))
								continue;
							check_topk(isa, (fep_k_dtype_t)ydt,
								   (fep_k_dtype_t)odt,
								   shapes[s], ks[kk], wt & 1, nt);
						}
}
END_TEST

static void check_sum(fabep_isa_t isa, fep_k_dtype_t dt, size_t n, int nin,
		      size_t off)
{
	size_t es = fep_k_dtype_size(dt), i;
	void *in[8], *o1 = xmalloc((n + off) * es), *o2 = xmalloc((n + off) * es);
	fep_k_sum_args_t a = { (const void *const *)in, nin, dt, o1, 0 };
	int j;

	for (j = 0; j < nin; j++) {
		in[j] = xmalloc((n + off) * es);
		fill_rows(in[j], dt, 1, n + off, n + off, 1);
	}
	fep_k_ops_isa(FABEP_ISA_SCALAR)->sum(&a, off, off + n);
	a.out = o2;
	fep_k_ops_isa(isa)->sum(&a, off, off + n);
	for (i = off; i < off + n; i++) {
		float g1 = ld_row(o1, dt, i), g2 = ld_row(o2, dt, i), want;

		EXPECT(same_f32(g1, g2), "%s sum n=%d [%zu] %a vs %a",
			      isa_name(isa), nin, i, g2, g1);
		/* independent: left-to-right fp32 sum */
		want = ld_row(in[0], dt, i);
		for (j = 1; j < nin; j++)
			want += ld_row(in[j], dt, i);
		if (dt == FEP_K_BF16)
			want = fep_bf16_to_f32(ref_bf16(want));
		EXPECT1(same_f32(g1, want));
	}
	/* in place into in[0] */
	if (isa != FABEP_ISA_SCALAR) {
		a.out = in[0];
		fep_k_ops_isa(isa)->sum(&a, off, off + n);
		for (i = off; i < off + n; i++)
			EXPECT1(same_f32(ld_row(in[0], dt, i), ld_row(o1, dt, i)));
	}
	for (j = 0; j < nin; j++)
		free(in[j]);
	free(o1);
	free(o2);
}

START_TEST(test_sum)
{
	static const int ns[] = { 1, 2, 3, 8 };
	size_t s;
	unsigned k;
	int dt;

	FOR_HW_BF16(hw)
	FOR_LEVELS(isa) {
		for (s = 0; s < FEP_ARRAY_SIZE(shapes); s++)
			for (k = 0; k < FEP_ARRAY_SIZE(ns); k++)
				for (dt = 0; dt < 2; dt++)
					check_sum(isa, (fep_k_dtype_t)dt, shapes[s], ns[k],
						  s & 1);
		/* streaming path, misaligned start */
		check_sum(isa, FEP_K_F32, FEP_K_NT_BYTES / 4 + 99, 3, 3);
		check_sum(isa, FEP_K_BF16, FEP_K_NT_BYTES / 2 + 99, 2, 5);
	}
}
END_TEST

/* ---------------------------------------------------------------- */
/* permutes                                                         */
/* ---------------------------------------------------------------- */

static void check_perm(fabep_isa_t isa, size_t rows, size_t row_bytes, size_t pad,
		       int nt)
{
	size_t stride = row_bytes + pad, r;
	uint8_t *src = xmalloc(rows * stride + 64), *d1 = xmalloc(rows * stride + 64);
	uint8_t *d2 = xmalloc(rows * stride + 64);
	int32_t *idx = xmalloc(rows * 4), *perm = xmalloc(rows * 4);
	fep_k_perm_args_t a = { src + 1, stride, d1 + 3, stride, row_bytes, idx, nt, NULL };

	for (r = 0; r < rows * stride + 64; r++)
		src[r] = (uint8_t)rnd32();
	for (r = 0; r < rows; r++)
		perm[r] = (int32_t)r;
	for (r = rows; r > 1; r--) { /* shuffle: scatter needs distinct targets */
		size_t j = rnd32() % r;
		int32_t t = perm[r - 1];
		perm[r - 1] = perm[j];
		perm[j] = t;
	}
	for (r = 0; r < rows; r++)
		idx[r] = (r % 7 == 3) ? -1 : perm[r];
	memset(d1, 0xee, rows * stride + 64);
	memset(d2, 0xee, rows * stride + 64);
	fep_k_ops_isa(isa)->gather(&a, 0, rows);
	for (r = 0; r < rows; r++) { /* independent check */
		if (idx[r] < 0)
			EXPECT1(d1[3 + r * stride] == 0xee &&
				  d1[3 + r * stride + row_bytes - 1] == 0xee);
		else
			EXPECT(!memcmp(d1 + 3 + r * stride,
					      src + 1 + idx[r] * stride, row_bytes),
				      "%s gather row %zu", isa_name(isa), r);
	}
	EXPECT1(d1[2] == 0xee);
	a.dst = d2 + 3;
	fep_k_ops_isa(isa)->scatter(&a, 0, rows);
	for (r = 0; r < rows; r++) {
		if (idx[r] >= 0)
			EXPECT(!memcmp(d2 + 3 + idx[r] * stride,
					      src + 1 + r * stride, row_bytes),
				      "%s scatter row %zu", isa_name(isa), r);
	}
	EXPECT1(d2[2] == 0xee && d2[3 + rows * stride] == 0xee);
	/* gather by pairs (didx): source rows in runs, as a record's row
	 * goes to its experts (one run longer than the prefetch's look),
	 * to distinct destinations; some entries skipped */
	{
		int32_t *didx = xmalloc(rows * 4);
		uint8_t *hit = calloc(rows, 1);
		size_t run = 0;
		int32_t cur = 0;

		for (r = 0; r < rows; r++) {
			if (!run) {
				cur = (int32_t)(rnd32() % rows);
				run = r == 0 ? 70 : 1 + rnd32() % 8;
			}
			run--;
			idx[r] = (r % 11 == 5) ? -1 : cur;
			didx[r] = perm[rows - 1 - r];
		}
		memset(d1, 0xee, rows * stride + 64);
		a.dst = d1 + 3;
		a.didx = didx;
		fep_k_ops_isa(isa)->gather(&a, 0, rows);
		for (r = 0; r < rows; r++) {
			if (idx[r] < 0)
				continue;
			hit[didx[r]] = 1;
			EXPECT(!memcmp(d1 + 3 + (size_t)didx[r] * stride,
				       src + 1 + (size_t)idx[r] * stride, row_bytes),
			       "%s gather pair %zu", isa_name(isa), r);
		}
		for (r = 0; r < rows; r++)
			if (!hit[r])
				EXPECT(d1[3 + r * stride] == 0xee &&
				       d1[3 + r * stride + row_bytes - 1] == 0xee,
				       "%s gather pairs wrote row %zu", isa_name(isa), r);
		EXPECT1(d1[2] == 0xee && d1[3 + rows * stride] == 0xee);
		free(didx);
		free(hit);
	}
	free(src); free(d1); free(d2); free(idx); free(perm);
}

START_TEST(test_permute)
{
	FOR_PF_L1(l1)
	FOR_LEVELS(isa) {
		for (int nt = -1; nt <= 1; nt++) { /* never, auto, forced */
			check_perm(isa, 50, 1, 0, nt);
			check_perm(isa, 50, 200, 8, nt);
			check_perm(isa, 33, 14336, 64, nt);
			check_perm(isa, 7, 257, 3, nt);
		}
		/* large: non-temporal path, odd sizes and alignment */
		check_perm(isa, 4000, 1111, 5, 0);
		check_perm(isa, 600, 7168 * 2, 0, 0);
		check_perm(isa, 600, 7168 * 2, 0, -1);
	}
}
END_TEST

/* ---------------------------------------------------------------- */
/* pool and threaded wrappers                                       */
/* ---------------------------------------------------------------- */

struct run_rec {
	_Atomic int hits[64];
	_Atomic int calls;
};

static void run_fn(void *ctx, int tid, int n)
{
	struct run_rec *r = ctx;
	atomic_fetch_add(&r->hits[tid], 1);
	atomic_fetch_add(&r->calls, 1);
	(void)n;
}

struct for_rec {
	_Atomic uint8_t *seen;
	size_t grain;            /* 0: not checked */
	_Atomic int misaligned;  /* a range that starts off a grain */
};

static void for_fn(void *ctx, size_t r0, size_t r1)
{
	struct for_rec *f = ctx;
	size_t i;

	if (f->grain && r0 % f->grain)
		atomic_store(&f->misaligned, 1);
	for (i = r0; i < r1; i++)
		atomic_fetch_add(&f->seen[i], 1);
}

/* idle: counts its calls; a worker thread never runs it */
struct idle_rec {
	_Atomic int calls;
	pthread_t caller;
	_Atomic int wrong_thread;
};

static void idle_fn(void *ctx)
{
	struct idle_rec *r = ctx;

	atomic_fetch_add(&r->calls, 1);
	if (!pthread_equal(pthread_self(), r->caller))
		atomic_store(&r->wrong_thread, 1);
}

START_TEST(test_pool_basic)
{
	static const int counts[] = { 1, 2, 3, 5 };
	unsigned c;

	for (c = 0; c < FEP_ARRAY_SIZE(counts); c++) {
		fep_pool_t *p = NULL;
		struct run_rec rr;
		size_t n, i;
		int t, it;

		ck_assert_int_eq(fep_pool_create(counts[c], -1, 1, &p), 0);
		ck_assert_int_eq(fep_pool_threads(p), counts[c]);
		ck_assert_int_ge(fep_pool_node(p), 0);
		/* the caller once per run, a worker at most once */
		for (it = 0; it < 2000; it++) {
			memset(&rr, 0, sizeof(rr));
			ck_assert_int_eq(fep_pool_run(p, run_fn, &rr), 0);
			ck_assert_int_eq(rr.hits[0], 1);
			for (t = 1; t < counts[c]; t++)
				ck_assert_int_le(rr.hits[t], 1);
			ck_assert_int_le(rr.calls, counts[c]);
		}
		for (n = 0; n < 300; n += 1 + n / 3) {
			size_t grain;
			for (grain = 1; grain < 40; grain += 13) {
				_Atomic uint8_t seen[300];
				struct for_rec f = { seen, grain, 0 };

				memset(seen, 0, sizeof(seen));
				ck_assert_int_eq(fep_pool_for(p, n, grain, for_fn, &f), 0);
				for (i = 0; i < 300; i++)
					ck_assert_int_eq(seen[i], i < n);
				ck_assert_int_eq(f.misaligned, 0);
			}
		}
		/* workers only, the caller idling: every index exactly once;
		 * idle only in the caller, never with one thread */
		for (n = 0; n < 300; n += 1 + n / 3) {
			_Atomic uint8_t seen[300];
			struct for_rec f = { seen, 1 + n % 7, 0 };
			struct idle_rec ir;

			memset(seen, 0, sizeof(seen));
			memset(&ir, 0, sizeof(ir));
			ir.caller = pthread_self();
			ck_assert_int_eq(fep_pool_for_idle(p, n, 1 + n % 7, for_fn, &f,
							   idle_fn, &ir), 0);
			for (i = 0; i < 300; i++)
				ck_assert_int_eq(seen[i], i < n);
			ck_assert_int_eq(f.misaligned, 0);
			ck_assert_int_eq(ir.wrong_thread, 0);
			if (counts[c] == 1 || n == 0)
				ck_assert_int_eq(ir.calls, 0);
		}
		ck_assert_int_eq(fep_pool_for_idle(p, 5, 1, NULL, NULL, idle_fn, NULL),
				 -EINVAL);
		ck_assert_int_eq(fep_pool_run(p, NULL, NULL), -EINVAL);
		fep_pool_destroy(p);
	}
	fep_pool_destroy(NULL);
	ck_assert_int_eq(fep_pool_threads(NULL), 1);
}
END_TEST

/* Waking the workers without work, asleep or spinning, then runs: every
 * index still exactly once, the caller once per run, a worker at most. */
START_TEST(test_pool_wake)
{
	fep_pool_t *p = NULL;
	struct run_rec rr;
	int it, t;

	fep_pool_wake(NULL);
	ck_assert_int_eq(fep_pool_create(1, -1, 1, &p), 0);
	fep_pool_wake(p);
	fep_pool_destroy(p);
	ck_assert_int_eq(fep_pool_create(4, -1, 1, &p), 0);
	memset(&rr, 0, sizeof(rr));
	for (it = 0; it < 40; it++) {
		_Atomic uint8_t seen[1000];
		struct for_rec f = { seen, 3, 0 };
		size_t i, n = 1 + (size_t)it * 23;
		struct timespec ts = { 0, (it % 4) * 3000000L };

		nanosleep(&ts, NULL);  /* 0-9 ms: workers spinning or asleep */
		fep_pool_wake(p);
		if (it % 2)
			fep_pool_wake(p);
		memset(seen, 0, sizeof(seen));
		ck_assert_int_eq(fep_pool_for(p, n, 3, for_fn, &f), 0);
		for (i = 0; i < 1000; i++)
			ck_assert_int_eq(seen[i], i < n);
		ck_assert_int_eq(f.misaligned, 0);
		ck_assert_int_eq(fep_pool_run(p, run_fn, &rr), 0);
	}
	ck_assert_int_eq(rr.hits[0], 40);
	for (t = 1; t < 4; t++)
		ck_assert_int_le(rr.hits[t], 40);
	fep_pool_wake(p);
	fep_pool_destroy(p);  /* right after a wake */
}
END_TEST

/* fep_pool_run: fn runs on the caller and on every worker that starts
 * before the caller's fn returns; the call waits for those, and no worker
 * starts a run that has returned.  Each run has its own record (static:
 * a worker that came too late would still write into it). */
struct join_rec {
	_Atomic int entered;   /* workers that started fn */
	_Atomic int finished;  /* ... and returned from it */
	_Atomic int over;      /* the call has returned */
	_Atomic int after;     /* a worker started after that */
	int hold;              /* tid 0 waits for a worker, which takes 2 ms */
};

#define JOIN_RUNS 300
static struct join_rec join_recs[JOIN_RUNS + 20];

static void join_fn(void *ctx, int tid, int n)
{
	struct join_rec *r = ctx;
	struct timespec ts = { 0, 2000000L };
	int i;

	(void)n;
	if (tid == 0) {
		for (i = 0; r->hold && !atomic_load(&r->entered) && i < 1000; i++)
			nanosleep(&(struct timespec){ 0, 1000000L }, NULL);
		return;
	}
	if (atomic_load(&r->over))
		atomic_store(&r->after, 1);
	atomic_fetch_add(&r->entered, 1);
	if (r->hold)
		nanosleep(&ts, NULL);
	atomic_fetch_add(&r->finished, 1);
}

START_TEST(test_pool_run_late)
{
	cpu_set_t all, one;
	fep_pool_t *p = NULL;
	int i, cpu, skipped = 0;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	for (cpu = 0; cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &all); cpu++)
		;
	ck_assert_int_lt(cpu, CPU_SETSIZE);
	/* One CPU for the caller and 3 workers: a worker runs only when the
	 * caller gives up the CPU, so most runs close before any worker
	 * comes (a run that waited for all would never). */
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	ck_assert_int_eq(fep_pool_create(4, -1, 1, &p), 0);
	for (i = 0; i < JOIN_RUNS; i++) {
		struct join_rec *r = &join_recs[i];

		ck_assert_int_eq(fep_pool_run(p, join_fn, r), 0);
		ck_assert_int_eq(atomic_load(&r->finished), atomic_load(&r->entered));
		atomic_store(&r->over, 1);
		skipped += atomic_load(&r->entered) < 3;
	}
	ck_assert_int_gt(skipped, 0);
	fep_pool_destroy(p);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(all), &all), 0);

	/* Every CPU, tid 0 holding the run until a worker is in: the call
	 * returns only once that worker's 2 ms are over. */
	ck_assert_int_eq(fep_pool_create(3, -1, 1, &p), 0);
	for (i = 0; i < 20; i++) {
		struct join_rec *r = &join_recs[JOIN_RUNS + i];

		r->hold = 1;
		ck_assert_int_eq(fep_pool_run(p, join_fn, r), 0);
		ck_assert_int_ge(atomic_load(&r->entered), 1);
		ck_assert_int_eq(atomic_load(&r->finished), atomic_load(&r->entered));
		atomic_store(&r->over, 1);
	}
	fep_pool_destroy(p);  /* joins the workers: none may start a run now */
	for (i = 0; i < JOIN_RUNS + 20; i++)
		ck_assert_int_eq(atomic_load(&join_recs[i].after), 0);
	fep_pool_destroy(NULL);
	ck_assert_int_eq(fep_pool_run(NULL, join_fn, &join_recs[0]), 0);
}
END_TEST

START_TEST(test_pool_config)
{
	fep_pool_t *p = NULL;
	int ncpu;
	char *mem;
	size_t i;

	/* default: cores of the node / local ranks, at least 1 */
	unsetenv("FABEP_THREADS");
	ck_assert_int_eq(fep_pool_create(0, -1, 1, &p), 0);
	ncpu = fep_pool_threads(p);
	ck_assert_int_ge(ncpu, 1);
	fep_pool_destroy(p);
	ck_assert_int_eq(fep_pool_create(0, -1, 1000, &p), 0);
	ck_assert_int_eq(fep_pool_threads(p), 1);
	fep_pool_destroy(p);
	ck_assert_int_eq(fep_pool_create(0, -1, 2, &p), 0);
	ck_assert_int_eq(fep_pool_threads(p), ncpu / 2 ? ncpu / 2 : 1);
	fep_pool_destroy(p);

	setenv("FABEP_THREADS", "3", 1);
	ck_assert_int_eq(fep_pool_create(0, -1, 1, &p), 0);
	ck_assert_int_eq(fep_pool_threads(p), 3);
	mem = fep_pool_alloc(p, 100, 4096);
	ck_assert_ptr_nonnull(mem);
	for (i = 0; i < 100 * 4096; i++)
		EXPECT1(mem[i] == 0);
	fep_numa_free(mem, 100 * 4096);
	fep_pool_destroy(p);
	setenv("FABEP_THREADS", "lots", 1);
	ck_assert_int_eq(fep_pool_create(0, -1, 1, &p), -EINVAL);
	unsetenv("FABEP_THREADS");

	setenv("FABEP_NUMA_NODE", "0", 1);
	ck_assert_int_eq(fep_pool_default_node(5), 0);
	setenv("FABEP_NUMA_NODE", "x", 1);
	ck_assert_int_eq(fep_pool_default_node(5), -EINVAL);
	unsetenv("FABEP_NUMA_NODE");
	ck_assert_int_eq(fep_pool_default_node(0), 0);
	ck_assert_int_ge(fep_pool_default_node(-1), 0);
	if (numa_available() >= 0)
		ck_assert_int_eq(fep_pool_create(1, 4000, 1, &p), -EINVAL);
	ck_assert_int_eq(fep_pool_create(1, -1, 1, NULL), -EINVAL);
	mem = fep_numa_alloc(1 << 20, 0);
	ck_assert_ptr_nonnull(mem);
	mem[0] = 1;
	fep_numa_free(mem, 1 << 20);
}
END_TEST

START_TEST(test_mt_wrappers)
{
	const size_t rows = 37, cols = 2880;
	fep_pool_t *p = NULL;
	float *in = xmalloc(rows * cols * 4), *gamma = xmalloc(cols * 4);
	float *o1 = xmalloc(rows * cols * 4), *o2 = xmalloc(rows * cols * 4);
	uint16_t *h1 = xmalloc(rows * cols * 2), *h2 = xmalloc(rows * cols * 2);
	uint8_t *q1 = xmalloc(rows * cols), *q2 = xmalloc(rows * cols);
	float s1[37 * 23], s2[37 * 23];
	int32_t idx[37];
	const void *ins[2] = { in, o1 };
	size_t i;

	fill_rows(in, FEP_K_F32, rows, cols, cols, 1);
	for (i = 0; i < cols; i++)
		gamma[i] = rnd_unit();
	for (i = 0; i < rows; i++)
		idx[i] = (int32_t)(rows - 1 - i);
	ck_assert_int_eq(fep_pool_create(3, -1, 1, &p), 0);

	ck_assert_int_eq(fep_k_f32_to_bf16_mt(NULL, in, h1, rows * cols), 0);
	ck_assert_int_eq(fep_k_f32_to_bf16_mt(p, in, h2, rows * cols), 0);
	EXPECT1(!memcmp(h1, h2, rows * cols * 2));
	ck_assert_int_eq(fep_k_bf16_to_f32_mt(NULL, h1, o1, rows * cols), 0);
	ck_assert_int_eq(fep_k_bf16_to_f32_mt(p, h1, o2, rows * cols), 0);
	EXPECT1(!memcmp(o1, o2, rows * cols * 4));
	{
		fep_k_fp8_args_t a = { in, FEP_K_F32, cols, q1, cols, s1, 23, cols,
				       128, 0, 0, 0 };
		ck_assert_int_eq(fep_k_fp8_quant_mt(NULL, &a, rows), 0);
		a.out = q2;
		a.scales = s2;
		ck_assert_int_eq(fep_k_fp8_quant_mt(p, &a, rows), 0);
		EXPECT1(!memcmp(q1, q2, rows * cols) && !memcmp(s1, s2, sizeof(s1)));
		a.block = 100;
		ck_assert_int_eq(fep_k_fp8_quant_mt(p, &a, rows), -EINVAL);
		a.block = 128;
		a.ld_scales = 22;
		ck_assert_int_eq(fep_k_fp8_quant_mt(p, &a, rows), -EINVAL);
		a.ld_scales = 23;
		a.in_dt = FEP_K_FP8;
		ck_assert_int_eq(fep_k_fp8_quant_mt(p, &a, rows), -EINVAL);
	}
	{
		fep_k_fp8dq_args_t d = { q1, cols, s1, 23, 128, o1, FEP_K_F32, cols, cols, 0 };
		ck_assert_int_eq(fep_k_fp8_dequant_mt(NULL, &d, rows), 0);
		d.out = o2;
		ck_assert_int_eq(fep_k_fp8_dequant_mt(p, &d, rows), 0);
		EXPECT1(!memcmp(o1, o2, rows * cols * 4));
		d.out = NULL;
		ck_assert_int_eq(fep_k_fp8_dequant_mt(p, &d, rows), -EINVAL);
	}
	{
		fep_k_rmsnorm_args_t a = {
			.in = h1, .in_dt = FEP_K_BF16, .ld_in = cols, .gamma = gamma,
			.eps = 1e-5f, .out = q1, .out_dt = FEP_K_FP8, .ld_out = cols,
			.scales = s1, .ld_scales = 1, .cols = cols,
		};
		ck_assert_int_eq(fep_k_rmsnorm_mt(NULL, &a, rows), 0);
		a.out = q2;
		a.scales = s2;
		ck_assert_int_eq(fep_k_rmsnorm_mt(p, &a, rows), 0);
		EXPECT1(!memcmp(q1, q2, rows * cols) && !memcmp(s1, s2, rows * 4));
		a.eps = -1;
		ck_assert_int_eq(fep_k_rmsnorm_mt(p, &a, rows), -EINVAL);
		a.eps = 0;
		a.gamma = NULL;
		ck_assert_int_eq(fep_k_rmsnorm_mt(p, &a, rows), -EINVAL);
	}
	{
		fep_k_sum_args_t a = { ins, 2, FEP_K_F32, o2, 0 };
		const void *bad[2] = { in, NULL };

		memcpy(o1, in, rows * cols * 4);
		ck_assert_int_eq(fep_k_sum_mt(p, &a, rows * cols), 0);
		for (i = 0; i < rows * cols; i++)
			EXPECT1(same_f32(o2[i], in[i] + in[i]));
		a.in = bad;
		ck_assert_int_eq(fep_k_sum_mt(p, &a, 10), -EINVAL);
		a.in = ins;
		a.n = 0;
		ck_assert_int_eq(fep_k_sum_mt(p, &a, 10), -EINVAL);
	}
	{
		int32_t tk[37 * 2];
		float w[37 * 2];
		fep_k_topk_args_t a = { in, FEP_K_F32, cols, tk, w, 2, o1, FEP_K_F32,
					cols, cols, NULL, NULL, 0 };

		for (i = 0; i < rows * 2; i++) {
			tk[i] = (int32_t)(rnd32() % rows);
			w[i] = rnd_unit();
		}
		ck_assert_int_eq(fep_k_topk_sum_mt(NULL, &a, rows), 0);
		a.out = o2;
		ck_assert_int_eq(fep_k_topk_sum_mt(p, &a, rows), 0);
		for (i = 0; i < rows * cols; i++)
			EXPECT1(same_f32(o1[i], o2[i]));
		a.k = 0;
		ck_assert_int_eq(fep_k_topk_sum_mt(p, &a, rows), -EINVAL);
	}
	{
		fep_k_perm_args_t a = { in, cols * 4, o1, cols * 4, cols * 4, idx, 0, NULL };

		ck_assert_int_eq(fep_k_gather_mt(p, &a, rows), 0);
		for (i = 0; i < rows; i++)
			EXPECT1(!memcmp(o1 + i * cols, in + (rows - 1 - i) * cols, cols * 4));
		a.dst = o2;
		ck_assert_int_eq(fep_k_scatter_mt(p, &a, rows), 0);
		EXPECT1(!memcmp(o1, o2, rows * cols * 4));
		a.dst_stride = 4;
		ck_assert_int_eq(fep_k_gather_mt(p, &a, rows), -EINVAL);
	}
	fep_pool_destroy(p);
	free(in); free(gamma); free(o1); free(o2); free(h1); free(h2); free(q1); free(q2);
}
END_TEST

/* fep_k_gather_blocks_mt: random disjoint (some adjacent, some empty)
 * destination blocks, with and without idle, against a scalar loop; rows
 * outside the blocks stay untouched.  Every fourth iteration the blocks
 * are of (source, destination) pairs (didx: a permutation). */
START_TEST(test_gather_blocks)
{
	enum { ROWS = 300, SRC = 97 };
	static const int counts[] = { 1, 2, 3 };
	size_t cols[] = { 1, 13, 1100 };  /* 1100 * 4 bytes: vector rows */
	int c, ci, it;

	for (c = 0; c < 3; c++) {
		fep_pool_t *p = NULL;

		ck_assert_int_eq(fep_pool_create(counts[c], -1, 1, &p), 0);
		for (ci = 0; ci < 3; ci++)
			for (it = 0; it < 40; it++) {
				size_t rb = cols[ci] * 4, nb = 0, r, i;
				float *src = malloc(SRC * rb), *dst = malloc(ROWS * rb);
				float *want = malloc(ROWS * rb);
				int32_t idx[ROWS], didx[ROWS];
				uint32_t start[ROWS], pre[ROWS + 1];
				fep_k_perm_args_t a = { src, rb, dst, rb, rb, idx, 0,
							it % 4 == 3 ? didx : NULL };
				struct idle_rec ir;

				ck_assert(src && dst && want);
				for (r = 0; r < ROWS; r++)
					didx[r] = (int32_t)r;
				for (r = ROWS; r > 1; r--) {
					size_t j = rnd32() % r;
					int32_t t = didx[r - 1];

					didx[r - 1] = didx[j];
					didx[j] = t;
				}
				for (i = 0; i < SRC * cols[ci]; i++)
					src[i] = (float)rnd32();
				for (i = 0; i < ROWS * cols[ci]; i++)
					dst[i] = want[i] = -1.0f;
				for (r = 0; r < ROWS; r++)
					idx[r] = (int32_t)(rnd32() % SRC);
				/* blocks: runs of random length, each kept with
				 * probability 1/2 (empty ones too) */
				pre[0] = 0;
				for (r = 0; r < ROWS;) {
					size_t len = rnd32() % 40;

					len = FEP_MIN(len, ROWS - r);
					if (rnd32() & 1) {
						start[nb] = (uint32_t)r;
						pre[nb + 1] = pre[nb] + (uint32_t)len;
						for (i = r; i < r + len; i++)
							memcpy(want + (a.didx ? (size_t)didx[i] : i) *
							       cols[ci],
							       src + (size_t)idx[i] * cols[ci], rb);
						nb++;
					}
					r += len ? len : 1;
				}
				a.nt = it % 3 - 1;
				memset(&ir, 0, sizeof(ir));
				ir.caller = pthread_self();
				ck_assert_int_eq(fep_k_gather_blocks_mt(p, &a, start, pre, nb,
					it & 1 ? idle_fn : NULL, &ir), 0);
				ck_assert_int_eq(ir.wrong_thread, 0);
				ck_assert_msg(!memcmp(dst, want, ROWS * rb),
					      "threads %d cols %zu iteration %d", counts[c],
					      cols[ci], it);
				free(src);
				free(dst);
				free(want);
			}
		{
			fep_k_perm_args_t bad = { NULL, 4, NULL, 4, 4, NULL, 0, NULL };
			uint32_t st = 0, pr[2] = { 0, 1 };

			ck_assert_int_eq(fep_k_gather_blocks_mt(p, &bad, &st, pr, 1,
								NULL, NULL), -EINVAL);
		}
		fep_pool_destroy(p);
	}
}
END_TEST

/* fep_huge_alloc: below 2 MiB plain memory; from 2 MiB aligned to it,
 * advised as huge pages, whole and writable, and freed by free(). */
START_TEST(test_huge_alloc)
{
	static const size_t sizes[] = { 1, 4096, ((size_t)2 << 20) - 1,
					(size_t)2 << 20, ((size_t)5 << 20) + 123 };
	size_t k;

	for (k = 0; k < FEP_ARRAY_SIZE(sizes); k++) {
		uint8_t *p = fep_huge_alloc(sizes[k]);

		ck_assert_ptr_nonnull(p);
		memset(p, 0xa5, sizes[k]);
		ck_assert_int_eq(p[sizes[k] - 1], 0xa5);
		if (sizes[k] >= FEP_HUGE_PAGE)
			EXPECT((uintptr_t)p % FEP_HUGE_PAGE == 0,
			       "%zu bytes at %p: not 2 MiB-aligned", sizes[k], (void *)p);
		free(p);
	}
}
END_TEST

START_TEST(test_huge_alloc_advised)
{
	size_t n = (size_t)6 << 20;
	uint8_t *p;
	int hg;

	if (!fep_test_have_thp())
		fep_test_skip("this kernel has no transparent huge pages");
	p = fep_huge_alloc(n);
	ck_assert_ptr_nonnull(p);
	memset(p, 0, n);
	hg = fep_test_smaps_hg(p);
	if (hg < 0) {
		free(p);
		fep_test_skip("/proc/self/smaps gives no VmFlags here");
	}
	EXPECT(hg == 1, "%zu bytes from fep_huge_alloc: their mapping is not "
	       "advised as huge pages (no \"hg\" in its VmFlags)", n);
	free(p);
}
END_TEST

static Suite *kernels_suite(int forked)
{
	Suite *s = suite_create("kernels");
	TCase *tc;

	tc = tcase_create("isa");
	tcase_add_test(tc, test_isa_names);
	tcase_add_test(tc, test_isa_avx512_here);
	if (forked) { /* need a fresh process: the level is chosen once */
		tcase_add_test(tc, test_isa_env);
		tcase_add_test(tc, test_isa_env_bad);
	}
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);

	tc = tcase_create("bf16");
	tcase_add_test(tc, test_bf16_reference);
	tcase_add_test(tc, test_bf16_vector);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);

	tc = tcase_create("fp8");
	tcase_add_test(tc, test_fp8_table);
	tcase_add_test(tc, test_fp8_scale_rules);
	tcase_add_test(tc, test_fp8_bf16_all);
	tcase_add_test(tc, test_fp8_f32_all);
	tcase_add_test(tc, test_fp8_table_vector);
	tcase_add_test(tc, test_fp8_zero_blocks);
	tcase_add_test(tc, test_fp8_dequant_edges);
	tcase_add_test(tc, test_fp8_vector);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);

	tc = tcase_create("rmsnorm");
	tcase_add_test(tc, test_rmsnorm);
	tcase_add_test(tc, test_rmsnorm_nan);
	tcase_add_test(tc, test_rmsnorm_edges);
	tcase_add_test(tc, test_rmsnorm_order);
	tcase_add_test(tc, test_rmsnorm_no_scratch);
	tcase_add_test(tc, test_rmsnorm_small_stack);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);

	tc = tcase_create("reduce");
	tcase_add_test(tc, test_topk);
	tcase_add_test(tc, test_topk_special);
	tcase_add_test(tc, test_sum);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);

	tc = tcase_create("permute");
	tcase_add_test(tc, test_permute);
	tcase_set_timeout(tc, 20);
	suite_add_tcase(s, tc);

	tc = tcase_create("pool");
	tcase_add_test(tc, test_pool_basic);
	tcase_add_test(tc, test_pool_wake);
	tcase_add_test(tc, test_pool_run_late);
	tcase_add_test(tc, test_pool_config);
	tcase_add_test(tc, test_mt_wrappers);
	tcase_add_test(tc, test_gather_blocks);
	tcase_add_test(tc, test_huge_alloc);
	tcase_add_test(tc, test_huge_alloc_advised);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return s;
}

/* Which levels run: all that the CPU has (the others are reported as
 * skipped), or with FABEP_TEST_ISA=avx2|avx512 that one only, and exit
 * status 77 (automake's SKIP) where the CPU lacks it. */
static int choose_levels(void)
{
	const char *only = getenv("FABEP_TEST_ISA");
	fabep_isa_t max, lvl, i;
	int st = 0;
	pid_t pid;

	/* detected in a child: the first use in this process picks the
	 * level from FABEP_ISA, which test_isa_env sets in its own child */
	pid = fork();
	if (pid == 0)
		fep_test_exit((int)fep_k_isa_max());
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
		fprintf(stderr, "test_kernels: cannot detect the CPU's level\n");
		return 99;
	}
	max = (fabep_isa_t)WEXITSTATUS(st);

	test_hi = max;
	if (only) {
		if (fep_k_isa_parse(only, &lvl) || lvl == FABEP_ISA_SCALAR) {
			fprintf(stderr, "test_kernels: FABEP_TEST_ISA=%s is not avx2 "
				"or avx512\n", only);
			return 99;
		}
		if (lvl > max) {
			printf("test_kernels: SKIP: %s kernels: this CPU lacks %s\n",
			       isa_name(lvl), isa_name(lvl));
			return 77;
		}
		test_lo = test_hi = lvl;
	}
	printf("test_kernels: ISA levels tested against the scalar reference:");
	FOR_VECTOR_LEVELS(l)
		printf(" %s", isa_name(l));
	if (test_lo > test_hi)
		printf(" none");
	printf("\n");
	for (i = FABEP_ISA_AVX2; i <= FABEP_ISA_AVX512; i = (fabep_isa_t)(i + 1))
		if (i > max)
			printf("test_kernels: SKIPPED: %s (not on this CPU)\n",
			       isa_name(i));
	fflush(stdout);
	return 0;
}

int main(void)
{
	SRunner *sr;
	int forked, ret;

	ret = choose_levels();
	if (ret)
		return ret;

	/* probe the fork mode (CK_FORK=no turns it off) */
	sr = srunner_create(suite_create("probe"));
	forked = srunner_fork_status(sr) != CK_NOFORK;
	srunner_free(sr);

	return fep_test_run_suite(kernels_suite(forked));
}
