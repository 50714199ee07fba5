/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * pool.c - the worker pool of a communicator: threads pinned to the CPUs
 * of one NUMA node (libnuma), work split by rows, the caller taking part
 * as worker 0.  Idle workers spin briefly, then sleep on a futex, so more
 * ranks than cores still make progress.
 *
 * Two kinds of run, neither of which waits for a worker that has not
 * started: one that wakes late (on a busy or virtual machine, up to
 * hundreds of microseconds after the caller, milliseconds on a busy
 * host) holds nobody up.  fep_pool_for (and _idle) hands out claims:
 * ranges of rows that whoever is running takes from a shared cursor, and
 * it waits only for the claims.  fep_pool_run calls fn on the caller and
 * on every worker that starts before the caller's fn returns, for jobs
 * that share their work out themselves: a worker enters the run by a
 * compare-and-swap on `entry` (the run's gen and the count that entered),
 * the caller closes it once its own fn returns and waits for those that
 * entered; a worker that comes later finds it closed and skips it.
 *
 * A run is published like a seqlock: gen goes odd, the run's fields are
 * written, gen goes even; a worker that reads the fields between two
 * reads of the same even gen has a consistent run.  Claims carry that gen
 * in the cursor's high half, so a worker still holding an old run's
 * fields cannot claim rows of a later run: its compare-and-swap fails.
 * It may call fn only after a successful claim (or entry), and the
 * caller waits for every claim (every entered worker) to finish, so fn
 * and ctx are alive whenever it does.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include <numa.h>

#include "kernels/kernels.h"

#define POOL_SPINS 4000
#define POOL_CLOSED 0x80000000u  /* entry: the run takes no more workers */

struct fep_pool_worker {
	struct fep_pool *pool;
	int tid;
	pthread_t thread;
};

struct fep_pool {
	int nthreads;
	int node;
	cpu_set_t cpus;
	int have_cpus;            /* pin workers to cpus */
	struct fep_pool_worker *workers;
	int started;              /* workers started (1..nthreads-1) */

	_Atomic uint32_t gen;     /* futex: odd while a run is written, even
				     once published; +2 per run */
	_Atomic uint32_t pending; /* futex: workers still running this run
				     (less those the close shut out) */
	_Atomic uint64_t entry;   /* fn runs: gen << 32 | POOL_CLOSED | the
				     count of workers that entered */
	_Atomic int sleepers;     /* workers sleeping (or about to) on gen */
	_Atomic int caller_sleeps;
	_Atomic int stop;
	/* the run (written while gen is odd): fn on every worker, or claims
	 * of rfn's rows (fep_pool_for) */
	_Atomic(fep_pool_fn) fn;
	_Atomic(fep_pool_range_fn) rfn;
	_Atomic(void *) ctx;
	_Atomic size_t n, step, claims;
	_Atomic uint64_t cursor;  /* claims: gen << 32 | next claim */
	_Atomic size_t claimed_done; /* claims finished */
};

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

/* Take claims of run g (fep_pool_for) until none is left: fn, ctx and the sizes
 * are the run's own (read under the seqlock), and a claim succeeds only
 * while the cursor still carries g. */
static void pool_claims(struct fep_pool *p, uint32_t g, fep_pool_range_fn fn,
			void *ctx, size_t n, size_t step, size_t claims)
{
	uint64_t cur = atomic_load_explicit(&p->cursor, memory_order_relaxed);

	for (;;) {
		size_t c = (size_t)(cur & 0xffffffffu), r0;

		if ((uint32_t)(cur >> 32) != g || c >= claims)
			return;
		if (!atomic_compare_exchange_weak_explicit(&p->cursor, &cur, cur + 1,
							   memory_order_acquire,
							   memory_order_relaxed))
			continue;
		r0 = c * step;
		fn(ctx, r0, FEP_MIN(r0 + step, n));
		atomic_fetch_add_explicit(&p->claimed_done, 1, memory_order_release);
		cur = atomic_load_explicit(&p->cursor, memory_order_relaxed);
	}
}

/* Enter fn run g: false when g is over or closed (fn and ctx may be dead). */
static bool pool_enter(struct fep_pool *p, uint32_t g)
{
	uint64_t e = atomic_load_explicit(&p->entry, memory_order_acquire);

	while ((uint32_t)(e >> 32) == g && !(e & POOL_CLOSED))
		if (atomic_compare_exchange_weak_explicit(&p->entry, &e, e + 1,
							  memory_order_acq_rel,
							  memory_order_acquire))
			return true;
	return false;
}

static void *worker_main(void *arg)
{
	struct fep_pool_worker *w = arg;
	struct fep_pool *p = w->pool;
	uint32_t seen = 0;
	int i;

	if (p->have_cpus)
		pthread_setaffinity_np(pthread_self(), sizeof(p->cpus), &p->cpus);
	for (;;) {
		uint32_t g = seen;
		fep_pool_fn fn;
		fep_pool_range_fn rfn;
		void *ctx;
		size_t n, step, claims;

		/* spin, then sleep; woken without a run (fep_pool_wake), the
		 * same again.  An odd gen is a run being written: spin on. */
		for (;;) {
			for (i = 0; i < POOL_SPINS; i++) {
				g = atomic_load_explicit(&p->gen, memory_order_acquire);
				if (g != seen && !(g & 1))
					break;
				__builtin_ia32_pause();
			}
			if (g != seen && !(g & 1))
				break;
			if (g != seen) {
				sched_yield();
				continue;
			}
			atomic_fetch_add(&p->sleepers, 1);
			futex(&p->gen, FUTEX_WAIT_PRIVATE, seen);
			atomic_fetch_sub(&p->sleepers, 1);
		}
		if (atomic_load(&p->stop))
			break;
		/* the run of g, consistent only if gen is still g after */
		fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
		rfn = atomic_load_explicit(&p->rfn, memory_order_relaxed);
		ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
		n = atomic_load_explicit(&p->n, memory_order_relaxed);
		step = atomic_load_explicit(&p->step, memory_order_relaxed);
		claims = atomic_load_explicit(&p->claims, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&p->gen, memory_order_relaxed) != g)
			continue;  /* a later run began meanwhile: take that */
		seen = g;
		if (rfn) {
			pool_claims(p, g, rfn, ctx, n, step, claims);
			continue;
		}
		if (!pool_enter(p, g))
			continue;  /* closed before this worker came */
		fn(ctx, w->tid, p->nthreads);
		if (atomic_fetch_sub(&p->pending, 1) == 1 &&
		    atomic_load(&p->caller_sleeps))
			futex(&p->pending, FUTEX_WAKE_PRIVATE, 1);
	}
	return NULL;
}

