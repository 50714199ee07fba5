/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * coll.h - collectives on top of the communicator: the allreduce handle
 * (allreduce.c).  Internal (not installed).  Layer: coll, using core,
 * fabric and kernels.
 */
#ifndef FEP_COLL_H
#define FEP_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/comm.h"
#include "kernels/kernels.h"

/* The threshold when FABEP_AR_ONESTAGE_MAX is not set, in input bytes
 * per rank: FEP_AR_ONESTAGE_DEFAULT; from FEP_AR_RD_RANKS ranks (the
 * log-step path) FEP_AR_RD_SMALL_SUMS bytes of the fp32 sums it moves
 * (16 KiB of bf16 input, 32 KiB of fp32), and from FEP_AR_RD_WIDE ranks
 * FEP_AR_RD_DEFAULT_F32 for fp32 input.  Measured on shm (see the
 * comment at fep_ar_onestage_env in allreduce.c). */
#define FEP_AR_ONESTAGE_DEFAULT ((size_t)32 << 10)
#define FEP_AR_RD_SMALL_SUMS ((size_t)32 << 10)
#define FEP_AR_RD_WIDE 8
#define FEP_AR_RD_DEFAULT_F32 ((size_t)96 << 10)
/* The plain sum's threshold on 2 ranks when FABEP_AR_ONESTAGE_MAX is not
 * set: both paths move the same bytes there, and the one-stage path
 * saves a round trip and the allgather's copy (measured on shm and tcp,
 * see fep_ar_onestage_env). */
#define FEP_AR_ONESTAGE_SUM2_DEFAULT ((size_t)1 << 20)
/* The log-step path below the threshold from this many ranks: log2(ranks)
 * rounds with one partner each, where the one-stage path has every rank
 * write its input to every other (ranks - 1 copies of it into each rank,
 * queued under the target's locks).  Below it, one round of ranks - 1
 * writes is as short. */
#define FEP_AR_RD_RANKS 4

/* Every slot and allgather block starts with this header, written in the
 * same fi_write as the data that follows it. */
struct fep_ar_hdr {
	uint64_t seq;     /* call number: first, so fep_comm_wait can name
			   * the peers whose slot is behind */
	uint64_t rows;
	uint64_t cols;
	int32_t status;   /* 0, or the sender's negative error code */
	uint32_t op;      /* enum fep_ar_op | FEP_AR_F_* | the parameters'
			   * fingerprint << FEP_AR_PARM_SHIFT */
	uint8_t pad[32];
};

/* The header of a log-step message (fep_ar_rd, allreduce.c): what the
 * ranks merged into it so far know of every merged rank's call, so that
 * after the last step every rank holds the same view of all of them. */
struct fep_ar_rdhdr {
	uint64_t seq;     /* call number */
	uint64_t rows;    /* of rank ref */
	uint64_t cols;
	int32_t status;   /* of rank err */
	uint32_t op;      /* of rank ref */
	int32_t ref;      /* the lowest rank merged */
	int32_t err;      /* the lowest merged rank with an error, or -1 */
	int32_t diff;     /* the lowest merged rank whose rows, cols or op
			   * differ from ref's, or -1 */
	uint32_t dop;     /* its op, rows and cols */
	uint64_t drows;
	uint64_t dcols;
};

enum fep_ar_op {
	FEP_AR_SUM = 1,
	FEP_AR_NORM = 2,       /* allreduce + RMSNorm, dtype out */
	FEP_AR_NORM_FP8 = 3,   /* allreduce + RMSNorm + FP8 */
};
#define FEP_AR_F_RESIDUAL 0x100u
/* In a phase-1 header: its rank took the log-step path, found a peer on
 * the two-stage one (rows that differ between ranks) and joined phase 1
 * to agree on the verdict; the log-step counters are then out of step. */
#define FEP_AR_F_LOGSTEP 0x200u
/* Bits 16 to 31 of a header's op: a fingerprint of the RMSNorm calls'
 * scalars (eps, weight_offset, and with FP8 output scale_ub), 0 for the
 * plain sum: ranks that pass different ones would normalize the rows
 * each owns differently, so they get -FABEP_ERR_MISMATCH as ranks that
 * pass different shapes do, at no cost (gamma's and the residual's
 * values are not compared: that would be a pass over them a call). */
#define FEP_AR_PARM_SHIFT 16
/* Log-step rounds at most: ranks up to 65536, the fold and its answer
 * for a rank count that is not a power of two, and as many again for
 * the allgather of the halving mode. */
#define FEP_AR_RD_MAX 34
/* The halving mode of the log-step path (fep_ar_rd), above the
 * threshold of its doubling mode, when FABEP_AR_HALVING_MAX is not set:
 * up to this many bytes of fp32 sums per rank (times the ranks) for the
 * plain sum of fp32 input, and for that of bf16 input and the RMSNorm
 * calls; measured on shm (see fep_ar_halving_env in allreduce.c). */
#define FEP_AR_HALVING_F32_SUM ((size_t)16 << 10)  /* plain sum, fp32 input */
#define FEP_AR_HALVING_OTHER ((size_t)8 << 10)     /* bf16 input; the norms */

