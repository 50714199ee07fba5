/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * comm.c - the communicator: configuration from attributes and the
 * environment, bootstrap, fabric and heap, the warm-up exchange, the
 * barrier and error agreement, and the public one-sided calls.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sched.h>
#include <pthread.h>
#include <numa.h>

#include "core/comm.h"
#include "kernels/kernels.h"

#define FEP_DEFAULT_TIMEOUT_MS 30000
#define FEP_AUTO_CHANNELS 8   /* FABEP_CHANNELS unset, shm: at most */
#define FEP_AUTO_CHANNELS_TCP 4 /* and tcp */
#define FEP_DEFAULT_HEAP (64ul << 20)

#define FEP_CPU_WORDS (CPU_SETSIZE / 64)

/* What every rank must agree on, compared at creation. */
struct fep_hello {
	char host[64];
	int32_t signal;
	int32_t status;
	uint64_t heap_size;
	int32_t pid;      /* for the liveness check of ranks on this host */
	int32_t channels; /* FABEP_CHANNELS */
	uint64_t pidns;   /* inode of /proc/self/ns/pid, 0 unknown */
	uint64_t cma_word; /* fep_cma_word(): where peers try a CMA write */
	int32_t cpu_quota; /* fep_cgroup_cpus(): 0 none */
	int32_t pad;
	uint64_t shm_dev; /* /dev/shm's device and inode (fep_shm_id), */
	uint64_t shm_ino; /* 0 and 0 where it has none */
	uint64_t cpus[FEP_CPU_WORDS]; /* the CPUs it may run on, bit i CPU i */
};

/* A small exchange slot: one per source rank in each peer's heap. */
struct fep_xslot {
	uint64_t seq;
	int64_t value;
};

FEP_EXPORT void fabep_comm_attr_init(fabep_comm_attr_t *attr)
{
	if (!attr)
		return;
	memset(attr, 0, sizeof(*attr));
	attr->size = sizeof(*attr);
	attr->rank = -1;
	attr->nranks = -1;
	attr->numa_node = -1;
}

/* The ranges of the attributes and of their variables (fabep(7)). */
#define FEP_TIMEOUT_MAX_MS 86400000
#define FEP_HEAP_MIN ((size_t)1 << 16)
#define FEP_HEAP_MAX ((size_t)1 << 40)
#define FEP_THREADS_MAX 1024
#define FEP_NUMA_MAX 4095

/* The caller's own values, where it gave one; 0 (and -1 for numa_node)
 * leave the field to the environment or the default. */
static int fep_attr_check(const fabep_comm_attr_t *a)
{
	if (a->timeout_ms < 0 || a->timeout_ms > FEP_TIMEOUT_MAX_MS) {
		fep_err("fabep_comm_create: timeout_ms %d is not 1 to %d "
			"(0: FABEP_TIMEOUT_MS or the default)", a->timeout_ms,
			FEP_TIMEOUT_MAX_MS);
		return -EINVAL;
	}
	if (a->heap_size && (a->heap_size < FEP_HEAP_MIN ||
			     a->heap_size > FEP_HEAP_MAX)) {
		fep_err("fabep_comm_create: heap_size %zu is not 64 KiB to 1 TiB "
			"(0: FABEP_HEAP_SIZE or the default)", a->heap_size);
		return -EINVAL;
	}
	if (a->threads < 0 || a->threads > FEP_THREADS_MAX) {
		fep_err("fabep_comm_create: threads %d is not 1 to %d "
			"(0: FABEP_THREADS or the default)", a->threads,
			FEP_THREADS_MAX);
		return -EINVAL;
	}
	if (a->numa_node < -1 || a->numa_node > FEP_NUMA_MAX) {
		fep_err("fabep_comm_create: numa_node %d is not 0 to %d "
			"(-1: FABEP_NUMA_NODE or the default)", a->numa_node,
			FEP_NUMA_MAX);
		return -EINVAL;
	}
	if (a->rendezvous_timeout_ms < -1 ||
	    a->rendezvous_timeout_ms > FEP_TIMEOUT_MAX_MS) {
		fep_err("fabep_comm_create: rendezvous_timeout_ms %d is not 1 to "
			"%d, or -1 for no limit (0: FABEP_RENDEZVOUS_TIMEOUT_MS "
			"or timeout_ms)", a->rendezvous_timeout_ms,
			FEP_TIMEOUT_MAX_MS);
		return -EINVAL;
	}
	return 0;
}

/* The rendezvous's limit when the attribute leaves it (0):
 * FABEP_RENDEZVOUS_TIMEOUT_MS (-1 or 1 to the maximum), else the calls'
 * timeout_ms.  0 or -EINVAL (logged). */
static int fep_rdv_from_env(fabep_comm_attr_t *a)
{
	long v;
	int ret;

	if (a->rendezvous_timeout_ms)
		return 0;
	a->rendezvous_timeout_ms = a->timeout_ms;
	ret = fep_env_long("FABEP_RENDEZVOUS_TIMEOUT_MS", -1, FEP_TIMEOUT_MAX_MS, &v);
	if (ret < 0)
		return ret;
	if (ret && !v) {
		fep_err("FABEP_RENDEZVOUS_TIMEOUT_MS=\"0\" refused: 1 to %d ms, "
			"or -1 for no limit", FEP_TIMEOUT_MAX_MS);
		return -EINVAL;
	}
	if (ret)
		a->rendezvous_timeout_ms = (int)v;
	return 0;
}

static int fep_attr_from_env(fabep_comm_attr_t *a)
{
	const char *s = NULL;
	long v;
	size_t sz;
	int ret;

	ret = fep_attr_check(a);
	if (ret)
		return ret;

	if (!a->provider && fep_env_str("FABEP_PROVIDER", &s) > 0)
		a->provider = s;
	if (!a->domain && fep_env_str("FABEP_DOMAIN", &s) > 0)
		a->domain = s;
	if (a->signal == FABEP_SIGNAL_AUTO && fep_env_str("FABEP_SIGNAL", &s) > 0) {
		if (fabep_signal_parse(s, &a->signal)) {
			fep_err("FABEP_SIGNAL=\"%s\" refused", s);
			return -EINVAL;
		}
	}
	if (a->timeout_ms <= 0) {
		a->timeout_ms = FEP_DEFAULT_TIMEOUT_MS;
		ret = fep_env_long("FABEP_TIMEOUT_MS", 1, FEP_TIMEOUT_MAX_MS, &v);
		if (ret < 0)
			return ret;
		if (ret)
			a->timeout_ms = (int)v;
	}
	ret = fep_rdv_from_env(a);
	if (ret)
		return ret;
	if (!a->heap_size) {
		a->heap_size = FEP_DEFAULT_HEAP;
		ret = fep_env_size("FABEP_HEAP_SIZE", FEP_HEAP_MIN, FEP_HEAP_MAX, &sz);
		if (ret < 0)
			return ret;
		if (ret)
			a->heap_size = sz;
	}
	if (a->threads <= 0) {
		ret = fep_env_long("FABEP_THREADS", 1, FEP_THREADS_MAX, &v);
		if (ret < 0)
			return ret;
		a->threads = ret ? (int)v : 0;
	}
	if (a->numa_node < 0) {
		/* -1, as in the attribute: the default (the NIC's node) */
		ret = fep_env_long("FABEP_NUMA_NODE", -1, FEP_NUMA_MAX, &v);
		if (ret < 0)
			return ret;
		if (ret)
			a->numa_node = (int)v;
	}
	return 0;
}

