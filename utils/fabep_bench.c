/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fabep_bench - benchmarks of fabep's parts, one per -o:
 *
 *   write      raw put bandwidth between 2 ranks (fabep_put in windows):
 *              the reference rate the other operations compare with
 *   kernels    the local compute kernels (bench_kernels() in bench_kernels.c,
 *              which reaches internal kernels: fabep_bench links the
 *              convenience library)
 *   dispatch, combine, moe, allreduce, arnorm: hook points, filled in as
 *              those parts land (see parts[] below)
 *
 * Options are parsed by utils/common.c into struct tool_opts, then copied
 * into struct bench_opts (utils/bench.h), which every part receives.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "utils/common.h"
#include "utils/bench.h"

/* A part that runs on every rank of a communicator. */
typedef int (*bench_rank_fn)(fabep_comm_t *comm, const struct bench_opts *o,
			     FILE *out);

struct bench_part {
	const char *name;
	const char *what;
	/* Exactly one of local (runs once here, no communicator) and rank
	 * (runs on every rank) is set once the part exists; neither while it
	 * is "not available yet". */
	int (*local)(const struct bench_opts *o, FILE *out);
	bench_rank_fn rank;
	int default_ranks;  /* local ranks forked when -n is not given */
	/* the heap the part needs (NULL: the write sizes decide) */
	size_t (*heap)(const struct bench_opts *o, int nranks);
};

static int bench_write(fabep_comm_t *comm, const struct bench_opts *o,
		       FILE *out);

/* -o soak, and --soak SECONDS without -o (utils/bench_soak.c) */
int bench_soak(fabep_comm_t *comm, const struct bench_opts *o, FILE *out);
size_t bench_soak_heap_bytes(const struct bench_opts *o, int nranks);

/*
 * The table of parts.  To add one: write
 *   int bench_<name>(fabep_comm_t *comm, const struct bench_opts *o, FILE *out);
 * (declared in bench.h), set .rank here (or .local for a part without a
 * communicator) and add its help to the -o text below.
 */
static const struct bench_part parts[] = {
	{ "write", "raw put bandwidth between 2 ranks (reference rate)",
	  NULL, bench_write, 2, NULL },
	{ "kernels", "local compute kernels (GB/s per kernel and ISA level)",
	  bench_kernels, NULL, 0, NULL },
	{ "dispatch", "expert-parallel dispatch", NULL, bench_moe, 2,
	  bench_moe_heap_bytes },
	{ "combine", "expert-parallel combine", NULL, bench_moe, 2,
	  bench_moe_heap_bytes },
	{ "moe", "dispatch + combine, as one MoE layer", NULL, bench_moe, 2,
	  bench_moe_heap_bytes },
	{ "allreduce", "sum allreduce", NULL, bench_coll, 2, bench_coll_heap_bytes },
	{ "arnorm", "allreduce + RMSNorm + FP8", NULL, bench_coll, 2,
	  bench_coll_heap_bytes },
	{ "soak", "dispatch + combine + allreduce with fresh random routing "
	  "every round, all checked, for --soak SECONDS (default 10)",
	  NULL, bench_soak, 2, bench_soak_heap_bytes },
	{ "scale", "dispatch, combine, allreduce and arnorm over rank and token "
	  "counts, next to their floor and the MPI baseline",
	  bench_scale, NULL, 0, NULL },
};

#define NPARTS ((int)(sizeof(parts) / sizeof(parts[0])))

static const int bench_accept[] = {
	'o', 'p', 'd', 'I', 'w', 'm', 'n', 'T', 'S', 'W', 'B', 'K', 't', 'H',
	'k', 'e', 'f', TOOL_OPT_ROWS, TOOL_OPT_COLS, TOOL_OPT_CHECK,
	TOOL_OPT_SOAK, TOOL_OPT_ROUNDS, TOOL_OPT_NO_REF, 'V', 'h', 0
};

