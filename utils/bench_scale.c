/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * bench_scale.c - fabep_bench -o scale: dispatch, combine, allreduce and
 * allreduce + RMSNorm + FP8 over rank counts (-n 2,4,8,16) and token
 * counts (-t 1,8,128,1024), each row next to its floor and, when the MPI
 * baseline was built (configure found mpicc and mpirun), next to MPI in
 * the same run.
 *
 * Every row is a run of its own: this program again (/proc/self/exe) with
 * -o dispatch|combine|allreduce|arnorm -n N -m, which forks N ranks and
 * prints one "key: value" line, and the baseline under mpirun with the
 * same shapes and the iterations and warm-up fabep's part takes for them
 * (bench_moe_iters, bench_coll_iters: the baseline's own defaults
 * differ), always given (fabep_mpi_bench, utils/fabep_mpi_bench.c).
 * Every string in a command line is quoted for the shell (sh_word).
 * The floor of a dispatch or combine is the larger of the bench's
 * ref_live_us (every rank at once puts the bytes the phase sends) and
 * floor_us (the least local traffic of the phase at the memcpy rate of
 * every rank at once); of an allreduce, ref_median_us: every rank
 * writing the bytes of the input to the next at once.
 *
 * --rounds R measures every row R times, fabep and the baseline in
 * turn, so that a load that comes and goes on a shared machine reaches
 * both alike: the row shows the medians of the rounds and, as the
 * speedup, the median of the rounds' own speedups with their range.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "utils/common.h"
#include "utils/bench.h"

static const int def_ranks[] = { 2, 4, 8, 16 };
static const int def_tokens[] = { 1, 8, 128, 1024 };
static const int def_rows[] = { 16, 128, 1024 };

struct scale_row {
	const char *part;
	int ranks, size;       /* size: tokens or rows */
	double us, floor_us, mpi_us, wire_us, local_us;
	int failed, mpi_failed;
	/* --rounds: the median of the rounds' speedups (each its mpi_us /
	 * us), the least and the largest of them, and the rounds */
	double speed, speed_lo, speed_hi;
	int rounds;
};

/* One round of a row: fabep's figures and the baseline's. */
struct scale_round {
	double us, floor_us, mpi_us, wire_us, local_us;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The median of v[0, n) (sorted in place; n > 0): the lower middle
 * one for even n, a value that was measured. */
static double median_of(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[(n - 1) / 2];
}

/* r's figures from its rounds (each field of fabep's and of the
 * baseline's its median; the speedup the median of the rounds' own) */
static void row_of_rounds(struct scale_row *r, const struct scale_round *k,
			  int n)
{
	double v[TOOL_MAX_ROUNDS];
	int i;

#define MED(f) do { for (i = 0; i < n; i++) v[i] = k[i].f; r->f = median_of(v, n); } while (0)
	MED(us);
	MED(floor_us);
	MED(wire_us);
	MED(local_us);
	MED(mpi_us);
#undef MED
	r->rounds = n;
	r->speed = r->speed_lo = r->speed_hi = -1;
	if (r->failed || r->mpi_failed)
		return;
	for (i = 0; i < n; i++)
		v[i] = k[i].us > 0 ? k[i].mpi_us / k[i].us : -1;
	r->speed = median_of(v, n);
	r->speed_lo = v[0];
	r->speed_hi = v[n - 1];
}

/* The value after " key: " in line, or -1. */
static double field(const char *line, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), " %s: ", key);
	p = strstr(line, pat);
	if (!p && !strncmp(line, pat + 1, strlen(pat + 1)))
		p = line - 1;
	return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* Run cmd (a shell command line) and keep its last line that starts
 * with "op: ".  0, or -1 when it failed or printed none. */
static int run_line(const char *cmd, char *line, size_t len)
{
	char buf[4096];
	FILE *f;
	int st, got = 0;

	fflush(stdout);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	while (fgets(buf, sizeof(buf), f))
		if (!strncmp(buf, "op: ", 4)) {
			snprintf(line, len, "%s", buf);
			got = 1;
		}
	st = pclose(f);
	return got && st == 0 ? 0 : -1;
}

/* Cores this process may run on. */
/* One round's figures from the line of fabep's run (ar_floor: arnorm's
 * floor, the allreduce's of the same rows). */
