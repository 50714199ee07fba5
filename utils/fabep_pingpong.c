/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fabep_pingpong - latency and bandwidth of fabep's one-sided layer
 * between two ranks, in the look of fabtests' fi_rma_pingpong / fi_rma_bw.
 *
 *   -o write      fabep_put of a payload whose last word (last byte for
 *                 sizes that are not a multiple of 8) carries a sequence
 *                 number the receiver polls with fabep_progress: the raw
 *                 fi_write path.
 *   -o signal     fabep_put_signal, fabep_wait on the counter: the put +
 *                 signal path with the provider's signal strategy.
 *   -o writedata  as signal, with the communicator forced to the cqdata
 *                 strategy (fi_writedata + FI_REMOTE_CQ_DATA).
 *
 * Latency mode (default): a ping-pong; usec/xfer is half the round trip.
 * Bandwidth mode (-b): windows of transfers, each window answered once.
 */
#include "config.h"

#include <errno.h>
#include <sched.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "utils/common.h"

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

enum pp_op { PP_WRITE, PP_SIGNAL, PP_WRITEDATA };

static const char *const pp_op_names[] = { "write", "signal", "writedata" };

static const int pp_accept[] = {
	'p', 'd', 'I', 'w', 'S', 'o', 'b', 'W', 'm', 'n', 's', 'P', 'V', 'h', 0
};

static const struct tool_help pp_help[] = {
	{ 'o', "write|signal|writedata[,...]",
	  "write: fabep_put, the receiver polls the payload's last word; "
	  "signal: fabep_put_signal + fabep_wait (default); "
	  "writedata: as signal, with the cqdata strategy (fi_writedata); "
	  "a list (e.g. write,signal) runs each in one run and compares "
	  "each with the first" },
	{ 'I', NULL,
	  "timed iterations per size (default: 10000 below 64k, 1000 below 1M, "
	  "100 from 1M; with -b windows: 1000, 100, 10)" },
	{ 'w', NULL, "warm-up iterations per size (default: a tenth of -I, 10 to 1000)" },
	{ 'S', NULL,
	  "transfer sizes: one size, a comma-separated list (k, M, G suffixes), "
	  "or all (powers of two, 1 to 4M); default 64,4k,64k,1M" },
	{ 'n', NULL,
	  "fork N local ranks; must be 2 (default when neither -s nor HOST is "
	  "given and not run under mpirun/srun)" },
	{ 0, NULL, NULL },
};

static const struct tool_desc pp_desc = {
	.name = "fabep_pingpong",
	.args = "[HOST]",
	.summary = "Latency (ping-pong, usec/xfer = one way) and bandwidth (-b) of "
		   "fabep's put, put + signal and writedata between two ranks.",
	.accept = pp_accept,
	.help = pp_help,
	.max_args = 1,
	.ranks_min = 2,
	.ranks_max = 2,
	.epilog =
		"Ranks: with neither -s nor HOST, two local ranks are forked (-n 2);\n"
		"under mpirun or srun (2 ranks) each process is one rank.  Across hosts\n"
		"run 'fabep_pingpong -s [OPTIONS]' on one (rank 0) and\n"
		"'fabep_pingpong [OPTIONS] HOST' on the other (rank 1).\n"
		"\n"
		"Columns: bytes iters total time MB/sec usec/xfer Mxfers/sec, where\n"
		"MB/sec = bytes / usec/xfer (10^6 bytes per second).  With -m, one line\n"
		"per size: op, mode, provider, signal, bytes, iters, xfers, time_s,\n"
		"usec_per_xfer, MBps, Mxfers_per_s.\n"
		"\n"
		"Exit status: 0 success, 1 a run failed, 2 bad command line.\n",
};

#define PP_MAX_OPS 3
#define PP_MAX_SIZES 64

struct pp_ctx {
	enum pp_op ops[PP_MAX_OPS];  /* -o a,b: run each, in one communicator */
	int nops;
	enum pp_op op;               /* the op being run */
	double mbps[PP_MAX_OPS][PP_MAX_SIZES];
	double usec[PP_MAX_OPS][PP_MAX_SIZES];
};

