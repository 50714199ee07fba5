/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_fuzz_regress.c - replays the corpus of one fuzz target
 * (fuzz/corpus/<target>/: its seeds, and the input of every crash the
 * fuzzer found, each fixed since) through that target's harness
 * (fuzz/<target>.c), built here with the project's compiler and flags: in
 * the sanitizer build with ASan and UBSan, so a fixed bug that comes back
 * fails `make check` without clang or libFuzzer.
 *
 * tests/Makefile.include builds this file once per target, with
 * FUZZ_TARGET naming it and the harness linked in.  FUZZ_CORPUS (from the
 * environment) overrides the corpus folder.
 */
#include "config.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <check.h>

#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#ifndef FUZZ_CORPUS_DIR
#define FUZZ_CORPUS_DIR "fuzz/corpus"
#endif

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(test_replay)
{
	const char *corpus = getenv("FUZZ_CORPUS");
	char dir[4096], path[8192], *names[4096];
	struct dirent *de;
	size_t n = 0, i;
	DIR *d;
	FILE *log;
	int argc = 1;
	char *args[] = { (char *)FUZZ_TARGET, NULL }, **argv = args;

	/* The harness sends stderr to /dev/null: name each input on a copy
	 * of it, so a crash report follows the name of its input. */
	log = fdopen(dup(2), "w");
	ck_assert_ptr_nonnull(log);
	snprintf(dir, sizeof(dir), "%s/%s", corpus ? corpus : FUZZ_CORPUS_DIR,
		 FUZZ_TARGET);
	d = opendir(dir);
	ck_assert_msg(d != NULL, "cannot open %s", dir);
	while ((de = readdir(d)) && n < sizeof(names) / sizeof(names[0]))
		if (de->d_name[0] != '.')
			names[n++] = strdup(de->d_name);
	closedir(d);
	ck_assert_msg(n > 0, "%s is empty", dir);
	qsort(names, n, sizeof(names[0]), name_cmp);

	LLVMFuzzerInitialize(&argc, &argv);
	for (i = 0; i < n; i++) {
		uint8_t *buf;
		long len;
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		f = fopen(path, "rb");
		ck_assert_msg(f != NULL, "cannot open %s", path);
		ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
		len = ftell(f);
		rewind(f);
		buf = malloc(len > 0 ? (size_t)len : 1);
		ck_assert_ptr_nonnull(buf);
		ck_assert_int_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
		fclose(f);
		fprintf(log, "%s: %s (%ld bytes)\n", FUZZ_TARGET, names[i], len);
		fflush(log);
		ck_assert_int_eq(LLVMFuzzerTestOneInput(buf, (size_t)len), 0);
		free(buf);
		free(names[i]);
	}
	fprintf(log, "%s: %zu inputs replayed\n", FUZZ_TARGET, n);
	fclose(log);
}
END_TEST

int main(void)
{
	Suite *s = suite_create(FUZZ_TARGET);
	TCase *tc = tcase_create("replay");

	tcase_add_test(tc, test_replay);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return fep_test_run_suite(s);
}
