/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * common.h - what the fabep tools share: one option parser (a flag means
 * the same in every tool), size lists, the results printer (fabtests'
 * table, or one "key: value" line per row with -m), and running ranks
 * (forked locally, or one rank under mpirun/srun or server/client).
 *
 * Tools use only the public header fabep.h (and libfabric's, for the
 * versions of --version); this file adds nothing to the library.
 */
#ifndef FEP_UTILS_COMMON_H
#define FEP_UTILS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fabep.h"

/* Exit statuses of every tool. */
enum {
	TOOL_EXIT_OK = 0,
	TOOL_EXIT_FAIL = 1,  /* a run failed (message printed) */
	TOOL_EXIT_USAGE = 2, /* bad command line (message + usage printed) */
};

/* Long-only options get ids above any character. */
enum {
	TOOL_OPT_ROWS = 256,
	TOOL_OPT_COLS,
	TOOL_OPT_CHECK,
	TOOL_OPT_SOAK,
	TOOL_OPT_ROUNDS,
	TOOL_OPT_NO_REF,
};

#define TOOL_MAX_SIZES 64
#define TOOL_MAX_LIST 16      /* values in a -n, -t or --rows list */
#define TOOL_MAX_ROUNDS 100   /* fabep_bench --rounds */
#define TOOL_MAX_SOAK_S 604800 /* --soak: 7 days, in seconds */
#define TOOL_DEFAULT_PORT 47592

/* Everything any tool parses; each tool accepts a subset. */
struct tool_opts {
	const char *provider;  /* -p */
	const char *domain;    /* -d */
	int iters;             /* -I (0 = scaled by size / the part's default) */
	int warmup;            /* -w (-1 = default) */
	int machine;           /* -m */
	int nranks;            /* -n (0 = not given) */
	int threads;           /* -T (0 = default) */
	const char *op;        /* -o (NULL = the tool's default) */
	size_t sizes[TOOL_MAX_SIZES]; /* -S, ascending as given */
	int nsizes;            /* 0 = not given */
	int bandwidth;         /* -b */
	int window;            /* -W (0 = default) */
	int server;            /* -s */
	int port;              /* -P (0 = not given) */
	const char *host;      /* positional HOST (client) */
	size_t bytes;          /* -B (0 = not given) */
	const char *kernel;    /* -K */
	int tokens;            /* -t */
	int hidden;            /* -H */
	int topk;              /* -k */
	int experts;           /* -e */
	const char *format;    /* -f */
	int rows, cols;        /* --rows, --cols */
	int check;             /* --check */
	double soak_s;         /* --soak */
	int rounds;            /* --rounds (0 = not given) */
	int no_ref;            /* --no-ref */
	fabep_signal_t signal; /* set by a tool (e.g. -o writedata), not a flag */
	/* -n, -t, --rows as comma-separated lists (fabep_bench -o scale
	 * only; elsewhere one value, the field above) */
	int nranks_list[TOOL_MAX_LIST], n_nranks;
	int tokens_list[TOOL_MAX_LIST], n_tokens;
	int rows_list[TOOL_MAX_LIST], n_rows;
};

/* A help line a tool wants to word its own way (e.g. what -o accepts). */
struct tool_help {
	int id;
	const char *arg;  /* NULL: the common argument name */
	const char *text;
};

struct tool_desc {
	const char *name;       /* "fabep_pingpong" */
	const char *args;       /* after "[OPTIONS]" in the synopsis, or NULL */
	const char *summary;    /* one line */
	const int *accept;      /* option ids the tool takes, 0-terminated */
	const struct tool_help *help; /* overrides, {0} terminated, or NULL */
	int max_args;           /* positional arguments allowed */
	const char *epilog;     /* printed after the options, or NULL */
	/* -n's range (both 0: 1 to 256), checked while parsing, so that the
	 * message names the tool's own limits */
	int ranks_min, ranks_max;
	/* where -n, -t and --rows take comma-separated lists ("-o scale"),
	 * NULL: nowhere; only there does a bad value's message offer one */
	const char *lists;
};

/*
 * Parse argv into o (defaults first).  -h/--help prints the usage to
 * stdout and exits 0; a bad option or value prints a message and the
 * usage to stderr and exits 2.  Positional arguments: o->host (the first).
 */
void tool_parse(const struct tool_desc *d, int argc, char **argv,
		struct tool_opts *o);

/* Print the usage of a tool to f. */
void tool_usage(const struct tool_desc *d, FILE *f);

/* For checks a tool makes after parsing: message + usage, exit 2. */
void tool_usage_error(const struct tool_desc *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3), noreturn));

/* An environment switch (unset, empty or 0: off; 1: on); any other
 * value is a usage error (message + usage, exit 2). */
int tool_env_switch(const struct tool_desc *d, const char *name);
/* Whether the switch is on, as tool_env_switch reads it (set, not empty
 * and not 0), for the code that acts on a switch main checked. */
int tool_env_on(const char *name);