/* Sizes of one handle's heap objects. */
struct fep_ar_layout {
	size_t esize;       /* element bytes */
	size_t qmax;        /* ceil(max_rows / ranks): rows one rank owns */
	size_t os_cap;      /* one-stage data bytes a slot holds */
	size_t blk1;        /* phase-1 slot: hdr + data */
	size_t blkst;       /* two-stage staging block: hdr + owned rows */
	size_t blkag;       /* allgather block: hdr + data; 0 without two-stage */
	bool two_stage;     /* whether max_rows x max_cols exceeds the lower
			       threshold (some call may take two stages) */
	int rd_m;           /* log-step rounds (log2 of the largest power of
			       two <= ranks) where calls below os_max take
			       the log-step path (4 ranks or more), else 0 */
	int rd_n;           /* log-step slots (and counters) per parity:
			       2 * rd_m + 2 */
	size_t hv_cap;      /* input bytes up to which calls above os_cap
			       may take the halving mode (the larger
			       limit); 0: none */
	size_t rdoff[FEP_AR_RD_MAX]; /* log-step slot k within a parity */
	size_t rdpar;       /* log-step slot bytes per parity */
	size_t blkrd;       /* log-step staging: rdhdr + the fp32 sums of a
			       call up to os_cap or hv_cap */
	/* offsets from the start of the handle's heap block */
	size_t o_ctr;       /* 3 counters: phase 1 by parity, allgather */
	size_t o_slots;     /* 2 parities x ranks x blk1 */
	size_t o_stage;     /* one-stage: hdr + os_cap; two-stage: ranks x
			       blkst (the larger of the two) */
	size_t o_ag;        /* ranks x blkag */
	size_t o_rdctr;     /* 2 parities x rd_n log-step counters */
	size_t o_rdslots;   /* 2 parities x rdpar */
	size_t o_rdstage;   /* blkrd: what this rank sends in a round */
	size_t total;
};

struct fabep_allreduce {
	fabep_comm_t *comm;
	struct fep_comm_handle link; /* on the communicator's list */
	fep_k_dtype_t dt;
	size_t max_rows;
	size_t max_cols;
	size_t os_max;          /* threshold of the RMSNorm calls */
	size_t os_sum;          /* threshold of the plain sum */
	size_t hv_max;          /* the halving mode's limit, RMSNorm calls */
	size_t hv_sum;          /* and the plain sum's (both at most hv_cap) */
	struct fep_ar_layout lay;
	uint64_t base;          /* heap offset of the block */
	uint64_t ctrs;          /* its counters: a counter slot (fep_comm_block)
				   or base; o_ctr and o_rdctr are from here */
	uint64_t ctr1[2];       /* phase-1 counters, by call parity */
	uint64_t ctr_ag;        /* allgather counter */
	uint64_t slots1[2];     /* phase-1 slots, by call parity */
	uint64_t stage;         /* staging: what this rank writes */
	uint64_t ag;            /* allgather blocks */
	uint64_t seq;           /* calls made on this handle */
	uint64_t expect1[2];    /* what ctr1[p] must reach */
	uint64_t expect_ag;
	uint64_t rdctr;         /* log-step counters, slots, staging */
	uint64_t rdslots;
	uint64_t rdstage;
	uint64_t rd_expect[2][FEP_AR_RD_MAX];
	bool rd_resync;     /* ranks took different paths: fep_ar_resync owed */
	int broken;             /* an earlier call failed mid-protocol */
	bool direct;            /* phase 1 writes from the caller's input
				   (fep_ar_direct_ok), not from staging */
	bool rd;                /* the allgather reads the owners' blocks
				   into the caller's outputs */
	char path;              /* the last call's path, as it began: 'o'
				   one-stage, 'l' log-step, 't' two-stage
				   (for tests: test_coll checks it against the
				   thresholds) */

	/* local scratch */
	int nthreads;
	float *gamma32;         /* max_cols */
	const void **ins;       /* nthreads x ranks input pointers */
	const void **rbase;     /* ranks: the reduction's row-0 list (on the
				 * heap, not the caller's stack, at any rank
				 * count) */
	uint8_t *scratch;       /* nthreads x scratch_bytes */
	size_t scratch_bytes;
	struct fep_put *puts;   /* 2 x ranks */
};

/* Compute the layout; 0 or -EINVAL / -EOVERFLOW (not logged). */
int fep_ar_layout(size_t max_rows, size_t max_cols, size_t esize, int nranks,
		  size_t os_max, size_t os_sum, size_t hv_max, size_t hv_sum,
		  struct fep_ar_layout *l);

/* The halving mode's limits in input bytes per rank, of the RMSNorm
 * calls (*hv_max) and of the plain sum (*hv_sum): FABEP_AR_HALVING_MAX
 * for both, else the defaults for elements of esize bytes on nranks
 * ranks.  0 or -EINVAL (logged). */
int fep_ar_halving_env(size_t esize, int nranks, size_t *hv_max,
		       size_t *hv_sum);

/* The thresholds of the RMSNorm calls (*os_max) and of the plain sum
 * (*os_sum): FABEP_AR_ONESTAGE_MAX for both, else the defaults for
 * elements of esize bytes on nranks ranks.  0 or -EINVAL (logged). */
int fep_ar_onestage_env(size_t esize, int nranks, size_t *os_max,
			size_t *os_sum);

#endif
