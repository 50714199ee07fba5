/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bootstrap.h - out-of-band exchange used once at start-up (and for
 * collective error agreement at creation): allgather and barrier between
 * the ranks, over a TCP rendezvous at rank 0 or over a caller's allgather;
 * over TCP, also the watch for ranks whose process ended.  Uses only util.
 */
#ifndef FEP_BOOTSTRAP_H
#define FEP_BOOTSTRAP_H

#include <stddef.h>
#include "fabep.h"

typedef struct fep_boot fep_boot_t;

/* The most ranks a world may have: far beyond expert parallelism's
 * hundreds, and a bound on what a mistyped world size makes the root
 * allocate and wait for. */
#define FEP_BOOT_MAX_RANKS (1 << 20)

struct fep_boot {
	int rank;
	int size;
	int timeout_ms;
	/* Gather len bytes from every rank into out (size * len, rank order).
	 * Every rank passes the same len. */
	int (*allgather)(fep_boot_t *b, const void *in, void *out, size_t len);
	int (*barrier)(fep_boot_t *b);
	void (*destroy)(fep_boot_t *b);
	/* Between collectives, without blocking: 0 while every rank is
	 * there, else the code of a loss (logged once).  NULL: cannot tell. */
	int (*watch)(fep_boot_t *b);
	/* Called while a TCP collective waits (between polls of at most
	 * 1 ms), so that the fabric above keeps progressing: a peer's
	 * transfer to this rank may need this rank's progress to complete
	 * before that peer can join the collective.  NULL: none. */
	void (*idle)(void *ctx);
	void *idle_ctx;
	/* Set before destroy where the communicator above failed: destroy
	 * then says no goodbye, so that the peers still waiting for this
	 * rank see it lost at once instead of at their timeout. */
	int failed;
};

static inline int fep_boot_allgather(fep_boot_t *b, const void *in, void *out,
				     size_t len)
{
	return b->allgather(b, in, out, len);
}
static inline int fep_boot_barrier(fep_boot_t *b) { return b->barrier(b); }
static inline int fep_boot_watch(fep_boot_t *b)
{
	return b && b->watch ? b->watch(b) : 0;
}
static inline void fep_boot_destroy(fep_boot_t *b)
{
	if (b)
		b->destroy(b);
}

/* Where this process sits, from the environment. */
struct fep_boot_env {
	int rank;          /* -1 if unknown */
	int size;          /* -1 if unknown */
	int local_rank;    /* -1 if unknown (FABEP_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
			    * MPI_LOCALRANKID under PMI, SLURM_LOCALID) */
	int local_size;    /* -1 if unknown (FABEP_LOCAL_SIZE,
			    * OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS) */
	char root_host[256];
	int root_port;     /* 0 if FABEP_ROOT unset */
	const char *source; /* "FABEP", "OMPI", "PMI", "SLURM" or NULL */
	int local_status;  /* 0, or -EINVAL: the local pair is refused (logged);
			    * rank, size and root are still good, so the
			    * rank can meet the others to tell them */
};

/*
 * Read FABEP_RANK / FABEP_WORLD_SIZE / FABEP_ROOT, else OMPI_COMM_WORLD_*,
 * PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS (FABEP_ROOT still names
 * the rendezvous; without it, under Slurm/mpirun with one rank, none is
 * needed).  Returns 0, or -EINVAL with a logged message naming the bad
 * variable.  A world size of 1 needs no root.
 */
int fep_boot_env_read(struct fep_boot_env *env);

/*
 * TCP rendezvous: rank 0 listens on root_host:root_port (SO_REUSEADDR),
 * every other rank connects (retrying until timeout_ms).  Messages carry a
 * header (magic, version, rank, size, length) that is validated; a peer
 * that closes its connection makes every later call fail with
 * -FABEP_ERR_PEER_LOST naming the rank; no answer within timeout_ms gives
 * -ETIMEDOUT naming who is missing.  size == 1 needs no sockets.  The
 * connections stay open to watch the ranks (fep_boot_watch): a rank whose
 * process ends is lost; destroy says goodbye, so a normal end is not.
 */
int fep_boot_tcp_create(int rank, int size, const char *root_host,
			int root_port, int timeout_ms, fep_boot_t **out);
/* The same with the rendezvous bounded by rdv_ms instead (-1: no limit,
 * the ranks wait for each other until they all come or a signal ends
 * them); the calls after it keep timeout_ms. */
int fep_boot_tcp_create_rdv(int rank, int size, const char *root_host,
			    int root_port, int timeout_ms, int rdv_ms,
			    fep_boot_t **out);

/* The checks every bootstrap makes of its arguments: out not NULL, 0 <=
 * rank < size <= FEP_BOOT_MAX_RANKS.  0, or -EINVAL (logged). */
int fep_boot_check_world(int rank, int size, fep_boot_t **out);

/* Over a caller's allgather callback (barrier = allgather of one byte). */
int fep_boot_callback_create(int rank, int size, fabep_allgather_fn fn,
			     void *ctx, int timeout_ms, fep_boot_t **out);

#endif
