/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * common.c - option parsing, size lists, result printing and rank running
 * shared by fabep_pingpong, fabep_info and fabep_bench.
 */
#include "config.h"

#include <errno.h>
#include <sched.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <rdma/fabric.h>

#include "utils/common.h"

const char *tool_name = "fabep";

/* ------------------------------------------------------------------ */
/* Options                                                            */
/* ------------------------------------------------------------------ */

struct tool_optdef {
	int id;
	const char *lname;
	const char *arg;  /* NULL: takes no argument */
	const char *text;
};

/* The one table: a flag means the same in every tool. */
static const struct tool_optdef tool_optdefs[] = {
	{ 'p', "provider", "NAME",
	  "libfabric provider: shm, tcp, sockets, verbs, efa, ... "
	  "(default: FABEP_PROVIDER, else fabep's choice)" },
	{ 'd', "domain", "NAME",
	  "domain (NIC) to use (default: FABEP_DOMAIN, else loopback on one "
	  "host, a real interface across hosts)" },
	{ 'I', "iterations", "N", "timed iterations per size" },
	{ 'w', "warmup", "N", "untimed warm-up iterations per size" },
	{ 'm', "machine", NULL,
	  "machine-readable output: one line of \"key: value\" pairs per row" },
	{ 'n', "ranks", "N", "fork N local ranks" },
	{ 'S', "size", "SIZE|LIST|all",
	  "transfer sizes: one size, a comma-separated list (k, M, G suffixes), "
	  "or all (powers of two, 1 to 4M)" },
	{ 'o', "op", "OP", "operation" },
	{ 'b', "bandwidth", NULL,
	  "bandwidth mode: a window of transfers, then one signal and an answer" },
	{ 'W', "window", "N", "transfers per window with -b (default 64)" },
	{ 's', "server", NULL,
	  "server: be rank 0 of 2 and wait for a client on 0.0.0.0:PORT when "
	  "-P is given, else on FABEP_ROOT, else on 0.0.0.0:47592, until "
	  "interrupted unless FABEP_RENDEZVOUS_TIMEOUT_MS or FABEP_TIMEOUT_MS "
	  "is set" },
	{ 'P', "port", "PORT",
	  "rendezvous port for -s and HOST (default 47592)" },
	{ 'T', "threads", "N", "worker threads per rank (default: FABEP_THREADS, else fabep's choice)" },
	{ 'B', "bytes", "SIZE", "input bytes for the kernels (default 64M)" },
	{ 'K', "kernel", "NAME", "run only this kernel (default: all)" },
	{ 't', "tokens", "N", "tokens per rank" },
	{ 'H', "hidden", "N", "hidden size (elements per token row)" },
	{ 'k', "topk", "N", "experts per token" },
	{ 'e', "experts", "N", "experts in all" },
	{ 'f', "format", "FMT", "data format: bf16, fp8 or fp32" },
	{ TOOL_OPT_ROWS, "rows", "N", "rows of the allreduce input" },
	{ TOOL_OPT_COLS, "cols", "N", "columns of the allreduce input" },
	{ TOOL_OPT_CHECK, "check", NULL, "check results against a reference" },
	{ TOOL_OPT_SOAK, "soak", "SECONDS",
	  "repeat for SECONDS, checking every result, and report errors" },
	{ TOOL_OPT_ROUNDS, "rounds", "N", "measure every row N times" },
	{ TOOL_OPT_NO_REF, "no-ref", NULL, "time the part alone, without its references" },
	{ 'V', "version", NULL,
	  "print the versions of this tool, of the libfabep it runs with and of "
	  "libfabric, and exit" },
	{ 'h', "help", NULL, "print this help and exit" },
};

#define TOOL_NOPTS ((int)(sizeof(tool_optdefs) / sizeof(tool_optdefs[0])))

static const struct tool_optdef *optdef_find(int id)
{
	for (int i = 0; i < TOOL_NOPTS; i++)
		if (tool_optdefs[i].id == id)
			return &tool_optdefs[i];
	return NULL;
}

static const struct tool_help *help_find(const struct tool_desc *d, int id)
{
	if (!d->help)
		return NULL;
	for (const struct tool_help *h = d->help; h->id; h++)
		if (h->id == id)
			return h;
	return NULL;
}

/* Print text wrapped at 79 columns, continuation lines indented by col. */
static void print_wrapped(FILE *f, int col, int at, const char *text)
{
	const char *p = text;

	while (*p) {
		const char *end = p, *brk = NULL;
		int width = 79 - at;

		if (*p == '\n') {
			fprintf(f, "\n%*s", col, "");
			at = col;
			p++;
			continue;
		}
		while (*end && *end != '\n' && end - p < width) {
			if (*end == ' ')
				brk = end;
			end++;
		}
		if (!*end || *end == '\n' || !brk)
			brk = end;
		fprintf(f, "%.*s", (int)(brk - p), p);
		p = brk;
		while (*p == ' ')
			p++;
		if (*p && *p != '\n') {
			fprintf(f, "\n%*s", col, "");
			at = col;
		}
	}
	fputc('\n', f);
}

void tool_usage(const struct tool_desc *d, FILE *f)
{
	fprintf(f, "Usage: %s [OPTIONS]%s%s\n", d->name, d->args ? " " : "",
		d->args ? d->args : "");
	print_wrapped(f, 0, 0, d->summary);
	fprintf(f, "\nOptions:\n");
	for (const int *a = d->accept; *a; a++) {
		const struct tool_optdef *od = optdef_find(*a);
		const struct tool_help *h = help_find(d, *a);
		const char *arg, *text;
		char lhs[64];
		int n;

		if (!od)
			continue;
		arg = h && h->arg ? h->arg : od->arg;
		text = h && h->text ? h->text : od->text;
		if (od->id < 256)
			n = snprintf(lhs, sizeof(lhs), "  -%c, --%s%s%s", od->id,
				     od->lname, arg ? " " : "", arg ? arg : "");
		else
			n = snprintf(lhs, sizeof(lhs), "      --%s%s%s", od->lname,
				     arg ? " " : "", arg ? arg : "");
		if (n < 30) {
			fprintf(f, "%-30s", lhs);
			print_wrapped(f, 30, 30, text);
		} else {
			fprintf(f, "%s\n%30s", lhs, "");
			print_wrapped(f, 30, 30, text);
		}
	}
	if (d->epilog) {
		fputc('\n', f);
		fputs(d->epilog, f);
	}
}

