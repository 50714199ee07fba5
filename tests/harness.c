/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * harness.c - multi-rank tests: ranks are forked children that bootstrap
 * through the TCP rendezvous on 127.0.0.1; a run that outlives its time
 * is killed and the ranks still running are named.
 *
 * Rank bodies must report failure by returning nonzero (after printing
 * why), not with ck_assert: they run in grandchildren of Check's runner.
 * A rank's stderr goes through a pipe that the parent copies to its own
 * as it comes, keeping the rank's last line for the tests' failure
 * messages (fep_test_rank_said): the TAP output, which is all that some
 * logs keep, then says why a rank failed.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include "core/comm.h"
#include "fabric/fabric.h"
#include "harness.h"

/* Sanitizer builds (configure --enable-sanitizers): ranks end with _exit,
 * which skips LeakSanitizer's check at exit, so they run it themselves. */
#if defined(__SANITIZE_ADDRESS__)
#define HARNESS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HARNESS_LSAN 1
#endif
#endif
/* ThreadSanitizer builds, with GCC or Clang (as FEP_TSAN in fabric.h) */
#if defined(__SANITIZE_THREAD__)
#define HARNESS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HARNESS_TSAN 1
#endif
#endif
#ifdef HARNESS_LSAN
#include <sanitizer/lsan_interface.h>

/* The harness's own bookkeeping, inherited from the parent at fork, is
 * not a rank's leak. */
const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"), used))
const char *__lsan_default_suppressions(void)
{
	return "leak:harness_run\n";
}

/* libfabric 1.17's net provider leaks the fi_info it duplicates for
 * each peer it connects (fi_dupinfo, a few hundred bytes a peer, left
 * after every close; none on tcp, udp, sockets or shm under the same
 * calls): on it a rank's leaks are not checked. */
static int harness_leaks_checked(void)
{
	const char *p = getenv("FABEP_PROVIDER");

	return !p || strcmp(p, "net");
}
#endif

int fep_test_have_thp(void)
{
	return access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0;
}

int fep_test_smaps_hg(const void *p)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	uintptr_t a = (uintptr_t)p;
	int in = 0, ret = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char sp;

		if (sscanf(line, "%lx-%lx%c", &lo, &hi, &sp) == 3 && sp == ' ') {
			in = lo <= a && a < hi;
			continue;
		}
		if (in && !strncmp(line, "VmFlags:", 8)) {
			ret = strstr(line, " hg") != NULL;
			break;
		}
	}
	fclose(f);
	return ret;
}

int fep_test_leak_check(void)
{
#ifdef HARNESS_LSAN
	return harness_leaks_checked() && __lsan_do_recoverable_leak_check();
#else
	return 0;
#endif
}

static uint64_t harness_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void harness_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* Whether 127.0.0.1:port can be bound now (0: yes). */
static int port_bindable(int port, int *bound)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	int fd, one = 1, ret = -1;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons((uint16_t)port);
	if (!bind(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
	    !getsockname(fd, (struct sockaddr *)&sa, &sl)) {
		*bound = ntohs(sa.sin_port);
		ret = 0;
	}
	close(fd);
	return ret;
}

int fep_test_free_port(void)
{
	static uint64_t seed;
	int lo = 32768, hi = 60999, port, bound, i;
	FILE *f;

	/* Prefer a port below the ephemeral range: there no outgoing
	 * connection can take it between now and the root's bind, and a
	 * rank connecting before the root listens cannot connect to itself. */
	f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2)
			lo = 32768;
		fclose(f);
	}
	if (!seed)
		seed = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^
		       (uint64_t)harness_now_ms() ^ 1;
	if (lo > 20000) {
		for (i = 0; i < 64; i++) {
			port = 10000 + (int)(fep_test_rand(&seed) %
					     (uint64_t)(lo - 10000));
			if (!port_bindable(port, &bound))
				return port;
		}
	}
	if (!port_bindable(0, &bound))
		return bound;
	fprintf(stderr, "harness: no free TCP port on 127.0.0.1\n");
	return -1;
}