static void pool_release(struct fep_pool *p)
{
	atomic_store(&p->stop, 1);
	atomic_fetch_add(&p->gen, 2);
	futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
}

int fep_pool_default_node(int nic_node)
{
	long v;
	int ret, cpu, node;

	ret = fep_env_long("FABEP_NUMA_NODE", -1, 65535, &v);
	if (ret < 0)
		return ret;
	if (ret > 0 && v >= 0)
		return (int)v;
	if (nic_node >= 0)
		return nic_node;
	if (numa_available() < 0)
		return 0;
	cpu = sched_getcpu();
	node = cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
	return node >= 0 ? node : 0;
}

/* CPUs of `node` this process may run on; count returned. */
static int node_cpus(int node, cpu_set_t *set)
{
	cpu_set_t allowed;
	struct bitmask *bm;
	int i, n = 0;

	CPU_ZERO(set);
	if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0) {
		CPU_ZERO(&allowed);
		for (i = 0; i < CPU_SETSIZE; i++)
			CPU_SET(i, &allowed);
	}
	if (numa_available() < 0) {
		*set = allowed;
		return CPU_COUNT(set);
	}
	bm = numa_allocate_cpumask();
	if (!bm)
		return -ENOMEM;
	if (numa_node_to_cpus(node, bm) < 0) {
		numa_free_cpumask(bm);
		return -EINVAL;
	}
	for (i = 0; i < CPU_SETSIZE && (unsigned)i < bm->size; i++) {
		if (numa_bitmask_isbitset(bm, i) && CPU_ISSET(i, &allowed)) {
			CPU_SET(i, set);
			n++;
		}
	}
	numa_free_cpumask(bm);
	if (n == 0) { /* the node's CPUs are all outside our cpuset */
		fep_warn("pool: NUMA node %d has no CPU this process may use; "
			 "threads run on the allowed CPUs", node);
		*set = allowed;
		n = CPU_COUNT(set);
	}
	return n;
}