/* As fi_info --version prints it: the tool's version as built, the shared
 * library's and libfabric's as loaded (either may have been replaced since
 * the tool was built), and the libfabric API the tool was built against. */
static void tool_version(const struct tool_desc *d, FILE *f)
{
	uint32_t v = fi_version();

	fprintf(f, "%s: %s\n", d->name, PACKAGE_VERSION);
	fprintf(f, "libfabep: %s\n", fabep_version());
	fprintf(f, "libfabric: %s\n", fi_tostr(&v, FI_TYPE_VERSION));
	fprintf(f, "libfabric api: %d.%d\n", FI_MAJOR_VERSION, FI_MINOR_VERSION);
}

void tool_usage_error(const struct tool_desc *d, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", d->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n\n", stderr);
	tool_usage(d, stderr);
	exit(TOOL_EXIT_USAGE);
}

int tool_parse_size(const char *s, size_t *out)
{
	unsigned long long v, mul = 1;
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -ERANGE;
	switch (*end) {
	case 'k': case 'K': mul = 1ull << 10; end++; break;
	case 'm': case 'M': mul = 1ull << 20; end++; break;
	case 'g': case 'G': mul = 1ull << 30; end++; break;
	default: break;
	}
	if (mul > 1 && (*end == 'i' || *end == 'I'))
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end)
		return -EINVAL;
	if (v > SIZE_MAX / mul)
		return -ERANGE;
	*out = (size_t)(v * mul);
	return 0;
}

static int size_cmp(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return x < y ? -1 : x > y;
}

int tool_parse_sizes(const char *s, size_t max, size_t *sizes, int *n)
{
	char buf[1024], *tok, *save = NULL;
	int cnt = 0;

	if (!strcmp(s, "all")) {
		for (size_t v = 1; v <= max && v <= (4u << 20) &&
		     cnt < TOOL_MAX_SIZES; v <<= 1)
			sizes[cnt++] = v;
		*n = cnt;
		return 0;
	}
	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		size_t v;
		int ret = tool_parse_size(tok, &v);

		if (ret)
			return ret;
		if (v < 1 || v > max)
			return -ERANGE;
		if (cnt == TOOL_MAX_SIZES)
			return -E2BIG;
		sizes[cnt++] = v;
	}
	if (!cnt || s[strlen(s) - 1] == ',' || s[0] == ',' || strstr(s, ",,"))
		return -EINVAL;
	qsort(sizes, cnt, sizeof(*sizes), size_cmp);
	for (int i = 1; i < cnt; i++)
		if (sizes[i] == sizes[i - 1])
			return -EEXIST;  /* one size twice: measured twice */
	*n = cnt;
	return 0;
}

const char *tool_size_str(char *buf, size_t len, uint64_t v)
{
	uint64_t base = 1, frac = 0;
	const char *mag = "";

	if (v >= (1ull << 30)) {
		base = 1ull << 30;
		mag = "g";
	} else if (v >= (1ull << 20)) {
		base = 1ull << 20;
		mag = "m";
	} else if (v >= (1ull << 10)) {
		base = 1ull << 10;
		mag = "k";
	}
	if (v / base < 10)
		frac = (v % base) * 10 / base;
	if (frac)
		snprintf(buf, len, "%llu.%llu%s", (unsigned long long)(v / base),
			 (unsigned long long)frac, mag);
	else
		snprintf(buf, len, "%llu%s", (unsigned long long)(v / base), mag);
	return buf;
}

static const char *cnt_str(char *buf, size_t len, uint64_t v)
{
	if (v >= 1000000000ull)
		snprintf(buf, len, "%llub", (unsigned long long)(v / 1000000000ull));
	else if (v >= 1000000ull)
		snprintf(buf, len, "%llum", (unsigned long long)(v / 1000000ull));
	else if (v >= 1000ull)
		snprintf(buf, len, "%lluk", (unsigned long long)(v / 1000ull));
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
	return buf;
}

static void __attribute__((noreturn))
opt_bad(const struct tool_desc *d, const struct tool_optdef *od,
	const char *val, const char *want)
{
	if (od->id < 256)
		tool_usage_error(d, "invalid value '%s' for -%c (--%s): %s", val,
				 od->id, od->lname, want);
	tool_usage_error(d, "invalid value '%s' for --%s: %s", val, od->lname,
			 want);
}

/* Whether p starts a number as written on a command line: a digit, or a
 * minus sign and a digit (strtol would also take blanks and a '+'). */
static int num_start(const char *p)
{
	return (*p >= '0' && *p <= '9') ||
	       (*p == '-' && p[1] >= '0' && p[1] <= '9');
}

static int opt_int(const struct tool_desc *d, const struct tool_optdef *od,
		   const char *val, long min, long max)
{
	char want[96];
	char *end;
	long v;

	errno = 0;
	v = strtol(val, &end, 10);
	if (!num_start(val) || errno || end == val || *end || v < min || v > max) {
		if (min == max)
			snprintf(want, sizeof(want), "expected %ld", min);
		else
			snprintf(want, sizeof(want), "expected an integer from "
				 "%ld to %ld", min, max);
		opt_bad(d, od, val, want);
	}
	return (int)v;
}

/* A comma-separated list of integers in [min, max] (a single value too);
 * returns the first.  The message offers a list only where the tool
 * takes one (d->lists): elsewhere it would invite a second error. */