static const struct tool_help bench_help[] = {
	{ 'o', "PART",
	  "what to measure: write (raw put bandwidth between 2 ranks, the "
	  "reference rate), kernels (local compute kernels; default), "
	  "dispatch, combine, moe, allreduce, arnorm, soak (dispatch + combine "
	  "+ allreduce, every result checked; the default with --soak), scale "
	  "(dispatch, combine, allreduce and arnorm over the -n and -t lists, "
	  "each next to its floor and the MPI baseline)" },
	{ 'I', NULL,
	  "timed iterations (kernels: default 11, the median is shown; write: 1000 "
	  "windows below 64k, 100 below 1M, 10 from 1M; dispatch, combine, moe: "
	  "200 up to 8 tokens per rank, else 20; allreduce, arnorm: 200 below 1M "
	  "of input, 50 below 16M, 20 from 16M)" },
	{ 'w', NULL, "warm-up iterations (kernels: 2; write: a tenth of -I, 10 to "
		     "1000; dispatch, combine, moe: 20 up to 8 tokens per rank, else "
		     "3; allreduce, arnorm: a tenth of -I, at least 3)" },
	{ 'T', NULL, "worker threads per rank (default: FABEP_THREADS, else fabep's "
		     "choice); kernels run with 1 thread and with N" },
	{ 'n', "N|LIST", "fork N local ranks (default 2 for the parts that need "
		     "ranks, unless run under mpirun/srun); scale: a comma-separated "
		     "list (default 2,4,8,16)" },
	{ 'S', NULL,
	  "write: message sizes, one size, a comma-separated list (k, M, G "
	  "suffixes) or all (powers of two, 1 to 4M); default 64k,1M,4M" },
	{ 'W', NULL, "write: puts per window (default 64)" },
	{ 'B', NULL, "kernels: input bytes per kernel, at least 16 rows of -H "
		     "(default 64M)" },
	{ 'K', NULL, "kernels: run only this kernel, e.g. bf16_to_f32, "
		     "fp8_quant_bf16_b128, rmsnorm_bf16_fp8, topk8_sum_bf16 "
		     "(an unknown name lists them all; default: all)" },
	{ 't', "N|LIST", "dispatch, combine, moe: tokens per rank (default 128; "
		     "soak: 64, the most a rank sends in a round); scale: a list "
		     "(default 1,8,128,1024)" },
	{ 'H', NULL, "hidden size, elements per row (kernels, dispatch, combine, "
		     "moe: default 7168; soak: 256)" },
	{ 'k', NULL, "dispatch, combine, moe: experts per token (top-k), at most "
		     "32 (default 8; soak: 3)" },
	{ 'e', NULL, "dispatch, combine, moe: experts in all, a multiple of the "
		     "ranks (default 256; soak: 4 per rank)" },
	{ 'f', NULL, "data format: bf16, fp8 (quantized in dispatch), fp8pre "
		     "(dispatch, combine, moe: FP8 the caller quantized) or fp32 "
		     "(default: the part's)" },
	{ TOOL_OPT_CHECK, NULL,
	  "check results (write: the receiver compares the data after each size; "
	  "dispatch, combine, moe: the combine outputs; allreduce, arnorm: one "
	  "more call per shape against a reference in double)" },
	{ TOOL_OPT_ROWS, "N|LIST", "rows of the allreduce input (default: 1, 16, "
				   "128, 1024 and 8192, one shape each; soak: at "
				   "most 48); scale: a list (default 16,128,1024)" },
	{ TOOL_OPT_COLS, NULL, "columns of the allreduce input (default 7168; "
			       "soak: at most 1024)" },
	{ TOOL_OPT_SOAK, NULL,
	  "without -o (or with -o soak): run dispatch + combine + allreduce "
	  "with fresh random routing every round for SECONDS (at most 604800: "
	  "7 days), checking every "
	  "result, and report rounds, errors and resident memory after the "
	  "warm-up and at the end (exit 1 on an error or a growth above 8 MiB "
	  "of newly allocated memory); "
	  "with -o write: repeat the write test for SECONDS, checking the data" },
	{ TOOL_OPT_ROUNDS, NULL,
	  "scale: measure every row N times (at most 100), fabep and the MPI "
	  "baseline in turn, and show the medians, the median of the rounds' "
	  "speedups and their range (default 1)" },
	{ TOOL_OPT_NO_REF, NULL,
	  "dispatch, combine, moe: time the part alone, without the references "
	  "(raw puts, memcpy, floor), which take most of a run's time: a quick "
	  "check, or a run under a profiler" },
	{ 0, NULL, NULL },
};

