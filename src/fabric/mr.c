/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * mr.c - the symmetric heap: one region of the same size on every rank,
 * registered once for remote writes and reads, holding every remotely
 * written object (receive regions, counters) and every remotely read one
 * (the allreduce's results) at the same offset everywhere, and the send
 * staging.  Allocation is a bump allocator: every rank makes the same
 * sequence of allocations, so offsets agree.  The handles' blocks are given
 * back and reused by agreement at creation (fep_hb_*, fabric.h).
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <numa.h>
#include <numaif.h>

#include "util/util.h"
#include "fabric/fabric.h"

#define FEP_HEAP_KEY 0xfeb0c0deull

uint64_t fep_fab_test_key_salt;

static int fep_heap_register(fep_fabric_t *fab, void *p, size_t size)
{
	int ret = FEP_FAULT("fi_mr_reg",
			    fi_mr_reg(fab->domain, p, size, FI_READ | FI_WRITE |
				      FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
				      FEP_HEAP_KEY + fep_fab_test_key_salt, 0,
				      &fab->heap_mr, NULL));

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

/* The heap's pages: anonymous, and from 2 MiB up aligned to 2 MiB and
 * advised as transparent huge pages.  Every byte of the heap is copied
 * by some peer's writes (shm's process_vm_writev pins the target's
 * pages, a NIC walks its translation table) and by this rank's packing:
 * huge pages cut the page walks and pins 512-fold.  Where the kernel
 * has no THP (or it is off) the advice fails and 4 KiB pages remain. */
static void *heap_map(size_t size)
{
	size_t len = size >= FEP_HUGE_PAGE ? size + FEP_HUGE_PAGE : size;
	uint8_t *p, *a;

	if (FEP_FAULT("heap_map", 0)) {
		errno = ENOMEM;
		return NULL;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (len == size)
		return p;
	a = (uint8_t *)FEP_ALIGN_UP((uintptr_t)p, FEP_HUGE_PAGE);
	if (a > p)
		munmap(p, (size_t)(a - p));
	if (a + size < p + len)
		munmap(a + size, (size_t)(p + len - (a + size)));
#ifdef MADV_HUGEPAGE
	if (madvise(a, size, MADV_HUGEPAGE))
		fep_dbg("madvise(MADV_HUGEPAGE, %zu bytes): %s", size,
			strerror(errno));
#endif
	return a;
}

int fep_heap_create(fep_fabric_t *fab, size_t size, int numa_node)
{
	void *p;
	int ret;

	size = FEP_ALIGN_UP(size, FEP_HEAP_PAGE);
	p = heap_map(size);
	if (!p) {
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
	fab->hb = calloc(FEP_HB_MAX, sizeof(*fab->hb));
	ret = fab->hb ? fep_heap_register(fab, p, size) : -ENOMEM;
	if (ret) {
		munmap(p, size);
		fab->heap = NULL;
		free(fab->hb);
		fab->hb = NULL;
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
	free(fab->hb);
	fab->hb = NULL;
	fab->nhb = 0;
	if (fab->heap_mr)
		fi_close(&fab->heap_mr->fid);
	fab->heap_mr = NULL;
	if (fab->heap && !fab->heap_shared && !fab->keep_heap)
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

/* ---- handle blocks ---- */

static bool hb_bit(const uint64_t *mask, int i)
{
	return (mask[i / 64] >> (i % 64)) & 1;
}

void fep_hb_hello(const fep_fabric_t *fab, struct fep_hb_hello *h)
{
	int i;

	memset(h, 0, sizeof(*h));
	for (i = 0; i < fab->nhb; i++)
		if (fab->hb[i].state == FEP_HB_FREE)
			h->free[i / 64] |= 1ull << (i % 64);
	h->heap_used = fab->heap_used;
	h->nhb = (uint32_t)fab->nhb;
	for (i = 0; i < fab->cs_n; i++) {
		if (fab->cs_state[i] == FEP_CS_FRESH ||
		    fab->cs_state[i] == FEP_CS_FREE)
			h->cs_free[i / 64] |= 1ull << (i % 64);
		if (fab->cs_state[i] != FEP_CS_FRESH)
			h->cs_used[i / 64] |= 1ull << (i % 64);
	}
}

int fep_hb_agree(const char *what, int nranks, const void *all, size_t stride,
		 struct fep_hb_hello *and_)
{
	const struct fep_hb_hello *h0 = all;
	int r, w;

	*and_ = *h0;
	for (r = 1; r < nranks; r++) {
		const struct fep_hb_hello *h =
			(const void *)((const char *)all + (size_t)r * stride);

		if (h->heap_used != h0->heap_used || h->nhb != h0->nhb) {
			fep_err("%s: the heaps differ (rank 0: %llu bytes used, %u "
				"handle blocks; rank %d: %llu, %u): every rank must "
				"make the same heap allocations and handles", what,
				(unsigned long long)h0->heap_used, h0->nhb, r,
				(unsigned long long)h->heap_used, h->nhb);
			return -FABEP_ERR_MISMATCH;
		}
		for (w = 0; w < FEP_HB_WORDS; w++)
			and_->free[w] &= h->free[w];
		for (w = 0; w < FEP_CS_WORDS; w++) {
			and_->cs_free[w] &= h->cs_free[w];
			and_->cs_used[w] |= h->cs_used[w];
		}
	}
	return 0;
}

int fep_cs_reserve(fep_fabric_t *fab, size_t n)
{
	int ret;

	n = FEP_MIN(n, (size_t)FEP_CS_MAX);
	if (!n)
		return 0;
	ret = fep_heap_alloc_(fab, n * FEP_CS_BYTES, 64, &fab->cs_base);
	if (!ret)
		fab->cs_n = (int)n;
	return ret;
}

int fep_cs_take(fep_fabric_t *fab, const struct fep_hb_hello *and_, bool *used)
{
	int i;

	for (i = 0; i < fab->cs_n; i++)
		if (hb_bit(and_->cs_free, i)) {
			fab->cs_state[i] = FEP_CS_LIVE;
			*used = hb_bit(and_->cs_used, i);
			return i;
		}
	return -1;
}

void fep_cs_give(fep_fabric_t *fab, uint64_t ctrs, bool clean)
{
	uint64_t i;

	if (!fab->cs_n || ctrs < fab->cs_base)
		return;
	i = (ctrs - fab->cs_base) / FEP_CS_BYTES;
	if (i < (uint64_t)fab->cs_n && fab->cs_state[i] == FEP_CS_LIVE)
		fab->cs_state[i] = clean ? FEP_CS_FREE : FEP_CS_KEPT;
}

/* Merge runs of adjacent blocks given back everywhere (and_ follows). */
static void hb_merge(fep_fabric_t *fab, struct fep_hb_hello *and_)
{
	int i, j, k, n = fab->nhb;

	for (i = 0; i < n; i++) {
		if (!hb_bit(and_->free, i))
			continue;
		for (j = i; j + 1 < n && hb_bit(and_->free, j + 1) &&
			    fab->hb[j].off + fab->hb[j].size == fab->hb[j + 1].off; j++)
			;
		if (j == i)
			continue;
		fab->hb[i].size = fab->hb[j].off + fab->hb[j].size - fab->hb[i].off;
		/* drop entries i+1..j, and their bits */
		for (k = i + 1; k + (j - i) < n; k++) {
			int from = k + (j - i);

			fab->hb[k] = fab->hb[from];
			and_->free[k / 64] &= ~(1ull << (k % 64));
			and_->free[k / 64] |=
				(uint64_t)hb_bit(and_->free, from) << (k % 64);
		}
		for (k = n - (j - i); k < n; k++)
			and_->free[k / 64] &= ~(1ull << (k % 64));
		n -= j - i;
	}
	fab->nhb = n;
}

int fep_hb_alloc(fep_fabric_t *fab, const struct fep_hb_hello *all_free,
		 size_t size, uint64_t *off, bool *reused)
{
	struct fep_hb_hello and_ = *all_free;
	size_t used = fab->heap_used;
	int i, n;
	bool top = false;

	size = FEP_ALIGN_UP(size ? size : 1, 64);
	hb_merge(fab, &and_);
	n = fab->nhb;
	for (i = 0; i < n; i++)
		if (hb_bit(and_.free, i) && fab->hb[i].size >= size) {
			/* the rest stays free everywhere, as the block was */
			if (fab->hb[i].size > size && n < FEP_HB_MAX) {
				memmove(&fab->hb[i + 2], &fab->hb[i + 1],
					(size_t)(n - i - 1) * sizeof(*fab->hb));
				fab->hb[i + 1].off = fab->hb[i].off + size;
				fab->hb[i + 1].size = fab->hb[i].size - size;
				fab->hb[i + 1].state = FEP_HB_FREE;
				fab->hb[i].size = size;
				fab->nhb = n + 1;
			}
			fab->hb[i].state = FEP_HB_LIVE;
			*off = fab->hb[i].off;
			*reused = true;
			return 0;
		}
	/* free blocks at the heap's end: the new one starts there */
	if (n && hb_bit(and_.free, n - 1) &&
	    fab->hb[n - 1].off + fab->hb[n - 1].size == fab->heap_used) {
		fab->heap_used = fab->hb[n - 1].off;
		n--;
		top = true;
	}
	*off = FEP_ALIGN_UP(fab->heap_used, 64);
	if (*off > fab->heap_size || size > fab->heap_size - *off) {
		fab->heap_used = used;  /* as it was: the block stays free */
		return -FABEP_ERR_HEAP_FULL;  /* the caller says what it needed */
	}
	fab->heap_used = *off + size;
	fab->nhb = n;
	/* the heap's end only grows: space below it held an earlier block,
	 * and fabep_heap_alloc always takes fresh (zero) space */
	*reused = top;
	if (fab->hb && n < FEP_HB_MAX) {  /* past it, never reused */
		fab->hb[n].off = *off;
		fab->hb[n].size = size;
		fab->hb[n].state = FEP_HB_LIVE;
		fab->nhb = n + 1;
	}
	return 0;
}

void fep_hb_free(fep_fabric_t *fab, uint64_t off, bool clean)
{
	int i;

	for (i = 0; i < fab->nhb; i++)
		if (fab->hb[i].off == off && fab->hb[i].state == FEP_HB_LIVE) {
			fab->hb[i].state = clean ? FEP_HB_FREE : FEP_HB_KEPT;
			return;
		}
}
