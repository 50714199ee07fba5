/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bench.h - what fabep_bench's parts share: options and result rows.
 * fabep_bench.c parses the options (utils/common.c) and calls the part
 * named by -o.
 */
#ifndef FEP_UTILS_BENCH_H
#define FEP_UTILS_BENCH_H

#include <stddef.h>
#include <stdio.h>

struct bench_opts {
	const char *op;       /* -o: kernels|dispatch|combine|moe|allreduce|arnorm|write */
	const char *provider; /* -p */
	const char *domain;   /* -d */
	int iters;            /* -I (0 = the part's default) */
	int warmup;           /* -w (-1 = the part's default) */
	int machine;          /* -m: one "key: value" line per row */
	int nranks;           /* -n: fork this many local ranks (0 = from env/mpirun) */
	int threads;          /* -T: worker threads (0 = default; kernels: also 1) */
	size_t bytes;         /* -B: input bytes for kernels (default 64 MiB) */
	const char *kernel;   /* -K: one kernel by name (NULL = all) */
	int tokens;           /* -t */
	int hidden;           /* -H */
	int topk;             /* -k */
	int experts;          /* -e */
	const char *format;   /* -f bf16|fp8|fp32 */
	int rows, cols;       /* --rows, --cols */
	int check;            /* --check */
	double soak_s;        /* --soak SECONDS */
	int rounds;           /* --rounds N (scale; 0 = once) */
	int no_ref;           /* --no-ref: dispatch, combine, moe without references */
	/* -o scale: -n, -t, --rows as lists (n_* 0: the part's defaults) */
	const int *ranks_list, *tokens_list, *rows_list;
	int n_ranks, n_tokens, n_rows;
};

/* Each part returns 0 on success, else a negative code (message printed). */
int bench_kernels(const struct bench_opts *o, FILE *out);
/* kernels: 0 when -K names a kernel (or none is given) and -B holds 16
 * rows of -H; else -EINVAL and why, for fabep_bench to refuse the
 * command line before the part runs */
int bench_kernels_check(const struct bench_opts *o, char *why, size_t len);
/* -o scale (utils/bench_scale.c): runs the other parts and the MPI
 * baseline over rank and token counts, here (no communicator). */
int bench_scale(const struct bench_opts *o, FILE *out);
/* FABEP_BENCH_SCALE_PARTS names part (NULL: the variable is valid) */
int bench_scale_want(const char *part);
/* bench_moe_check for every rank and token count of the dispatch and
 * combine rows o asks for. */
int bench_scale_check(const struct bench_opts *o, char *why, size_t len);
/* -o allreduce|arnorm (utils/bench_coll.c): runs on every rank of comm;
 * rank 0 prints.  bench_coll_heap_bytes: the heap the communicator needs
 * for it (fabep_comm_attr_t.heap_size). */
struct fabep_comm;
int bench_coll(struct fabep_comm *comm, const struct bench_opts *o, FILE *out);
size_t bench_coll_heap_bytes(const struct bench_opts *o, int nranks);
/* allreduce, arnorm: the iterations and warm-up of -I and -w, or their
 * defaults for an input of that many bytes (the scale part gives the MPI
 * baseline the same): 200 below 1 MiB, where a call takes microseconds,
 * 50 below 16 MiB, 20 above; warm-up a tenth of the iterations, at
 * least 3. */
long bench_coll_iters(const struct bench_opts *o, size_t bytes);
long bench_coll_warmup(const struct bench_opts *o, long iters);
/* allreduce, arnorm: whether an input of rows x cols values of es bytes
 * is one fabep_allreduce takes: at most 2^BENCH_COLL_MAX_LOG2 bytes
 * (beyond, creating the handle fails with -EOVERFLOW, and the heap's
 * size would wrap) */
#define BENCH_COLL_MAX_LOG2 40
int bench_coll_fits(size_t rows, size_t cols, size_t es);

/* -o dispatch|combine|moe (utils/bench_moe.c): runs on every rank of comm;
 * rank 0 prints.  bench_moe_heap_bytes: the heap the communicator needs
 * for it (fabep_comm_attr_t.heap_size). */
#include "fabep.h"
int bench_moe(fabep_comm_t *comm, const struct bench_opts *o, FILE *out);
size_t bench_moe_heap_bytes(const struct bench_opts *o, int nranks);
/* Whether the library takes a MoE handle of o's shape on nranks ranks,
 * within fabep's largest heap: 0, or a code with the reason in why. */
int bench_moe_check(const struct bench_opts *o, int nranks, char *why,
		    size_t len);
/* dispatch, combine, moe: the iterations and warm-up of -I and -w, or
 * their defaults for that many tokens per rank (the scale part gives the
 * MPI baseline the same): 200 and 20 up to 8 tokens, where a call takes
 * tens of microseconds and the first tens of calls of a run are slower;
 * 20 and 3 above. */
int bench_moe_iters(const struct bench_opts *o, int tokens);
int bench_moe_warmup(const struct bench_opts *o, int tokens);

/* --check: rank 0 learns whether every rank's check passed (*all_ok, set
 * on rank 0 only).  words: a heap word per rank; ctr: a counter that
 * reaches round * (ranks - 1) at this call (one round per call). */
int bench_gather_ok(fabep_comm_t *comm, fabep_off_t words, fabep_off_t ctr,
		    uint64_t round, int mine, int *all_ok);

#endif