static const struct tool_desc bench_desc = {
	.name = "fabep_bench",
	.args = NULL,
	.summary = "Benchmarks of fabep: raw put bandwidth (-o write), the compute "
		   "kernels (-o kernels), expert-parallel dispatch and combine, and "
		   "the allreduce collectives, each next to a reference measured in "
		   "the same run.",
	.accept = bench_accept,
	.help = bench_help,
	.max_args = 0,
	.lists = "-o scale",
	.epilog =
		"The write part prints fabep_pingpong's table (bytes iters total time\n"
		"MB/sec usec/xfer Mxfers/sec), or with -m one line per size: op, mode,\n"
		"provider, signal, bytes, iters, xfers, time_s, usec_per_xfer, MBps,\n"
		"Mxfers_per_s.\n"
		"\n"
		"dispatch, combine and moe time every rank's calls (an iteration takes\n"
		"its slowest rank's time) and compare the bytes rank 0 put to other\n"
		"ranks with fabep_put of the same bytes, timed alike (ref: caches warm;\n"
		"ref_live: source rewritten and received bytes read before each round;\n"
		"ref_cold: caches flushed first), and the local work with a memcpy on\n"
		"the pool's thread count; floor: the phase's least local traffic at that\n"
		"rate, ceiling_live: the best ratio_live it allows; overlap_us: the live\n"
		"put while the pool's other threads copy the floor's bytes,\n"
		"ceiling_overlap: the best ratio_live with all local work overlapped.\n"
		"With -m one line:\n"
		"op, provider, ranks, tokens, hidden, topk, experts, format, bytes,\n"
		"median_us, min_us, GBps, ref_GBps, ratio, mode (copy|zcopy), ref_us,\n"
		"wire_us, wire_ratio, local_us, local_bytes, memcpy_us, local_vs_memcpy,\n"
		"rows, input (caller|send_buffer), ref_cold_us, ref_cold_GBps,\n"
		"ratio_cold, ref_live_us, ref_live_GBps, ratio_live, floor_bytes,\n"
		"floor_us, ceiling_live, overlap_us, ceiling_overlap, channels, check,\n"
		"put_us (the posting part of wire_us), signal, pull_us, rank_min_us,\n"
		"rank_median_us, rank_max_us (each rank's median call: the least, the\n"
		"median rank's, the largest), slowest_rank (the rank with the largest).\n"
		"With --no-ref none of the references is measured, and -m gives: op,\n"
		"provider, ranks, tokens, hidden, topk, experts, format, bytes,\n"
		"median_us, min_us, GBps, mode, wire_us, local_us, local_bytes, rows,\n"
		"input, channels, check, put_us, signal, rank_min_us, rank_median_us,\n"
		"rank_max_us, slowest_rank, refs (none).\n"
		"The references write each peer's bytes as one write on one channel;\n"
		"phases split theirs over FABEP_CHANNELS (fabep(7)).\n"
		"allreduce and arnorm compare with a raw write of the same bytes and with\n"
		"the separate steps; -m: op, provider, signal, ranks, threads, dtype,\n"
		"rows, cols, bytes, iters, path, median_us, ref_median_us, ratio, check.\n"
		"\n"
		"scale runs every other part as a child (this program, -n N -m) for\n"
		"each rank count of -n and each token count of -t (dispatch, combine)\n"
		"or row count of --rows (allreduce, arnorm: fp32; default 16,128,1024),\n"
		"and, when configure found MPI, fabep_mpi_bench with the same shapes\n"
		"and routing under mpirun (--bind-to core; beyond the cores\n"
		"--oversubscribe --bind-to none, as the forked ranks are then unbound;\n"
		"--allow-run-as-root as root).  Per row: the median, the floor\n"
		"(dispatch, combine: the larger of ref_live_us, every rank putting the\n"
		"phase's bytes, and floor_us, its least local traffic at memcpy's rate;\n"
		"allreduce, arnorm: the raw write of the input's bytes, every rank at\n"
		"once), median / floor, MPI's\n"
		"median and MPI / fabep (n/a without the baseline; mpi_us failed where\n"
		"it ran and failed, and the run exits 1).  --rounds N runs\n"
		"each row N times, fabep and the baseline in turn: the medians of the\n"
		"rounds, the median of their speedups, and (with N > 1) its range.\n"
		"With -m: op (scale), part, ranks, tokens or rows, median_us,\n"
		"floor_us, ratio, wire_us, local_us, mpi_us, speedup, result, rounds,\n"
		"speedup_min, speedup_max.\n"
		"\n"
		"--soak (-o soak) prints rounds, errors and each rank's VmRSS after the\n"
		"warm-up (a tenth of the run, at least 20 rounds) and at the end, and\n"
		"how much its VmData grew meanwhile; a rank's growth is its VmRSS's as\n"
		"far as VmData grew too (pages allocated before and first touched\n"
		"later, as the symmetric heap's, are no leak); with -m one line: op,\n"
		"seconds, ranks, provider, rounds, errors, rss_kb_R (start/end per\n"
		"rank), vmdata_growth_kb_R, rss_growth_kb (the largest growth),\n"
		"growth_bound_kb, result (ok or FAIL).\n"
		"\n"
		"Environment: FABEP_BENCH_SCALE_PARTS (scale: a comma-separated\n"
		"subset of dispatch,combine,allreduce,arnorm), FABEP_MPI_BENCH and\n"
		"FABEP_MPIRUN (scale: the baseline and mpirun to use; none: no\n"
		"baseline),\n"
		"FABEP_BENCH_ZERO_COPY=1 (MoE handle with\n"
		"FABEP_MOE_ZERO_COPY), FABEP_BENCH_SEND_BUFFER=1 (dispatch takes its\n"
		"tokens from fabep_moe_send_buffer, filled before the timed call),\n"
		"FABEP_BENCH_EXPERT_US=N (an untimed pause of N us before each combine:\n"
		"the experts' compute, fabep's threads idle), FABEP_BENCH_PULL=1\n"
		"(combine, moe: also pull_us, every rank fetching its tokens' rows\n"
		"from the peers with fabep_get, a row a read, and summing them in\n"
		"cache), FABEP_BENCH_SLOW_US=N with FABEP_BENCH_SLOW_RANK=R (rank R's\n"
		"clock runs N us on after each timed call: a slow rank, which\n"
		"slowest_rank must name), FABEP_BIND=none (forked ranks unbound).\n"
		"A bench variable set for a part that does not read it, or to a value\n"
		"it does not take, is a bad command line.\n"
		"\n"
		"Exit status: 0 success, 1 a run failed or a check found an error,\n"
		"2 bad command line.\n",
};

