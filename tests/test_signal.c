/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_signal.c - the communicator and put + signal, with forked ranks on
 * shm, tcp, sockets, udp (udp;ofi_rxd) and net (no atomics: cqdata
 * alone), for every signal strategy each provider supports.
 *
 * The stress test: senders write a fresh random payload into their slot of
 * the target's heap and signal; the target waits for the counter, then
 * checks that every slot holds exactly this round's payload (never a stale
 * one), and acknowledges with a signal back.  Payloads go from 1 byte to
 * several MiB; 1 to 3 senders write to one target at once.
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <pthread.h>
#include <stdatomic.h>

#include "fabep.h"
#include "harness.h"
#include "fabric/fabric.h"
#include "core/comm.h"

struct stress {
	fabep_signal_t signal;
	int rounds;
	const size_t *sizes;
	int nsizes;
	const char *channels;   /* FABEP_CHANNELS, NULL: unset */
	int threads;
	bool slices;            /* large puts must go in slices (cma_slices) */
};

static void fill(uint8_t *p, size_t n, int src, int round)
{
	uint64_t s = 0x9e3779b97f4a7c15ull ^ ((uint64_t)src << 32) ^ (uint64_t)round;
	size_t i = 0;

	fep_test_rand(&s);
	for (; i + 8 <= n; i += 8) {
		uint64_t v = fep_test_rand(&s);
		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)fep_test_rand(&s);
}

static int make_comm_chan(fabep_signal_t sig, size_t heap, const char *channels,
			  int threads, fabep_comm_t **comm)
{
	fabep_comm_attr_t a;

	if (channels)
		setenv("FABEP_CHANNELS", channels, 1);
	fabep_comm_attr_init(&a);
	a.signal = sig;
	a.heap_size = heap;
	a.threads = threads > 0 ? threads : 1;
	return fabep_comm_create(&a, comm);
}

static int make_comm(fabep_signal_t sig, size_t heap, fabep_comm_t **comm)
{
	return make_comm_chan(sig, heap, NULL, 1, comm);
}

#define BIG_ADD ((3ull << 24) + 5)

static int stress_rank(int rank, int size, void *arg)
{
	struct stress *st = arg;
	fabep_comm_t *comm;
	size_t maxlen = 0;
	fabep_off_t ctr, ack, big, slots, src;
	uint8_t *expect;
	int i, s, ret;

	for (i = 0; i < st->nsizes; i++)
		if (st->sizes[i] > maxlen)
			maxlen = st->sizes[i];
	ret = make_comm_chan(st->signal, (size_t)size * maxlen + (8u << 20),
			     st->channels, st->threads, &comm);
	if (ret == -FABEP_ERR_NO_SIGNAL)
		return 77; /* strategy not offered: the caller skips */
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	if (st->channels &&
	    fabep_comm_channels(comm) != (fabep_comm_signal(comm) == FABEP_SIGNAL_CQDATA ||
					  fabep_comm_signal(comm) == FABEP_SIGNAL_CMA ?
					  atoi(st->channels) : 1)) {
		fprintf(stderr, "rank %d: %d channels with FABEP_CHANNELS=%s, signal %s\n",
			rank, fabep_comm_channels(comm), st->channels,
			fabep_signal_name(fabep_comm_signal(comm)));
		return 1;
	}
	if ((ret = fabep_heap_alloc(comm, 8, 8, &ctr)) ||
	    (ret = fabep_heap_alloc(comm, 8, 8, &ack)) ||
	    (ret = fabep_heap_alloc(comm, 8, 8, &big)) ||
	    (ret = fabep_heap_alloc(comm, (size_t)size * maxlen, 64, &slots)) ||
	    (ret = fabep_heap_alloc(comm, maxlen, 64, &src))) {
		fprintf(stderr, "alloc: %s\n", fabep_strerror(ret));
		return 1;
	}
	/* an add that the channels would multiply past 64 bits: refused,
	 * nothing sent (the counter checks below would see it) */
	if (fabep_comm_channels(comm) > 1 &&
	    (ret = fabep_put_signal(comm, (rank + 1) % size, src, src, 0, ctr,
				    UINT64_MAX)) != -ERANGE) {
		fprintf(stderr, "rank %d: add past 64 bits gave %d\n", rank, ret);
		return 1;
	}
	/* an add past what one CQ data carries (24 bits, 8 with 4 bytes of
	 * CQ data) arrives whole from every rank, in as many writes as it
	 * takes: the counter reads exactly the sum */
	if (rank != 0)
		ret = fabep_put_signal(comm, 0, slots, src, 0, big, BIG_ADD);
	else if (!(ret = fabep_wait(comm, big, (uint64_t)(size - 1) * BIG_ADD)) &&
		 fabep_counter_read(comm, big) != (uint64_t)(size - 1) * BIG_ADD) {
		fprintf(stderr, "big add: counter %llu, want %llu\n",
			(unsigned long long)fabep_counter_read(comm, big),
			(unsigned long long)(size - 1) * BIG_ADD);
		return 1;
	}
	if (ret) {
		fprintf(stderr, "rank %d: big add: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	expect = malloc(maxlen ? maxlen : 1);
	for (i = 1; i <= st->rounds; i++) {
		size_t len = st->sizes[i % st->nsizes];

		if (rank != 0) {
			fill(fabep_heap_ptr(comm, src), len, rank, i);
			ret = fabep_put_signal(comm, 0, slots + (size_t)rank * maxlen,
					       src, len, ctr, 1);
			if (!ret)
				ret = fabep_wait(comm, ack, (uint64_t)i);
			if (ret) {
				fprintf(stderr, "rank %d round %d: %s\n", rank, i,
					fabep_strerror(ret));
				return 1;
			}
			continue;
		}
		ret = fabep_wait(comm, ctr, (uint64_t)i * (uint64_t)(size - 1));
		if (ret) {
			fprintf(stderr, "target round %d: %s\n", i, fabep_strerror(ret));
			return 1;
		}
		if (fabep_counter_read(comm, ctr) != (uint64_t)i * (uint64_t)(size - 1)) {
			fprintf(stderr, "counter overshot: %llu\n",
				(unsigned long long)fabep_counter_read(comm, ctr));
			return 1;
		}
		for (s = 1; s < size; s++) {
			fill(expect, len, s, i);
			if (memcmp(expect, (uint8_t *)fabep_heap_ptr(comm, slots) +
					   (size_t)s * maxlen, len)) {
				fprintf(stderr, "round %d: stale or wrong payload of %zu "
					"bytes from rank %d\n", i, len, s);
				return 1;
			}
		}
		for (s = 1; s < size; s++) {
			ret = fabep_put_signal(comm, s, ack, ack, 0, ack, 1);
			if (ret) {
				fprintf(stderr, "ack: %s\n", fabep_strerror(ret));
				return 1;
			}
		}
	}
	free(expect);
	/* cma with more channels than a target has senders, and a thread
	 * for each: the large puts went in slices over the channels */
	if (st->slices && rank != 0 && (!comm->fab->cma_slices ||
					!comm->fab->cma_sliced)) {
		fprintf(stderr, "rank %d: cma_slices %d, %llu puts sliced\n", rank,
			comm->fab->cma_slices,
			(unsigned long long)comm->fab->cma_sliced);
		return 1;
	}
	/* delivery: no atomic went before the completions of the writes to
	 * its peer were reaped (the providers here would not show it: shm
	 * and tcp carry a write and the next atomic through one queue) */
	if (comm->fab->sig_unreaped) {
		fprintf(stderr, "rank %d: %llu signals posted before their "
			"writes' completions were reaped\n", rank,
			(unsigned long long)comm->fab->sig_unreaped);
		return 1;
	}
	ret = fabep_barrier(comm);
	if (ret) {
		fprintf(stderr, "rank %d: final barrier: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	ret = fabep_comm_destroy(comm);
	return ret ? 1 : 0;
}

static const size_t small_sizes[] = { 1, 7, 8, 64, 100, 4096, 4097, 65536 + 3 };
static const size_t big_sizes[] = { 1, 1u << 20, (4u << 20) + 13, 3, 65536 };

static void run_stress_slices(const char *prov, fabep_signal_t sig, int size,
			      int small_rounds, int big_rounds,
			      const char *channels, int threads, bool slices)
{
	struct stress st = { .signal = sig, .channels = channels, .threads = threads };
	int status[8], r, ret;

	fep_test_on_provider(prov);
	st.sizes = small_sizes;
	st.nsizes = (int)(sizeof(small_sizes) / sizeof(small_sizes[0]));
	st.rounds = small_rounds;
	ret = fep_test_run_ranks_status(size, 120, stress_rank, &st, status);
	if (status[0] == 77)
		fep_test_skip("%s does not offer signal strategy %s", prov,
			      fabep_signal_name(sig));
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == 0, "%s/%s small: rank %d exited %d: %s",
			      prov, fabep_signal_name(sig), r, status[r],
			      fep_test_rank_said(r));
	(void)ret;
	st.sizes = big_sizes;
	st.nsizes = (int)(sizeof(big_sizes) / sizeof(big_sizes[0]));
	st.rounds = big_rounds;
	st.slices = slices;
	ret = fep_test_run_ranks_status(size, 120, stress_rank, &st, status);
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == 0, "%s/%s big: rank %d exited %d: %s",
			      prov, fabep_signal_name(sig), r, status[r],
			      fep_test_rank_said(r));
}

static void run_stress_chan(const char *prov, fabep_signal_t sig, int size,
			    int small_rounds, int big_rounds, const char *channels,
			    int threads)
{
	run_stress_slices(prov, sig, size, small_rounds, big_rounds, channels,
			  threads, false);
}

static void run_stress(const char *prov, fabep_signal_t sig, int size,
		       int small_rounds, int big_rounds)
{
	run_stress_chan(prov, sig, size, small_rounds, big_rounds, NULL, 1);
}

#define STRESS_TEST(name, prov, sig, n, small, big)        \
	START_TEST(name) { run_stress(prov, sig, n, small, big); } END_TEST
/* Channels: under cqdata puts of 128 KiB and more are split over them,
 * under cma every put of a rank and its signal go on the rank's own
 * channel; the counter must read exactly the sum of the adds (never
 * more, never early), with the waits' threads progressing the channels
 * side by side (threads 2) or the caller progressing all of them
 * (threads 1).  Asked for with another strategy, a warning and one
 * channel. */
#define CHAN_TEST(name, prov, sig, n, small, big, chans, threads)  \
	START_TEST(name) { run_stress_chan(prov, sig, n, small, big, chans, threads); } END_TEST

STRESS_TEST(shm_cqdata, "shm", FABEP_SIGNAL_CQDATA, 4, 3000, 40)
STRESS_TEST(shm_ordered, "shm", FABEP_SIGNAL_ORDERED, 3, 3000, 40)
STRESS_TEST(shm_delivery, "shm", FABEP_SIGNAL_DELIVERY, 2, 3000, 40)
STRESS_TEST(shm_fence, "shm", FABEP_SIGNAL_FENCE, 2, 1000, 10)
STRESS_TEST(shm_cma, "shm", FABEP_SIGNAL_CMA, 4, 3000, 40)
STRESS_TEST(tcp_cqdata, "tcp", FABEP_SIGNAL_CQDATA, 3, 2000, 20)
STRESS_TEST(tcp_delivery, "tcp", FABEP_SIGNAL_DELIVERY, 4, 1000, 20)
STRESS_TEST(tcp_ordered, "tcp", FABEP_SIGNAL_ORDERED, 2, 1000, 10)
STRESS_TEST(tcp_fence, "tcp", FABEP_SIGNAL_FENCE, 2, 1000, 10)
STRESS_TEST(sockets_fence, "sockets", FABEP_SIGNAL_FENCE, 2, 200, 4)
STRESS_TEST(sockets_ordered, "sockets", FABEP_SIGNAL_ORDERED, 3, 1000, 8)
STRESS_TEST(sockets_cqdata, "sockets", FABEP_SIGNAL_CQDATA, 2, 1000, 8)
STRESS_TEST(sockets_delivery, "sockets", FABEP_SIGNAL_DELIVERY, 2, 500, 8)
STRESS_TEST(udp_cqdata, "udp", FABEP_SIGNAL_CQDATA, 3, 1000, 8)
STRESS_TEST(udp_ordered, "udp", FABEP_SIGNAL_ORDERED, 3, 1000, 8)
STRESS_TEST(udp_delivery, "udp", FABEP_SIGNAL_DELIVERY, 3, 1000, 8)
STRESS_TEST(udp_fence, "udp", FABEP_SIGNAL_FENCE, 2, 500, 4)
/* net (1.17): no atomics at all, as efa-direct; cqdata alone */
STRESS_TEST(net_cqdata, "net", FABEP_SIGNAL_CQDATA, 3, 1000, 8)
CHAN_TEST(shm_chan4, "shm", FABEP_SIGNAL_AUTO, 3, 1000, 40, "4", 2)
CHAN_TEST(shm_chan3_one_thread, "shm", FABEP_SIGNAL_CQDATA, 2, 500, 30, "3", 1)
CHAN_TEST(shm_chan_ordered, "shm", FABEP_SIGNAL_ORDERED, 2, 200, 10, "4", 2)
CHAN_TEST(shm_cma_chan4, "shm", FABEP_SIGNAL_CMA, 4, 2000, 30, "4", 1)
CHAN_TEST(shm_cma_chan3_threads, "shm", FABEP_SIGNAL_CMA, 3, 1000, 20, "3", 2)
CHAN_TEST(tcp_chan2, "tcp", FABEP_SIGNAL_CQDATA, 3, 500, 10, "2", 2)
/* cma with 4 channels on 3 ranks of 4 threads: a target's 2 senders
 * would leave 2 of its channels idle, so the large puts go in slices,
 * one on every channel with its share of the signal as CQ data (the big
 * payloads are checked, and that slices were sent) */
START_TEST(shm_cma_slices)
{
	run_stress_slices("shm", FABEP_SIGNAL_CMA, 3, 300, 20, "4", 4, true);
}
END_TEST

/* ---- failures ---- */

static int killed_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm;
	int i, ret;

	ret = make_comm(FABEP_SIGNAL_AUTO, 1u << 20, &comm);
	if (ret)
		return 2;
	for (i = 0; i < 1000000; i++) {
		if (rank == size - 1 && i == 20)
			raise(SIGKILL);
		ret = fabep_barrier(comm);
		if (ret) {
			/* expected: the lost rank is named in the log */
			if (ret != -ETIMEDOUT && ret != -FABEP_ERR_PEER_LOST) {
				fprintf(stderr, "rank %d: unexpected %s\n", rank,
					fabep_strerror(ret));
				return 3;
			}
			fabep_comm_destroy(comm);
			return 10;
		}
	}
	return 4;
}

static void run_killed(const char *prov)
{
	int status[3], r;
	uint64_t t0, dt;
	struct timespec ts;

	fep_test_on_provider(prov);
	setenv("FABEP_TIMEOUT_MS", "2000", 1);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t0 = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	fep_test_run_ranks_status(3, 60, killed_rank, NULL, status);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	dt = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 - t0;
	unsetenv("FABEP_TIMEOUT_MS");
	ck_assert_msg(status[2] == 128 + SIGKILL, "killed rank status %d", status[2]);
	for (r = 0; r < 2; r++)
		ck_assert_msg(status[r] == 10, "%s: survivor %d exited %d: %s", prov,
			      r, status[r], fep_test_rank_said(r));
	/* create + 20 barriers + detection within the timeout + destroy (<= 5 s) */
	ck_assert_msg(dt < 20000, "detection took %llu ms", (unsigned long long)dt);
}

START_TEST(killed_shm) { run_killed("shm"); } END_TEST

/* A get from a rank that died fails with an error (no hang, no crash)
 * within the timeout, and the communicator can still be destroyed. */
static int get_killed_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm;
	fabep_off_t blk;
	int i, ret;

	(void)size;
	(void)arg;
	if (make_comm(FABEP_SIGNAL_AUTO, 1u << 20, &comm) ||
	    fabep_heap_alloc(comm, 65536, 64, &blk) || fabep_barrier(comm))
		return 2;
	if (rank == 1)
		raise(SIGKILL);
	usleep(300 * 1000);
	for (i = 0; i < 3; i++) {
		ret = fabep_get(comm, 1, blk, blk, 65536);
		if (!ret)
			ret = fabep_flush(comm);
		if (ret)
			break;
	}
	if (!ret) {
		fprintf(stderr, "rank 0: gets from a dead rank succeeded\n");
		return 3;
	}
	fprintf(stderr, "rank 0: get from the dead rank: %s\n", fabep_strerror(ret));
	fabep_comm_destroy(comm);
	return 10;
}

