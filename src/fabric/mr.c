/*
 * mr.c - the symmetric heap: one region of the same size on every rank,
 * registered once for FI_REMOTE_WRITE, holding every remotely written
 * object (receive regions, counters) at the same offset everywhere, and the
 * send staging.  Allocation is a bump allocator: every rank makes the same
 * sequence of allocations, so offsets agree.
 */
#include "config.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <numa.h>
#include <numaif.h>

#include "util/util.h"
#include "fabric/fabric.h"

#define FEP_HEAP_KEY 0xfeb0c0deull

static int fep_heap_register(fep_fabric_t *fab, void *p, size_t size)
{
	int ret = fi_mr_reg(fab->domain, p, size, FI_WRITE | FI_REMOTE_WRITE, 0,
			    FEP_HEAP_KEY, 0, &fab->heap_mr, NULL);

	if (ret) {
		fep_err("fi_mr_reg(heap, %zu bytes): %s", size, fi_strerror(-ret));
		return ret;
	}
	fab->heap_desc = fi_mr_desc(fab->heap_mr);
	fab->heap_key = fi_mr_key(fab->heap_mr);
	return 0;
}

int fep_heap_share(fep_fabric_t *fab, const fep_fabric_t *of)
{
	fab->heap = of->heap;
	fab->heap_size = of->heap_size;
	fab->heap_used = of->heap_size;   /* allocations are chan[0]'s */
	fab->heap_shared = true;
	return fep_heap_register(fab, fab->heap, fab->heap_size);
}

int fep_heap_create(fep_fabric_t *fab, size_t size, int numa_node)
{
	size_t page = 4096;
	void *p;
	int ret;

	size = FEP_ALIGN_UP(size, page);
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	if (p == MAP_FAILED) {
		fep_err("cannot map a heap of %zu bytes: %s", size, strerror(errno));
		return -ENOMEM;
	}
	if (numa_node >= 0 && numa_available() >= 0 &&
	    numa_node <= numa_max_node()) {
		unsigned long mask[16] = { 0 };

		if ((size_t)numa_node < sizeof(mask) * 8) {
			mask[numa_node / (8 * sizeof(long))] |=
				1ul << (numa_node % (8 * sizeof(long)));
			if (mbind(p, size, MPOL_PREFERRED, mask, sizeof(mask) * 8, 0))
				fep_dbg("mbind(node %d): %s", numa_node, strerror(errno));
			else
				fab->heap_numa = true;
		}
	}
	fab->heap = p;
	fab->heap_size = size;
	fab->heap_used = 0;
	ret = fep_heap_register(fab, p, size);
	if (ret) {
		munmap(p, size);
		fab->heap = NULL;
	}
	return ret;
}

static int fep_mr_bind_enable(fep_fabric_t *fab, struct fid_mr *mr, const char *what)
{
	int ret;

	if (fab->mr_mode & FI_MR_ENDPOINT) {
		ret = fi_mr_bind(mr, &fab->ep->fid, 0);
		if (ret) {
			fep_err("fi_mr_bind(%s): %s", what, fi_strerror(-ret));
			return ret;
		}
	}
	if (fab->mr_mode & (FI_MR_ENDPOINT | FI_MR_RMA_EVENT)) {
		ret = fi_mr_enable(mr);
		if (ret) {
			fep_err("fi_mr_enable(%s): %s", what, fi_strerror(-ret));
			return ret;
		}
	}
	return 0;
}

int fep_heap_bind(fep_fabric_t *fab)
{
	int ret = fep_mr_bind_enable(fab, fab->heap_mr, "heap");

	if (!ret && fab->ops_mr)
		ret = fep_mr_bind_enable(fab, fab->ops_mr, "operation pool");
	if (ret)
		return ret;
	/* provider keys may only be known once enabled */
	fab->heap_key = fi_mr_key(fab->heap_mr);
	if (fab->heap_key == FI_KEY_NOTAVAIL && !(fab->mr_mode & FI_MR_RAW)) {
		fep_err("the provider gave the heap no key");
		return -FI_ENOKEY;
	}
	fab->heap_desc = fi_mr_desc(fab->heap_mr);
	return 0;
}

void fep_heap_destroy(fep_fabric_t *fab)
{
	if (fab->heap_mr)
		fi_close(&fab->heap_mr->fid);
	fab->heap_mr = NULL;
	if (fab->heap && !fab->heap_shared)
		munmap(fab->heap, fab->heap_size);
	fab->heap = NULL;
}

int fep_heap_alloc_(fep_fabric_t *fab, size_t size, size_t align, uint64_t *off)
{
	size_t start;

	if (align == 0)
		align = 64;
	if (align & (align - 1)) {
		fep_err("heap alignment %zu is not a power of two", align);
		return -EINVAL;
	}
	if (align > 4096) {
		fep_err("heap alignment %zu exceeds the page size", align);
		return -EINVAL;
	}
	start = FEP_ALIGN_UP(fab->heap_used, align);
	if (start > fab->heap_size || size > fab->heap_size - start) {
		fep_err("symmetric heap full: %zu bytes asked, %zu of %zu used "
			"(raise FABEP_HEAP_SIZE)", size, fab->heap_used, fab->heap_size);
		return -FABEP_ERR_HEAP_FULL;
	}
	fab->heap_used = start + (size ? size : 0);
	*off = start;
	return 0;
}