/* The parsed command line, for parts that read more than bench_opts has
 * (write: the sizes and window). */
static struct tool_opts g_opts;

static uint8_t pattern(size_t i, size_t len, long pass)
{
	return (uint8_t)(i * 131u + len * 7u + (size_t)pass * 17u + 1u);
}

/* Tell rank 1 whether another soak pass follows (rank 0 decides). */
static int soak_decide(struct tool_rma *r, fabep_off_t ctl, int more)
{
	uint64_t *p = fabep_heap_ptr(r->comm, ctl);
	int ret;

	if (r->rank == 0) {
		*p = more ? 1 : 2;
		ret = fabep_put_signal(r->comm, r->peer, ctl, ctl, 8, r->sig, 1);
		if (ret)
			return tool_fail("fabep_put_signal", ret);
		ret = fabep_flush(r->comm);
		if (ret)
			return tool_fail("fabep_flush", ret);
		return more;
	}
	ret = fabep_wait(r->comm, r->sig, ++r->seen);
	if (ret)
		return tool_fail("fabep_wait", ret);
	return __atomic_load_n(p, __ATOMIC_ACQUIRE) == 1;
}

static int bench_write(fabep_comm_t *comm, const struct bench_opts *bo,
		       FILE *out)
{
	const struct tool_opts *o = &g_opts;
	int window = o->window ? o->window : 64;
	int check = bo->check || bo->soak_s > 0;
	uint64_t t_end = 0, errors = 0;
	struct tool_rma r;
	fabep_off_t ctl;
	long pass = 0;
	int ret, more;

	ret = tool_rma_setup(comm, o->sizes[o->nsizes - 1], &r);
	if (ret)
		return ret;
	ret = fabep_heap_alloc(comm, 64, 64, &ctl);
	if (ret)
		return tool_fail("fabep_heap_alloc", ret);
	if (r.rank == 0 && !bo->machine) {
		fprintf(out, "# %s -o write: fabep_put bandwidth, window %d, "
			"provider %s, domain %s, signal %s%s\n", tool_name, window,
			fabep_comm_provider(comm), fabep_comm_domain(comm),
			fabep_signal_name(fabep_comm_signal(comm)),
			check ? ", checked" : "");
		fflush(out);
	}
	if (bo->soak_s > 0)
		t_end = tool_now_ns() + (uint64_t)(bo->soak_s * 1e9);

	do {
		for (int s = 0; s < o->nsizes; s++) {
			size_t len = o->sizes[s];
			long iters = bo->iters ? bo->iters : tool_default_iters(len, 1);
			long warmup = bo->warmup >= 0 ? bo->warmup :
							tool_default_warmup(iters);
			uint8_t *src = fabep_heap_ptr(comm, r.src);
			uint8_t *dst = fabep_heap_ptr(comm, r.dst);
			struct tool_row row = {
				.op = "write", .mode = "bw",
				.provider = fabep_comm_provider(comm),
				.signal = fabep_signal_name(fabep_comm_signal(comm)),
				.bytes = len, .iters = iters,
				.xfers = (uint64_t)iters * (uint64_t)window,
			};

			if (check) {
				if (r.rank == 0)
					for (size_t i = 0; i < len; i++)
						src[i] = pattern(i, len, pass);
				else
					memset(dst, 0, len);
				ret = fabep_barrier(comm);
				if (ret)
					return tool_fail("fabep_barrier", ret);
			}
			ret = tool_rma_bw(&r, 0, len, window, warmup, iters, &row.ns);
			if (ret)
				return ret;
			if (check && r.rank == 1) {
				for (size_t i = 0; i < len; i++) {
					if (dst[i] == pattern(i, len, pass))
						continue;
					if (errors < 10)
						fprintf(stderr, "%s: rank 1: write of %zu bytes, "
							"pass %ld: byte %zu is 0x%02x, want 0x%02x\n",
							tool_name, len, pass, i, dst[i],
							pattern(i, len, pass));
					errors++;
				}
			}
			if (r.rank == 0 && pass == 0)
				tool_print_row(out, o, &row);
		}
		pass++;
		more = t_end ? soak_decide(&r, ctl, tool_now_ns() < t_end) : 0;
		if (more < 0)
			return more;
	} while (more);

	if (r.rank == 1 && check) {
		if (errors) {
			fprintf(stderr, "%s: rank 1: %llu wrong bytes in %ld passes\n",
				tool_name, (unsigned long long)errors, pass);
			return -EIO;
		}
		if (t_end)
			fprintf(stderr, "%s: soak: %ld passes, all data checked, no errors\n",
				tool_name, pass);
	}
	ret = fabep_barrier(comm);
	if (ret)
		return tool_fail("fabep_barrier", ret);
	return 0;
}