/* Wait until the flag at p reads `want`, driving progress; spin, then
 * yield, then sleep briefly (as fabep_wait does), so that ranks on a
 * busy machine still get the cores they need. */
static int poll_flag(fabep_comm_t *comm, const void *p, int word,
		     uint64_t want)
{
	uint64_t deadline = 0;
	unsigned spins = 0;
	int ret;

	for (;;) {
		uint64_t v = word ?
			__atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE) :
			__atomic_load_n((const uint8_t *)p, __ATOMIC_ACQUIRE);

		if (v == want)
			return 0;
		ret = fabep_progress(comm);
		if (ret < 0)
			return tool_fail("fabep_progress", ret);
		spins++;
		if (spins < 64) {
			cpu_relax();
		} else if (spins < 64 + 256) {
			sched_yield();
		} else {
			struct timespec ts = { 0, 20000 };
			uint64_t now = tool_now_ns();

			if (!deadline) {
				deadline = now + tool_timeout_ns();
			} else if (now > deadline) {
				fprintf(stderr, "%s: rank %d: the peer's write never "
					"arrived (flag %llu, want %llu)\n", tool_name,
					fabep_comm_rank(comm), (unsigned long long)v,
					(unsigned long long)want);
				return -ETIMEDOUT;
			}
			nanosleep(&ts, NULL);
		}
	}
}

static void set_flag(void *p, int word, uint64_t v)
{
	if (word)
		__atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
	else
		__atomic_store_n((uint8_t *)p, (uint8_t)v, __ATOMIC_RELEASE);
}

/* One ping-pong exchange of the write op; i numbers it within a size. */
static int pp_write_round(struct tool_rma *r, size_t len, long i)
{
	int word = len >= 8 && len % 8 == 0;
	size_t at = len - (word ? 8 : 1);
	char *src = fabep_heap_ptr(r->comm, r->src);
	char *dst = fabep_heap_ptr(r->comm, r->dst);
	uint64_t v = word ? (uint64_t)i + 1 : (uint64_t)(i % 255) + 1;
	int ret;

	if (r->rank == 1) {
		ret = poll_flag(r->comm, dst + at, word, v);
		if (ret)
			return ret;
		ret = fabep_flush(r->comm);
		if (ret)
			return tool_fail("fabep_flush", ret);
	}
	set_flag(src + at, word, v);
	ret = fabep_put(r->comm, r->peer, r->dst, r->src, len);
	if (ret)
		return tool_fail("fabep_put", ret);
	if (r->rank == 0) {
		ret = poll_flag(r->comm, dst + at, word, v);
		if (ret)
			return ret;
		ret = fabep_flush(r->comm);
		if (ret)
			return tool_fail("fabep_flush", ret);
	}
	return 0;
}

/* One ping-pong exchange of put + signal (signal and writedata ops). */
static int pp_signal_round(struct tool_rma *r, size_t len)
{
	int ret;

	if (r->rank == 1) {
		ret = fabep_wait(r->comm, r->sig, ++r->seen);
		if (ret)
			return tool_fail("fabep_wait", ret);
		ret = fabep_flush(r->comm);
		if (ret)
			return tool_fail("fabep_flush", ret);
	}
	ret = fabep_put_signal(r->comm, r->peer, r->dst, r->src, len, r->sig, 1);
	if (ret)
		return tool_fail("fabep_put_signal", ret);
	if (r->rank == 0) {
		ret = fabep_wait(r->comm, r->sig, ++r->seen);
		if (ret)
			return tool_fail("fabep_wait", ret);
		ret = fabep_flush(r->comm);
		if (ret)
			return tool_fail("fabep_flush", ret);
	}
	return 0;
}

