/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_faults.c - what survivors see when a rank dies or stalls, bad
 * rendezvous peers, and bad arguments to every public call.
 *
 * Fault matrix (shm and tcp, kills on sockets; 3 forked ranks,
 * FABEP_TIMEOUT_MS=1000): rank 2 is killed with SIGKILL before, during
 * and after a dispatch, a combine and an allreduce, or stopped with
 * SIGSTOP during one (or, under delivery, before one: the survivors'
 * writes to it never complete).  Every survivor
 * must return -ETIMEDOUT, -FABEP_ERR_PEER_LOST or -FABEP_ERR_PEER within
 * the timeout (plus slack) of entering the failing call (for a killed
 * rank, which runs on this host, -FABEP_ERR_PEER_LOST: the waits' check
 * that the ranks of this host still run), log a message
 * naming rank 2 (its stderr is captured into a file and searched; a
 * timeout with rank 2 stopped must also say that it is stopped), have
 * the failed call's handle refuse its next call at once, and find the
 * communicator refusing a barrier at once where rank 2 is lost or its
 * own transfers timed out, or timing out again where rank 2 is only
 * stopped; then free its handles and destroy its communicator within a
 * bound.  A stopped rank
 * is resumed (SIGCONT) once the survivors are done and must itself fail
 * cleanly.  Each case prints one table row ("FAULTROW | ...") to stderr:
 * fault, operation, provider, the error, and the milliseconds from the
 * fault to the error (grep FAULTROW in the test's log).
 *
 * "During" is between the send and receive halves for dispatch and
 * combine; for allreduce (no halves) the victim's input pages are
 * PROT_NONE, and the SIGSEGV handler kills or stops it at the library's
 * first read of the input, inside the call.  "After" is once the call returned
 * on the victim: the survivors fail in the next call.
 */
#include "config.h"

#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <malloc.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "fabep.h"
#include "harness.h"
#include "util/util.h"

/* With --enable-sanitizers, survivors check for leaks after they freed
 * everything (fep_test_leak_check), to report them with the case's row. */

#define TIMEOUT_MS 1000
/* slack over the timeout when ranks outnumber the cores */
#define SLACK_MS 1500
#define NRANKS 3
#define VICTIM (NRANKS - 1)
#define FAULT_ROUND 3
#define ROUNDS (FAULT_ROUND + 2)

enum { OP_DISPATCH, OP_COMBINE, OP_AR, OP_N };
/* F_KILL_PACK: inside dispatch_send, after its headers left (the runs
 * are big enough to post them before packing), while reading the tokens */
enum { F_KILL_BEFORE, F_KILL_DURING, F_KILL_AFTER, F_STOP, F_KILL_PACK,
       F_STOP_BEFORE, F_N };

static const char *op_names[] = { "dispatch", "combine", "allreduce" };
static const char *fault_names[] = { "SIGKILL before", "SIGKILL during",
				     "SIGKILL after", "SIGSTOP during",
				     "SIGKILL packing", "SIGSTOP before" };

struct rank_res {
	int err;          /* the first error a survivor saw */
	int failed_op;    /* in which operation */
	int round;        /* of which round */
	int64_t call_ms;  /* from entering that call to its return */
	int64_t fault_ms; /* from the fault to that return */
	int64_t destroy_ms;
	int destroy_ret;
	int named;        /* its log names the victim */
	int leaked;       /* LeakSanitizer found leaks after destroy */
	int incomplete;   /* how often its log says transfers were incomplete */
	int incomplete_call; /* of them, before its barrier after the failure */
	int blamed;       /* ...and that the oldest of them go to the victim */
	int stopped;      /* its log says the victim is stopped */
	int again;        /* the failed operation called once more */
	int64_t again_ms;
	int again_said;   /* its message says the handle is unusable */
	int bar;          /* then a barrier on the communicator */
	int64_t bar_ms;
	int bar_said;     /* its message says the communicator is unusable */
	int bar_stopped;  /* or that the victim is stopped */
	int done;
	/* while its stderr is captured: the file, for the parent to show
	 * what it said if it dies there */
	char cap[64];
};

struct shared {
	pid_t pid[NRANKS];
	int64_t t_fault_ns;  /* set by the victim just before it dies/stops */
	int survivors_done;
	int survivors_seen;  /* survivors that have seen the fault */
	struct rank_res res[NRANKS];
};

static struct shared *g_sh;
/* the case requires a survivor's wait for completions to time out */
static int g_want_incomplete;

struct fcase {
	const char *prov;
	int op, fault;
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

static void shared_init(void)
{
	if (!g_sh) {
		g_sh = mmap(NULL, sizeof(*g_sh), PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		ck_assert(g_sh != MAP_FAILED);
	}
	memset(g_sh, 0, sizeof(*g_sh));
}

/* ---- stderr capture ---- */

struct capture {
	FILE *f;
	int saved;
	char *path;  /* the file's name (shared with the parent) or NULL */
};

/* stderr into a file until capture_end; with `path` (room for 64 bytes,
 * in the shared page) a named one, which the parent reads if this
 * process dies before capture_end (fault_said), else an unnamed one. */
static void capture_begin(struct capture *c, char *path)
{
	int fd = -1;

	fflush(stderr);
	c->f = NULL;
	c->saved = -1;
	c->path = NULL;
	if (path) {
		snprintf(path, 64, "/tmp/fep_faults_XXXXXX");
		fd = mkstemp(path);
		if (fd >= 0) {
			c->f = fdopen(fd, "w+");
			if (!c->f)
				close(fd);
		}
		if (c->f)
			c->path = path;
		else if (fd >= 0)
			unlink(path);
		if (!c->f)
			path[0] = '\0';
	}
	if (!c->f)
		c->f = tmpfile();
	if (!c->f)
		return;
	c->saved = dup(2);
	dup2(fileno(c->f), 2);
}

/* The last line a rank wrote to its capture file before it died there
 * ("" when none), and the file removed. */
static const char *fault_said(char *path)
{
	static char line[256];
	char buf[4096];
	FILE *f;
	size_t n = 0;
	char *p;

	line[0] = '\0';
	if (!path[0])
		return line;
	f = fopen(path, "r");
	if (f) {
		if (fseek(f, -(long)(sizeof(buf) - 1), SEEK_END))
			fseek(f, 0, SEEK_SET);
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	p = strrchr(buf, '\n');
	snprintf(line, sizeof(line), "%.*s", (int)sizeof(line) - 1, p ? p + 1 : buf);
	unlink(path);
	path[0] = '\0';
	return line;
}

/* How much has been captured so far (stderr's file offset: the file's
 * own stream is never written through). */
static long capture_tell(struct capture *c)
{
	fflush(stderr);
	return c->f ? (long)lseek(fileno(c->f), 0, SEEK_CUR) : 0;
}

/* Restore stderr; returns the captured text (malloc'd, "" on failure). */
static char *capture_end(struct capture *c)
{
	char *buf;
	long n;

	fflush(stderr);
	if (!c->f)
		return strdup("");
	dup2(c->saved, 2);
	close(c->saved);
	if (c->path) {
		unlink(c->path);
		c->path[0] = '\0';
	}
	fseek(c->f, 0, SEEK_END);
	n = ftell(c->f);
	if (n < 0)
		n = 0;
	buf = calloc(1, (size_t)n + 1);
	fseek(c->f, 0, SEEK_SET);
	if (buf && n && fread(buf, 1, (size_t)n, c->f) != (size_t)n)
		buf[0] = '\0';
	fclose(c->f);
	return buf ? buf : strdup("");
}

/* Whether a log line names rank `r` as the culprit ("rank 2", "ranks 0, 2"). */
static int log_names(const char *log, int r)
{
	static const char *const fmt[] = { "rank %d ", "ranks %d", ", %d never",
					   "rank %d:", "rank %d)", "rank %d\n", ", %d)" };
	char pat[32];
	unsigned i;

	for (i = 0; i < sizeof(fmt) / sizeof(fmt[0]); i++) {
		snprintf(pat, sizeof(pat), fmt[i], r);
		if (strstr(log, pat))
			return 1;
	}
	return 0;
}

/* ---- the victim ---- */

/* Whether process pid is stopped ('T' in /proc/<pid>/stat). */
static int pid_stopped(pid_t pid)
{
	char path[64], buf[512], *p;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'T';
}

/* Whether the fault stops the victim (it runs on, resumed at the end). */
static int is_stop(int fault)
{
	return fault == F_STOP || fault == F_STOP_BEFORE;
}

static void fault_now(int sig)
{
	__atomic_store_n(&g_sh->t_fault_ns, now_ns(), __ATOMIC_SEQ_CST);
	kill(getpid(), sig);
}

/* A fault before an operation: the victim faults; for a stop, the
 * survivors enter the operation only once it is stopped (up to 5 s), so
 * that nothing they send there is taken in by its progress. */
static void fault_before(int victim, int sig)
{
	int64_t dl_ns = now_ns() + 5000000000ll;

	if (victim) {
		fault_now(sig);
		return;
	}
	while (sig == SIGSTOP && !pid_stopped(g_sh->pid[VICTIM]) && now_ns() < dl_ns)
		sleep_us(1000);
}

/*
 * "During" an allreduce: the victim passes an input whose pages are
 * PROT_NONE from byte `keep` on, so the library's first read of them
 * faults inside the call; the handler then kills the process (or stops
 * it, after making the pages readable, so that it resumes where it was).
 * The allreduce's trap covers only the rows the victim owns, which the
 * library reduces itself after phase 1: the rows it sends may leave
 * straight from the input, read by the provider (the kernel's
 * process_vm_writev on shm), where an unreadable page fails the write
 * instead of trapping.
 */
static void *g_trap;
static size_t g_trap_len;
static int g_trap_sig;
static int g_trap_hit;  /* a thread has taken the fault */

static void trap_handler(int sig, siginfo_t *si, void *uc)
{
	char *a = si->si_addr;

	(void)sig;
	(void)uc;
	if (!g_trap || a < (char *)g_trap || a >= (char *)g_trap + g_trap_len) {
		signal(SIGSEGV, SIG_DFL);
		return; /* a real crash: fault again, default action */
	}
	/* several of the pool's threads may read the input at once: only the
	 * first stops (or kills) the process; another returns and faults
	 * again until the pages are readable, then goes on.  Were it to stop
	 * the process too, its stop could come after the resume, and nobody
	 * would resume it again. */
	if (__atomic_exchange_n(&g_trap_hit, 1, __ATOMIC_SEQ_CST))
		return;
	mprotect(g_trap, g_trap_len, PROT_READ | PROT_WRITE);
	fault_now(g_trap_sig);
}

/* A copy of len bytes at src whose bytes from keep on are unreadable
 * (keep a multiple of the page size); the first read of them stops or
 * kills the process (trap_handler).  NULL when it cannot be made. */
static void *trap_input(const void *src, size_t len, size_t keep, int sig)
{
	struct sigaction sa;
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	g_trap_len = (len + pg - 1) / pg * pg;
	g_trap = mmap(NULL, g_trap_len, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (g_trap == MAP_FAILED)
		return NULL;
	memcpy(g_trap, src, len);
	g_trap_sig = sig;
	g_trap_hit = 0;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = trap_handler;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, NULL);
	if (keep % pg || keep >= g_trap_len)
		return NULL;
	mprotect((char *)g_trap + keep, g_trap_len - keep, PROT_NONE);
	return g_trap;
}

/* ---- one rank of a fault case ---- */

#define E_EXPERTS 6
#define E_TOPK 2
/* 16 records of 4 KiB and more: dispatch posts its headers before
 * packing (FEP_EP_EARLY_BYTES) */
#define E_HIDDEN 2048
#define E_TOKENS 16
#define AR_ROWS 64
#define AR_COLS 1024     /* a row is one 4 KiB page */
/* the first row the victim owns in the two-stage allreduce */
#define AR_VICTIM_ROW0 (VICTIM * ((AR_ROWS + NRANKS - 1) / NRANKS))

struct world {
	fabep_comm_t *comm;
	fabep_moe_t *moe;
	fabep_allreduce_t *ar;
	int32_t ids[E_TOKENS * E_TOPK];
	float w[E_TOKENS * E_TOPK];
	uint16_t x[E_TOKENS * E_HIDDEN];
	uint16_t *y;
	uint16_t out[E_TOKENS * E_HIDDEN];
	float *arin, *arout;
};

static int world_open(struct world *wd, int rank, int size)
{
	fabep_moe_config_t cfg;
	fabep_comm_attr_t a;
	uint64_t s = 77 + (uint64_t)rank;
	size_t i;
	int ret;

	memset(wd, 0, sizeof(*wd));
	fabep_moe_config_init(&cfg);
	cfg.num_experts = E_EXPERTS;
	cfg.top_k = E_TOPK;
	cfg.hidden = E_HIDDEN;
	cfg.max_tokens = E_TOKENS;
	fabep_comm_attr_init(&a);
	a.threads = fep_test_threads(1);
	a.timeout_ms = TIMEOUT_MS;
	a.heap_size = fabep_moe_heap_bytes(&cfg, size) +
		      fabep_allreduce_heap_bytes(AR_ROWS, AR_COLS, FABEP_AR_F32, size) +
		      (2u << 20);
	ret = fabep_comm_create(&a, &wd->comm);
	if (ret) {
		fprintf(stderr, "rank %d: fabep_comm_create: %s\n", rank, fabep_strerror(ret));
		return ret;
	}
	if (getenv("FABEP_CHANNELS") &&
	    fabep_comm_channels(wd->comm) != atoi(getenv("FABEP_CHANNELS"))) {
		fprintf(stderr, "rank %d: %d channels, FABEP_CHANNELS=%s\n", rank,
			fabep_comm_channels(wd->comm), getenv("FABEP_CHANNELS"));
		return -EINVAL;
	}
	if (getenv("FABEP_SIGNAL") &&
	    strcmp(fabep_signal_name(fabep_comm_signal(wd->comm)), getenv("FABEP_SIGNAL"))) {
		fprintf(stderr, "rank %d: signal %s, FABEP_SIGNAL=%s\n", rank,
			fabep_signal_name(fabep_comm_signal(wd->comm)),
			getenv("FABEP_SIGNAL"));
		return -EINVAL;
	}
	ret = fabep_moe_create(wd->comm, &cfg, &wd->moe);
	if (!ret)
		ret = fabep_allreduce_create(wd->comm, AR_ROWS, AR_COLS, FABEP_AR_F32,
					     &wd->ar);
	if (ret) {
		fprintf(stderr, "rank %d: handles: %s\n", rank, fabep_strerror(ret));
		return ret;
	}
	for (i = 0; i < E_TOKENS * E_TOPK; i++) {
		wd->ids[i] = (int32_t)(fep_test_rand(&s) % E_EXPERTS);
		wd->w[i] = 0.5f;
	}
	for (i = 0; i < E_TOKENS * E_HIDDEN; i++)
		wd->x[i] = 0x3f80; /* 1.0 */
	wd->y = calloc((size_t)E_TOKENS * E_TOPK * NRANKS * E_HIDDEN, 2);
	wd->arin = calloc(AR_ROWS * AR_COLS, 4);
	wd->arout = calloc(AR_ROWS * AR_COLS, 4);
	if (!wd->y || !wd->arin || !wd->arout)
		return -ENOMEM;
	for (i = 0; i < AR_ROWS * AR_COLS; i++)
		wd->arin[i] = (float)rank + 1;
	return 0;
}

/* Free the handles (not collective), then destroy the communicator. */
static int world_close(struct world *wd, int64_t *ms)
{
	int64_t t0;
	int ret;

	fabep_moe_destroy(wd->moe);
	fabep_allreduce_destroy(wd->ar);
	t0 = now_ns();
	ret = fabep_comm_destroy(wd->comm);
	if (ms)
		*ms = (now_ns() - t0) / 1000000;
	free(wd->y);
	free(wd->arin);
	free(wd->arout);
	return ret;
}

static int fault_rank(int rank, int size, void *arg)
{
	const struct fcase *fc = arg;
	struct rank_res *res = &g_sh->res[rank];
	int stop = is_stop(fc->fault);
	int victim = rank == VICTIM, sig = stop ? SIGSTOP : SIGKILL;
	int during = fc->fault == F_KILL_DURING || fc->fault == F_STOP;
	int before = fc->fault == F_KILL_BEFORE || fc->fault == F_STOP_BEFORE;
	struct capture cap;
	struct world wd;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	int round, op = 0, ret = 0, rc = 0;
	int64_t t_call = 0, tf;
	long bar_off = -1;      /* the log's length before the barrier */
	char *log;
	const char *p;

	g_sh->pid[rank] = getpid();
	capture_begin(&cap, res->cap);
	ret = world_open(&wd, rank, size);
	if (ret) {
		/* creation itself can time out on a loaded machine: the
		 * caller tries again */
		log = capture_end(&cap);
		fprintf(stderr, "%s", log);
		free(log);
		if (wd.comm) {
			fabep_moe_destroy(wd.moe);
			fabep_allreduce_destroy(wd.ar);
			fabep_comm_destroy(wd.comm);
		}
		return 77;
	}
	for (round = 1; round <= ROUNDS && !ret; round++) {
		int hit = victim && round == FAULT_ROUND;

		/* dispatch */
		op = OP_DISPATCH;
		if (fc->op == OP_DISPATCH && before && round == FAULT_ROUND)
			fault_before(victim, sig);
		{
			const void *x = wd.x;

			if (hit && fc->op == OP_DISPATCH && fc->fault == F_KILL_PACK) {
				x = trap_input(wd.x, sizeof(wd.x), 0, sig);
				if (!x) {
					rc = 4;
					break;
				}
			}
			t_call = now_ns();
			ret = fabep_moe_dispatch_send(wd.moe, x, NULL, E_TOKENS, wd.ids,
						      wd.w);
		}
		if (ret)
			break;
		if (hit && fc->op == OP_DISPATCH && during)
			fault_now(sig);
		ret = fabep_moe_dispatch_recv(wd.moe, &rv);
		if (ret)
			break;
		if (hit && fc->op == OP_DISPATCH && fc->fault == F_KILL_AFTER)
			fault_now(sig);
		memcpy(wd.y, rv.x, rv.rows * E_HIDDEN * 2);

		/* combine */
		op = OP_COMBINE;
		if (fc->op == OP_COMBINE && before && round == FAULT_ROUND)
			fault_before(victim, sig);
		t_call = now_ns();
		ret = fabep_moe_combine_send(wd.moe, wd.y, E_HIDDEN, 0);
		if (ret)
			break;
		if (hit && fc->op == OP_COMBINE && during)
			fault_now(sig);
		ret = fabep_moe_combine_recv(wd.moe, wd.out, E_HIDDEN, NULL, NULL);
		if (ret)
			break;
		if (hit && fc->op == OP_COMBINE && fc->fault == F_KILL_AFTER)
			fault_now(sig);

		/* allreduce */
		op = OP_AR;
		if (fc->op == OP_AR && before && round == FAULT_ROUND)
			fault_before(victim, sig);
		{
			const float *in = wd.arin;

			if (hit && fc->op == OP_AR && during) {
				in = trap_input(wd.arin, sizeof(float) * AR_ROWS * AR_COLS,
						sizeof(float) * AR_VICTIM_ROW0 * AR_COLS, sig);
				if (!in) {
					rc = 4;
					break;
				}
			}
			t_call = now_ns();
			ret = fabep_allreduce(wd.ar, in, wd.arout, AR_ROWS, AR_COLS);
			if (ret)
				break;
		}
		if (hit && fc->op == OP_AR && fc->fault == F_KILL_AFTER)
			fault_now(sig);
		if (!victim && wd.arout[0] != (float)(size * (size + 1) / 2)) {
			fprintf(stderr, "rank %d: allreduce gave %g\n", rank,
				(double)wd.arout[0]);
			rc = 3;
			break;
		}
	}
	tf = __atomic_load_n(&g_sh->t_fault_ns, __ATOMIC_SEQ_CST);
	res->err = ret;
	res->failed_op = op;
	res->round = round;
	res->call_ms = ret ? (now_ns() - t_call) / 1000000 : -1;
	res->fault_ms = ret && tf ? (now_ns() - tf) / 1000000 : -1;
	if (ret && !victim) {
		/* the failed call's handle refuses the next call at once
		 * and says so: the ranks' calls are out of step */
		int64_t t0 = now_ns();

		if (op == OP_AR)
			res->again = fabep_allreduce(wd.ar, wd.arin, wd.arout,
						     AR_ROWS, AR_COLS);
		else if (op == OP_COMBINE)
			res->again = fabep_moe_combine_send(wd.moe, wd.y, E_HIDDEN, 0);
		else
			res->again = fabep_moe_dispatch_send(wd.moe, wd.x, NULL,
							     E_TOKENS, wd.ids, wd.w);
		res->again_ms = (now_ns() - t0) / 1000000;
		res->again_said = strstr(fabep_last_error(), "unusable") != NULL;
		/* the communicator: see run_fault */
		bar_off = capture_tell(&cap);
		t0 = now_ns();
		res->bar = fabep_barrier(wd.comm);
		res->bar_ms = (now_ns() - t0) / 1000000;
		p = fabep_last_error();
		res->bar_said = strstr(p, "communicator is unusable") != NULL;
		res->bar_stopped = strstr(p, "is stopped") != NULL;
	}
	/* a survivor's destroy ends its communicator without a goodbye
	 * (it is unusable): one that has not seen the fault yet would
	 * name that survivor instead of the victim, so none destroys
	 * before all have seen it (or 20 s) */
	if (!victim) {
		int64_t dl_ns = now_ns() + 20000000000ll;

		__atomic_add_fetch(&g_sh->survivors_seen, 1, __ATOMIC_SEQ_CST);
		while (__atomic_load_n(&g_sh->survivors_seen, __ATOMIC_SEQ_CST) <
		       NRANKS - 1 && now_ns() < dl_ns)
			sleep_us(1000);
	}
	res->destroy_ret = world_close(&wd, &res->destroy_ms);
	res->leaked = fep_test_leak_check();
	log = capture_end(&cap);
	res->named = log_names(log, VICTIM);
	{
		char pat[64], only[24], oldest[40];

		/* the peers in flight name the victim as the only one or as
		 * the oldest's (transfers to live ranks can wait behind
		 * one to it: fep_busy_peers) */
		snprintf(only, sizeof(only), "(to rank %d)", VICTIM);
		snprintf(oldest, sizeof(oldest), "; the oldest to rank %d)", VICTIM);
		for (p = log; (p = strstr(p, "still incomplete")); p++) {
			const char *eol = strchr(p, '\n'), *a = strstr(p, only),
				   *b = strstr(p, oldest);

			res->incomplete++;
			res->incomplete_call += bar_off < 0 || p - log < bar_off;
			res->blamed = (a && (!eol || a < eol)) ||
				      (b && (!eol || b < eol));
		}

		snprintf(pat, sizeof(pat), "rank %d (process %d on this host) is stopped",
			 VICTIM, (int)g_sh->pid[VICTIM]);
		res->stopped = strstr(log, pat) != NULL;
	}
	if (victim) {
		/* only a stopped victim gets here: resumed after the others */
		free(log);
		return rc;
	}
	__atomic_store_n(&res->done, 1, __ATOMIC_SEQ_CST);
	if (!ret || !res->named || rc || res->leaked)
		fprintf(stderr, "---- rank %d log ----\n%s---- end ----\n", rank, log);
	free(log);
	__atomic_add_fetch(&g_sh->survivors_done, 1, __ATOMIC_SEQ_CST);
	if (rank == 0 && stop) {
		int64_t dl_ns = now_ns() + 20000000000ll;

		while (__atomic_load_n(&g_sh->survivors_done, __ATOMIC_SEQ_CST) <
		       NRANKS - 1 && now_ns() < dl_ns)
			sleep_us(1000);
		kill(g_sh->pid[VICTIM], SIGCONT);
	}
	return rc;
}

static void run_fault(const char *prov, int op, int fault)
{
	struct fcase fc = { prov, op, fault };
	int status[NRANKS], r;
	char said[NRANKS][256];
	char row[512];
	size_t l = 0;

	fep_test_on_provider(prov);
	for (r = 0; r < 3; r++) {
		int again = 0, q;

		shared_init();
		fep_test_run_ranks_status(NRANKS, 60, fault_rank, &fc, status);
		/* what a rank said before it died with its stderr captured
		 * (the victim's file too: it is removed) */
		for (q = 0; q < NRANKS; q++)
			snprintf(said[q], sizeof(said[q]), "%s",
				 fault_said(g_sh->res[q].cap));
		for (q = 0; q < NRANKS; q++)
			again |= status[q] == 77;
		if (!again)
			break;
		fprintf(stderr, "%s %s %s: setting up the ranks failed (a loaded "
			"machine?); trying again\n", prov, op_names[op],
			fault_names[fault]);
	}
	if (is_stop(fault))
		ck_assert_msg(status[VICTIM] < 128, "%s %s %s: the resumed rank died "
			      "of signal %d", prov, op_names[op], fault_names[fault],
			      status[VICTIM] - 128);
	else
		ck_assert_msg(status[VICTIM] == 128 + SIGKILL, "victim status %d",
			      status[VICTIM]);
	l += (size_t)snprintf(row + l, sizeof(row) - l, "FAULTROW | %s | %s | %s |",
			      fault_names[fault], op_names[op], prov);
	for (r = 0; r < VICTIM; r++) {
		struct rank_res *x = &g_sh->res[r];

		l += (size_t)snprintf(row + l, sizeof(row) - l,
				      " r%d: %s in %s %d, %lld ms after fault (call %lld ms), "
				      "destroy %lld ms%s%s%s |", r, fabep_strerror(x->err),
				      op_names[x->failed_op], x->round, (long long)x->fault_ms,
				      (long long)x->call_ms, (long long)x->destroy_ms,
				      x->named ? "" : ", NOT NAMED",
				      x->leaked ? ", LEAKED" : "",
				      x->incomplete ? ", writes incomplete" : "");
	}
	fprintf(stderr, "%s\n", row);
	if (g_want_incomplete)
		ck_assert_msg(g_sh->res[0].incomplete || g_sh->res[1].incomplete,
			      "%s %s %s: no survivor's wait for its writes timed out",
			      prov, op_names[op], fault_names[fault]);
	for (r = 0; r < VICTIM; r++) {
		struct rank_res *x = &g_sh->res[r];

		ck_assert_msg(status[r] == 0, "%s %s %s: survivor %d exited %d%s%s%s%s",
			      prov, op_names[op], fault_names[fault], r,
			      status[r], *fep_test_rank_said(r) ? ": " : "",
			      fep_test_rank_said(r),
			      said[r][0] ? "; its last line while captured: " : "",
			      said[r]);
		ck_assert_msg(x->done, "survivor %d did not finish", r);
		ck_assert_msg(x->err == -ETIMEDOUT || x->err == -FABEP_ERR_PEER_LOST ||
			      x->err == -FABEP_ERR_PEER,
			      "%s %s %s: survivor %d got %d (%s)", prov, op_names[op],
			      fault_names[fault], r, x->err, fabep_strerror(x->err));
		/* every rank runs on this host: a killed one is seen gone
		 * (the liveness check), not by the timeout; a stopped one
		 * still runs */
		if (!is_stop(fault))
			ck_assert_msg(x->err == -FABEP_ERR_PEER_LOST,
				      "%s %s %s: survivor %d got %d (%s), not the "
				      "lost peer", prov, op_names[op],
				      fault_names[fault], r, x->err,
				      fabep_strerror(x->err));
		ck_assert_msg(x->call_ms <= TIMEOUT_MS + SLACK_MS,
			      "%s %s %s: survivor %d returned after %lld ms", prov,
			      op_names[op], fault_names[fault], r, (long long)x->call_ms);
		ck_assert_msg(x->fault_ms >= 0 && x->fault_ms <= 2 * TIMEOUT_MS + SLACK_MS,
			      "%s %s %s: survivor %d detected %lld ms after the fault",
			      prov, op_names[op], fault_names[fault], r,
			      (long long)x->fault_ms);
		ck_assert_msg(!x->leaked, "%s %s %s: survivor %d leaked memory "
			      "(LeakSanitizer)", prov, op_names[op], fault_names[fault], r);
		ck_assert_msg(x->named, "%s %s %s: survivor %d's log does not name "
			      "rank %d", prov, op_names[op], fault_names[fault], r,
			      VICTIM);
		ck_assert_msg(x->again && x->again_said && x->again_ms < 100,
			      "%s %s %s: survivor %d's next %s gave %d (%s) after "
			      "%lld ms, %s", prov, op_names[op], fault_names[fault],
			      r, op_names[x->failed_op], x->again,
			      fabep_strerror(x->again), (long long)x->again_ms,
			      x->again_said ? "saying why" : "not saying that the "
			      "handle is unusable");
		/* A rank gone (killed), or transfers of the failed call
		 * that never completed (the fabric keeps their error): the
		 * communicator refuses at once, saying why.  A stopped rank
		 * whose signals did not come is only late: the communicator
		 * stays usable, and its barrier times out again, saying the
		 * rank is stopped (whether the barrier's own writes to it
		 * time out first depends on the strategy). */
		if (!is_stop(fault) || x->incomplete_call)
			ck_assert_msg(x->bar == (is_stop(fault) ? -ETIMEDOUT :
						 -FABEP_ERR_PEER_LOST) &&
				      x->bar_said && x->bar_ms < 100, "%s %s %s: survivor "
				      "%d's barrier after the failure gave %d (%s) after "
				      "%lld ms, %s", prov, op_names[op], fault_names[fault],
				      r, x->bar, fabep_strerror(x->bar),
				      (long long)x->bar_ms, x->bar_said ? "saying why" :
				      "not saying that the communicator is unusable");
		else
			ck_assert_msg(x->bar == -ETIMEDOUT && x->bar_stopped &&
				      x->bar_ms <= TIMEOUT_MS + SLACK_MS,
				      "%s %s %s: survivor %d's barrier after the timeout "
				      "gave %d (%s) after %lld ms, %s", prov, op_names[op],
				      fault_names[fault], r, x->bar, fabep_strerror(x->bar),
				      (long long)x->bar_ms, x->bar_stopped ? "naming the "
				      "stopped rank" : "not saying that rank 2 is stopped");
		/* once: a later wait that fails on the earlier timeout
		 * has not waited itself */
		ck_assert_msg(x->incomplete <= 1, "%s %s %s: survivor %d's log says "
			      "%d times that transfers are incomplete", prov,
			      op_names[op], fault_names[fault], r, x->incomplete);
		if (x->incomplete && is_stop(fault))
			ck_assert_msg(x->blamed, "%s %s %s: survivor %d's log does "
				      "not say that its oldest incomplete transfers "
				      "go to rank %d: %s", prov, op_names[op],
				      fault_names[fault], r, VICTIM,
				      fep_test_rank_said(r));
		/* a timeout with a rank of this host stopped says so */
		if (x->err == -ETIMEDOUT && is_stop(fault))
			ck_assert_msg(x->stopped, "%s %s %s: survivor %d's log does not "
				      "say that rank %d is stopped", prov, op_names[op],
				      fault_names[fault], r, VICTIM);
		ck_assert_msg(x->destroy_ret == 0 || x->destroy_ret == -ETIMEDOUT ||
			      x->destroy_ret == -FABEP_ERR_PEER_LOST,
			      "%s %s %s: survivor %d's destroy gave %d (%s)", prov,
			      op_names[op], fault_names[fault], r, x->destroy_ret,
			      fabep_strerror(x->destroy_ret));
		/* destroy's barrier is bounded by the timeout */
		ck_assert_msg(x->destroy_ms <= TIMEOUT_MS + SLACK_MS,
			      "%s: survivor %d's destroy took %lld ms", prov, r,
			      (long long)x->destroy_ms);
	}
}

#define FAULT_TEST(name, prov, op, fault) \
	START_TEST(name) { setenv("FABEP_TIMEOUT_MS", "1000", 1); run_fault(prov, op, fault); } END_TEST

/* A fault case with channels and two threads a rank, under signal
 * strategy sig (NULL: the automatic choice) and FABEP_MOE_LANES lanes
 * (NULL: unset). */
static void run_fault_chan(const char *prov, int op, int fault, const char *chans,
			   const char *sig, const char *lanes)
{
	setenv("FABEP_TIMEOUT_MS", "1000", 1);
	setenv("FABEP_CHANNELS", chans, 1);
	setenv("FEP_TEST_THREADS", "2", 1);
	if (sig)
		setenv("FABEP_SIGNAL", sig, 1);
	if (lanes)
		setenv("FABEP_MOE_LANES", lanes, 1);
	run_fault(prov, op, fault);
	unsetenv("FABEP_CHANNELS");
	unsetenv("FEP_TEST_THREADS");
	unsetenv("FABEP_SIGNAL");
	unsetenv("FABEP_MOE_LANES");
}

/* With channels: the waits run on the pool's threads, each progressing
 * its channel, while the caller alone checks that the peers live; the
 * allreduce's 256 KiB puts are split over the channels. */
#define FAULT_TEST_CHAN(name, prov, op, fault) \
	START_TEST(name) { run_fault_chan(prov, op, fault, "2", NULL, NULL); } END_TEST

FAULT_TEST_CHAN(chan_kill_during_dispatch, "shm", OP_DISPATCH, F_KILL_DURING)
FAULT_TEST_CHAN(chan_kill_during_combine, "shm", OP_COMBINE, F_KILL_DURING)
FAULT_TEST_CHAN(chan_kill_during_ar, "shm", OP_AR, F_KILL_DURING)
FAULT_TEST_CHAN(chan_stop_ar, "shm", OP_AR, F_STOP)

/* With lanes: under cma with a channel per peer, each batch of the
 * sender's copies made on both threads, the victim's lane failing or
 * waiting beside the others. */
#define FAULT_TEST_LANES(name, prov, op, fault) \
	START_TEST(name) { run_fault_chan(prov, op, fault, "3", "cma", "always"); } END_TEST

/* Under delivery a write completes only once the target's progress has
 * placed it: the survivors' writes to a rank stopped before the call
 * stay incomplete, and their wait for completions must give up at the
 * timeout, naming the rank, and leave handles that free and a
 * communicator that destroys within the timeout.  Records only
 * (FABEP_MOE_PLACE=never): a placed dispatch's send half first waits for
 * every rank's headers, and would time out there. */
#define FAULT_TEST_PENDING(name, prov, op)                                    \
	START_TEST(name)                                                      \
	{                                                                     \
		g_want_incomplete = 1;                                        \
		setenv("FABEP_MOE_PLACE", "never", 1);                        \
		run_fault_chan(prov, op, F_STOP_BEFORE, "1", "delivery", NULL); \
		unsetenv("FABEP_MOE_PLACE");                                  \
	}                                                                     \
	END_TEST

FAULT_TEST_PENDING(pending_stop_dispatch, "shm", OP_DISPATCH)
FAULT_TEST_PENDING(pending_stop_combine, "shm", OP_COMBINE)
FAULT_TEST_PENDING(pending_stop_ar, "shm", OP_AR)
FAULT_TEST_LANES(lanes_kill_during_dispatch, "shm", OP_DISPATCH, F_KILL_DURING)
FAULT_TEST_LANES(lanes_kill_during_combine, "shm", OP_COMBINE, F_KILL_DURING)
FAULT_TEST_LANES(lanes_stop_dispatch, "shm", OP_DISPATCH, F_STOP)
FAULT_TEST(shm_kill_before_dispatch, "shm", OP_DISPATCH, F_KILL_BEFORE)
FAULT_TEST(shm_kill_during_dispatch, "shm", OP_DISPATCH, F_KILL_DURING)
FAULT_TEST(shm_kill_after_dispatch, "shm", OP_DISPATCH, F_KILL_AFTER)
FAULT_TEST(shm_stop_dispatch, "shm", OP_DISPATCH, F_STOP)
FAULT_TEST(shm_kill_packing_dispatch, "shm", OP_DISPATCH, F_KILL_PACK)
FAULT_TEST(shm_kill_before_combine, "shm", OP_COMBINE, F_KILL_BEFORE)
FAULT_TEST(shm_kill_during_combine, "shm", OP_COMBINE, F_KILL_DURING)
FAULT_TEST(shm_kill_after_combine, "shm", OP_COMBINE, F_KILL_AFTER)
FAULT_TEST(shm_stop_combine, "shm", OP_COMBINE, F_STOP)
FAULT_TEST(shm_kill_before_ar, "shm", OP_AR, F_KILL_BEFORE)
FAULT_TEST(shm_kill_during_ar, "shm", OP_AR, F_KILL_DURING)
FAULT_TEST(shm_kill_after_ar, "shm", OP_AR, F_KILL_AFTER)
FAULT_TEST(shm_stop_ar, "shm", OP_AR, F_STOP)
FAULT_TEST(tcp_kill_before_dispatch, "tcp", OP_DISPATCH, F_KILL_BEFORE)
FAULT_TEST(tcp_kill_during_dispatch, "tcp", OP_DISPATCH, F_KILL_DURING)
FAULT_TEST(tcp_kill_after_dispatch, "tcp", OP_DISPATCH, F_KILL_AFTER)
FAULT_TEST(tcp_stop_dispatch, "tcp", OP_DISPATCH, F_STOP)
FAULT_TEST(tcp_kill_packing_dispatch, "tcp", OP_DISPATCH, F_KILL_PACK)
FAULT_TEST(tcp_kill_before_combine, "tcp", OP_COMBINE, F_KILL_BEFORE)
FAULT_TEST(tcp_kill_during_combine, "tcp", OP_COMBINE, F_KILL_DURING)
FAULT_TEST(tcp_kill_after_combine, "tcp", OP_COMBINE, F_KILL_AFTER)
FAULT_TEST(tcp_stop_combine, "tcp", OP_COMBINE, F_STOP)
FAULT_TEST(tcp_kill_before_ar, "tcp", OP_AR, F_KILL_BEFORE)
FAULT_TEST(tcp_kill_during_ar, "tcp", OP_AR, F_KILL_DURING)
FAULT_TEST(tcp_kill_after_ar, "tcp", OP_AR, F_KILL_AFTER)
FAULT_TEST(tcp_stop_ar, "tcp", OP_AR, F_STOP)
/* sockets: a post to a rank whose process is gone can fail at once
 * (fi_writemsg: -FI_ENOENT, no connection to it), which must read
 * -FABEP_ERR_PEER_LOST too, in the call and in the destroy */
FAULT_TEST(sockets_kill_before_dispatch, "sockets", OP_DISPATCH, F_KILL_BEFORE)
FAULT_TEST(sockets_kill_during_dispatch, "sockets", OP_DISPATCH, F_KILL_DURING)
FAULT_TEST(sockets_kill_after_dispatch, "sockets", OP_DISPATCH, F_KILL_AFTER)
FAULT_TEST(sockets_kill_during_combine, "sockets", OP_COMBINE, F_KILL_DURING)
FAULT_TEST(sockets_kill_before_ar, "sockets", OP_AR, F_KILL_BEFORE)

/* ---- rendezvous: FABEP_ROOT names the wrong port ---- */

enum { RDV_NOTHING, RDV_SILENT, RDV_GARBAGE, RDV_CLOSE, RDV_N };
static const char *rdv_names[] = {
	"nothing listens", "a silent server", "a server sending garbage",
	"a server closing at once"
};

struct rdv {
	int mode, port, lfd;
};

struct rdv_res {
	int ret;
	int64_t ms;
	char log[400];
};

static struct rdv_res *g_rdv;

/* Rank 0 plays the stranger at the port; rank 1 is a fabep rank whose
 * FABEP_ROOT names it. */
static int rdv_rank(int rank, int size, void *arg)
{
	const struct rdv *rv = arg;
	static const char junk[] = "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"
		"\x00\x00\x05\xdc\x07\x14garbage garbage garbage garbage garbage";
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	struct capture cap;
	char buf[64], *log;
	int64_t t0;

	if (rank == 0) {
		int64_t end = now_ns() + 6000000000ll;
		int fds[16], nfd = 0, i;

		if (rv->lfd < 0)
			return 0;
		while (now_ns() < end && !__atomic_load_n(&g_rdv->ms, __ATOMIC_SEQ_CST)) {
			struct pollfd p = { rv->lfd, POLLIN, 0 };
			int fd;

			if (poll(&p, 1, 20) <= 0)
				continue;
			fd = accept(rv->lfd, NULL, NULL);
			if (fd < 0)
				continue;
			if (rv->mode == RDV_CLOSE) {
				close(fd);
				continue;
			}
			if (rv->mode == RDV_GARBAGE &&
			    send(fd, junk, sizeof(junk), MSG_NOSIGNAL) < 0) {
				close(fd);
				continue;
			}
			if (nfd < 16)
				fds[nfd++] = fd;
			else
				close(fd);
		}
		for (i = 0; i < nfd; i++)
			close(fds[i]);
		return 0;
	}
	if (rv->lfd >= 0)
		close(rv->lfd);
	snprintf(buf, sizeof(buf), "127.0.0.1:%d", rv->port);
	setenv("FABEP_ROOT", buf, 1);
	fabep_comm_attr_init(&a);
	a.timeout_ms = TIMEOUT_MS;
	a.threads = 1;
	capture_begin(&cap, NULL);
	t0 = now_ns();
	g_rdv->ret = fabep_comm_create(&a, &comm);
	__atomic_store_n(&g_rdv->ms, (now_ns() - t0) / 1000000 + 1, __ATOMIC_SEQ_CST);
	log = capture_end(&cap);
	snprintf(g_rdv->log, sizeof(g_rdv->log), "%s", log);
	free(log);
	if (!g_rdv->ret)
		fabep_comm_destroy(comm);
	return 0;
}

static void run_rdv(const char *prov, int mode)
{
	struct rdv rv = { mode, fep_test_free_port(), -1 };
	int status[2], one = 1;
	char *nl;

	fep_test_on_provider(prov);
	if (!g_rdv) {
		g_rdv = mmap(NULL, sizeof(*g_rdv), PROT_READ | PROT_WRITE,
			     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		ck_assert(g_rdv != MAP_FAILED);
	}
	memset(g_rdv, 0, sizeof(*g_rdv));
	ck_assert_int_gt(rv.port, 0);
	if (mode != RDV_NOTHING) {
		struct sockaddr_in sa;

		rv.lfd = socket(AF_INET, SOCK_STREAM, 0);
		ck_assert_int_ge(rv.lfd, 0);
		setsockopt(rv.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		memset(&sa, 0, sizeof(sa));
		sa.sin_family = AF_INET;
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		sa.sin_port = htons((uint16_t)rv.port);
		ck_assert_int_eq(bind(rv.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		ck_assert_int_eq(listen(rv.lfd, 16), 0);
	}
	fep_test_run_ranks_status(2, 30, rdv_rank, &rv, status);
	if (rv.lfd >= 0)
		close(rv.lfd);
	nl = strchr(g_rdv->log, '\n');
	if (nl)
		*nl = '\0';
	fprintf(stderr, "RDVROW | %s | %s | %s | %lld ms | %s |\n", rdv_names[mode],
		prov, fabep_strerror(g_rdv->ret), (long long)g_rdv->ms - 1,
		g_rdv->log);
	ck_assert_msg(status[0] == 0 && status[1] == 0, "statuses %d %d", status[0],
		      status[1]);
	ck_assert_msg(g_rdv->ret < 0, "%s: fabep_comm_create gave %d",
		      rdv_names[mode], g_rdv->ret);
	ck_assert_msg(g_rdv->ms - 1 <= TIMEOUT_MS + SLACK_MS, "%s: took %lld ms",
		      rdv_names[mode], (long long)g_rdv->ms - 1);
	ck_assert_msg(g_rdv->log[0], "%s: nothing logged", rdv_names[mode]);
	if (mode == RDV_NOTHING || mode == RDV_SILENT)
		ck_assert_msg(g_rdv->ret == -ETIMEDOUT, "%s: %s", rdv_names[mode],
			      fabep_strerror(g_rdv->ret));
}

START_TEST(rdv_nothing) { run_rdv("tcp", RDV_NOTHING); } END_TEST
START_TEST(rdv_silent) { run_rdv("tcp", RDV_SILENT); } END_TEST
START_TEST(rdv_garbage) { run_rdv("tcp", RDV_GARBAGE); } END_TEST
START_TEST(rdv_close) { run_rdv("tcp", RDV_CLOSE); } END_TEST

/* ---- bad arguments to every public call ---- */

#define EXPECT(call, want)                                                  \
	do {                                                                \
		long got_ = (long)(call);                                   \
		if (got_ != (long)(want)) {                                 \
			fprintf(stderr, "rank %d: line %d: %s gave %ld (%s), " \
				"want %ld\n", rank, __LINE__, #call, got_,  \
				fabep_strerror((int)got_), (long)(want));   \
			return __LINE__ % 200 + 1;                          \
		}                                                           \
	} while (0)

#define A_ROWS 8
#define A_COLS 32

/* A correct dispatch + combine round; the output checked. */
static int good_moe_round(fabep_moe_t *moe, int rank, int size)
{
	int32_t ids[E_TOKENS * E_TOPK];
	float w[E_TOKENS * E_TOPK];
	uint16_t x[E_TOKENS * E_HIDDEN], out[E_TOKENS * E_HIDDEN];
	static uint16_t y[E_TOKENS * E_TOPK * NRANKS * E_HIDDEN];
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	int i, ret;

	for (i = 0; i < E_TOKENS * E_TOPK; i++) {
		ids[i] = (i % E_TOPK) ? -1 : (int32_t)((i / E_TOPK) % E_EXPERTS);
		w[i] = 1.0f;
	}
	for (i = 0; i < E_TOKENS * E_HIDDEN; i++)
		x[i] = 0x4000; /* 2.0 */
	ret = fabep_moe_dispatch(moe, x, NULL, E_TOKENS, ids, w, &rv);
	if (ret)
		return ret;
	memcpy(y, rv.x, rv.rows * E_HIDDEN * 2);
	ret = fabep_moe_combine(moe, y, E_HIDDEN, 0, out, E_HIDDEN, NULL, NULL);
	if (ret)
		return ret;
	for (i = 0; i < E_TOKENS * E_HIDDEN; i++)
		if (out[i] != 0x4000)
			return -EIO;
	(void)rank;
	(void)size;
	return 0;
}

static int good_ar(fabep_allreduce_t *ar, int size)
{
	float in[A_ROWS * A_COLS], out[A_ROWS * A_COLS];
	int i, ret;

	for (i = 0; i < A_ROWS * A_COLS; i++)
		in[i] = 1.0f;
	ret = fabep_allreduce(ar, in, out, A_ROWS, A_COLS);
	if (ret)
		return ret;
	for (i = 0; i < A_ROWS * A_COLS; i++)
		if (out[i] != (float)size)
			return -EIO;
	return 0;
}

/* A world of one's allgather, and one that fails. */
static int copy_allgather(const void *in, void *out, size_t len, void *ctx)
{
	(void)ctx;
	memcpy(out, in, len);
	return 0;
}

static int failing_allgather(const void *in, void *out, size_t len, void *ctx)
{
	(void)in;
	(void)out;
	(void)len;
	(void)ctx;
	return -EIO;
}

static int args_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_moe_config_t cfg, bad;
	fabep_moe_t *moe = NULL, *m2 = (fabep_moe_t *)&cfg;
	fabep_allreduce_t *ar = NULL, *a2 = (fabep_allreduce_t *)&cfg;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	fabep_rmsnorm_params_t p;
	fabep_provider_desc_t desc[2];
	fabep_signal_t sig;
	fabep_off_t off = 0, ctr = 0;
	int32_t ids[E_TOKENS * E_TOPK];
	float in[A_ROWS * A_COLS], out[A_ROWS * A_COLS], sc[A_ROWS], gamma[A_COLS];
	uint16_t x[E_TOKENS * E_HIDDEN], y[E_TOKENS * E_HIDDEN], o[E_TOKENS * E_HIDDEN];
	int n, i;

	(void)arg;
	/* before a communicator exists */
	EXPECT(fabep_comm_create(NULL, NULL), -EINVAL);
	fabep_comm_attr_init(NULL);
	EXPECT(fabep_comm_destroy(NULL), 0);
	EXPECT(fabep_comm_rank(NULL), -EINVAL);
	EXPECT(fabep_comm_size(NULL), -EINVAL);
	EXPECT(fabep_comm_threads(NULL), -EINVAL);
	EXPECT(fabep_comm_numa_node(NULL), -EINVAL);
	EXPECT(fabep_comm_channels(NULL), -EINVAL);
	EXPECT(fabep_comm_provider(NULL), NULL);
	EXPECT(fabep_comm_domain(NULL), NULL);
	EXPECT(fabep_heap_size(NULL), 0);
	EXPECT(fabep_heap_ptr(NULL, 0), NULL);
	EXPECT(fabep_signal_parse(NULL, &sig), -EINVAL);
	EXPECT(fabep_signal_parse("ordered", NULL), -EINVAL);
	EXPECT(fabep_signal_parse("", &sig), -EINVAL);
	/* each refusal says why (fabep_last_error) */
	EXPECT(strstr(fabep_last_error(), "is not one of") != NULL, 1);
	EXPECT(fabep_signal_parse(NULL, &sig), -EINVAL);
	EXPECT(strstr(fabep_last_error(), "NULL name") != NULL, 1);
	EXPECT(fabep_progress(NULL), -EINVAL);
	EXPECT(strstr(fabep_last_error(), "NULL communicator") != NULL, 1);
	EXPECT(fabep_provider_list(NULL, desc, 2, NULL), -EINVAL);
	EXPECT(fabep_provider_list(NULL, desc, -1, &n), -EINVAL);
	EXPECT(fabep_provider_list(NULL, NULL, 2, &n), -EINVAL);
	EXPECT(fabep_strerror(-123456) != NULL, 1);
	EXPECT(fabep_strerror(INT32_MIN) != NULL, 1);
	fabep_comm_attr_init(&a);
	a.signal = (fabep_signal_t)99;
	EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
	/* fields set out of the ranges their variables have */
	{
		static const struct { size_t heap; int timeout, threads, numa; } bad[] = {
			{ 4096, 0, 0, -1 }, { (1ull << 40) + 4096, 0, 0, -1 },
			{ 0xffffffffffe01000ull, 0, 0, -1 }, { SIZE_MAX, 0, 0, -1 },
			{ 0, -5, 0, -1 }, { 0, 86400001, 0, -1 }, { 0, 0, -3, -1 },
			{ 0, 0, 1025, -1 }, { 0, 0, 0, -7 }, { 0, 0, 0, 4096 },
		};
		size_t i;

		for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			fabep_comm_attr_init(&a);
			a.heap_size = bad[i].heap;
			a.timeout_ms = bad[i].timeout;
			a.threads = bad[i].threads;
			a.numa_node = bad[i].numa;
			(void)fabep_last_error();
			EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
			EXPECT(strstr(fabep_last_error(), "is not") != NULL, 1);
		}
	}
	/* the rendezvous's limit: -1 (none) or 1 to a day, in the field
	 * and in its variable (0 there is refused: the field's 0 means
	 * "not set") */
	{
		static const int bad_rdv[] = { -2, INT_MIN, 86400001 };
		static const char *bad_var[] = { "0", "-2", "abc", "86400001" };
		size_t i;

		for (i = 0; i < sizeof(bad_rdv) / sizeof(bad_rdv[0]); i++) {
			fabep_comm_attr_init(&a);
			a.allgather = copy_allgather;
			a.rank = 0;
			a.nranks = 1;
			a.rendezvous_timeout_ms = bad_rdv[i];
			(void)fabep_last_error();
			EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
			EXPECT(strstr(fabep_last_error(), "rendezvous_timeout_ms") != NULL, 1);
		}
		for (i = 0; i < sizeof(bad_var) / sizeof(bad_var[0]); i++) {
			fabep_comm_attr_init(&a);
			a.allgather = copy_allgather;
			a.rank = 0;
			a.nranks = 1;
			setenv("FABEP_RENDEZVOUS_TIMEOUT_MS", bad_var[i], 1);
			(void)fabep_last_error();
			n = fabep_comm_create(&a, &comm);
			unsetenv("FABEP_RENDEZVOUS_TIMEOUT_MS");
			EXPECT(n, -EINVAL);
			EXPECT(strstr(fabep_last_error(), "FABEP_RENDEZVOUS_TIMEOUT_MS") != NULL, 1);
		}
	}
	/* an allgather callback with a rank outside [0, nranks) */
	fabep_comm_attr_init(&a);
	a.allgather = copy_allgather;
	a.rank = 1;
	a.nranks = 1;
	EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
	a.rank = -1;
	EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
	a.rank = 0;
	a.nranks = 0;
	EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
	/* the callback's error comes back; then a world of one works */
	a.nranks = 1;
	a.allgather = failing_allgather;
	EXPECT(fabep_comm_create(&a, &comm), -EIO);
	a.allgather = copy_allgather;
	a.threads = 1;
	/* a domain the provider does not offer (which shm and tcp do not
	 * check themselves): refused, naming the domains offered */
	a.domain = "no-such-domain";
	EXPECT(fabep_comm_create(&a, &comm), -FABEP_ERR_NO_PROVIDER);
	EXPECT(strstr(fabep_last_error(), "domains offered") != NULL, 1);
	a.domain = NULL;
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_comm_size(comm), 1);
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	comm = NULL;
	fabep_moe_config_init(NULL);
	fabep_moe_config_init(&cfg);
	cfg.num_experts = E_EXPERTS;
	cfg.top_k = E_TOPK;
	cfg.hidden = E_HIDDEN;
	cfg.max_tokens = E_TOKENS;
	EXPECT(fabep_moe_heap_bytes(NULL, size), 0);
	EXPECT(fabep_moe_heap_bytes(&cfg, 0), 0);
	EXPECT(fabep_moe_heap_bytes(&cfg, -3), 0);
	EXPECT(fabep_allreduce_heap_bytes(0, A_COLS, FABEP_AR_F32, size), 0);
	EXPECT(fabep_allreduce_heap_bytes(A_ROWS, 0, FABEP_AR_F32, size), 0);
	EXPECT(fabep_allreduce_heap_bytes(A_ROWS, A_COLS, (fabep_ar_dtype_t)7, size), 0);
	EXPECT(fabep_allreduce_heap_bytes(A_ROWS, A_COLS, FABEP_AR_F32, 0), 0);
	EXPECT(fabep_allreduce_heap_bytes(SIZE_MAX / 2, SIZE_MAX / 2, FABEP_AR_F32, size), 0);

	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 10000;
	a.heap_size = fabep_moe_heap_bytes(&cfg, size) +
		      fabep_allreduce_heap_bytes(A_ROWS, A_COLS, FABEP_AR_F32, size) +
		      (1u << 20);
	EXPECT(fabep_comm_create(&a, &comm), 0);

	/* one-sided */
	EXPECT(fabep_heap_alloc(NULL, 8, 8, &off), -EINVAL);
	EXPECT(fabep_heap_alloc(comm, 8, 8, NULL), -EINVAL);
	EXPECT(fabep_heap_alloc(comm, 8, 3, &off), -EINVAL);
	EXPECT(fabep_heap_alloc(comm, 8, 8192, &off), -EINVAL);
	EXPECT(fabep_heap_alloc(comm, SIZE_MAX, 8, &off), -FABEP_ERR_HEAP_FULL);
	EXPECT(fabep_heap_alloc(comm, 64, 64, &off), 0);
	EXPECT(fabep_heap_alloc(comm, 8, 8, &ctr), 0);
	EXPECT(fabep_heap_ptr(comm, fabep_heap_size(comm)), NULL);
	EXPECT(fabep_heap_ptr(comm, UINT64_MAX), NULL);
	EXPECT(fabep_put(NULL, 0, off, off, 8), -EINVAL);
	EXPECT(fabep_put(comm, -1, off, off, 8), -EINVAL);
	EXPECT(fabep_put(comm, size, off, off, 8), -EINVAL);
	EXPECT(fabep_put(comm, 0, fabep_heap_size(comm) - 4, off, 8), -ERANGE);
	EXPECT(fabep_put(comm, 0, off, fabep_heap_size(comm) - 4, 8), -ERANGE);
	EXPECT(fabep_put(comm, 0, off, off, SIZE_MAX), -ERANGE);
	EXPECT(fabep_put(comm, 0, UINT64_MAX - 2, off, 8), -ERANGE);
	EXPECT(fabep_put_signal(NULL, 0, off, off, 8, ctr, 1), -EINVAL);
	EXPECT(fabep_put_signal(comm, 0, off, off, 8, ctr, 0), -EINVAL);
	EXPECT(fabep_put_signal(comm, 0, off, off, 8, ctr + 4, 1), -EINVAL);
	EXPECT(fabep_put_signal(comm, 0, off, off, 8, UINT64_MAX - 7, 1), -EINVAL);
	EXPECT(fabep_put_signal(comm, -5, off, off, 8, ctr, 1), -EINVAL);
	EXPECT(fabep_put_signal(comm, 0, off, UINT64_MAX, 8, ctr, 1), -ERANGE);
	EXPECT(fabep_put_signal(comm, 0, off, UINT64_MAX, 0, ctr, 1), -ERANGE);
	/* an add beyond what 1024 writes of CQ data carry, where adds may
	 * travel so: refused at once, not posted as millions of writes */
	if (fabep_comm_signal(comm) == FABEP_SIGNAL_CQDATA ||
	    fabep_comm_signal(comm) == FABEP_SIGNAL_CMA) {
		EXPECT(fabep_put_signal(comm, (rank + 1) % size, off, off, 8, ctr,
					UINT64_MAX / 16), -ERANGE);
		EXPECT(strstr(fabep_last_error(), "signal less at a time") != NULL, 1);
	}
	/* inside the heap but outside fabep_heap_alloc's ranges: offset 0
	 * is the communicator's own (its barrier counters), off + 60
	 * straddles two allocations; refused, nothing written */
	EXPECT(off > 0 && ctr == off + 64, 1);
	EXPECT(fabep_put(comm, 0, 0, off, 8), -ERANGE);
	EXPECT(strstr(fabep_last_error(), "not within one allocation") != NULL, 1);
	EXPECT(fabep_put(comm, 0, off, 0, 8), -ERANGE);
	EXPECT(fabep_put(comm, 0, off + 60, off, 8), -ERANGE);
	/* no bytes, no range: a signal-only put names any offset */
	EXPECT(fabep_put_signal(comm, (rank + 1) % size, 0, 0, 0, ctr, 1), 0);
	EXPECT(fabep_wait(comm, ctr, 1), 0);
	EXPECT(fabep_get(comm, 0, off, 0, 8), -ERANGE);
	EXPECT(fabep_get(comm, 0, 8, off, 8), -ERANGE);
	EXPECT(fabep_put_signal(comm, 0, off, off, 8, 0, 1), -EINVAL);
	EXPECT(fabep_wait(comm, 0, 0), -EINVAL);
	EXPECT(fabep_heap_ptr(comm, 0), NULL);
	EXPECT(fabep_heap_ptr(comm, off + 63) != NULL, 1);
	EXPECT(fabep_heap_ptr(comm, ctr + 8), NULL);
	EXPECT(fabep_flush(NULL), -EINVAL);
	EXPECT(fabep_progress(NULL), -EINVAL);
	EXPECT(fabep_wait(NULL, ctr, 0), -EINVAL);
	EXPECT(fabep_wait(comm, ctr + 1, 0), -EINVAL);
	EXPECT(fabep_wait(comm, UINT64_MAX - 7, 0), -EINVAL);
	EXPECT(fabep_counter_read(NULL, ctr), 0);
	EXPECT(fabep_counter_read(comm, UINT64_MAX - 7), 0);
	EXPECT(fabep_barrier(NULL), -EINVAL);
	EXPECT(fabep_progress(comm), 0);
	/* still usable: a put + signal round trip and a barrier */
	EXPECT(fabep_put_signal(comm, (rank + 1) % size, off, off, 8, ctr, 1), 0);
	EXPECT(fabep_wait(comm, ctr, 2), 0);
	EXPECT(fabep_flush(comm), 0);
	EXPECT(fabep_barrier(comm), 0);

	/* MoE: creation (every rank passes the same, so all fail alike) */
	EXPECT(fabep_moe_create(NULL, &cfg, &moe), -EINVAL);
	EXPECT(fabep_moe_create(comm, NULL, &moe), -EINVAL);
	EXPECT(fabep_moe_create(comm, &cfg, NULL), -EINVAL);
	/* one rank's NULL configuration or output: every rank gets -EINVAL */
	EXPECT(fabep_moe_create(comm, rank == 1 ? NULL : &cfg, &moe), -EINVAL);
	EXPECT(fabep_moe_create(comm, &cfg, rank == 1 ? NULL : &moe), -EINVAL);
	bad = cfg; bad.top_k = 0;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.top_k = FABEP_MOE_MAX_TOPK + 1;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.input_type = (fabep_moe_type_t)9; /* with bf16 tokens */
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.top_k = -1;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.num_experts = size * 2 + 1;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.num_experts = -size;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.hidden = 0;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.max_tokens = -1;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.max_tokens = 0;  /* fabep_moe_config_init's: never set */
	EXPECT(fabep_moe_heap_bytes(&bad, size), 0);
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.top_k = E_EXPERTS + 1;
	EXPECT(fabep_moe_heap_bytes(&bad, size), 0);
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	/* one rank's: every rank gets -EINVAL */
	bad = cfg; if (rank == 1) bad.max_tokens = 0;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.top_k = bad.num_experts = size;  /* top_k == E is fine */
	EXPECT(fabep_moe_create(comm, &bad, &moe), 0);
	EXPECT(fabep_moe_destroy(moe), 0);
	bad = cfg; bad.token_type = (fabep_moe_type_t)9;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.combine_type = FABEP_MOE_FP8;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.token_type = FABEP_MOE_FP8; bad.fp8_block = 10;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.buffer_sets = -1;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -EINVAL);
	bad = cfg; bad.hidden = SIZE_MAX / 4; bad.max_tokens = INT32_MAX;
	EXPECT(fabep_moe_create(comm, &bad, &moe) < 0, 1);
	/* mismatched: rank 1 asks for another top_k */
	bad = cfg; if (rank == 1) bad.top_k = 1;
	EXPECT(fabep_moe_create(comm, &bad, &moe), -FABEP_ERR_MISMATCH);
	EXPECT(fabep_moe_create(comm, &cfg, &moe), 0);

	/* MoE: calls out of order are refused locally, nothing sent */
	EXPECT(fabep_moe_dispatch(NULL, x, NULL, 1, ids, NULL, &rv), -EINVAL);
	EXPECT(fabep_moe_dispatch_send(NULL, x, NULL, 1, ids, NULL), -EINVAL);
	EXPECT(fabep_moe_dispatch_recv(NULL, &rv), -EINVAL);
	EXPECT(fabep_moe_dispatch_recv(moe, NULL), -EINVAL);
	EXPECT(fabep_moe_dispatch_recv(moe, &rv), -EINVAL);
	EXPECT(fabep_moe_combine(NULL, y, E_HIDDEN, 0, y, E_HIDDEN, NULL, NULL), -EINVAL);
	EXPECT(fabep_moe_combine_send(NULL, y, E_HIDDEN, 0), -EINVAL);
	EXPECT(fabep_moe_combine_send(moe, y, E_HIDDEN, 0), -EINVAL);
	EXPECT(fabep_moe_combine_recv(NULL, y, E_HIDDEN, NULL, NULL), -EINVAL);
	EXPECT(fabep_moe_combine_recv(moe, y, E_HIDDEN, NULL, NULL), -EINVAL);
	/* MoE: bad input is agreed on: every rank gets the same code */
	for (i = 0; i < E_TOKENS * E_TOPK; i++)
		ids[i] = i % E_EXPERTS;
	memset(x, 0, sizeof(x));
	EXPECT(fabep_moe_dispatch(moe, x, NULL, E_TOKENS + 1, ids, NULL, &rv), -EMSGSIZE);
	EXPECT(fabep_moe_dispatch(moe, x, NULL, (size_t)-1, ids, NULL, &rv), -EMSGSIZE);
	EXPECT(fabep_moe_dispatch(moe, NULL, NULL, 2, ids, NULL, &rv), -EINVAL);
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, NULL), -EINVAL);
	ids[1] = E_EXPERTS;
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, &rv), -ERANGE);
	ids[1] = -2;
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, &rv), -ERANGE);
	/* one rank's bad input: every rank returns its code */
	ids[1] = rank == 1 ? INT32_MAX : 0;
	(void)fabep_last_error();
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, &rv), -ERANGE);
	/* and its text says why: the id on rank 1, who rejected on rank 0 */
	EXPECT(strstr(fabep_last_error(), rank == 1 ?
		      "token 0: expert id 2147483647 not in [-1, " :
		      "rank 1 rejected its input") != NULL, 1);
	EXPECT(good_moe_round(moe, rank, size), 0);
	/* bad combine arguments (after a good dispatch): refused on every
	 * rank, the dispatch kept each time; then combined with good ones
	 * (the expert outputs are the received rows: out == 2 * x) */
	ids[1] = 0;
	for (i = 0; i < E_TOKENS * E_HIDDEN; i++)
		x[i] = 0x3f80; /* 1.0 */
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, &rv), 0);
	memcpy(y, rv.x, rv.rows * E_HIDDEN * 2);
	EXPECT(fabep_moe_combine(moe, NULL, E_HIDDEN, 0, o, E_HIDDEN, NULL, NULL), -EINVAL);
	EXPECT(fabep_moe_combine(moe, y, E_HIDDEN - 1, 0, o, E_HIDDEN, NULL, NULL), -EINVAL);
	EXPECT(fabep_moe_combine(moe, y, E_HIDDEN, 0x80, o, E_HIDDEN, NULL, NULL), -EINVAL);
	EXPECT(fabep_moe_combine(moe, y, E_HIDDEN, 0, NULL, E_HIDDEN, NULL, NULL), -EINVAL);
	EXPECT(fabep_moe_combine(moe, y, E_HIDDEN, 0, o, E_HIDDEN - 1, NULL, NULL), -EINVAL);
	/* strides whose rows run past the address space (rank 0 has rows
	 * from both tokens of every rank) */
	EXPECT(rv.rows >= 2 || rank != 0, 1);
	EXPECT(fabep_moe_combine(moe, y, (size_t)1 << 62, 0, o, E_HIDDEN, NULL, NULL),
	       -EINVAL);
	EXPECT(fabep_moe_combine(moe, y, E_HIDDEN, 0, o, (size_t)1 << 62, NULL, NULL),
	       -EINVAL);
	/* one rank's bad argument: every rank gets its code */
	EXPECT(fabep_moe_combine(moe, rank == 1 ? NULL : y, E_HIDDEN, 0, o, E_HIDDEN,
				 NULL, NULL), -EINVAL);
	memset(o, 0, sizeof(o));
	EXPECT(fabep_moe_combine(moe, y, E_HIDDEN, 0, o, E_HIDDEN, NULL, NULL), 0);
	for (i = 0; i < 2 * E_HIDDEN; i++)
		EXPECT(o[i], 0x4000); /* 2.0: each token's two ids, weight 1 */
	/* the same with the halves: the refusing rank owes no receive half */
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, &rv), 0);
	if (rank == 1) {
		EXPECT(fabep_moe_combine_send(moe, NULL, E_HIDDEN, 0), -EINVAL);
	} else {
		EXPECT(fabep_moe_combine_send(moe, y, E_HIDDEN, 0), 0);
		EXPECT(fabep_moe_combine_recv(moe, o, E_HIDDEN, NULL, NULL), -EINVAL);
	}
	EXPECT(fabep_moe_combine_send(moe, y, E_HIDDEN, 0), 0);
	EXPECT(fabep_moe_combine_recv(moe, o, E_HIDDEN, NULL, NULL), 0);
	/* a send half while the last one awaits its receive half: refused
	 * locally with nothing sent, and the pending call still completes */
	EXPECT(fabep_moe_dispatch_send(moe, x, NULL, 2, ids, NULL), 0);
	EXPECT(fabep_moe_dispatch_send(moe, x, NULL, 2, ids, NULL), -EINVAL);
	EXPECT(fabep_moe_combine_send(moe, y, E_HIDDEN, 0), -EINVAL);
	EXPECT(fabep_moe_dispatch_recv(moe, &rv), 0);
	EXPECT(fabep_moe_combine_send(moe, y, E_HIDDEN, 0), 0);
	EXPECT(fabep_moe_combine_send(moe, y, E_HIDDEN, 0), -EINVAL);
	EXPECT(fabep_moe_dispatch_send(moe, x, NULL, 2, ids, NULL), -EINVAL);
	memset(o, 0, sizeof(o));
	EXPECT(fabep_moe_combine_recv(moe, o, E_HIDDEN, NULL, NULL), 0);
	for (i = 0; i < 2 * E_HIDDEN; i++)
		EXPECT(o[i], 0x4000);
	EXPECT(fabep_moe_send_buffer(NULL, NULL, NULL, NULL, NULL), -EINVAL);
	/* a refused dispatch_send, logged under the name of the function
	 * called (the refusing rank's check, the peers' receive half) */
	{
		struct capture c;
		char *log;
		int got;

		ids[1] = rank == 1 ? E_EXPERTS : 0;
		capture_begin(&c, NULL);
		got = fabep_moe_dispatch_send(moe, x, NULL, 2, ids, NULL);
		if (rank != 1 && !got)
			got = fabep_moe_dispatch_recv(moe, &rv);
		log = capture_end(&c);
		ids[1] = 0;
		if (got != -ERANGE || !strstr(log, rank == 1 ?
		    "fabep_moe_dispatch_send: token 0: expert id 6" :
		    "fabep_moe_dispatch_recv: rank 1 rejected its input")) {
			fprintf(stderr, "rank %d: refused dispatch_send gave %d, "
				"logged:\n%s", rank, got, log);
			free(log);
			return 2;
		}
		free(log);
	}
	EXPECT(good_moe_round(moe, rank, size), 0);
	EXPECT(fabep_moe_destroy(NULL), 0);

	/* allreduce */
	EXPECT(fabep_allreduce_create(NULL, A_ROWS, A_COLS, FABEP_AR_F32, &ar), -EINVAL);
	EXPECT(fabep_allreduce_create(comm, A_ROWS, A_COLS, FABEP_AR_F32, NULL), -EINVAL);
	EXPECT(fabep_allreduce_create(comm, 0, A_COLS, FABEP_AR_F32, &ar), -EINVAL);
	EXPECT(fabep_allreduce_create(comm, A_ROWS, 0, FABEP_AR_F32, &ar), -EINVAL);
	EXPECT(fabep_allreduce_create(comm, A_ROWS, A_COLS, (fabep_ar_dtype_t)-1, &ar), -EINVAL);
	EXPECT(fabep_allreduce_create(comm, SIZE_MAX / 2, SIZE_MAX / 2, FABEP_AR_F32, &ar) < 0, 1);
	EXPECT(fabep_allreduce_create(comm, A_ROWS + rank, A_COLS, FABEP_AR_F32, &ar),
	       -FABEP_ERR_MISMATCH);
	EXPECT(fabep_allreduce_create(comm, A_ROWS, A_COLS, FABEP_AR_F32, &ar), 0);
	EXPECT(fabep_allreduce_onestage_max(NULL), 0);
	for (i = 0; i < A_ROWS * A_COLS; i++)
		in[i] = 1.0f;
	for (i = 0; i < A_COLS; i++)
		gamma[i] = 1.0f;
	EXPECT(fabep_allreduce(NULL, in, out, A_ROWS, A_COLS), -EINVAL);
	EXPECT(fabep_allreduce(ar, in, out, A_ROWS + 1, A_COLS), -EINVAL);
	EXPECT(fabep_allreduce(ar, in, out, (size_t)-1, A_COLS), -EINVAL);
	EXPECT(fabep_allreduce(ar, in, out, A_ROWS, A_COLS + 1), -EINVAL);
	EXPECT(fabep_allreduce(ar, in, out, A_ROWS, 0), -EINVAL);
	EXPECT(fabep_allreduce(ar, NULL, out, A_ROWS, A_COLS), -EINVAL);
	EXPECT(fabep_allreduce(ar, in, NULL, A_ROWS, A_COLS), -EINVAL);
	EXPECT(fabep_allreduce(ar, in, out, A_ROWS - rank, A_COLS), -FABEP_ERR_MISMATCH);
	EXPECT(fabep_allreduce(ar, rank == 1 ? NULL : in, out, A_ROWS, A_COLS), -EINVAL);
	EXPECT(good_ar(ar, size), 0);
	fabep_rmsnorm_params_init(&p);
	p.gamma = gamma;
	p.eps = 1e-6f;
	p.scale_ub = 1000.0f;
	EXPECT(fabep_allreduce_rmsnorm(NULL, in, A_ROWS, A_COLS, &p, out), -EINVAL);
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS, NULL, out), -EINVAL);
	p.gamma = NULL;
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS, &p, out), -EINVAL);
	p.gamma = gamma;
	p.eps = -1.0f;
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS, &p, out), -EINVAL);
	p.eps = NAN;
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS, &p, out), -EINVAL);
	p.eps = 1e-6f;
	/* parameters that are not numbers, on one rank or all */
	p.weight_offset = rank == 1 ? NAN : 0.0f;
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS, &p, out), -EINVAL);
	p.weight_offset = INFINITY;
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS, &p, out), -EINVAL);
	p.weight_offset = 0.0f;
	p.scale_ub = rank == 1 ? NAN : 1000.0f;
	EXPECT(fabep_allreduce_rmsnorm_fp8(ar, in, A_ROWS, A_COLS, &p, (uint8_t *)out, sc),
	       -EINVAL);
	p.scale_ub = 1000.0f;
	/* out is the residual on one rank */
	p.residual = rank == 1 ? (void *)out : NULL;
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS, &p, out), -EINVAL);
	p.residual = NULL;
	EXPECT(fabep_allreduce_rmsnorm_fp8(ar, in, A_ROWS, A_COLS, &p, NULL, sc), -EINVAL);
	EXPECT(fabep_allreduce_rmsnorm_fp8(ar, in, A_ROWS, A_COLS, &p, (uint8_t *)out, NULL),
	       -EINVAL);
	EXPECT(fabep_allreduce_rmsnorm_fp8(ar, in, A_ROWS, A_COLS, NULL, (uint8_t *)out, sc),
	       -EINVAL);
	EXPECT(fabep_allreduce_rmsnorm_fp8(ar, in, A_ROWS, A_COLS, &p, (uint8_t *)out, sc), 0);
	EXPECT(good_ar(ar, size), 0);
	EXPECT(fabep_allreduce_destroy(NULL), 0);

	/* and everything still works together */
	EXPECT(good_moe_round(moe, rank, size), 0);
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_moe_destroy(moe), 0);
	EXPECT(fabep_allreduce_destroy(ar), 0);

	/* FP8_PREQUANT tokens come with their scales: without them on any
	 * rank, every rank gets -EINVAL; then a dispatch with them works */
	bad = cfg;
	bad.token_type = FABEP_MOE_FP8_PREQUANT;
	EXPECT(fabep_moe_create(comm, &bad, &moe), 0);
	memset(x, 0x38, sizeof(x)); /* e4m3 1.0 */
	for (i = 0; i < A_ROWS; i++)
		sc[i] = 1.0f;
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, &rv), -EINVAL);
	EXPECT(fabep_moe_dispatch(moe, x, rank == 1 ? NULL : sc, 2, ids, NULL, &rv),
	       -EINVAL);
	EXPECT(fabep_moe_dispatch(moe, x, sc, 2, ids, NULL, &rv), 0);
	/* a row per (token, k) whose expert lives here, from every rank */
	for (i = 0, n = 0; i < 2 * E_TOPK; i++)
		n += ids[i] / (E_EXPERTS / size) == rank;
	EXPECT(rv.rows, (size_t)(n * size));
	for (n = 0; n < (int)rv.rows; n++) {
		const uint8_t *row = (const uint8_t *)rv.x +
				     rv.row_index[n] * rv.row_stride;

		EXPECT(row[0] == 0x38 && row[E_HIDDEN - 1] == 0x38, 1);
		EXPECT(rv.scales[rv.row_index[n] * rv.scale_stride] == 1.0f, 1);
	}
	EXPECT(fabep_moe_destroy(moe), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	(void)m2;
	(void)a2;
	return 0;
}

