/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/* mem.c - memory for the library's large buffers of rows. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util/util.h"

void *fep_huge_alloc(size_t size)
{
	void *p;
	int ret;

	if (size < FEP_HUGE_PAGE)
		return malloc(size);
	ret = posix_memalign(&p, FEP_HUGE_PAGE, size);
	if (ret) {
		errno = ret;
		return NULL;
	}
#ifdef MADV_HUGEPAGE
	if (madvise(p, size / FEP_HUGE_PAGE * FEP_HUGE_PAGE, MADV_HUGEPAGE))
		fep_dbg("madvise(MADV_HUGEPAGE, %zu bytes): %s", size,
			strerror(errno));
#endif
	return p;
}
