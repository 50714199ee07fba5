/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * harness.h - helpers for multi-rank tests: ranks are forked processes
 * that bootstrap through the TCP rendezvous on 127.0.0.1.
 */
#ifndef FEP_TEST_HARNESS_H
#define FEP_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <check.h>

#include "fabep.h"
#include "util/rand.h"

/* A rank's body: return 0 on success, anything else is a failure. */
typedef int (*fep_test_rank_fn)(int rank, int size, void *arg);

/*
 * Fork `size` ranks.  Each child gets FABEP_RANK, FABEP_WORLD_SIZE and
 * FABEP_ROOT=127.0.0.1:<a free port> in its environment (plus whatever the
 * parent has, e.g. FABEP_PROVIDER), runs fn(rank, size, arg) and exits with
 * its return value (clamped to 0..255; a nonzero return is printed).
 * After timeout_s seconds every child still running is killed with
 * SIGKILL and the run fails with a message naming those ranks.
 * Returns 0 when every rank exited 0, else -1 (all reasons printed).
 * The parent must hold no libfabric resources.
 */
int fep_test_run_ranks(int size, int timeout_s, fep_test_rank_fn fn, void *arg);

/* Why the last fep_test_run_ranks failed: each failed rank's status and
 * last line of stderr (fep_test_rank_said), or "" after a run that
 * passed. */
const char *fep_test_ranks_failed(void);

/* Assert that fep_test_run_ranks(...) passes, saying why where not. */
#define fep_test_ranks_ok(size, timeout_s, fn, arg)                        \
	ck_assert_msg(fep_test_run_ranks(size, timeout_s, fn, arg) == 0, "%s", \
		      fep_test_ranks_failed())

/* Like fep_test_run_ranks, but exit statuses are stored in status[size]
 * (exit code, or 128 + signal) instead of being judged. */
int fep_test_run_ranks_status(int size, int timeout_s, fep_test_rank_fn fn,
			      void *arg, int *status);

/* The last line rank `rank` of the last run wrote to stderr, besides the
 * harness's own ("" when none): for the test's failure message. */
const char *fep_test_rank_said(int rank);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int fep_test_free_port(void);

/*
 * Whether libfabric offers provider `prov` with FI_RMA here (probed in a
 * forked child so the caller holds no libfabric state).  When not, prints
 * "SKIP: <reason>" once to stderr and returns 0.
 */
int fep_test_have_provider(const char *prov);

/*
 * Skipping.  A case that cannot run here ends with fep_test_skip(fmt,
 * ...) (a format string literal): fep_test_run_suite reports it as
 * "ok N - case # SKIP reason" in its TAP output, which automake's
 * tap-driver.sh counts as a skip, never as a pass.  Only in the test's
 * own process (Check's), not in a rank: a rank returns 77 and the test
 * calls fep_test_skip.
 */
#define FEP_TEST_SKIP_MARK "fep-test-skip: "
#define fep_test_skip(...) ck_abort_msg(FEP_TEST_SKIP_MARK __VA_ARGS__)

/* Skip the case unless fep_test_have_provider(prov). */
void fep_test_need_provider(const char *prov);

/*
 * The signal strategies fabep offers with provider `prov` here, into
 * *mask: the `signals` bitmask of fabep_provider_list's entries for it,
 * AND-ed (every domain offers them; 0 when the provider is missing).
 * Probed in a forked child.  0, or -1 when the probe failed (logged).
 */
int fep_test_signals(const char *prov, unsigned *mask);

/*
 * Every strategy of fabep_signal_t besides AUTO, in order, from the
 * library's names (so a strategy added to the enum is picked up): fills
 * out[max], returns the count.
 */
int fep_test_signal_list(fabep_signal_t *out, int max);

/*
 * Skip the case unless `prov` is here and fabep offers `sig` with it;
 * else set FABEP_PROVIDER (fep_test_use_provider) and FABEP_SIGNAL.
 */
void fep_test_use_signal(const char *prov, fabep_signal_t sig);

/*
 * Add test t to tc once per provider of fep_test_providers and strategy
 * of fep_test_signal_list, named "<t>_<provider>_<strategy>"; each runs
 * with _i its index, which fep_test_signal_case turns into its provider
 * and strategy, setting them up (or skipping the case).
 */
