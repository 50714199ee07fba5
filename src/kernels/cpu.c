/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * cpu.c - CPU feature detection and the kernel dispatch table, filled
 * once (pthread_once) from the CPU's features and FABEP_ISA.
 */
#include "config.h"

#include <cpuid.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "kernels/kernels.h"

static const struct fep_k_ops ops_scalar = {
	.isa = FABEP_ISA_SCALAR,
	.bf16_to_f32 = fep_k_bf16_to_f32_scalar,
	.f32_to_bf16 = fep_k_f32_to_bf16_scalar,
	.sum = fep_k_sum_scalar,
	.fp8_quant = fep_k_fp8_quant_scalar,
	.fp8_dequant = fep_k_fp8_dequant_scalar,
	.rmsnorm = fep_k_rmsnorm_scalar,
	.topk_sum = fep_k_topk_sum_scalar,
	.gather = fep_k_gather_scalar,
	.scatter = fep_k_scatter_scalar,
};

static const struct fep_k_ops ops_avx2 = {
	.isa = FABEP_ISA_AVX2,
	.bf16_to_f32 = fep_k_bf16_to_f32_avx2,
	.f32_to_bf16 = fep_k_f32_to_bf16_avx2,
	.sum = fep_k_sum_avx2,
	.fp8_quant = fep_k_fp8_quant_avx2,
	.fp8_dequant = fep_k_fp8_dequant_avx2,
	.rmsnorm = fep_k_rmsnorm_avx2,
	.topk_sum = fep_k_topk_sum_avx2,
	.gather = fep_k_gather_avx2,
	.scatter = fep_k_scatter_avx2,
};

static const struct fep_k_ops ops_avx512 = {
	.isa = FABEP_ISA_AVX512,
	.bf16_to_f32 = fep_k_bf16_to_f32_avx512,
	.f32_to_bf16 = fep_k_f32_to_bf16_avx512,
	.sum = fep_k_sum_avx512,
	.fp8_quant = fep_k_fp8_quant_avx512,
	.fp8_dequant = fep_k_fp8_dequant_avx512,
	.rmsnorm = fep_k_rmsnorm_avx512,
	.topk_sum = fep_k_topk_sum_avx512,
	.gather = fep_k_gather_avx512,
	.scatter = fep_k_scatter_avx512,
};

int fep_k_hw_bf16;
int fep_k_vbmi;
int fep_k_nt_fp8 = 1;
int fep_k_pf_l1;

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static fabep_isa_t isa_max = FABEP_ISA_SCALAR;
static fabep_isa_t isa_chosen = FABEP_ISA_SCALAR;

/* F16C from CPUID.1:ECX: clang (14) knows no "f16c" for
 * __builtin_cpu_supports.  Only asked after AVX2, whose check covers the
 * OS saving the YMM state that F16C uses. */
static int cpu_has_f16c(void)
{
	unsigned a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static void isa_detect(void)
{
	const char *env = NULL;
	fabep_isa_t want;

	__builtin_cpu_init();
	/* __builtin_cpu_supports also checks that the OS saves the state
	 * (XGETBV), so a feature reported here is usable. */
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	    cpu_has_f16c()) {
		isa_max = FABEP_ISA_AVX2;
		if (__builtin_cpu_supports("avx512f") &&
		    __builtin_cpu_supports("avx512bw") &&
		    __builtin_cpu_supports("avx512vl") &&
		    __builtin_cpu_supports("avx512dq"))
			isa_max = FABEP_ISA_AVX512;
	}
	if (isa_max == FABEP_ISA_AVX512 && __builtin_cpu_supports("avx512bf16"))
		fep_k_hw_bf16 = 1;
	if (isa_max == FABEP_ISA_AVX512 && __builtin_cpu_supports("avx512vbmi"))
		fep_k_vbmi = 1;
	fep_k_nt_fp8 = !__builtin_cpu_is("amd");
	fep_k_pf_l1 = __builtin_cpu_is("amd");
	isa_chosen = isa_max;
	if (fep_env_str("FABEP_ISA", &env) > 0 && env) {
		if (fep_k_isa_parse(env, &want) < 0) {
			fep_warn("FABEP_ISA=%s: expected scalar|avx2|avx512; using %s",
				 env, fabep_isa_name(isa_max));
		} else if (want > isa_max) {
			fep_warn("FABEP_ISA=%s: this CPU supports at most %s; using it",
				 env, fabep_isa_name(isa_max));
		} else {
			isa_chosen = want;
		}
	}
	fep_dbg("kernels: isa %s (cpu max %s%s%s)%s%s", fabep_isa_name(isa_chosen),
		fabep_isa_name(isa_max), fep_k_hw_bf16 ? ", avx512_bf16" : "",
		fep_k_vbmi ? ", avx512_vbmi" : "",
		fep_k_nt_fp8 ? "" : "; FP8 dequantization and bf16 quantization "
		"without streaming stores",
		fep_k_pf_l1 ? "; top-k sum and row gather prefetching into L1" : "");
}

int fep_k_isa_parse(const char *s, fabep_isa_t *isa)
{
	if (!s || !isa)
		return -EINVAL;
	if (!strcmp(s, "scalar"))
		*isa = FABEP_ISA_SCALAR;
	else if (!strcmp(s, "avx2"))
		*isa = FABEP_ISA_AVX2;
	else if (!strcmp(s, "avx512"))
		*isa = FABEP_ISA_AVX512;
	else
		return -EINVAL;
	return 0;
}

fabep_isa_t fep_k_isa_max(void)
{
	pthread_once(&isa_once, isa_detect);
	return isa_max;
}

const struct fep_k_ops *fep_k_ops_isa(fabep_isa_t isa)
{
	pthread_once(&isa_once, isa_detect);
	if ((int)isa < 0 || isa > isa_max)
		return NULL;
	switch (isa) {
	case FABEP_ISA_SCALAR: return &ops_scalar;
	case FABEP_ISA_AVX2: return &ops_avx2;
	case FABEP_ISA_AVX512: return &ops_avx512;
	}
	return NULL;
}

const struct fep_k_ops *fep_k_ops(void)
{
	pthread_once(&isa_once, isa_detect);
	return fep_k_ops_isa(isa_chosen);
}

FEP_EXPORT fabep_isa_t fabep_isa(void)
{
	pthread_once(&isa_once, isa_detect);
	return isa_chosen;
}

FEP_EXPORT const char *fabep_isa_name(fabep_isa_t isa)
{
	switch (isa) {
	case FABEP_ISA_SCALAR: return "scalar";
	case FABEP_ISA_AVX2: return "avx2";
	case FABEP_ISA_AVX512: return "avx512";
	}
	return "unknown";
}

const char *fep_k_dtype_name(fep_k_dtype_t dt)
{
	switch (dt) {
	case FEP_K_F32: return "fp32";
	case FEP_K_BF16: return "bf16";
	case FEP_K_FP8: return "fp8";
	}
	return "unknown";
}