/* A rank's stderr as the parent reads it: the line being read, and the
 * last complete one that was not the harness's own. */
struct harness_out {
	int fd;        /* the pipe's read end; -1 once closed */
	size_t len;
	char line[512];
};

#define HARNESS_SAID_RANKS 64
static char harness_said[HARNESS_SAID_RANKS][256];

/* Copy what rank r has written to stderr so far to this process's stderr;
 * keep its last line.  At end of file, close the pipe. */
static void harness_drain(struct harness_out *o, int r)
{
	char buf[4096];
	ssize_t n, i, off;

	while (o->fd >= 0) {
		n = read(o->fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0 || errno != EAGAIN) {
				close(o->fd);
				o->fd = -1;
			}
			return;
		}
		for (off = 0; off < n;) {
			ssize_t w = write(STDERR_FILENO, buf + off, (size_t)(n - off));

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				break;  /* nowhere to copy it: keep the line only */
			off += w;
		}
		for (i = 0; i < n; i++) {
			if (buf[i] != '\n') {
				if (o->len < sizeof(o->line) - 1)
					o->line[o->len++] = buf[i];
				continue;
			}
			o->line[o->len] = '\0';
			if (o->len && strncmp(o->line, "harness:", 8) &&
			    r < HARNESS_SAID_RANKS) {
				size_t k = FEP_MIN(o->len, sizeof(harness_said[r]) - 1);

				memcpy(harness_said[r], o->line, k);
				harness_said[r][k] = '\0';
			}
			o->len = 0;
		}
	}
}

const char *fep_test_rank_said(int rank)
{
	if (rank < 0 || rank >= HARNESS_SAID_RANKS)
		return "";
	return harness_said[rank];
}

static void harness_child(int rank, int size, int port, fep_test_rank_fn fn,
			  void *arg, pid_t parent, struct harness_out *outs,
			  int err_fd)
{
	char buf[32];
	int rc, r;

	/* Die with the test process (Check kills it on its timeout). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		fep_test_exit(127);
	/* stderr into this rank's pipe; the other ranks' read ends (and
	 * this one's) are the parent's */
	fflush(stderr);
	if (err_fd >= 0) {
		dup2(err_fd, STDERR_FILENO);
		close(err_fd);
	}
	for (r = 0; r <= rank; r++)
		if (outs[r].fd >= 0)
			close(outs[r].fd);
	free(outs);  /* the parent's */
	snprintf(buf, sizeof(buf), "%d", rank);
	setenv("FABEP_RANK", buf, 1);
	snprintf(buf, sizeof(buf), "%d", size);
	setenv("FABEP_WORLD_SIZE", buf, 1);
	snprintf(buf, sizeof(buf), "127.0.0.1:%d", port);
	setenv("FABEP_ROOT", buf, 1);

	rc = fn(rank, size, arg);
	if (rc) {
		fprintf(stderr, "harness: rank %d of %d returned %d\n", rank,
			size, rc);
		rc = rc < 0 ? (rc < -255 ? 255 : -rc) : (rc > 255 ? 255 : rc);
	}
#ifdef HARNESS_LSAN
	if (harness_leaks_checked() && __lsan_do_recoverable_leak_check() &&
	    !rc) {
		fprintf(stderr, "harness: rank %d of %d leaked memory\n", rank,
			size);
		rc = 1;
	}
#endif
	fflush(stdout);
	fflush(stderr);
	fep_test_exit(rc);
}

/* Fork and reap; returns 0, or -1 when the run had to be killed or could
 * not be started. */