static void parse_round(const char *part, const char *line, double ar_floor,
			struct scale_round *q)
{
	q->us = field(line, "median_us");
	if (!strcmp(part, "allreduce") || !strcmp(part, "arnorm")) {
		/* allreduce: the raw write of the input's bytes; arnorm's
		 * reference is the separate steps, so its floor is
		 * allreduce's */
		q->floor_us = strcmp(part, "arnorm") ? field(line, "ref_median_us") :
						       ar_floor;
		return;
	}
	/* the larger of the live put of the bytes it sends and its least
	 * local traffic at memcpy's rate, every rank at once */
	q->floor_us = field(line, "ref_live_us");
	if (field(line, "floor_us") > q->floor_us)
		q->floor_us = field(line, "floor_us");
	q->wire_us = field(line, "wire_us");
	q->local_us = field(line, "local_us");
}

/* r's rounds: fabep's run fcmd, then the baseline's mcmd (NULL: none),
 * in turn, and r's figures from their medians. */
static void run_rounds(struct scale_row *r, int rounds, const char *fcmd,
		       const char *mcmd, double ar_floor)
{
	struct scale_round rd[TOOL_MAX_ROUNDS];
	char line[4096];
	int k;

	r->mpi_failed = !mcmd;
	for (k = 0; k < rounds; k++) {
		struct scale_round *q = &rd[k];

		memset(q, 0, sizeof(*q));
		q->wire_us = q->local_us = -1;
		if (run_line(fcmd, line, sizeof(line)))
			r->failed = 1;
		else
			parse_round(r->part, line, ar_floor, q);
		if (!mcmd)
			continue;
		if (!run_line(mcmd, line, sizeof(line)) && !strstr(line, "check: failed"))
			q->mpi_us = field(line, "median_us");
		else
			r->mpi_failed = 1;
	}
	row_of_rounds(r, rd, rounds);
}

