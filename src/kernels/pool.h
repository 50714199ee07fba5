/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * pool.h - the NUMA-pinned worker pool that runs the kernels (and the
 * other layers' parallel loops), and NUMA allocation.
 *
 * Layer: uses only util.  Internal (not installed).
 */
#ifndef FEP_KERNELS_POOL_H
#define FEP_KERNELS_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct fep_pool fep_pool_t;

/*
 * Create a pool of `nthreads` threads (the caller counts as worker 0, so
 * nthreads - 1 threads are started; nthreads == 1 starts none) pinned to
 * the CPUs of NUMA node `numa_node`.
 *   nthreads <= 0: FABEP_THREADS if set, else max(1, physical cores of
 *     the node that this process may use, no more than its cgroup's CPU
 *     quota, / local_ranks: the ranks that share those CPUs).  An
 *     explicit count above the node's CPUs is allowed (logged as a
 *     warning).
 *   numa_node < 0: fep_pool_default_node(-1).
 * Without NUMA support (numa_available() < 0) the node is 0 and the
 * threads run on the CPUs the process is allowed.  The calling thread is
 * never re-pinned.  Waiting workers spin briefly, then sleep on a futex.
 */
int fep_pool_create(int nthreads, int numa_node, int local_ranks,
		    fep_pool_t **pool);
void fep_pool_destroy(fep_pool_t *pool); /* NULL is ignored */
int fep_pool_threads(const fep_pool_t *pool); /* NULL: 1 */
int fep_pool_node(const fep_pool_t *pool);    /* NULL: -1 */

/* The node to use: FABEP_NUMA_NODE if set (and valid), else `nic_node`
 * if >= 0, else the node of the CPU the caller runs on (0 without NUMA).
 * Returns -EINVAL on a malformed FABEP_NUMA_NODE. */
int fep_pool_default_node(int nic_node);

/* Wake the sleeping workers without work: they spin for a while, ready
 * for a run that comes soon (a phase calls this on entry, so that waking
 * them overlaps its setup).  NULL is ignored. */
void fep_pool_wake(fep_pool_t *pool);

/* Run fn(ctx, tid, nthreads) on the caller (tid 0) and on every worker
 * that starts before the caller's fn returns, then wait for those; a
 * worker that starts later skips the run, so one that the host or the
 * kernel is slow to wake holds nobody up.  fn must therefore be a job
 * that the caller, with any of the workers, finishes (shared out by
 * claims and rescues, not by tid); each tid runs it at most once.  One
 * run at a time per pool (a communicator is used by one thread at a
 * time).  pool NULL: fn(ctx, 0, 1). */
typedef void (*fep_pool_fn)(void *ctx, int tid, int nthreads);
int fep_pool_run(fep_pool_t *pool, fep_pool_fn fn, void *ctx);

/* A run that moves fewer bytes than this in all goes on the caller
 * alone: handing ranges to the workers costs microseconds (a sleeping
 * worker's wake-up, the rows' cache lines moving to its core), as long
 * as the caller takes to copy that much from its caches. */
#define FEP_POOL_SOLO_BYTES (128 * 1024)

/* The grain of a run of n items of item_bytes each: n (one range, the
 * caller's) below FEP_POOL_SOLO_BYTES in all, else 1. */
static inline size_t fep_pool_grain(size_t n, size_t item_bytes)
{
	return n && item_bytes < FEP_POOL_SOLO_BYTES / n ? n : 1;
}

/* Call fn(ctx, r0, r1) over [0, n) on the workers, in contiguous ranges
 * that start at multiples of `grain` (grain 0 = 1) and cover every index
 * once.  The workers claim the ranges as they come (several each, about
 * a quarter of an even share at a time), so which worker runs which rows
 * is not fixed: a worker that starts late does less, and the call
 * returns once every range is done, without waiting for workers that
 * took none.  Every worker runs on the pool's node, so first touch by
 * fep_pool_for still places pages on the node that reads them. */
typedef void (*fep_pool_range_fn)(void *ctx, size_t r0, size_t r1);
int fep_pool_for(fep_pool_t *pool, size_t n, size_t grain,
		 fep_pool_range_fn fn, void *ctx);
/* fep_pool_for over the workers only, while the caller calls idle(ictx)
 * in a loop until every range is done (it drives the fabric meanwhile).
 * With one thread, or n <= grain, the caller runs fn over [0, n) itself
 * and idle is not called. */
int fep_pool_for_idle(fep_pool_t *pool, size_t n, size_t grain,
		      fep_pool_range_fn fn, void *ctx,
		      void (*idle)(void *), void *ictx);

/* Page-aligned memory on a NUMA node (node < 0 or no NUMA: local policy).
 * Not touched: the first writer places the pages. */
void *fep_numa_alloc(size_t size, int node);
void fep_numa_free(void *p, size_t size);
/* Allocate on the pool's node and zero it with the pool's threads, in
 * `nrows` rows of `row_bytes` (fep_pool_for: first touch on the pool's
 * node).  Free with fep_numa_free(p, nrows * row_bytes). */
void *fep_pool_alloc(fep_pool_t *pool, size_t nrows, size_t row_bytes);

#endif /* FEP_KERNELS_POOL_H */