struct rank_ctx {
	const struct bench_part *part;
	const struct bench_opts *bo;
};

static int bench_rank(fabep_comm_t *comm, const struct tool_opts *o, void *arg)
{
	const struct rank_ctx *c = arg;
	int ret = c->part->rank(comm, c->bo, stdout);

	fflush(stdout);
	return ret;
}

static bool part_in(const char *name, const char *list)
{
	size_t n = strlen(name);
	const char *p;

	for (p = list; (p = strstr(p, name)); p += n)
		if ((p == list || p[-1] == ' ') && (p[n] == ' ' || !p[n]))
			return true;
	return false;
}

/* The bench's own switches and the parts that read them */
static const struct {
	const char *name, *parts;
} env_use[] = {
	{ "FABEP_BENCH_ZERO_COPY", "dispatch combine moe scale" },
	{ "FABEP_BENCH_SEND_BUFFER", "dispatch combine moe scale" },
	{ "FABEP_BENCH_PULL", "combine moe" },
};

/* The bench's numeric variables: 0 to max (-1: to the ranks - 1) */
static const struct {
	const char *name;
	long max;
} env_num[] = {
	{ "FABEP_BENCH_EXPERT_US", 10000000 },
	{ "FABEP_BENCH_SLOW_US", 10000000 },
	{ "FABEP_BENCH_SLOW_RANK", -1 },
};

/* A list of parts "a b c" as it reads in a message: "a, b, c" */
static const char *parts_text(const char *parts, char *buf, size_t len)
{
	size_t k = 0;

	for (; *parts && k + 3 < len; parts++)
		if (*parts == ' ') {
			buf[k++] = ',';
			buf[k++] = ' ';
		} else {
			buf[k++] = *parts;
		}
	buf[k] = 0;
	return buf;
}

static void __attribute__((noreturn))
env_unused(const char *name, const char *parts, const char *p)
{
	char list[128];

	tool_usage_error(&bench_desc, "%s is for -o %s, not -o %s (unset it)",
			 name, parts_text(parts, list, sizeof(list)), p);
}

/* An option the part would not use is refused, as a mistyped one is:
 * a run that silently ignored it would measure something else than
 * asked.  So are shapes that cannot run, before any rank starts. */