/* Handles left alive: fabep_comm_destroy (arg NULL) or fabep_comm_abort
 * destroys them first.  Three rounds of a communicator with a MoE and
 * two allreduce handles; from the second round on the process's heap
 * must not grow by a MoE handle's memory each round (and LeakSanitizer,
 * where the tests run under it, must find nothing). */
static int handles_rank(int rank, int size, void *arg)
{
	fabep_moe_config_t cfg;
	fabep_comm_attr_t a;
	size_t used[3];
	int round;

	(void)rank;
	fabep_moe_config_init(&cfg);
	cfg.num_experts = 4 * size;
	cfg.top_k = 2;
	cfg.hidden = 4096;
	cfg.max_tokens = 2048;
	for (round = 0; round < 3; round++) {
		fabep_comm_t *comm = NULL;
		fabep_moe_t *moe = NULL;
		fabep_allreduce_t *ar = NULL, *ar2 = NULL;
		float in[2 * 64], out[2 * 64];
		int i;

		fabep_comm_attr_init(&a);
		a.threads = 1;
		a.heap_size = fabep_moe_heap_bytes(&cfg, size) +
			      2 * fabep_allreduce_heap_bytes(2, 64, FABEP_AR_F32, size) +
			      (1u << 20);
		EXPECT(fabep_comm_create(&a, &comm), 0);
		EXPECT(fabep_moe_create(comm, &cfg, &moe), 0);
		EXPECT(fabep_allreduce_create(comm, 2, 64, FABEP_AR_F32, &ar), 0);
		EXPECT(fabep_allreduce_create(comm, 2, 64, FABEP_AR_F32, &ar2), 0);
		EXPECT(fabep_allreduce_destroy(ar2), 0); /* one gone before */
		for (i = 0; i < 2 * 64; i++)
			in[i] = 1.0f;
		EXPECT(fabep_allreduce(ar, in, out, 2, 64), 0);
		EXPECT(out[127] == (float)size, 1);
		if (arg) {
			EXPECT(fabep_barrier(comm), 0);
			fabep_comm_abort(comm);
		} else {
			EXPECT(fabep_comm_destroy(comm), 0);
		}
		used[round] = mallinfo2().uordblks;
	}
	if (used[2] > used[1] + (256u << 10)) {
		fprintf(stderr, "rank %d: the heap grew by %zu bytes in a round "
			"(%zu, %zu, %zu)\n", rank, used[2] - used[1], used[0],
			used[1], used[2]);
		return 1;
	}
	return fep_test_leak_check() ? 3 : 0;
}

