/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_inject.c - what every rank sees when a libfabric call or a system
 * resource fails on one rank, as real providers and exhausted machines
 * fail them (verbs' fi_mr_reg past RLIMIT_MEMLOCK, fi_endpoint past the
 * queue pairs a device has, a failed mmap or pthread_create): shm, tcp
 * and sockets never fail them here, so the step fails by injection
 * (fep_test_fault, util.h) on rank 1 of 3.
 *
 * Creation: for each step of fabep_comm_create that can fail (every
 * libfabric call, the heap's mapping and registration, the pool's
 * threads, a second channel's endpoint), the failing rank gets the
 * step's own error and the others -FABEP_ERR_PEER with a message naming
 * rank 1, within a bound and without leaks (LeakSanitizer, with
 * --enable-sanitizers); the fault must have been reached.  Then all
 * three create a communicator again in the same processes and run an
 * allreduce checked against its sum.
 *
 * Transfers: a post (fi_writemsg, fi_atomic) or a completion queue read
 * that fails on rank 1 during a dispatch and combine, an allreduce or a
 * put with a signal, under each strategy that posts it, and on the
 * allreduce's log-step path (4 ranks).  Rank 1's call returns that error
 * at once, and so do its next calls, saying that the communicator is
 * unusable (what the post was to carry is lost).  Every other rank ends
 * its call within the timeout (plus slack): with an error naming rank 1
 * where the call knows who is late, or, where it needed nothing of what
 * was lost, with the right result (checked); its barrier then fails.
 * Every rank's handles and communicator are freed within a bound,
 * without leaks.
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fi_errno.h>

#include "fabep.h"
#include "harness.h"
#include "fabric/fabric.h"
#include "util/util.h"

#define NRANKS 3
#define VICTIM 1
#define TIMEOUT_MS 1000
/* a failed creation or transfer is answered within the timeout; slack
 * for ranks that outnumber the cores and for sanitizers */
#define BOUND_MS (TIMEOUT_MS + 4000)
/* A creation's rendezvous waits for every rank to start: 3 ranks forked
 * on a loaded 2-core host can take more than TIMEOUT_MS to get there,
 * and a victim that timed out there never reaches its fault.  A failed
 * creation is still answered at once (the bound below), not at this. */
#define CREATE_TIMEOUT_MS 10000
/* what fails on this rank alone fails at once */
#define QUICK_MS 500

#define FAIL(...)                                                           \
	do {                                                                \
		fprintf(stderr, "rank %d: line %d: ", rank, __LINE__);      \
		fprintf(stderr, __VA_ARGS__);                               \
		fputc('\n', stderr);                                        \
		return __LINE__ % 200 + 1;                                  \
	} while (0)

static int64_t now_ms(void)
{
	return (int64_t)(fep_now_ns() / 1000000ull);
}

/* One step of fabep_comm_create failing on rank VICTIM. */
struct create_fault {
	const char *step;
	unsigned nth;
	int code;        /* what the step returns */
	int want;        /* what fabep_comm_create returns on the victim */
	int channels;    /* FABEP_CHANNELS, 0: the default */
	int threads;     /* the pool's threads, 0: one */
	int mr_local;    /* as if the provider needed FI_MR_LOCAL */
};

static int check_allreduce(fabep_comm_t *comm, int rank, int size)
{
	enum { ROWS = 4, COLS = 64 };
	fabep_allreduce_t *ar;
	float in[ROWS * COLS], out[ROWS * COLS];
	int i, ret;

	ret = fabep_allreduce_create(comm, ROWS, COLS, FABEP_AR_F32, &ar);
	if (ret)
		FAIL("allreduce_create: %s", fabep_strerror(ret));
	for (i = 0; i < ROWS * COLS; i++)
		in[i] = (float)(i % 13) + (float)rank;
	ret = fabep_allreduce(ar, in, out, ROWS, COLS);
	if (ret)
		FAIL("allreduce: %s", fabep_strerror(ret));
	for (i = 0; i < ROWS * COLS; i++)
		if (out[i] != (float)(size * (i % 13) + size * (size - 1) / 2))
			FAIL("allreduce [%d] = %g", i, (double)out[i]);
	fabep_allreduce_destroy(ar);
	return 0;
}

static int create_rank(int rank, int size, void *arg)
{
	const struct create_fault *f = arg;
	fabep_comm_attr_t a;
	fabep_comm_t *comm = NULL;
	int64_t t0;
	int ret;

	fabep_comm_attr_init(&a);
	a.threads = f->threads ? f->threads : 1;
	a.timeout_ms = CREATE_TIMEOUT_MS;
	fep_test_emulate(rank, f->mr_local, 0, 0, 0);
	if (rank == VICTIM) {
		fep_test_fault.step = f->step;
		fep_test_fault.nth = f->nth;
		fep_test_fault.code = f->code;
	}
	t0 = now_ms();
	ret = fabep_comm_create(&a, &comm);
	if (now_ms() - t0 > BOUND_MS)
		FAIL("fabep_comm_create took %lld ms", (long long)(now_ms() - t0));
	if (rank == VICTIM) {
		if (fep_test_fault.hits != 1)
			FAIL("%s call %u was never made (%u calls)", f->step,
			     f->nth, fep_test_fault.seen);
		fep_test_fault.step = NULL;
		if (ret != f->want)
			FAIL("%s failing: fabep_comm_create gave %d (%s), want %d (%s)",
			     f->step, ret, fabep_strerror(ret), f->want,
			     fabep_strerror(f->want));
	} else {
		if (ret != -FABEP_ERR_PEER)
			FAIL("%s failing on rank %d: fabep_comm_create gave %d (%s)",
			     f->step, VICTIM, ret, fabep_strerror(ret));
		if (!strstr(fabep_last_error(), "failed on rank 1"))
			FAIL("the message names no rank: \"%s\"", fabep_last_error());
	}
	if (comm)
		FAIL("a failed creation handed out a communicator");
	if (fep_test_leak_check())
		FAIL("leaks after the failed creation");
	/* the same processes create one again */
	ret = fabep_comm_create(&a, &comm);
	if (ret)
		FAIL("creation after the failure: %s", fabep_strerror(ret));
	ret = check_allreduce(comm, rank, size);
	if (ret)
		return ret;
	ret = fabep_comm_destroy(comm);
	if (ret)
		FAIL("destroy: %s", fabep_strerror(ret));
	if (fep_test_leak_check())
		FAIL("leaks after destroy");
	return 0;
}

static void run_create(const char *prov, struct create_fault *f)
{
	char ch[16];

	fep_test_on_provider(prov);
	setenv("FABEP_LOG", "error", 1);
	if (f->channels) {
		snprintf(ch, sizeof(ch), "%d", f->channels);
		setenv("FABEP_CHANNELS", ch, 1);
		setenv("FABEP_SIGNAL", "cqdata", 1);
	}
	fep_test_ranks_ok(NRANKS, 60, create_rank, f);
}

#define CREATE_CASE(name, prov, st, n, c, w, ...)                           \
	START_TEST(name)                                                     \
	{                                                                    \
		struct create_fault f_ = { .step = st, .nth = n, .code = c,  \
					   .want = w, __VA_ARGS__ };         \
		run_create(prov, &f_);                                       \
	}                                                                    \
	END_TEST

CREATE_CASE(create_fi_getinfo, "shm", "fi_getinfo", 1, -FI_ENOMEM, -FI_ENOMEM)
CREATE_CASE(create_fi_fabric, "shm", "fi_fabric", 1, -FI_ENOMEM, -FI_ENOMEM)
CREATE_CASE(create_fi_domain, "shm", "fi_domain", 1, -FI_ENODEV, -FI_ENODEV)
CREATE_CASE(create_tx_cq, "shm", "fi_cq_open", 1, -FI_ENOMEM, -FI_ENOMEM)
CREATE_CASE(create_rx_cq, "tcp", "fi_cq_open", 2, -FI_ENOMEM, -FI_ENOMEM)
CREATE_CASE(create_fi_av_open, "shm", "fi_av_open", 1, -FI_ENOMEM, -FI_ENOMEM)
CREATE_CASE(create_fi_endpoint, "tcp", "fi_endpoint", 1, -FI_ENOSPC, -FI_ENOSPC)
CREATE_CASE(create_fi_ep_bind, "shm", "fi_ep_bind", 1, -FI_EINVAL, -FI_EINVAL)
CREATE_CASE(create_heap_reg, "tcp", "fi_mr_reg", 1, -FI_ENOMEM, -FI_ENOMEM)
CREATE_CASE(create_heap_map, "shm", "heap_map", 1, 1, -ENOMEM)
CREATE_CASE(create_ops_reg, "shm", "fi_mr_reg", 1, -FI_ENOMEM, -FI_ENOMEM,
	    .mr_local = 1)
CREATE_CASE(create_heap_reg_local, "shm", "fi_mr_reg", 2, -FI_EACCES, -FI_EACCES,
	    .mr_local = 1)
CREATE_CASE(create_fi_enable, "tcp", "fi_enable", 1, -FI_EOTHER, -FI_EOTHER)
CREATE_CASE(create_fi_getname, "shm", "fi_getname", 1, -FI_ETOOSMALL, -FI_ETOOSMALL)
CREATE_CASE(create_fi_av_insert, "tcp", "fi_av_insert", 2, -FI_EINVAL, -FI_EINVAL)
CREATE_CASE(create_pthread, "shm", "pthread_create", 2, EAGAIN, -EAGAIN,
	    .threads = 3)
CREATE_CASE(create_channel_ep, "shm", "fi_endpoint", 2, -FI_ENOSPC, -FI_ENOSPC,
	    .channels = 2)

/* ---- a transfer failing on one rank ---- */

enum { OP_MOE, OP_AR, OP_PUT };

struct xfer_fault {
	const char *step;
	unsigned nth;
	int code;
	int op;
	const char *signal;   /* FABEP_SIGNAL */
	int nranks;           /* 0: NRANKS */
	int want;             /* the victim's error; 0: code */
	bool rx;              /* the fault is on the receive side: what
				 the victim sent may have arrived */
};

#define X_EXPERTS 12
#define X_TOPK 2
#define X_HIDDEN 256
#define X_TOKENS 8
#define X_ROWS 8
#define X_COLS 256
#define X_MAX_RANKS 4

struct xworld {
	fabep_comm_t *comm;
	fabep_moe_t *moe;
	fabep_allreduce_t *ar;
	int32_t ids[X_TOKENS * X_TOPK];
	float w[X_TOKENS * X_TOPK];
	uint16_t x[X_TOKENS * X_HIDDEN], out[X_TOKENS * X_HIDDEN];
	uint16_t y[X_TOKENS * X_TOPK * X_MAX_RANKS * X_HIDDEN];
	float arin[X_ROWS * X_COLS], arout[X_ROWS * X_COLS];
	fabep_off_t off, src, ctr;
	uint64_t waited;
};

/* One call of the operation; 0 or its error. */
static int xfer_op(struct xworld *w, int op, int rank, int size)
{
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	int ret, i;

	switch (op) {
	case OP_MOE:
		ret = fabep_moe_dispatch(w->moe, w->x, NULL, X_TOKENS, w->ids,
					 w->w, &rv);
		if (ret)
			return ret;
		memcpy(w->y, rv.x, rv.rows * X_HIDDEN * 2);
		return fabep_moe_combine(w->moe, w->y, X_HIDDEN, 0, w->out,
					 X_HIDDEN, NULL, NULL);
	case OP_AR:
		return fabep_allreduce(w->ar, w->arin, w->arout, X_ROWS, X_COLS);
	default:
		/* every rank puts a row to the next and waits for its own */
		for (i = 0; i < 8; i++)
			((uint64_t *)fabep_heap_ptr(w->comm, w->src))[i] =
				(uint64_t)rank;
		ret = fabep_put_signal(w->comm, (rank + 1) % size, w->off,
				       w->src, 64, w->ctr, 1);
		if (ret)
			return ret;
		return fabep_wait(w->comm, w->ctr, ++w->waited);
	}
}

/* 0 where the last call's result is right, else 1 + the first wrong
 * element: each token back as its weighted sum of itself (the rows come
 * back unchanged), the sum of every rank's ones, the left neighbour's
 * row. */
static int xfer_verify(struct xworld *w, int op, int rank, int size)
{
	int t, k, i;

	switch (op) {
	case OP_MOE:
		for (t = 0; t < X_TOKENS; t++) {
			float want = 0;

			for (k = 0; k < X_TOPK; k++)
				want += w->ids[t * X_TOPK + k] >= 0 ?
					w->w[t * X_TOPK + k] : 0.0f;
			for (i = 0; i < X_HIDDEN; i++) {
				uint32_t b = (uint32_t)w->out[t * X_HIDDEN + i] << 16;
				float got;

				memcpy(&got, &b, 4);
				if (got != want)
					return 1 + t * X_HIDDEN + i;
			}
		}
		return 0;
	case OP_AR:
		for (i = 0; i < X_ROWS * X_COLS; i++)
			if (w->arout[i] != (float)size)
				return 1 + i;
		return 0;
	default:
		for (i = 0; i < 8; i++)
			if (((uint64_t *)fabep_heap_ptr(w->comm, w->off))[i] !=
			    (uint64_t)((rank + size - 1) % size))
				return 1 + i;
		return 0;
	}
}

/* A rank's world: a communicator of one thread that times out after
 * TIMEOUT_MS and a MoE handle, with all also an allreduce and the put's
 * blocks, and every operation's input.  0 or the error. */
static int xworld_open(struct xworld *w, int rank, int all)
{
	fabep_moe_config_t cfg;
	fabep_comm_attr_t a;
	uint64_t s = 5 + (uint64_t)rank;
	int i, ret;

	fabep_moe_config_init(&cfg);
	cfg.num_experts = X_EXPERTS;
	cfg.top_k = X_TOPK;
	cfg.hidden = X_HIDDEN;
	cfg.max_tokens = X_TOKENS;
	fabep_comm_attr_init(&a);
	a.threads = 1;
	a.timeout_ms = TIMEOUT_MS;
	if ((ret = fabep_comm_create(&a, &w->comm)) ||
	    (ret = fabep_moe_create(w->comm, &cfg, &w->moe)))
		return ret;
	if (all &&
	    ((ret = fabep_allreduce_create(w->comm, X_ROWS, X_COLS, FABEP_AR_F32,
					   &w->ar)) ||
	     (ret = fabep_heap_alloc(w->comm, 64, 64, &w->off)) ||
	     (ret = fabep_heap_alloc(w->comm, 64, 64, &w->src)) ||
	     (ret = fabep_heap_alloc(w->comm, 8, 8, &w->ctr))))
		return ret;
	for (i = 0; i < X_TOKENS * X_TOPK; i++) {
		w->ids[i] = (int32_t)(fep_test_rand(&s) % X_EXPERTS);
		w->w[i] = 0.5f;
	}
	for (i = 0; i < X_TOKENS * X_HIDDEN; i++)
		w->x[i] = 0x3f80;
	for (i = 0; i < X_ROWS * X_COLS; i++)
		w->arin[i] = 1.0f;
	return 0;
}

static int xfer_rank(int rank, int size, void *arg)
{
	const struct xfer_fault *f = arg;
	struct xworld *w = calloc(1, sizeof(*w));
	int64_t t0, dt;
	int ret, r2;

	if (!w)
		FAIL("out of memory");
	if ((ret = xworld_open(w, rank, 1)))
		FAIL("setup: %s", fabep_strerror(ret));
	/* a good round first: connections made, queues warm */
	ret = xfer_op(w, f->op, rank, size);
	if (ret)
		FAIL("the round before the fault: %s", fabep_strerror(ret));
	if ((ret = xfer_verify(w, f->op, rank, size)))
		FAIL("the round before the fault: wrong at %d", ret - 1);
	memset(w->out, 0, sizeof(w->out));
	memset(w->arout, 0, sizeof(w->arout));
	memset(fabep_heap_ptr(w->comm, w->off), 0xff, 64);
	/* no peer's next put before this rank cleared its row */
	if ((ret = fabep_barrier(w->comm)))
		FAIL("barrier: %s", fabep_strerror(ret));
	if (rank == VICTIM) {
		fep_test_fault.step = f->step;
		fep_test_fault.nth = f->nth;
		fep_test_fault.code = f->code;
	}
	t0 = now_ms();
	ret = xfer_op(w, f->op, rank, size);
	dt = now_ms() - t0;
	if (rank == VICTIM) {
		/* the post's own error, at once; then every call says that
		 * the communicator cannot be used, at once */
		int want = f->want ? f->want : f->code;

		if (fep_test_fault.hits != 1)
			FAIL("%s call %u was never made (%u calls)", f->step,
			     f->nth, fep_test_fault.seen);
		fep_test_fault.step = NULL;
		/* a receive-side error first looks for a lost source,
		 * FEP_LOST_GRACE_MS at most */
		if (ret != want || dt > QUICK_MS + (f->rx ? FEP_LOST_GRACE_MS : 0))
			FAIL("%s failing: the call gave %d (%s) after %lld ms",
			     f->step, ret, fabep_strerror(ret), (long long)dt);
		t0 = now_ms();
		if ((r2 = fabep_barrier(w->comm)) != want ||
		    now_ms() - t0 > QUICK_MS ||
		    !strstr(fabep_last_error(), "communicator is unusable"))
			FAIL("barrier after the failed post: %d (%s) in %lld ms: %s",
			     r2, fabep_strerror(r2), (long long)(now_ms() - t0),
			     fabep_last_error());
		if ((r2 = xfer_op(w, f->op, rank, size)) != want)
			FAIL("the call again: %d (%s)", r2, fabep_strerror(r2));
	} else {
		/* what rank 1 was to send never comes: an error within the
		 * timeout, naming rank 1 where the call knows who is late (a
		 * put goes to rank 2 alone; rank 0 may finish its wait) */
		/* rank 1's put goes to rank 2 alone, and each round of the
		 * log-step path to one peer: a rank that needed nothing of
		 * what was lost may finish, with the right result */
		if (dt > BOUND_MS)
			FAIL("the call gave %d (%s) after %lld ms", ret,
			     fabep_strerror(ret), (long long)dt);
		if (!ret && (r2 = xfer_verify(w, f->op, rank, size)))
			FAIL("the call succeeded with a wrong result at %d", r2 - 1);
		if (!ret && f->op == OP_PUT && !f->rx &&
		    rank == (VICTIM + 1) % size)
			FAIL("rank 1's put arrived");
		if (ret && ret != -ETIMEDOUT && ret != -FABEP_ERR_PEER_LOST &&
		    ret != -FABEP_ERR_PEER)
			FAIL("the call gave %d (%s)", ret, fabep_strerror(ret));
		if (ret && f->op != OP_PUT && !strstr(fabep_last_error(), "rank 1"))
			FAIL("the message names no rank: %s", fabep_last_error());
		t0 = now_ms();
		if (!(r2 = fabep_barrier(w->comm)) || now_ms() - t0 > BOUND_MS)
			FAIL("barrier after the failure: %d (%s) in %lld ms", r2,
			     fabep_strerror(r2), (long long)(now_ms() - t0));
	}
	fabep_moe_destroy(w->moe);
	fabep_allreduce_destroy(w->ar);
	t0 = now_ms();
	r2 = fabep_comm_destroy(w->comm);
	if (now_ms() - t0 > BOUND_MS)
		FAIL("destroy took %lld ms (%s)", (long long)(now_ms() - t0),
		     fabep_strerror(r2));
	free(w);
	if (fep_test_leak_check())
		FAIL("leaks after destroy");
	return 0;
}

/* A dispatch whose receive fails on rank 1 alone (host memory for its
 * result, after every header is in): rank 1 gets -ENOMEM at once and
 * then, for the handle, -FABEP_ERR_PEER_LOST saying it is unusable; the
 * others received the dispatch, and their combine, which waits for
 * rank 1's, ends within the timeout naming rank 1.  Every handle and
 * communicator is freed within a bound, without leaks. */
static int alone_rank(int rank, int size, void *arg)
{
	struct xworld *w = calloc(1, sizeof(*w));
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	int64_t t0;
	int ret;

	(void)arg;
	if (!w)
		FAIL("out of memory");
	if ((ret = xworld_open(w, rank, 0)))
		FAIL("setup: %s", fabep_strerror(ret));
	if ((ret = xfer_op(w, OP_MOE, rank, size)) ||
	    (ret = xfer_verify(w, OP_MOE, rank, size)))
		FAIL("the round before the fault: %d", ret);
	if (rank == VICTIM) {
		fep_test_fault.step = "ep_reserve";
		fep_test_fault.nth = 1;
		fep_test_fault.code = 1;
	}
	t0 = now_ms();
	ret = fabep_moe_dispatch(w->moe, w->x, NULL, X_TOKENS, w->ids, w->w, &rv);
	if (rank == VICTIM) {
		if (fep_test_fault.hits != 1)
			FAIL("the result's memory was never asked for");
		fep_test_fault.step = NULL;
		if (ret != -ENOMEM || now_ms() - t0 > QUICK_MS)
			FAIL("dispatch gave %d (%s) after %lld ms", ret,
			     fabep_strerror(ret), (long long)(now_ms() - t0));
		t0 = now_ms();
		ret = fabep_moe_dispatch(w->moe, w->x, NULL, X_TOKENS, w->ids,
					 w->w, &rv);
		if (ret != -FABEP_ERR_PEER_LOST || now_ms() - t0 > QUICK_MS ||
		    !strstr(fabep_last_error(), "handle is unusable"))
			FAIL("the next dispatch gave %d (%s) after %lld ms: %s",
			     ret, fabep_strerror(ret), (long long)(now_ms() - t0),
			     fabep_last_error());
	} else {
		if (ret)
			FAIL("dispatch gave %d (%s)", ret, fabep_strerror(ret));
		memcpy(w->y, rv.x, rv.rows * X_HIDDEN * 2);
		t0 = now_ms();
		ret = fabep_moe_combine(w->moe, w->y, X_HIDDEN, 0, w->out,
					X_HIDDEN, NULL, NULL);
		if (ret != -ETIMEDOUT || now_ms() - t0 > BOUND_MS ||
		    !strstr(fabep_last_error(), "rank 1"))
			FAIL("combine gave %d (%s) after %lld ms: %s", ret,
			     fabep_strerror(ret), (long long)(now_ms() - t0),
			     fabep_last_error());
	}
	fabep_moe_destroy(w->moe);
	t0 = now_ms();
	ret = fabep_comm_destroy(w->comm);
	if (now_ms() - t0 > BOUND_MS)
		FAIL("destroy took %lld ms (%s)", (long long)(now_ms() - t0),
		     fabep_strerror(ret));
	free(w);
	if (fep_test_leak_check())
		FAIL("leaks after destroy");
	return 0;
}

START_TEST(moe_recv_alone)
{
	fep_test_on_provider("shm");
	setenv("FABEP_LOG", "error", 1);
	fep_test_ranks_ok(NRANKS, 60, alone_rank, NULL);
}
END_TEST

static void run_xfer(const char *prov, struct xfer_fault *f)
{
	fep_test_on_provider(prov);
	setenv("FABEP_LOG", "error", 1);
	if (f->signal)
		setenv("FABEP_SIGNAL", f->signal, 1);
	fep_test_ranks_ok(f->nranks ? f->nranks : NRANKS, 60, xfer_rank, f);
}

#define XFER_CASE(name, prov, st, n, c, o, sig, ...)                         \
	START_TEST(name)                                                     \
	{                                                                    \
		struct xfer_fault f_ = { .step = st, .nth = n, .code = c,    \
					 .op = o, .signal = sig,             \
					 __VA_ARGS__ };                      \
		run_xfer(prov, &f_);                                         \
	}                                                                    \
	END_TEST

/* the third write of a dispatch, some runs out already */
XFER_CASE(xfer_moe_shm, "shm", "fi_writemsg", 3, -FI_EIO, OP_MOE, "cqdata")
/* combine's first write (dispatch takes four under cma) */
XFER_CASE(xfer_moe_cma, "shm", "fi_writemsg", 5, -FI_EIO, OP_MOE, "cma")
XFER_CASE(xfer_moe_tcp, "tcp", "fi_atomic", 2, -FI_ENOMEM, OP_MOE, "delivery")
XFER_CASE(xfer_ar_tcp, "tcp", "fi_writemsg", 1, -FI_EIO, OP_AR, "cqdata")
/* 4 ranks, 8 KiB a rank: the log-step path, whose rounds wait for
 * one peer each */
XFER_CASE(xfer_ar_logstep, "shm", "fi_writemsg", 2, -FI_EIO, OP_AR, "cqdata",
	  .nranks = 4)
XFER_CASE(xfer_ar_logstep_tcp, "tcp", "fi_writemsg", 1, -FI_EIO, OP_AR, NULL,
	  .nranks = 4)
/* completions lost: a completion queue that fails */
XFER_CASE(xfer_ar_cq, "shm", "fi_cq_read", 1, -FI_EOTHER, OP_AR, NULL)
XFER_CASE(xfer_put_cma, "shm", "fi_writemsg", 1, -FI_EACCES, OP_PUT, "cma")
XFER_CASE(xfer_put_tcp, "tcp", "fi_atomic", 1, -FI_EIO, OP_PUT, "delivery")
/* udp;ofi_rxd: ordered's atomic after its writes, a cqdata write */
XFER_CASE(xfer_moe_udp, "udp", "fi_atomic", 3, -FI_EIO, OP_MOE, "ordered")
XFER_CASE(xfer_ar_udp, "udp", "fi_writemsg", 2, -FI_EIO, OP_AR, "cqdata")
/* net: no atomics, every signal is a write's CQ data */
XFER_CASE(xfer_put_net, "net", "fi_writemsg", 1, -FI_EIO, OP_PUT, "cqdata")
XFER_CASE(xfer_moe_net, "net", "fi_writemsg", 3, -FI_EIO, OP_MOE, "cqdata")
/* a write into rank 1 fails there (an error completion on its receive
 * queue): its call fails at once, not at the timeout, and its
 * communicator is unusable.  A MoE call, whose combine needs writes the
 * peers make only after rank 1's dispatch: a put's signal may have been
 * read before the fault was set. */
XFER_CASE(xfer_moe_rx_cqdata, "shm", "rx_error", 1, -FI_EAVAIL, OP_MOE, "cqdata",
	  .want = -FABEP_ERR_PEER_LOST, .rx = true)
XFER_CASE(xfer_moe_rx, "shm", "rx_error", 1, -FI_EAVAIL, OP_MOE, "cma",
	  .want = -FABEP_ERR_PEER_LOST, .rx = true)

static Suite *suite(void)
{
	Suite *s = suite_create("inject");
	TCase *tc = tcase_create("create");

	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, create_fi_getinfo);
	tcase_add_test(tc, create_fi_fabric);
	tcase_add_test(tc, create_fi_domain);
	tcase_add_test(tc, create_tx_cq);
	tcase_add_test(tc, create_rx_cq);
	tcase_add_test(tc, create_fi_av_open);
	tcase_add_test(tc, create_fi_endpoint);
	tcase_add_test(tc, create_fi_ep_bind);
	tcase_add_test(tc, create_heap_reg);
	tcase_add_test(tc, create_heap_map);
	tcase_add_test(tc, create_ops_reg);
	tcase_add_test(tc, create_heap_reg_local);
	tcase_add_test(tc, create_fi_enable);
	tcase_add_test(tc, create_fi_getname);
	tcase_add_test(tc, create_fi_av_insert);
	tcase_add_test(tc, create_pthread);
	tcase_add_test(tc, create_channel_ep);
	suite_add_tcase(s, tc);

	tc = tcase_create("transfer");
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, xfer_moe_shm);
	tcase_add_test(tc, xfer_moe_cma);
	tcase_add_test(tc, xfer_moe_tcp);
	tcase_add_test(tc, xfer_ar_tcp);
	tcase_add_test(tc, xfer_ar_logstep);
	tcase_add_test(tc, xfer_ar_logstep_tcp);
	tcase_add_test(tc, xfer_ar_cq);
	tcase_add_test(tc, xfer_put_cma);
	tcase_add_test(tc, xfer_put_tcp);
	tcase_add_test(tc, xfer_moe_udp);
	tcase_add_test(tc, xfer_ar_udp);
	tcase_add_test(tc, xfer_put_net);
	tcase_add_test(tc, xfer_moe_net);
	tcase_add_test(tc, xfer_moe_rx_cqdata);
	tcase_add_test(tc, xfer_moe_rx);
	tcase_add_test(tc, moe_recv_alone);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return fep_test_run_suite(suite());
}