static int pp_latency(struct tool_rma *r, enum pp_op op, size_t len,
		      long warmup, long iters, uint64_t *ns)
{
	uint64_t t0 = 0;
	int ret;

	if (op == PP_WRITE) {
		/* Flags start from zero at every size: clear ours, then agree. */
		int word = len >= 8 && len % 8 == 0;
		char *dst = fabep_heap_ptr(r->comm, r->dst);

		set_flag(dst + len - (word ? 8 : 1), word, 0);
		ret = fabep_barrier(r->comm);
		if (ret)
			return tool_fail("fabep_barrier", ret);
	}
	for (long i = 0; i < warmup + iters; i++) {
		if (i == warmup) {
			ret = fabep_barrier(r->comm);
			if (ret)
				return tool_fail("fabep_barrier", ret);
			t0 = tool_now_ns();
		}
		ret = op == PP_WRITE ? pp_write_round(r, len, i) :
				       pp_signal_round(r, len);
		if (ret)
			return ret;
	}
	*ns = tool_now_ns() - t0;
	return 0;
}

static int pp_rank_op(fabep_comm_t *comm, const struct tool_opts *o,
		      struct pp_ctx *ctx, int k);

static uint64_t fnv(uint64_t h, uint64_t v)
{
	for (int i = 0; i < 8; i++, v >>= 8)
		h = (h ^ (v & 0xff)) * 0x100000001b3ull;
	return h;
}

/* What both sides must run alike: the ops, and per size the bytes, the
 * iterations and warm-up as used, the mode and the window. */
static uint64_t pp_fingerprint(const struct tool_opts *o, const struct pp_ctx *ctx)
{
	uint64_t h = fnv(0xcbf29ce484222325ull, (uint64_t)ctx->nops);

	for (int k = 0; k < ctx->nops; k++)
		h = fnv(h, (uint64_t)ctx->ops[k]);
	h = fnv(fnv(h, (uint64_t)o->bandwidth), (uint64_t)(o->window ? o->window : 64));
	for (int s = 0; s < o->nsizes; s++) {
		long iters = o->iters ? o->iters :
			     tool_default_iters(o->sizes[s], o->bandwidth);
		long warmup = o->warmup >= 0 ? o->warmup : tool_default_warmup(iters);

		h = fnv(fnv(fnv(h, o->sizes[s]), (uint64_t)iters), (uint64_t)warmup);
	}
	return h;
}

/* A server and a client started with different options would wait for
 * each other until the timeout (and lay out their buffers differently):
 * each sends the other its fingerprint first, in blocks of the same
 * size on both sides, and a difference is reported at once. */
static int pp_same_options(fabep_comm_t *comm, const struct tool_opts *o,
			   const struct pp_ctx *ctx)
{
	fabep_off_t mine, theirs, sig;
	uint64_t fp = pp_fingerprint(o, ctx), got;
	int ret, rank = fabep_comm_rank(comm);

	ret = fabep_heap_alloc(comm, 8, 64, &mine);
	if (!ret)
		ret = fabep_heap_alloc(comm, 8, 64, &theirs);
	if (!ret)
		ret = fabep_heap_alloc(comm, 64, 64, &sig);
	if (ret)
		return tool_fail("fabep_heap_alloc", ret);
	memcpy(fabep_heap_ptr(comm, mine), &fp, 8);
	ret = fabep_put_signal(comm, 1 - rank, theirs, mine, 8, sig, 1);
	if (ret)
		return tool_fail("fabep_put_signal", ret);
	ret = fabep_wait(comm, sig, 1);
	if (ret)
		return tool_fail("fabep_wait", ret);
	memcpy(&got, fabep_heap_ptr(comm, theirs), 8);
	if (got != fp) {
		fprintf(stderr, "%s: rank %d: the peer was started with other "
			"options (-o, -S, -I, -w, -b or -W differ)\n", tool_name,
			rank);
		return -EINVAL;
	}
	return 0;
}

/* With several ops, each runs over every size, then a comparison of each
 * op with the first (MB/sec ratio) is printed. */