/* Physical cores among the CPUs of set (hardware threads of one core
 * count once), from sysfs; the CPU count where the topology is unknown. */
static int set_cores(const cpu_set_t *set)
{
	int key[CPU_SETSIZE];
	int i, j, n = 0, cores = 0;

	for (i = 0; i < CPU_SETSIZE; i++) {
		if (!CPU_ISSET(i, set))
			continue;
		key[n] = fep_cpu_core_key(i);
		for (j = 0; j < n && key[j] != key[n]; j++)
			;
		cores += j == n;
		n++;
	}
	return cores > 0 ? cores : n;
}

int fep_pool_create(int nthreads, int numa_node, int local_ranks,
		    fep_pool_t **pool)
{
	struct fep_pool *p;
	long v;
	int ret, ncpu, i;

	if (!pool) {
		fep_err("pool: NULL output pointer");
		return -EINVAL;
	}
	if (numa_node < 0) {
		numa_node = fep_pool_default_node(-1);
		if (numa_node < 0)
			return numa_node;
	}
	if (numa_available() >= 0) {
		if (numa_node > numa_max_node() ||
		    !numa_bitmask_isbitset(numa_all_nodes_ptr, numa_node)) {
			fep_err("pool: NUMA node %d does not exist or is not allowed "
				"(max node %d)", numa_node, numa_max_node());
			return -EINVAL;
		}
	} else if (numa_node != 0) {
		fep_warn("pool: no NUMA support; node %d taken as node 0", numa_node);
		numa_node = 0;
	}

	p = calloc(1, sizeof(*p));
	if (!p) {
		fep_err("pool: out of memory");
		return -ENOMEM;
	}
	p->node = numa_node;
	ncpu = node_cpus(numa_node, &p->cpus);
	if (ncpu < 0) {
		fep_err("pool: cannot read the CPUs of node %d", numa_node);
		ret = ncpu;
		goto err_free;
	}
	p->have_cpus = ncpu > 0;
	if (ncpu < 1)
		ncpu = 1;

	if (nthreads <= 0) {
		ret = fep_env_long("FABEP_THREADS", 0, 1024, &v);
		if (ret < 0)
			goto err_free;
		if (ret > 0 && v > 0) {
			nthreads = (int)v;
		} else {
			/* busy threads of all local ranks: no more than
			 * cores (a second hardware thread of a core adds
			 * little to copies and kernels bound by memory),
			 * nor than the CPUs the cgroup's quota allows */
			int cores = p->have_cpus ? set_cores(&p->cpus) : ncpu;
			int quota = fep_cgroup_cpus();

			if (quota && quota < cores)
				cores = quota;

			if (local_ranks < 1)
				local_ranks = 1;
			nthreads = cores / local_ranks;
			if (nthreads < 1)
				nthreads = 1;
		}
	}
	if (nthreads > 1024) {
		fep_err("pool: %d threads is too many (max 1024)", nthreads);
		ret = -EINVAL;
		goto err_free;
	}
	if (nthreads > ncpu)
		fep_warn("pool: %d threads on node %d, which has %d usable CPUs",
			 nthreads, numa_node, ncpu);
	p->nthreads = nthreads;

	p->workers = calloc((size_t)nthreads, sizeof(*p->workers));
	if (!p->workers) {
		fep_err("pool: out of memory");
		ret = -ENOMEM;
		goto err_free;
	}
	for (i = 1; i < nthreads; i++) {
		p->workers[i].pool = p;
		p->workers[i].tid = i;
		ret = FEP_FAULT("pthread_create",
				pthread_create(&p->workers[i].thread, NULL,
					       worker_main, &p->workers[i]));
		if (ret) {
			fep_err("pool: pthread_create: %s", strerror(ret));
			ret = -ret;
			goto err_join;
		}
		p->started = i;
	}
	fep_dbg("pool: %d threads on NUMA node %d (%d CPUs, %d local ranks)",
		nthreads, numa_node, ncpu, local_ranks);
	*pool = p;
	return 0;

err_join:
	pool_release(p);
	for (i = 1; i <= p->started; i++)
		pthread_join(p->workers[i].thread, NULL);
	free(p->workers);
err_free:
	free(p);
	return ret;
}