START_TEST(handles_with_comm)
{
	fep_test_on_provider("shm");
	fep_test_ranks_ok(2, 60, handles_rank, NULL);
	fep_test_ranks_ok(2, 60, handles_rank, (void *)1);
}
END_TEST

/* A child of fork() after the communicator was made: every call on the
 * communicator or its handles fails at once with -EPERM saying why,
 * destroy and abort included, and touches nothing of the parent's (a
 * call sent on the copies would land in the peer as rank 0's, a goodbye
 * would end its communicator); a communicator the child makes itself
 * works.  The parent and its peer go on, their results checked, and
 * destroy cleanly. */
static int forked_child(fabep_comm_t *comm, fabep_moe_t *moe,
			fabep_allreduce_t *ar, fabep_off_t ctr)
{
	int rank = 0;  /* for EXPECT */
	float in[A_COLS], out[A_COLS];
	int64_t t0 = now_ns();

	memset(in, 0, sizeof(in));
	EXPECT(fabep_barrier(comm), -EPERM);
	EXPECT(strstr(fabep_last_error(), "child of a fork()") != NULL, 1);
	EXPECT(fabep_put(comm, 1, ctr, ctr, 64), -EPERM);
	EXPECT(fabep_wait(comm, ctr, 1), -EPERM);
	EXPECT(fabep_progress(comm), -EPERM);
	EXPECT(fabep_allreduce(ar, in, out, 1, A_COLS), -EPERM);
	EXPECT(fabep_moe_destroy(moe), -EPERM);
	EXPECT(fabep_allreduce_destroy(ar), -EPERM);
	EXPECT(fabep_comm_destroy(comm), -EPERM);
	fabep_comm_abort(comm);
	EXPECT(fabep_barrier(comm), -EPERM);  /* still refused, not freed */
	EXPECT((now_ns() - t0) < 2000000000LL, 1);
	{
		/* and a communicator of its own works (one rank) */
		fabep_comm_t *own = NULL;
		fabep_allreduce_t *oar = NULL;
		fabep_comm_attr_t a;
		char root[32];
		int i;

		snprintf(root, sizeof(root), "127.0.0.1:%d", fep_test_free_port());
		setenv("FABEP_ROOT", root, 1);
		setenv("FABEP_RANK", "0", 1);
		setenv("FABEP_WORLD_SIZE", "1", 1);
		unsetenv("FABEP_LOCAL_RANK");
		unsetenv("FABEP_LOCAL_SIZE");
		fabep_comm_attr_init(&a);
		a.threads = 1;
		a.heap_size = fabep_allreduce_heap_bytes(1, A_COLS, FABEP_AR_F32, 1) +
			      (1u << 20);
		EXPECT(fabep_comm_create(&a, &own), 0);
		EXPECT(fabep_allreduce_create(own, 1, A_COLS, FABEP_AR_F32, &oar), 0);
		for (i = 0; i < A_COLS; i++)
			in[i] = (float)i;
		EXPECT(fabep_allreduce(oar, in, out, 1, A_COLS), 0);
		EXPECT(out[A_COLS - 1] == (float)(A_COLS - 1), 1);
		EXPECT(fabep_barrier(own), 0);
		EXPECT(fabep_allreduce_destroy(oar), 0);
		EXPECT(fabep_comm_destroy(own), 0);
	}
	return 0;
}