void fep_test_add_signal_cases(TCase *tc, const TTest *t);
const char *fep_test_signal_case(int i, fabep_signal_t *sig);

/* The providers the strategy loops run on, and how many. */
extern const char *const fep_test_providers[];
#define FEP_TEST_NPROVIDERS 5

/* The largest number of strategies fep_test_signal_list returns. */
#define FEP_TEST_MAX_SIGNALS 16

/* Set FABEP_PROVIDER (and the provider tuning the tests need, such as
 * FI_SOCKETS_PE_WAITTIME=0 for sockets) in this process's environment. */
void fep_test_use_provider(const char *prov);

/* Skip the case unless `prov` is here (fep_test_need_provider), else
 * use it (fep_test_use_provider). */
void fep_test_on_provider(const char *prov);

/* A case that runs fn(rank, size, arg) on `size` forked ranks of
 * provider prov, skipped where prov is missing (fep_test_on_provider),
 * failing as fep_test_ranks_ok. */
#define FEP_TEST_RANKS_CASE(name, prov, size, timeout_s, fn, arg)          \
	START_TEST(name)                                                   \
	{                                                                  \
		fep_test_on_provider(prov);                                \
		fep_test_ranks_ok(size, timeout_s, fn, arg);               \
	}                                                                  \
	END_TEST

/* Worker threads per rank for a test that does not ask for a number:
 * FEP_TEST_THREADS (1-64; CI's ThreadSanitizer run sets 2, so that every
 * multi-rank case runs its kernels on a pool), else dflt. */
int fep_test_threads(int dflt);

/* verbs' and efa's remote CQ data, 4 bytes (24 bits of counter index,
 * the heap's first 128 MiB), for the communicators this process creates
 * from now on; a heap FEP_TEST_CQ4_FILLER bytes larger lets
 * fep_test_cq4_filler take a block that puts every later handle's block
 * past what they name.  The filler: 0, or 1 with a message. */
/* Before fabep_comm_create: this rank's fabric as a cluster provider
 * would give it, on shm, tcp and sockets: registered local buffers
 * required (mr_local: FI_MR_LOCAL, as verbs and efa), a heap key of its
 * own (own_key: as provider keys differ between ranks), messages of at
 * most msg_max bytes (0: the provider's max_msg_size), writes of at most
 * iov_max local pieces (0: the provider's iov_limit). */
void fep_test_emulate(int rank, int mr_local, int own_key, size_t msg_max,
		      size_t iov_max);

#define FEP_TEST_CQ4_FILLER ((size_t)160 << 20)
void fep_test_cq4(void);
int fep_test_cq4_filler(fabep_comm_t *comm, int rank);

/* Deterministic per-rank random numbers. */
/* Whether the kernel has transparent huge pages (madvise(MADV_HUGEPAGE)
 * can take effect). */
int fep_test_have_thp(void);

/* The VmFlags of the mapping in /proc/self/smaps that holds p: 1 where
 * they have "hg" (advised MADV_HUGEPAGE), 0 where not, -1 where smaps
 * says nothing of it (no such file, no VmFlags line). */
int fep_test_smaps_hg(const void *p);

/* LeakSanitizer's check now, in a rank that wants it before its end
 * (the harness checks at every rank's end): nonzero where memory
 * leaked, reported on stderr.  0 without --enable-sanitizers. */
int fep_test_leak_check(void);

#define fep_test_rand fep_xorshift

/*
 * Run every test of s, free it, and print the results in TAP on stdout
 * (one line per case, skips marked "# SKIP", failures with Check's
 * message, then a "# Checks: ..." summary); returns 0 when none failed,
 * else 1 (main's status).  The automake harness reads it through
 * tap-driver.sh.
 */
int fep_test_run_suite(Suite *s);

/*
 * _exit for a forked child (a rank, a probe).  In a build configured
 * with --enable-coverage it first writes the child's coverage counters,
 * which _exit would drop: the ranks run most of the library's code.
 */
#ifdef FEP_COVERAGE
void __gcov_dump(void);
#endif
static inline void fep_test_exit(int rc)
{
#ifdef FEP_COVERAGE
	__gcov_dump();
#endif
	_exit(rc);
}

#endif