static int harness_run(int size, int timeout_s, fep_test_rank_fn fn,
		       void *arg, int *status)
{
	pid_t *pids;
	pid_t parent = getpid();
	struct harness_out *outs;
	uint64_t deadline;
	int port, r, left, ret = 0, st, pfd[2];

	if (size < 1 || !fn || !status) {
		fprintf(stderr, "harness: bad arguments (size %d)\n", size);
		return -1;
	}
	port = fep_test_free_port();
	if (port < 0)
		return -1;
	pids = calloc((size_t)size, sizeof(*pids));
	outs = calloc((size_t)size, sizeof(*outs));
	if (!pids || !outs) {
		fprintf(stderr, "harness: out of memory\n");
		free(pids);
		free(outs);
		return -1;
	}
	for (r = 0; r < size; r++) {
		outs[r].fd = -1;
		if (r < HARNESS_SAID_RANKS)
			harness_said[r][0] = '\0';
	}
	fflush(stdout);
	fflush(stderr);
	for (r = 0; r < size; r++) {
		status[r] = -1;
		/* without a pipe the rank writes to stderr directly */
		if (pipe2(pfd, O_CLOEXEC))
			pfd[0] = pfd[1] = -1;
		pids[r] = fork();
		if (pids[r] < 0) {
			fprintf(stderr, "harness: fork of rank %d: %s\n", r,
				strerror(errno));
			if (pfd[0] >= 0) {
				close(pfd[0]);
				close(pfd[1]);
			}
			ret = -1;
			size = r; /* reap what was started */
			for (r = 0; r < size; r++)
				kill(pids[r], SIGKILL);
			break;
		}
		outs[r].fd = pfd[0];
		if (pids[r] == 0) {
			free(pids); /* the parent's: not the rank's to leak */
			harness_child(r, size, port, fn, arg, parent, outs, pfd[1]);
		}
		if (pfd[1] >= 0) {
			close(pfd[1]);
			fcntl(pfd[0], F_SETFL, fcntl(pfd[0], F_GETFL) | O_NONBLOCK);
		}
	}

	deadline = harness_now_ms() + (uint64_t)timeout_s * 1000;
	left = size;
	while (left) {
		for (r = 0; r < size; r++)
			harness_drain(&outs[r], r);
		for (r = 0; r < size; r++) {
			pid_t p;

			if (!pids[r])
				continue;
			p = waitpid(pids[r], &st, WNOHANG);
			if (p == 0)
				continue;
			if (p < 0 && errno == EINTR)
				continue;
			if (p < 0)
				status[r] = 255;
			else if (WIFEXITED(st))
				status[r] = WEXITSTATUS(st);
			else if (WIFSIGNALED(st))
				status[r] = 128 + WTERMSIG(st);
			else
				continue;
			/* killed, or gone without destroying its
			 * communicator: its shm regions stay behind */
			if (p > 0)
				fep_shm_remove_regions(p);
			pids[r] = 0;
			left--;
		}
		if (!left)
			break;
		if (harness_now_ms() >= deadline) {
			char list[256];
			size_t off = 0;

			list[0] = '\0';
			for (r = 0; r < size; r++) {
				if (!pids[r])
					continue;
				kill(pids[r], SIGKILL);
				if (off < sizeof(list) - 12)
					off += (size_t)snprintf(list + off,
						sizeof(list) - off, "%s%d",
						off ? ", " : "", r);
			}
			fprintf(stderr, "harness: timeout after %d s: rank%s %s "
				"still running, killed\n", timeout_s,
				left > 1 ? "s" : "", list);
			for (r = 0; r < size; r++) {
				if (!pids[r])
					continue;
				while (waitpid(pids[r], &st, 0) < 0 &&
				       errno == EINTR)
					;
				status[r] = 128 + SIGKILL;
				fep_shm_remove_regions(pids[r]);
				pids[r] = 0;
			}
			ret = -1;
			break;
		}
		harness_sleep_ms(2);
	}
	/* what the ranks wrote last; a pipe that something a rank started
	 * still holds open is closed unread */
	for (r = 0; r < size; r++) {
		harness_drain(&outs[r], r);
		if (outs[r].fd >= 0)
			close(outs[r].fd);
	}
	free(outs);
	free(pids);
	return ret;
}