static int forked_rank(int rank, int size, void *arg)
{
	fabep_moe_config_t cfg;
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_moe_t *moe = NULL;
	fabep_allreduce_t *ar = NULL;
	float in[A_COLS], out[A_COLS];
	int i, round, status;
	fabep_off_t ctr;
	pid_t pid;

	(void)arg;
	fabep_moe_config_init(&cfg);
	cfg.num_experts = 2 * size;
	cfg.top_k = 2;
	cfg.hidden = 256;
	cfg.max_tokens = 16;
	fabep_comm_attr_init(&a);
	a.threads = 2;
	a.timeout_ms = 10000;
	a.heap_size = fabep_moe_heap_bytes(&cfg, size) +
		      fabep_allreduce_heap_bytes(1, A_COLS, FABEP_AR_F32, size) +
		      (1u << 20);
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_moe_create(comm, &cfg, &moe), 0);
	EXPECT(fabep_allreduce_create(comm, 1, A_COLS, FABEP_AR_F32, &ar), 0);
	EXPECT(fabep_heap_alloc(comm, 64, 64, &ctr), 0);
	EXPECT(fabep_barrier(comm), 0);
	if (rank == 0) {
		fflush(NULL);
		pid = fork();
		EXPECT(pid >= 0, 1);
		if (pid == 0)
			_exit(forked_child(comm, moe, ar, ctr));
		EXPECT(waitpid(pid, &status, 0), pid);
		if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			fprintf(stderr, "rank 0: the forked child ended with status "
				"0x%x\n", status);
			return 2;
		}
	}
	for (round = 0; round < 3; round++) {
		for (i = 0; i < A_COLS; i++)
			in[i] = (float)(rank + 1) * (float)(i + round);
		EXPECT(fabep_allreduce(ar, in, out, 1, A_COLS), 0);
		for (i = 0; i < A_COLS; i++)
			EXPECT(out[i] == 3.0f * (float)(i + round), 1);
		EXPECT(fabep_barrier(comm), 0);
	}
	EXPECT(fabep_moe_destroy(moe), 0);
	EXPECT(fabep_allreduce_destroy(ar), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	return 0;
}

