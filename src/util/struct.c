/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * struct.c - the size rule of the structs a caller allocates (fabep.h,
 * "Extensible structs"): each opens with size_t size, inputs are copied
 * in by it and outputs written up to it.
 */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "util/util.h"

/* The caller's size field, checked against the first extensible layout
 * (min) and the bound that keeps a garbage size from reading far. */
static int fep_struct_size(const char *fn, const char *type, const void *p,
			   size_t min, size_t *size)
{
	size_t sz;

	memcpy(&sz, p, sizeof(sz));
	if (sz == 0) {
		fep_err("%s: %s.size is 0: set it to sizeof(%s) before the "
			"call", fn, type, type);
		return -EINVAL;
	}
	if (sz < min) {
		fep_err("%s: %s.size %zu is smaller than the %zu bytes of its "
			"first extensible layout (fabep 0.2)", fn, type, sz, min);
		return -EINVAL;
	}
	if (sz > FABEP_STRUCT_SIZE_MAX) {
		fep_err("%s: %s.size %zu is above %d: not a struct size (was it "
			"set?)", fn, type, sz, FABEP_STRUCT_SIZE_MAX);
		return -EINVAL;
	}
	*size = sz;
	return 0;
}

int fep_struct_in(const char *fn, const char *type, void *dst, size_t known,
		  size_t min, const void *src)
{
	const unsigned char *tail = (const unsigned char *)src + known;
	size_t sz, i;
	int ret;

	ret = fep_struct_size(fn, type, src, min, &sz);
	if (ret)
		return ret;
	for (i = 0; known + i < sz; i++)
		if (tail[i]) {
			fep_err("%s: %s.size %zu has nonzero byte %zu past the %zu "
				"bytes this library (fabep %s) knows: fields of "
				"a later version it cannot honour", fn, type, sz,
				known + i, known, PACKAGE_VERSION);
			return -E2BIG;
		}
	memset(dst, 0, known);
	memcpy(dst, src, FEP_MIN(sz, known));
	return 0;
}

int fep_struct_out_size(const char *fn, const char *type, const void *dst,
			size_t min, size_t *size)
{
	return fep_struct_size(fn, type, dst, min, size);
}

void fep_struct_out(void *dst, size_t size, const void *src, size_t known)
{
	/* the size field stays the caller's */
	if (FEP_MIN(size, known) > sizeof(size_t))
		memcpy((char *)dst + sizeof(size_t),
		       (const char *)src + sizeof(size_t),
		       FEP_MIN(size, known) - sizeof(size_t));
}