void fep_pool_destroy(fep_pool_t *p)
{
	int i;

	if (!p)
		return;
	pool_release(p);
	for (i = 1; i <= p->started; i++)
		pthread_join(p->workers[i].thread, NULL);
	free(p->workers);
	free(p);
}

int fep_pool_threads(const fep_pool_t *p)
{
	return p ? p->nthreads : 1;
}

int fep_pool_node(const fep_pool_t *p)
{
	return p ? p->node : -1;
}

void fep_pool_wake(fep_pool_t *p)
{
	if (p && p->nthreads > 1 && atomic_load(&p->sleepers) > 0)
		futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
}

/* Publish a run (the seqlock: gen odd, the fields, gen even) and wake the
 * sleeping workers: fn on every worker, or (rfn) claims of rows.  Returns
 * the run's gen. */
static uint32_t pool_publish(struct fep_pool *p, fep_pool_fn fn,
			     fep_pool_range_fn rfn, void *ctx, size_t n,
			     size_t step, size_t claims)
{
	uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed);

	atomic_store_explicit(&p->gen, g + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&p->rfn, rfn, memory_order_relaxed);
	atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
	atomic_store_explicit(&p->n, n, memory_order_relaxed);
	atomic_store_explicit(&p->step, step, memory_order_relaxed);
	atomic_store_explicit(&p->claims, claims, memory_order_relaxed);
	if (rfn) {
		atomic_store_explicit(&p->claimed_done, 0, memory_order_relaxed);
		atomic_store_explicit(&p->cursor, (uint64_t)(g + 2) << 32,
				      memory_order_relaxed);
	} else {
		atomic_store(&p->pending, (uint32_t)(p->nthreads - 1));
		atomic_store_explicit(&p->entry, (uint64_t)(g + 2) << 32,
				      memory_order_relaxed);
	}
	atomic_store(&p->gen, g + 2);  /* seq_cst: publishes the fields */
	if (atomic_load(&p->sleepers) > 0)
		futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
	return g + 2;
}

int fep_pool_run(fep_pool_t *p, fep_pool_fn fn, void *ctx)
{
	uint64_t e;
	uint32_t left, late;
	int i;

	if (!fn) {
		fep_err("pool: NULL function");
		return -EINVAL;
	}
	if (!p || p->nthreads == 1) {
		fn(ctx, 0, 1);
		return 0;
	}
	pool_publish(p, fn, NULL, ctx, 0, 0, 0);
	fn(ctx, 0, p->nthreads);
	/* close the run; the workers that did not enter owe nothing */
	e = atomic_load_explicit(&p->entry, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(&p->entry, &e, e | POOL_CLOSED,
						      memory_order_acq_rel,
						      memory_order_relaxed))
		;
	late = (uint32_t)(p->nthreads - 1) - (uint32_t)(e & (POOL_CLOSED - 1));
	if (late)
		atomic_fetch_sub(&p->pending, late);
	for (i = 0; i < POOL_SPINS; i++) {
		if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
			return 0;
		__builtin_ia32_pause();
	}
	atomic_store(&p->caller_sleeps, 1);
	while ((left = atomic_load(&p->pending)) != 0)
		futex(&p->pending, FUTEX_WAIT_PRIVATE, left);
	atomic_store(&p->caller_sleeps, 0);
	return 0;
}