/* The inode of this process's PID namespace, 0 when unknown. */
static uint64_t fep_pidns(void)
{
	struct stat st;

	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Which /dev/shm this process sees: libfabric's shm keeps every
 * endpoint's queues in a file there, so ranks of one host reach each
 * other over shm only where they see the same one (containers each see
 * their own unless started with --ipc=host). */
static void fep_shm_id(uint64_t *dev, uint64_t *ino)
{
	struct stat st;

	*dev = *ino = 0;
	if (stat("/dev/shm", &st) == 0) {
		*dev = (uint64_t)st.st_dev;
		*ino = (uint64_t)st.st_ino;
	}
}

/* The state of process pid (of this host and PID namespace) as
 * /proc/<pid>/stat gives it ('R', 'S', 'T' stopped, 't' traced, 'Z'
 * zombie...): 0 when it is gone (ESRCH), '?' when it cannot be read. */
static char fep_pid_state(pid_t pid)
{
	char path[64], buf[512], *p;
	size_t n;
	FILE *f;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return '?';
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');  /* the name may hold spaces and parentheses */
	return p && p[1] == ' ' && p[2] ? p[2] : '?';
}

/* Whether process pid still runs: gone or a zombie ('Z', 'X') is dead;
 * anything we cannot tell counts as running. */
static int fep_pid_runs(pid_t pid)
{
	char st = fep_pid_state(pid);

	return st && st != 'Z' && st != 'X' && st != 'x';
}

/* After a wait timed out: name the ranks of this host whose process is
 * stopped (SIGSTOP, a job control stop, a debugger at a breakpoint),
 * which a counter summed over senders cannot single out and which the
 * liveness check counts as running.  Diagnosis only; skipped while
 * another thread runs the liveness check, which may mark a rank gone. */
static void fep_comm_tell_stopped(void *arg)
{
	fabep_comm_t *comm = arg;
	int r;

	if (!comm->peer_pid ||
	    atomic_exchange_explicit(&comm->alive_busy, 1, memory_order_acquire))
		return;
	for (r = 0; r < comm->size; r++) {
		char st;

		if (comm->peer_pid[r] <= 0)
			continue;
		st = fep_pid_state(comm->peer_pid[r]);
		if (st == 'T' || st == 't')
			fep_err("rank %d (process %d on this host) is stopped%s",
				r, (int)comm->peer_pid[r],
				st == 't' ? " in a debugger" : " (a signal or a debugger)");
	}
	atomic_store_explicit(&comm->alive_busy, 0, memory_order_release);
}

void fep_comm_fail(fabep_comm_t *comm, int code)
{
	int none = 0;

	comm->failed = true;
	__atomic_compare_exchange_n(&comm->broken, &none, code, false,
				    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* A communicator belongs to the process that made it: its endpoints,
 * shm regions, bootstrap connections and worker threads are that
 * process's.  A child of fork() has copies of the handles but not the
 * threads, and what it sent on the copies would land in the peers as
 * the parent's (counts and signals out of step, a goodbye to the peers
 * that ends the parent's communicator), so it may neither use nor
 * destroy a communicator made before the fork.  fep_fork_gen counts
 * the forks that led to this process; a handle made before one is
 * refused with -EPERM.  getpid() alone would not do: a grandchild may
 * get the pid of a process long gone. */
static unsigned fep_fork_gen;
static pthread_once_t fep_fork_once = PTHREAD_ONCE_INIT;

static void fep_fork_child(void)
{
	__atomic_add_fetch(&fep_fork_gen, 1, __ATOMIC_RELAXED);
}

static void fep_fork_watch(void)
{
	(void)pthread_atfork(NULL, NULL, fep_fork_child);
}

int fep_comm_forked(const fabep_comm_t *comm, const char *what)
{
	if (comm->fork_gen == __atomic_load_n(&fep_fork_gen, __ATOMIC_RELAXED))
		return 0;
	fep_err("%s: the communicator was made by process %d; process %d, a "
		"child of a fork() after it, can neither use nor destroy it (the "
		"parent's endpoints and connections would carry its traffic): "
		"make one of its own", what, (int)comm->pid, (int)getpid());
	return -EPERM;
}

int fep_comm_usable(fabep_comm_t *comm, const char *what)
{
	int code = fep_comm_forked(comm, what);

	if (code)
		return code;
	code = __atomic_load_n(&comm->broken, __ATOMIC_ACQUIRE);

	if (!code)
		code = fep_fabric_tx_error(comm->fab);
	if (!code)
		return 0;
	fep_err("%s: the communicator is unusable after an earlier failure "
		"(%s): destroy it", what, fabep_strerror(code));
	return code;
}

/* The fabric's liveness check: the ranks on this host (same boot, same
 * PID namespace) must still run, and the TCP bootstrap's connections
 * must not have closed without a goodbye (any host; the root tells the
 * other ranks).  A rank that died makes every wait fail at once with
 * -FABEP_ERR_PEER_LOST instead of after the timeout.  Without report, a
 * rank of this host gone is only told, neither logged nor marked (a wait
 * first drains what it sent); a lost bootstrap connection is logged at
 * once either way. */
static int fep_comm_alive_one(fabep_comm_t *comm, bool report)
{
	int r, lost = 0, ret;

	ret = fep_boot_watch(comm->boot);
	if (ret) {
		fep_comm_fail(comm, ret);
		return ret;
	}

	/* every rank gone, each named once (later waits fail silently);
	 * in destroy's round not one whose part of it is here: having all
	 * the others' too, it may have ended, while this rank still waits
	 * for a slower rank */
	for (r = 0; r < comm->size; r++) {
		pid_t pid = comm->peer_pid[r];

		if (!pid || fep_pid_runs(pid > 0 ? pid : -pid))
			continue;
		if (comm->ending &&
		    fep_counter_load(comm->fab, comm->bar_ctr + 8 * (uint64_t)r) >=
		    comm->bar_exp[r])
			continue;
		if (pid > 0 && report) {
			fep_err("rank %d (process %d on this host) has exited",
				r, (int)pid);
			comm->peer_pid[r] = -pid;
		}
		lost++;
	}
	if (!lost)
		return 0;
	if (report)
		fep_comm_fail(comm, -FABEP_ERR_PEER_LOST);
	return -FABEP_ERR_PEER_LOST;
}

/* One thread at a time; another that asks meanwhile is told all is well
 * and asks again at its next check, FEP_ALIVE_EVERY_MS later. */
static int fep_comm_alive(void *arg, bool report)
{
	fabep_comm_t *comm = arg;
	int ret;

	if (atomic_exchange_explicit(&comm->alive_busy, 1, memory_order_acquire))
		return 0;
	ret = fep_comm_alive_one(comm, report);
	atomic_store_explicit(&comm->alive_busy, 0, memory_order_release);
	return ret;
}

static void fep_host_id(char *buf, size_t len)
{
	char host[64] = "";
	char boot[40] = "";
	FILE *f;

	gethostname(host, sizeof(host) - 1);
	f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (f) {
		if (!fgets(boot, sizeof(boot), f))
			boot[0] = '\0';
		fclose(f);
		boot[strcspn(boot, "\n")] = '\0';
	}
	snprintf(buf, len, "%.23s/%.36s", host, boot);
}

static int fep_comm_boot(const fabep_comm_attr_t *a, fabep_comm_t *comm)
{
	struct fep_boot_env env;
	int ret;

	if (a->allgather) {
		if (a->nranks < 1 || a->rank < 0 || a->rank >= a->nranks) {
			fep_err("with an allgather callback, rank (%d) and nranks (%d) "
				"must satisfy 0 <= rank < nranks", a->rank, a->nranks);
			return -EINVAL;
		}
		return fep_boot_callback_create(a->rank, a->nranks, a->allgather,
						a->allgather_ctx, a->timeout_ms,
						&comm->boot);
	}
	ret = fep_boot_env_read(&env);
	if (ret)
		return ret;
	if (env.rank < 0 || env.size < 1) {
		/* Nothing said: a world of one. */
		env.rank = 0;
		env.size = 1;
	}
	if (env.size > 1 && !env.root_port) {
		fep_err("%d ranks but no rendezvous: set FABEP_ROOT=host:port "
			"(rank 0's address), or pass an allgather callback",
			env.size);
		return -EINVAL;
	}
	ret = fep_boot_tcp_create_rdv(env.rank, env.size, env.root_host,
				      env.root_port, a->timeout_ms,
				      a->rendezvous_timeout_ms, &comm->boot);
	/* a refused local pair: booted all the same, so that the caller
	 * tells the others (fep_comm_tell_refusal) instead of leaving them
	 * to wait for this rank until their timeout */
	return ret ? ret : env.local_status;
}

static int fep_comm_pick_numa(fabep_comm_t *comm, const fabep_comm_attr_t *a)
{
	int cpu;

	if (a->numa_node >= 0)
		return a->numa_node;
	if (comm->fab && comm->fab->desc.numa_node >= 0)
		return comm->fab->desc.numa_node;
	if (numa_available() < 0)
		return -1;
	cpu = sched_getcpu();
	return cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
}

/* The bootstrap's collectives (handle creations' exchanges) progress the
 * fabric while they wait: a peer may still be in its previous call,
 * waiting for a transfer to this rank that completes only through this
 * rank's progress (a delivery-complete write, shm's segmented writes),
 * and join the exchange only after it.  Errors surface at the next
 * fabric call (tx_error, lost peers). */
static void comm_boot_idle(void *ctx)
{
	fabep_comm_t *comm = ctx;

	(void)fep_fabric_progress_all(comm->fab);
}

/* Exchange one int64 with every rank over the fabric: out[size]. */
enum { XCHG_ALL, XCHG_DOWN, XCHG_UP };

/* Whether rank from writes to rank to in an exchange of direction dir:
 * every pair, or only downward (to < from) or upward (to > from). */
static bool xchg_writes(int dir, int from, int to)
{
	return dir == XCHG_ALL || (dir == XCHG_DOWN ? to < from : to > from);
}

static int fep_comm_xchg_dir(fabep_comm_t *comm, const char *what,
			     int64_t value, int64_t *out, int dir)
{
	fep_fabric_t *fab = comm->fab;
	struct fep_xslot *src = fep_heap_at(fab, comm->bar_src);
	struct fep_xslot *slots;
	struct fep_put *puts;
	uint64_t seq, base;
	int r, n = 0, ret;

	/* the source slot must not change under a write still in flight */
	ret = fep_fabric_quiet(fab);
	if (ret)
		return ret;
	seq = ++comm->bar_seq;
	/* the round's slots, by its parity: a peer that has read ours may
	 * already write its next round, never the one after (that needs
	 * this rank's next write, which comes after reading these) */
	base = comm->bar_slots + (seq & 1) * (uint64_t)comm->size * sizeof(*src);
	slots = fep_heap_at(fab, base);
	src->seq = seq;
	src->value = value;
	slots[comm->rank] = *src;
	if (comm->size == 1)
		goto done;
	puts = comm->xchg_puts;
	for (r = 1; r < comm->size; r++) {
		int peer = (comm->rank + r) % comm->size;

		if (!xchg_writes(dir, comm->rank, peer))
			continue;
		puts[n].peer = peer;
		puts[n].dst = base + (uint64_t)comm->rank * sizeof(*src);
		puts[n].src = comm->bar_src;
		puts[n].len = sizeof(*src);
		puts[n].sig = comm->bar_ctr + 8 * (uint64_t)comm->rank;
		puts[n].add = 1;
		n++;
	}
	ret = fep_fab_put_signal_many(fab, puts, (size_t)n);
	if (ret)
		return ret;
	/* each source's own counter: one sum over the sources could be
	 * reached by a fast peer's next round before a slow one's write of
	 * this round has landed.  Every source's target is set before the
	 * first wait: the liveness check of destroy's round reads them
	 * (fep_comm_alive_one) */
	for (r = 1; r < comm->size; r++) {
		int peer = (comm->rank + r) % comm->size;

		if (xchg_writes(dir, peer, comm->rank))
			comm->bar_exp[peer]++;
	}
	for (r = 1; r < comm->size; r++) {
		int peer = (comm->rank + r) % comm->size;
		uint64_t ctr = comm->bar_ctr + 8 * (uint64_t)peer;

		if (!xchg_writes(dir, peer, comm->rank) ||
		    fep_counter_load(fab, ctr) >= comm->bar_exp[peer])
			continue;
		ret = fep_comm_wait(comm, what, ctr, comm->bar_exp[peer],
				    dir != XCHG_ALL ? UINT64_MAX : base,
				    sizeof(struct fep_xslot), seq);
		if (ret)
			return ret;
	}
done:
	if (out && dir == XCHG_ALL)
		for (r = 0; r < comm->size; r++) {
			struct fep_xslot s;

			memcpy(&s, &slots[r], sizeof(s));
			if (s.seq != seq) {
				fep_err("%s: rank %d's slot holds round %llu, expected %llu",
					what, r, (unsigned long long)s.seq,
					(unsigned long long)seq);
				return -FABEP_ERR_PROTOCOL;
			}
			out[r] = s.value;
		}
	return 0;
}

static int fep_comm_xchg(fabep_comm_t *comm, const char *what, int64_t value,
			 int64_t *out)
{
	return fep_comm_xchg_dir(comm, what, value, out, XCHG_ALL);
}

struct chan_wait {
	fabep_comm_t *comm;
	uint64_t ctr, target;
	int stop;
	int err;
	int (*work)(void *);  /* tid 0's, first */
	void *work_ctx;
	int work_ret;
};

/* Thread tid of the pool progresses channels tid, tid + nthreads, ...
 * (on shm each copies what arrived on its channels), and any channel
 * that its thread leaves alone for long, until the counter is reached;
 * the caller (tid 0) keeps the wait's clock.  A worker that wakes after
 * the counter was reached skips the run, and whatever channel it owns is
 * rescued by the others meanwhile. */
static void chan_wait_fn(void *arg, int tid, int nthreads)
{
	struct chan_wait *w = arg;
	fep_fabric_t *fab = w->comm->fab;
	struct fep_backoff bo = { 0 };
	struct fep_chan_watch cw;
	uint64_t deadline = 0;
	unsigned n = 0;
	int ret = 0;

	if (tid >= fab->nchan)
		return;
	if (tid == 0 && w->work)  /* the others' rescue covers tid 0's channels */
		w->work_ret = w->work(w->work_ctx);
	memset(&cw, 0, sizeof(cw));
	for (;;) {
		if (fep_counter_load(fab, w->ctr) >= w->target ||
		    __atomic_load_n(&w->stop, __ATOMIC_ACQUIRE))
			return;
		ret = fep_fabric_progress_mine(fab, tid, nthreads, &cw, 16);
		if (!ret && tid == 0 && ((++n & 63) == 0 || bo.spins >= 64))
			ret = fep_fabric_clock_ctr(fab, &deadline, w->comm->timeout_ms,
						   w->ctr, w->target);
		if (ret) {
			int none = 0;

			__atomic_compare_exchange_n(&w->err, &none, ret, false,
						    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
			__atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
			return;
		}
		fep_backoff_step(&bo);
	}
}

int fep_comm_wait(fabep_comm_t *comm, const char *what, uint64_t ctr,
		  uint64_t target, uint64_t slots, size_t stride, uint64_t seq)
{
	return fep_comm_wait_with(comm, what, ctr, target, slots, stride, seq,
				  NULL, NULL);
}

static int comm_wait(fabep_comm_t *comm, const char *what, uint64_t ctr,
		     uint64_t target, uint64_t slots, size_t stride,
		     uint64_t seq, int (*work)(void *), void *work_ctx,
		     bool fatal);

int fep_comm_wait_with(fabep_comm_t *comm, const char *what, uint64_t ctr,
		       uint64_t target, uint64_t slots, size_t stride,
		       uint64_t seq, int (*work)(void *), void *work_ctx)
{
	return comm_wait(comm, what, ctr, target, slots, stride, seq, work,
			 work_ctx, true);
}

/* A wait of the library's own protocol (fatal) that times out marks the
 * communicator failed (destroy then does not wait for a goodbye, as a
 * peer may be gone: a later barrier that completes clears it), names
 * the ranks that never signalled and says which ranks of this host are
 * stopped; the handle whose counters it waited on is then out of step
 * and says so itself.  A caller's fabep_wait on its own counter does
 * none of this: a signal the caller's protocol never sent leaves the
 * library's state as it was, and the caller may wait again or go on. */
static int comm_wait(fabep_comm_t *comm, const char *what, uint64_t ctr,
		     uint64_t target, uint64_t slots, size_t stride,
		     uint64_t seq, int (*work)(void *), void *work_ctx,
		     bool fatal)
{
	fep_fabric_t *fab = comm->fab;
	char names[256];
	size_t len = 0;
	int r, ret, wret = 0, missing = 0;

	if (fab->nchan > 1 && fep_pool_threads(comm->pool) > 1 &&
	    fep_counter_load(fab, ctr) < target) {
		struct chan_wait w = { comm, ctr, target, 0, 0, work, work_ctx, 0 };

		ret = fep_pool_run(comm->pool, chan_wait_fn, &w);
		if (!ret)
			ret = w.err;
		wret = w.work_ret;
	} else {
		if (work)
			wret = work(work_ctx);
		ret = fep_fab_wait(fab, ctr, target, comm->timeout_ms);
	}
	if (ret != -ETIMEDOUT) {
		if (ret) {
			comm->failed = true;
			fep_err("%s: %s", what, fabep_strerror(ret));
		}
		return ret ? ret : wret;
	}
	if (!fatal) {
		fep_err("%s: timed out after %d ms (counter %llu of %llu)", what,
			comm->timeout_ms,
			(unsigned long long)fep_counter_load(fab, ctr),
			(unsigned long long)target);
		return -ETIMEDOUT;
	}
	names[0] = '\0';
	if (slots != UINT64_MAX) {
		if (!stride)
			stride = 8;
		for (r = 0; r < comm->size; r++) {
			uint64_t s;

			if (r == comm->rank)
				continue;
			s = __atomic_load_n((uint64_t *)fep_heap_at(fab, slots + (uint64_t)r * stride),
					    __ATOMIC_ACQUIRE);
			FEP_TSAN_OBSERVE(s);
			if (s < seq) {
				missing++;
				if (len < sizeof(names) - 16)
					len += (size_t)snprintf(names + len,
								sizeof(names) - len,
								"%s%d", missing > 1 ? ", " : "", r);
			}
		}
	}
	comm->failed = true;
	if (missing)
		fep_err("%s: timed out after %d ms; rank%s %s never signalled",
			what, comm->timeout_ms, missing > 1 ? "s" : "", names);
	else
		fep_err("%s: timed out after %d ms (counter %llu of %llu)", what,
			comm->timeout_ms,
			(unsigned long long)fep_counter_load(fab, ctr),
			(unsigned long long)target);
	fep_comm_tell_stopped(comm);
	return -ETIMEDOUT;
}

int fep_comm_allgather(fabep_comm_t *comm, const void *in, void *out, size_t len)
{
	return fep_boot_allgather(comm->boot, in, out, len);
}

int fep_comm_agree(fabep_comm_t *comm, int status)
{
	int64_t *all = comm->xchg_vals;
	int r, ret, first = 0, who = -1;

	ret = fep_comm_xchg(comm, "error agreement", status, all);
	if (!ret) {
		for (r = 0; r < comm->size; r++)
			if (all[r]) {
				first = (int)all[r];
				who = r;
				break;
			}
		if (status)
			ret = status;
		else if (first) {
			fep_err("rank %d reported: %s", who, fabep_strerror(first));
			ret = -FABEP_ERR_PEER;
		}
	}
	return ret;
}

int fep_comm_block(fabep_comm_t *comm, const struct fep_hb_hello *all_free,
		   size_t size, size_t ctr_bytes, uint64_t *off, uint64_t *ctrs)
{
	fep_fabric_t *fab = comm->fab;
	bool reused, used = false;
	int slot = -1, ret = fep_hb_alloc(fab, all_free, size, off, &reused);

	if (ret)
		return ret;
	*ctrs = *off;
	if (ctr_bytes <= FEP_CS_BYTES)
		slot = fep_cs_take(fab, all_free, &used);
	if (slot >= 0)
		*ctrs = fab->cs_base + (uint64_t)slot * FEP_CS_BYTES;
	if (!fep_fab_ctrs_named(fab, *ctrs, ctr_bytes)) {
		/* the same verdict on every rank, before anything is written */
		fep_err("the handle's counters at heap offset %llu lie beyond "
			"what %zu bytes of remote CQ data name, and no counter "
			"slot is free (%d, one per live handle): destroy handles "
			"first", (unsigned long long)*ctrs, fab->cq_data_size,
			fab->cs_n);
		fep_comm_block_free(comm, *off, *ctrs, true);
		return -ERANGE;
	}
	fep_dbg("heap block at %llu, %zu bytes%s, counters at %llu%s",
		(unsigned long long)*off, size, reused ? ", reused" : "",
		(unsigned long long)*ctrs, used ? ", reused" : "");
	reused = reused && *ctrs == *off;  /* its counters in the block */
	if (!reused && !used)
		return 0;
	if (reused)
		memset(fep_heap_at(fab, *off), 0, ctr_bytes);
	if (used)
		memset(fep_heap_at(fab, *ctrs), 0, FEP_CS_BYTES);
	ret = fep_comm_agree(comm, 0);
	if (ret) {
		fep_err("taking a heap block back: %s", fabep_strerror(ret));
		fep_comm_block_free(comm, *off, *ctrs, false);
	}
	return ret;
}

void fep_comm_block_free(fabep_comm_t *comm, uint64_t off, uint64_t ctrs,
			 bool clean)
{
	fep_hb_free(comm->fab, off, clean);
	if (ctrs != off)
		fep_cs_give(comm->fab, ctrs, clean);
}

/*
 * The dissemination barrier: in round k each rank signals rank + 2^k and
 * waits for rank - 2^k, so after ceil(log2 size) rounds each has heard,
 * directly or through others, from every rank.  One signal a round
 * where an exchange with every peer posts size - 1 and waits for as
 * many: at 16 ranks 4 signals, and the ranks leave within one signal's
 * latency of each other, which is what a timed call after the barrier
 * measures.  Round k's counter counts the barriers; a signal of the
 * next barrier that lands first only means its sender is past this one.
 * The previous calls' transfers are complete first, as for every
 * collective.  A round that fails (a timeout: a peer late or stopped)
 * leaves the barrier pending, and the next call finishes that one
 * instead of starting another: were it abandoned, the signals of its
 * later rounds would never go, and every later barrier of the peers
 * that wait for them would pass one signal early or not at all.
 */
static int fep_comm_barrier(fabep_comm_t *comm)
{
	fep_fabric_t *fab = comm->fab;
	uint64_t seq;
	int k, d, k0 = 0, ret;

	ret = fep_fabric_quiet(fab);
	if (ret || comm->size == 1)
		return ret;
	if (comm->dis_pend) {
		k0 = comm->dis_pend - 1;
		seq = comm->dis_seq;
	} else {
		seq = ++comm->dis_seq;
		comm->dis_sent = false;
	}
	for (k = 0, d = 1; d < comm->size; k++, d *= 2) {
		uint64_t ctr = comm->dis_ctr + 8 * (uint64_t)k;
		int from = (comm->rank - d + comm->size) % comm->size;
		char what[64];

		if (k < k0)
			continue;
		comm->dis_pend = k + 1;
		if (k > k0 || !comm->dis_sent) {
			comm->dis_sent = false;
			ret = fep_fab_signal(fab, (comm->rank + d) % comm->size, ctr, 1);
			if (ret)
				return ret;
			comm->dis_sent = true;
		}
		if (fep_counter_load(fab, ctr) >= seq)
			continue;
		snprintf(what, sizeof(what), "barrier: waiting for rank %d", from);
		ret = fep_comm_wait(comm, what, ctr, seq, UINT64_MAX, 0, 0);
		if (ret)
			return ret;
	}
	/* every rank entered this barrier, every write posted before it
	 * is complete: no peer is gone, whatever a failed wait before
	 * feared, so destroy says goodbye again */
	comm->dis_pend = 0;
	comm->failed = false;
	return 0;
}

FEP_EXPORT int fabep_barrier(fabep_comm_t *comm)
{
	int ret;

	if (!comm) {
		fep_err("fabep_barrier: NULL communicator");
		return -EINVAL;
	}
	ret = fep_comm_usable(comm, "fabep_barrier");
	return ret ? ret : fep_comm_barrier(comm);
}

/* Every rank reports its status; all return the same verdict. */
static int fep_boot_agree(fabep_comm_t *comm, int status, const char *what)
{
	int32_t *all = comm->boot_vals, r, ret;

	ret = fep_boot_allgather(comm->boot, &status, all, sizeof(status));
	if (!ret) {
		for (r = 0; r < comm->size; r++)
			if (all[r]) {
				if (!status)
					fep_err("%s failed on rank %d: %s", what, r,
						fabep_strerror(all[r]));
				ret = status ? status : -FABEP_ERR_PEER;
				break;
			}
	}
	return ret;
}

/* Who shares this rank's CPUs: the ranks of this host whose CPU sets
 * meet its own (itself included), and how many CPUs they have between
 * them, fewer where a cgroup's quota allows fewer.  More such ranks than
 * CPUs (a launcher that binds ranks to too few cores, taskset, a Slurm
 * or container cpuset, a container's CPU limit) and a rank that spins
 * in a wait takes the CPU from the peer it waits for. */
static void fep_comm_crowd(fabep_comm_t *comm, const struct fep_hello *h)
{
	const struct fep_hello *me = &h[comm->rank];
	uint64_t all[FEP_CPU_WORDS] = { 0 };
	int r, w, quota = 0, avail = 0;

	comm->cpu_share = 0;
	for (r = 0; r < comm->size; r++) {
		bool meet = r == comm->rank;

		if (strcmp(h[r].host, me->host))
			continue;
		for (w = 0; !meet && w < FEP_CPU_WORDS; w++)
			meet = (h[r].cpus[w] & me->cpus[w]) != 0;
		if (!meet)
			continue;
		comm->cpu_share++;
		for (w = 0; w < FEP_CPU_WORDS; w++)
			all[w] |= h[r].cpus[w];
		if (h[r].cpu_quota > 0 && (!quota || h[r].cpu_quota < quota))
			quota = h[r].cpu_quota;
	}
	for (w = 0; w < FEP_CPU_WORDS; w++)
		avail += __builtin_popcountll(all[w]);
	if (quota && quota < avail)
		avail = quota;
	comm->cpu_avail = avail > 0 ? avail : 1;
}

/* This process's CPUs for its hello: its affinity mask, or every online
 * CPU where that cannot be read; the cgroup's quota. */
static void fep_hello_cpus(struct fep_hello *hello)
{
	cpu_set_t set;
	long n, i;

	if (sched_getaffinity(0, sizeof(set), &set) < 0) {
		CPU_ZERO(&set);
		n = sysconf(_SC_NPROCESSORS_ONLN);
		for (i = 0; i < n && i < CPU_SETSIZE; i++)
			CPU_SET(i, &set);
	}
	for (i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set))
			hello->cpus[i / 64] |= (uint64_t)1 << (i % 64);
	hello->cpu_quota = fep_cgroup_cpus();
}

/* Whether libfabric's shm cannot join two ranks of one host: 1.17's shm
 * keeps each endpoint's queues in a file in /dev/shm named after its
 * process's pid, and reads and writes a peer's memory by that pid
 * (process_vm_readv/writev, its own check of it included), so the ranks
 * must see one /dev/shm and one PID namespace.  Containers have their
 * own of both unless started with --ipc=host and --pid=host; with one
 * /dev/shm but two PID namespaces shm's pids name the wrong processes
 * (two ranks with pid 1 each take the other's region for their own)
 * and libfabric crashes the process.  0 and 0 (no /dev/shm, no /proc
 * to tell the namespace) are a value like another. */
static const char *fep_shm_apart(const struct fep_hello *a,
				 const struct fep_hello *b)
{
	if (a->shm_dev != b->shm_dev || a->shm_ino != b->shm_ino)
		return "sees another /dev/shm";
	if (a->pidns != b->pidns)
		return "is in another PID namespace";
	return NULL;
}

static int fep_comm_check_hellos(fabep_comm_t *comm, struct fep_hello *h)
{
	const struct fep_hello *me = &h[comm->rank];
	int r;

	/* Peers' strings come off the wire: end each before comparing or
	 * printing it (found by fuzz/fuzz_comm_hello.c). */
	for (r = 0; r < comm->size; r++)
		h[r].host[sizeof(h[r].host) - 1] = '\0';
	/* a rank whose configuration was refused joined only to say so
	 * (fep_comm_refuse) */
	for (r = 0; r < comm->size; r++)
		if (h[r].status) {
			fep_err("rank %d refused its configuration: %s (its log "
				"says why)", r, fabep_strerror(h[r].status));
			return -FABEP_ERR_PEER;
		}
	comm->all_local = true;
	comm->shm_apart = -1;
	comm->local_rank = 0;
	comm->local_size = 0;
	for (r = 0; r < comm->size; r++) {
		if (comm->shm_apart < 0 && !strcmp(h[r].host, me->host) &&
		    (comm->shm_apart_why = fep_shm_apart(me, &h[r])))
			comm->shm_apart = r;
		if (comm->peer_pid && r != comm->rank && !strcmp(h[r].host, me->host) &&
		    me->pidns && h[r].pidns == me->pidns && h[r].pid > 0)
			comm->peer_pid[r] = (pid_t)h[r].pid;
		if (strcmp(h[r].host, me->host))
			comm->all_local = false;
		else {
			if (r < comm->rank)
				comm->local_rank++;
			comm->local_size++;
		}
		/* the provider and domain asked for may differ: each rank
		 * may name its own NIC, or leave the choice to fabep; the
		 * provider opened is compared when the addresses are
		 * (fep_fabric_connect) */
		if (h[r].signal != h[0].signal || h[r].heap_size != h[0].heap_size ||
		    h[r].channels != h[0].channels) {
			fep_err("configuration differs between ranks: rank 0 has "
				"signal %s heap %llu channels %d, rank %d has %s %llu %d",
				fep_signal_name(h[0].signal),
				(unsigned long long)h[0].heap_size, h[0].channels, r,
				fep_signal_name(h[r].signal),
				(unsigned long long)h[r].heap_size, h[r].channels);
			return -FABEP_ERR_MISMATCH;
		}
	}
	fep_comm_crowd(comm, h);
	return 0;
}

bool fep_comm_cma_crowded(const fabep_comm_t *comm)
{
	return comm->cpu_share >= FEP_CMA_CROWD * comm->cpu_avail;
}

/* Channels 1..n-1 of the fabric, opened and connected on every rank.
 * asked: FABEP_CHANNELS (the same on every rank, checked with the hellos),
 * or 0: with the cqdata strategy on shm as many as the pool has threads,
 * at most 8, on tcp at most 4 (each connection pushed by its own
 * thread, so a large run is not bound by one socket), the fewest of any
 * rank; with cma, one per thread (at most 8) where ranks have several
 * and number at least FEP_CMA_THREADS_RANKS, FEP_CMA_CHANNELS where they
 * have one thread, number at least FEP_CMA_CHANNEL_RANKS and no rank is
 * crowded (fep_comm_cma_crowded); elsewhere
 * one. */
static int fep_comm_open_channels(fabep_comm_t *comm, int asked, bool sig_auto)
{
	struct fep_fab_blob *mine, *all;
	int c, ret, status, n = asked;
	/* cma chosen by default gives way to cqdata with channels where
	 * ranks have several threads and are fewer than
	 * FEP_CMA_THREADS_RANKS: with 2 or 3 ranks a sender's copies (its
	 * lanes, one per peer) would take only one or two of its threads,
	 * and the receivers' threads copy side by side (one per channel),
	 * faster; with one thread, the sender's copy avoids the receiver's
	 * one-thread progress.  Both use the same endpoint (no ordering,
	 * atomics and CQ data).  From FEP_CMA_THREADS_RANKS ranks cma keeps
	 * a channel per thread, and where a target then has fewer senders
	 * than channels its large puts go in slices (cma_slices, below), so
	 * that every one of its threads copies a share. */
	bool may_switch = sig_auto && comm->fab->signal == FABEP_SIGNAL_CMA &&
			  (comm->fab->desc.signals & (1u << FABEP_SIGNAL_CQDATA));

	if (n > 1 && may_switch) {
		fep_info("FABEP_CHANNELS=%d: signal cqdata instead of cma", n);
		comm->fab->signal = FABEP_SIGNAL_CQDATA;
	}
	/* cma: a target's senders copy into its region one at a time,
	 * under the region's lock (shm, smr_generic_rma), and with many of
	 * them the copies queue there; channels give each target as many
	 * regions, and each rank sends on its own one (signal.c,
	 * put_cma_chan).  With one thread a rank, 4 channels from 16 ranks
	 * (dispatch and combine of 128 tokens 16 % faster at 16; no clear
	 * gain at 8); with several threads, one channel per thread from 4
	 * ranks (against cqdata with as many channels: at 4 ranks of four
	 * threads dispatch 22-30 % less time at 1 to 1024 tokens, combine
	 * 18 % at 8 tokens and the same at 128, the allreduce the same or
	 * up to 11 % less; at 8 ranks of two threads 16 % less at 128
	 * tokens and 20 % at one token; at 16 ranks of four threads 37-39 %
	 * less for a dispatch of 128 tokens and 45-51 % for one; at 8 of
	 * eight threads 45 % less at one token and the same at 128;
	 * docs/performance.md).  Not where some rank's CPUs are shared by
	 * FEP_CMA_CROWD times as many ranks or more: there a rank is often
	 * preempted holding a target's lock (its copy under it) while the
	 * others spin, and every further endpoint is one more region to
	 * map and queue to progress on the same CPUs. */
	if (!n) {
		const char *prov = comm->fab->desc.provider;
		int cap = fep_prov_is(prov, "shm") ? FEP_AUTO_CHANNELS :
			  fep_prov_is(prov, "tcp") ? FEP_AUTO_CHANNELS_TCP : 1;
		/* this rank's channels wanted, and whether its CPUs are
		 * crowded; the fewest and any, over every rank */
		int32_t mine[2] = { FEP_MIN(fep_pool_threads(comm->pool), cap),
				    fep_comm_cma_crowded(comm) };
		int32_t *all = comm->boot_vals, want = mine[0], crowded = 0;
		bool many;

		ret = fep_boot_allgather(comm->boot, mine, all, sizeof(mine));
		for (c = 0; !ret && c < comm->size; c++) {
			want = FEP_MIN(want, all[2 * c]);
			crowded |= all[2 * c + 1];
		}
		if (ret)
			return ret;
		many = want > 1 && comm->size >= FEP_CMA_THREADS_RANKS;
		if (may_switch && want > 1 && !many) {
			fep_info("%d threads per rank: signal cqdata with %d channels "
				 "instead of cma", want, want);
			comm->fab->signal = FABEP_SIGNAL_CQDATA;
		}
		if (comm->fab->signal == FABEP_SIGNAL_CQDATA ||
		    (comm->fab->signal == FABEP_SIGNAL_CMA && many))
			n = want;
		else if (comm->fab->signal == FABEP_SIGNAL_CMA && want == 1 &&
			 comm->size >= FEP_CMA_CHANNEL_RANKS && !crowded)
			n = FEP_CMA_CHANNELS;
		else
			n = 1;
	} else if (n > 1 && comm->fab->signal != FABEP_SIGNAL_CQDATA &&
		   comm->fab->signal != FABEP_SIGNAL_CMA) {
		fep_warn("FABEP_CHANNELS=%d needs the cqdata or cma signal "
			 "strategy, not %s: using one channel", n,
			 fep_signal_name(comm->fab->signal));
		n = 1;
	}
	/* cqdata in place of cma with at most FEP_SENDER_COPY_CHANNELS
	 * channels (FABEP_CHANNELS asked for them): dispatch still copies
	 * on the sender (shm's fast path, which the endpoint was opened
	 * for), since that one copy beats the receivers' copies on so few
	 * threads; combine keeps the receivers' */
	comm->fab->sender_copy = may_switch &&
				 comm->fab->signal == FABEP_SIGNAL_CQDATA &&
				 n <= FEP_SENDER_COPY_CHANNELS;
	/* cma with more channels than a target's senders, each channel
	 * progressed by a thread of its own: large puts in slices over
	 * every channel (signal.c, put_cma_chan) */
	comm->fab->cma_slices = comm->fab->signal == FABEP_SIGNAL_CMA && n > 1 &&
				comm->size - 1 < n &&
				fep_pool_threads(comm->pool) >= n;
	if (comm->fab->cma_slices)
		fep_info("cma with %d channels and %d sender%s to a target: puts "
			 "of %u KiB and more go in slices over every channel", n,
			 comm->size - 1, comm->size > 2 ? "s" : "",
			 2 * FEP_SLICE_MIN >> 10);
	if (n <= 1)
		return 0;
	mine = calloc((size_t)n, sizeof(*mine));
	all = calloc((size_t)n * (size_t)comm->size, sizeof(*all));
	status = mine && all ? fep_fabric_chan_open(comm->fab, n, mine) : -ENOMEM;
	ret = fep_boot_agree(comm, status, "opening the channels");
	for (c = 1; !ret && c < n; c++)
		ret = fep_boot_allgather(comm->boot, &mine[c - 1],
					 all + (size_t)(c - 1) * comm->size,
					 sizeof(*mine));
	if (!ret) {
		status = fep_fabric_chan_connect(comm->fab, all);
		ret = fep_boot_agree(comm, status, "connecting the channels");
	}
	free(mine);
	free(all);
	return ret;
}

/* The attributes in force: the caller's (checked by their size) or the
 * defaults, completed from the environment; *channels gets
 * FABEP_CHANNELS (0 when unset), *queue_warm FABEP_QUEUE_WARMUP (-1 never,
 * 0 auto, 1 always). */
/* The caller's attributes (already read into *a) completed from the
 * environment, and checked. */
static int fep_comm_config(fabep_comm_attr_t *a, int *channels,
			   int *queue_warm)
{
	const char *s = NULL;
	int ret;
	long v;

	ret = fep_attr_from_env(a);
	if (ret)
		return ret;
	*channels = 0;
	ret = fep_env_long("FABEP_CHANNELS", 1, FEP_MAX_CHANNELS, &v);
	if (ret < 0)
		return ret;
	if (ret)
		*channels = (int)v;
	*queue_warm = 0;
	if (fep_env_str("FABEP_QUEUE_WARMUP", &s) > 0) {
		if (!strcmp(s, "never") || !strcmp(s, "0"))
			*queue_warm = -1;
		else if (!strcmp(s, "always") || !strcmp(s, "1"))
			*queue_warm = 1;
		else if (strcmp(s, "auto")) {
			fep_err("FABEP_QUEUE_WARMUP=\"%s\" is not one of auto|always|never", s);
			return -EINVAL;
		}
	}
	if (a->signal < FABEP_SIGNAL_AUTO || a->signal > FABEP_SIGNAL_CMA) {
		fep_err("fabep_comm_create: signal %d is not a fabep_signal_t",
			(int)a->signal);
		return -EINVAL;
	}
	return 0;
}

/* Whether shm's CMA fast path works between every pair of ranks (the
 * cma strategy's condition): all on one host and PID namespace, and
 * every rank's process_vm_writev into every other succeeded.  Asked of
 * every rank, so all decide alike. */
static int fep_comm_cma_peers(fabep_comm_t *comm, const struct fep_hello *h,
			      bool *ok)
{
	int32_t mine = comm->all_local && fep_cma_usable(NULL, 0);
	int32_t *all = comm->boot_vals;
	int r, ret;

	for (r = 0; mine && r < comm->size; r++)
		if (r != comm->rank &&
		    (!comm->peer_pid[r] || !fep_cma_reach(comm->peer_pid[r],
							  h[r].cma_word)))
			mine = 0;
	ret = fep_boot_allgather(comm->boot, &mine, all, sizeof(mine));
	*ok = !ret;
	for (r = 0; !ret && r < comm->size; r++)
		*ok = *ok && all[r];
	return ret;
}

/* Who is where, and what each rank was configured with; *cma_peers:
 * whether every rank reaches every other with CMA. */
static int fep_comm_hello_all(fabep_comm_t *comm, const fabep_comm_attr_t *a,
			      int channels, struct fep_hello *hellos,
			      bool *cma_peers)
{
	struct fep_hello hello;
	int ret;

	memset(&hello, 0, sizeof(hello));
	fep_host_id(hello.host, sizeof(hello.host));
	hello.signal = a->signal;
	/* as the heap is mapped: whole pages */
	hello.heap_size = FEP_ALIGN_UP(a->heap_size, FEP_HEAP_PAGE);
	hello.pid = (int32_t)getpid();
	hello.channels = channels;
	hello.pidns = fep_pidns();
	hello.cma_word = fep_cma_word();
	fep_shm_id(&hello.shm_dev, &hello.shm_ino);
	fep_hello_cpus(&hello);
	ret = fep_boot_allgather(comm->boot, &hello, hellos, sizeof(hello));
	/* the hello's layout is the library's: another size is another build */
	if (ret == -FABEP_ERR_MISMATCH)
		fep_err("fabep_comm_create: the ranks' hellos differ: every rank "
			"must run the same build of fabep (this one: %s, hello of "
			"%zu bytes)", PACKAGE_VERSION, sizeof(hello));
	if (!ret)
		ret = fep_comm_check_hellos(comm, hellos);
	if (!ret)
		ret = fep_comm_cma_peers(comm, hellos, cma_peers);
	return ret;
}

/* The fabric, opened, its addresses exchanged and connected;
 * every rank learns whether every rank succeeded.  On failure
 * comm->fab may be open: the caller closes it. */
static int fep_comm_fabric(fabep_comm_t *comm, const fabep_comm_attr_t *a,
			   bool cma_peers)
{
	struct fep_fab_params fp;
	struct fep_fab_blob blob, *blobs;
	bool shm_named = a->provider && fep_prov_is(a->provider, "shm");
	int ret, status = 0;

	/* ranks of one host beyond shm's reach (fep_shm_apart): every
	 * rank knows it from the same hellos */
	if (comm->all_local && comm->shm_apart >= 0) {
		if (shm_named) {
			fep_err("provider \"%s\": rank %d shares this host but %s "
				"(a container of its own: start every rank's with "
				"--ipc=host --pid=host), where libfabric's shm cannot "
				"reach it", a->provider, comm->shm_apart,
				comm->shm_apart_why);
			status = -FABEP_ERR_NO_PROVIDER;
		} else if (!comm->rank && !a->provider) {
			fep_warn("rank %d shares this host but %s (a container "
				 "of its own: start every rank's with --ipc=host "
				 "--pid=host), where libfabric's shm cannot reach it: "
				 "a network provider is taken, several times slower",
				 comm->shm_apart, comm->shm_apart_why);
		}
	}
	blobs = calloc((size_t)comm->size, sizeof(*blobs));
	memset(&fp, 0, sizeof(fp));
	fp.provider = a->provider;
	fp.domain = a->domain;
	fp.signal = a->signal;
	fp.all_local = comm->all_local && comm->shm_apart < 0;
	fp.rank = comm->rank;
	fp.size = comm->size;
	fp.timeout_ms = a->timeout_ms;
	fp.heap_size = a->heap_size;
	fp.numa_node = a->numa_node;
	fp.cma_peers = cma_peers;
	if (!status)
		status = blobs ? fep_fabric_open(&fp, &comm->fab) : -ENOMEM;
	(void)fep_signals_restore();  /* a provider loaded just now */
	if (!status)
		fep_fabric_set_alive(comm->fab, fep_comm_alive, fep_comm_tell_stopped, comm);
	memset(&blob, 0, sizeof(blob));
	if (!status)
		status = fep_fabric_blob(comm->fab, &blob);
	ret = fep_boot_agree(comm, status, "opening the fabric");
	if (!ret)
		ret = fep_boot_allgather(comm->boot, &blob, blobs, sizeof(blob));
	if (!ret) {
		status = fep_fabric_connect(comm->fab, blobs);
		ret = fep_boot_agree(comm, status, "connecting");
	}
	free(blobs);
	return ret;
}

/* The kernel thread pool, near the NIC (or the caller, for shm). */
static int fep_comm_pool(fabep_comm_t *comm, const fabep_comm_attr_t *a)
{
	int ret;

	comm->numa_node = fep_comm_pick_numa(comm, a);
	ret = fep_pool_create(a->threads, comm->numa_node, comm->cpu_share,
			      &comm->pool);
	ret = fep_boot_agree(comm, ret, "creating the thread pool");
	if (ret)
		return ret;
	comm->numa_node = fep_pool_node(comm->pool);
	/* the CPUs of the ranks that share this one's, not this process's
	 * alone: a rank bound to one core of its own is not oversubscribed */
	comm->fab->oversubscribed = comm->cpu_share > comm->cpu_avail;
	fep_dbg("%d rank(s) of this host share its CPUs, %d of them%s",
		comm->cpu_share, comm->cpu_avail,
		comm->fab->oversubscribed ? ": waits yield at once" : "");
	return 0;
}

/*
 * The queues' warm-up.  libfabric 1.17's shm (smr_generic_rma,
 * smr_generic_atomic) writes every operation's commands into a ring of
 * rx_attr->size entries in the target's region, a file in /dev/shm that
 * each sender maps, under that region's spin lock; a sender's first
 * write to each page of the ring faults the page into its own mapping.
 * Where ranks outnumber the CPUs, a sender that faults, or is preempted,
 * with the lock held leaves every other sender to that target spinning
 * out its time slice: the first calls, until each sender has gone round
 * each target's ring, took two to three times as long as the later
 * ones (about 35 calls of dispatch and combine at 4 ranks on 2 CPUs,
 * 30 at 8; the number of calls follows the ring's size).  So, where any
 * rank asks for it, every rank sends each peer, on every channel,
 * rx_attr->size signals (each takes at least one entry of the ring;
 * at most FEP_WARM_MAX, for providers with deep queues) to a counter
 * that nothing else uses, before the first call.  In rounds:
 * a round's signals fill at most a quarter of any ring, and a rank
 * starts the next only once every peer's signals of this one have
 * arrived, so no post ever waits on a full ring (a post that does
 * progresses only its own channel, and two ranks waiting so on
 * different channels would wait for each other).  Every signal adds
 * nchan in the counter's raw units (chan[0]'s signals multiply their
 * adds so; a channel's do not), so that fep_counter_load counts
 * signals.
 */
static int fep_comm_warm_queues(fabep_comm_t *comm)
{
	fep_fabric_t *fab = comm->fab;
	size_t ring = FEP_MIN(fab->info->rx_attr->size, FEP_WARM_MAX), per, sent = 0, i;
	uint64_t target = 0, nchan = (uint64_t)fab->nchan, t0 = fep_now_ns();
	int c, p, ret = 0;

	per = ring / (4 * (size_t)(comm->size - 1));
	if (!per)
		per = 1;
	while (sent < ring && !ret) {
		size_t n = FEP_MIN(per, ring - sent);

		for (i = 0; i < n && !ret; i++)
			for (c = 0; c < fab->nchan && !ret; c++)
				for (p = 1; p < comm->size && !ret; p++)
					ret = fep_fab_signal(c ? fab->chan[c] : fab,
							     (comm->rank + p) % comm->size,
							     comm->warm_ctr, c ? nchan : 1);
		sent += n;
		target += n * nchan * (uint64_t)(comm->size - 1);
		if (!ret)
			ret = fep_comm_wait(comm, "the queues' warm-up",
					    comm->warm_ctr, target, UINT64_MAX, 0, 0);
	}
	if (!ret)
		fep_dbg("the queues' warm-up: %zu signals to each of %d peers on "
			"%d channel%s in %.1f ms", ring, comm->size - 1, fab->nchan,
			fab->nchan > 1 ? "s" : "", (double)(fep_now_ns() - t0) / 1e6);
	return ret;
}

/* Whether this rank asks for the queues' warm-up (FABEP_QUEUE_WARMUP). */
static bool fep_comm_wants_warm(const fabep_comm_t *comm)
{
	const fep_fabric_t *fab = comm->fab;

	if (comm->queue_warm)
		return comm->queue_warm > 0;
	return fab->oversubscribed && !strcmp(fab->desc.provider, "shm") &&
	       (comm->size - 1) * fab->nchan <= FEP_WARM_AUTO_PEERS;
}

/* Barrier objects, then the warm-up exchange (first contact on
 * every pair, so the first real transfer never stalls), and where a
 * rank asks for it (FABEP_QUEUE_WARMUP; by default on shm where this host
 * has more ranks than CPUs and a rank sends to at most
 * FEP_WARM_AUTO_PEERS peer endpoints) the queues' warm-up.  It moves
 * the first calls' cost to creation rather than saving time: at 4
 * ranks on 2 CPUs about 25 ms of creation against about 700 us more in
 * each of the first 35 calls of dispatch; at 32 ranks on 16 cores
 * (124 peer endpoints) the first calls were only 15 % slower, and 0.6 s
 * of warm-up did not make them faster. */
static int fep_comm_warm_up(fabep_comm_t *comm)
{
	int64_t *want = comm->xchg_vals;
	int ret, r, warm = 0;

	if ((ret = fep_heap_alloc_(comm->fab, 8 * (size_t)comm->size, 64,
				   &comm->bar_ctr)) ||
	    (ret = fep_heap_alloc_(comm->fab, 2 * (size_t)comm->size *
				   sizeof(struct fep_xslot), 64, &comm->bar_slots)) ||
	    (ret = fep_heap_alloc_(comm->fab, sizeof(struct fep_xslot), 64,
				   &comm->bar_src)) ||
	    (ret = fep_heap_alloc_(comm->fab, 8 * FEP_DIS_ROUNDS, 64,
				   &comm->dis_ctr)) ||
	    (ret = fep_heap_alloc_(comm->fab, 8, 64, &comm->warm_ctr)) ||
	    (ret = fep_cs_reserve(comm->fab, comm->fab->heap_size /
				  (16 * FEP_CS_BYTES))))
		return ret;
	/* First contact one direction at a time, higher to lower ranks and
	 * then back, so no pair connects from both ends at once (the sockets
	 * provider drops one of two crossing connections, failing what was
	 * posted on it), then every pair both ways. */
	ret = fep_comm_xchg_dir(comm, "warm-up exchange", 0, NULL, XCHG_DOWN);
	if (!ret)
		ret = fep_comm_xchg_dir(comm, "warm-up exchange", 0, NULL, XCHG_UP);
	/* the last one tells every rank whether any asks for the queues'
	 * warm-up */
	if (!ret)
		ret = fep_comm_xchg(comm, "warm-up exchange",
				    fep_comm_wants_warm(comm), want);
	for (r = 0; !ret && r < comm->size; r++)
		warm |= want[r] != 0;
	if (!ret && warm && comm->size > 1)
		ret = fep_comm_warm_queues(comm);
	return fep_boot_agree(comm, ret, "the warm-up exchange");
}

/*
 * A configuration refused on this rank (a bad FABEP_* variable, a bad
 * signal) is told to the others: the rank still meets them, as far as
 * its rendezvous settings allow, and its hello carries the error, so
 * their creation fails at once with -FABEP_ERR_PEER naming this rank
 * instead of at their timeout.  Nothing is kept.
 */
/* This rank refuses the creation (status): its hello, the first
 * exchange of every rank, says so, and the others fail at once with
 * -FABEP_ERR_PEER.  Frees the bootstrap. */
static void fep_comm_tell_refusal(fabep_comm_t *comm, int status)
{
	struct fep_hello hello, *hellos;

	memset(&hello, 0, sizeof(hello));
	hello.status = status;
	hellos = calloc((size_t)comm->boot->size, sizeof(*hellos));
	if (hellos)
		(void)fep_boot_allgather(comm->boot, &hello, hellos, sizeof(hello));
	free(hellos);
	fep_boot_destroy(comm->boot);
	comm->boot = NULL;
}

static void fep_comm_refuse(const fabep_comm_attr_t *a, int status)
{
	fabep_comm_attr_t b = *a;
	fabep_comm_t *comm = calloc(1, sizeof(*comm));

	if (!comm)
		return;
	/* the refusal may have come before FABEP_TIMEOUT_MS was read (a
	 * bad attribute, FABEP_SIGNAL): the rendezvous keeps to it all the
	 * same, as the peers do */
	if (b.timeout_ms <= 0 || b.timeout_ms > FEP_TIMEOUT_MAX_MS) {
		long v;

		b.timeout_ms = FEP_DEFAULT_TIMEOUT_MS;
		if (fep_env_long("FABEP_TIMEOUT_MS", 1, FEP_TIMEOUT_MAX_MS, &v) > 0)
			b.timeout_ms = (int)v;
	}
	if (b.rendezvous_timeout_ms < -1 ||
	    b.rendezvous_timeout_ms > FEP_TIMEOUT_MAX_MS)
		b.rendezvous_timeout_ms = 0;
	if (fep_rdv_from_env(&b))
		b.rendezvous_timeout_ms = b.timeout_ms;
	(void)fep_comm_boot(&b, comm);
	if (comm->boot)  /* booted, the local pair perhaps refused too */
		fep_comm_tell_refusal(comm, status);
	free(comm);
}

static void fep_comm_free_scratch(fabep_comm_t *comm)
{
	free(comm->peer_pid);
	free(comm->bar_exp);
	free(comm->xchg_puts);
	free(comm->xchg_vals);
	free(comm->boot_vals);
	free(comm->ualloc);
}

FEP_EXPORT int fabep_comm_create(const fabep_comm_attr_t *attr,
				 fabep_comm_t **out)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm;
	struct fep_hello *hellos;
	bool cma_peers = false;
	/* fep_comm_config sets both; zeroed for compilers that cannot tell */
	int ret, channels = 0, queue_warm = 0;

	if (!out) {
		fep_err("fabep_comm_create: NULL output pointer");
		return -EINVAL;
	}
	if (attr) {
		/* a struct refused here is not read: no rendezvous to tell */
		ret = fep_struct_in("fabep_comm_create", "fabep_comm_attr_t", &a,
				    sizeof(a), FEP_COMM_ATTR_SIZE0, attr);
		if (ret)
			return ret;
	} else {
		fabep_comm_attr_init(&a);
	}
	ret = fep_comm_config(&a, &channels, &queue_warm);
	if (ret) {
		fep_comm_refuse(&a, ret);
		return ret;
	}
	comm = calloc(1, sizeof(*comm));
	if (!comm) {
		fep_err("fabep_comm_create: out of memory");
		return -ENOMEM;
	}
	comm->handles.prev = comm->handles.next = &comm->handles;
	(void)pthread_once(&fep_fork_once, fep_fork_watch);
	comm->fork_gen = __atomic_load_n(&fep_fork_gen, __ATOMIC_RELAXED);
	comm->pid = getpid();
	comm->timeout_ms = a.timeout_ms;
	comm->queue_warm = queue_warm;
	ret = fep_comm_boot(&a, comm);
	if (ret) {
		if (comm->boot)
			fep_comm_tell_refusal(comm, ret);
		goto err_free;
	}
	comm->rank = comm->boot->rank;
	comm->size = comm->boot->size;
	fep_log_set_rank(comm->rank);
	comm->peer_pid = calloc((size_t)comm->size, sizeof(*comm->peer_pid));
	comm->bar_exp = calloc((size_t)comm->size, sizeof(*comm->bar_exp));
	comm->xchg_puts = calloc((size_t)comm->size, sizeof(*comm->xchg_puts));
	comm->xchg_vals = calloc((size_t)comm->size, sizeof(*comm->xchg_vals));
	comm->boot_vals = calloc(2 * (size_t)comm->size, sizeof(*comm->boot_vals));
	hellos = calloc((size_t)comm->size, sizeof(*hellos));
	if (!comm->peer_pid || !comm->bar_exp || !comm->xchg_puts ||
	    !comm->xchg_vals || !comm->boot_vals || !hellos) {
		fep_err("fabep_comm_create: out of memory for the tables of %d "
			"ranks", comm->size);
		free(hellos);
		ret = -ENOMEM;
		goto err_boot;
	}

	ret = fep_comm_hello_all(comm, &a, channels, hellos, &cma_peers);
	free(hellos);
	if (ret)
		goto err_boot;
	ret = fep_comm_fabric(comm, &a, cma_peers);
	if (ret)
		goto err_fabric;
	ret = fep_comm_pool(comm, &a);
	if (ret)
		goto err_fabric;
	/* the channels before any counter counts: they count in units of
	 * the channels */
	ret = fep_comm_open_channels(comm, channels, a.signal == FABEP_SIGNAL_AUTO);
	if (ret)
		goto err_fabric;
	ret = fep_comm_warm_up(comm);
	if (ret)
		goto err_fabric;

	comm->boot->idle = comm_boot_idle;
	comm->boot->idle_ctx = comm;
	fep_info("rank %d of %d: provider %s domain %s signal %s%s, %d channel%s, "
		 "%d threads on node %d", comm->rank, comm->size,
		 comm->fab->desc.provider, comm->fab->desc.domain,
		 fep_signal_name(comm->fab->signal),
		 comm->fab->sender_copy ? " (dispatch: the sender's copies)" : "",
		 comm->fab->nchan, comm->fab->nchan > 1 ? "s" : "",
		 fep_pool_threads(comm->pool), comm->numa_node);
	*out = comm;
	return 0;

err_fabric:
	if (comm->pool)
		fep_pool_destroy(comm->pool);
	if (comm->fab)
		fep_fabric_close(comm->fab);
err_boot:
	fep_boot_destroy(comm->boot);
err_free:
	fep_comm_free_scratch(comm);
	free(comm);
	return ret;
}

/* Free the communicator.  Everyone stops writing into everyone's heap
 * before it goes away, waiting for the others as long as any call does
 * (the timeout: ranks may reach destroy far apart).  After a failed wait
 * or transfer, or on abort, there is no wait: peers may be gone; and
 * where no rank is known lost no goodbye either, so that the peers see
 * this rank lost (where one is gone, they see that one and name it).
 * Without the exchange, peers still running may write into the heap
 * until they see this rank gone: its memory stays mapped (and taken)
 * until the process ends, so that no later mapping gets their bytes. */
void fep_comm_handle_add(fabep_comm_t *comm, struct fep_comm_handle *h,
			 void (*destroy)(struct fep_comm_handle *h))
{
	h->destroy = destroy;
	h->next = &comm->handles;
	h->prev = comm->handles.prev;
	h->prev->next = h;
	comm->handles.prev = h;
}

void fep_comm_handle_del(struct fep_comm_handle *h)
{
	if (!h->next)
		return;
	h->prev->next = h->next;
	h->next->prev = h->prev;
	h->next = h->prev = NULL;
}

static int fep_comm_end(fabep_comm_t *comm, bool abort)
{
	int ret = 0;

	/* the handles still alive, newest first, each taking itself off */
	while (comm->handles.prev != &comm->handles)
		comm->handles.prev->destroy(comm->handles.prev);

	if (!abort && !fep_fabric_tx_error(comm->fab) && !comm->failed) {
		comm->ending = true;
		ret = fep_comm_xchg(comm, "destroy", 0, NULL);
	} else {
		comm->boot->failed = !fep_comm_alive_one(comm, false);
		comm->fab->keep_heap = true;
	}
	if (comm->pool)
		fep_pool_destroy(comm->pool);
	comm->boot->idle = NULL;
	fep_fabric_close(comm->fab);
	fep_boot_destroy(comm->boot);
	fep_comm_free_scratch(comm);
	free(comm);
	return ret;
}

/* In a child of a fork after its creation nothing is touched (the
 * memory is this process's copy, freed when it ends; the rest is the
 * parent's), and the handles made on it stay as they are. */
FEP_EXPORT int fabep_comm_destroy(fabep_comm_t *comm)
{
	int ret;

	if (!comm)
		return 0;
	ret = fep_comm_forked(comm, "fabep_comm_destroy");
	if (ret)
		return ret;
	return fep_comm_end(comm, false);
}

FEP_EXPORT void fabep_comm_abort(fabep_comm_t *comm)
{
	if (comm && !fep_comm_forked(comm, "fabep_comm_abort"))
		(void)fep_comm_end(comm, true);
}

FEP_EXPORT int fabep_comm_rank(const fabep_comm_t *comm)
{
	return comm ? comm->rank : -EINVAL;
}

FEP_EXPORT int fabep_comm_size(const fabep_comm_t *comm)
{
	return comm ? comm->size : -EINVAL;
}

FEP_EXPORT const char *fabep_comm_provider(const fabep_comm_t *comm)
{
	return comm ? comm->fab->desc.provider : NULL;
}

FEP_EXPORT const char *fabep_comm_domain(const fabep_comm_t *comm)
{
	return comm ? comm->fab->desc.domain : NULL;
}

FEP_EXPORT fabep_signal_t fabep_comm_signal(const fabep_comm_t *comm)
{
	return comm ? comm->fab->signal : FABEP_SIGNAL_AUTO;
}

FEP_EXPORT int fabep_comm_channels(const fabep_comm_t *comm)
{
	return comm ? comm->fab->nchan : -EINVAL;
}

FEP_EXPORT int fabep_comm_threads(const fabep_comm_t *comm)
{
	return comm ? fep_pool_threads(comm->pool) : -EINVAL;
}

FEP_EXPORT int fabep_comm_numa_node(const fabep_comm_t *comm)
{
	return comm ? comm->numa_node : -EINVAL;
}

/* ---- one-sided ---- */

FEP_EXPORT int fabep_heap_alloc(fabep_comm_t *comm, size_t size, size_t align,
				fabep_off_t *off)
{
	uint64_t o;
	int ret;

	if (!comm || !off) {
		fep_err("fabep_heap_alloc: NULL communicator or offset");
		return -EINVAL;
	}
	if (comm->nualloc == comm->cualloc) {
		size_t c = comm->cualloc ? 2 * comm->cualloc : 16;
		uint64_t *a = realloc(comm->ualloc, 2 * c * sizeof(*a));

		if (!a) {
			fep_err("fabep_heap_alloc: out of memory");
			return -ENOMEM;
		}
		comm->ualloc = a;
		comm->cualloc = c;
	}
	ret = fep_heap_alloc_(comm->fab, size, align, &o);
	if (ret)
		return ret;
	comm->ualloc[2 * comm->nualloc] = o;
	comm->ualloc[2 * comm->nualloc + 1] = o + size;
	comm->nualloc++;
	*off = o;
	return 0;
}

/* Whether [off, off + len) lies within one range of fabep_heap_alloc
 * (len 0: off within one, its end included). */
static bool comm_user_range(const fabep_comm_t *comm, uint64_t off, size_t len)
{
	size_t lo = 0, hi = comm->nualloc;
	const uint64_t *a = comm->ualloc;

	/* the last range that starts at or below off */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (a[2 * mid] <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* ranges of 0 bytes share their start with the next one: any of
	 * those starting at off will do, the last is the widest */
	return lo && off <= a[2 * lo - 1] && len <= a[2 * lo - 1] - off;
}

/* 0, or -ERANGE with a message naming the call and the range.  No
 * bytes touch nothing: a signal-only put may name any offset (the
 * fabric still wants it inside the heap). */
static int comm_range(const fabep_comm_t *comm, const char *call,
		      const char *what, uint64_t off, size_t len)
{
	if (!len || comm_user_range(comm, off, len))
		return 0;
	if (!fep_heap_range_ok(comm->fab, off, len))
		fep_err("%s: %zu bytes at %s offset %llu leave the heap (%zu "
			"bytes)", call, len, what, (unsigned long long)off,
			comm->fab->heap_size);
	else
		fep_err("%s: %zu bytes at %s offset %llu are not within one "
			"allocation of fabep_heap_alloc", call, len, what,
			(unsigned long long)off);
	return -ERANGE;
}

FEP_EXPORT void *fabep_heap_ptr(fabep_comm_t *comm, fabep_off_t off)
{
	if (!comm || !comm_user_range(comm, off, 1))
		return NULL;
	return fep_heap_at(comm->fab, off);
}

FEP_EXPORT size_t fabep_heap_size(const fabep_comm_t *comm)
{
	return comm ? comm->fab->heap_size : 0;
}

FEP_EXPORT int fabep_put(fabep_comm_t *comm, int peer, fabep_off_t dst,
			 fabep_off_t src, size_t len)
{
	int ret;

	if (!comm) {
		fep_err("fabep_put: NULL communicator");
		return -EINVAL;
	}
	ret = fep_comm_usable(comm, "fabep_put");
	if (!ret)
		ret = comm_range(comm, "fabep_put", "destination", dst, len);
	if (!ret)
		ret = comm_range(comm, "fabep_put", "source", src, len);
	return ret ? ret : fep_fab_write(comm->fab, peer, dst, src, len, 0);
}

FEP_EXPORT int fabep_put_signal(fabep_comm_t *comm, int peer, fabep_off_t dst,
				fabep_off_t src, size_t len, fabep_off_t sig,
				uint64_t add)
{
	int ret;

	if (!comm) {
		fep_err("fabep_put_signal: NULL communicator");
		return -EINVAL;
	}
	if (!add) {
		fep_err("fabep_put_signal: add must be nonzero (use fabep_put)");
		return -EINVAL;
	}
	/* UINT64_MAX is the library's own mark of a pointer source */
	if (src == FEP_PUT_PTR) {
		fep_err("fabep_put_signal: source offset %llu leaves the heap "
			"(%zu bytes)", (unsigned long long)src, comm->fab->heap_size);
		return -ERANGE;
	}
	ret = fep_comm_usable(comm, "fabep_put_signal");
	if (!ret)
		ret = fep_fab_user_add_ok(comm->fab, add);
	if (!ret)
		ret = comm_range(comm, "fabep_put_signal", "destination", dst, len);
	if (!ret)
		ret = comm_range(comm, "fabep_put_signal", "source", src, len);
	if (!ret && !(sig & 7) && !comm_user_range(comm, sig, 8)) {
		fep_err("fabep_put_signal: counter offset %llu is not within "
			"one allocation of fabep_heap_alloc",
			(unsigned long long)sig);
		ret = -EINVAL;
	}
	return ret ? ret : fep_fab_put_signal(comm->fab, peer, dst, src, len, sig, add);
}

FEP_EXPORT int fabep_get(fabep_comm_t *comm, int peer, fabep_off_t dst,
			 fabep_off_t src, size_t len)
{
	int ret;

	if (!comm) {
		fep_err("fabep_get: NULL communicator");
		return -EINVAL;
	}
	ret = comm_range(comm, "fabep_get", "local", dst, len);
	if (!ret)
		ret = comm_range(comm, "fabep_get", "source", src, len);
	if (!ret)
		ret = fep_comm_usable(comm, "fabep_get");
	return ret ? ret : fep_fab_read(comm->fab, peer, fep_heap_at(comm->fab, dst),
					src, len);
}

FEP_EXPORT int fabep_flush(fabep_comm_t *comm)
{
	int ret;

	if (!comm) {
		fep_err("fabep_flush: NULL communicator");
		return -EINVAL;
	}
	ret = fep_comm_usable(comm, "fabep_flush");
	return ret ? ret : fep_fabric_quiet(comm->fab);
}

FEP_EXPORT int fabep_wait(fabep_comm_t *comm, fabep_off_t sig, uint64_t target)
{
	int ret;

	if (!comm) {
		fep_err("fabep_wait: NULL communicator");
		return -EINVAL;
	}
	if ((sig & 7) || !comm_user_range(comm, sig, 8)) {
		fep_err("fabep_wait: counter offset %llu is not 8-byte aligned "
			"within an allocation of fabep_heap_alloc",
			(unsigned long long)sig);
		return -EINVAL;
	}
	ret = fep_comm_usable(comm, "fabep_wait");
	return ret ? ret : comm_wait(comm, "fabep_wait", sig, target,
				     UINT64_MAX, 0, 0, NULL, NULL, false);
}

FEP_EXPORT uint64_t fabep_counter_read(fabep_comm_t *comm, fabep_off_t sig)
{
	if (!comm || (sig & 7) || !comm_user_range(comm, sig, 8))
		return 0;
	return fep_counter_load(comm->fab, sig);
}

FEP_EXPORT int fabep_progress(fabep_comm_t *comm)
{
	int ret;

	if (!comm) {
		fep_err("fabep_progress: NULL communicator");
		return -EINVAL;
	}
	ret = fep_comm_usable(comm, "fabep_progress");
	if (!ret)
		ret = fep_fabric_progress_all(comm->fab);
	/* a caller polling memory for a peer that has gone would otherwise
	 * poll until its own timeout: the waits' liveness check, at most
	 * every FEP_ALIVE_EVERY_MS, after what arrived was progressed */
	if (!ret)
		ret = fep_fabric_alive_due(comm->fab);
	if (ret == -FABEP_ERR_PEER_LOST)
		(void)fep_fabric_progress_all(comm->fab);
	return ret;
}
