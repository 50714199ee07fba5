/*
 * pool.c - the worker pool of a communicator: threads pinned to the CPUs
 * of one NUMA node (libnuma), work split by rows, the caller taking part
 * as worker 0.  Idle workers spin briefly, then sleep on a futex, so more
 * ranks than cores still make progress.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include <numa.h>

#include "kernels/kernels.h"

#define POOL_SPINS 4000

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

	_Atomic uint32_t gen;     /* futex: bumped once per run */
	_Atomic uint32_t pending; /* futex: workers still running this run */
	_Atomic int sleepers;     /* workers sleeping (or about to) on gen */
	_Atomic int caller_sleeps;
	_Atomic int stop;
	fep_pool_fn fn;
	void *ctx;
};

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
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
		uint32_t g;

		for (i = 0; i < POOL_SPINS; i++) {
			g = atomic_load_explicit(&p->gen, memory_order_acquire);
			if (g != seen)
				break;
			__builtin_ia32_pause();
		}
		while ((g = atomic_load(&p->gen)) == seen) {
			atomic_fetch_add(&p->sleepers, 1);
			futex(&p->gen, FUTEX_WAIT_PRIVATE, seen);
			atomic_fetch_sub(&p->sleepers, 1);
		}
		seen = g;
		if (atomic_load(&p->stop))
			break;
		p->fn(p->ctx, w->tid, p->nthreads);
		if (atomic_fetch_sub(&p->pending, 1) == 1 &&
		    atomic_load(&p->caller_sleeps))
			futex(&p->pending, FUTEX_WAKE_PRIVATE, 1);
	}
	return NULL;
}

static void pool_release(struct fep_pool *p)
{
	atomic_store(&p->stop, 1);
	atomic_fetch_add(&p->gen, 1);
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
			if (local_ranks < 1)
				local_ranks = 1;
			nthreads = ncpu / local_ranks;
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
		ret = pthread_create(&p->workers[i].thread, NULL, worker_main,
				     &p->workers[i]);
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

/* Hand fn to the workers and wake the sleeping ones. */
static void pool_start(struct fep_pool *p, fep_pool_fn fn, void *ctx)
{
	p->fn = fn;
	p->ctx = ctx;
	atomic_store(&p->pending, (uint32_t)(p->nthreads - 1));
	atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn, ctx */
	if (atomic_load(&p->sleepers) > 0)
		futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
}

int fep_pool_run(fep_pool_t *p, fep_pool_fn fn, void *ctx)
{
	uint32_t left;
	int i;

	if (!fn) {
		fep_err("pool: NULL function");
		return -EINVAL;
	}
	if (!p || p->nthreads == 1) {
		fn(ctx, 0, 1);
		return 0;
	}
	pool_start(p, fn, ctx);
	fn(ctx, 0, p->nthreads);
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

/* Like fep_pool_run, but the caller takes no share: it calls idle(ictx)
 * until the workers are done (no futex sleep: idle is the caller's work,
 * e.g. driving the fabric's progress). */
static int pool_run_idle(struct fep_pool *p, fep_pool_fn fn, void *ctx,
			 void (*idle)(void *), void *ictx)
{
	pool_start(p, fn, ctx);
	fn(ctx, 0, p->nthreads);      /* tid 0's share is empty by contract */
	while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
		idle(ictx);
		__builtin_ia32_pause();
	}
	return 0;
}

void fep_pool_split(size_t n, size_t grain, int tid, int nthreads,
		    size_t *r0, size_t *r1)
{
	size_t chunks, per, rem, c0, c1, t = (size_t)tid;

	if (grain == 0)
		grain = 1;
	if (nthreads < 1)
		nthreads = 1;
	chunks = (n + grain - 1) / grain;
	per = chunks / (size_t)nthreads;
	rem = chunks % (size_t)nthreads;
	c0 = t * per + (t < rem ? t : rem);
	c1 = c0 + per + (t < rem ? 1 : 0);
	*r0 = FEP_MIN(c0 * grain, n);
	*r1 = FEP_MIN(c1 * grain, n);
}

struct pool_for_ctx {
	size_t n, grain;
	fep_pool_range_fn fn;
	void *ctx;
};

static void pool_for_body(void *arg, int tid, int nthreads)
{
	struct pool_for_ctx *c = arg;
	size_t r0, r1;

	fep_pool_split(c->n, c->grain, tid, nthreads, &r0, &r1);
	if (r1 > r0)
		c->fn(c->ctx, r0, r1);
}

int fep_pool_for(fep_pool_t *p, size_t n, size_t grain,
		 fep_pool_range_fn fn, void *ctx)
{
	struct pool_for_ctx c = { n, grain ? grain : 1, fn, ctx };

	if (!fn) {
		fep_err("pool: NULL function");
		return -EINVAL;
	}
	if (n == 0)
		return 0;
	/* Not worth waking threads for less than one grain each. */
	if (!p || p->nthreads == 1 || n <= c.grain) {
		fn(ctx, 0, n);
		return 0;
	}
	return fep_pool_run(p, pool_for_body, &c);
}

static void pool_for_workers_body(void *arg, int tid, int nthreads)
{
	struct pool_for_ctx *c = arg;
	size_t r0, r1;

	if (tid == 0)
		return;  /* the caller drives idle() */
	fep_pool_split(c->n, c->grain, tid - 1, nthreads - 1, &r0, &r1);
	if (r1 > r0)
		c->fn(c->ctx, r0, r1);
}

int fep_pool_for_idle(fep_pool_t *p, size_t n, size_t grain,
		      fep_pool_range_fn fn, void *ctx,
		      void (*idle)(void *), void *ictx)
{
	struct pool_for_ctx c = { n, grain ? grain : 1, fn, ctx };

	if (!fn || !idle) {
		fep_err("pool: NULL function");
		return -EINVAL;
	}
	if (!p || p->nthreads == 1 || n == 0) {
		if (n)
			fn(ctx, 0, n);  /* no idle: the caller was busy all along */
		return 0;
	}
	return pool_run_idle(p, pool_for_workers_body, &c, idle, ictx);
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