static void bench_check_opts(const struct tool_opts *o, const char *p)
{
	static const struct {
		const char *opt, *parts;
	} *u, use[] = {
		{ "-S", "write" },
		{ "-W", "write" },
		{ "--soak", "write soak" },
		{ "-B", "kernels" },
		{ "-K", "kernels" },
		{ "-n", "write dispatch combine moe allreduce arnorm soak scale" },
		{ "-t", "dispatch combine moe soak scale" },
		{ "-k", "dispatch combine moe soak scale" },
		{ "-e", "dispatch combine moe soak scale" },
		{ "-H", "kernels dispatch combine moe soak scale" },
		{ "--rows", "allreduce arnorm soak scale" },
		{ "--cols", "allreduce arnorm soak scale" },
		{ "--check", "write dispatch combine moe allreduce arnorm soak scale" },
		{ "-I", "write kernels dispatch combine moe allreduce arnorm scale" },
		{ "-w", "write kernels dispatch combine moe allreduce arnorm scale" },
		{ "-f", "dispatch combine moe allreduce arnorm soak scale" },
		{ "--rounds", "scale" },
		{ "--no-ref", "dispatch combine moe" },
		{ "-p", "write dispatch combine moe allreduce arnorm soak scale" },
		{ "-d", "write dispatch combine moe allreduce arnorm soak scale" },
	};
	bool given[sizeof(use) / sizeof(use[0])] = {
		o->nsizes > 0, o->window > 0, o->soak_s > 0, o->bytes > 0,
		o->kernel != NULL, o->nranks > 0, o->tokens > 0, o->topk > 0,
		o->experts > 0, o->hidden > 0, o->rows > 0, o->cols > 0,
		o->check != 0, o->iters > 0, o->warmup >= 0, o->format != NULL,
		o->rounds > 0, o->no_ref != 0, o->provider != NULL,
		o->domain != NULL,
	};
	size_t i;
	int n, e, k;
	bool moe, soak;

	for (i = 0, u = use; i < sizeof(use) / sizeof(use[0]); i++, u++)
		if (given[i] && !part_in(p, u->parts)) {
			char list[128];

			tool_usage_error(&bench_desc, "%s is for -o %s, not -o %s",
					 u->opt, parts_text(u->parts, list, sizeof(list)),
					 p);
		}
	if (o->format && (part_in(p, "allreduce arnorm soak")) &&
	    strcmp(o->format, "bf16") && strcmp(o->format, "fp32"))
		tool_usage_error(&bench_desc, "-o %s takes -f bf16 or fp32", p);
	/* the parts read these as on unless unset, empty or 0: any other
	 * spelling (no, off) is refused here, not taken for on; so is one
	 * the part would not read, as an unused option is (scale passes
	 * them to its dispatch and combine rows) */
	for (i = 0; i < sizeof(env_use) / sizeof(env_use[0]); i++)
		if (tool_env_switch(&bench_desc, env_use[i].name) &&
		    !part_in(p, env_use[i].parts))
			env_unused(env_use[i].name, env_use[i].parts, p);
	if (tool_env_on("FABEP_BENCH_SEND_BUFFER") && o->format &&
	    !strcmp(o->format, "fp8"))
		tool_usage_error(&bench_desc, "FABEP_BENCH_SEND_BUFFER=1: -f fp8 "
				 "quantizes the caller's rows on the way, from no "
				 "send buffer (bf16, fp8pre and fp32 have one)");
	/* the ranks main forks when -n is not given, outside a job */
	n = o->nranks ? o->nranks : tool_in_job() ? 0 : 2;
	/* the numbers the MoE parts read, checked before any rank starts */
	for (i = 0; i < sizeof(env_num) / sizeof(env_num[0]); i++) {
		const char *v = getenv(env_num[i].name);
		long max = env_num[i].max;
		char *end;
		long x;

		if (!v || !*v)
			continue;
		if (!part_in(p, "dispatch combine moe scale"))
			env_unused(env_num[i].name, "dispatch combine moe scale", p);
		/* the slow rank: one of the ranks (any under a launcher, where
		 * the part checks it; scale: of its smallest -n) */
		if (max < 0) {
			int least = n;

			for (k = 0; !strcmp(p, "scale") && k < o->n_nranks; k++)
				if (!k || o->nranks_list[k] < least)
					least = o->nranks_list[k];
			max = least > 0 ? least - 1 : INT_MAX;
		}
		errno = 0;
		x = strtol(v, &end, 10);
		if (!(*v >= '0' && *v <= '9') || errno || *end || x > max)
			tool_usage_error(&bench_desc, "%s=%s: expected a whole "
					 "number from 0 to %ld", env_num[i].name, v,
					 max);
	}
	if (!strcmp(p, "scale") && getenv("FABEP_MPI_BENCH") &&
	    *getenv("FABEP_MPI_BENCH") && strcmp(getenv("FABEP_MPI_BENCH"), "none") &&
	    access(getenv("FABEP_MPI_BENCH"), X_OK))
		tool_usage_error(&bench_desc, "FABEP_MPI_BENCH=%s: not an executable "
				 "file (%s; none runs no baseline)",
				 getenv("FABEP_MPI_BENCH"), strerror(errno));
	if (!strcmp(p, "scale") && !bench_scale_want(NULL))
		tool_usage_error(&bench_desc, "FABEP_BENCH_SCALE_PARTS=%s: not a "
				 "comma-separated list of dispatch, combine, "
				 "allreduce, arnorm", getenv("FABEP_BENCH_SCALE_PARTS"));
	/* the allreduce's input with the part's default for what was not
	 * given (rows: allreduce, arnorm 8192 at most, scale 1024, soak 48;
	 * cols: 7168, soak 1024; fp32 but for allreduce and arnorm's bf16):
	 * a shape fabep_allreduce cannot take is the command line's fault,
	 * and is said so before the heap's size is reckoned from it */
	if ((o->rows > 0 || o->cols > 0) && part_in(p, "allreduce arnorm soak scale")) {
		bool soak_p = !strcmp(p, "soak");
		size_t cols = o->cols > 0 ? (size_t)o->cols : soak_p ? 1024 : 7168;
		size_t es = part_in(p, "allreduce arnorm") &&
			    !(o->format && !strcmp(o->format, "fp32")) ? 2 : 4;
		size_t rows = soak_p ? 48 : !strcmp(p, "scale") ? 1024 : 8192;

		if (o->rows > 0)
			for (i = 0, rows = 0; i < (size_t)(o->n_rows ? o->n_rows : 1); i++)
				if ((size_t)o->rows_list[i] > rows)
					rows = (size_t)o->rows_list[i];
		if (!bench_coll_fits(rows, cols, es))
			tool_usage_error(&bench_desc, "-o %s: the allreduce's shape is "
					 "too large: %zu rows x %zu cols of %zu bytes pass "
					 "2^%d bytes", p, rows, cols, es,
					 BENCH_COLL_MAX_LOG2);
	}
	/* the MoE parts' shapes with their defaults (bench_cfg: -e 256,
	 * -k 8).  soak's defaults follow the ranks (-e 4 per rank, -k 3,
	 * at most the experts): a -k given must fit them, as a soak that
	 * quietly ran with fewer experts per token would test something
	 * else than asked (under a launcher, the ranks and so the default
	 * -e are known only to the part, which refuses it there) */
	moe = part_in(p, "dispatch combine moe scale");
	soak = !strcmp(p, "soak");
	e = o->experts > 0 ? o->experts : moe ? 256 : soak ? 4 * n : 0;
	k = o->topk > 0 ? o->topk : moe ? 8 : 0;
	if (k > 0 && e > 0 && k > e) {
		char why[64] = "";

		if (soak && o->experts <= 0)
			snprintf(why, sizeof(why), " (soak's default -e: 4 per "
				 "rank, %d ranks)", n);
		else if (o->experts <= 0 || o->topk <= 0)
			snprintf(why, sizeof(why), " (the default -e 256, -k 8)");
		tool_usage_error(&bench_desc, "-k %d is more than the -e %d "
				 "experts%s", k, e, why);
	}
	if (e > 0 && n > 0 && part_in(p, "dispatch combine moe soak") && e % n)
		tool_usage_error(&bench_desc, "-e %d experts are not a multiple of "
				 "the %d ranks%s", e, n, o->experts > 0 ? "" :
				 " (the default -e 256)");
	/* the experts matter only to the rows of dispatch and combine */
	for (i = 0; e > 0 && !strcmp(p, "scale") && (bench_scale_want("dispatch") ||
	     bench_scale_want("combine")) && i < (size_t)o->n_nranks; i++)
		if (e % o->nranks_list[i])
			tool_usage_error(&bench_desc, "-e %d experts are not a "
					 "multiple of the -n %d ranks%s", e,
					 o->nranks_list[i], o->experts > 0 ? "" :
					 " (the default -e 256)");
}