int fep_test_run_ranks_status(int size, int timeout_s, fep_test_rank_fn fn,
			      void *arg, int *status)
{
	return harness_run(size, timeout_s, fn, arg, status);
}

/* The last judged run's failed ranks, for fep_test_ranks_failed. */
static char harness_failed[1024];

const char *fep_test_ranks_failed(void)
{
	return harness_failed;
}

int fep_test_run_ranks(int size, int timeout_s, fep_test_rank_fn fn, void *arg)
{
	int *status, r, ret;
	size_t off = 0;

	harness_failed[0] = '\0';
	status = calloc((size_t)(size > 0 ? size : 1), sizeof(*status));
	if (!status) {
		fprintf(stderr, "harness: out of memory\n");
		snprintf(harness_failed, sizeof(harness_failed), "out of memory");
		return -1;
	}
	ret = harness_run(size, timeout_s, fn, arg, status);
	for (r = 0; r < size; r++) {
		char why[64];

		if (status[r] == 0)
			continue;
		if (status[r] > 128)
			snprintf(why, sizeof(why), "died of signal %d", status[r] - 128);
		else
			snprintf(why, sizeof(why), "exited with %d", status[r]);
		fprintf(stderr, "harness: rank %d of %d %s\n", r, size, why);
		if (off < sizeof(harness_failed))
			off += (size_t)snprintf(harness_failed + off,
						sizeof(harness_failed) - off,
						"%srank %d of %d %s%s%s", off ? "; " : "",
						r, size, why,
						*fep_test_rank_said(r) ? ": " : "",
						fep_test_rank_said(r));
		ret = -1;
	}
	if (ret && !harness_failed[0])
		snprintf(harness_failed, sizeof(harness_failed),
			 "the ranks could not be started (see the log)");
	free(status);
	return ret;
}

/* ---- providers ---- */

static int probe_one(const char *name, char *why, size_t whylen)
{
	struct fi_info *hints, *info = NULL;
	int ret;

	hints = fi_allocinfo();
	if (!hints) {
		snprintf(why, whylen, "fi_allocinfo failed");
		return -1;
	}
	hints->caps = FI_RMA;
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR |
				      FI_MR_ALLOCATED | FI_MR_PROV_KEY |
				      FI_MR_ENDPOINT;
	hints->fabric_attr->prov_name = strdup(name);
	ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	if (ret)
		snprintf(why, whylen, "fi_getinfo(prov_name \"%s\", FI_RMA, "
			 "FI_EP_RDM): %s", name, fi_strerror(-ret));
	else
		fi_freeinfo(info);
	fi_freeinfo(hints);
	return ret ? -1 : 0;
}

void fep_test_emulate(int rank, int mr_local, int own_key, size_t msg_max,
		      size_t iov_max)
{
	if (mr_local)
		fep_fab_test_mr_mode = FI_MR_LOCAL;
	if (own_key)
		fep_fab_test_key_salt = ((uint64_t)rank + 1) << 20;
	if (msg_max)
		fep_fab_test_msg_max = msg_max;
	if (iov_max)
		fep_fab_test_iov_max = iov_max;
}

void fep_test_cq4(void)
{
	fep_fab_test_cq_data_max = 4;
}

int fep_test_cq4_filler(fabep_comm_t *comm, int rank)
{
	fabep_off_t filler;
	int ret = fabep_heap_alloc(comm, FEP_TEST_CQ4_FILLER, 64, &filler);

	if (ret || comm->fab->cq_data_size != 4) {
		fprintf(stderr, "rank %d: filler: %s; %zu bytes of CQ data\n",
			rank, fabep_strerror(ret), comm->fab->cq_data_size);
		return 1;
	}
	return 0;
}

int fep_test_threads(int dflt)
{
	long v;

	/* a bad value is logged (and dflt taken) */
	return fep_env_long("FEP_TEST_THREADS", 1, 64, &v) > 0 ? (int)v : dflt;
}