static void run_get_killed(const char *prov)
{
	int status[2];

	fep_test_on_provider(prov);
	setenv("FABEP_TIMEOUT_MS", "2000", 1);
	fep_test_run_ranks_status(2, 60, get_killed_rank, NULL, status);
	unsetenv("FABEP_TIMEOUT_MS");
	ck_assert_msg(status[1] == 128 + SIGKILL, "killed rank status %d", status[1]);
	ck_assert_msg(status[0] == 10, "%s: survivor exited %d: %s", prov,
		      status[0], fep_test_rank_said(0));
}

START_TEST(get_killed_shm) { run_get_killed("shm"); } END_TEST
START_TEST(get_killed_tcp) { run_get_killed("tcp"); } END_TEST
START_TEST(get_killed_udp) { run_get_killed("udp"); } END_TEST

/* The /dev/shm regions named after process pid. */
static int shm_regions(pid_t pid)
{
	char prefix[32];
	struct dirent *e;
	int n = 0;
	size_t len;
	DIR *d = opendir("/dev/shm");

	if (!d)
		return -1;
	len = (size_t)snprintf(prefix, sizeof(prefix), "%d:", (int)pid);
	while ((e = readdir(d)))
		n += !strncmp(e->d_name, prefix, len);
	closedir(d);
	return n;
}

/* A one-rank communicator's process, killed: its regions stay until
 * fabep_shm_cleanup removes them, which refuses a live process and a
 * pid that is none. */
static int cleanup_rank(int rank, int size, void *arg)
{
	int fds[2], before, after, got, again;
	pid_t child;
	char c = 0;

	(void)rank; (void)size; (void)arg;
	if (pipe(fds))
		return 1;
	child = fork();
	if (child < 0)
		return 1;
	if (child == 0) {
		fabep_comm_t *comm;

		close(fds[0]);
		if (make_comm(FABEP_SIGNAL_AUTO, 4u << 20, &comm))
			fep_test_exit(2);
		c = 1;
		if (write(fds[1], &c, 1) != 1)
			fep_test_exit(3);
		pause();
		fep_test_exit(0);
	}
	close(fds[1]);
	if (read(fds[0], &c, 1) != 1 || c != 1) {
		fprintf(stderr, "the child made no communicator\n");
		return 1;
	}
	close(fds[0]);
	got = fabep_shm_cleanup(child);
	if (got != -EBUSY) {
		fprintf(stderr, "cleanup of a live process: %d\n", got);
		return 1;
	}
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	before = shm_regions(child);
	got = fabep_shm_cleanup(child);
	after = shm_regions(child);
	again = fabep_shm_cleanup(child);
	if (before < 1 || got != before || after != 0 || again != 0) {
		fprintf(stderr, "regions %d, removed %d, left %d, again %d\n",
			before, got, after, again);
		return 1;
	}
	if (fabep_shm_cleanup(0) != -EINVAL || fabep_shm_cleanup(-3) != -EINVAL ||
	    fabep_shm_cleanup(getpid()) != -EBUSY) {
		fprintf(stderr, "bad pids accepted\n");
		return 1;
	}
	return 0;
}

FEP_TEST_RANKS_CASE(shm_cleanup, "shm", 1, 60, cleanup_rank, NULL)
START_TEST(killed_tcp) { run_killed("tcp"); } END_TEST
START_TEST(killed_udp) { run_killed("udp"); } END_TEST
START_TEST(killed_net) { run_killed("net"); } END_TEST

static int bad_env_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm = NULL;
	int expect = *(int *)arg;
	int ret = fabep_comm_create(NULL, &comm);

	if (ret != expect) {
		fprintf(stderr, "rank %d: got %d (%s), expected %d\n", rank, ret,
			fabep_strerror(ret), expect);
		if (!ret)
			fabep_comm_destroy(comm);
		return 1;
	}
	return 0;
}

START_TEST(bad_provider)
{
	int expect = -FABEP_ERR_NO_PROVIDER;

	setenv("FABEP_PROVIDER", "no-such-provider", 1);
	fep_test_ranks_ok(2, 30, bad_env_rank, &expect);
	unsetenv("FABEP_PROVIDER");
}
END_TEST

START_TEST(bad_signal)
{
	int expect = -EINVAL;

	setenv("FABEP_SIGNAL", "carrier-pigeon", 1);
	fep_test_ranks_ok(1, 30, bad_env_rank, &expect);
	unsetenv("FABEP_SIGNAL");
}
END_TEST

/* FABEP_NUMA_NODE=-1 is the attribute's -1: the default node, as unset */
static int numa_default_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm = NULL;
	int ret = fabep_comm_create(NULL, &comm), node;

	(void)size;
	(void)arg;
	if (ret) {
		fprintf(stderr, "rank %d: FABEP_NUMA_NODE=-1: %s\n", rank,
			fabep_strerror(ret));
		return 1;
	}
	node = fabep_comm_numa_node(comm);
	fabep_comm_destroy(comm);
	if (node < 0) {
		fprintf(stderr, "rank %d: FABEP_NUMA_NODE=-1 gave node %d\n", rank,
			node);
		return 2;
	}
	return 0;
}

START_TEST(numa_node_env)
{
	static const char *bad[] = { "-2", "4096", "near", "1x" };
	int expect = -EINVAL;
	size_t i;

	fep_test_on_provider("shm");
	setenv("FABEP_NUMA_NODE", "-1", 1);
	fep_test_ranks_ok(1, 30, numa_default_rank, NULL);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("FABEP_NUMA_NODE", bad[i], 1);
		ck_assert_msg(fep_test_run_ranks(1, 30, bad_env_rank, &expect) == 0,
			      "FABEP_NUMA_NODE=%s accepted: %s", bad[i],
			      fep_test_ranks_failed());
	}
	unsetenv("FABEP_NUMA_NODE");
}
END_TEST

/* Bind this rank to set (NULL: leave it), then create a communicator
 * from the environment; 0, or -1 with what failed on stderr. */
static int bound_comm(int rank, const cpu_set_t *set, fabep_comm_t **comm)
{
	int ret;

	if (set && sched_setaffinity(0, sizeof(*set), set)) {
		perror("sched_setaffinity");
		return -1;
	}
	ret = fabep_comm_create(NULL, comm);
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return -1;
	}
	return 0;
}

/* A rank's end: a barrier, then destroy; 1 where either failed or bad. */
static int end_comm(int rank, fabep_comm_t *comm, int bad)
{
	int ret = fabep_barrier(comm);

	if (ret) {
		fprintf(stderr, "rank %d: barrier: %s\n", rank, fabep_strerror(ret));
		bad = 1;
	}
	return fabep_comm_destroy(comm) || bad;
}

/* Who shares a rank's CPUs.  Each rank binds itself to its set of the
 * plan before it creates the communicator; then its waits must yield
 * from the start exactly where more ranks than CPUs may run on its
 * CPUs, and its pool must hold one thread per core of its own. */
#define CROWD_MAX 4
struct crowd_plan {
	int n;
	cpu_set_t set[CROWD_MAX];
	int over[CROWD_MAX];    /* oversubscribed expected: 0 or 1 */
	int threads[CROWD_MAX]; /* pool threads expected, or 0: any */
};

static int crowd_rank(int rank, int size, void *arg)
{
	const struct crowd_plan *pl = arg;
	fabep_comm_t *comm = NULL;
	int bad = 0, threads;

	(void)size;
	unsetenv("FABEP_THREADS");
	if (bound_comm(rank, &pl->set[rank], &comm))
		return 1;
	threads = fabep_comm_threads(comm);
	if (comm->fab->oversubscribed != (pl->over[rank] != 0)) {
		fprintf(stderr, "rank %d of %d (%d CPUs of its own set): waits %s, "
			"expected %s (%d ranks share %d CPUs)\n", rank, pl->n,
			CPU_COUNT(&pl->set[rank]),
			comm->fab->oversubscribed ? "yield" : "spin",
			pl->over[rank] ? "yield" : "spin", comm->cpu_share,
			comm->cpu_avail);
		bad = 1;
	}
	if (pl->threads[rank] && threads != pl->threads[rank]) {
		fprintf(stderr, "rank %d of %d: %d pool threads, expected %d\n",
			rank, pl->n, threads, pl->threads[rank]);
		bad = 1;
	}
	return end_comm(rank, comm, bad);
}

/* The CPUs this process may use, by physical core: out[i] is a CPU of
 * core i (one per core); the count of cores returned. */
static int crowd_cores(int *out, int max)
{
	cpu_set_t all;
	int key[CPU_SETSIZE], n = 0, i, j;

	if (sched_getaffinity(0, sizeof(all), &all))
		return 0;
	for (i = 0; i < CPU_SETSIZE && n < max; i++) {
		if (!CPU_ISSET(i, &all))
			continue;
		key[n] = fep_cpu_core_key(i);
		for (j = 0; j < n && key[j] != key[n]; j++)
			;
		if (j == n)
			out[n++] = i;
	}
	return n;
}

static void crowd_run(int n, const int *over, const int *threads,
		      const int cpus[][3])
{
	struct crowd_plan pl;
	int r, i;

	memset(&pl, 0, sizeof(pl));
	pl.n = n;
	for (r = 0; r < n; r++) {
		CPU_ZERO(&pl.set[r]);
		for (i = 0; i < 3 && cpus[r][i] >= 0; i++)
			CPU_SET(cpus[r][i], &pl.set[r]);
		pl.over[r] = over[r];
		pl.threads[r] = threads ? threads[r] : 0;
	}
	ck_assert_msg(fep_test_run_ranks(n, 60, crowd_rank, &pl) == 0,
		      "%d ranks: waits or threads not as the CPU sets say: %s", n,
		      fep_test_ranks_failed());
}