FEP_TEST_RANKS_CASE(forked_shm, "shm", 2, 60, forked_rank, NULL)
FEP_TEST_RANKS_CASE(forked_tcp, "tcp", 2, 60, forked_rank, NULL)

/* A rank that reaches destroy late, within the communicator's timeout
 * but past 5 s: every rank's destroy waits for it and succeeds. */
#define LATE_TIMEOUT_MS 20000
#define LATE_MS 6000

static int late_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	int64_t t0;
	int ret;

	(void)size;
	(void)arg;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = LATE_TIMEOUT_MS;
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_barrier(comm), 0);
	if (rank == 1)
		sleep_us(LATE_MS * 1000L);
	t0 = now_ns();
	ret = fabep_comm_destroy(comm);
	if (ret) {
		fprintf(stderr, "rank %d: destroy gave %d (%s) after %lld ms\n", rank,
			ret, fabep_strerror(ret), (long long)((now_ns() - t0) / 1000000));
		return 1;
	}
	return 0;
}

START_TEST(destroy_late)
{
	fep_test_on_provider("shm");
	unsetenv("FABEP_TIMEOUT_MS");
	fep_test_ranks_ok(2, 60, late_rank, NULL);
}
END_TEST

/* The rendezvous's own limit (rendezvous_timeout_ms,
 * FABEP_RENDEZVOUS_TIMEOUT_MS): rank 1 comes RDV_LATE_MS after rank 0,
 * longer than the calls' timeout.  RDV_ATTR: a limit in the attribute
 * lets it in, and the calls keep their timeout (rank 0's barrier without
 * rank 1 fails at about RDV_CALL_MS); RDV_FOREVER: the variable's -1
 * (no limit) lets it in; RDV_DEFAULT: without either the rendezvous
 * keeps the calls' timeout and both ranks fail with -ETIMEDOUT, rank 0
 * naming the rank that never came. */
