/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * harness.h - helpers for multi-rank tests: ranks are forked processes
 * that bootstrap through the TCP rendezvous on 127.0.0.1.
 */
#ifndef FEP_TEST_HARNESS_H
#define FEP_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <check.h>

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

/* Like fep_test_run_ranks, but exit statuses are stored in status[size]
 * (exit code, or 128 + signal) instead of being judged. */
int fep_test_run_ranks_status(int size, int timeout_s, fep_test_rank_fn fn,
			      void *arg, int *status);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int fep_test_free_port(void);

/*
 * Whether libfabric offers provider `prov` with FI_RMA here (probed in a
 * forked child so the caller holds no libfabric state).  When not, prints
 * "SKIP: <reason>" once to stderr and returns 0.
 */
int fep_test_have_provider(const char *prov);

/* Set FABEP_PROVIDER (and the provider tuning the tests need, such as
 * FI_SOCKETS_PE_WAITTIME=0 for sockets) in this process's environment. */
void fep_test_use_provider(const char *prov);

/* Worker threads per rank for a test that does not ask for a number:
 * FEP_TEST_THREADS (1-64; CI's ThreadSanitizer run sets 2, so that every
 * multi-rank case runs its kernels on a pool), else dflt. */
int fep_test_threads(int dflt);

/* Deterministic per-rank random numbers. */
#define fep_test_rand fep_xorshift

/* Run every test of s, free it; 0 when all passed, else 1 (main's status). */
int fep_test_run_suite(Suite *s);

#endif