START_TEST(cpus_crowd)
{
	int c[2], cpu[CPU_SETSIZE];
	cpu_set_t all;
	int n = 0, i;

	fep_test_on_provider("shm");
	ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	for (i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &all))
			cpu[n++] = i;
	if (n < 2)
		fep_test_skip("one CPU here: no two CPU sets to tell apart");
	c[0] = cpu[0];
	c[1] = cpu[1];
	{       /* a CPU each: spin */
		const int sets[][3] = { { c[0], -1 }, { c[1], -1 } };
		const int over[] = { 0, 0 }, thr[] = { 1, 1 };

		crowd_run(2, over, thr, sets);
	}
	{       /* two on one CPU: yield, on any machine */
		const int sets[][3] = { { c[0], -1 }, { c[0], -1 } };
		const int over[] = { 1, 1 }, thr[] = { 1, 1 };

		crowd_run(2, over, thr, sets);
	}
	{       /* two crowded, one alone: only the crowded yield */
		const int sets[][3] = { { c[0], -1 }, { c[0], -1 }, { c[1], -1 } };
		const int over[] = { 1, 1, 0 };

		crowd_run(3, over, NULL, sets);
	}
	{       /* three unbound in a set of two CPUs (a cpuset) */
		const int sets[][3] = { { c[0], c[1], -1 }, { c[0], c[1], -1 },
					{ c[0], c[1], -1 } };
		const int over[] = { 1, 1, 1 };

		crowd_run(3, over, NULL, sets);
	}
	{       /* two in a set of two CPUs: spin */
		const int sets[][3] = { { c[0], c[1], -1 }, { c[0], c[1], -1 } };
		const int over[] = { 0, 0 }, thr[] = { 1, 1 };

		crowd_run(2, over, thr, sets);
	}
}
END_TEST

/* Two ranks bound to two cores of their own each: two threads each,
 * not the host's cores shared among all its ranks. */
START_TEST(cpus_own_cores)
{
	int core[4];

	fep_test_on_provider("shm");
	if (crowd_cores(core, 4) < 4)
		fep_test_skip("fewer than 4 physical cores here");
	{
		const int sets[][3] = { { core[0], core[1], -1 },
					{ core[2], core[3], -1 } };
		const int over[] = { 0, 0 }, thr[] = { 2, 2 };

		crowd_run(2, over, thr, sets);
	}
}
END_TEST

/* The queues' warm-up at creation (FABEP_QUEUE_WARMUP): where any rank
 * asks for it (auto: shm with more ranks than CPUs and at most
 * FEP_WARM_AUTO_PEERS peer endpoints), every rank's
 * counter holds the signals of every peer on every channel, the
 * endpoint's queue depth of them (at most FEP_WARM_MAX); else none. */
struct warm_plan {
	const char *prov;
	const char *env[3];     /* FABEP_QUEUE_WARMUP per rank, NULL: unset */
	int cpu[3];             /* the CPU each rank is bound to, -1: any */
	const char *channels;   /* FABEP_CHANNELS (cqdata), NULL: unset */
	int warmed;             /* expected on every rank */
};

static int warm_rank(int rank, int size, void *arg)
{
	const struct warm_plan *pl = arg;
	fabep_comm_t *comm = NULL;
	uint64_t got, want = 0;
	cpu_set_t set;
	int bad = 0;

	if (pl->env[rank])
		setenv("FABEP_QUEUE_WARMUP", pl->env[rank], 1);
	else
		unsetenv("FABEP_QUEUE_WARMUP");
	if (pl->channels) {
		setenv("FABEP_CHANNELS", pl->channels, 1);
		setenv("FABEP_SIGNAL", "cqdata", 1);
	}
	CPU_ZERO(&set);
	if (pl->cpu[rank] >= 0)
		CPU_SET(pl->cpu[rank], &set);
	if (bound_comm(rank, pl->cpu[rank] >= 0 ? &set : NULL, &comm))
		return 1;
	if (pl->warmed)
		want = (uint64_t)FEP_MIN(comm->fab->info->rx_attr->size, FEP_WARM_MAX) *
		       (uint64_t)comm->fab->nchan * (uint64_t)(size - 1);
	got = fep_counter_load(comm->fab, comm->warm_ctr);
	if (got != want) {
		fprintf(stderr, "rank %d of %d (%s, %d channels): %llu warm-up "
			"signals, expected %llu\n", rank, size, pl->prov,
			comm->fab->nchan, (unsigned long long)got,
			(unsigned long long)want);
		bad = 1;
	}
	if (pl->channels && comm->fab->nchan != atoi(pl->channels)) {
		fprintf(stderr, "rank %d: %d channels, asked for %s\n", rank,
			comm->fab->nchan, pl->channels);
		bad = 1;
	}
	return end_comm(rank, comm, bad);
}

static void warm_run(const struct warm_plan *pl, int n)
{
	fep_test_use_provider(pl->prov);
	ck_assert_msg(fep_test_run_ranks(n, 120, warm_rank, (void *)pl) == 0,
		      "%d ranks on %s: the queues' warm-up not as planned: %s", n,
		      pl->prov, fep_test_ranks_failed());
}

START_TEST(queue_warmup)
{
	static const char *bad[] = { "sometimes", "2", "Never" };
	int expect = -EINVAL, c0, c1 = -1, i;
	cpu_set_t all;

	fep_test_need_provider("shm");
	fep_test_need_provider("tcp");
	ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	for (c0 = 0; !CPU_ISSET(c0, &all); c0++)
		;
	for (i = c0 + 1; i < CPU_SETSIZE && c1 < 0; i++)
		if (CPU_ISSET(i, &all))
			c1 = i;
	{       /* two ranks on one CPU: warmed by default, not with never */
		struct warm_plan a = { "shm", { NULL, NULL }, { c0, c0 }, NULL, 1 };
		struct warm_plan b = { "shm", { "never", "never" }, { c0, c0 }, NULL, 0 };

		warm_run(&a, 2);
		warm_run(&b, 2);
	}
	if (c1 >= 0) {  /* a CPU each: not by default; one that asks warms all */
		struct warm_plan a = { "shm", { NULL, NULL }, { c0, c1 }, NULL, 0 };
		struct warm_plan b = { "shm", { "auto", "always" }, { c0, c1 }, NULL, 1 };

		warm_run(&a, 2);
		warm_run(&b, 2);
	}
	{       /* three ranks crowded on one CPU: with three channels each
		 * (6 peer endpoints), not with five (10) */
		struct warm_plan a = { "shm", { NULL, NULL, NULL }, { c0, c0, c0 },
				       "3", 1 };
		struct warm_plan b = { "shm", { NULL, NULL, NULL }, { c0, c0, c0 },
				       "5", 0 };

		ck_assert_int_eq(2 * 3 <= FEP_WARM_AUTO_PEERS &&
				 2 * 5 > FEP_WARM_AUTO_PEERS, 1);
		warm_run(&a, 3);
		warm_run(&b, 3);
	}
	{       /* asked for on tcp */
		struct warm_plan a = { "tcp", { "always", "1" }, { -1, -1 }, NULL, 1 };

		warm_run(&a, 2);
	}
	unsetenv("FABEP_CHANNELS");
	unsetenv("FABEP_SIGNAL");
	for (i = 0; i < (int)(sizeof(bad) / sizeof(bad[0])); i++) {
		setenv("FABEP_QUEUE_WARMUP", bad[i], 1);
		ck_assert_msg(fep_test_run_ranks(1, 30, bad_env_rank, &expect) == 0,
			      "FABEP_QUEUE_WARMUP=\"%s\" accepted: %s", bad[i],
			      fep_test_ranks_failed());
	}
	unsetenv("FABEP_QUEUE_WARMUP");
}
END_TEST

START_TEST(unsupported_signal)
{
	int expect = -FABEP_ERR_NO_SIGNAL;

	fep_test_need_provider("shm");
	/* shm refuses FI_FENCE (PROVIDERS.md) */
	setenv("FABEP_PROVIDER", "shm", 1);
	setenv("FABEP_SIGNAL", "fence", 1);
	fep_test_ranks_ok(2, 30, bad_env_rank, &expect);
	unsetenv("FABEP_SIGNAL");
	unsetenv("FABEP_PROVIDER");
}
END_TEST

/* cqdata sends the head of a put past max_msg_size with
 * FI_DELIVERY_COMPLETE: where a provider refuses that and a put of the
 * heap can exceed one message, cqdata is neither picked nor accepted;
 * with delivery-complete, or with messages as large as the heap, it is. */
static int cqdata_dc_rank(int rank, int size, void *arg)
{
	static const struct {
		int no_dc;
		size_t msg_max;
		fabep_signal_t sig;
		int expect;
	} c[] = {
		{ 1, 64u << 10, FABEP_SIGNAL_CQDATA, -FABEP_ERR_NO_SIGNAL },
		{ 1, 64u << 10, FABEP_SIGNAL_AUTO, 0 },
		{ 1, 0, FABEP_SIGNAL_CQDATA, 0 },
		{ 0, 64u << 10, FABEP_SIGNAL_CQDATA, 0 },
	};
	size_t i;

	(void)size;
	(void)arg;
	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		fabep_comm_t *comm = NULL;
		int ret;

		fep_fab_test_no_dc = c[i].no_dc;
		fep_fab_test_msg_max = c[i].msg_max;
		ret = make_comm(c[i].sig, 4u << 20, &comm);
		if (ret != c[i].expect) {
			fprintf(stderr, "rank %d: case %zu: got %s, expected %s\n",
				rank, i, fabep_strerror(ret),
				fabep_strerror(c[i].expect));
			if (!ret)
				fabep_comm_destroy(comm);
			return 1;
		}
		if (ret)
			continue;
		if (c[i].no_dc && c[i].msg_max &&
		    fabep_comm_signal(comm) == FABEP_SIGNAL_CQDATA) {
			fprintf(stderr, "rank %d: cqdata chosen without "
				"FI_DELIVERY_COMPLETE\n", rank);
			fabep_comm_destroy(comm);
			return 1;
		}
		if (fabep_comm_destroy(comm))
			return 1;
	}
	return 0;
}

FEP_TEST_RANKS_CASE(cqdata_delivery, "shm", 2, 30, cqdata_dc_rank, NULL)

/* A rank that aborts its communicator (and lives on): the others, in a
 * barrier, fail with -FABEP_ERR_PEER_LOST naming it within a few
 * seconds, not at their timeout of 30 s; the aborting rank returns at
 * once. */