#define RDV_CALL_MS 500
#define RDV_LATE_MS 1500
enum { RDV_ATTR, RDV_FOREVER, RDV_DEFAULT };

static int rdv_limit_rank(int rank, int size, void *arg)
{
	int mode = (int)(intptr_t)arg;
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	int64_t t0, ms;
	int ret;

	(void)size;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = RDV_CALL_MS;
	if (mode == RDV_ATTR)
		a.rendezvous_timeout_ms = 20000;
	if (mode == RDV_FOREVER)
		setenv("FABEP_RENDEZVOUS_TIMEOUT_MS", "-1", 1);
	else
		unsetenv("FABEP_RENDEZVOUS_TIMEOUT_MS");
	if (rank == 1)
		sleep_us(RDV_LATE_MS * 1000L);
	(void)fabep_last_error();
	ret = fabep_comm_create(&a, &comm);
	if (mode == RDV_DEFAULT) {
		EXPECT(ret, -ETIMEDOUT);
		if (rank == 0)
			EXPECT(strstr(fabep_last_error(), "rank 1 never connected within 500 ms") != NULL, 1);
		return 0;
	}
	EXPECT(ret, 0);
	if (mode == RDV_ATTR) {
		/* the calls' timeout is still RDV_CALL_MS: rank 0's barrier,
		 * which rank 1 never enters, fails after it */
		if (rank == 0) {
			t0 = now_ns();
			ret = fabep_barrier(comm);
			ms = (now_ns() - t0) / 1000000;
			EXPECT(ret, -ETIMEDOUT);
			EXPECT(ms >= RDV_CALL_MS - 50 && ms < 2 * RDV_CALL_MS + 500, 1);
		} else {
			sleep_us(3 * RDV_CALL_MS * 1000L);
		}
		fabep_comm_abort(comm);
		return 0;
	}
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	return 0;
}

START_TEST(rendezvous_limit)
{
	fep_test_on_provider("shm");
	unsetenv("FABEP_TIMEOUT_MS");
	fep_test_ranks_ok(2, 30, rdv_limit_rank, (void *)(intptr_t)_i);
}
END_TEST

/* A peer that dies while this rank polls memory with fabep_progress
 * (no wait of the library's): fabep_progress says so within the
 * liveness check's period, not at the caller's own timeout. */
#define POLL_TIMEOUT_MS 20000

static int poll_lost_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	int64_t t0, ms;
	int ret;

	(void)size;
	(void)arg;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = POLL_TIMEOUT_MS;
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_progress(comm), 0);
	EXPECT(fabep_barrier(comm), 0);
	/* rank 0 is past the barrier's wait by then, however loaded the
	 * host: what sees the death is its polling below */
	if (rank == 1) {
		sleep_us(300 * 1000);
		raise(SIGKILL);
	}
	t0 = now_ns();
	do {
		ret = fabep_progress(comm);
		ms = (now_ns() - t0) / 1000000;
		if (!ret)
			sleep_us(100);
	} while (!ret && ms < POLL_TIMEOUT_MS);
	if (ret != -FABEP_ERR_PEER_LOST || ms > 5000) {
		fprintf(stderr, "fabep_progress gave %d (%s) after %lld ms\n", ret,
			fabep_strerror(ret), (long long)ms);
		return 1;
	}
	/* the communicator is told it cannot go on; aborting it frees it */
	EXPECT(fabep_barrier(comm), -FABEP_ERR_PEER_LOST);
	fabep_comm_abort(comm);
	return 0;
}

static void run_poll_lost(const char *prov)
{
	int status[2];

	fep_test_on_provider(prov);
	setenv("FABEP_LOG", "error", 1);
	ck_assert_msg(fep_test_run_ranks_status(2, 60, poll_lost_rank, NULL,
						status) == 0 &&
		      status[0] == 0 && status[1] == 128 + SIGKILL,
		      "%s: statuses %d, %d: %s", prov, status[0], status[1],
		      fep_test_rank_said(0));
}

START_TEST(poll_lost_shm) { run_poll_lost("shm"); } END_TEST
START_TEST(poll_lost_tcp) { run_poll_lost("tcp"); } END_TEST

static void run_args(const char *prov)
{
	fep_test_on_provider(prov);
	setenv("FABEP_LOG", "error", 1);
	fep_test_ranks_ok(2, 60, args_rank, NULL);
}

START_TEST(args_shm) { run_args("shm"); } END_TEST
START_TEST(args_tcp) { run_args("tcp"); } END_TEST

/* ---- a configuration refused on one rank ---- */

/* Rank 1's FABEP_* variable (or attribute) is refused: rank 1 fails
 * with -EINVAL, and tells the others through the rendezvous, whose
 * creation fails with -FABEP_ERR_PEER naming it long before their
 * timeout (20 s here); then all create a communicator again. */
#define REFUSE_TIMEOUT_MS 20000
#define REFUSE_BOUND_MS 5000

struct refusal {
	const char *var, *value;   /* NULL var: attr.signal out of range */
};

static int refuse_rank(int rank, int size, void *arg)
{
	const struct refusal *rf = arg;
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	int64_t t0, ms;
	int ret;

	(void)size;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = REFUSE_TIMEOUT_MS;
	if (rank == 1) {
		if (rf->var)
			setenv(rf->var, rf->value, 1);
		else
			a.signal = (fabep_signal_t)99;
	}
	t0 = now_ns();
	ret = fabep_comm_create(&a, &comm);
	ms = (now_ns() - t0) / 1000000;
	if (ret != (rank == 1 ? -EINVAL : -FABEP_ERR_PEER) || ms > REFUSE_BOUND_MS) {
		fprintf(stderr, "rank %d: %s=%s on rank 1: %d (%s) after %lld ms\n",
			rank, rf->var ? rf->var : "attr.signal",
			rf->value ? rf->value : "99", ret, fabep_strerror(ret),
			(long long)ms);
		return 1;
	}
	if (rank != 1 && !strstr(fabep_last_error(),
				 "rank 1 refused its configuration")) {
		fprintf(stderr, "rank %d: the message names no rank: %s\n", rank,
			fabep_last_error());
		return 2;
	}
	if (rank == 1) {
		if (rf->var)
			unsetenv(rf->var);
		a.signal = FABEP_SIGNAL_AUTO;
	}
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	return fep_test_leak_check() ? 3 : 0;
}

START_TEST(refused_config)
{
	static const struct refusal cases[] = {
		{ "FABEP_SIGNAL", "bogus" },
		{ "FABEP_NUMA_NODE", "near" },
		{ "FABEP_CHANNELS", "0" },
		{ "FABEP_QUEUE_WARMUP", "sometimes" },
		{ "FABEP_HEAP_SIZE", "12q" },
		{ "FABEP_LOCAL_RANK", "5" },  /* without FABEP_LOCAL_SIZE */
		{ NULL, NULL },
	};
	size_t i;

	fep_test_on_provider("shm");
	setenv("FABEP_LOG", "error", 1);
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		fep_test_ranks_ok(3, 60, refuse_rank, (void *)&cases[i]);
}
END_TEST

/* A rank whose FABEP_SIGNAL is refused before FABEP_TIMEOUT_MS is read,
 * and whose root never comes: it still gives up at FABEP_TIMEOUT_MS
 * (1 s here), not at the default 30 s. */
static int refuse_alone_rank(int rank, int size, void *arg)
{
	char root[32];
	fabep_comm_t *comm = NULL;
	int64_t t0, ms;
	int ret;

	(void)rank;
	(void)size;
	(void)arg;
	snprintf(root, sizeof(root), "127.0.0.1:%d", fep_test_free_port());
	setenv("FABEP_ROOT", root, 1);
	setenv("FABEP_RANK", "1", 1);
	setenv("FABEP_WORLD_SIZE", "2", 1);
	setenv("FABEP_TIMEOUT_MS", "1000", 1);
	setenv("FABEP_SIGNAL", "bogus", 1);
	t0 = now_ns();
	ret = fabep_comm_create(NULL, &comm);
	ms = (now_ns() - t0) / 1000000;
	if (ret != -EINVAL || ms > 1000 + SLACK_MS) {
		fprintf(stderr, "create gave %d (%s) after %lld ms\n", ret,
			fabep_strerror(ret), (long long)ms);
		return 1;
	}
	return 0;
}

START_TEST(refused_alone)
{
	fep_test_ranks_ok(1, 60, refuse_alone_rank, NULL);
}
END_TEST

/* Heap sizes that map to the same pages are the same configuration. */
static int heap_round_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;

	(void)size;
	(void)arg;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.heap_size = rank ? 69632 : 65537;
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_heap_size(comm), 69632);
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	return 0;
}

FEP_TEST_RANKS_CASE(heap_rounded, "shm", 2, 60, heap_round_rank, NULL)

/* A caller's fabep_wait that times out on a counter its own protocol
 * never signalled leaves the communicator usable on every rank: the
 * same wait again, a put + signal round trip, a barrier and a clean
 * destroy (the peers were not told this rank stopped). */
static int wait_timeout_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_off_t ctr = 0, off = 0;

	(void)arg;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 1000;
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_heap_alloc(comm, 8, 8, &ctr), 0);
	EXPECT(fabep_heap_alloc(comm, 64, 64, &off), 0);
	/* rank 1 meets rank 0 in the barrier well within its timeout */
	if (rank == 0) {
		EXPECT(fabep_wait(comm, ctr, 1), -ETIMEDOUT);
		EXPECT(strstr(fabep_last_error(), "timed out") != NULL, 1);
	} else
		usleep(500 * 1000);
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_put_signal(comm, (rank + 1) % size, off, off, 8, ctr, 1), 0);
	EXPECT(fabep_wait(comm, ctr, 1), 0);
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	return 0;
}

FEP_TEST_RANKS_CASE(wait_timeout, "shm", 2, 60, wait_timeout_rank, NULL)

/* A barrier that times out on a late rank is finished by the next call:
 * with 4 ranks (two rounds) ranks time out in either round, and their
 * retries must meet the late rank's first barrier, after which barriers
 * keep their meaning: every rank's stamp, put before a barrier, is there
 * after it (a barrier abandoned mid-way would leave the later rounds'
 * counters one short, and the retries would time out or pass early).
 * destroy then says goodbye on every rank. */