/* fep_pool_for's ranges are claimed, not assigned: whoever runs takes the
 * next `step` rows (a multiple of grain, about a quarter of an even share)
 * from the pool's cursor until none are left, and the caller waits for
 * the claims, not for the workers (see the top of this file).  With idle,
 * the caller takes no claim and calls idle(ictx) while it waits. */
static int pool_for(struct fep_pool *p, size_t n, size_t grain, int workers,
		    fep_pool_range_fn fn, void *ctx, void (*idle)(void *),
		    void *ictx)
{
	size_t chunks, per, step, claims;
	uint32_t g;
	int i;

	chunks = (n + grain - 1) / grain;
	per = chunks / (4 * (size_t)workers);
	step = (per ? per : 1) * grain;
	claims = (n + step - 1) / step;
	g = pool_publish(p, NULL, fn, ctx, n, step, claims);
	if (!idle)
		pool_claims(p, g, fn, ctx, n, step, claims);
	for (i = 0; atomic_load_explicit(&p->claimed_done,
					 memory_order_acquire) < claims; i++) {
		if (idle)
			idle(ictx);
		else if (i >= POOL_SPINS)
			sched_yield();  /* a claim's worker may be preempted */
		__builtin_ia32_pause();
	}
	return 0;
}

int fep_pool_for(fep_pool_t *p, size_t n, size_t grain,
		 fep_pool_range_fn fn, void *ctx)
{
	if (!fn) {
		fep_err("pool: NULL function");
		return -EINVAL;
	}
	if (grain == 0)
		grain = 1;
	if (n == 0)
		return 0;
	/* Not worth waking threads for less than one grain each. */
	if (!p || p->nthreads == 1 || n <= grain) {
		fn(ctx, 0, n);
		return 0;
	}
	return pool_for(p, n, grain, p->nthreads, fn, ctx, NULL, NULL);
}

int fep_pool_for_idle(fep_pool_t *p, size_t n, size_t grain,
		      fep_pool_range_fn fn, void *ctx,
		      void (*idle)(void *), void *ictx)
{
	if (!fn || !idle) {
		fep_err("pool: NULL function");
		return -EINVAL;
	}
	if (grain == 0)
		grain = 1;
	if (!p || p->nthreads == 1 || n <= grain) {
		if (n)
			fn(ctx, 0, n);  /* no idle: the caller was busy all along */
		return 0;
	}
	return pool_for(p, n, grain, p->nthreads - 1, fn, ctx, idle, ictx);
}

void *fep_numa_alloc(size_t size, int node)
{
	void *p;

	if (size == 0)
		return NULL;
	if (node >= 0 && numa_available() >= 0) {
		p = numa_alloc_onnode(size, node);
		if (!p)
			fep_err("numa_alloc_onnode(%zu, %d) failed", size, node);
		return p;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		fep_err("mmap(%zu) failed: %s", size, strerror(errno));
		return NULL;
	}
	return p;
}

void fep_numa_free(void *p, size_t size)
{
	if (p && size)
		munmap(p, size); /* numa_alloc_onnode memory is mmap'ed too */
}

struct touch_ctx {
	char *base;
	size_t row_bytes;
};

static void touch_rows(void *arg, size_t r0, size_t r1)
{
	struct touch_ctx *t = arg;

	memset(t->base + r0 * t->row_bytes, 0, (r1 - r0) * t->row_bytes);
}

void *fep_pool_alloc(fep_pool_t *pool, size_t nrows, size_t row_bytes)
{
	struct touch_ctx t;
	size_t size;

	if (row_bytes && nrows > SIZE_MAX / row_bytes) {
		fep_err("pool_alloc: %zu rows of %zu bytes overflow", nrows,
			row_bytes);
		return NULL;
	}
	size = nrows * row_bytes;
	t.base = fep_numa_alloc(size, pool ? pool->node : -1);
	if (!t.base)
		return NULL;
	t.row_bytes = row_bytes;
	fep_pool_for(pool, nrows, 1, touch_rows, &t);
	return t.base;
}