static int opt_int_list(const struct tool_desc *d, const struct tool_optdef *od,
			const char *val, long min, long max, int *list, int *n)
{
	char want[128];
	const char *p = val;
	char *end;
	long v;

	if (!d->lists) {
		list[0] = opt_int(d, od, val, min, max);
		*n = 1;
		return list[0];
	}
	*n = 0;
	for (;;) {
		int i;

		errno = 0;
		v = strtol(p, &end, 10);
		if (!num_start(p) || errno || end == p || (*end && *end != ',') ||
		    v < min || v > max || *n == TOOL_MAX_LIST) {
			snprintf(want, sizeof(want), "expected an integer from %ld to "
				 "%ld, or with %s a list of at most %d (2,4,8)", min,
				 max, d->lists, TOOL_MAX_LIST);
			opt_bad(d, od, val, want);
		}
		/* a value twice would only measure its rows twice */
		for (i = 0; i < *n; i++)
			if (list[i] == v) {
				snprintf(want, sizeof(want), "%ld is in the list twice", v);
				opt_bad(d, od, val, want);
			}
		list[(*n)++] = (int)v;
		if (!*end)
			break;
		p = end + 1;
	}
	return list[0];
}

static int opt_word(const char *val)
{
	/* Names of providers, ops, kernels: printable, no spaces. */
	if (!*val)
		return 0;
	for (const char *p = val; *p; p++)
		if (*p <= ' ' || *p > '~')
			return 0;
	return 1;
}

/*
 * getopt_long refused a long option arg (argv[optind - 1]) that names one
 * of ours: with a value the option does not take ("--machine=1", which it
 * reports as the short option, "-m"), or as a prefix of more than one
 * ("--r": --ranks, --rows, --rounds), which it reports as an unknown
 * option.  Say which, and exit 2; return for anything else.  (optopt
 * tells the cases apart: the option's id, or 0 when ambiguous.)
 */
static void opt_unknown(const struct tool_desc *d, const struct option *lo,
			int nlong, const char *arg)
{
	char names[256];
	size_t len, at = 0;
	int i, match = -1, matches = 0;

	if (!arg || strncmp(arg, "--", 2) || !arg[2])
		return;
	arg += 2;
	len = strcspn(arg, "=");
	names[0] = '\0';
	for (i = 0; i < nlong; i++) {
		if (strncmp(lo[i].name, arg, len))
			continue;
		if (strlen(lo[i].name) == len) {  /* exact: no ambiguity */
			match = i;
			matches = 1;
			break;
		}
		match = i;
		matches++;
		if (at < sizeof(names))
			at += (size_t)snprintf(names + at, sizeof(names) - at,
					       "%s--%s", at ? ", " : "", lo[i].name);
	}
	if (matches == 1 && arg[len] == '=' && lo[match].has_arg == no_argument &&
	    optopt == lo[match].val)
		tool_usage_error(d, "option --%s takes no argument", lo[match].name);
	if (matches > 1 && !optopt)
		tool_usage_error(d, "option --%.*s is ambiguous: %s", (int)len, arg,
				 names);
}

void tool_parse(const struct tool_desc *d, int argc, char **argv,
		struct tool_opts *o)
{
	struct option longopts[TOOL_NOPTS + 1];
	char optstring[3 * TOOL_NOPTS + 2];
	int nlong = 0, ns = 0, c;

	tool_name = d->name;
	memset(o, 0, sizeof(*o));
	o->warmup = -1;
	o->signal = FABEP_SIGNAL_AUTO;

	optstring[ns++] = ':';
	for (const int *a = d->accept; *a; a++) {
		const struct tool_optdef *od = optdef_find(*a);

		if (!od)
			continue;
		longopts[nlong].name = od->lname;
		longopts[nlong].has_arg = od->arg ? required_argument : no_argument;
		longopts[nlong].flag = NULL;
		longopts[nlong].val = od->id;
		nlong++;
		if (od->id < 256) {
			optstring[ns++] = (char)od->id;
			if (od->arg)
				optstring[ns++] = ':';
		}
	}
	memset(&longopts[nlong], 0, sizeof(longopts[nlong]));
	optstring[ns] = '\0';