static int barrier_retry_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_off_t slots = 0;
	volatile uint64_t *seen;
	uint64_t stamp;
	int i, r, ret, timeouts = 0;

	(void)arg;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 500;
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_heap_alloc(comm, 8 * (size_t)(size + 1), 64, &slots), 0);
	seen = fabep_heap_ptr(comm, slots);
	if (rank == size - 1)
		usleep(1500 * 1000);
	for (i = 0; (ret = fabep_barrier(comm)) == -ETIMEDOUT && i < 20; i++)
		timeouts++;
	EXPECT(ret, 0);
	if (rank == 0 && !timeouts) {
		fprintf(stderr, "rank 0: no barrier timed out waiting for rank %d\n",
			size - 1);
		return 90;
	}
	for (i = 1; i <= 5; i++) {
		stamp = (uint64_t)i;
		memcpy((void *)&seen[size], &stamp, 8);
		for (r = 0; r < size; r++)
			if (r != rank)
				EXPECT(fabep_put(comm, r, slots + 8 * (uint64_t)rank,
						 slots + 8 * (uint64_t)size, 8), 0);
		EXPECT(fabep_barrier(comm), 0);
		for (r = 0; r < size; r++)
			if (r != rank && seen[r] < (uint64_t)i) {
				fprintf(stderr, "rank %d: barrier %d passed before "
					"rank %d's stamp arrived (%llu)\n", rank, i,
					r, (unsigned long long)seen[r]);
				return 91;
			}
	}
	EXPECT(fabep_comm_destroy(comm), 0);
	return 0;
}

FEP_TEST_RANKS_CASE(barrier_retry, "shm", 4, 60, barrier_retry_rank, NULL)

/* Each rank may ask for its own domain (a NIC of its own) and spell the
 * provider its own way: what must agree is the provider opened.  tcp
 * with rank 0 on "lo" and rank 1 on another tcp domain where there is
 * one (else fabep's choice), rank 0 asking for "tcp" and rank 1 for
 * "tcp;ofi_rxm": a put + signal round trip works.  Then rank 0 on tcp
 * and rank 1 on sockets: every rank refuses, naming both providers, and
 * a communicator on one provider works after it. */
static int prov_domain_rank(int rank, int size, void *arg)
{
	fabep_provider_desc_t d[16];
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_off_t ctr = 0, off = 0;
	const char *other = NULL;
	int n = 0, i;

	(void)arg;
	for (i = 0; i < 16; i++) {
		memset(&d[i], 0, sizeof(d[i]));
		d[i].size = sizeof(d[i]);
	}
	if (!fabep_provider_list("tcp", d, 16, &n))
		for (i = 0; i < n && !other; i++)
			if (strcmp(d[i].domain, "lo"))
				other = d[i].domain;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 10000;
	a.provider = rank == 0 ? "tcp" : "tcp;ofi_rxm";
	a.domain = rank == 0 ? "lo" : other;
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(strcmp(fabep_comm_domain(comm), rank == 0 ? "lo" :
		      other ? other : fabep_comm_domain(comm)), 0);
	EXPECT(fabep_heap_alloc(comm, 8, 8, &ctr), 0);
	EXPECT(fabep_heap_alloc(comm, 64, 64, &off), 0);
	EXPECT(fabep_put_signal(comm, (rank + 1) % size, off, off, 8, ctr, 1), 0);
	EXPECT(fabep_wait(comm, ctr, 1), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 10000;
	a.provider = rank == 0 ? "tcp" : "sockets";
	EXPECT(fabep_comm_create(&a, &comm), -FABEP_ERR_MISMATCH);
	EXPECT(strstr(fabep_last_error(), "opened provider") != NULL, 1);
	a.provider = "sockets";
	EXPECT(fabep_comm_create(&a, &comm), 0);
	EXPECT(fabep_barrier(comm), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	return 0;
}

START_TEST(provider_domain_per_rank)
{
	fep_test_need_provider("tcp");
	fep_test_need_provider("sockets");
	fep_test_ranks_ok(2, 90, prov_domain_rank, NULL);
}
END_TEST

/* ---- fabep_last_error: the calling thread's error messages ---- */

static void *last_error_thread(void *arg)
{
	const char **seen = arg;

	/* the main thread's unread failure is not this thread's */
	seen[0] = strdup(fabep_last_error());
	if (fabep_flush(NULL) != -EINVAL)
		return NULL;
	seen[1] = strdup(fabep_last_error());
	return NULL;
}

START_TEST(last_error)
{
	char want[4096];
	const char *seen[2] = { NULL, NULL };
	const char *p, *q;
	pthread_t t;
	size_t len;
	int i;

	/* kept whatever FABEP_LOG says: here nothing is printed */
	setenv("FABEP_LOG", "none", 1);
	ck_assert_int_eq(fep_log_level(), FEP_LOG_NONE);
	(void)fabep_last_error();
	ck_assert_str_eq(fabep_last_error(), "");

	ck_assert_int_eq(fabep_barrier(NULL), -EINVAL);
	p = fabep_last_error();
	ck_assert_str_eq(p, "fabep_barrier: NULL communicator");
	/* returned once; the text stays until the thread's next error */
	ck_assert_str_eq(fabep_last_error(), "");
	ck_assert_int_eq(fabep_comm_rank(NULL), -EINVAL); /* logs nothing */
	fep_warn("a warning is not an error");
	ck_assert_str_eq(p, "fabep_barrier: NULL communicator");
	ck_assert_str_eq(fabep_last_error(), "");

	/* unread failures add up, oldest first */
	ck_assert_int_eq(fabep_put(NULL, 0, 0, 0, 8), -EINVAL);
	ck_assert_int_eq(fabep_wait(NULL, 0, 0), -EINVAL);
	ck_assert_str_eq(fabep_last_error(),
			 "fabep_put: NULL communicator\n"
			 "fabep_wait: NULL communicator");

	/* another thread sees none of this thread's text, and this thread
	 * none of the other's */
	ck_assert_int_eq(fabep_heap_alloc(NULL, 8, 8, NULL), -EINVAL);
	ck_assert_int_eq(pthread_create(&t, NULL, last_error_thread, seen), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_ptr_nonnull(seen[0]);
	ck_assert_ptr_nonnull(seen[1]);
	ck_assert_str_eq(seen[0], "");
	ck_assert_str_eq(seen[1], "fabep_flush: NULL communicator");
	ck_assert_str_eq(fabep_last_error(),
			 "fabep_heap_alloc: NULL communicator or offset");
	free((void *)seen[0]);
	free((void *)seen[1]);

	/* more than the buffer holds: the newest whole lines are kept */
	for (i = 0; i < 300; i++) {
		snprintf(want, sizeof(want), "message %d", i);
		fep_err("%s", want);
	}
	p = fabep_last_error();
	len = strlen(p);
	ck_assert_uint_gt(len, 2048);
	ck_assert_uint_lt(len, 4096);
	ck_assert_int_eq(strncmp(p, "message ", 8), 0);
	ck_assert_str_eq(p + len - strlen(want), want);
	for (i = atoi(p + 8), q = p; q; i++) {
		snprintf(want, sizeof(want), "message %d", i);
		ck_assert_int_eq(strncmp(q, want, strlen(want)), 0);
		q = strchr(q, '\n');
		q = q ? q + 1 : NULL;
	}
	ck_assert_int_eq(i, 300);
}
END_TEST

static void *log_quiet_thread(void *arg)
{
	(void)arg;
	/* not muted: the main thread's setting is its own */
	(void)fabep_heap_alloc(NULL, 8, 8, NULL);
	return NULL;
}

/* fabep_log_quiet: a muted thread's errors are kept for fabep_last_error
 * but not printed; other threads print as FABEP_LOG says */
START_TEST(log_quiet)
{
	char out[4096];
	pthread_t t;
	FILE *f;
	size_t n;
	int err_fd;

	setenv("FABEP_LOG", "warning", 1);
	f = tmpfile();
	ck_assert_ptr_nonnull(f);
	fflush(stderr);
	err_fd = dup(2);
	ck_assert_int_ge(err_fd, 0);
	ck_assert_int_eq(dup2(fileno(f), 2), 2);

	(void)fabep_last_error();
	ck_assert_int_eq(fabep_barrier(NULL), -EINVAL);       /* printed */
	ck_assert_int_eq(fabep_log_quiet(1), 0);
	ck_assert_int_eq(fabep_put(NULL, 0, 0, 0, 8), -EINVAL); /* kept only */
	fep_warn("a muted warning");
	ck_assert_int_eq(pthread_create(&t, NULL, log_quiet_thread, NULL), 0);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_int_eq(fabep_log_quiet(7), 1);              /* still muted */
	ck_assert_int_eq(fabep_wait(NULL, 0, 0), -EINVAL);    /* kept only */
	ck_assert_int_eq(fabep_log_quiet(0), 1);
	ck_assert_int_eq(fabep_flush(NULL), -EINVAL);         /* printed */
	fep_warn("an unmuted warning");                       /* printed */
	ck_assert_int_eq(fabep_log_quiet(0), 0);

	fflush(stderr);
	ck_assert_int_eq(dup2(err_fd, 2), 2);
	close(err_fd);
	rewind(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	fclose(f);
	ck_assert_str_eq(fabep_last_error(),
			 "fabep_barrier: NULL communicator\n"
			 "fabep_put: NULL communicator\n"
			 "fabep_wait: NULL communicator\n"
			 "fabep_flush: NULL communicator");
	ck_assert_ptr_nonnull(strstr(out, "fabep_barrier: NULL communicator"));
	ck_assert_ptr_nonnull(strstr(out,
		"fabep_heap_alloc: NULL communicator or offset"));
	ck_assert_ptr_nonnull(strstr(out, "fabep_flush: NULL communicator"));
	ck_assert_ptr_null(strstr(out, "fabep_put"));
	ck_assert_ptr_null(strstr(out, "fabep_wait"));
	ck_assert_ptr_nonnull(strstr(out, "an unmuted warning"));
	ck_assert_ptr_null(strstr(out, "a muted warning"));
}
END_TEST

/* ---- the size field of caller-allocated structs (fabep.h) ---- */

/* A caller's struct of `size` bytes: the library's layout `src` (known
 * bytes), then `tail` bytes past it (a later version's fields). */
#define ABI_MAX 2048
union abi_buf {
	size_t size;
	max_align_t align_;
	unsigned char b[ABI_MAX];
};

static void *abi_make(union abi_buf *u, const void *src, size_t known,
		      size_t size, unsigned char tail)
{
	memset(u->b, tail, sizeof(u->b));
	memcpy(u->b, src, FEP_MIN(known, size));
	u->size = size;
	return u->b;
}

/* No byte of u at or past `from` differs from c. */
static int abi_untouched(const union abi_buf *u, size_t from, unsigned char c)
{
	size_t i;

	for (i = from; i < sizeof(u->b); i++)
		if (u->b[i] != c)
			return 0;
	return 1;
}

/* Calls that need no communicator, on rank 0's side of the test. */
static int abi_local(int rank)
{
	fabep_comm_attr_t a;
	fabep_moe_config_t cfg;
	fabep_rmsnorm_params_t p;
	fabep_provider_desc_t d[2], ref[2];
	fabep_comm_t *comm = NULL;
	union abi_buf u, v;
	size_t bytes;
	int n = 0, m = 0;

	/* the init functions set the size, and only what they document */
	memset(&a, 0x5a, sizeof(a));
	fabep_comm_attr_init(&a);
	EXPECT(a.size, sizeof(a));
	EXPECT(a.nranks, -1);
	memset(&cfg, 0x5a, sizeof(cfg));
	fabep_moe_config_init(&cfg);
	EXPECT(cfg.size, sizeof(cfg));
	memset(&p, 0x5a, sizeof(p));
	fabep_rmsnorm_params_init(&p);
	EXPECT(p.size, sizeof(p));
	EXPECT(p.gamma == NULL && p.residual == NULL && p.eps == 0.0f, 1);
	fabep_rmsnorm_params_init(NULL);

	/* an input refused by its size: 0, an older smaller layout, garbage,
	 * and unknown nonzero fields; before anything else is looked at */
	fabep_comm_attr_init(&a);
	a.size = 0;
	EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
	a.size = FEP_COMM_ATTR_SIZE0 - sizeof(int);
	EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
	a.size = FABEP_STRUCT_SIZE_MAX + 1;
	EXPECT(fabep_comm_create(&a, &comm), -EINVAL);
	fabep_comm_attr_init(&a);
	EXPECT(fabep_comm_create(abi_make(&u, &a, sizeof(a), sizeof(a) + 8, 0x01),
				 &comm), -E2BIG);
	EXPECT(comm == NULL, 1);
	fabep_moe_config_init(&cfg);
	cfg.num_experts = E_EXPERTS;
	cfg.top_k = E_TOPK;
	cfg.hidden = E_HIDDEN;
	cfg.max_tokens = E_TOKENS;
	bytes = fabep_moe_heap_bytes(&cfg, 2);
	EXPECT(bytes > 0, 1);
	EXPECT(fabep_moe_heap_bytes(abi_make(&u, &cfg, sizeof(cfg), sizeof(cfg) + 24,
					     0), 2), bytes);
	EXPECT(fabep_moe_heap_bytes(abi_make(&u, &cfg, sizeof(cfg), sizeof(cfg) + 24,
					     0x80), 2), 0);
	EXPECT(fabep_moe_heap_bytes(abi_make(&u, &cfg, sizeof(cfg),
					     FEP_MOE_CONFIG_SIZE0 - 4, 0), 2), 0);
	EXPECT(fabep_moe_heap_bytes(abi_make(&u, &cfg, sizeof(cfg), 0, 0), 2), 0);

	/* outputs: descs[0].size is the element size */
	d[0].size = sizeof(d[0]);
	EXPECT(fabep_provider_list("shm", d, 0, &n), 0);
	EXPECT(n, 0);
	memset(ref, 0, sizeof(ref));
	ref[0].size = sizeof(ref[0]);
	EXPECT(fabep_provider_list(NULL, ref, 2, &n), 0);
	EXPECT(n >= 1 && ref[0].size == sizeof(ref[0]), 1);
	EXPECT(n < 2 || ref[1].size == sizeof(ref[1]), 1);
	memset(d, 0, sizeof(d));
	EXPECT(fabep_provider_list(NULL, d, 2, &m), -EINVAL);
	d[0].size = FEP_PROVIDER_DESC_SIZE0 - 8;
	EXPECT(fabep_provider_list(NULL, d, 2, &m), -EINVAL);
	d[0].size = FABEP_STRUCT_SIZE_MAX * 2;
	EXPECT(fabep_provider_list(NULL, d, 2, &m), -EINVAL);
	EXPECT(m, 0);
	/* a later caller's larger elements: each written up to what the
	 * library knows, its size field set, the rest left alone */
	{
		size_t es = sizeof(d[0]) + 40;
		unsigned char *e;
		int i;

		EXPECT(2 * es <= sizeof(u.b), 1);
		memset(u.b, 0xee, sizeof(u.b));
		u.size = es;
		EXPECT(fabep_provider_list(NULL, (fabep_provider_desc_t *)u.b, 2, &m), 0);
		EXPECT(m, n);
		for (i = 0; i < m; i++) {
			size_t j;

			e = u.b + (size_t)i * es;
			memcpy(&v.size, e, sizeof(size_t));
			EXPECT(v.size, es);
			EXPECT(memcmp(e + sizeof(size_t), (char *)&ref[i] + sizeof(size_t),
				      sizeof(ref[i]) - sizeof(size_t)), 0);
			for (j = sizeof(d[0]); j < es; j++)
				EXPECT(e[j], 0xee);
		}
		EXPECT(abi_untouched(&u, (size_t)m * es, 0xee), 1);
	}

	/* the rule for a struct that has grown since an older caller's
	 * layout (min < known): an input's missing fields read as 0, an
	 * output is written up to the caller's size only */
	{
		unsigned char src[64], dst[64];
		size_t sz = 24, i;

		memset(u.b, 0x11, sizeof(u.b));
		u.size = sz;
		memset(dst, 0x77, sizeof(dst));
		EXPECT(fep_struct_in("test", "t", dst, 40, 16, u.b), 0);
		for (i = 0; i < 40; i++)
			EXPECT(dst[i], i < sizeof(size_t) ? u.b[i] : i < sz ? 0x11 : 0);
		EXPECT(dst[40], 0x77);
		u.size = 8;
		EXPECT(fep_struct_in("test", "t", dst, 40, 16, u.b), -EINVAL);
		memset(src, 0x22, sizeof(src));
		memset(u.b, 0x33, sizeof(u.b));
		u.size = sz;
		fep_struct_out(u.b, sz, src, 40);
		EXPECT(u.size, sz);
		for (i = sizeof(size_t); i < sz; i++)
			EXPECT(u.b[i], 0x22);
		EXPECT(abi_untouched(&u, sz, 0x33), 1);
	}
	(void)rank;
	return 0;
}

/* Collective calls: a struct refused on one rank gives its code on every
 * rank, and the handle still works. */
static int abi_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	fabep_moe_config_t cfg;
	fabep_moe_t *moe = NULL;
	fabep_allreduce_t *ar = NULL;
	fabep_moe_recv_t rv = { .size = sizeof(rv) }, ref;
	fabep_moe_timing_t tm = { .size = sizeof(tm) };
	fabep_rmsnorm_params_t p;
	union abi_buf u;
	int32_t ids[E_TOKENS * E_TOPK];
	float in[A_ROWS * A_COLS], out[A_ROWS * A_COLS], gamma[A_COLS];
	uint16_t x[E_TOKENS * E_HIDDEN];
	int i, ret;

	(void)arg;
	if ((ret = abi_local(rank)))
		return ret;
	fabep_moe_config_init(&cfg);
	cfg.num_experts = E_EXPERTS;
	cfg.top_k = E_TOPK;
	cfg.hidden = E_HIDDEN;
	cfg.max_tokens = E_TOKENS;

	/* a later caller's attr with zero tail is accepted */
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = 10000;
	a.heap_size = 2 * fabep_moe_heap_bytes(&cfg, size) +
		      fabep_allreduce_heap_bytes(A_ROWS, A_COLS, FABEP_AR_F32, size) +
		      (1u << 20);
	EXPECT(fabep_comm_create(abi_make(&u, &a, sizeof(a), sizeof(a) + 64, 0),
				 &comm), 0);

	/* moe_create: one rank's bad size, every rank its code */
	EXPECT(fabep_moe_create(comm, rank == 1 ? abi_make(&u, &cfg, sizeof(cfg), 0, 0) :
				(void *)&cfg, &moe), -EINVAL);
	EXPECT(fabep_moe_create(comm, rank == 1 ? abi_make(&u, &cfg, sizeof(cfg),
							   FEP_MOE_CONFIG_SIZE0 - 8, 0) :
				(void *)&cfg, &moe), -EINVAL);
	EXPECT(fabep_moe_create(comm, rank == 1 ? abi_make(&u, &cfg, sizeof(cfg),
							   sizeof(cfg) + 8, 0x02) :
				(void *)&cfg, &moe), -E2BIG);
	EXPECT(moe == NULL, 1);
	EXPECT(fabep_moe_create(comm, abi_make(&u, &cfg, sizeof(cfg), sizeof(cfg) + 8, 0),
				&moe), 0);

	/* dispatch's output: a bad size on one rank */
	for (i = 0; i < E_TOKENS * E_TOPK; i++)
		ids[i] = (int32_t)(i % E_EXPERTS);
	memset(x, 0, sizeof(x));
	rv.size = rank == 1 ? 0 : sizeof(rv);
	EXPECT(fabep_moe_dispatch(moe, x, NULL, 2, ids, NULL, &rv), -EINVAL);
	EXPECT(good_moe_round(moe, rank, size), 0);
	/* dispatch_recv: refused on this rank alone, the dispatch pending */
	EXPECT(fabep_moe_dispatch_send(moe, x, NULL, 2, ids, NULL), 0);
	rv.size = FEP_MOE_RECV_SIZE0 - 8;
	EXPECT(fabep_moe_dispatch_recv(moe, &rv), -EINVAL);
	rv.size = FABEP_STRUCT_SIZE_MAX + 8;
	EXPECT(fabep_moe_dispatch_recv(moe, &rv), -EINVAL);
	/* a larger one: written up to what the library knows */
	memset(u.b, 0xcd, sizeof(u.b));
	u.size = sizeof(rv) + 32;
	EXPECT(fabep_moe_dispatch_recv(moe, (fabep_moe_recv_t *)u.b), 0);
	memcpy(&ref, u.b, sizeof(ref));
	EXPECT(ref.size, sizeof(rv) + 32);
	EXPECT(ref.rows > 0 && ref.row_offsets != NULL && ref.x != NULL, 1);
	EXPECT(ref.local_experts, E_EXPERTS / size);
	EXPECT(abi_untouched(&u, sizeof(rv), 0xcd), 1);
	EXPECT(fabep_moe_combine(moe, ref.x, E_HIDDEN, 0, x, E_HIDDEN, NULL, NULL), 0);

	/* timing: local */
	tm.size = 0;
	EXPECT(fabep_moe_timing(moe, &tm), -EINVAL);
	tm.size = sizeof(tm) - 8;
	EXPECT(fabep_moe_timing(moe, &tm), -EINVAL);
	tm.size = sizeof(tm);
	EXPECT(fabep_moe_timing(moe, &tm), 0);
	memset(u.b, 0xcd, sizeof(u.b));
	u.size = sizeof(tm) + 16;
	EXPECT(fabep_moe_timing(moe, (fabep_moe_timing_t *)u.b), 0);
	EXPECT(memcmp(u.b + sizeof(size_t), (char *)&tm + sizeof(size_t),
		      sizeof(tm) - sizeof(size_t)), 0);
	EXPECT(u.size, sizeof(tm) + 16);
	EXPECT(abi_untouched(&u, sizeof(tm), 0xcd), 1);
	EXPECT(good_moe_round(moe, rank, size), 0);

	/* allreduce + RMSNorm: one rank's bad size, every rank its code */
	EXPECT(fabep_allreduce_create(comm, A_ROWS, A_COLS, FABEP_AR_F32, &ar), 0);
	for (i = 0; i < A_ROWS * A_COLS; i++)
		in[i] = (float)(i % 7) - 3.0f;
	for (i = 0; i < A_COLS; i++)
		gamma[i] = 1.0f;
	fabep_rmsnorm_params_init(&p);
	p.gamma = gamma;
	p.eps = 1e-6f;
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS,
				       rank == 1 ? abi_make(&u, &p, sizeof(p), 0, 0) :
				       (void *)&p, out), -EINVAL);
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS,
				       rank == 0 ? abi_make(&u, &p, sizeof(p),
							    FEP_RMSNORM_PARAMS_SIZE0 - 8, 0) :
				       (void *)&p, out), -EINVAL);
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS,
				       rank == 1 ? abi_make(&u, &p, sizeof(p),
							    sizeof(p) + 8, 0x03) :
				       (void *)&p, out), -E2BIG);
	EXPECT(fabep_allreduce_rmsnorm(ar, in, A_ROWS, A_COLS,
				       abi_make(&u, &p, sizeof(p), sizeof(p) + 8, 0),
				       out), 0);
	EXPECT(good_ar(ar, size), 0);

	EXPECT(fabep_allreduce_destroy(ar), 0);
	EXPECT(fabep_moe_destroy(moe), 0);
	EXPECT(fabep_comm_destroy(comm), 0);
	return 0;
}