static int abort_rank(int rank, int size, void *arg)
{
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	uint64_t t0;
	int ret;

	(void)size;
	(void)arg;
	fabep_comm_attr_init(&a);
	a.timeout_ms = 30000;
	ret = fabep_comm_create(&a, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	ret = fabep_barrier(comm);
	if (ret) {
		fprintf(stderr, "rank %d: barrier: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	t0 = fep_now_ns();
	if (rank == 1) {
		fabep_comm_abort(comm);
		if (fep_now_ns() - t0 > 1000000000ull) {
			fprintf(stderr, "rank 1: abort took %llu ms\n",
				(unsigned long long)((fep_now_ns() - t0) / 1000000));
			return 1;
		}
		sleep(8);  /* alive: the others learn it from the bootstrap */
		return 0;
	}
	ret = fabep_barrier(comm);
	if (ret != -FABEP_ERR_PEER_LOST || fep_now_ns() - t0 > 6000000000ull ||
	    !strstr(fabep_last_error(), "rank 1")) {
		fprintf(stderr, "rank %d: barrier after rank 1 aborted: %s after "
			"%llu ms: %s\n", rank, fabep_strerror(ret),
			(unsigned long long)((fep_now_ns() - t0) / 1000000),
			fabep_last_error());
		fabep_comm_destroy(comm);
		return 1;
	}
	fabep_comm_destroy(comm);
	return 0;
}

START_TEST(comm_abort)
{
	fep_test_on_provider("shm");
	setenv("FABEP_LOG", "error", 1);
	fep_test_ranks_ok(3, 60, abort_rank, NULL);
	fabep_comm_abort(NULL);
}
END_TEST

/* cma only where shm's fast path is sure: the strategy a rank with
 * FI_SHM_DISABLE_CMA set (all ranks, or rank 1 alone: the others must
 * follow it) neither picks nor accepts, nor does tcp. */
static int cma_auto_rank(int rank, int size, void *arg)
{
	const char *only = arg;
	fabep_comm_t *comm = NULL;
	int ret;

	(void)size;
	if (only && rank == atoi(only))
		setenv("FI_SHM_DISABLE_CMA", "1", 1);
	ret = fabep_comm_create(NULL, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	if (fabep_comm_signal(comm) == FABEP_SIGNAL_CMA) {
		fprintf(stderr, "rank %d: cma chosen with FI_SHM_DISABLE_CMA on "
			"rank %s\n", rank, only ? only : "every");
		fabep_comm_destroy(comm);
		return 1;
	}
	return fabep_comm_destroy(comm) ? 1 : 0;
}

START_TEST(cma_conditions)
{
	int expect = -FABEP_ERR_NO_SIGNAL;

	if (fep_test_have_provider("tcp")) {
		fep_test_use_provider("tcp");
		setenv("FABEP_SIGNAL", "cma", 1);
		fep_test_ranks_ok(2, 30, bad_env_rank, &expect);
		unsetenv("FABEP_SIGNAL");
	}
	if (!fep_test_have_provider("shm"))
		return;
	fep_test_use_provider("shm");
	setenv("FI_SHM_DISABLE_CMA", "1", 1);
	setenv("FABEP_SIGNAL", "cma", 1);
	fep_test_ranks_ok(2, 30, bad_env_rank, &expect);
	unsetenv("FABEP_SIGNAL");
	fep_test_ranks_ok(2, 30, cma_auto_rank, NULL);
	unsetenv("FI_SHM_DISABLE_CMA");
	fep_test_ranks_ok(3, 30, cma_auto_rank, "1");
}
END_TEST

/* The strategy chosen for what the providers of the users' clusters
 * grant (verbs;ofi_rxm as tcp;ofi_rxm, efa, efa-direct
 * without atomics, cxi), none of which runs here: descriptors as
 * fep_fabric_describe fills them, through fep_signal_supported and
 * fep_signal_choose. */
static fabep_signal_t choose_for(const char *prov, uint64_t msg_order,
				 int fence, int delivery, int atomics,
				 size_t cq_data_size, uint32_t *signals)
{
	fabep_provider_desc_t d;
	char why[256];
	fabep_signal_t s;
	int i;

	memset(&d, 0, sizeof(d));
	d.size = sizeof(d);
	snprintf(d.provider, sizeof(d.provider), "%s", prov);
	d.mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
		    FI_MR_PROV_KEY;
	d.msg_order = msg_order;
	d.fence = fence;
	d.delivery_complete = delivery;
	d.atomic_sum_u64 = atomics;
	d.atomic_count = atomics ? 1 : 0;
	d.cq_data_size = cq_data_size;
	for (i = FABEP_SIGNAL_ORDERED; i <= FABEP_SIGNAL_CMA; i++)
		if (fep_signal_supported(&d, (fabep_signal_t)i))
			d.signals |= 1u << i;
	why[0] = '\0';
	s = fep_signal_choose(&d, why, sizeof(why));
	ck_assert_msg(why[0], "%s: no reason given for %s", prov,
		      fabep_signal_name(s));
	*signals = d.signals;
	return s;
}

#define SIG(s) (1u << FABEP_SIGNAL_##s)

START_TEST(choose_cluster_providers)
{
	uint32_t sigs;

	/* verbs;ofi_rxm: RMA_WAW and ATOMIC_WAW apart (not FI_ORDER_WAW), no
	 * fence, delivery complete, emulated atomics, 4 bytes of CQ data */
	ck_assert_int_eq(choose_for("verbs;ofi_rxm", FI_ORDER_RMA_WAW |
				    FI_ORDER_ATOMIC_WAW, 0, 1, 1, 4, &sigs),
			 FABEP_SIGNAL_CQDATA);
	ck_assert_uint_eq(sigs, SIG(DELIVERY) | SIG(CQDATA));
	/* efa: no ordering, no fence, delivery, atomics, CQ data */
	ck_assert_int_eq(choose_for("efa", 0, 0, 1, 1, 4, &sigs),
			 FABEP_SIGNAL_CQDATA);
	ck_assert_uint_eq(sigs, SIG(DELIVERY) | SIG(CQDATA));
	/* efa-direct: no atomics at all, CQ data only */
	ck_assert_int_eq(choose_for("efa-direct", 0, 0, 0, 0, 4, &sigs),
			 FABEP_SIGNAL_CQDATA);
	ck_assert_uint_eq(sigs, SIG(CQDATA));
	/* cxi: FI_ORDER_WAW, fence, native atomics, 8 bytes of CQ data */
	ck_assert_int_eq(choose_for("cxi", FI_ORDER_WAW, 1, 1, 1, 8, &sigs),
			 FABEP_SIGNAL_CQDATA);
	ck_assert_uint_eq(sigs, SIG(ORDERED) | SIG(FENCE) | SIG(DELIVERY) |
			  SIG(CQDATA));
	/* without CQ data: ordering, then a fence, then delivery complete */
	ck_assert_int_eq(choose_for("cxi", FI_ORDER_WAW, 1, 1, 1, 0, &sigs),
			 FABEP_SIGNAL_ORDERED);
	ck_assert_int_eq(choose_for("x", 0, 1, 1, 1, 0, &sigs), FABEP_SIGNAL_FENCE);
	ck_assert_int_eq(choose_for("x", 0, 0, 1, 1, 2, &sigs),
			 FABEP_SIGNAL_DELIVERY);
	/* sockets' fence is not used (its fenced atomics fail under load) */
	ck_assert_int_eq(choose_for("sockets", 0, 1, 1, 1, 0, &sigs),
			 FABEP_SIGNAL_DELIVERY);
	/* nothing that can signal: no strategy */
	ck_assert_int_eq(choose_for("x", FI_ORDER_WAW, 1, 1, 0, 2, &sigs),
			 FABEP_SIGNAL_AUTO);
	ck_assert_uint_eq(sigs, 0);
}
END_TEST

/* A channel that its pool thread never progresses: rank 1 calls only
 * thread 0's share of fep_fabric_progress_mine (of 2 threads), so the
 * slice of rank 0's put that travels on channel 1 (on shm the target
 * copies it when it progresses that channel) arrives only through the
 * rescue of a channel that nobody progressed over two looks. */
static int rescue_rank(int rank, int size, void *arg)
{
	const size_t len = 1u << 20;
	fabep_comm_t *comm;
	fabep_off_t ctr, dst, src;
	int ret, round;

	(void)size;
	(void)arg;
	ret = make_comm_chan(FABEP_SIGNAL_CQDATA, 4 * len + (8u << 20), "2", 1, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	if (fabep_comm_channels(comm) != 2) {
		fprintf(stderr, "rank %d: %d channels, not 2\n", rank,
			fabep_comm_channels(comm));
		return 1;
	}
	if ((ret = fabep_heap_alloc(comm, 8, 8, &ctr)) ||
	    (ret = fabep_heap_alloc(comm, len, 64, &dst)) ||
	    (ret = fabep_heap_alloc(comm, len, 64, &src))) {
		fprintf(stderr, "alloc: %s\n", fabep_strerror(ret));
		return 1;
	}
	for (round = 1; round <= 20; round++) {
		if (rank == 0) {
			fill(fabep_heap_ptr(comm, src), len, 0, round);
			ret = fabep_put_signal(comm, 1, dst, src, len, ctr, 1);
		} else {
			fep_fabric_t *fab = comm->fab;
			struct fep_chan_watch w;
			uint64_t t0 = fep_now_ns();
			uint8_t *expect = malloc(len);

			memset(&w, 0, sizeof(w));
			ret = 0;
			while (!ret && fep_counter_load(fab, ctr) < (uint64_t)round) {
				if (fep_now_ns() - t0 > 5000000000ull) {
					fprintf(stderr, "round %d: channel 1 never "
						"progressed (counter %llu)\n", round,
						(unsigned long long)fep_counter_load(fab, ctr));
					return 1;
				}
				ret = fep_fabric_progress_mine(fab, 0, 2, &w, 4);
			}
			fill(expect, len, 0, round);
			if (!ret && memcmp(expect, fabep_heap_ptr(comm, dst), len)) {
				fprintf(stderr, "round %d: stale or wrong payload\n", round);
				return 1;
			}
			free(expect);
		}
		if (!ret)
			ret = fabep_barrier(comm);
		if (ret) {
			fprintf(stderr, "rank %d round %d: %s\n", rank, round,
				fabep_strerror(ret));
			return 1;
		}
	}
	return fabep_comm_destroy(comm) ? 1 : 0;
}

FEP_TEST_RANKS_CASE(channels_rescue, "shm", 2, 60, rescue_rank, NULL)

/* fabep_barrier: no rank leaves a barrier before every rank has entered
 * it.  Each rank marks its entry (in memory shared by the forked ranks)
 * before it enters, the ranks entering in a different order each round,
 * and checks every mark when it leaves; sizes that are and are not
 * powers of two, on one channel and on three. */
struct barrier_arg {
	volatile uint64_t *entered;  /* [rounds][size]: round + 1 once entered */
	const char *channels;
};

#define BARRIER_ROUNDS 6

static int barrier_rank(int rank, int size, void *arg)
{
	struct barrier_arg *b = arg;
	fabep_comm_t *comm;
	int round, r, ret;

	ret = make_comm_chan(FABEP_SIGNAL_CQDATA, 1u << 20, b->channels,
			     b->channels ? 3 : 1, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	for (round = 0; round < BARRIER_ROUNDS; round++) {
		struct timespec ts = { 0, (long)((rank * 7 + round * 3) % size) * 4000000L };

		if (round % 2)  /* odd rounds: straight in, late ranks overlap */
			nanosleep(&ts, NULL);
		__atomic_store_n(&b->entered[round * size + rank], (uint64_t)round + 1,
				 __ATOMIC_RELEASE);
		ret = fabep_barrier(comm);
		if (ret) {
			fprintf(stderr, "rank %d round %d: barrier: %s\n", rank, round,
				fabep_strerror(ret));
			return 1;
		}
		for (r = 0; r < size; r++)
			if (__atomic_load_n(&b->entered[round * size + r],
					    __ATOMIC_ACQUIRE) != (uint64_t)round + 1) {
				fprintf(stderr, "rank %d left barrier %d before rank %d "
					"entered it\n", rank, round, r);
				return 1;
			}
	}
	return fabep_comm_destroy(comm) ? 1 : 0;
}

START_TEST(barrier_order)
{
	static const int sizes[] = { 2, 3, 5, 8 };
	struct barrier_arg b = { NULL, NULL };
	size_t len = BARRIER_ROUNDS * 8 * sizeof(uint64_t);
	unsigned i;

	fep_test_on_provider("shm");
	b.entered = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne((void *)b.entered, MAP_FAILED);
	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		memset((void *)b.entered, 0, len);
		b.channels = i == 2 ? "3" : NULL;
		ck_assert_msg(fep_test_run_ranks(sizes[i], 60, barrier_rank, &b) == 0,
			      "%d ranks%s: %s", sizes[i], b.channels ? ", 3 channels" : "",
			      fep_test_ranks_failed());
	}
	munmap((void *)b.entered, len);
}
END_TEST

/* A peer that leaves right after its last signal: rank 1 signals rank 0
 * and exits.  Once it is gone, rank 0's liveness check is due with the
 * signal not yet progressed: the wait's clock must drain what arrived and
 * let the wait succeed (target 1), and fail with PEER_LOST only for what
 * never comes (target 2). */
static int leave_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm;
	fabep_off_t ctr;
	uint64_t deadline, tmo = 10000ull * 1000000ull;
	pid_t peer;
	int ret, i;

	(void)size;
	(void)arg;
	ret = make_comm(FABEP_SIGNAL_AUTO, 4u << 20, &comm);
	if (!ret)
		ret = fabep_heap_alloc(comm, 8, 8, &ctr);
	if (!ret)
		ret = fabep_barrier(comm);
	if (ret) {
		fprintf(stderr, "rank %d: set-up: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	if (rank == 1) {
		ret = fabep_put_signal(comm, 0, ctr, ctr, 0, ctr, 1);
		if (!ret)
			ret = fabep_flush(comm);
		fep_test_exit(ret ? 1 : 0);  /* gone, its signal sent */
	}
	peer = comm->peer_pid[1];
	for (i = 0; i < 500 && kill(peer, 0) == 0; i++) {
		char path[64], buf[512] = "";
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/stat", (int)peer);
		f = fopen(path, "r");
		if (f) {
			if (!fgets(buf, sizeof(buf), f))
				buf[0] = '\0';
			fclose(f);
		}
		if (strstr(buf, ") Z") || strstr(buf, ") X"))
			break;  /* a zombie: gone */
		usleep(10000);
	}
	if (peer <= 0 || i == 500) {
		fprintf(stderr, "rank 0: rank 1 (pid %d) did not exit\n", (int)peer);
		return 1;
	}
	/* a wait of 100 ms so far: the liveness check is due */
	deadline = fep_now_ns() + tmo - 100000000ull;
	comm->fab->alive_next = 0;
	ret = fep_fabric_clock_ctr(comm->fab, &deadline, 10000, ctr, 1);
	if (ret || fep_counter_load(comm->fab, ctr) != 1) {
		fprintf(stderr, "rank 0: the signal sent before leaving: %d (%s), "
			"counter %llu\n", ret, fabep_strerror(ret),
			(unsigned long long)fep_counter_load(comm->fab, ctr));
		return 1;
	}
	deadline = fep_now_ns() + tmo - 100000000ull;
	comm->fab->alive_next = 0;
	ret = fep_fabric_clock_ctr(comm->fab, &deadline, 10000, ctr, 2);
	if (ret != -FABEP_ERR_PEER_LOST) {
		fprintf(stderr, "rank 0: a signal that never comes: %d, want "
			"PEER_LOST\n", ret);
		return 1;
	}
	return fabep_comm_destroy(comm) ? 1 : 0;
}

FEP_TEST_RANKS_CASE(peer_leaves_after_signal, "shm", 2, 60, leave_rank, NULL)

/* The fabric's reads of a peer's heap and puts from a pointer outside the
 * heap (the allreduce's direct path), under every strategy shm offers
 * (each rank one thread: cma by default): bytes compared with the pattern
 * the peer wrote, and the bad ranges refused. */
#define RD_BYTES (96u << 10)

/* Two blocks of bytes and a counter in the heap (after a create that
 * returned ret), or 1 with what failed said. */
static int blocks_ctr(int ret, int rank, fabep_comm_t *comm, size_t bytes,
		      fabep_off_t *a, fabep_off_t *b, fabep_off_t *ctr)
{
	if (!ret)
		ret = fabep_heap_alloc(comm, bytes, 64, a);
	if (!ret)
		ret = fabep_heap_alloc(comm, bytes, 64, b);
	if (!ret)
		ret = fabep_heap_alloc(comm, 8, 8, ctr);
	if (ret)
		fprintf(stderr, "rank %d: set-up: %s\n", rank, fabep_strerror(ret));
	return ret ? 1 : 0;
}

static uint8_t rd_pat(int rank, size_t i)
{
	return (uint8_t)(i * 131u + (size_t)rank * 7u + (i >> 12));
}

static int reads_rank(int rank, int size, void *arg)
{
	fabep_signal_t sig = *(const fabep_signal_t *)arg;
	fabep_comm_t *comm = NULL;
	fep_fabric_t *fab;
	fabep_off_t mine, into, ctr;
	uint8_t *got = malloc(RD_BYTES), *src = malloc(RD_BYTES), *p;
	int peer = 1 - rank, ret;
	struct fep_put pu;
	size_t i;

	(void)size;
	ret = got && src ? make_comm(sig, 4u << 20, &comm) : -ENOMEM;
	if (blocks_ctr(ret, rank, comm, RD_BYTES, &mine, &into, &ctr))
		return 1;
	fab = comm->fab;
	p = fep_heap_at(fab, mine);
	for (i = 0; i < RD_BYTES; i++) {
		p[i] = rd_pat(rank, i);
		src[i] = rd_pat(rank + 2, i);
	}
	ret = fabep_barrier(comm);
	/* the peer's block, in two reads, into unregistered memory */
	if (!ret)
		ret = fep_fab_read(fab, peer, got, mine, RD_BYTES / 3);
	if (!ret)
		ret = fep_fab_read(fab, peer, got + RD_BYTES / 3, mine + RD_BYTES / 3,
				   RD_BYTES - RD_BYTES / 3);
	if (!ret)
		ret = fep_fabric_reap_writes(fab);
	for (i = 0; !ret && i < RD_BYTES; i++)
		if (got[i] != rd_pat(peer, i)) {
			fprintf(stderr, "rank %d: read byte %zu is %u, want %u\n", rank,
				i, got[i], rd_pat(peer, i));
			return 1;
		}
	/* a put with its signal from the unregistered buffer */
	memset(&pu, 0, sizeof(pu));
	pu.peer = peer;
	pu.dst = into;
	pu.src = FEP_PUT_PTR;
	pu.ptr = src;
	pu.len = RD_BYTES;
	pu.sig = ctr;
	pu.add = 1;
	if (!ret)
		ret = fep_fab_put_signal_many(fab, &pu, 1);
	if (!ret)
		ret = fep_fab_wait(fab, ctr, 1, -1);
	if (!ret)
		ret = fep_fabric_reap_writes(fab);
	p = fep_heap_at(fab, into);
	for (i = 0; !ret && i < RD_BYTES; i++)
		if (p[i] != rd_pat(peer + 2, i)) {
			fprintf(stderr, "rank %d: put byte %zu is %u, want %u\n", rank,
				i, p[i], rd_pat(peer + 2, i));
			return 1;
		}
	if (ret) {
		fprintf(stderr, "rank %d: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	/* refused before anything is posted */
	if (fep_fab_read(fab, peer, got, fab->heap_size - 8, 16) != -ERANGE) {
		fprintf(stderr, "rank %d: a read past the heap was not refused\n", rank);
		return 1;
	}
	pu.ptr = NULL;
	if (fep_fab_put_signal_many(fab, &pu, 1) != -EINVAL) {
		fprintf(stderr, "rank %d: a put from NULL was not refused\n", rank);
		return 1;
	}
	ret = fabep_barrier(comm);
	free(got);
	free(src);
	return fabep_comm_destroy(comm) || ret ? 1 : 0;
}

START_TEST(shm_reads)
{
	static const fabep_signal_t sigs[] = {
		FABEP_SIGNAL_AUTO, FABEP_SIGNAL_CQDATA, FABEP_SIGNAL_DELIVERY,
	};
	unsigned i;

	fep_test_on_provider("shm");
	for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		ck_assert_msg(fep_test_run_ranks(2, 60, reads_rank, (void *)&sigs[i]) == 0,
			      "signal %s: %s", fabep_signal_name(sigs[i]),
			      fep_test_ranks_failed());
}
END_TEST

/* A chain of puts (fep_fab_joins: pieces from the heap and from outside
 * it, to one peer at consecutive destinations, the last alone with a
 * signal) under remote CQ data leaves as one write carrying the signal:
 * no plain fi_write is posted (counted by an armed fault that never
 * fires), the peer's counter moves by the signal, every byte is there.
 * The same pieces with a gap after the first are no chain from there:
 * the first goes as a plain write, the rest still join.  Each rank sends
 * to the other; with channels (arg: FABEP_CHANNELS, threads as many), the
 * chain stays on one, and one long enough for slices does not join. */
#define JOIN_PIECE 3000u

static uint8_t join_pat(int rank, int round, size_t i)
{
	return (uint8_t)(i * 29u + (size_t)rank * 11u + (size_t)round * 5u);
}

static int joined_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm;
	fep_fabric_t *fab;
	fabep_off_t src, into, ctr;
	uint8_t ext[JOIN_PIECE], *p;
	struct fep_put pu[3];
	int peer = 1 - rank, ret, round;
	size_t i, np, len;

	(void)size;
	ret = make_comm_chan(FABEP_SIGNAL_CQDATA, 4u << 20, arg,
			     arg ? atoi(arg) : 1, &comm);
	if (ret == -FABEP_ERR_NO_SIGNAL)
		return 77;
	if (blocks_ctr(ret, rank, comm, 4 * JOIN_PIECE, &src, &into, &ctr))
		return 1;
	fab = comm->fab;
	np = FEP_MIN((size_t)3, fab->iov_max);
	len = np * JOIN_PIECE;
	if (np < 2) {
		fabep_comm_destroy(comm);
		return 78;  /* one local buffer a write: nothing to join */
	}
	if (!fep_fab_joins(fab, np, len)) {
		fprintf(stderr, "rank %d: %zu pieces of %u bytes do not join "
			"(iov_max %zu, max_msg_size %zu)\n", rank, np, JOIN_PIECE,
			fab->iov_max, fab->max_msg_size);
		return 1;
	}
	if (arg && (fab->nchan != atoi(arg) ||
		    fep_fab_joins(fab, 2, 2 * (size_t)FEP_SLICE_MIN))) {
		fprintf(stderr, "rank %d: %d channels, FABEP_CHANNELS=%s; a "
			"chain of two slices' bytes joins: %d\n", rank, fab->nchan,
			(const char *)arg, fep_fab_joins(fab, 2, 2 * (size_t)FEP_SLICE_MIN));
		return 1;
	}
	fep_test_fault.step = "fi_write";  /* counts, never fires */
	fep_test_fault.nth = UINT_MAX;
	fep_test_fault.code = -FI_EIO;
	for (round = 0; round < 2; round++) {
		unsigned before;
		size_t gap = round ? 64 : 0;

		/* pieces: the heap's second block, the outside buffer, the
		 * heap's first block (sources out of order on purpose) */
		p = fep_heap_at(fab, src);
		for (i = 0; i < 2 * JOIN_PIECE; i++)
			p[JOIN_PIECE + i - (i >= JOIN_PIECE ? 2 * JOIN_PIECE : 0)] =
				join_pat(rank, round, i < JOIN_PIECE ? i : i + JOIN_PIECE);
		for (i = 0; i < JOIN_PIECE; i++)
			ext[i] = join_pat(rank, round, JOIN_PIECE + i);
		memset(fep_heap_at(fab, into), 0, 4 * JOIN_PIECE);
		ret = fabep_barrier(comm);
		memset(pu, 0, sizeof(pu));
		for (i = 0; i < np; i++) {
			pu[i].peer = peer;
			pu[i].dst = into + i * JOIN_PIECE + (i ? gap : 0);
			pu[i].len = JOIN_PIECE;
			pu[i].sig = ctr;
		}
		pu[0].src = src + JOIN_PIECE;
		pu[1].src = FEP_PUT_PTR;
		pu[1].ptr = ext;
		if (np > 2)
			pu[2].src = src;
		pu[np - 1].add = 1;
		before = fep_test_fault.seen;
		if (!ret)
			ret = fep_fab_put_signal_many(fab, pu, np);
		if (!ret && fep_test_fault.seen - before != (gap ? 1u : 0u)) {
			fprintf(stderr, "rank %d round %d: %u plain writes for %zu "
				"pieces%s\n", rank, round, fep_test_fault.seen - before,
				np, gap ? " with a gap" : " in a chain");
			ret = -EIO;
		}
		if (!ret)
			ret = fep_fab_wait(fab, ctr, (uint64_t)round + 1, -1);
		if (!ret)
			ret = fep_fabric_reap_writes(fab);
		p = fep_heap_at(fab, into);
		/* the plain write is not signalled: not checked */
		for (i = gap ? JOIN_PIECE : 0; !ret && i < np * JOIN_PIECE; i++) {
			size_t at = i + (i >= JOIN_PIECE ? gap : 0);

			if (p[at] != join_pat(peer, round, i)) {
				fprintf(stderr, "rank %d round %d: byte %zu is %u, "
					"want %u\n", rank, round, i, p[at],
					join_pat(peer, round, i));
				ret = -EIO;
			}
		}
		if (!ret)
			ret = fabep_barrier(comm);
	}
	fep_test_fault.step = NULL;
	if (ret)
		fprintf(stderr, "rank %d: %s\n", rank, fabep_strerror(ret));
	return fabep_comm_destroy(comm) || ret ? 1 : 0;
}

static void run_joined(const char *prov, const char *channels)
{
	int status[2], r;

	fep_test_on_provider(prov);
	fep_test_run_ranks_status(2, 60, joined_rank, (void *)channels, status);
	if (status[0] == 77)
		fep_test_skip("%s: signal cqdata not supported", prov);
	if (status[0] == 78)
		fep_test_skip("%s: one local buffer a write", prov);
	for (r = 0; r < 2; r++)
		ck_assert_msg(status[r] == 0, "%s: rank %d exited %d: %s", prov, r,
			      status[r], fep_test_rank_said(r));
}

START_TEST(joined_shm) { run_joined("shm", NULL); } END_TEST
START_TEST(joined_shm_chan) { run_joined("shm", "3"); } END_TEST
START_TEST(joined_tcp) { run_joined("tcp", NULL); } END_TEST
START_TEST(joined_tcp_chan) { run_joined("tcp", "3"); } END_TEST
START_TEST(joined_udp) { run_joined("udp", NULL); } END_TEST
START_TEST(joined_net) { run_joined("net", NULL); } END_TEST

/* fabep_get: every rank writes a fresh block each round and signals the
 * others; each then reads random pieces of every rank's block (its own
 * too; empty, one byte, unaligned, across the block) into random places
 * of its heap and checks them against the generator's bytes. */
#define GET_BLK ((size_t)1 << 20)

struct get_case { fabep_signal_t sig; int rounds; };

static int gets_rank(int rank, int size, void *arg)
{
	struct get_case *gc = arg;
	fabep_comm_t *comm;
	fabep_off_t blk, into, ctr;
	uint8_t *want = malloc(GET_BLK), *got;
	uint64_t seed = 0x5eed0000ull + (uint64_t)rank, target = 0;
	int round, ret, p;

	ret = want ? make_comm(gc->sig, 8u << 20, &comm) : -ENOMEM;
	if (ret == -FABEP_ERR_NO_SIGNAL) {
		free(want);
		return 77; /* strategy not offered: the caller skips */
	}
	if (!ret)
		ret = fabep_heap_alloc(comm, GET_BLK, 64, &blk);
	if (!ret)
		ret = fabep_heap_alloc(comm, GET_BLK + 64, 64, &into);
	if (!ret)
		ret = fabep_heap_alloc(comm, 8, 8, &ctr);
	if (ret) {
		fprintf(stderr, "rank %d: set-up: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	got = fabep_heap_ptr(comm, into);
	for (round = 0; !ret && round < gc->rounds; round++) {
		fill(fabep_heap_ptr(comm, blk), GET_BLK, rank, round);
		/* the block is new: tell every peer (a signal alone) */
		for (p = 0; !ret && p < size; p++)
			if (p != rank)
				ret = fabep_put_signal(comm, p, blk, blk, 0, ctr, 1);
		target += (uint64_t)size - 1;
		if (!ret)
			ret = fabep_wait(comm, ctr, target);
		for (p = 0; !ret && p < size; p++) {
			int piece;

			fill(want, GET_BLK, p, round);
			for (piece = 0; !ret && piece < 6; piece++) {
				size_t len, src, dst;

				switch (piece) {
				case 0: len = 0; break;
				case 1: len = 1; break;
				case 2: len = GET_BLK; break;
				default: len = fep_test_rand(&seed) % GET_BLK + 1; break;
				}
				src = fep_test_rand(&seed) % (GET_BLK - len + 1);
				dst = fep_test_rand(&seed) % (GET_BLK + 64 - len + 1);
				memset(got + dst, 0xa5, len);
				ret = fabep_get(comm, p, into + dst, blk + src, len);
				if (!ret)
					ret = fabep_flush(comm);
				if (!ret && len && memcmp(got + dst, want + src, len)) {
					size_t i = 0;

					while (got[dst + i] == want[src + i])
						i++;
					fprintf(stderr, "rank %d round %d: get of %zu bytes at "
						"%zu of rank %d: byte %zu is %u, want %u\n",
						rank, round, len, src, p, i, got[dst + i],
						want[src + i]);
					ret = -EIO;
				}
			}
		}
		/* nobody rewrites its block while another still reads it */
		if (!ret)
			ret = fabep_barrier(comm);
	}
	if (ret)
		fprintf(stderr, "rank %d: %s\n", rank, fabep_strerror(ret));
	free(want);
	return fabep_comm_destroy(comm) || ret ? 1 : 0;
}

static void run_gets(const char *prov, fabep_signal_t sig, int size, int rounds)
{
	struct get_case gc = { sig, rounds };
	int status[4], r;

	fep_test_on_provider(prov);
	fep_test_run_ranks_status(size, 120, gets_rank, &gc, status);
	if (status[0] == 77)
		fep_test_skip("%s: signal %s not supported", prov, fabep_signal_name(sig));
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == 0, "%s/%s: rank %d exited %d: %s", prov,
			      fabep_signal_name(sig), r, status[r],
			      fep_test_rank_said(r));
}

START_TEST(gets_shm) { run_gets("shm", FABEP_SIGNAL_AUTO, 3, 20); } END_TEST
START_TEST(gets_shm_cqdata) { run_gets("shm", FABEP_SIGNAL_CQDATA, 3, 10); } END_TEST
START_TEST(gets_shm_ordered) { run_gets("shm", FABEP_SIGNAL_ORDERED, 2, 10); } END_TEST
START_TEST(gets_shm_delivery) { run_gets("shm", FABEP_SIGNAL_DELIVERY, 2, 10); } END_TEST
START_TEST(gets_shm_cma) { run_gets("shm", FABEP_SIGNAL_CMA, 4, 20); } END_TEST
START_TEST(gets_tcp) { run_gets("tcp", FABEP_SIGNAL_AUTO, 3, 10); } END_TEST
START_TEST(gets_sockets) { run_gets("sockets", FABEP_SIGNAL_AUTO, 2, 5); } END_TEST
START_TEST(gets_udp) { run_gets("udp", FABEP_SIGNAL_AUTO, 3, 10); } END_TEST
START_TEST(gets_net) { run_gets("net", FABEP_SIGNAL_AUTO, 3, 10); } END_TEST

/* FABEP_CHANNELS unset: with cqdata, one channel per thread, at most 8 on
 * shm and 4 on tcp; with cma (shm), one per thread where ranks have
 * several threads and number at least 4, 4 where every rank has one
 * thread and there are at least 16 ranks; one elsewhere.  want and cma_want are the
 * channels with cqdata and with cma; 0: that strategy must not be the
 * choice. */
/* want: channels under cqdata; cma_want: under cma, and cma_crowded
 * where FEP_CMA_CROWD ranks or more share each CPU (0: as cma_want) */
struct chan_default { int threads, want, ranks, cma_want, cma_crowded; };

static int default_rank(int rank, int size, void *arg)
{
	const struct chan_default *d = arg;
	fabep_comm_t *comm;
	int want, ret;

	(void)size;
	unsetenv("FABEP_CHANNELS");
	ret = make_comm_chan(FABEP_SIGNAL_AUTO, 4u << 20, NULL, d->threads, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	want = fabep_comm_signal(comm) == FABEP_SIGNAL_CQDATA ? d->want :
	       fabep_comm_signal(comm) != FABEP_SIGNAL_CMA ? 1 :
	       fep_comm_cma_crowded(comm) && d->cma_crowded ? d->cma_crowded :
	       d->cma_want;
	if (!want || fabep_comm_channels(comm) != want) {
		fprintf(stderr, "rank %d: %s, %d threads, signal %s%s: %d "
			"channels, want %d\n", rank, fabep_comm_provider(comm),
			d->threads, fabep_signal_name(fabep_comm_signal(comm)),
			fep_comm_cma_crowded(comm) ? ", crowded" : "",
			fabep_comm_channels(comm), want);
		return 1;
	}
	ret = fabep_barrier(comm);
	return fabep_comm_destroy(comm) || ret ? 1 : 0;
}

START_TEST(channels_default)
{
	static const struct { const char *prov; struct chan_default d; } c[] = {
		{ "shm", { 3, 3, 2, 0, 0 } }, { "shm", { 10, 8, 2, 0, 0 } },
		{ "shm", { 1, 0, 2, 1, 0 } }, { "shm", { 1, 0, 16, 4, 1 } },
		{ "shm", { 2, 2, 3, 0, 0 } }, { "shm", { 2, 0, 8, 2, 0 } },
		{ "shm", { 3, 3, 3, 0, 0 } }, { "shm", { 3, 0, 4, 3, 0 } },
		{ "shm", { 3, 0, 8, 3, 0 } },
		{ "shm", { 1, 0, 15, 1, 0 } },
		{ "tcp", { 2, 2, 2, 1, 0 } }, { "tcp", { 6, 4, 2, 1, 0 } },
		{ "sockets", { 3, 1, 2, 1, 0 } },
	};
	size_t i;

	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct chan_default d = c[i].d;
		unsigned mask = 0;

		if (!fep_test_have_provider(c[i].prov))
			continue;
		/* without cma (a Yama policy, FI_SHM_DISABLE_CMA) shm takes
		 * cqdata: the cases about cma's rules do not apply */
		if (fep_test_signals(c[i].prov, &mask))
			mask = 0;
		if (!d.want && !(mask & (1u << FABEP_SIGNAL_CMA)))
			continue;
		fep_test_use_provider(c[i].prov);
		ck_assert_msg(fep_test_run_ranks(d.ranks, 60, default_rank, &d) == 0,
			      "%s with %d ranks of %d threads: %s", c[i].prov, d.ranks,
			      d.threads, fep_test_ranks_failed());
	}
}
END_TEST

/* Ranks that disagree on whether they are crowded still agree on their
 * channels: under cma, 16 ranks of one thread, 15 of them bound to one
 * CPU (FEP_CMA_CROWD or more a CPU) and the last alone on another,
 * which on its own would open FEP_CMA_CHANNELS; every rank must open
 * one. */
#define CROWDED_RANKS 16

struct crowded_plan {
	int cpu[2];
};

static int crowded_rank(int rank, int size, void *arg)
{
	const struct crowded_plan *pl = arg;
	int alone = rank == size - 1, bad = 0, ret;
	fabep_comm_t *comm;
	cpu_set_t set;

	unsetenv("FABEP_CHANNELS");
	CPU_ZERO(&set);
	CPU_SET(pl->cpu[alone], &set);
	if (sched_setaffinity(0, sizeof(set), &set)) {
		perror("sched_setaffinity");
		return 1;
	}
	ret = make_comm_chan(FABEP_SIGNAL_CMA, 4u << 20, NULL, 1, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: create: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	if (fep_comm_cma_crowded(comm) == alone) {
		fprintf(stderr, "rank %d: %s, expected %s\n", rank,
			fep_comm_cma_crowded(comm) ? "crowded" : "not crowded",
			alone ? "alone" : "crowded");
		bad = 1;
	}
	if (fabep_comm_channels(comm) != 1) {
		fprintf(stderr, "rank %d (%s): %d channels, want 1\n", rank,
			alone ? "alone" : "crowded", fabep_comm_channels(comm));
		bad = 1;
	}
	return end_comm(rank, comm, bad);
}

START_TEST(channels_crowded)
{
	struct crowded_plan pl;
	unsigned mask = 0;
	cpu_set_t all;
	int n = 0, i;

	fep_test_need_provider("shm");
	if (fep_test_signals("shm", &mask) || !(mask & (1u << FABEP_SIGNAL_CMA)))
		fep_test_skip("shm does not offer signal strategy cma");
	ck_assert_int_eq(sched_getaffinity(0, sizeof(all), &all), 0);
	for (i = 0; i < CPU_SETSIZE && n < 2; i++)
		if (CPU_ISSET(i, &all))
			pl.cpu[n++] = i;
	if (n < 2)
		fep_test_skip("one CPU here: no rank can be alone");
	fep_test_use_provider("shm");
	ck_assert_msg(fep_test_run_ranks(CROWDED_RANKS, 120, crowded_rank, &pl) == 0,
		      "%d ranks, one alone on a CPU: %s", CROWDED_RANKS,
		      fep_test_ranks_failed());
}
END_TEST

/* fep_fabric_reap_writes waits for the writes of every channel, not
 * only of chan[0]: under cma with 2 channels rank 1 posts on its own
 * channel, 1, with CQ data, so that the target's progress copies; the
 * target does not progress for a while, and after the reap no write
 * may be in flight on any channel.  77: cma is not offered here. */
#define REAP_BYTES (256u << 10)

static int reap_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm;
	fep_fabric_t *fab;
	fabep_off_t buf, ctr;
	struct fep_put pu;
	size_t out = 0, i;
	uint8_t *p;
	int c, ret;

	(void)size;
	(void)arg;
	ret = make_comm_chan(FABEP_SIGNAL_CMA, 4u << 20, "2", 2, &comm);
	if (ret == -FABEP_ERR_NO_SIGNAL)
		return 77;
	if (!ret)
		ret = fabep_heap_alloc(comm, REAP_BYTES, 64, &buf);
	if (!ret)
		ret = fabep_heap_alloc(comm, 8, 8, &ctr);
	if (ret) {
		fprintf(stderr, "rank %d: set-up: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	fab = comm->fab;
	p = fep_heap_at(fab, buf);
	memset(p, rank + 1, REAP_BYTES);
	ret = fabep_barrier(comm);
	if (!ret && rank == 1) {
		memset(&pu, 0, sizeof(pu));
		pu.peer = 0;
		pu.dst = buf;
		pu.src = buf;
		pu.len = REAP_BYTES;
		pu.sig = ctr;
		pu.add = 1;
		ret = fep_fab_put_recv_many(fab, &pu, 1);
		if (!ret)
			ret = fep_fabric_reap_writes(fab);
		for (c = 0; c < fab->nchan; c++)
			out += fab->chan[c]->writes;
		if (!ret && out) {
			fprintf(stderr, "rank 1: %zu writes in flight after the reap\n", out);
			return 1;
		}
	} else if (!ret) {
		struct timespec ts = { 0, 300000000L };

		nanosleep(&ts, NULL);  /* the write waits for this rank */
		ret = fep_fab_wait(fab, ctr, 1, -1);
		for (i = 0; !ret && i < REAP_BYTES; i++)
			if (p[i] != 2) {
				fprintf(stderr, "rank 0: byte %zu is %u, want 2\n", i, p[i]);
				return 1;
			}
	}
	if (!ret)
		ret = fabep_barrier(comm);
	if (ret) {
		fprintf(stderr, "rank %d: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	return fabep_comm_destroy(comm) ? 1 : 0;
}

/* A transfer error seen on a channel other than the first: destroy must
 * not wait for the peers' closing exchange (they may be gone).  Rank 1
 * marks its second channel failed, as a write's error completion would,
 * and destroys at once; rank 0 destroys only 2 s later, when rank 1
 * must have returned (an exchange would have waited for rank 0), and
 * then finds rank 1 gone. */
static int destroy_err_rank(int rank, int size, void *arg)
{
	struct timespec ts = { 0, 100000000L };
	fabep_comm_t *comm;
	uint64_t t0, ms;
	int ret;

	(void)size;
	(void)arg;
	setenv("FABEP_TIMEOUT_MS", "3000", 1);
	ret = make_comm_chan(FABEP_SIGNAL_CMA, 1u << 20, "2", 1, &comm);
	if (ret == -FABEP_ERR_NO_SIGNAL)
		return 77;
	if (!ret)
		ret = fabep_barrier(comm);
	if (ret) {
		fprintf(stderr, "rank %d: set-up: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	if (rank == 0) {
		struct timespec late = { 2, 0 };

		nanosleep(&late, NULL);
		(void)fabep_comm_destroy(comm);  /* the peer is gone: an error */
		return 0;
	}
	nanosleep(&ts, NULL);
	comm->fab->chan[1]->tx_error = -FABEP_ERR_PEER_LOST;
	t0 = fep_now_ns();
	ret = fabep_comm_destroy(comm);
	ms = (fep_now_ns() - t0) / 1000000;
	if (ret || ms >= 1500) {
		fprintf(stderr, "rank 1: destroy after a channel's error: %s "
			"after %llu ms\n", fabep_strerror(ret), (unsigned long long)ms);
		return 1;
	}
	return 0;
}

/* fn on 2 ranks over shm with the cma strategy (exit 77: not offered) */
static void run_cma_pair(fep_test_rank_fn fn)
{
	int status[2], r;

	fep_test_on_provider("shm");
	(void)fep_test_run_ranks_status(2, 60, fn, NULL, status);
	if (status[0] == 77 || status[1] == 77)
		fep_test_skip("shm does not offer signal strategy cma");
	for (r = 0; r < 2; r++)
		ck_assert_msg(status[r] == 0, "rank %d exited %d: %s", r,
			      status[r], fep_test_rank_said(r));
}

START_TEST(destroy_chan_error)
{
	run_cma_pair(destroy_err_rank);
}
END_TEST

START_TEST(reap_channels)
{
	run_cma_pair(reap_rank);
}
END_TEST

/*
 * One thread of rank 0 drives progress (and posts the acknowledgements),
 * another only reads the counter and then the data: rank 1's put of
 * each round, which lands inside the first thread's progress, must be
 * there in full when the second sees the count.  Under ThreadSanitizer
 * the tool must see that order too (FEP_TSAN in fabric.h): without it,
 * every strategy whose add libfabric applies reports a race here.
 */
#define XT_ROUNDS 200
#define XT_LEN 2048     /* within shm's inject size: copied by progress */

struct xthread {
	fabep_comm_t *comm;
	fabep_off_t ack, src;
	atomic_int stop, acks, sent, err;
};

static void *xthread_progress(void *arg)
{
	struct xthread *x = arg;
	int ret;

	while (!atomic_load(&x->stop)) {
		ret = fabep_progress(x->comm);
		while (!ret && atomic_load(&x->sent) < atomic_load(&x->acks)) {
			ret = fabep_put_signal(x->comm, 1, x->ack, x->src, 0,
					       x->ack, 1);
			atomic_fetch_add(&x->sent, 1);
		}
		if (ret) {
			atomic_store(&x->err, ret);
			break;
		}
	}
	return NULL;
}

static int xthread_rank(int rank, int size, void *arg)
{
	static struct xthread x;
	fabep_off_t data, ctr;
	uint8_t *d;
	int i, j, ret;
	pthread_t t;

	(void)size;
	(void)arg;
	if ((ret = make_comm(FABEP_SIGNAL_AUTO, 1u << 20, &x.comm)) ||
	    (ret = fabep_heap_alloc(x.comm, XT_LEN, 64, &data)) ||
	    (ret = fabep_heap_alloc(x.comm, XT_LEN, 64, &x.src)) ||
	    (ret = fabep_heap_alloc(x.comm, 8, 8, &ctr)) ||
	    (ret = fabep_heap_alloc(x.comm, 8, 8, &x.ack)) ||
	    (ret = fabep_barrier(x.comm))) {
		fprintf(stderr, "rank %d: setup: %s\n", rank, fabep_strerror(ret));
		return 2;
	}
	d = fabep_heap_ptr(x.comm, rank ? x.src : data);
	if (rank == 1) {
		for (i = 1; i <= XT_ROUNDS; i++) {
			memset(d, i & 0xff, XT_LEN);
			if ((ret = fabep_put_signal(x.comm, 0, data, x.src, XT_LEN,
						    ctr, 1)) ||
			    (ret = fabep_flush(x.comm)) ||
			    (ret = fabep_wait(x.comm, x.ack, (uint64_t)i))) {
				fprintf(stderr, "rank 1 round %d: %s\n", i,
					fabep_strerror(ret));
				return 3;
			}
		}
	} else {
		if (pthread_create(&t, NULL, xthread_progress, &x))
			return 4;
		for (i = 1; i <= XT_ROUNDS && !atomic_load(&x.err); i++) {
			while (fabep_counter_read(x.comm, ctr) < (uint64_t)i &&
			       !atomic_load(&x.err))
				sched_yield();
			for (j = 0; j < XT_LEN; j++)
				if (d[j] != (i & 0xff)) {
					fprintf(stderr, "round %d: byte %d is %d\n",
						i, j, d[j]);
					atomic_store(&x.err, -EIO);
					break;
				}
			atomic_fetch_add(&x.acks, 1);
		}
		while (atomic_load(&x.sent) < XT_ROUNDS && !atomic_load(&x.err))
			sched_yield();
		atomic_store(&x.stop, 1);
		pthread_join(t, NULL);
		if ((ret = atomic_load(&x.err))) {
			fprintf(stderr, "rank 0: %s\n", fabep_strerror(ret));
			return 5;
		}
	}
	if ((ret = fabep_barrier(x.comm))) {
		fprintf(stderr, "rank %d: barrier: %s\n", rank, fabep_strerror(ret));
		return 6;
	}
	return fabep_comm_destroy(x.comm) ? 7 : 0;
}

START_TEST(progress_thread)
{
	fabep_signal_t sig;
	const char *prov = fep_test_signal_case(_i, &sig);

	(void)prov;
	fep_test_ranks_ok(2, 60, xthread_rank, NULL);
}
END_TEST

/* rank 1 asks for 3 channels, the others for 2: refused on every rank */
static int chan_mismatch_rank(int rank, int size, void *arg)
{
	setenv("FABEP_CHANNELS", rank == 1 ? "3" : "2", 1);
	(void)size;
	return bad_env_rank(rank, size, arg);
}

START_TEST(channels_bad)
{
	static const char *bad[] = { "0", "17", "two", "-1" };
	int expect = -EINVAL, mismatch = -FABEP_ERR_MISMATCH;
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("FABEP_CHANNELS", bad[i], 1);
		ck_assert_msg(fep_test_run_ranks(1, 30, bad_env_rank, &expect) == 0,
			      "FABEP_CHANNELS=%s accepted: %s", bad[i],
			      fep_test_ranks_failed());
	}
	unsetenv("FABEP_CHANNELS");
	if (fep_test_have_provider("shm")) {
		fep_test_use_provider("shm");
		fep_test_ranks_ok(3, 30, chan_mismatch_rank, &mismatch);
	}
}
END_TEST

static int args_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm;
	fabep_off_t off, ctr;
	int ret = make_comm(FABEP_SIGNAL_AUTO, 1u << 20, &comm);

	if (ret)
		return 1;
	if (fabep_heap_alloc(comm, 64, 8, &off) || fabep_heap_alloc(comm, 8, 8, &ctr))
		return 2;
	if (fabep_put(comm, size, off, off, 8) != -EINVAL) return 3;
	if (fabep_put(comm, -1, off, off, 8) != -EINVAL) return 4;
	if (fabep_put(comm, 0, fabep_heap_size(comm) - 4, off, 8) != -ERANGE) return 5;
	if (fabep_get(comm, size, off, off, 8) != -EINVAL) return 17;
	if (fabep_get(comm, -1, off, off, 8) != -EINVAL) return 18;
	if (fabep_get(comm, 0, off, fabep_heap_size(comm) - 4, 8) != -ERANGE) return 19;
	if (fabep_get(comm, 0, fabep_heap_size(comm) - 4, off, 8) != -ERANGE) return 20;
	if (fabep_get(comm, 0, off, off, SIZE_MAX) != -ERANGE) return 21;
	if (fabep_get(NULL, 0, off, off, 8) != -EINVAL) return 22;
	if (fabep_put_signal(comm, 0, off, off, 8, ctr + 4, 1) != -EINVAL) return 6;
	if (fabep_put_signal(comm, 0, off, off, 8, ctr, 0) != -EINVAL) return 7;
	if (fabep_wait(comm, ctr + 1, 1) != -EINVAL) return 8;
	if (fabep_heap_alloc(comm, 1ull << 40, 8, &off) != -FABEP_ERR_HEAP_FULL) return 9;
	if (fabep_heap_alloc(comm, 8, 3, &off) != -EINVAL) return 10;
	if (fabep_heap_ptr(comm, fabep_heap_size(comm)) != NULL) return 11;
	/* the communicator's own words (offset 0) are not the caller's */
	if (off == 0 || fabep_get(comm, 0, off, 0, 8) != -ERANGE) return 23;
	if (fabep_barrier(NULL) != -EINVAL) return 12;
	/* still usable after all that */
	if (fabep_barrier(comm)) return 13;
	if (fabep_comm_rank(comm) != rank || fabep_comm_size(comm) != size) return 14;
	if (!fabep_comm_provider(comm) || !fabep_comm_domain(comm)) return 15;
	return fabep_comm_destroy(comm) ? 16 : 0;
}

FEP_TEST_RANKS_CASE(bad_args, "shm", 2, 60, args_rank, NULL)

START_TEST(strerror_all)
{
	int e;

	for (e = FABEP_ERR_BASE + 1; e < FABEP_ERR_LAST; e++) {
		ck_assert_ptr_nonnull(fabep_strerror(-e));
		ck_assert_str_ne(fabep_strerror(-e), "unknown error");
	}
	ck_assert_str_eq(fabep_strerror(0), "success");
	ck_assert_ptr_nonnull(strstr(fabep_strerror(-ETIMEDOUT), "timed out"));
	ck_assert_str_eq(fabep_strerror(-FABEP_ERR_LAST - 5), "unknown error");
}
END_TEST

/* Address and key exchange: what a peer publishes is validated. */
START_TEST(blob_exchange)
{
	struct fep_fab_params p = { 0 };
	struct fep_fab_blob blobs[2], b;
	fep_fabric_t *fab;
	int ret;

	fep_test_need_provider("shm");
	p.provider = "shm";
	p.all_local = true;
	p.rank = 0;
	p.size = 2;
	p.timeout_ms = 2000;
	p.heap_size = 1 << 20;
	p.numa_node = -1;
	ret = fep_fabric_open(&p, &fab);
	ck_assert_msg(ret == 0, "open: %s", fabep_strerror(ret));
	ck_assert_int_eq(fep_fabric_blob(fab, &b), 0);
	ck_assert_uint_gt(b.name_len, 0);
	ck_assert_uint_eq(b.heap_size, fab->heap_size);

	blobs[0] = blobs[1] = b;
	blobs[1].magic ^= 1;
	ck_assert_int_eq(fep_fabric_connect(fab, blobs), -FABEP_ERR_PROTOCOL);
	blobs[1] = b;
	blobs[1].name_len = sizeof(b.name) + 1;
	ck_assert_int_eq(fep_fabric_connect(fab, blobs), -FABEP_ERR_PROTOCOL);
	blobs[1] = b;
	blobs[1].raw_key_len = sizeof(b.raw_key) + 1;
	ck_assert_int_eq(fep_fabric_connect(fab, blobs), -FABEP_ERR_PROTOCOL);
	blobs[1] = b;
	blobs[1].heap_size += 4096;
	ck_assert_int_eq(fep_fabric_connect(fab, blobs), -FABEP_ERR_MISMATCH);
	blobs[1] = b;
	blobs[1].signal = b.signal == FABEP_SIGNAL_CQDATA ? FABEP_SIGNAL_DELIVERY
							  : FABEP_SIGNAL_CQDATA;
	ck_assert_int_eq(fep_fabric_connect(fab, blobs), -FABEP_ERR_MISMATCH);
	fep_fabric_close(fab);

	/* a fresh fabric takes the good pair; keys and bases are recorded */
	ret = fep_fabric_open(&p, &fab);
	ck_assert_int_eq(ret, 0);
	ck_assert_int_eq(fep_fabric_blob(fab, &b), 0);
	blobs[0] = blobs[1] = b;
	ck_assert_int_eq(fep_fabric_connect(fab, blobs), 0);
	ck_assert_uint_eq(fab->peers[1].key, b.key);
	ck_assert_uint_eq(fab->peers[1].base,
			  (fab->mr_mode & FI_MR_VIRT_ADDR) ? b.heap_base : 0);
	fep_fabric_close(fab);
}
END_TEST

/* Agreement rounds back to back, nothing else between them: each rank
 * gets the agreed status of every round (a peer's error as
 * -FABEP_ERR_PEER, its own as itself), while the last rank, never held
 * up, runs a round ahead of rank 0, which pauses before some rounds and
 * yields inside others.  A rank that starts its next round may write its
 * next slot before a slower peer has read this one. */
static int agree_rank(int rank, int size, void *arg)
{
	fabep_comm_t *comm;
	int i, ret, want, rc = 0;

	(void)arg;
	ret = make_comm(FABEP_SIGNAL_AUTO, 1 << 20, &comm);
	if (ret) {
		fprintf(stderr, "rank %d: comm: %s\n", rank, fabep_strerror(ret));
		return 1;
	}
	for (i = 0; i < 3000 && !rc; i++) {
		int st = i % 97 == 3 && rank == size - 1 ? -EINVAL : 0;

		if (rank == 0 && i % 5 == 0) {
			struct timespec ts = { 0, 20000L * (i % 3) };

			nanosleep(&ts, NULL);
		}
		ret = fep_comm_agree(comm, st);
		want = st ? st : i % 97 == 3 ? -FABEP_ERR_PEER : 0;
		if (ret != want) {
			fprintf(stderr, "rank %d round %d: %d (%s), want %d\n", rank,
				i, ret, fabep_strerror(ret), want);
			rc = 1;
		}
	}
	/* the last round, then at once the destroy's own */
	ret = fabep_comm_destroy(comm);
	return rc ? rc : ret ? 1 : 0;
}

START_TEST(shm_agree_rounds)
{
	fep_test_on_provider("shm");
	fep_test_ranks_ok(2, 120, agree_rank, NULL);
	fep_test_ranks_ok(3, 120, agree_rank, NULL);
}
END_TEST

/* Handle blocks (fep_hb_*) against a model, three ranks' tables side by
 * side: random creations, and destroys on random subsets of the ranks (one
 * in twenty after a failure), in episodes of 300 steps on a fresh 4 MiB
 * heap.  After every creation every rank has the same table, heap end and
 * answer; a new block lies in the heap and overlaps only handles that
 * every rank gave back cleanly (what is left of those stays free); and it
 * fails exactly when the model finds no run of such space (with the
 * heap's unused end) as long as the block. */
#define HB_R 3
struct hb_model {
	uint64_t off, size;
	int state[HB_R];     /* FEP_HB_*, per rank */
	int gone;            /* its space went to a later block */
};

static int hb_free_all(const struct hb_model *h)
{
	int r;

	for (r = 0; r < HB_R; r++)
		if (h->state[r] != FEP_HB_FREE)
			return 0;
	return 1;
}

/* The longest run of space every rank gave back (the heap's unused end
 * included), and the heap's end, from the model alone. */
static uint64_t hb_best_run(const struct hb_model *h, int nh, uint64_t base,
			    uint64_t heap, uint64_t *top)
{
	uint64_t best = 0, run = 0, end = 0;
	int i;

	*top = base;
	for (i = 0; i < nh; i++)
		if (!h[i].gone && h[i].off + h[i].size > *top)
			*top = h[i].off + h[i].size;
	for (i = 0; i < nh; i++) {  /* h[] is in offset order */
		if (h[i].gone)
			continue;
		if (!hb_free_all(&h[i])) {
			run = 0;
			continue;
		}
		run = run && end == h[i].off ? run + h[i].size : h[i].size;
		end = h[i].off + h[i].size;
		best = FEP_MAX(best, end == *top ? run + heap - *top : run);
	}
	return FEP_MAX(best, heap - *top);
}

/* Insert at its offset (h[] in offset order). */
static void hb_add(struct hb_model *h, int *nh, uint64_t off, uint64_t size,
		   int state)
{
	int i, r;

	for (i = *nh; i > 0 && h[i - 1].off > off; i--)
		h[i] = h[i - 1];
	memset(&h[i], 0, sizeof(h[i]));
	h[i].off = off;
	h[i].size = size;
	for (r = 0; r < HB_R; r++)
		h[i].state[r] = state;
	(*nh)++;
}

START_TEST(heap_blocks_model)
{
	const uint64_t heap = 4u << 20, base = 4096;
	fep_fabric_t fab[HB_R];
	static struct hb_model h[2048];
	uint64_t seed = 0x5eedull;
	int nh, step, ep, r, reuses = 0, fulls = 0, splits = 0, kept = 0;

	memset(fab, 0, sizeof(fab));
	for (r = 0; r < HB_R; r++) {
		fab[r].heap_size = heap;
		fab[r].hb = calloc(FEP_HB_MAX, sizeof(*fab[r].hb));
		ck_assert_ptr_nonnull(fab[r].hb);
	}
	for (ep = 0; ep < 40; ep++) {
		for (r = 0; r < HB_R; r++) {
			fab[r].heap_used = base;
			fab[r].nhb = 0;
		}
		nh = 0;
		for (step = 0; step < 300; step++) {
			struct fep_hb_hello hello[HB_R], and_;
			uint64_t size, want, off[HB_R], top, best, lo, hi;
			bool reused[HB_R];
			int ret[HB_R], live = 0, i, j;

			for (i = 0; i < nh; i++)
				live += !h[i].gone;
			if (live && fep_test_rand(&seed) % 2) {  /* a destroy */
				int pick = (int)(fep_test_rand(&seed) % (uint64_t)live);

				for (i = 0; i < nh; i++)
					if (!h[i].gone && !pick--)
						break;
				for (r = 0; r < HB_R; r++) {
					if (h[i].state[r] != FEP_HB_LIVE ||
					    fep_test_rand(&seed) % 3 == 0)
						continue;  /* later, on this rank */
					h[i].state[r] = fep_test_rand(&seed) % 20 ?
							FEP_HB_FREE : FEP_HB_KEPT;
					kept += h[i].state[r] == FEP_HB_KEPT;
					fep_hb_free(&fab[r], h[i].off,
						    h[i].state[r] == FEP_HB_FREE);
				}
				continue;
			}
			size = 64 + fep_test_rand(&seed) % (600u << 10);
			want = FEP_ALIGN_UP(size, 64);
			best = hb_best_run(h, nh, base, heap, &top);
			ck_assert_uint_eq(fab[0].heap_used, top);
			ck_assert_int_lt(fab[0].nhb, FEP_HB_MAX - 2);
			for (r = 0; r < HB_R; r++)
				fep_hb_hello(&fab[r], &hello[r]);
			for (r = 0; r < HB_R; r++) {
				ck_assert_int_eq(fep_hb_agree("model", HB_R, hello,
							      sizeof(hello[0]), &and_), 0);
				ret[r] = fep_hb_alloc(&fab[r], &and_, size, &off[r],
						      &reused[r]);
			}
			for (r = 1; r < HB_R; r++) {
				ck_assert_int_eq(ret[r], ret[0]);
				ck_assert_uint_eq(fab[r].heap_used, fab[0].heap_used);
				ck_assert_int_eq(fab[r].nhb, fab[0].nhb);
				for (j = 0; j < fab[0].nhb; j++) {
					ck_assert_uint_eq(fab[r].hb[j].off, fab[0].hb[j].off);
					ck_assert_uint_eq(fab[r].hb[j].size, fab[0].hb[j].size);
				}
				if (!ret[0]) {
					ck_assert_uint_eq(off[r], off[0]);
					ck_assert_int_eq(reused[r], reused[0]);
				}
			}
			if (ret[0]) {
				ck_assert_int_eq(ret[0], -FABEP_ERR_HEAP_FULL);
				ck_assert_msg(best < want, "episode %d step %d: %llu "
					      "bytes refused, a run of %llu was free",
					      ep, step, (unsigned long long)want,
					      (unsigned long long)best);
				fulls++;
				continue;
			}
			ck_assert_msg(best >= want, "episode %d step %d: a block "
				      "where the model has no room", ep, step);
			ck_assert_uint_ge(off[0], base);
			ck_assert_uint_le(off[0] + want, heap);
			/* what it overlaps: given back everywhere, and gone */
			lo = off[0];
			hi = off[0] + want;
			for (i = 0; i < nh; i++) {
				if (h[i].gone || off[0] >= h[i].off + h[i].size ||
				    h[i].off >= off[0] + want)
					continue;
				ck_assert_msg(hb_free_all(&h[i]), "episode %d step %d: "
					      "the new block overlaps a handle not "
					      "given back everywhere", ep, step);
				lo = FEP_MIN(lo, h[i].off);
				hi = FEP_MAX(hi, h[i].off + h[i].size);
				h[i].gone = 1;
				reuses++;
			}
			ck_assert_uint_eq(lo, off[0]);
			ck_assert_int_eq(reused[0], off[0] < top);
			for (j = 0; j < fab[0].nhb && fab[0].hb[j].off != off[0]; j++)
				;
			ck_assert_int_lt(j, fab[0].nhb);
			ck_assert_uint_eq(fab[0].hb[j].size, want);
			hb_add(h, &nh, off[0], want, FEP_HB_LIVE);
			if (hi > off[0] + want && off[0] + want < top) {
				hb_add(h, &nh, off[0] + want,
				       FEP_MIN(hi, top) - off[0] - want, FEP_HB_FREE);
				splits++;
			}
			ck_assert_int_lt(nh, 2048);
		}
	}
	/* the runs did what they are for */
	ck_assert_int_gt(reuses, 100);
	ck_assert_int_gt(fulls, 100);
	ck_assert_int_gt(splits, 50);
	ck_assert_int_gt(kept, 20);
	for (r = 0; r < HB_R; r++)
		free(fab[r].hb);
}
END_TEST

/* Past FEP_HB_MAX blocks, new ones work but are never reused: one rank,
 * 300 blocks of 64 bytes, all given back; then 300 more: the first 256
 * land in the tracked space again (merged into one block and split), the
 * rest come from the heap's end. */
START_TEST(heap_blocks_table_full)
{
	fep_fabric_t fab;
	struct fep_hb_hello hello, and_;
	uint64_t off[300], top;
	bool reused;
	int i;

	memset(&fab, 0, sizeof(fab));
	fab.heap_size = 1u << 20;
	fab.heap_used = 4096;
	fab.hb = calloc(FEP_HB_MAX, sizeof(*fab.hb));
	ck_assert_ptr_nonnull(fab.hb);
	for (i = 0; i < 300; i++) {
		fep_hb_hello(&fab, &hello);
		ck_assert_int_eq(fep_hb_agree("full", 1, &hello, sizeof(hello), &and_), 0);
		ck_assert_int_eq(fep_hb_alloc(&fab, &and_, 64, &off[i], &reused), 0);
		ck_assert(!reused);
		ck_assert_uint_eq(off[i], 4096 + 64 * (uint64_t)i);
	}
	ck_assert_int_eq(fab.nhb, FEP_HB_MAX);
	top = fab.heap_used;
	for (i = 0; i < 300; i++)
		fep_hb_free(&fab, off[i], true);  /* past 256: nothing to free */
	for (i = 0; i < 300; i++) {
		fep_hb_hello(&fab, &hello);
		ck_assert_int_eq(fep_hb_agree("full", 1, &hello, sizeof(hello), &and_), 0);
		ck_assert_int_eq(fep_hb_alloc(&fab, &and_, 64, &off[i], &reused), 0);
		if (i < FEP_HB_MAX) {
			ck_assert(reused);
			ck_assert_uint_eq(off[i], 4096 + 64 * (uint64_t)i);
		} else {
			ck_assert_uint_eq(off[i], top + 64 * (uint64_t)(i - FEP_HB_MAX));
		}
	}
	free(fab.hb);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("signal");
	TCase *tc;

	tc = tcase_create("shm");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, shm_cqdata);
	tcase_add_test(tc, shm_ordered);
	tcase_add_test(tc, shm_delivery);
	tcase_add_test(tc, shm_fence);
	tcase_add_test(tc, shm_cma);
	suite_add_tcase(s, tc);

	tc = tcase_create("tcp");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, tcp_cqdata);
	tcase_add_test(tc, tcp_delivery);
	tcase_add_test(tc, tcp_ordered);
	tcase_add_test(tc, tcp_fence);
	suite_add_tcase(s, tc);

	tc = tcase_create("sockets");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, sockets_fence);
	tcase_add_test(tc, sockets_ordered);
	tcase_add_test(tc, sockets_cqdata);
	tcase_add_test(tc, sockets_delivery);
	suite_add_tcase(s, tc);

	tc = tcase_create("udp_net");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, udp_cqdata);
	tcase_add_test(tc, udp_ordered);
	tcase_add_test(tc, udp_delivery);
	tcase_add_test(tc, udp_fence);
	tcase_add_test(tc, net_cqdata);
	suite_add_tcase(s, tc);

	tc = tcase_create("channels");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, shm_chan4);
	tcase_add_test(tc, shm_chan3_one_thread);
	tcase_add_test(tc, shm_chan_ordered);
	tcase_add_test(tc, shm_cma_chan4);
	tcase_add_test(tc, shm_cma_chan3_threads);
	tcase_add_test(tc, shm_cma_slices);
	tcase_add_test(tc, tcp_chan2);
	tcase_add_test(tc, channels_bad);
	tcase_add_test(tc, channels_rescue);
	tcase_add_test(tc, channels_default);
	tcase_add_test(tc, channels_crowded);
	tcase_add_test(tc, reap_channels);
	tcase_add_test(tc, destroy_chan_error);
	suite_add_tcase(s, tc);

	/* every strategy of every provider */
	tc = tcase_create("threads");
	tcase_set_timeout(tc, 120);
	fep_test_add_signal_cases(tc, progress_thread);
	suite_add_tcase(s, tc);

	tc = tcase_create("heap");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, shm_reads);
	tcase_add_test(tc, gets_shm);
	tcase_add_test(tc, gets_shm_cqdata);
	tcase_add_test(tc, gets_shm_ordered);
	tcase_add_test(tc, gets_shm_delivery);
	tcase_add_test(tc, gets_shm_cma);
	tcase_add_test(tc, gets_tcp);
	tcase_add_test(tc, gets_sockets);
	tcase_add_test(tc, gets_udp);
	tcase_add_test(tc, gets_net);
	tcase_add_test(tc, joined_shm);
	tcase_add_test(tc, joined_shm_chan);
	tcase_add_test(tc, joined_tcp);
	tcase_add_test(tc, joined_tcp_chan);
	tcase_add_test(tc, joined_udp);
	tcase_add_test(tc, joined_net);
	tcase_add_test(tc, heap_blocks_model);
	tcase_add_test(tc, heap_blocks_table_full);
	tcase_add_test(tc, shm_agree_rounds);
	tcase_add_test(tc, barrier_order);
	suite_add_tcase(s, tc);

	tc = tcase_create("failures");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, killed_shm);
	tcase_add_test(tc, killed_tcp);
	tcase_add_test(tc, killed_udp);
	tcase_add_test(tc, killed_net);
	tcase_add_test(tc, get_killed_shm);
	tcase_add_test(tc, get_killed_tcp);
	tcase_add_test(tc, get_killed_udp);
	tcase_add_test(tc, shm_cleanup);
	tcase_add_test(tc, bad_provider);
	tcase_add_test(tc, bad_signal);
	tcase_add_test(tc, numa_node_env);
	tcase_add_test(tc, queue_warmup);
	tcase_add_test(tc, cpus_crowd);
	tcase_add_test(tc, cpus_own_cores);
	tcase_add_test(tc, unsupported_signal);
	tcase_add_test(tc, cma_conditions);
	tcase_add_test(tc, cqdata_delivery);
	tcase_add_test(tc, comm_abort);
	tcase_add_test(tc, choose_cluster_providers);
	tcase_add_test(tc, bad_args);
	tcase_add_test(tc, strerror_all);
	tcase_add_test(tc, blob_exchange);
	tcase_add_test(tc, peer_leaves_after_signal);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return fep_test_run_suite(suite());
}