static int scale_cores(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		return CPU_COUNT(&set);
	return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

static int executable(const char *path)
{
	return path && *path && access(path, X_OK) == 0;
}

/* FABEP_MPI_BENCH (none: no baseline), else the baseline next to this
 * program; NULL: none. */
static const char *find_mpi_bench(const char *self, char *buf, size_t len)
{
	const char *env = getenv("FABEP_MPI_BENCH");
	const char *slash;

	if (env && *env)  /* none: no baseline (fabep_bench checked the rest) */
		return strcmp(env, "none") && executable(env) ? env : NULL;
#ifdef FABEP_HAVE_MPI_BENCH
	slash = strrchr(self, '/');
	if (slash && (size_t)(slash - self) + 20 < len) {
		snprintf(buf, len, "%.*s/fabep_mpi_bench", (int)(slash - self), self);
		if (executable(buf))
			return buf;
	}
#else
	(void)self;
	(void)buf;
	(void)len;
	(void)slash;
#endif
	return NULL;
}

static const char *find_mpirun(void)
{
	const char *env = getenv("FABEP_MPIRUN");

	if (env && *env)
		return env;
#ifdef FABEP_MPIRUN_PATH
	if (executable(FABEP_MPIRUN_PATH))
		return FABEP_MPIRUN_PATH;
#endif
	return "mpirun";
}

/* FABEP_BENCH_SCALE_PARTS: a comma-separated subset of dispatch,
 * combine, allreduce, arnorm (default all), spaces around a name
 * allowed.  Whether it names part (NULL: whether every item is a
 * part and at least one is given; fabep_bench checks that before
 * anything runs). */
int bench_scale_want(const char *part)
{
	static const char *const parts[] = { "dispatch", "combine", "allreduce",
					     "arnorm" };
	const char *e = getenv("FABEP_BENCH_SCALE_PARTS"), *p, *q;
	int found = 0, items = 0;

	if (!e || !*e)
		return 1;
	for (p = e;; p = q + 1) {
		size_t n, i;
		int known = 0;

		while (*p == ' ')
			p++;
		q = strchr(p, ',');
		if (!q)
			q = p + strlen(p);
		for (n = (size_t)(q - p); n && p[n - 1] == ' '; n--)
			;
		for (i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
			if (strlen(parts[i]) == n && !strncmp(p, parts[i], n))
				known = 1;
		if (!known)
			return part ? found : 0;
		items++;
		if (part && strlen(part) == n && !strncmp(p, part, n))
			found = 1;
		if (!*q)
			break;
	}
	return part ? found : items > 0;
}

static void print_row(FILE *out, const struct bench_opts *o,
		      const struct scale_row *r, int have_mpi)
{
	double ratio = r->floor_us > 0 && !r->failed ? r->us / r->floor_us : -1;
	double speed = have_mpi && r->speed > 0 ? r->speed : -1;
	int coll = !strcmp(r->part, "allreduce") || !strcmp(r->part, "arnorm");
	char us[32], fl[32], ra[32], mp[32], sp[32], rg[32];

	if (o->machine) {
		fprintf(out, "op: scale part: %s ranks: %d %s: %d median_us: %.1f "
			"floor_us: %.1f ratio: %.2f wire_us: %.1f local_us: %.1f "
			"mpi_us: %.1f speedup: %.2f result: %s rounds: %d "
			"speedup_min: %.2f speedup_max: %.2f\n", r->part, r->ranks,
			coll ? "rows" : "tokens", r->size, r->failed ? -1 : r->us,
			r->floor_us, ratio, r->wire_us, r->local_us,
			have_mpi && !r->mpi_failed ? r->mpi_us : -1, speed,
			r->failed ? "failed" : "ok", r->rounds,
			speed > 0 ? r->speed_lo : -1, speed > 0 ? r->speed_hi : -1);
		fflush(out);
		return;
	}
	snprintf(us, sizeof(us), r->failed ? "failed" : "%.1f", r->us);
	snprintf(fl, sizeof(fl), r->floor_us > 0 ? "%.1f" : "-", r->floor_us);
	snprintf(ra, sizeof(ra), ratio > 0 ? "%.2f" : "-", ratio);
	if (!have_mpi)
		snprintf(mp, sizeof(mp), "n/a");
	else
		snprintf(mp, sizeof(mp), r->mpi_failed ? "failed" : "%.1f", r->mpi_us);
	snprintf(sp, sizeof(sp), speed > 0 ? "%.2f" : "n/a", speed);
	rg[0] = '\0';
	if (o->rounds > 1 && speed > 0)
		snprintf(rg, sizeof(rg), " %.2f-%.2f", r->speed_lo, r->speed_hi);
	else if (o->rounds > 1)
		snprintf(rg, sizeof(rg), " n/a");
	fprintf(out, "%-10s %5d %5d%c %11s %11s %6s %11s %7s%s\n", r->part, r->ranks,
		r->size, coll ? 'r' : 't', us, fl, ra, mp, sp, rg);
	fflush(out);
}

/* A command line for popen, which hands it to sh -c. */
struct sh_cmd {
	char buf[4 * PATH_MAX + 1024];
	size_t n;
	int over;  /* it did not fit: not to be run */
};

static void sh_start(struct sh_cmd *c)
{
	c->buf[0] = '\0';
	c->n = 0;
	c->over = 0;
}

static void __attribute__((format(printf, 2, 3)))
sh_add(struct sh_cmd *c, const char *fmt, ...)
{
	va_list ap;
	int r;

	if (c->over)
		return;
	va_start(ap, fmt);
	r = vsnprintf(c->buf + c->n, sizeof(c->buf) - c->n, fmt, ap);
	va_end(ap);
	if (r < 0 || (size_t)r >= sizeof(c->buf) - c->n)
		c->over = 1;
	else
		c->n += (size_t)r;
}

/* " 'word'": s as one single-quoted shell word, each ' in it written
 * '\'' (end the quote, an escaped quote, quote again).  Every string
 * that reaches the shell goes through here: a provider named
 * "shm';cmd;'" must reach the child as that name, not run cmd. */
static void sh_word(struct sh_cmd *c, const char *s)
{
	sh_add(c, " '");
	for (; *s && !c->over; s++) {
		if (*s == '\'')
			sh_add(c, "'\\''");
		else
			sh_add(c, "%c", *s);
	}
	sh_add(c, "'");
}

/* Whether c fit; if not, says so (a row that cannot run fails). */
static int sh_ok(const struct sh_cmd *c)
{
	if (c->over)
		fprintf(stderr, "%s: -o scale: a command line of more than %zu "
			"bytes: the options or paths are too long\n", tool_name,
			sizeof(c->buf) - 1);
	return !c->over;
}

/* The start of a row's two command lines: this program (its part's
 * options follow) and the MPI baseline under mpirun (mpib, or nothing
 * where there is none: the line is then not run). */
static void sh_row_start(struct sh_cmd *cmd, struct sh_cmd *mcmd,
			 const char *self, const char *mpirun,
			 const char *mpiopt, const char *mpib)
{
	sh_start(cmd);
	sh_word(cmd, self);
	sh_start(mcmd);
	sh_word(mcmd, mpirun);
	sh_add(mcmd, "%s", mpiopt);
	sh_word(mcmd, mpib ? mpib : "");
}

/* Options every child of this program takes over from ours. */
static void common_args(const struct bench_opts *o, struct sh_cmd *c)
{
	if (o->provider) {
		sh_add(c, " -p");
		sh_word(c, o->provider);
	}
	if (o->domain) {
		sh_add(c, " -d");
		sh_word(c, o->domain);
	}
	if (o->iters)
		sh_add(c, " -I %d", o->iters);
	if (o->warmup >= 0)
		sh_add(c, " -w %d", o->warmup);
	if (o->threads)
		sh_add(c, " -T %d", o->threads);
	if (o->check)
		sh_add(c, " --check");
}

int bench_scale_check(const struct bench_opts *o, char *why, size_t len)
{
	const int *ranks = o->n_ranks ? o->ranks_list : def_ranks;
	const int *tokens = o->n_tokens ? o->tokens_list : def_tokens;
	int nr = o->n_ranks ? o->n_ranks : 4, nt = o->n_tokens ? o->n_tokens : 4;
	struct bench_opts row = *o;
	int i, j, ret;

	if (!bench_scale_want("dispatch") && !bench_scale_want("combine"))
		return 0;
	for (i = 0; i < nr; i++)
		for (j = 0; j < nt; j++) {
			row.op = "scale";
			row.tokens = tokens[j];
			ret = bench_moe_check(&row, ranks[i], why, len);
			if (ret)
				return ret;
		}
	return 0;
}

int bench_scale(const struct bench_opts *o, FILE *out)
{
	const int *ranks = o->n_ranks ? o->ranks_list : def_ranks;
	const int *tokens = o->n_tokens ? o->tokens_list : def_tokens;
	const int *rows = o->n_rows ? o->rows_list : def_rows;
	int nr = o->n_ranks ? o->n_ranks : 4, nt = o->n_tokens ? o->n_tokens : 4;
	int nrows = o->n_rows ? o->n_rows : 3;
	int cores = scale_cores(), failed = 0, mpi_bad = 0, i, j, p;
	int rounds = o->rounds > 0 ? o->rounds : 1;
	const char *mpib, *mpirun = find_mpirun();
	char self[PATH_MAX], mbuf[PATH_MAX];
	struct sh_cmd cmd, mcmd;
	char mpiopt[160], shape[96], cols[32];
	const char *fmt = o->format ? o->format : "bf16";
	size_t ncols = o->cols ? (size_t)o->cols : 7168;
	ssize_t sl;
	double ar_floor;
	int mpi_moe;

	sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (sl <= 0) {
		fprintf(stderr, "%s: -o scale: cannot find this program (/proc/self/exe)\n",
			tool_name);
		return -ENOENT;
	}
	self[sl] = '\0';
	mpib = find_mpi_bench(self, mbuf, sizeof(mbuf));
	/* the baseline dispatches bf16 rows only */
	mpi_moe = mpib && !strcmp(fmt, "bf16");
	/* the shapes, for both (numbers only) */
	snprintf(shape, sizeof(shape), "%s%.0d%s%.0d%s%.0d",
		 o->hidden ? " -H " : "", o->hidden, o->topk ? " -k " : "", o->topk,
		 o->experts ? " -e " : "", o->experts);
	snprintf(cols, sizeof(cols), "%s%.0d", o->cols ? " --cols " : "", o->cols);

	if (!o->machine) {
		fprintf(out, "# %s -o scale: median us of each part (the slowest rank's "
			"time per call), its floor\n# (the bytes it must move, copied by "
			"every rank at once) and the ratio; the MPI\n# baseline (%s) with "
			"the same shapes, and fabep's speedup over it.\n# %d cores; "
			"dispatch/combine: hidden %d, top-%d of %d experts, %s; "
			"allreduce, arnorm: fp32, %d columns\n", tool_name,
			mpib ? "MPI_Alltoallv dispatcher, MPI_Allreduce" : "not built: n/a",
			cores, o->hidden ? o->hidden : 7168, o->topk ? o->topk : 8,
			o->experts ? o->experts : 256, fmt, o->cols ? o->cols : 7168);
		if (o->rounds > 1)
			fprintf(out, "# %d rounds a row, fabep and the baseline in turn: "
				"the medians, and the\n# median of the rounds' speedups "
				"with their range\n", o->rounds);
		fprintf(out, "%-10s %5s %6s %11s %11s %6s %11s %7s%s\n", "part", "ranks",
			"size", "median_us", "floor_us", "ratio", "mpi_us", "speedup",
			o->rounds > 1 ? " range" : "");
	}
	for (i = 0; i < nr; i++) {
		int n = ranks[i];

		/* one rank per core, as the forked ranks are bound; beyond
		 * the cores mpirun needs --oversubscribe, and both leave the
		 * ranks unbound (mpirun's own default when oversubscribed) */
		snprintf(mpiopt, sizeof(mpiopt), "%s%s -np %d",
			 geteuid() == 0 ? " --allow-run-as-root" : "",
			 n > cores ? " --oversubscribe --bind-to none" :
				     " --bind-to core", n);
		for (j = 0; j < nt; j++)
			for (p = 0; p < 2; p++) {
				struct scale_row r = { p ? "combine" : "dispatch", n, tokens[j],
						       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 };

				if (!bench_scale_want(r.part))
					continue;

				sh_row_start(&cmd, &mcmd, self, mpirun, mpiopt, mpib);
				sh_add(&cmd, " -o %s -n %d -t %d -f", r.part, n, tokens[j]);
				sh_word(&cmd, fmt);
				common_args(o, &cmd);
				sh_add(&cmd, "%s -m", shape);
				/* the iterations fabep's part takes */
				sh_add(&mcmd, " -o %s -t %d -I %d -w %d%s -m", r.part,
				       tokens[j], bench_moe_iters(o, tokens[j]),
				       bench_moe_warmup(o, tokens[j]), shape);
				if (!sh_ok(&cmd) || !sh_ok(&mcmd))
					return -E2BIG;
				run_rounds(&r, rounds, cmd.buf, mpi_moe ? mcmd.buf : NULL, 0);
				failed += r.failed;
				mpi_bad += mpi_moe && r.mpi_failed;
				print_row(out, o, &r, mpi_moe);
			}
		for (j = 0; j < nrows; j++)
			for (p = 0, ar_floor = 0; p < 2; p++) {
				struct scale_row r = { p ? "arnorm" : "allreduce", n, rows[j],
						       0, 0, 0, -1, -1, 0, 0, 0, 0, 0, 0 };
				/* arnorm's floor is the allreduce's: measured,
				 * once and not shown, where only arnorm is asked */
				int floor_only = !p && !bench_scale_want("allreduce") &&
						 bench_scale_want("arnorm");
				/* the iterations fabep's part takes for this
				 * input (fp32), given to the baseline as well */
				long iters = bench_coll_iters(o, (size_t)rows[j] * ncols * 4);

				if (!bench_scale_want(r.part) && !floor_only)
					continue;

				sh_row_start(&cmd, &mcmd, self, mpirun, mpiopt, mpib);
				sh_add(&cmd, " -o %s -n %d --rows %d -f fp32", r.part, n,
				       rows[j]);
				common_args(o, &cmd);
				sh_add(&cmd, "%s -m", cols);
				sh_add(&mcmd, " -o %s --rows %d -I %ld -w %ld%s -m", r.part,
				       rows[j], iters, bench_coll_warmup(o, iters), cols);
				if (!sh_ok(&cmd) || !sh_ok(&mcmd))
					return -E2BIG;
				run_rounds(&r, floor_only ? 1 : rounds, cmd.buf,
					   mpib && !floor_only ? mcmd.buf : NULL, ar_floor);
				if (!p)
					ar_floor = r.floor_us;
				failed += r.failed;
				if (floor_only)
					continue;
				mpi_bad += mpib && r.mpi_failed;
				print_row(out, o, &r, mpib != NULL);
			}
	}
	/* a baseline that ran and failed leaves the comparison asked for
	 * undone: the run fails, as where fabep's part failed */
	if (failed)
		fprintf(stderr, "%s: -o scale: fabep's part failed in %d row%s "
			"(its messages are above)\n", tool_name, failed,
			failed > 1 ? "s" : "");
	if (mpi_bad)
		fprintf(stderr, "%s: -o scale: the MPI baseline failed in %d row%s "
			"(mpi_us: failed; its messages are above)\n", tool_name,
			mpi_bad, mpi_bad > 1 ? "s" : "");
	return failed || mpi_bad ? -EIO : 0;
}