START_TEST(abi_shm)
{
	fep_test_on_provider("shm");
	setenv("FABEP_LOG", "error", 1);
	fep_test_ranks_ok(2, 60, abi_rank, NULL);
}
END_TEST

/* ---- the caller's signal dispositions ---- */

/* Whether a library whose file name starts with `name` is mapped into
 * this process (its line in /proc/self/maps). */
static int lib_mapped(const char *name)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096];
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		const char *b = strrchr(line, '/');

		found = b && !strncmp(b + 1, name, strlen(name));
	}
	fclose(f);
	return found;
}

/* Whether the handler of sig at start is neither the default nor
 * libinfinipath's (a sanitizer's runtime claims SIGSEGV, for one):
 * raising it then tells nothing about what libfabep did. */
static int handled_by_another(int sig)
{
	struct sigaction sa;
	Dl_info di;
	void *h;

	if (sigaction(sig, NULL, &sa))
		return 0;
	h = sa.sa_flags & SA_SIGINFO ? (void *)sa.sa_sigaction :
				       (void *)sa.sa_handler;
	if (h == (void *)SIG_DFL)
		return 0;
	return !(dladdr(h, &di) && di.dli_fname &&
		 strstr(di.dli_fname, "/libinfinipath.so"));
}

/* The process this test program becomes with FEP_TEST_RAISE=sig (main):
 * a fresh one, whose dispositions are what loading libfabep left (the
 * test's own process has Check's handlers for SIGINT and SIGTERM).  With
 * FEP_TEST_RAISE_COMM set it first opens a communicator of one rank on
 * shm.  Then it raises sig; 0 if it lived on, 77 where another party's
 * handler has the signal (handled_by_another). */
static int raise_main(int sig)
{
	struct rlimit no_core = { 0, 0 };

	(void)setrlimit(RLIMIT_CORE, &no_core);
	if (handled_by_another(sig))
		return 77;
	if (getenv("FEP_TEST_RAISE_COMM")) {
		fabep_comm_attr_t attr;
		fabep_comm_t *comm = NULL;

		fabep_comm_attr_init(&attr);
		attr.allgather = copy_allgather;  /* a world of one */
		attr.rank = 0;
		attr.nranks = 1;
		attr.threads = 1;
		attr.provider = "shm";
		if (fabep_comm_create(&attr, &comm))
			return 3;
		/* shm's own handler, if any, removes its files and ends the
		 * process by the signal, with the handler it found */
		raise(sig);
		fabep_comm_destroy(comm);
		return 0;
	}
	raise(sig);
	return 0;
}

/* This program run again with FEP_TEST_RAISE=sig: how it ended, as
 * "signal N" or "exit N". */
static void raise_in_child(int sig, int comm, char *how, size_t len)
{
	int st = 0;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (!pid) {
		char v[16];

		snprintf(v, sizeof(v), "%d", sig);
		setenv("FEP_TEST_RAISE", v, 1);
		if (comm)
			setenv("FEP_TEST_RAISE_COMM", "1", 1);
		execl("/proc/self/exe", "test_faults", (char *)NULL);
		_exit(126);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	if (comm)  /* what the killed communicator left in /dev/shm */
		(void)fabep_shm_cleanup(pid);
	if (WIFSIGNALED(st))
		snprintf(how, len, "signal %d", WTERMSIG(st));
	else
		snprintf(how, len, "exit %d", WEXITSTATUS(st));
}

/* libfabric's psm provider (Debian's, Ubuntu's) loads libinfinipath,
 * whose handler for SIGINT, SIGTERM, SIGABRT, ... calls exit(1).
 * Linked with libfabep, a process still ends by the signal it got, as
 * it would without: when libfabep loads, and after a communicator's
 * fabric is open. */
START_TEST(psm_signals)
{
	static const int sigs[] = { SIGINT, SIGTERM, SIGABRT, SIGSEGV };
	size_t i;
	int comm, tried = 0;

	if (!lib_mapped("libinfinipath.so"))
		fep_test_skip("libinfinipath (libfabric's psm provider) is not "
			      "loaded here: no handlers of its own to undo");
	fep_test_need_provider("shm");
	for (comm = 0; comm < 2; comm++)
		for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
			char how[32], want[32];

			raise_in_child(sigs[i], comm, how, sizeof(how));
			if (!strcmp(how, "exit 77"))
				continue;  /* a sanitizer's, say */
			tried++;
			snprintf(want, sizeof(want), "signal %d", sigs[i]);
			ck_assert_msg(!strcmp(how, want), "%s raised %s ended the "
				      "process with %s, not by the signal",
				      strsignal(sigs[i]), comm ? "with a "
				      "communicator" : "at start", how);
		}
	if (!tried)
		fep_test_skip("every signal tried has a handler of another "
			      "party here");
}
END_TEST

/* FEP_FAULTS_ONLY=substring runs only the tests whose names contain it. */
#define ADD(tc, t)                                                     \
	do {                                                           \
		const char *only_ = getenv("FEP_FAULTS_ONLY");         \
		if (!only_ || strstr(#t, only_))                       \
			tcase_add_test(tc, t);                       \
	} while (0)

static Suite *suite(void)
{
	Suite *s = suite_create("faults");
	TCase *tc;

	tc = tcase_create("matrix");
	tcase_set_timeout(tc, 90);
	ADD(tc, shm_kill_before_dispatch);
	ADD(tc, shm_kill_during_dispatch);
	ADD(tc, shm_kill_after_dispatch);
	ADD(tc, shm_stop_dispatch);
	ADD(tc, shm_kill_packing_dispatch);
	ADD(tc, shm_kill_before_combine);
	ADD(tc, shm_kill_during_combine);
	ADD(tc, shm_kill_after_combine);
	ADD(tc, shm_stop_combine);
	ADD(tc, shm_kill_before_ar);
	ADD(tc, shm_kill_during_ar);
	ADD(tc, shm_kill_after_ar);
	ADD(tc, shm_stop_ar);
	ADD(tc, tcp_kill_before_dispatch);
	ADD(tc, tcp_kill_during_dispatch);
	ADD(tc, tcp_kill_after_dispatch);
	ADD(tc, tcp_stop_dispatch);
	ADD(tc, tcp_kill_packing_dispatch);
	ADD(tc, tcp_kill_before_combine);
	ADD(tc, tcp_kill_during_combine);
	ADD(tc, tcp_kill_after_combine);
	ADD(tc, tcp_stop_combine);
	ADD(tc, tcp_kill_before_ar);
	ADD(tc, tcp_kill_during_ar);
	ADD(tc, tcp_kill_after_ar);
	ADD(tc, tcp_stop_ar);
	ADD(tc, sockets_kill_before_dispatch);
	ADD(tc, sockets_kill_during_dispatch);
	ADD(tc, sockets_kill_after_dispatch);
	ADD(tc, sockets_kill_during_combine);
	ADD(tc, sockets_kill_before_ar);
	ADD(tc, chan_kill_during_dispatch);
	ADD(tc, chan_kill_during_combine);
	ADD(tc, chan_kill_during_ar);
	ADD(tc, chan_stop_ar);
	ADD(tc, lanes_kill_during_dispatch);
	ADD(tc, lanes_kill_during_combine);
	ADD(tc, lanes_stop_dispatch);
	ADD(tc, pending_stop_dispatch);
	ADD(tc, pending_stop_combine);
	ADD(tc, pending_stop_ar);
	suite_add_tcase(s, tc);

	tc = tcase_create("rendezvous");
	tcase_set_timeout(tc, 40);
	ADD(tc, rdv_nothing);
	ADD(tc, rdv_silent);
	ADD(tc, rdv_garbage);
	ADD(tc, rdv_close);
	suite_add_tcase(s, tc);

	tc = tcase_create("arguments");
	tcase_set_timeout(tc, 90);
	ADD(tc, psm_signals);
	ADD(tc, args_shm);
	ADD(tc, args_tcp);
	ADD(tc, abi_shm);
	ADD(tc, destroy_late);
	if (!getenv("FEP_FAULTS_ONLY") || strstr("rendezvous_limit",
						 getenv("FEP_FAULTS_ONLY")))
		tcase_add_loop_test(tc, rendezvous_limit, RDV_ATTR, RDV_DEFAULT + 1);
	ADD(tc, poll_lost_shm);
	ADD(tc, poll_lost_tcp);
	ADD(tc, handles_with_comm);
	ADD(tc, forked_shm);
	ADD(tc, forked_tcp);
	ADD(tc, refused_config);
	ADD(tc, refused_alone);
	ADD(tc, heap_rounded);
	ADD(tc, wait_timeout);
	ADD(tc, barrier_retry);
	ADD(tc, provider_domain_per_rank);
	ADD(tc, last_error);
	ADD(tc, log_quiet);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *raise_sig = getenv("FEP_TEST_RAISE");

	if (raise_sig)  /* psm_signals' fresh process */
		return raise_main(atoi(raise_sig));
	return fep_test_run_suite(suite());
}
