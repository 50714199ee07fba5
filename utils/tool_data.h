/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * tool_data.h - the test data helpers the tools share (header only, so
 * tools that do not link common.c can use them): a xorshift64* generator
 * bf16 conversion (round to nearest even; inputs here are finite), and the
 * values of the FP8 e4m3fn codes.
 */
#ifndef FEP_UTILS_TOOL_DATA_H
#define FEP_UTILS_TOOL_DATA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "util/rand.h"

static inline uint64_t rnd(uint64_t *s)
{
	return fep_xorshift(s);
}

static inline uint16_t f2bf(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* e4m3fn code -> value, for every code (NaN codes 0x7f, 0xff not used) */
static inline void e4m3_lut(float lut[256])
{
	for (int c = 0; c < 256; c++) {
		int ex = (c >> 3) & 15, mt = c & 7;
		float v = ex ? ldexpf(1.0f + mt / 8.0f, ex - 7) : ldexpf((float)mt, -9);

		lut[c] = c & 0x80 ? -v : v;
	}
}

#endif
