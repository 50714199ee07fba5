/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz_tool_opts.c - the tools' command line (utils/common.c): tool_parse
 * with every option and with a tool's subset, the size lists, and the
 * FABEP_TIMEOUT_MS the tools read themselves.
 *
 * tool_parse exits on a bad option (status 2) and on -h (status 0); here
 * exit() is redefined for common.c to jump back to the harness, so one
 * process runs every input.
 *
 * Input: a byte of flags, then the arguments separated by NULs.
 */
#include "config.h"

#include <setjmp.h>
#include <stdlib.h>

static jmp_buf fuzz_exit_jmp;
static int fuzz_exit_status;

static void __attribute__((noreturn)) fuzz_exit(int status)
{
	fuzz_exit_status = status;
	longjmp(fuzz_exit_jmp, 1);
}

#define exit(status) fuzz_exit(status)
#include "../utils/common.c"
#undef exit

#include "fuzz.h"

#define FUZZ_MAX_ARGS 64

static int all_accept[TOOL_NOPTS + 1];

/* What fabep_pingpong takes (utils/fabep_pingpong.c). */
static const int pp_accept[] = {
	'p', 'd', 'I', 'w', 'm', 'n', 'S', 'o', 'b', 'W', 's', 'P', 'T', 'h', 0
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	int i;

	fuzz_quiet();
	if (!getenv("FUZZ_VERBOSE"))
		stdout = stderr; /* -h prints the usage to stdout */
	for (i = 0; i < TOOL_NOPTS; i++)
		all_accept[i] = tool_optdefs[i].id;
	all_accept[TOOL_NOPTS] = 0;
	return 0;
}

static void fuzz_check_opts(const struct tool_desc *d, int argc,
			    struct tool_opts *o)
{
	int i;

	FUZZ_CHECK(o->nsizes >= 0 && o->nsizes <= TOOL_MAX_SIZES);
	for (i = 0; i < o->nsizes; i++) {
		FUZZ_CHECK(o->sizes[i] >= 1 && o->sizes[i] <= (1ull << 30));
		FUZZ_CHECK(!i || o->sizes[i - 1] <= o->sizes[i]);
	}
	FUZZ_CHECK(o->nranks >= 0 && o->nranks <= 256);
	FUZZ_CHECK(o->port >= 0 && o->port <= 65535);
	FUZZ_CHECK(o->iters >= 0 && o->threads >= 0 && o->window >= 0);
	FUZZ_CHECK(!o->host || opt_word(o->host));
	FUZZ_CHECK(!o->provider || opt_word(o->provider));
	FUZZ_CHECK(o->soak_s == 0 || (o->soak_s > 0 && o->soak_s <= 86400 * 7));
	/* --rounds: 1 to 100.  Which parts take it is fabep_bench's rule
	 * (bench_check_opts), not the shared parser's: tests/tools.sh. */
	FUZZ_CHECK(o->rounds >= 0 && o->rounds <= TOOL_MAX_ROUNDS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
	static struct tool_desc d;
	struct fuzz_in in = { data, n };
	struct tool_opts o;
	char *buf, *argv[FUZZ_MAX_ARGS + 2];
	uint8_t flags = fuzz_u8(&in);
	size_t len = in.n, off;
	int argc = 0, i;

	/* argv[0], then the NUL-separated arguments */
	buf = malloc(len + 1);
	if (!buf)
		abort();
	memcpy(buf, in.p, len);
	buf[len] = '\0';
	argv[argc++] = (char *)"fabep_fuzz";
	for (off = 0; off <= len && argc <= FUZZ_MAX_ARGS; ) {
		argv[argc++] = buf + off;
		off += strlen(buf + off) + 1;
	}
	if (len == 0)
		argc = 1;
	argv[argc] = NULL;

	/* The size parsers on every argument. */
	for (i = 1; i < argc; i++) {
		size_t v, sizes[TOOL_MAX_SIZES];
		char s[32];
		int ns = 0, ret;

		ret = tool_parse_size(argv[i], &v);
		FUZZ_CHECK(ret == 0 || ret == -EINVAL || ret == -ERANGE);
		if (!ret)
			tool_size_str(s, sizeof(s), v);
		ret = tool_parse_sizes(argv[i], 1ull << 30, sizes, &ns);
		FUZZ_CHECK(ret || (ns >= 1 && ns <= TOOL_MAX_SIZES));
	}

	/* The tools read FABEP_TIMEOUT_MS themselves: the library takes
	 * 1 ms to 24 h, so must they. */
	if (argc > 1 && (flags & 0x80)) {
		uint64_t ns;

		setenv("FABEP_TIMEOUT_MS", argv[1], 1);
		ns = tool_timeout_ns();
		FUZZ_CHECK(ns >= 1000000ull && ns <= 86400000ull * 1000000ull);
		unsetenv("FABEP_TIMEOUT_MS");
	}

	memset(&d, 0, sizeof(d));
	d.name = "fabep_fuzz";
	d.summary = "fuzzing";
	d.accept = (flags & 1) ? pp_accept : all_accept;
	d.max_args = (flags >> 1) & 3;
	optind = 0; /* glibc: start getopt afresh (also after a jump out) */
	if (!setjmp(fuzz_exit_jmp)) {
		tool_parse(&d, argc, argv, &o);
		fuzz_check_opts(&d, argc, &o);
	} else {
		FUZZ_CHECK(fuzz_exit_status == TOOL_EXIT_OK ||
			   fuzz_exit_status == TOOL_EXIT_USAGE);
	}
	free(buf);
	return 0;
}
