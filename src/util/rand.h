/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * rand.h - the xorshift64* generator the tests and tools make their
 * deterministic data with (header only; not used by the library).
 */
#ifndef FEP_RAND_H
#define FEP_RAND_H

#include <stdint.h>

static inline uint64_t fep_xorshift(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

#endif