	opterr = 0;
	while ((c = getopt_long(argc, argv, optstring, longopts, NULL)) != -1) {
		const struct tool_optdef *od = optdef_find(c);
		const char *val = optarg;
		int ret;

		if (c == '?') {
			opt_unknown(d, longopts, nlong, argv[optind - 1]);
			if (optopt && optopt < 256)
				tool_usage_error(d, "unknown option -%c", optopt);
			tool_usage_error(d, "unknown option %s", argv[optind - 1]);
		}
		if (c == ':') {
			const struct tool_optdef *m = optdef_find(optopt);

			if (m && m->id < 256)
				tool_usage_error(d, "option -%c (--%s) needs an argument %s",
						 m->id, m->lname, m->arg);
			if (m)
				tool_usage_error(d, "option --%s needs an argument %s",
						 m->lname, m->arg);
			tool_usage_error(d, "option %s needs an argument",
					 argv[optind - 1]);
		}
		switch (c) {
		case 'p':
		case 'd':
		case 'o':
		case 'K':
		case 'f':
			if (!opt_word(val))
				opt_bad(d, od, val, "expected a name");
			if (c == 'p')
				o->provider = val;
			else if (c == 'd')
				o->domain = val;
			else if (c == 'o')
				o->op = val;
			else if (c == 'K')
				o->kernel = val;
			else
				o->format = val;
			break;
		case 'I': o->iters = opt_int(d, od, val, 1, 1000000000); break;
		case 'w': o->warmup = opt_int(d, od, val, 0, 1000000000); break;
		case 'm': o->machine = 1; break;
		case 'n':
			o->nranks = opt_int_list(d, od, val,
						 d->ranks_max ? d->ranks_min : 1,
						 d->ranks_max ? d->ranks_max : 256,
						 o->nranks_list, &o->n_nranks);
			break;
		case 'T': o->threads = opt_int(d, od, val, 1, 4096); break;
		case 'W': o->window = opt_int(d, od, val, 1, 65536); break;
		case 'P': o->port = opt_int(d, od, val, 1, 65535); break;
		case 't':
			o->tokens = opt_int_list(d, od, val, 1, INT_MAX, o->tokens_list,
						 &o->n_tokens);
			break;
		case 'H': o->hidden = opt_int(d, od, val, 1, INT_MAX); break;
		case 'k': o->topk = opt_int(d, od, val, 1, FABEP_MOE_MAX_TOPK); break;
		case 'e': o->experts = opt_int(d, od, val, 1, 1 << 20); break;
		case TOOL_OPT_ROWS:
			o->rows = opt_int_list(d, od, val, 1, INT_MAX, o->rows_list,
					       &o->n_rows);
			break;
		case TOOL_OPT_COLS: o->cols = opt_int(d, od, val, 1, INT_MAX); break;
		case TOOL_OPT_ROUNDS: o->rounds = opt_int(d, od, val, 1, TOOL_MAX_ROUNDS); break;
		case 'b': o->bandwidth = 1; break;
		case 's': o->server = 1; break;
		case TOOL_OPT_CHECK: o->check = 1; break;
		case TOOL_OPT_NO_REF: o->no_ref = 1; break;
		case 'S':
			ret = tool_parse_sizes(val, 1ull << 30, o->sizes, &o->nsizes);
			if (ret == -ERANGE)
				opt_bad(d, od, val, "sizes go from 1 to 1G");
			if (ret == -E2BIG)
				opt_bad(d, od, val, "at most 64 sizes");
			if (ret == -EEXIST)
				opt_bad(d, od, val, "a size is in the list twice");
			if (ret)
				opt_bad(d, od, val,
					"expected a size (64, 4k, 1M), a list 64,4k,1M, or all");
			break;
		case 'B':
			ret = tool_parse_size(val, &o->bytes);
			if (ret || o->bytes == 0)
				opt_bad(d, od, val, "expected a size such as 4096, 64M, 1G");
			break;
		case TOOL_OPT_SOAK: {
			char *end;

			/* decimal seconds: strtod would take hex and blanks */
			errno = 0;
			o->soak_s = strtod(val, &end);
			if (!num_start(val) || strpbrk(val, "xXpP") || errno ||
			    end == val || *end || !(o->soak_s > 0) ||
			    o->soak_s > TOOL_MAX_SOAK_S)
				opt_bad(d, od, val, "expected seconds, more than 0 "
					"and at most 604800 (7 days)");
			break;
		}
		case 'h':
			tool_usage(d, stdout);
			exit(TOOL_EXIT_OK);
		case 'V':
			tool_version(d, stdout);
			exit(TOOL_EXIT_OK);
		default:
			tool_usage_error(d, "unhandled option %s", argv[optind - 1]);
		}
	}
	if ((o->n_nranks > 1 || o->n_tokens > 1 || o->n_rows > 1) &&
	    !(o->op && !strcmp(o->op, "scale")))
		tool_usage_error(d, "%s takes one value here (a list only with fabep_bench -o scale)",
				 o->n_nranks > 1 ? "-n" : o->n_tokens > 1 ? "-t" : "--rows");
	if (argc - optind > d->max_args) {
		tool_usage_error(d, "unexpected argument '%s'",
				 argv[optind + d->max_args]);
	}
	if (optind < argc) {
		if (!opt_word(argv[optind]))
			tool_usage_error(d, "invalid host '%s'", argv[optind]);
		o->host = argv[optind];
	}
	/* the one value FABEP_BIND takes: another (off, None) would bind
	 * the ranks while the user meant not to */
	{
		const char *b = getenv("FABEP_BIND");

		if (b && *b && strcmp(b, "none"))
			tool_usage_error(d, "FABEP_BIND=%s: the one value taken is "
					 "none (forked ranks left unbound)", b);
	}
}

int tool_env_on(const char *name)
{
	const char *v = getenv(name);

	return v && *v && strcmp(v, "0");
}