static int pp_rank(fabep_comm_t *comm, const struct tool_opts *o, void *arg)
{
	struct pp_ctx *ctx = arg;
	int k, s, ret, report = fabep_comm_rank(comm) == 0 || o->host;
	char b[32];

	if (fabep_comm_size(comm) == 2) {
		ret = pp_same_options(comm, o, ctx);
		if (ret)
			return ret;
	}
	for (k = 0; k < ctx->nops; k++) {
		ctx->op = ctx->ops[k];
		ret = pp_rank_op(comm, o, ctx, k);
		if (ret)
			return ret;
	}
	if (ctx->nops < 2 || !report)
		return 0;
	for (k = 1; k < ctx->nops; k++) {
		if (!o->machine)
			printf("# %s vs %s, same run: MB/sec ratio (1.00 = as fast)\n"
			       "%-8s%12s%12s%12s%12s%8s\n", pp_op_names[ctx->ops[k]],
			       pp_op_names[ctx->ops[0]], "bytes", "usec_a", "usec_b",
			       "MBps_a", "MBps_b", "ratio");
		for (s = 0; s < o->nsizes && s < PP_MAX_SIZES; s++) {
			double ratio = ctx->mbps[0][s] > 0 ?
				ctx->mbps[k][s] / ctx->mbps[0][s] : 0;

			if (o->machine)
				printf("op: compare mode: %s provider: %s a: %s b: %s "
				       "bytes: %zu usec_a: %.3f usec_b: %.3f MBps_a: "
				       "%.2f MBps_b: %.2f ratio: %.3f\n",
				       o->bandwidth ? "bw" : "lat",
				       fabep_comm_provider(comm),
				       pp_op_names[ctx->ops[0]], pp_op_names[ctx->ops[k]],
				       o->sizes[s], ctx->usec[0][s], ctx->usec[k][s],
				       ctx->mbps[0][s], ctx->mbps[k][s], ratio);
			else
				printf("%-8s%12.2f%12.2f%12.2f%12.2f%8.3f\n",
				       tool_size_str(b, sizeof(b), o->sizes[s]),
				       ctx->usec[0][s], ctx->usec[k][s],
				       ctx->mbps[0][s], ctx->mbps[k][s], ratio);
		}
	}
	return 0;
}

static int pp_rank_op(fabep_comm_t *comm, const struct tool_opts *o,
		      struct pp_ctx *ctx, int k)
{
	int window = o->window ? o->window : 64;
	struct tool_rma r;
	int report, ret;

	ret = tool_rma_setup(comm, o->sizes[o->nsizes - 1], &r);
	if (ret)
		return ret;
	report = r.rank == 0 || o->host;
	if (report && !o->machine) {
		printf("# %s: op %s (%s), %s, provider %s, domain %s, signal %s\n",
		       tool_name, pp_op_names[ctx->op],
		       o->bandwidth ? "bandwidth" : "latency",
		       o->server ? "server" : o->host ? "client" :
		       o->nranks > 0 ? "two local ranks (no -s, no HOST)" :
		       "a launcher's job",
		       fabep_comm_provider(comm), fabep_comm_domain(comm),
		       fabep_signal_name(fabep_comm_signal(comm)));
		fflush(stdout);
	}
	for (int s = 0; s < o->nsizes; s++) {
		size_t len = o->sizes[s];
		long iters = o->iters ? o->iters : tool_default_iters(len, o->bandwidth);
		long warmup = o->warmup >= 0 ? o->warmup : tool_default_warmup(iters);
		struct tool_row row = {
			.op = pp_op_names[ctx->op],
			.mode = o->bandwidth ? "bw" : "lat",
			.provider = fabep_comm_provider(comm),
			.signal = fabep_signal_name(fabep_comm_signal(comm)),
			.bytes = len,
			.iters = iters,
		};

		if (o->bandwidth) {
			ret = tool_rma_bw(&r, ctx->op != PP_WRITE, len, window,
					  warmup, iters, &row.ns);
			row.xfers = (uint64_t)iters * (uint64_t)window;
		} else {
			ret = pp_latency(&r, ctx->op, len, warmup, iters, &row.ns);
			row.xfers = 2 * (uint64_t)iters;
		}
		if (ret)
			return ret;
		if (s < PP_MAX_SIZES && row.xfers && row.ns) {
			ctx->usec[k][s] = (double)row.ns / 1000.0 / (double)row.xfers;
			ctx->mbps[k][s] = (double)len / ctx->usec[k][s];
		}
		if (report)
			tool_print_row(stdout, o, &row);
	}
	ret = fabep_barrier(comm);
	if (ret)
		return tool_fail("fabep_barrier", ret);
	return 0;
}

