/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz.h - what the libFuzzer targets in fuzz/ share: a reader over the
 * input bytes, quiet logging, and a check that turns a broken invariant
 * into a crash the fuzzer reports.
 *
 * The targets include the .c file they test, so they reach its static
 * parsing and validation functions without the library exporting them;
 * the rest of the library comes from the archive fuzz/build.sh makes.
 */
#ifndef FEP_FUZZ_H
#define FEP_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Abort with a message when an invariant of the code under test fails:
 * a fuzzer finding, like a sanitizer report. */
#define FUZZ_CHECK(cond)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(fuzz_real_stderr ? fuzz_real_stderr : stderr, "%s:%d: invariant failed: %s\n", \
				__FILE__, __LINE__, #cond);                  \
			abort();                                             \
		}                                                            \
	} while (0)

static FILE *fuzz_real_stderr;

/*
 * fabep logs every rejected input with fep_err (to stderr).  The messages
 * are formatted as usual (printing what a peer sent is part of what is
 * tested) but go to /dev/null, unless FUZZ_VERBOSE is set.  Sanitizer and
 * libFuzzer reports write to file descriptor 2 directly and still show.
 */
static void fuzz_quiet(void)
{
	FILE *null;

	fuzz_real_stderr = stderr;
	if (getenv("FUZZ_VERBOSE"))
		return;
	null = fopen("/dev/null", "w");
	if (null)
		stderr = null;
}

/* ---- reading the input ---- */

struct fuzz_in {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
	uint8_t v;

	if (!in->n)
		return 0;
	v = *in->p++;
	in->n--;
	return v;
}

static inline uint16_t fuzz_u16(struct fuzz_in *in)
{
	uint16_t v = fuzz_u8(in);

	return (uint16_t)(v << 8 | fuzz_u8(in));
}

static inline uint32_t fuzz_u32(struct fuzz_in *in)
{
	uint32_t v = fuzz_u16(in);

	return v << 16 | fuzz_u16(in);
}

/* Up to len bytes (fewer at the end of the input); *got how many. */
static inline const uint8_t *fuzz_bytes(struct fuzz_in *in, size_t len,
					size_t *got)
{
	const uint8_t *p = in->p;

	if (len > in->n)
		len = in->n;
	in->p += len;
	in->n -= len;
	*got = len;
	return p;
}

/* A NUL-terminated copy of the bytes up to the next '\n' (or the end),
 * NULs inside cut short; the caller frees it. */
static inline char *fuzz_line(struct fuzz_in *in)
{
	const uint8_t *nl = memchr(in->p, '\n', in->n);
	size_t len = nl ? (size_t)(nl - in->p) : in->n;
	char *s = malloc(len + 1);

	if (!s)
		abort();
	memcpy(s, in->p, len);
	s[len] = '\0';
	in->p += len + (nl ? 1 : 0);
	in->n -= len + (nl ? 1 : 0);
	return s;
}

#endif