int tool_env_switch(const struct tool_desc *d, const char *name)
{
	const char *v = getenv(name);

	if (!tool_env_on(name))
		return 0;
	if (!strcmp(v, "1"))
		return 1;
	tool_usage_error(d, "%s=%s: expected 1 (on) or 0 (off)", name, v);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Results                                                            */
/* ------------------------------------------------------------------ */

void tool_print_row(FILE *f, const struct tool_opts *o,
		    const struct tool_row *r)
{
	static FILE *header_done;
	double usec = (double)r->ns / 1000.0;
	double total = (double)r->bytes * (double)r->xfers;
	double usec_per_xfer = r->xfers ? usec / (double)r->xfers : 0.0;
	double mbps = usec > 0 ? total / usec : 0.0;
	char b1[32], b2[32], b3[32];

	if (o->machine) {
		fprintf(f, "op: %s mode: %s provider: %s signal: %s bytes: %zu "
			"iters: %ld xfers: %llu time_s: %.6f usec_per_xfer: %.3f "
			"MBps: %.2f Mxfers_per_s: %.4f\n",
			r->op, r->mode, r->provider ? r->provider : "-",
			r->signal ? r->signal : "-", r->bytes, r->iters,
			(unsigned long long)r->xfers, usec / 1e6, usec_per_xfer,
			mbps, usec_per_xfer > 0 ? 1.0 / usec_per_xfer : 0.0);
		fflush(f);
		return;
	}
	if (header_done != f) {
		fprintf(f, "%-8s%-8s%-8s%8s %10s%13s%13s\n", "bytes", "iters",
			"total", "time", "MB/sec", "usec/xfer", "Mxfers/sec");
		header_done = f;
	}
	fprintf(f, "%-8s", tool_size_str(b1, sizeof(b1), r->bytes));
	fprintf(f, "%-8s", cnt_str(b2, sizeof(b2), (uint64_t)r->iters));
	fprintf(f, "%-8s", tool_size_str(b3, sizeof(b3), (uint64_t)total));
	fprintf(f, "%8.2fs%10.2f%11.2f%11.2f\n", usec / 1e6, mbps,
		usec_per_xfer, usec_per_xfer > 0 ? 1.0 / usec_per_xfer : 0.0);
	fflush(f);
}

/* ------------------------------------------------------------------ */
/* Ranks                                                              */
/* ------------------------------------------------------------------ */

uint64_t tool_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tool_timeout_ns(void)
{
	const char *s = getenv("FABEP_TIMEOUT_MS");
	long ms = 30000;

	if (s && *s) {
		const char *p;
		char *end;
		long v;

		/* what the library accepts, as it reads it (spaces around,
		 * decimal or 0x hex; 1 ms to 24 h): a larger value would
		 * wrap the product below (found by fuzz/fuzz_tool_opts.c) */
		while (*s == ' ' || *s == '\t')
			s++;
		p = *s == '+' ? s + 1 : s;
		errno = 0;
		v = strtol(s, &end, p[0] == '0' && (p[1] == 'x' || p[1] == 'X') ? 16 : 10);
		while (*end == ' ' || *end == '\t' || *end == '\n')
			end++;
		if (!errno && end != s && !*end && v > 0 && v <= 86400000)
			ms = v;
	}
	return (uint64_t)ms * 1000000ull;
}

int tool_fail(const char *what, int err)
{
	fprintf(stderr, "%s: %s: %s\n", tool_name, what, fabep_strerror(err));
	return err;
}

/* The launchers' rank and size variables, in the order the library
 * reads them (fabep_comm_create(3)). */
static const char *const job_env[][2] = {
	{ "FABEP_RANK", "FABEP_WORLD_SIZE" },
	{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
	{ "PMI_RANK", "PMI_SIZE" },
	{ "SLURM_PROCID", "SLURM_NTASKS" },
};
#define JOB_ENVS (sizeof(job_env) / sizeof(job_env[0]))

int tool_in_job(void)
{
	size_t i;

	for (i = 0; i < JOB_ENVS; i++) {
		const char *s = getenv(job_env[i][1]);

		if (s && atoi(s) > 1)
			return 1;
	}
	return 0;
}

/* This process's rank as its launcher set it, or "?". */
static const char *job_rank(void)
{
	size_t i;

	for (i = 0; i < JOB_ENVS; i++) {
		const char *r = getenv(job_env[i][0]);

		if (r && *r)
			return r;
	}
	return "?";
}

void tool_tune_provider(const char *provider)
{
	if (provider && !strncmp(provider, "sockets", 7))
		setenv("FI_SOCKETS_PE_WAITTIME", "0", 0);
}

static int free_port(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int fd, port = -1;

	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (!bind(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
	    !getsockname(fd, (struct sockaddr *)&sa, &len))
		port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

/*
 * Binding of forked ranks, as mpirun --bind-to core does: the CPUs this
 * process may use, grouped by physical core (hardware threads of a core
 * together), are shared out in contiguous blocks, rank r taking the r-th
 * block of cores / n cores.  The rank's worker threads then default to
 * the cores of its block, so ranks x threads never exceeds the cores.
 * With more ranks than cores the ranks stay unbound, as mpirun leaves
 * them when oversubscribed: two ranks tied to one core wait for each
 * other while the scheduler could have run one elsewhere.  FABEP_BIND=none
 * leaves them unbound always.  Returns the cores bound to (0: not bound).
 */
static int core_key(int cpu)
{
	char path[96];
	int core = cpu, pkg = 0;
	FILE *f;

	snprintf(path, sizeof(path),
		 "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
	if ((f = fopen(path, "r"))) {
		if (fscanf(f, "%d", &core) != 1)
			core = cpu;
		fclose(f);
	}
	snprintf(path, sizeof(path),
		 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
	if ((f = fopen(path, "r"))) {
		if (fscanf(f, "%d", &pkg) != 1)
			pkg = 0;
		fclose(f);
	}
	return pkg * 65536 + core;
}

int tool_bind_rank(int r, int n)
{
	const char *e = getenv("FABEP_BIND");
	int key[CPU_SETSIZE], group[CPU_SETSIZE];
	cpu_set_t allowed, mine;
	int cpus = 0, ngroups = 0, first, count, i, j, g;

	if (e && !strcmp(e, "none"))
		return 0;
	if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0)
		return 0;
	/* groups numbered in the order of their first CPU */
	for (i = 0; i < CPU_SETSIZE; i++) {
		if (!CPU_ISSET(i, &allowed))
			continue;
		key[cpus] = core_key(i);
		group[cpus] = -1;
		for (j = 0; j < cpus; j++)
			if (key[j] == key[cpus]) {
				group[cpus] = group[j];
				break;
			}
		if (group[cpus] < 0)
			group[cpus] = ngroups++;
		cpus++;
	}
	if (ngroups < 1)
		return 0;
	if (n > ngroups)
		return 0;
	count = ngroups / n;
	first = r * count;
	CPU_ZERO(&mine);
	for (i = 0, j = 0; i < CPU_SETSIZE && j < cpus; i++) {
		if (!CPU_ISSET(i, &allowed))
			continue;
		g = group[j++];
		if (g >= first && g < first + count)
			CPU_SET(i, &mine);
	}
	if (sched_setaffinity(0, sizeof(mine), &mine) < 0)
		return 0;
	return count;
}

int tool_cores(void)
{
	cpu_set_t allowed;
	int i, n = 0, key[CPU_SETSIZE];

	if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0)
		return 1;
	for (i = 0; i < CPU_SETSIZE; i++) {
		int j;

		if (!CPU_ISSET(i, &allowed))
			continue;
		key[n] = core_key(i);
		for (j = 0; j < n && key[j] != key[n]; j++)
			;
		if (j == n)
			n++;
	}
	return n > 0 ? n : 1;
}

/* Whether this rank is a server that waits for its client until
 * interrupted, as fi_pingpong's does: unless a timeout was asked for. */
static int server_waits(const struct tool_opts *o, const fabep_comm_attr_t *attr)
{
	const char *t = getenv("FABEP_TIMEOUT_MS");
	const char *r = getenv("FABEP_RENDEZVOUS_TIMEOUT_MS");

	return o->server && attr->timeout_ms <= 0 && !attr->rendezvous_timeout_ms &&
	       !(t && *t) && !(r && *r);
}

/* One rank, in this process: create the communicator, run, destroy; a
 * run that failed aborts instead, so that the peers see this rank gone at
 * once rather than after waiting for its goodbye to their timeout. */
static int run_rank(const fabep_comm_attr_t *attr, const struct tool_opts *o,
		    tool_rank_fn fn, void *arg)
{
	fabep_comm_t *comm = NULL;
	int ret, ret2;

	ret = fabep_comm_create(attr, &comm);
	if (ret) {
		fprintf(stderr, "%s: rank %s: fabep_comm_create: %s\n", tool_name,
			job_rank(), fabep_strerror(ret));
		return ret;
	}
	ret = fn(comm, o, arg);
	if (ret) {
		fabep_comm_abort(comm);
		return ret;
	}
	ret2 = fabep_comm_destroy(comm);
	if (ret2 && !ret) {
		fprintf(stderr, "%s: rank %d: fabep_comm_destroy: %s\n", tool_name,
			fabep_comm_rank(comm), fabep_strerror(ret2));
		ret = ret2;
	}
	return ret;
}

static void describe_status(int rank, int status)
{
	if (WIFEXITED(status))
		fprintf(stderr, "%s: rank %d exited with status %d\n", tool_name,
			rank, WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		fprintf(stderr, "%s: rank %d killed by signal %d (%s)\n", tool_name,
			rank, WTERMSIG(status), strsignal(WTERMSIG(status)));
}

/* A signal that ends the launcher (SIGTERM, SIGHUP, SIGINT sent to it
 * alone) ends its ranks too: it is passed on to them, they are reaped
 * and their shm regions removed, and then it ends the launcher. */
static volatile sig_atomic_t forked_stop;

static void forked_on_signal(int sig)
{
	forked_stop = sig;
}

static const int forked_sigs[] = { SIGTERM, SIGHUP, SIGINT };

/* SIGCHLD as the launcher found it: ignored (SIG_IGN or SA_NOCLDWAIT,
 * inherited from a parent that set it) makes the kernel reap the ranks
 * at once, and waitpid then has no status to give and no child to wait
 * for, so the launcher sets the default while its ranks run. */
static struct sigaction forked_chld_old;

static void forked_catch(struct sigaction *old)
{
	struct sigaction sa;
	size_t i;

	sigaction(SIGCHLD, NULL, &forked_chld_old);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGCHLD, &sa, NULL);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forked_on_signal;
	sigemptyset(&sa.sa_mask);
	for (i = 0; i < sizeof(forked_sigs) / sizeof(forked_sigs[0]); i++) {
		sigaction(forked_sigs[i], NULL, &old[i]);
		/* ignored (nohup, a background job's SIGINT): stays so */
		if (old[i].sa_handler != SIG_IGN)
			sigaction(forked_sigs[i], &sa, NULL);
	}
}

static void forked_restore(const struct sigaction *old)
{
	size_t i;

	sigaction(SIGCHLD, &forked_chld_old, NULL);

	for (i = 0; i < sizeof(forked_sigs) / sizeof(forked_sigs[0]); i++)
		sigaction(forked_sigs[i], &old[i], NULL);
}

/* In a rank's child: the launcher's signals back to their defaults; a
 * launcher killed outright takes its ranks along (shm's own handler then
 * removes their regions), and one already gone is not waited for. */
static void rank_child_init(const struct sigaction *old_sa, pid_t parent)
{
	forked_restore(old_sa);
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (getppid() != parent)
		_exit(TOOL_EXIT_FAIL);
}

/* The launcher's signals restored; after a stop signal the launcher
 * ends with that signal's status, by its default action, not by
 * libfabric's handler (shm's exits with status 1). */
static void forked_finish(const struct sigaction *old_sa)
{
	forked_restore(old_sa);
	if (forked_stop) {
		fflush(NULL);
		signal((int)forked_stop, SIG_DFL);
		raise((int)forked_stop);
	}
}

/* A rank killed outright, reaped, and its shm regions removed (it
 * cannot remove them itself). */
static void kill_reap(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	fabep_shm_cleanup(pid);
}

/* The ranks still running get sig, then after 2 s SIGKILL; each is
 * reaped and its shm regions removed. */
static void forked_end(const pid_t *pids, int *done, int n, int sig)
{
	uint64_t end = tool_now_ns() + 2000000000ull;
	int left = 0;

	fprintf(stderr, "%s: %s: stopping the ranks\n", tool_name, strsignal(sig));
	for (int r = 0; r < n; r++)
		if (!done[r] && !kill(pids[r], sig))
			left++;
	while (left > 0 && tool_now_ns() < end) {
		struct timespec ts = { 0, 5000000 };

		for (int r = 0; r < n; r++)
			if (!done[r] && waitpid(pids[r], NULL, WNOHANG) == pids[r]) {
				done[r] = 1;
				left--;
				fabep_shm_cleanup(pids[r]);
			}
		nanosleep(&ts, NULL);
	}
	for (int r = 0; r < n; r++)
		if (!done[r]) {
			kill_reap(pids[r]);
			done[r] = 1;
		}
}

/* Waits for the ranks pids[0..n), numbered from first, to end.  Polled,
 * not a blocking waitpid: a stop signal caught before a wait begins
 * would wait for a rank's own end, so each poll looks at forked_stop
 * and a caught signal cuts the sleep between polls short.  Each rank
 * reaped has its shm regions removed (one that died, or exited without
 * destroying its communicator, leaves them).  A failed rank is named
 * (exits only with describe_exits: a rank that exits with a failure has
 * said why itself) and the others get 5 s to end; timeout_s > 0 kills
 * those still running after it.  Returns 1 where a rank failed or the
 * ranks were stopped, else 0. */
static int forked_wait(const pid_t *pids, int *done, int n, int first,
		       int timeout_s, int describe_exits)
{
	uint64_t deadline = tool_now_ns() + (uint64_t)timeout_s * 1000000000ull;
	uint64_t grace = 0;
	int left = n, failed = 0;

	while (left > 0) {
		uint64_t now = tool_now_ns();
		int reaped = 0;

		for (int r = 0; r < n; r++) {
			int status;
			pid_t got;

			if (done[r])
				continue;
			got = waitpid(pids[r], &status, WNOHANG);
			if (got < 0 && errno != EINTR) {
				/* gone, and its status with it: not ours to kill
				 * (its pid may have been reused) */
				fprintf(stderr, "%s: rank %d: waitpid: %s\n", tool_name,
					first + r, strerror(errno));
				status = -1;
			} else if (got != pids[r]) {
				continue;
			}
			done[r] = 1;
			left--;
			reaped = 1;
			fabep_shm_cleanup(pids[r]);
			if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status)) {
				if (status != -1 && (describe_exits || !WIFEXITED(status)))
					describe_status(first + r, status);
				if (!failed)
					grace = now + 5000000000ull;
				failed = 1;
			}
		}
		if (!left)
			break;
		if (forked_stop) {
			forked_end(pids, done, n, (int)forked_stop);
			return 1;
		}
		if ((timeout_s > 0 && now > deadline) || (grace && now > grace)) {
			for (int r = 0; r < n; r++) {
				if (done[r])
					continue;
				kill_reap(pids[r]);
				done[r] = 1;
				if (now > deadline && timeout_s > 0)
					fprintf(stderr, "%s: rank %d still running after %d s: killed\n",
						tool_name, first + r, timeout_s);
				else
					fprintf(stderr, "%s: rank %d still running 5 s after a rank failed: killed\n",
						tool_name, first + r);
			}
			return 1;
		}
		if (!reaped) {
			struct timespec ts = { 0, 5000000 };

			nanosleep(&ts, NULL);
		}
	}
	return failed;
}

static int run_forked(const struct tool_opts *o, const fabep_comm_attr_t *attr,
		      int timeout_s, tool_rank_fn fn, void *arg)
{
	struct sigaction old_sa[sizeof(forked_sigs) / sizeof(forked_sigs[0])];
	pid_t parent = getpid();
	int n = o->nranks, failed, port;
	pid_t *pids = calloc(n, sizeof(*pids));
	int *done = calloc(n, sizeof(*done));
	char root[64];

	if (!pids || !done) {
		fprintf(stderr, "%s: out of memory\n", tool_name);
		free(pids);
		free(done);
		return TOOL_EXIT_FAIL;
	}
	port = free_port();
	if (port < 0) {
		fprintf(stderr, "%s: no free TCP port on 127.0.0.1: %s\n",
			tool_name, strerror(errno));
		free(pids);
		free(done);
		return TOOL_EXIT_FAIL;
	}
	snprintf(root, sizeof(root), "127.0.0.1:%d", port);

	fflush(NULL);
	forked_stop = 0;
	forked_catch(old_sa);
	for (int r = 0; r < n; r++) {
		pid_t pid = fork();

		if (pid < 0) {
			fprintf(stderr, "%s: fork: %s\n", tool_name, strerror(errno));
			for (int q = 0; q < r; q++)
				kill_reap(pids[q]);
			forked_restore(old_sa);
			free(pids);
			free(done);
			return TOOL_EXIT_FAIL;
		}
		if (pid == 0) {
			char rs[16], ns[16];
			int ret;

			rank_child_init(old_sa, parent);
			snprintf(rs, sizeof(rs), "%d", r);
			snprintf(ns, sizeof(ns), "%d", n);
			setenv("FABEP_RANK", rs, 1);
			setenv("FABEP_WORLD_SIZE", ns, 1);
			setenv("FABEP_ROOT", root, 1);
			{
				fabep_comm_attr_t a = *attr;
				int cores = tool_bind_rank(r, n);
				const char *t = getenv("FABEP_THREADS");

				/* threads: -T, else FABEP_THREADS, else the
				 * rank's cores */
				if (cores && !a.threads && !(t && *t))
					a.threads = cores;
				ret = run_rank(&a, o, fn, arg);
			}
			fflush(NULL);
			_exit(ret ? TOOL_EXIT_FAIL : TOOL_EXIT_OK);
		}
		pids[r] = pid;
	}

	failed = forked_wait(pids, done, n, 0, timeout_s, 1);
	free(pids);
	free(done);
	forked_finish(old_sa);
	return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}

/* The one rank of a server or client (-s, HOST) in a child, as the
 * forked ranks are: the provider libraries' signal handlers end a rank
 * with status 1 and no word (some exit in theirs), so the tool catches
 * SIGINT, SIGTERM and SIGHUP here, passes them on, says so, removes the
 * child's shm regions and ends by the signal. */
static int run_supervised(const struct tool_opts *o, const fabep_comm_attr_t *attr,
			  const char *hello, tool_rank_fn fn, void *arg)
{
	struct sigaction old_sa[sizeof(forked_sigs) / sizeof(forked_sigs[0])];
	pid_t parent = getpid(), pid;
	int done = 0, failed;

	forked_stop = 0;
	forked_catch(old_sa);
	/* said once the handlers are in: a signal sent when this line is
	 * seen is handled as documented */
	if (hello)
		fputs(hello, stderr);
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "%s: fork: %s\n", tool_name, strerror(errno));
		forked_restore(old_sa);
		return TOOL_EXIT_FAIL;
	}
	if (pid == 0) {
		int ret;

		rank_child_init(old_sa, parent);
		ret = run_rank(attr, o, fn, arg);
		fflush(NULL);
		_exit(ret ? TOOL_EXIT_FAIL : TOOL_EXIT_OK);
	}
	failed = forked_wait(&pid, &done, 1, o->server ? 0 : 1, 0, 0);
	forked_finish(old_sa);
	return failed ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}