int main(int argc, char **argv)
{
	static const size_t write_sizes[] = { 64 << 10, 1 << 20, 4 << 20 };
	struct bench_opts bo;
	const struct bench_part *part = NULL;
	struct tool_opts *o = &g_opts;
	struct rank_ctx ctx;
	fabep_comm_attr_t attr;
	size_t need;
	int ret;

	tool_parse(&bench_desc, argc, argv, o);
	if (!o->op)
		o->op = o->soak_s > 0 ? "soak" : "kernels";
	for (int i = 0; i < NPARTS; i++)
		if (!strcmp(o->op, parts[i].name))
			part = &parts[i];
	if (!part)
		tool_usage_error(&bench_desc, "unknown part '%s' for -o: expected "
				 "write, kernels, dispatch, combine, moe, allreduce, "
				 "arnorm, soak or scale", o->op);
	if (o->format && strcmp(o->format, "bf16") && strcmp(o->format, "fp8") &&
	    strcmp(o->format, "fp8pre") && strcmp(o->format, "fp32"))
		tool_usage_error(&bench_desc, "unknown format '%s' for -f: expected "
				 "bf16, fp8, fp8pre or fp32", o->format);
	if (o->format && !strcmp(o->format, "fp8pre") && strcmp(o->op, "dispatch") &&
	    strcmp(o->op, "combine") && strcmp(o->op, "moe"))
		tool_usage_error(&bench_desc, "-f fp8pre is for -o dispatch, combine "
				 "or moe");
	if (!strcmp(part->name, "write") && o->nranks && o->nranks != 2)
		tool_usage_error(&bench_desc, "-o write runs between 2 ranks, not -n %d",
				 o->nranks);
	bench_check_opts(o, part->name);

	memset(&bo, 0, sizeof(bo));
	bo.op = part->name;
	bo.provider = o->provider;
	bo.domain = o->domain;
	bo.iters = o->iters;
	bo.warmup = o->warmup;
	bo.machine = o->machine;
	bo.nranks = o->nranks;
	bo.threads = o->threads;
	bo.bytes = o->bytes ? o->bytes : (size_t)64 << 20;
	bo.kernel = o->kernel;
	bo.tokens = o->tokens;
	bo.hidden = o->hidden;
	bo.topk = o->topk;
	bo.experts = o->experts;
	bo.format = o->format;
	bo.rows = o->rows;
	bo.cols = o->cols;
	bo.check = o->check;
	bo.soak_s = o->soak_s;
	bo.rounds = o->rounds;
	bo.no_ref = o->no_ref;
	bo.ranks_list = o->nranks_list;
	bo.n_ranks = o->n_nranks;
	bo.tokens_list = o->tokens_list;
	bo.n_tokens = o->n_tokens;
	bo.rows_list = o->rows_list;
	bo.n_rows = o->n_rows;

	if (!part->local && !part->rank) {
		fprintf(stderr, "%s: -o %s: not available yet in this build (%s)\n",
			tool_name, part->name, part->what);
		return TOOL_EXIT_FAIL;
	}
	{
		/* an unknown -K, a -B too small for -H, a MoE shape the
		 * library refuses: a bad command line, told as any other
		 * (message, usage, exit 2) before any rank starts; under a
		 * launcher the ranks are known only to the part */
		char why[1024];
		int n = o->nranks ? o->nranks : tool_in_job() ? 0 :
			part->default_ranks;

		if (!strcmp(part->name, "kernels") &&
		    bench_kernels_check(&bo, why, sizeof(why)))
			tool_usage_error(&bench_desc, "%s", why);
		if (part_in(part->name, "dispatch combine moe") && n > 0 &&
		    bench_moe_check(&bo, n, why, sizeof(why)))
			tool_usage_error(&bench_desc, "%s", why);
		if (!strcmp(part->name, "scale") &&
		    bench_scale_check(&bo, why, sizeof(why)))
			tool_usage_error(&bench_desc, "%s", why);
	}
	if (part->local) {
		ret = part->local(&bo, stdout);
		fflush(stdout);
		if (ret == -EIO && !strcmp(part->name, "scale"))
			return TOOL_EXIT_FAIL;  /* its rows said what failed */
		if (ret) {
			fprintf(stderr, "%s: -o %s: %s\n", tool_name, part->name,
				fabep_strerror(ret));
			return TOOL_EXIT_FAIL;
		}
		return TOOL_EXIT_OK;
	}

	if (!o->nsizes) {
		o->nsizes = 3;
		memcpy(o->sizes, write_sizes, sizeof(write_sizes));
	}
	if (!o->nranks && !tool_in_job())
		o->nranks = part->default_ranks;
	bo.nranks = o->nranks;

	fabep_comm_attr_init(&attr);
	if (part->heap) {
		/* under mpirun/srun the rank count is only known inside the
		 * ranks: there FABEP_HEAP_SIZE must be large enough */
		if (o->nranks)
			attr.heap_size = part->heap(&bo, o->nranks);
	} else {
		need = 2 * o->sizes[o->nsizes - 1] + (1u << 20);
		if (need > (64u << 20))
			attr.heap_size = need;
	}
	ctx.part = part;
	ctx.bo = &bo;
	return tool_run(&bench_desc, o, &attr,
			300 + (int)(o->soak_s > 0 ? o->soak_s : 0), bench_rank, &ctx);
}