/* Whether prov is here; why: the reason when not (cached per provider). */
static int provider_probe(const char *prov, const char **whyp)
{
	static char seen[16][32], seen_why[16][512];
	static int seen_ok[16], nseen;
	char why[512] = "";
	int pfd[2], st, i, ok = 0;
	ssize_t n;
	pid_t pid;
	uint64_t deadline;

	*whyp = "no provider named";
	if (!prov || !*prov)
		return 0;
	for (i = 0; i < nseen; i++)
		if (!strcmp(seen[i], prov)) {
			*whyp = seen_why[i];
			return seen_ok[i];
		}

	if (pipe(pfd)) {
		fprintf(stderr, "SKIP: provider %s: pipe: %s\n", prov,
			strerror(errno));
		return 0;
	}
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "SKIP: provider %s: fork: %s\n", prov,
			strerror(errno));
		close(pfd[0]);
		close(pfd[1]);
		return 0;
	}
	if (pid == 0) {
		close(pfd[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (!probe_one(prov, why, sizeof(why)))
			fep_test_exit(0);
		/* The library maps "tcp" to tcp;ofi_rxm where tcp alone
		 * has no RDM endpoints. */
		if (!strcmp(prov, "tcp")) {
			size_t l = strlen(why);

			snprintf(why + l, sizeof(why) - l, "; ");
			l = strlen(why);
			if (!probe_one("tcp;ofi_rxm", why + l, sizeof(why) - l))
				fep_test_exit(0);
		}
		if (write(pfd[1], why, strlen(why)) < 0)
			fep_test_exit(2);
		fep_test_exit(1);
	}
	close(pfd[1]);
	deadline = harness_now_ms() + 20000;
	for (;;) {
		pid_t p = waitpid(pid, &st, WNOHANG);

		if (p == pid)
			break;
		if (harness_now_ms() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			snprintf(why, sizeof(why), "fi_getinfo did not return "
				 "within 20 s");
			break;
		}
		harness_sleep_ms(5);
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		ok = 1;
	} else if (!why[0]) {
		n = read(pfd[0], why, sizeof(why) - 1);
		why[n > 0 ? n : 0] = '\0';
		if (!why[0])
			snprintf(why, sizeof(why), "probe exited with status "
				 "0x%x", st);
	}
	close(pfd[0]);
	if (nseen < 16) {
		snprintf(seen[nseen], sizeof(seen[nseen]), "%s", prov);
		snprintf(seen_why[nseen], sizeof(seen_why[nseen]), "%s", why);
		*whyp = seen_why[nseen];
		seen_ok[nseen++] = ok;
	} else {
		*whyp = "probe table full";
	}
	return ok;
}

int fep_test_have_provider(const char *prov)
{
	const char *why;
	int ok = provider_probe(prov, &why);

	if (!ok)
		fprintf(stderr, "SKIP: libfabric provider %s with FI_RMA and "
			"FI_EP_RDM is not available here (%s)\n", prov, why);
	return ok;
}

void fep_test_need_provider(const char *prov)
{
	const char *why;

	if (!provider_probe(prov, &why))
		fep_test_skip("libfabric provider %s with FI_RMA and FI_EP_RDM "
			      "is not available here (%s)", prov, why);
}

/* ---- signal strategies ---- */

const char *const fep_test_providers[FEP_TEST_NPROVIDERS] = {
	"shm", "tcp", "sockets", "udp", "net",
};

int fep_test_signal_list(fabep_signal_t *out, int max)
{
	int s, n = 0;

	for (s = 1; s < FEP_TEST_MAX_SIGNALS && n < max; s++) {
		fabep_signal_t back;

		if (!fabep_signal_parse(fabep_signal_name((fabep_signal_t)s),
					&back) && back == (fabep_signal_t)s)
			out[n++] = (fabep_signal_t)s;
	}
	return n;
}

int fep_test_signals(const char *prov, unsigned *mask)
{
	static char seen[16][32];
	static unsigned seen_mask[16];
	static int nseen;
	int pfd[2], st, i, ok;
	pid_t pid;

	*mask = 0;
	for (i = 0; i < nseen; i++)
		if (!strcmp(seen[i], prov)) {
			*mask = seen_mask[i];
			return 0;
		}
	if (pipe(pfd))
		return -1;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return -1;
	}
	if (pid == 0) {
		fabep_provider_desc_t d[32];
		int n = 0, k;
		unsigned m = ~0u;

		close(pfd[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		d[0].size = sizeof(d[0]);
		if (fabep_provider_list(prov, d, 32, &n))
			fep_test_exit(2);  /* logged */
		if (n <= 0)
			m = 0;
		for (k = 0; k < n; k++)
			m &= d[k].signals;
		fep_test_exit(write(pfd[1], &m, sizeof(m)) == sizeof(m) ? 0 : 1);
	}
	close(pfd[1]);
	ok = read(pfd[0], mask, sizeof(*mask)) == sizeof(*mask);
	close(pfd[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!ok || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "harness: fabep_provider_list(\"%s\") failed in "
			"the probe (status 0x%x)\n", prov, st);
		*mask = 0;
		return -1;
	}
	if (nseen < 16) {
		snprintf(seen[nseen], sizeof(seen[nseen]), "%s", prov);
		seen_mask[nseen++] = *mask;
	}
	return 0;
}

void fep_test_add_signal_cases(TCase *tc, const TTest *t)
{
	/* static: the runner keeps pointers to them until the end */
	static TTest cases[4][FEP_TEST_NPROVIDERS * FEP_TEST_MAX_SIGNALS];
	static char names[4][FEP_TEST_NPROVIDERS * FEP_TEST_MAX_SIGNALS][64];
	static int ncalls;
	fabep_signal_t sig[FEP_TEST_MAX_SIGNALS];
	int n = fep_test_signal_list(sig, FEP_TEST_MAX_SIGNALS), i;

	if (ncalls >= 4) {  /* building the suite: no Check assertion here */
		fprintf(stderr, "harness: fep_test_add_signal_cases: more than "
			"4 tests\n");
		exit(1);
	}
	for (i = 0; i < FEP_TEST_NPROVIDERS * n; i++) {
		TTest *c = &cases[ncalls][i];

		snprintf(names[ncalls][i], sizeof(names[ncalls][i]), "%s_%s_%s",
			 t->name, fep_test_providers[i / n],
			 fabep_signal_name(sig[i % n]));
		*c = *t;
		c->name = names[ncalls][i];
		tcase_add_loop_test(tc, c, i, i + 1);
	}
	ncalls++;
}

const char *fep_test_signal_case(int i, fabep_signal_t *sig)
{
	fabep_signal_t all[FEP_TEST_MAX_SIGNALS];
	int n = fep_test_signal_list(all, FEP_TEST_MAX_SIGNALS);
	const char *prov;

	ck_assert_msg(n > 0 && i >= 0 && i < FEP_TEST_NPROVIDERS * n,
		      "signal case %d of %d", i, FEP_TEST_NPROVIDERS * n);
	prov = fep_test_providers[i / n];
	*sig = all[i % n];
	fep_test_use_signal(prov, *sig);
	return prov;
}

void fep_test_use_signal(const char *prov, fabep_signal_t sig)
{
	unsigned mask;

	fep_test_need_provider(prov);
	ck_assert_msg(!fep_test_signals(prov, &mask), "probing the strategies "
		      "of %s failed", prov);
	if (!(mask & (1u << sig)))
		fep_test_skip("fabep offers no signal strategy %s with provider %s "
			      "here", fabep_signal_name(sig), prov);
#ifdef HARNESS_TSAN
	/* The library tells ThreadSanitizer that a counter read orders what
	 * libfabric's progress wrote before it (FEP_TSAN_OBSERVE); that
	 * progress runs in the ranks' own calls, except on sockets, whose
	 * progress thread copies the data and applies the add: with every
	 * strategy but cqdata (whose add is fabep's own, after it reaped
	 * the completion) no order the tool can see links that thread's
	 * copy to the readers. */
	if (sig != FABEP_SIGNAL_CQDATA && !strcmp(prov, "sockets"))
		fep_test_skip("ThreadSanitizer cannot see the ordering of %s on "
			      "sockets: its progress thread applies the add",
			      fabep_signal_name(sig));
#endif
	fep_test_use_provider(prov);
	setenv("FABEP_SIGNAL", fabep_signal_name(sig), 1);
}

void fep_test_use_provider(const char *prov)
{
	setenv("FABEP_PROVIDER", prov, 1);
	if (!strcmp(prov, "sockets"))
		setenv("FI_SOCKETS_PE_WAITTIME", "0", 1);
}

void fep_test_on_provider(const char *prov)
{
	fep_test_need_provider(prov);
	fep_test_use_provider(prov);
}

/* One line of Check's TAP log ("[not ]ok N - <file>:<tcase>:<test>:
 * <message>"), rewritten: a pass as "ok N - <tcase>:<test>", a case that
 * ended with fep_test_skip (a failure to Check) as "ok N - <tcase>:<test>
 * # SKIP <reason>", a failure with Check's message.  Counts them. */
static void tap_line(char *line, int *pass, int *fail, int *skip)
{
	char *mark = strstr(line, FEP_TEST_SKIP_MARK), *desc, *end;
	int num, ok = sscanf(line, "ok %d - ", &num) == 1;

	if (!ok && sscanf(line, "not ok %d - ", &num) != 1) {
		fputs(line, stdout);   /* the plan, or anything else */
		return;
	}
	desc = strstr(line, " - ") + 3;
	end = strchr(desc, ':');
	if (end)
		desc = end + 1;   /* the file is in the log's name */
	if (!ok && !mark) {
		printf("not ok %d - %s", num, desc);
		(*fail)++;
		return;
	}
	/* the name ends at the second ':' */
	end = strchr(desc, ':');
	end = end ? strchr(end + 1, ':') : NULL;
	if (!end)
		end = desc + strcspn(desc, "\n");
	if (ok) {
		printf("ok %d - %.*s\n", num, (int)(end - desc), desc);
		(*pass)++;
	} else {
		printf("ok %d - %.*s # SKIP %s", num, (int)(end - desc), desc,
		       mark + strlen(FEP_TEST_SKIP_MARK));
		(*skip)++;
	}
}

int fep_test_run_suite(Suite *s)
{
	char path[] = "/tmp/fep_tap_XXXXXX", line[4096];
	int fd, pass = 0, fail = 0, skip = 0, failed;
	SRunner *sr = srunner_create(s);
	FILE *f;

	fd = mkstemp(path);
	if (fd < 0) {
		/* no TAP log: Check's own report, and its status */
		fprintf(stderr, "harness: mkstemp: %s\n", strerror(errno));
		srunner_run_all(sr, CK_NORMAL);
		failed = srunner_ntests_failed(sr);
		srunner_free(sr);
		return failed ? 1 : 0;
	}
	close(fd);
	srunner_set_tap(sr, path);
	srunner_run_all(sr, CK_SILENT);
	srunner_free(sr);
	f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "harness: %s: %s\n", path, strerror(errno));
		unlink(path);
		printf("Bail out! no TAP log from Check\n");
		return 1;
	}
	while (fgets(line, sizeof(line), f))
		tap_line(line, &pass, &fail, &skip);
	fclose(f);
	unlink(path);
	printf("# Checks: %d, Failures: %d, Skipped: %d\n", pass + fail + skip,
	       fail, skip);
	fflush(stdout);
	return fail ? 1 : 0;
}