int main(int argc, char **argv)
{
	static const size_t default_sizes[] = { 64, 4096, 65536, 1 << 20 };
	struct tool_opts o;
	static struct pp_ctx ctx = { .ops = { PP_SIGNAL }, .nops = 1 };
	fabep_comm_attr_t attr;
	size_t need;
	int found = 0;

	tool_parse(&pp_desc, argc, argv, &o);

	if (o.op) {
		char list[64], *tok, *save = NULL;

		snprintf(list, sizeof(list), "%s", o.op);
		/* strtok_r would skip empty items: a list such as "write,"
		 * is refused as -S refuses "64," */
		if (!*o.op || o.op[0] == ',' || o.op[strlen(o.op) - 1] == ',' ||
		    strstr(o.op, ",,"))
			tool_usage_error(&pp_desc, "-o '%s': an empty item in the "
					 "list", o.op);
		ctx.nops = 0;
		for (tok = strtok_r(list, ",", &save); tok;
		     tok = strtok_r(NULL, ",", &save)) {
			found = 0;
			for (int i = 0; i < 3; i++)
				if (!strcmp(tok, pp_op_names[i])) {
					if (ctx.nops == PP_MAX_OPS)
						tool_usage_error(&pp_desc, "-o: at most %d "
								 "operations", PP_MAX_OPS);
					ctx.ops[ctx.nops++] = (enum pp_op)i;
					found = 1;
				}
			if (!found)
				tool_usage_error(&pp_desc, "unknown operation '%s' for -o: "
						 "expected write, signal or writedata "
						 "(or a comma-separated list)", tok);
		}
		if (!ctx.nops)
			tool_usage_error(&pp_desc, "-o needs an operation");
	}
	for (int k = 0; k < ctx.nops; k++)
		if (ctx.ops[k] == PP_WRITEDATA && ctx.nops > 1)
			tool_usage_error(&pp_desc, "writedata forces the cqdata strategy "
					 "for the whole run: give it alone, or compare "
					 "with FABEP_SIGNAL=cqdata and -o write,signal");
	if (o.server && o.host)
		tool_usage_error(&pp_desc, "-s (server) and HOST (client) exclude each other");
	if ((o.server || o.host) && o.nranks)
		tool_usage_error(&pp_desc, "-n forks local ranks; it does not go with -s or HOST");
	if (o.nranks && o.nranks != 2)
		tool_usage_error(&pp_desc, "-n %d: a ping-pong needs 2 ranks", o.nranks);
	if (o.port && !o.server && !o.host)
		tool_usage_error(&pp_desc, "-P names the rendezvous port of -s or HOST");
	if (o.window && !o.bandwidth)
		tool_usage_error(&pp_desc, "-W (window) goes with -b (bandwidth mode)");
	if (!o.nsizes) {
		o.nsizes = 4;
		memcpy(o.sizes, default_sizes, sizeof(default_sizes));
	}
	if (!o.server && !o.host && !o.nranks && !tool_in_job())
		o.nranks = 2;
	if (ctx.ops[0] == PP_WRITEDATA)
		o.signal = FABEP_SIGNAL_CQDATA;

	fabep_comm_attr_init(&attr);
	/* Send and receive buffers of the largest size, and a counter. */
	need = (size_t)ctx.nops * (2 * o.sizes[o.nsizes - 1] + (1u << 20));
	if (need > (64u << 20))
		attr.heap_size = need;
	return tool_run(&pp_desc, &o, &attr, 300, pp_rank, &ctx);
}