/* "64", "4k", "1M", "1G" (binary units).  0 or -EINVAL/-ERANGE. */
int tool_parse_size(const char *s, size_t *out);
/* "all" (1 B .. max, powers of two), a list "64,4k,1M", or one size. */
int tool_parse_sizes(const char *s, size_t max, size_t *sizes, int *n);
/* 64 -> "64", 4096 -> "4k", 1048576 -> "1m", as fabtests prints them. */
const char *tool_size_str(char *buf, size_t len, uint64_t v);

/* ---- results ---- */

/*
 * One row: `xfers` transfers of `bytes` each took `ns` nanoseconds in all.
 * Table columns (fabtests): bytes iters total time MB/sec usec/xfer
 * Mxfers/sec, where total = bytes * xfers, MB/sec = total / usec and
 * usec/xfer = usec / xfers.  With -m one line of "key: value" pairs.
 */
struct tool_row {
	const char *op;        /* "write", "signal", "writedata", ... */
	const char *mode;      /* "lat" or "bw" */
	const char *provider;
	const char *signal;    /* the communicator's strategy */
	size_t bytes;
	long iters;
	uint64_t xfers;        /* iters * transfers per iteration */
	uint64_t ns;
};

/* Print the table header (once per stream) and the row, or the -m line. */
void tool_print_row(FILE *f, const struct tool_opts *o,
		    const struct tool_row *r);

/* ---- ranks ---- */

/* Physical cores this process may run on (at least 1). */
int tool_cores(void);
/* Bind forked rank r of n to its block of cores / n cores, as mpirun
 * --bind-to core would (nothing with more ranks than cores, or with
 * FABEP_BIND=none); returns the cores bound to, 0 when unbound. */
int tool_bind_rank(int r, int n);

/* A rank's body: return 0 or a negative fabep code (print why first). */
typedef int (*tool_rank_fn)(fabep_comm_t *comm, const struct tool_opts *o,
			    void *arg);

/*
 * Run fn on every rank, each with its own communicator made from attr
 * (provider, domain, threads and signal are filled in from o first):
 *  - o->nranks > 0: fork that many local ranks before touching libfabric,
 *    each with FABEP_RANK, FABEP_WORLD_SIZE and FABEP_ROOT=127.0.0.1:<a
 *    free port>; wait for them (killing the rest after a failure or after
 *    timeout_s) and report each rank that failed;
 *  - o->server / o->host: this process is rank 0 / rank 1 of 2, with the
 *    rendezvous on FABEP_ROOT, else 0.0.0.0:<port> / HOST:<port>;
 *  - otherwise one rank as the environment says (mpirun, srun, FABEP_*).
 * Returns a tool exit status.
 */
int tool_run(const struct tool_desc *d, const struct tool_opts *o,
	     const fabep_comm_attr_t *attr, int timeout_s, tool_rank_fn fn,
	     void *arg);

/* Whether the environment already places this process in a job
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS or FABEP_WORLD_SIZE). */
int tool_in_job(void);

/* Provider tuning the tools apply when the user did not: for sockets,
 * FI_SOCKETS_PE_WAITTIME=0 (its progress thread otherwise starves the
 * ranks on small machines). */
void tool_tune_provider(const char *provider);

/* Print "name: what: error text" to stderr and return err. */
int tool_fail(const char *what, int err);

/* Monotonic clock, nanoseconds. */
uint64_t tool_now_ns(void);

/* The rank timeout the library uses (FABEP_TIMEOUT_MS, default 30 s). */
uint64_t tool_timeout_ns(void);

/* ---- two-rank transfers (fabep_pingpong -b, fabep_bench -o write) ---- */

/* Heap objects of a two-rank test: the same offsets on both ranks. */
struct tool_rma {
	fabep_comm_t *comm;
	int rank, peer;        /* ranks 0 and 1 pair up */
	fabep_off_t src;       /* send buffer, max bytes */
	fabep_off_t dst;       /* receive buffer, max bytes */
	fabep_off_t sig;       /* this rank's counter, signalled by the peer */
	size_t max;
	uint64_t seen;         /* signals counted so far: the next wait target */
};

/* Check the communicator has 2 ranks and allocate the objects. */
int tool_rma_setup(fabep_comm_t *comm, size_t max, struct tool_rma *r);

/*
 * Bandwidth: per iteration rank 0 posts `window` transfers of len bytes
 * from its send buffer to rank 1's receive buffer (fabep_put, the last
 * one fabep_put_signal; with use_signal every one fabep_put_signal) and
 * waits for rank 1's zero-byte fabep_put_signal, sent once rank 1 has
 * seen the signals.  *ns gets the time of
 * the `iters` iterations after `warmup` untimed ones (on both ranks).
 */
int tool_rma_bw(struct tool_rma *r, int use_signal, size_t len, int window,
		long warmup, long iters, uint64_t *ns);

/* Default iterations for a size: latency 10000 / 1000 / 100 below 64 KiB
 * / below 1 MiB / above; bandwidth (windows) 1000 / 100 / 10.  Warm-up:
 * a tenth of that, at least 10, at most 1000. */
long tool_default_iters(size_t bytes, int bandwidth);
long tool_default_warmup(long iters);

/* Program name for messages (set by tool_parse). */
extern const char *tool_name;

#endif