int tool_run(const struct tool_desc *d, const struct tool_opts *o,
	     const fabep_comm_attr_t *attr_in, int timeout_s, tool_rank_fn fn,
	     void *arg)
{
	fabep_comm_attr_t attr = *attr_in;
	int port = o->port ? o->port : TOOL_DEFAULT_PORT;
	char buf[300];
	int ret;

	if (o->provider)
		attr.provider = o->provider;
	if (o->domain)
		attr.domain = o->domain;
	if (o->threads)
		attr.threads = o->threads;
	if (o->signal != FABEP_SIGNAL_AUTO)
		attr.signal = o->signal;
	tool_tune_provider(attr.provider ? attr.provider : getenv("FABEP_PROVIDER"));

	if (o->nranks > 0)
		return run_forked(o, &attr, timeout_s, fn, arg);

	if (o->server || o->host) {
		const char *tmo = getenv("FABEP_TIMEOUT_MS");
		const char *rdv = getenv("FABEP_RENDEZVOUS_TIMEOUT_MS");
		char hello[512];

		setenv("FABEP_RANK", o->server ? "0" : "1", 1);
		setenv("FABEP_WORLD_SIZE", "2", 1);
		if (o->host) {
			if (strchr(o->host, ':') && o->host[0] != '[')
				snprintf(buf, sizeof(buf), "[%s]:%d", o->host, port);
			else
				snprintf(buf, sizeof(buf), "%s:%d", o->host, port);
			setenv("FABEP_ROOT", buf, 1);
		} else if (!getenv("FABEP_ROOT") || o->port) {
			snprintf(buf, sizeof(buf), "0.0.0.0:%d", port);
			setenv("FABEP_ROOT", buf, 1);
		}
		if (server_waits(o, &attr))
			attr.rendezvous_timeout_ms = -1;
		if (!o->machine) {
			/* the rendezvous's limit, as the library takes it */
			const char *var = rdv && *rdv ? "FABEP_RENDEZVOUS_TIMEOUT_MS" :
					  "FABEP_TIMEOUT_MS";
			long ms = attr.rendezvous_timeout_ms ? attr.rendezvous_timeout_ms :
				  rdv && *rdv ? strtol(rdv, NULL, 0) :
				  attr.timeout_ms > 0 ? attr.timeout_ms :
				  tmo && *tmo ? strtol(tmo, NULL, 0) : 30000;
			char lim[96];

			if (ms < 0)
				snprintf(lim, sizeof(lim), "until interrupted");
			else
				snprintf(lim, sizeof(lim), "for %ld ms: %s", ms, var);
			if (o->server)
				snprintf(hello, sizeof(hello), "%s: server: waiting for "
					 "a client on %s (%s)\n", d->name,
					 getenv("FABEP_ROOT"), lim);
			else
				snprintf(hello, sizeof(hello), "%s: client: connecting "
					 "to %s (%s)\n", d->name, getenv("FABEP_ROOT"), lim);
		}
		return run_supervised(o, &attr, o->machine ? NULL : hello, fn, arg);
	}
	ret = run_rank(&attr, o, fn, arg);
	return ret ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* Two-rank transfers                                                 */
/* ------------------------------------------------------------------ */

long tool_default_iters(size_t bytes, int bandwidth)
{
	if (bytes < (64u << 10))
		return bandwidth ? 1000 : 10000;
	if (bytes < (1u << 20))
		return bandwidth ? 100 : 1000;
	return bandwidth ? 10 : 100;
}

long tool_default_warmup(long iters)
{
	long w = iters / 10;

	return w < 10 ? 10 : w > 1000 ? 1000 : w;
}

int tool_rma_setup(fabep_comm_t *comm, size_t max, struct tool_rma *r)
{
	int ret;

	memset(r, 0, sizeof(*r));
	r->comm = comm;
	r->rank = fabep_comm_rank(comm);
	r->max = max ? max : 8;
	if (fabep_comm_size(comm) != 2) {
		if (r->rank == 0)
			fprintf(stderr, "%s: this test runs between 2 ranks, not %d\n",
				tool_name, fabep_comm_size(comm));
		return -EINVAL;
	}
	r->peer = 1 - r->rank;
	ret = fabep_heap_alloc(comm, r->max, 4096, &r->src);
	if (!ret)
		ret = fabep_heap_alloc(comm, r->max, 4096, &r->dst);
	if (!ret)
		ret = fabep_heap_alloc(comm, 64, 64, &r->sig);
	if (ret)
		return tool_fail("fabep_heap_alloc", ret);
	return 0;
}

static int bw_round(struct tool_rma *r, int use_signal, size_t len, int window)
{
	int ret;

	if (r->rank == 0) {
		/* Every transfer writes the same bytes to the same place, so the
		 * last one's signal means the receive buffer holds the data. */
		for (int j = 0; j < window; j++) {
			if (use_signal || j == window - 1)
				ret = fabep_put_signal(r->comm, r->peer, r->dst, r->src,
						       len, r->sig, 1);
			else
				ret = fabep_put(r->comm, r->peer, r->dst, r->src, len);
			if (ret)
				return tool_fail(use_signal || j == window - 1 ?
						 "fabep_put_signal" : "fabep_put", ret);
		}
		r->seen += 1;
		ret = fabep_wait(r->comm, r->sig, r->seen);
		if (ret)
			return tool_fail("fabep_wait", ret);
		ret = fabep_flush(r->comm);
		if (ret)
			return tool_fail("fabep_flush", ret);
	} else {
		r->seen += use_signal ? (uint64_t)window : 1;
		ret = fabep_wait(r->comm, r->sig, r->seen);
		if (ret)
			return tool_fail("fabep_wait", ret);
		ret = fabep_put_signal(r->comm, r->peer, r->dst, r->src, 0,
				       r->sig, 1);
		if (ret)
			return tool_fail("fabep_put_signal", ret);
		ret = fabep_flush(r->comm);
		if (ret)
			return tool_fail("fabep_flush", ret);
	}
	return 0;
}

int tool_rma_bw(struct tool_rma *r, int use_signal, size_t len, int window,
		long warmup, long iters, uint64_t *ns)
{
	uint64_t t0;
	int ret;

	for (long i = 0; i < warmup; i++) {
		ret = bw_round(r, use_signal, len, window);
		if (ret)
			return ret;
	}
	ret = fabep_barrier(r->comm);
	if (ret)
		return tool_fail("fabep_barrier", ret);
	t0 = tool_now_ns();
	for (long i = 0; i < iters; i++) {
		ret = bw_round(r, use_signal, len, window);
		if (ret)
			return ret;
	}
	*ns = tool_now_ns() - t0;
	return 0;
}
