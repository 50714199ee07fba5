/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz_rmsnorm.c - RMSNorm (src/kernels/rmsnorm.c) at every vector level
 * this CPU has, against the scalar reference, on rows the input
 * describes: input and output dtypes, residual, eps, weight offset, the
 * FP8 scale bound and power-of-two rounding, rows of any length (past
 * the 8192 values the vector levels keep between passes), calls of one
 * row or of all, and values drawn from a seed with chosen bit patterns
 * (NaN, inf, zeros, huge, subnormal) put at chosen places in the rows and
 * in gamma.  The levels' shortcuts (the FP8 amax from max|h * g|, the
 * encoding without clamp, the short bf16 rounding) must give the
 * reference's bits: every output value, every FP8 scale and the residual
 * written back, an fp32 or bf16 NaN matching any NaN, FP8 codes exactly.
 *
 * Input: flags, cols, rows, eps, weight offset, seed; then for x and
 * for gamma a count and (place, fp32 bits) pairs.
 */
#include "config.h"

#include <math.h>

#include "kernels/kernels.h"
#include "kernels/simd.h"

#include "fuzz.h"

#define FUZZ_MAX_ROWS 4
#define FUZZ_MAX_COLS 9000

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	fep_k_isa_max(); /* the CPU's detection, once */
	return 0;
}

static uint32_t xs(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

static int is_nan_bits(uint32_t u)
{
	return (u & 0x7fffffffu) > 0x7f800000u;
}

/* Value i of a buffer of dt as fp32 bits */
static uint32_t bits_at(const void *p, fep_k_dtype_t dt, size_t i)
{
	if (dt == FEP_K_F32)
		return fep_f2u(((const float *)p)[i]);
	if (dt == FEP_K_BF16)
		return (uint32_t)((const uint16_t *)p)[i] << 16;
	return ((const uint8_t *)p)[i];
}

static int same_value(uint32_t a, uint32_t b, fep_k_dtype_t dt)
{
	/* FP8 codes exactly, NaN codes included: a NaN code comes from one
	 * NaN operand (h, gamma, or inf * 0's default NaN) or from a row
	 * whose sum is a NaN, which is 0x7f throughout at every level */
	if (dt == FEP_K_FP8)
		return a == b;
	return a == b || (is_nan_bits(a) && is_nan_bits(b));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
	static const float epss[] = { 0.0f, 1e-6f, 1e-5f, 1.0f, 1e-30f, 3e38f };
	static const float ubs[] = { 0.0f, 1e-3f, 1.0f, 1e4f };
	struct fuzz_in in = { data, n };
	uint8_t flags = fuzz_u8(&in);
	fep_k_dtype_t idt = flags & 1 ? FEP_K_F32 : FEP_K_BF16;
	fep_k_dtype_t odt = (fep_k_dtype_t)((flags >> 1) % 3);
	int with_res = flags >> 3 & 1, one_row = flags >> 4 & 1;
	size_t cols = 1 + fuzz_u16(&in) % FUZZ_MAX_COLS;
	size_t rows = 1 + fuzz_u8(&in) % FUZZ_MAX_ROWS;
	uint8_t e = fuzz_u8(&in);
	float wo = (e >> 4) & 1 ? 1.0f : 0.0f;
	uint32_t seed = fuzz_u32(&in) | 1, amp = 1 + (seed >> 24) % 40;
	int shift = (int)((seed >> 16) & 0xff) % 64;
	size_t es = fep_k_dtype_size(idt), os = fep_k_dtype_size(odt);
	size_t ld = cols + (flags >> 5), i, r, k, cnt;
	char *x = malloc(rows * ld * es), *res0 = malloc(rows * ld * es);
	char *res_ref = malloc(rows * ld * es), *res_v = malloc(rows * ld * es);
	char *out_ref = malloc(rows * ld * os), *out_v = malloc(rows * ld * os);
	float *gamma = malloc(cols * sizeof(float));
	float sc_ref[FUZZ_MAX_ROWS], sc_v[FUZZ_MAX_ROWS];
	fep_k_rmsnorm_args_t a = {
		.in = x, .in_dt = idt, .ld_in = ld, .ld_res = ld,
		.gamma = gamma, .eps = epss[e % 6], .weight_offset = wo,
		.out_dt = odt, .ld_out = ld, .ld_scales = 1,
		.scale_ub = ubs[(e >> 5) & 3], .pow2 = e >> 7, .cols = cols,
		.nt = (e >> 3) & 1, /* streaming stores where aligned */
	};
	fabep_isa_t isa, top = fep_k_isa_max();
	int hw, hw0 = fep_k_hw_bf16;

	if (!x || !res0 || !res_ref || !res_v || !out_ref || !out_v || !gamma)
		abort();
	/* values of 2^(-amp-shift)..2^(amp-shift) from the seed, then the
	 * chosen ones */
	for (i = 0; i < rows * ld; i++) {
		float v = ldexpf((float)(int32_t)xs(&seed) / 2147483648.0f,
				 (int)(xs(&seed) % (2 * amp)) - (int)amp - shift);

		if (idt == FEP_K_F32) {
			((float *)x)[i] = v;
			((float *)res0)[i] = -0.5f * v;
		} else {
			((uint16_t *)x)[i] = fep_f32_to_bf16(v);
			((uint16_t *)res0)[i] = fep_f32_to_bf16(0.25f * v);
		}
	}
	for (i = 0; i < cols; i++)
		gamma[i] = (float)(int32_t)xs(&seed) / 1073741824.0f;
	for (cnt = fuzz_u8(&in) % 32; cnt; cnt--) {
		size_t at = fuzz_u16(&in) % (rows * ld);
		uint32_t b = fuzz_u32(&in);

		if (idt == FEP_K_F32)
			((float *)x)[at] = fep_u2f(b);
		else
			((uint16_t *)x)[at] = (uint16_t)(b >> 16);
	}
	for (cnt = fuzz_u8(&in) % 16; cnt; cnt--) {
		size_t at = fuzz_u16(&in) % cols;

		gamma[at] = fep_u2f(fuzz_u32(&in));
	}

	a.residual = with_res ? res_ref : NULL;
	a.out = out_ref;
	a.scales = sc_ref;
	memcpy(res_ref, res0, rows * ld * es);
	if (fep_k_rmsnorm_check(&a))
		goto done; /* refused, as the library refuses it: not a finding */
	fep_k_ops_isa(FABEP_ISA_SCALAR)->rmsnorm(&a, 0, rows);

	for (hw = hw0; hw >= 0; hw--) {
		fep_k_hw_bf16 = hw;
		for (isa = FABEP_ISA_AVX2; isa <= top; isa = (fabep_isa_t)(isa + 1)) {
			memcpy(res_v, res0, rows * ld * es);
			memset(out_v, 0xa5, rows * ld * os);
			a.residual = with_res ? res_v : NULL;
			a.out = out_v;
			a.scales = sc_v;
			if (one_row)
				for (r = 0; r < rows; r++)
					fep_k_ops_isa(isa)->rmsnorm(&a, r, r + 1);
			else
				fep_k_ops_isa(isa)->rmsnorm(&a, 0, rows);
			for (r = 0; r < rows; r++) {
				if (odt == FEP_K_FP8)
					FUZZ_CHECK(same_value(fep_f2u(sc_v[r]),
							      fep_f2u(sc_ref[r]), FEP_K_F32));
				for (i = 0; i < cols; i++) {
					k = r * ld + i;
					FUZZ_CHECK(same_value(bits_at(out_v, odt, k),
							      bits_at(out_ref, odt, k), odt));
					if (with_res)
						FUZZ_CHECK(same_value(bits_at(res_v, idt, k),
								      bits_at(res_ref, idt, k),
								      idt));
				}
			}
		}
	}
	fep_k_hw_bf16 = hw0;
done:
	free(x); free(res0); free(res_ref); free(res_v);
	free(out_ref); free(out_v); free(gamma);
	return 0;
}
