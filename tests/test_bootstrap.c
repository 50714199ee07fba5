/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * test_bootstrap.c - environment parsing, the option parsers of util, the
 * TCP rendezvous (forked ranks on 127.0.0.1) and the callback bootstrap.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>

#include <check.h>

#include "util/util.h"
#include "bootstrap/bootstrap.h"
#include "harness.h"

/* ---- helpers ---- */

static const char *boot_vars[] = {
	"FABEP_RANK", "FABEP_WORLD_SIZE", "FABEP_ROOT", "FABEP_LOCAL_RANK",
	"FABEP_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
	"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
	"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
};

static void env_clear(void)
{
	size_t i;

	for (i = 0; i < FEP_ARRAY_SIZE(boot_vars); i++)
		unsetenv(boot_vars[i]);
}

/* Capture this process's stderr (fd 2) into a temporary file. */
struct capture {
	int saved;
	FILE *f;
	char text[16384];
};

static void capture_begin(struct capture *c)
{
	fflush(stderr);
	c->f = tmpfile();
	ck_assert_ptr_nonnull(c->f);
	c->saved = dup(2);
	ck_assert_int_ge(c->saved, 0);
	ck_assert_int_ge(dup2(fileno(c->f), 2), 0);
}

/* Restores stderr, echoes what was captured, returns it. */
static const char *capture_end(struct capture *c)
{
	size_t n;

	fflush(stderr);
	dup2(c->saved, 2);
	close(c->saved);
	rewind(c->f);
	n = fread(c->text, 1, sizeof(c->text) - 1, c->f);
	c->text[n] = '\0';
	fclose(c->f);
	fputs(c->text, stderr);
	return c->text;
}

/* Expect fep_boot_env_read to fail with -EINVAL, leave its output alone
 * and log a message that contains `needle`. */
static void env_expect_einval(const char *needle)
{
	struct fep_boot_env env;
	struct capture cap;
	const char *log;
	int ret;

	memset(&env, 0x5a, sizeof(env));
	capture_begin(&cap);
	ret = fep_boot_env_read(&env);
	log = capture_end(&cap);
	ck_assert_int_eq(ret, -EINVAL);
	ck_assert_int_eq(env.rank, 0x5a5a5a5a);
	ck_assert_msg(strstr(log, needle), "log \"%s\" does not name %s", log,
		      needle);
}

/* A refused local pair: the world's rank, size and root stay readable
 * (the rank meets the others to tell them), local_status says why. */
static void env_expect_local_refused(const char *needle, int rank, int size)
{
	struct fep_boot_env env;
	struct capture cap;
	const char *log;
	int ret;

	capture_begin(&cap);
	ret = fep_boot_env_read(&env);
	log = capture_end(&cap);
	ck_assert_int_eq(ret, 0);
	ck_assert_int_eq(env.local_status, -EINVAL);
	ck_assert_int_eq(env.rank, rank);
	ck_assert_int_eq(env.size, size);
	ck_assert_int_eq(env.local_rank, -1);
	ck_assert_msg(strstr(log, needle), "log \"%s\" does not name %s", log,
		      needle);
}

/* ---- environment ---- */

START_TEST(test_env_fabep)
{
	struct fep_boot_env env;

	env_clear();
	setenv("FABEP_RANK", "2", 1);
	setenv("FABEP_WORLD_SIZE", "4", 1);
	setenv("FABEP_ROOT", "127.0.0.1:29500", 1);
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_int_eq(env.rank, 2);
	ck_assert_int_eq(env.size, 4);
	ck_assert_int_eq(env.local_rank, -1);
	ck_assert_int_eq(env.local_size, -1);
	ck_assert_str_eq(env.root_host, "127.0.0.1");
	ck_assert_int_eq(env.root_port, 29500);
	ck_assert_str_eq(env.source, "FABEP");

	/* A leading zero is decimal, not octal. */
	setenv("FABEP_RANK", "010", 1);
	setenv("FABEP_WORLD_SIZE", "11", 1);
	setenv("FABEP_ROOT", "[::1]:80", 1);
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_int_eq(env.rank, 10);
	ck_assert_str_eq(env.root_host, "::1");
	ck_assert_int_eq(env.root_port, 80);

	/* FABEP_* wins over every launcher. */
	setenv("FABEP_RANK", "1", 1);
	setenv("FABEP_WORLD_SIZE", "2", 1);
	setenv("OMPI_COMM_WORLD_RANK", "5", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
	setenv("PMI_RANK", "6", 1);
	setenv("PMI_SIZE", "8", 1);
	setenv("SLURM_PROCID", "7", 1);
	setenv("SLURM_NTASKS", "8", 1);
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_int_eq(env.rank, 1);
	ck_assert_int_eq(env.size, 2);
	ck_assert_str_eq(env.source, "FABEP");
}
END_TEST

START_TEST(test_env_launchers)
{
	struct fep_boot_env env;

	env_clear();
	setenv("FABEP_ROOT", "node0:1234", 1);
	setenv("OMPI_COMM_WORLD_RANK", "5", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
	setenv("PMI_RANK", "6", 1);
	setenv("PMI_SIZE", "9", 1);
	setenv("SLURM_PROCID", "7", 1);
	setenv("SLURM_NTASKS", "10", 1);
	setenv("SLURM_LOCALID", "3", 1);
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_str_eq(env.source, "OMPI");
	ck_assert_int_eq(env.rank, 5);
	ck_assert_int_eq(env.size, 8);
	ck_assert_int_eq(env.local_rank, 1);
	ck_assert_int_eq(env.local_size, 4);
	ck_assert_str_eq(env.root_host, "node0");
	ck_assert_int_eq(env.root_port, 1234);

	unsetenv("OMPI_COMM_WORLD_RANK");
	unsetenv("OMPI_COMM_WORLD_SIZE");
	unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
	unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_str_eq(env.source, "PMI");
	ck_assert_int_eq(env.rank, 6);
	ck_assert_int_eq(env.size, 9);
	ck_assert_int_eq(env.local_rank, -1);

	unsetenv("PMI_RANK");
	unsetenv("PMI_SIZE");
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_str_eq(env.source, "SLURM");
	ck_assert_int_eq(env.rank, 7);
	ck_assert_int_eq(env.size, 10);
	ck_assert_int_eq(env.local_rank, 3);
	ck_assert_int_eq(env.local_size, -1);

	/* Nothing at all: unknown, not an error. */
	env_clear();
	unsetenv("FABEP_ROOT");
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_int_eq(env.rank, -1);
	ck_assert_int_eq(env.size, -1);
	ck_assert_ptr_null(env.source);
	ck_assert_int_eq(env.root_port, 0);

	/* One rank under a launcher needs no root. */
	setenv("SLURM_PROCID", "0", 1);
	setenv("SLURM_NTASKS", "1", 1);
	ck_assert_int_eq(fep_boot_env_read(&env), 0);
	ck_assert_int_eq(env.size, 1);
	ck_assert_int_eq(env.root_port, 0);
}
END_TEST

START_TEST(test_env_bad)
{
	env_clear();
	setenv("FABEP_ROOT", "127.0.0.1:29500", 1);

	setenv("FABEP_WORLD_SIZE", "4", 1);
	setenv("FABEP_RANK", "abc", 1);
	env_expect_einval("FABEP_RANK");
	setenv("FABEP_RANK", "1x", 1);
	env_expect_einval("FABEP_RANK");
	setenv("FABEP_RANK", "-1", 1);
	env_expect_einval("FABEP_RANK");
	setenv("FABEP_RANK", "4", 1); /* rank >= size */
	env_expect_einval("FABEP_RANK=4");
	setenv("FABEP_RANK", "99999999999999999999", 1);
	env_expect_einval("FABEP_RANK");
	setenv("FABEP_RANK", "1", 1);
	setenv("FABEP_WORLD_SIZE", "0", 1);
	env_expect_einval("FABEP_WORLD_SIZE");
	setenv("FABEP_WORLD_SIZE", "4.0", 1);
	env_expect_einval("FABEP_WORLD_SIZE");
	unsetenv("FABEP_WORLD_SIZE"); /* one without the other */
	env_expect_einval("FABEP_WORLD_SIZE");
	setenv("FABEP_WORLD_SIZE", "4", 1);
	unsetenv("FABEP_RANK");
	env_expect_einval("FABEP_RANK");

	/* A world of several ranks needs a root, and a well-formed one. */
	setenv("FABEP_RANK", "1", 1);
	unsetenv("FABEP_ROOT");
	env_expect_einval("FABEP_ROOT");
	setenv("FABEP_ROOT", "127.0.0.1", 1);
	env_expect_einval("FABEP_ROOT");
	setenv("FABEP_ROOT", "127.0.0.1:0", 1);
	env_expect_einval("FABEP_ROOT");
	setenv("FABEP_ROOT", "127.0.0.1:65536", 1);
	env_expect_einval("FABEP_ROOT");
	setenv("FABEP_ROOT", ":80", 1);
	env_expect_einval("FABEP_ROOT");
	setenv("FABEP_ROOT", "[::1:80", 1);
	env_expect_einval("FABEP_ROOT");

	/* Launcher variables are checked the same way. */
	env_clear();
	setenv("FABEP_ROOT", "127.0.0.1:29500", 1);
	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
	env_expect_local_refused("OMPI_COMM_WORLD_LOCAL_RANK", 3, 4);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8", 1);
	env_expect_local_refused("OMPI_COMM_WORLD_LOCAL_SIZE", 3, 4);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "x", 1);
	env_expect_local_refused("OMPI_COMM_WORLD_LOCAL_SIZE", 3, 4);
	env_clear();
	setenv("PMI_RANK", "2", 1);
	setenv("PMI_SIZE", "2", 1);
	env_expect_einval("PMI_RANK");
	env_clear();
	setenv("SLURM_PROCID", "x", 1);
	setenv("SLURM_NTASKS", "2", 1);
	env_expect_einval("SLURM_PROCID");
	env_clear();
	setenv("SLURM_NTASKS", "2", 1);
	env_expect_einval("SLURM_PROCID");
}
END_TEST

/* ---- util parsers ---- */

START_TEST(test_parse_size)
{
	static const struct { const char *s; size_t v; } good[] = {
		{ "0", 0 }, { "123", 123 }, { "64k", 65536 }, { "64K", 65536 },
		{ "64kB", 65536 }, { "64KiB", 65536 }, { "4M", 4u << 20 },
		{ "4MiB", 4u << 20 }, { "1G", 1u << 30 }, { "100B", 100 },
		{ " 7", 7 }, { "7 ", 7 }, { "010", 10 },
	};
	static const char *bad[] = {
		"", " ", "k", "-1", "+1", "1.5k", "64i", "64iB", "1T", "abc",
		"0x10", "64 k", "64kk", "1,000",
	};
	size_t i, v;

	for (i = 0; i < FEP_ARRAY_SIZE(good); i++) {
		v = 12345;
		ck_assert_msg(fep_parse_size(good[i].s, &v) == 0,
			      "\"%s\" rejected", good[i].s);
		ck_assert_msg(v == good[i].v, "\"%s\" -> %zu, expected %zu",
			      good[i].s, v, good[i].v);
	}
	for (i = 0; i < FEP_ARRAY_SIZE(bad); i++) {
		v = 12345;
		ck_assert_msg(fep_parse_size(bad[i], &v) == -EINVAL,
			      "\"%s\" accepted or wrong code", bad[i]);
		ck_assert_uint_eq(v, 12345);
	}
	ck_assert_int_eq(fep_parse_size(NULL, &v), -EINVAL);
	ck_assert_int_eq(fep_parse_size("18446744073709551616", &v), -ERANGE);
	ck_assert_int_eq(fep_parse_size("17179869184G", &v), -ERANGE);
	ck_assert_uint_eq(v, 12345);
}
END_TEST

START_TEST(test_parse_long)
{
	long v = 99;

	ck_assert_int_eq(fep_parse_long("42", 0, 100, &v), 0);
	ck_assert_int_eq(v, 42);
	ck_assert_int_eq(fep_parse_long(" -7 ", -10, 10, &v), 0);
	ck_assert_int_eq(v, -7);
	ck_assert_int_eq(fep_parse_long("0x10", 0, 100, &v), 0);
	ck_assert_int_eq(v, 16);
	ck_assert_int_eq(fep_parse_long("010", 0, 100, &v), 0);
	ck_assert_int_eq(v, 10);
	ck_assert_int_eq(fep_parse_long("08", 0, 100, &v), 0);
	ck_assert_int_eq(v, 8);
	ck_assert_int_eq(fep_parse_long("0", 0, 100, &v), 0);
	ck_assert_int_eq(v, 0);
	v = 99;
	ck_assert_int_eq(fep_parse_long("", 0, 100, &v), -EINVAL);
	ck_assert_int_eq(fep_parse_long("  ", 0, 100, &v), -EINVAL);
	ck_assert_int_eq(fep_parse_long(NULL, 0, 100, &v), -EINVAL);
	ck_assert_int_eq(fep_parse_long("1e3", 0, 10000, &v), -EINVAL);
	ck_assert_int_eq(fep_parse_long("12abc", 0, 100, &v), -EINVAL);
	ck_assert_int_eq(fep_parse_long("0x", 0, 100, &v), -EINVAL);
	ck_assert_int_eq(fep_parse_long("101", 0, 100, &v), -ERANGE);
	ck_assert_int_eq(fep_parse_long("-1", 0, 100, &v), -ERANGE);
	ck_assert_int_eq(fep_parse_long("99999999999999999999999", LONG_MIN,
					LONG_MAX, &v), -ERANGE);
	ck_assert_int_eq(v, 99);
}
END_TEST

/* A file of the fake cgroup tree, its directories made first. */
static void cg_put(const char *root, const char *rel, const char *text)
{
	char path[1024], *sl;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (sl = strchr(path + strlen(root) + 1, '/'); sl; sl = strchr(sl + 1, '/')) {
		*sl = '\0';
		mkdir(path, 0755);
		*sl = '/';
	}
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/* The CPU limit of a cgroup, against trees made here: v2 (pure and
 * hybrid), v1 with either mount name, the tightest of nested limits, a
 * path the mount does not hold (a container's view), none set. */
START_TEST(test_cgroup_cpus)
{
	static const struct {
		const char *self;   /* /proc/self/cgroup */
		const char *files;  /* "path=text;..." under the root */
		int want;
	} cs[] = {
		{ "0::/a/b\n", "a/cpu.max=200000 100000\n;a/b/cpu.max=max 100000\n", 2 },
		{ "0::/a\n", "a/cpu.max=150000 100000\n", 2 },
		{ "0::/a\n", "a/cpu.max=max 100000\n", 0 },
		{ "0::/a/b\n", "a/cpu.max=100000 100000\n;a/b/cpu.max=300000 100000\n", 1 },
		{ "1:cpu:/\n0::/x\n", "unified/x/cpu.max=50000 100000\n", 1 },
		{ "4:cpu,cpuacct:/x\n",
		  "cpu,cpuacct/x/cpu.cfs_quota_us=300000\n;cpu,cpuacct/x/cpu.cfs_period_us=100000\n", 3 },
		{ "4:cpuacct,cpu:/x\n",
		  "cpu/x/cpu.cfs_quota_us=250000\n;cpu/x/cpu.cfs_period_us=100000\n", 3 },
		{ "1:cpu:/\n", "cpu/cpu.cfs_quota_us=-1\n;cpu/cpu.cfs_period_us=100000\n", 0 },
		{ "1:cpu:/docker/abc\n",
		  "cpu/cpu.cfs_quota_us=400000\n;cpu/cpu.cfs_period_us=100000\n", 4 },
		{ "2:memory:/x\n", "memory/x/cpu.cfs_quota_us=100000\n;"
		  "memory/x/cpu.cfs_period_us=100000\n", 0 },
		{ "garbage\n::\n0::relative\n", "cpu.max=100000 100000\n", 0 },
		{ "0::/a\n", "a/cpu.max=nonsense\n", 0 },
	};
	size_t i;

	for (i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		char root[] = "/tmp/fabep-cgroup-XXXXXX", self[64], cmd[96];
		char files[512], *f, *save = NULL;
		int got;

		ck_assert_ptr_nonnull(mkdtemp(root));
		snprintf(files, sizeof(files), "%s", cs[i].files);
		for (f = strtok_r(files, ";", &save); f; f = strtok_r(NULL, ";", &save)) {
			char *eq = strchr(f, '=');

			*eq = '\0';
			cg_put(root, f, eq + 1);
		}
		cg_put(root, "self", cs[i].self);
		snprintf(self, sizeof(self), "%s/self", root);
		got = fep_cgroup_cpus_at(root, self);
		snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
		ck_assert_int_eq(system(cmd), 0);
		ck_assert_msg(got == cs[i].want, "case %zu (%s): %d CPUs, expected %d",
			      i, cs[i].files, got, cs[i].want);
	}
	ck_assert_int_eq(fep_cgroup_cpus_at("/nonexistent", "/nonexistent/self"), 0);
	ck_assert_int_ge(fep_cgroup_cpus(), 0);
}
END_TEST

START_TEST(test_parse_hostport)
{
	static const struct { const char *s, *host; int port; } good[] = {
		{ "127.0.0.1:80", "127.0.0.1", 80 },
		{ "[::1]:8080", "::1", 8080 },
		{ "node-1.example:65535", "node-1.example", 65535 },
		{ "h:1", "h", 1 },
		{ "h:00080", "h", 80 },
	};
	static const char *bad[] = {
		"", "127.0.0.1", ":80", "h:", "h:0", "h:65536", "h:-1", "h:+80",
		"h: 80", "h:80 ", "h:0x50", "::1:80", "[::1]80", "[::1]", "[]:80",
		"[::1:80", " 127.0.0.1:80", "h x:80", "\th:80", "[ ::1]:80",
	};
	char host[64];
	int port;
	size_t i;

	for (i = 0; i < FEP_ARRAY_SIZE(good); i++) {
		port = -1;
		ck_assert_msg(!fep_parse_hostport(good[i].s, host, sizeof(host),
						  &port),
			      "\"%s\" rejected", good[i].s);
		ck_assert_str_eq(host, good[i].host);
		ck_assert_int_eq(port, good[i].port);
	}
	for (i = 0; i < FEP_ARRAY_SIZE(bad); i++) {
		port = -1;
		ck_assert_msg(fep_parse_hostport(bad[i], host, sizeof(host),
						 &port) == -EINVAL,
			      "\"%s\" accepted", bad[i]);
		ck_assert_int_eq(port, -1);
	}
	/* The host must fit with its NUL. */
	ck_assert_int_eq(fep_parse_hostport("abcd:80", host, 4, &port), -EINVAL);
	ck_assert_int_eq(fep_parse_hostport("abc:80", host, 4, &port), 0);
	ck_assert_str_eq(host, "abc");
}
END_TEST

/* ---- TCP bootstrap, single process ---- */

START_TEST(test_tcp_args)
{
	fep_boot_t *b = (fep_boot_t *)0x1;
	uint64_t in = 0x1122334455667788ull, out = 0;

	ck_assert_int_eq(fep_boot_tcp_create(0, 2, "127.0.0.1", 1234, 1000,
					     NULL), -EINVAL);
	ck_assert_int_eq(fep_boot_tcp_create(2, 2, "127.0.0.1", 1234, 1000,
					     &b), -EINVAL);
	ck_assert_int_eq(fep_boot_tcp_create(-1, 2, "127.0.0.1", 1234, 1000,
					     &b), -EINVAL);
	ck_assert_int_eq(fep_boot_tcp_create(0, 0, "127.0.0.1", 1234, 1000,
					     &b), -EINVAL);
	ck_assert_int_eq(fep_boot_tcp_create(1, 2, NULL, 1234, 1000, &b),
			 -EINVAL);
	ck_assert_int_eq(fep_boot_tcp_create(1, 2, "127.0.0.1", 0, 1000, &b),
			 -EINVAL);
	ck_assert_int_eq(fep_boot_tcp_create(1, 2, "127.0.0.1", 1234, 0, &b),
			 -EINVAL);
	ck_assert_ptr_eq(b, (fep_boot_t *)0x1); /* untouched on error */

	/* One rank: no sockets, no root needed. */
	ck_assert_int_eq(fep_boot_tcp_create(0, 1, NULL, 0, 1000, &b), 0);
	ck_assert_int_eq(b->rank, 0);
	ck_assert_int_eq(b->size, 1);
	ck_assert_int_eq(fep_boot_allgather(b, &in, &out, sizeof(in)), 0);
	ck_assert(out == in);
	ck_assert_int_eq(fep_boot_allgather(b, NULL, &out, 8), -EINVAL);
	ck_assert_int_eq(fep_boot_allgather(b, NULL, NULL, 0), 0);
	ck_assert_int_eq(fep_boot_barrier(b), 0);
	fep_boot_destroy(b);
	fep_boot_destroy(NULL);
}
END_TEST

/* A non-root rank whose root never listens: -ETIMEDOUT, on time. */
START_TEST(test_tcp_root_absent)
{
	fep_boot_t *b = NULL;
	struct capture cap;
	const char *log;
	uint64_t t0, ms;
	int port = fep_test_free_port(), ret;

	ck_assert_int_gt(port, 0);
	capture_begin(&cap);
	t0 = fep_now_ns();
	ret = fep_boot_tcp_create(1, 2, "127.0.0.1", port, 600, &b);
	ms = (fep_now_ns() - t0) / 1000000;
	log = capture_end(&cap);
	ck_assert_int_eq(ret, -ETIMEDOUT);
	ck_assert_ptr_null(b);
	ck_assert_msg(ms >= 590 && ms < 600 + 500, "took %llu ms",
		      (unsigned long long)ms);
	ck_assert_msg(strstr(log, "never answered within 600 ms"), "log: %s",
		      log);
}
END_TEST

/* A root whose ranks never come: -ETIMEDOUT naming them, on time. */
START_TEST(test_tcp_ranks_absent)
{
	fep_boot_t *b = NULL;
	struct capture cap;
	const char *log;
	uint64_t t0, ms;
	int port = fep_test_free_port(), ret;

	ck_assert_int_gt(port, 0);
	capture_begin(&cap);
	t0 = fep_now_ns();
	ret = fep_boot_tcp_create(0, 4, "127.0.0.1", port, 500, &b);
	ms = (fep_now_ns() - t0) / 1000000;
	log = capture_end(&cap);
	ck_assert_int_eq(ret, -ETIMEDOUT);
	ck_assert_ptr_null(b);
	ck_assert_msg(ms >= 490 && ms < 500 + 500, "took %llu ms",
		      (unsigned long long)ms);
	ck_assert_msg(strstr(log, "ranks 1, 2, 3 never connected"), "log: %s",
		      log);
}
END_TEST

/* ---- TCP bootstrap, forked ranks ---- */

#define FAIL_IF(cond, ...)                                                   \
	do {                                                                 \
		if (cond) {                                                  \
			fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__,  \
				__LINE__);                                   \
			fprintf(stderr, __VA_ARGS__);                        \
			fprintf(stderr, "\n");                               \
			return 1;                                            \
		}                                                            \
	} while (0)

/* Bootstrap this rank from the environment the harness set. */
static int rank_boot(int rank, int size, int timeout_ms, fep_boot_t **b)
{
	struct fep_boot_env env;
	int ret;

	fep_log_set_rank(rank);
	ret = fep_boot_env_read(&env);
	if (ret)
		return ret;
	if (env.rank != rank || env.size != size || !env.source ||
	    strcmp(env.source, "FABEP")) {
		fprintf(stderr, "rank %d: environment says rank %d of %d\n",
			rank, env.rank, env.size);
		return -EINVAL;
	}
	return fep_boot_tcp_create(env.rank, env.size, env.root_host,
				   env.root_port, timeout_ms, b);
}

static uint8_t pattern_byte(int rank, int round, size_t i)
{
	uint64_t s = ((uint64_t)rank << 40) ^ ((uint64_t)round << 20) ^ i ^
		     0x9E3779B97F4A7C15ull;

	return (uint8_t)(fep_test_rand(&s) >> 56);
}

static int rank_allgather(int rank, int size, void *arg)
{
	fep_boot_t *b;
	uint64_t seed = 0xabcdef12345ull; /* same on every rank: same lens */
	uint8_t *in, *out;
	size_t len, i;
	int round, r, ret;

	ret = rank_boot(rank, size, 10000, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	FAIL_IF(b->rank != rank || b->size != size, "rank/size");
	for (round = 0; round < 12; round++) {
		switch (round) {
		case 0: len = 0; break;
		case 1: len = 1; break;
		case 2: len = 300000; break; /* many partial reads/writes */
		default: len = (size_t)(fep_test_rand(&seed) % 70000); break;
		}
		in = malloc(len ? len : 1);
		out = malloc(len * (size_t)size + 1);
		FAIL_IF(!in || !out, "malloc");
		for (i = 0; i < len; i++)
			in[i] = pattern_byte(rank, round, i);
		memset(out, 0xee, len * (size_t)size + 1);
		ret = fep_boot_allgather(b, in, out, len);
		FAIL_IF(ret, "allgather round %d len %zu: %s", round, len,
			fabep_strerror(ret));
		for (r = 0; r < size; r++)
			for (i = 0; i < len; i++)
				FAIL_IF(out[(size_t)r * len + i] !=
						pattern_byte(r, round, i),
					"round %d len %zu: byte %zu of rank "
					"%d's block is wrong", round, len, i, r);
		FAIL_IF(out[len * (size_t)size] != 0xee, "wrote past the end");
		free(in);
		free(out);
		ret = fep_boot_barrier(b);
		FAIL_IF(ret, "barrier: %s", fabep_strerror(ret));
	}
	fep_boot_destroy(b);
	return 0;
}

START_TEST(test_tcp_allgather)
{
	int size = _i; /* loop test: 2..6 ranks */

	fep_test_ranks_ok(size, 20, rank_allgather, NULL);
}
END_TEST

/* Barrier: nobody leaves before the last one entered. */
static int rank_barrier(int rank, int size, void *arg)
{
	fep_boot_t *b;
	uint64_t t[2], *all;
	int ret, r, round;
	struct timespec ts;

	ret = rank_boot(rank, size, 10000, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	all = calloc((size_t)size * 2, sizeof(uint64_t));
	FAIL_IF(!all, "malloc");
	for (round = 0; round < 3; round++) {
		/* Enter at different times: the last rank 150 ms late. */
		ts.tv_sec = 0;
		ts.tv_nsec = (long)((rank + round) % size) * 50000000L;
		nanosleep(&ts, NULL);
		t[0] = fep_now_ns();
		ret = fep_boot_barrier(b);
		t[1] = fep_now_ns();
		FAIL_IF(ret, "barrier: %s", fabep_strerror(ret));
		ret = fep_boot_allgather(b, t, all, sizeof(t));
		FAIL_IF(ret, "allgather: %s", fabep_strerror(ret));
		for (r = 0; r < size; r++)
			FAIL_IF(all[2 * rank + 1] < all[2 * r],
				"round %d: left the barrier before rank %d "
				"entered it", round, r);
	}
	free(all);
	fep_boot_destroy(b);
	return 0;
}

START_TEST(test_tcp_barrier)
{
	fep_test_ranks_ok(4, 15, rank_barrier, NULL);
}
END_TEST

/* A rank dies in the middle: the others fail fast, with PEER_LOST. */
struct kill_arg {
	int victim;
	int timeout_ms;
};

static int rank_killed(int rank, int size, void *argp)
{
	struct kill_arg *a = argp;
	fep_boot_t *b;
	uint64_t v = (uint64_t)rank, out[8], t0, ms;
	int ret, round;

	ret = rank_boot(rank, size, a->timeout_ms, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	for (round = 0; round < 3; round++) {
		ret = fep_boot_allgather(b, &v, out, sizeof(v));
		FAIL_IF(ret, "allgather %d: %s", round, fabep_strerror(ret));
	}
	if (rank == a->victim)
		raise(SIGKILL);
	t0 = fep_now_ns();
	ret = fep_boot_allgather(b, &v, out, sizeof(v));
	ms = (fep_now_ns() - t0) / 1000000;
	FAIL_IF(ret != -FABEP_ERR_PEER_LOST && ret != -ETIMEDOUT,
		"allgather after rank %d died returned %d (%s)", a->victim,
		ret, fabep_strerror(ret));
	FAIL_IF(ms > (uint64_t)a->timeout_ms + 500, "took %llu ms",
		(unsigned long long)ms);
	/* Broken for good: a later call fails at once, with the same code. */
	t0 = fep_now_ns();
	FAIL_IF(fep_boot_barrier(b) != ret, "later call: different code");
	FAIL_IF(fep_now_ns() - t0 > 100000000ull, "later call waited");
	fep_boot_destroy(b);
	return 0;
}

/* size ranks run fn; the victim must die of SIGKILL, the others pass. */
static void run_kill(int size, int timeout_s, fep_test_rank_fn fn,
		     struct kill_arg *a)
{
	int status[8], r;

	ck_assert_int_le(size, 8);
	ck_assert_int_eq(fep_test_run_ranks_status(size, timeout_s, fn, a,
						   status), 0);
	for (r = 0; r < size; r++)
		ck_assert_msg(status[r] == (r == a->victim ? 128 + SIGKILL : 0),
			      "rank %d status %d", r, status[r]);
}

START_TEST(test_tcp_rank_killed)
{
	struct kill_arg a = { .victim = 2, .timeout_ms = 2000 };

	run_kill(4, 15, rank_killed, &a);
}
END_TEST

START_TEST(test_tcp_root_killed)
{
	struct kill_arg a = { .victim = 0, .timeout_ms = 2000 };

	run_kill(3, 15, rank_killed, &a);
}
END_TEST

/* Between collectives: fep_boot_watch sees a rank whose process ended,
 * directly (the root, or any rank for the root) or told by the root. */
static int watch_until(fep_boot_t *b, int limit_ms, uint64_t *ms)
{
	uint64_t t0 = fep_now_ns();
	struct timespec ts = { 0, 5000000L };
	int ret;

	for (;;) {
		ret = fep_boot_watch(b);
		*ms = (fep_now_ns() - t0) / 1000000;
		if (ret || *ms >= (uint64_t)limit_ms)
			return ret;
		nanosleep(&ts, NULL);
	}
}

static int rank_watch_killed(int rank, int size, void *argp)
{
	struct kill_arg *a = argp;
	fep_boot_t *b;
	uint64_t v = (uint64_t)rank, out[8], ms;
	int ret;

	ret = rank_boot(rank, size, a->timeout_ms, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	ret = fep_boot_allgather(b, &v, out, sizeof(v));
	FAIL_IF(ret, "allgather: %s", fabep_strerror(ret));
	FAIL_IF(fep_boot_watch(b), "watch before anyone died");
	ret = fep_boot_barrier(b);  /* every watch above came first */
	FAIL_IF(ret, "barrier: %s", fabep_strerror(ret));
	if (rank == a->victim)
		raise(SIGKILL);
	/* the watch, not the timeout (30 s), must see it */
	ret = watch_until(b, 6000, &ms);
	FAIL_IF(ret != -FABEP_ERR_PEER_LOST, "watch after rank %d died: %d "
		"(%s) after %llu ms", a->victim, ret, fabep_strerror(ret),
		(unsigned long long)ms);
	FAIL_IF(ms > 5000, "the loss took %llu ms to see", (unsigned long long)ms);
	/* for good, and the collectives fail at once */
	FAIL_IF(fep_boot_watch(b) != -FABEP_ERR_PEER_LOST, "second watch");
	ms = fep_now_ns();
	FAIL_IF(fep_boot_barrier(b) != -FABEP_ERR_PEER_LOST, "later barrier");
	FAIL_IF(fep_now_ns() - ms > 100000000ull, "later barrier waited");
	fep_boot_destroy(b);
	return 0;
}

START_TEST(test_tcp_watch_killed)
{
	/* _i: the victim; 0 is the root, whose end the ranks see directly */
	struct kill_arg a = { .victim = _i, .timeout_ms = 30000 };

	run_kill(4, 25, rank_watch_killed, &a);
}
END_TEST

/* A rank that destroys its bootstrap says goodbye: no loss.  A message
 * of the next collective (a rank ahead of the root) stays for it. */
static int rank_watch_bye(int rank, int size, void *arg)
{
	fep_boot_t *b;
	uint64_t v = (uint64_t)rank * 7 + 1, out[8], ms;
	int ret, r;

	(void)arg;
	ret = rank_boot(rank, size, 10000, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	if (rank == 0) {
		/* rank 1 and 2's blocks arrive while the root watches */
		ret = watch_until(b, 300, &ms);
		FAIL_IF(ret, "watch with blocks pending: %s", fabep_strerror(ret));
	}
	ret = fep_boot_allgather(b, &v, out, sizeof(v));
	FAIL_IF(ret, "allgather: %s", fabep_strerror(ret));
	for (r = 0; r < size; r++)
		FAIL_IF(out[r] != (uint64_t)r * 7 + 1, "block of rank %d", r);
	if (rank == 2) {
		fep_boot_destroy(b);  /* goodbye, then the process ends */
		return 0;
	}
	ret = watch_until(b, 300, &ms);
	FAIL_IF(ret, "watch after rank 2's goodbye: %s", fabep_strerror(ret));
	if (rank == 0) {
		fep_boot_destroy(b);
		return 0;
	}
	ret = watch_until(b, 300, &ms);
	FAIL_IF(ret, "watch after the root's goodbye: %s", fabep_strerror(ret));
	fep_boot_destroy(b);
	return 0;
}

START_TEST(test_tcp_watch_bye)
{
	fep_test_ranks_ok(3, 15, rank_watch_bye, NULL);
}
END_TEST

/* A rank whose communicator failed destroys its bootstrap without a
 * goodbye (b->failed): the root's watch and, told by the root, rank 1's
 * see it lost within seconds, where a goodbye would read as a normal
 * end. */
static int rank_failed_no_bye(int rank, int size, void *arg)
{
	fep_boot_t *b;
	uint64_t v = (uint64_t)rank, out[8], ms;
	int ret;

	(void)arg;
	ret = rank_boot(rank, size, 10000, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	ret = fep_boot_allgather(b, &v, out, sizeof(v));
	FAIL_IF(ret, "allgather: %s", fabep_strerror(ret));
	if (rank == 2) {
		b->failed = 1;
		fep_boot_destroy(b);
		return 0;
	}
	ret = watch_until(b, 6000, &ms);
	FAIL_IF(ret != -FABEP_ERR_PEER_LOST, "watch after rank 2 left failed: "
		"%d (%s) after %llu ms", ret, fabep_strerror(ret),
		(unsigned long long)ms);
	fep_boot_destroy(b);
	return 0;
}

START_TEST(test_tcp_failed_no_bye)
{
	setenv("FABEP_LOG", "none", 1);
	fep_test_ranks_ok(3, 15, rank_failed_no_bye, NULL);
}
END_TEST

/* Ranks that pass different lengths all get -FABEP_ERR_MISMATCH. */
static int rank_len_mismatch(int rank, int size, void *arg)
{
	fep_boot_t *b;
	uint8_t in[16] = { 0 }, out[16 * 8];
	int ret;

	ret = rank_boot(rank, size, 3000, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	ret = fep_boot_allgather(b, in, out, rank == 2 ? 16 : 8);
	FAIL_IF(ret != -FABEP_ERR_MISMATCH, "got %d (%s)", ret,
		fabep_strerror(ret));
	fep_boot_destroy(b);
	return 0;
}

START_TEST(test_tcp_len_mismatch)
{
	fep_test_ranks_ok(4, 15, rank_len_mismatch, NULL);
}
END_TEST

/* Raw connections to the root, speaking the wire format by hand. */
static int raw_connect(int port)
{
	struct sockaddr_in sa;
	uint64_t t0 = fep_now_ns();
	int fd;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons((uint16_t)port);
	while (fep_now_ns() - t0 < 5000000000ull) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
			return fd;
		close(fd);
		usleep(5000);
	}
	return -1;
}

static int root_port_from_env(void)
{
	const char *s = getenv("FABEP_ROOT");
	const char *c = s ? strrchr(s, ':') : NULL;

	return c ? atoi(c + 1) : -1;
}

static void hello_encode(uint8_t *p, int rank, int size)
{
	/* magic "FEPB", version 1, type 1 (hello), rank, size, seq 0, len 0;
	 * big-endian. */
	static const uint8_t head[8] = { 'F', 'E', 'P', 'B', 0, 1, 0, 1 };

	memset(p, 0, 32);
	memcpy(p, head, 8);
	p[8] = (uint8_t)(rank >> 24);
	p[9] = (uint8_t)(rank >> 16);
	p[10] = (uint8_t)(rank >> 8);
	p[11] = (uint8_t)rank;
	p[12] = (uint8_t)(size >> 24);
	p[13] = (uint8_t)(size >> 16);
	p[14] = (uint8_t)(size >> 8);
	p[15] = (uint8_t)size;
}

/*
 * Bad visitors at the root's port: rank 1 first sends garbage, a short
 * header that it closes, and a hello for the wrong world size; then it and
 * the other legitimate ranks bootstrap normally.  Rank 0 checks that it
 * logged why each was turned away.
 */
static int rank_intruders(int rank, int size, void *arg)
{
	fep_boot_t *b;
	struct capture cap;
	uint64_t v = (uint64_t)rank * 7, out[8];
	uint8_t junk[64], msg[512];
	int ret, fd, r, port = root_port_from_env();
	ssize_t n;

	if (rank == 0) {
		fflush(stderr);
		cap.f = tmpfile();
		FAIL_IF(!cap.f, "tmpfile");
		cap.saved = dup(2);
		dup2(fileno(cap.f), 2);
	}
	if (rank == 1) {
		/* Garbage, kept open: the root must not wait on it. */
		fd = raw_connect(port);
		FAIL_IF(fd < 0, "connect");
		memset(junk, 'x', sizeof(junk));
		FAIL_IF(send(fd, junk, sizeof(junk), MSG_NOSIGNAL) !=
			sizeof(junk), "send");
		/* Half a header, then nothing, kept open. */
		r = raw_connect(port);
		FAIL_IF(r < 0, "connect");
		hello_encode(junk, 1, size);
		FAIL_IF(send(r, junk, 10, MSG_NOSIGNAL) != 10, "send");
		/* A hello for a world of the wrong size: refused, answered. */
		ret = raw_connect(port);
		FAIL_IF(ret < 0, "connect");
		hello_encode(junk, 1, size + 3);
		FAIL_IF(send(ret, junk, 32, MSG_NOSIGNAL) != 32, "send");
		n = recv(ret, msg, sizeof(msg), MSG_WAITALL);
		FAIL_IF(n < 32 || msg[7] != 3, "no reject answer (%zd bytes)", n);
		close(ret);
		/* The same through the library: -FABEP_ERR_MISMATCH. */
		ret = fep_boot_tcp_create(1, size + 1, "127.0.0.1", port, 3000,
					  &b);
		FAIL_IF(ret != -FABEP_ERR_MISMATCH, "wrong size: got %d (%s)",
			ret, fabep_strerror(ret));
		/* And a rank out of range. */
		ret = raw_connect(port);
		FAIL_IF(ret < 0, "connect");
		hello_encode(junk, size + 5, size);
		FAIL_IF(send(ret, junk, 32, MSG_NOSIGNAL) != 32, "send");
		n = recv(ret, msg, sizeof(msg), MSG_WAITALL);
		FAIL_IF(n < 32 || msg[7] != 3, "no reject answer (%zd bytes)", n);
		close(ret);
		(void)fd; /* fd and r stay open through the rendezvous */
	}
	ret = rank_boot(rank, size, 5000, &b);
	FAIL_IF(ret, "bootstrap: %s", fabep_strerror(ret));
	ret = fep_boot_allgather(b, &v, out, sizeof(v));
	FAIL_IF(ret, "allgather: %s", fabep_strerror(ret));
	for (r = 0; r < size; r++)
		FAIL_IF(out[r] != (uint64_t)r * 7, "block %d", r);
	fep_boot_destroy(b);
	if (rank == 0) {
		const char *log = capture_end(&cap);

		FAIL_IF(!strstr(log, "is not a fabep rank (bad magic"),
			"garbage not reported");
		FAIL_IF(!strstr(log, "world has"), "wrong size not reported");
		FAIL_IF(!strstr(log, "is not in 1.."), "bad rank not reported");
	}
	return 0;
}

START_TEST(test_tcp_intruders)
{
	fep_test_ranks_ok(3, 20, rank_intruders, NULL);
}
END_TEST

/* Ranks arrive at the root in a wave larger than its room for strangers
 * (64): all 80 connect and say hello while the root is stopped, then it
 * runs and must welcome every one, none dropped as unidentified. */
#define WAVE 81

START_TEST(test_tcp_wave)
{
	int port = fep_test_free_port(), fds[WAVE], r, status = -1;
	uint8_t h[32];
	pid_t root;

	ck_assert_int_gt(port, 0);
	root = fork();
	ck_assert_int_ge(root, 0);
	if (root == 0) {
		fep_boot_t *b = NULL;
		int ret = fep_boot_tcp_create(0, WAVE, "127.0.0.1", port, 20000,
					      &b);

		if (!ret)
			fep_boot_destroy(b);
		_exit(ret ? 1 : 0);
	}
	/* the first connection waits for the root's listener */
	fds[1] = raw_connect(port);
	ck_assert_int_ge(fds[1], 0);
	kill(root, SIGSTOP);
	for (r = 2; r < WAVE; r++) {
		fds[r] = raw_connect(port);
		ck_assert_int_ge(fds[r], 0);
	}
	for (r = 1; r < WAVE; r++) {
		hello_encode(h, r, WAVE);
		ck_assert_int_eq(send(fds[r], h, 32, MSG_NOSIGNAL), 32);
	}
	kill(root, SIGCONT);
	for (r = 1; r < WAVE; r++) {
		struct timeval tv = { 20, 0 };
		ssize_t n;

		setsockopt(fds[r], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		n = recv(fds[r], h, 32, MSG_WAITALL);
		ck_assert_msg(n == 32 && h[7] == 2, "rank %d: %zd bytes, type %d "
			      "(want a welcome)", r, n, n == 32 ? h[7] : -1);
	}
	for (r = 1; r < WAVE; r++)
		close(fds[r]);
	ck_assert_int_eq(waitpid(root, &status, 0), root);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "root: status %d", status);
}
END_TEST

/* A header of the bootstrap's wire format: type, rank, size, seq, len,
 * big-endian (hello_encode's layout). */
static void hdr_encode_raw(uint8_t *p, int type, int rank, int size,
			   uint64_t seq, uint64_t len)
{
	int i;

	hello_encode(p, rank, size);
	p[7] = (uint8_t)type;
	for (i = 0; i < 8; i++) {
		p[16 + i] = (uint8_t)(seq >> (56 - 8 * i));
		p[24 + i] = (uint8_t)(len >> (56 - 8 * i));
	}
}

static int send_all(int fd, const void *b, size_t n)
{
	const uint8_t *p = b;

	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

#define MID_LEN (4u << 20)

static void mid_result_once(void);

/* A fake rank of a world of 3 (raw socket): hello, gather of MID_LEN
 * bytes; rank 1 then closes, rank 2 reads what the root sends it, slowly,
 * and exits 0 when no header lies inside the RESULT's payload, 1 when
 * one does. */
static int mid_fake(int port, int rank)
{
	size_t tot = 32 + 3ull * MID_LEN + 4096, got = 0, i;
	int fd = raw_connect(port), sz = 1 << 16;
	uint8_t h[32], *blk = malloc(tot);
	struct timeval tv = { 5, 0 };

	if (fd < 0 || !blk)
		return 2;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	hdr_encode_raw(h, 1, rank, 3, 0, 0);
	if (send_all(fd, h, 32) || recv(fd, h, 32, MSG_WAITALL) != 32)
		return 2;
	memset(blk, rank, MID_LEN);
	hdr_encode_raw(h, 4, rank, 3, 0, MID_LEN);
	if (send_all(fd, h, 32) || send_all(fd, blk, MID_LEN))
		return 2;
	if (rank == 1) {
		usleep(20000);
		close(fd);
		return 0;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (;;) {
		/* slow reads: the root's buffer to this rank has room
		 * while its RESULT is still half-sent (about 0.3 s) */
		ssize_t k = recv(fd, blk + got, FEP_MIN(tot - got, 4096), 0);

		usleep(50);

		if (k <= 0)
			break;
		got += (size_t)k;
	}
	/* an ERROR in place of the RESULT is right: the root failed
	 * before the RESULT's first byte */
	if (got < 32 || blk[7] != 5)
		return 0;
	for (i = 1; i + 4 <= got && i < 32 + 3ull * MID_LEN; i++)
		if (!memcmp(blk + i, "FEPB", 4)) {
			fprintf(stderr, "a header at byte %zu of a RESULT of %llu\n",
				i, 32 + 3ull * MID_LEN);
			return 1;
		}
	return 0;
}

/* The root's allgather fails (rank 1 is lost) while its RESULT to rank 2
 * is half-sent: rank 2 must not find the root's ERROR message inside
 * the RESULT's payload (it would take it for data, or wait for the
 * rest); the end of the stream tells it instead. */
START_TEST(test_tcp_error_mid_result)
{
	/* the root's failure finds its RESULT to rank 2 half-sent, with
	 * room in the socket's buffer, as the timing allows: thrice */
	for (int run = 0; run < 3; run++)
		mid_result_once();
}
END_TEST

static void mid_result_once(void)
{
	int port = fep_test_free_port(), st1 = -1, st2 = -1, ret;
	uint8_t *in = malloc(MID_LEN), *out = malloc(3ull * MID_LEN);
	fep_boot_t *b = NULL;
	pid_t p1, p2;

	ck_assert_int_gt(port, 0);
	ck_assert(in && out);
	setenv("FABEP_LOG", "none", 1);
	if (!(p1 = fork()))
		_exit(mid_fake(port, 1));
	if (!(p2 = fork()))
		_exit(mid_fake(port, 2));
	ret = fep_boot_tcp_create(0, 3, "127.0.0.1", port, 10000, &b);
	ck_assert_int_eq(ret, 0);
	memset(in, 0xAA, MID_LEN);
	ret = fep_boot_allgather(b, in, out, MID_LEN);
	ck_assert_int_eq(ret, -FABEP_ERR_PEER_LOST);
	/* its connections closed: rank 2 reads to their end */
	fep_boot_destroy(b);
	ck_assert_int_eq(waitpid(p1, &st1, 0), p1);
	ck_assert_int_eq(waitpid(p2, &st2, 0), p2);
	ck_assert_msg(WIFEXITED(st2) && WEXITSTATUS(st2) == 0,
		      "rank 2: status %d (1: the ERROR inside the RESULT)", st2);
	ck_assert_msg(WIFEXITED(st1) && WEXITSTATUS(st1) == 0, "rank 1: %d", st1);
	free(in);
	free(out);
}

/* Two processes claim rank 1 of 3: one is refused (-EINVAL), rank 2 never
 * comes, and everyone fails within the timeout, the root with the
 * refusal's code. */
static int rank_duplicate(int rank, int size, void *arg)
{
	fep_boot_t *b = NULL;
	struct capture cap;
	const char *log;
	int ret, claimed = rank == 2 ? 1 : rank;
	int port = root_port_from_env();
	uint64_t t0 = fep_now_ns(), ms;

	fep_log_set_rank(rank);
	if (rank == 0)
		capture_begin(&cap);
	ret = fep_boot_tcp_create(claimed, size, "127.0.0.1", port, 1500, &b);
	ms = (fep_now_ns() - t0) / 1000000;
	FAIL_IF(ms > 1500 + 500, "took %llu ms", (unsigned long long)ms);
	FAIL_IF(b, "bootstrap created");
	if (rank == 0) {
		log = capture_end(&cap);
		/* the refusal's code, not a plain timeout: the missing
		 * rank was most likely the one refused */
		FAIL_IF(ret != -EINVAL, "root got %d", ret);
		FAIL_IF(!strstr(log, "rank 1 has already connected"),
			"duplicate not reported");
		FAIL_IF(!strstr(log, "rank 2 never connected within 1500 ms "
				"(1 of 2 arrived); refused meanwhile: rank 1 has "
				"already connected"),
			"missing rank and refusal not named together");
		return 0;
	}
	/* Exit status tells the parent who got what. */
	return ret == -EINVAL ? 10 : ret == -ETIMEDOUT ? 20 : 30;
}

START_TEST(test_tcp_duplicate)
{
	int status[3];

	ck_assert_int_eq(fep_test_run_ranks_status(3, 15, rank_duplicate, NULL,
						   status), 0);
	ck_assert_int_eq(status[0], 0);
	/* the refused one -EINVAL at once; the accepted one the root's
	 * verdict at the root's timeout (-EINVAL, the refusal's), which it
	 * waits for a little past its own */
	ck_assert_msg(status[1] == 10 && status[2] == 10,
		      "statuses %d %d", status[1], status[2]);
}
END_TEST

/* Rank 1 says the world has 3 ranks, the root 2: rank 1 is refused
 * at once with -FABEP_ERR_MISMATCH, and the root, whose rank 1 never
 * arrives, fails at its timeout with the same code and the reason. */
static int rank_size_mismatch(int rank, int size, void *arg)
{
	fep_boot_t *b = NULL;
	struct capture cap;
	const char *log;
	int ret, port = root_port_from_env();
	uint64_t t0 = fep_now_ns(), ms;

	(void)arg;
	fep_log_set_rank(rank);
	if (rank == 0)
		capture_begin(&cap);
	ret = fep_boot_tcp_create(rank, rank ? size + 1 : size, "127.0.0.1",
				  port, 1500, &b);
	ms = (fep_now_ns() - t0) / 1000000;
	FAIL_IF(b, "bootstrap created");
	FAIL_IF(ret != -FABEP_ERR_MISMATCH, "rank %d got %d", rank, ret);
	if (rank == 1) {
		FAIL_IF(ms > 1000, "rank 1 told after %llu ms", (unsigned long long)ms);
		return 0;
	}
	log = capture_end(&cap);
	FAIL_IF(ms > 1500 + 500, "took %llu ms", (unsigned long long)ms);
	FAIL_IF(!strstr(log, "refused meanwhile: rank 1 says the world has 3 "
			"ranks, but the root's world has 2"),
		"the refusal is not in the timeout's message");
	return 0;
}

START_TEST(test_tcp_size_mismatch)
{
	fep_test_ranks_ok(2, 15, rank_size_mismatch, NULL);
}
END_TEST

/* A root name that does not resolve: tried again until the timeout
 * (it may come later), then -ETIMEDOUT naming the name's error. */
START_TEST(test_tcp_root_unresolved)
{
	fep_boot_t *b = NULL;
	struct capture cap;
	const char *log;
	uint64_t t0 = fep_now_ns(), ms;
	int ret;

	capture_begin(&cap);
	ret = fep_boot_tcp_create(1, 2, "fabep-test.invalid", 29999, 1000, &b);
	log = capture_end(&cap);
	ms = (fep_now_ns() - t0) / 1000000;
	ck_assert_int_eq(ret, -ETIMEDOUT);
	ck_assert_ptr_null(b);
	ck_assert_msg(ms >= 900, "gave up after %llu ms", (unsigned long long)ms);
	ck_assert_msg(strstr(log, "\"fabep-test.invalid\" does not resolve") ||
		      strstr(log, "never answered within 1000 ms"),
		      "log: %s", log);
}
END_TEST

/* More ranks than the bound: refused before anything is allocated. */
START_TEST(test_tcp_too_many_ranks)
{
	fep_boot_t *b = NULL;

	ck_assert_int_eq(fep_boot_tcp_create(1, FEP_BOOT_MAX_RANKS + 1, "127.0.0.1",
					     1, 1000, &b), -EINVAL);
	ck_assert_ptr_null(b);
	ck_assert_int_eq(fep_boot_tcp_create(0, INT_MAX, "127.0.0.1", 1, 1000, &b),
			 -EINVAL);
	ck_assert_ptr_null(b);
}
END_TEST

/* The harness itself: a hung rank is killed and named. */
static int rank_hang(int rank, int size, void *arg)
{
	if (rank == 1)
		pause();
	return rank == 2 ? 3 : 0;
}

START_TEST(test_harness_timeout)
{
	int status[3];

	ck_assert_int_eq(fep_test_run_ranks_status(3, 1, rank_hang, NULL,
						   status), -1);
	ck_assert_int_eq(status[0], 0);
	ck_assert_int_eq(status[1], 128 + SIGKILL);
	ck_assert_int_eq(status[2], 3);
	ck_assert_int_eq(fep_test_run_ranks(3, 1, rank_hang, NULL), -1);
}
END_TEST

/* ---- callback bootstrap ---- */

struct fake_world {
	int rank, size;
	int ret;      /* what the callback returns */
	int misplace; /* put our block in the wrong slot */
	int calls;
};

/* Plays every other rank: rank r's block is bytes (r + 1) * 0x11. */
static int fake_allgather(const void *in, void *out, size_t len, void *ctx)
{
	struct fake_world *w = ctx;
	int r;

	w->calls++;
	if (w->ret)
		return w->ret;
	for (r = 0; r < w->size; r++) {
		if (r == (w->misplace ? (w->rank + 1) % w->size : w->rank))
			memcpy((uint8_t *)out + (size_t)r * len, in, len);
		else
			memset((uint8_t *)out + (size_t)r * len,
			       (r + 1) * 0x11, len);
	}
	return 0;
}

START_TEST(test_callback)
{
	struct fake_world w = { .rank = 2, .size = 4 };
	fep_boot_t *b = (fep_boot_t *)0x1;
	uint8_t in[5], out[20], ref[20];
	int r;

	ck_assert_int_eq(fep_boot_callback_create(0, 1, NULL, NULL, 1000, &b),
			 -EINVAL);
	ck_assert_int_eq(fep_boot_callback_create(4, 4, fake_allgather, &w,
						  1000, &b), -EINVAL);
	ck_assert_int_eq(fep_boot_callback_create(0, 0, fake_allgather, &w,
						  1000, &b), -EINVAL);
	ck_assert_int_eq(fep_boot_callback_create(0, 1, fake_allgather, &w,
						  1000, NULL), -EINVAL);
	ck_assert_ptr_eq(b, (fep_boot_t *)0x1);

	ck_assert_int_eq(fep_boot_callback_create(2, 4, fake_allgather, &w,
						  1000, &b), 0);
	ck_assert_int_eq(b->rank, 2);
	ck_assert_int_eq(b->size, 4);
	memset(in, 0xab, sizeof(in));
	ck_assert_int_eq(fep_boot_allgather(b, in, out, sizeof(in)), 0);
	for (r = 0; r < 4; r++)
		memset(ref + r * 5, r == 2 ? 0xab : (r + 1) * 0x11, 5);
	ck_assert_mem_eq(out, ref, sizeof(ref));
	ck_assert_int_eq(fep_boot_barrier(b), 0);
	ck_assert_int_eq(w.calls, 2);
	ck_assert_int_eq(fep_boot_allgather(b, NULL, out, 5), -EINVAL);
	ck_assert_int_eq(w.calls, 2);

	/* The callback's error comes back, and out stays untouched. */
	memset(out, 0x77, sizeof(out));
	w.ret = -EIO;
	ck_assert_int_eq(fep_boot_allgather(b, in, out, sizeof(in)), -EIO);
	ck_assert_int_eq(fep_boot_barrier(b), -EIO);
	w.ret = 5; /* not a valid code: reported as a peer error */
	ck_assert_int_eq(fep_boot_allgather(b, in, out, sizeof(in)),
			 -FABEP_ERR_PEER);
	w.ret = 0;
	w.misplace = 1;
	ck_assert_int_eq(fep_boot_allgather(b, in, out, sizeof(in)),
			 -FABEP_ERR_PROTOCOL);
	for (r = 0; r < 20; r++)
		ck_assert_uint_eq(out[r], 0x77);
	fep_boot_destroy(b);

	/* One process, one rank. */
	w.rank = 0;
	w.size = 1;
	w.misplace = 0;
	ck_assert_int_eq(fep_boot_callback_create(0, 1, fake_allgather, &w,
						  1000, &b), 0);
	ck_assert_int_eq(fep_boot_allgather(b, in, out, sizeof(in)), 0);
	ck_assert_mem_eq(out, in, sizeof(in));
	ck_assert_int_eq(fep_boot_barrier(b), 0);
	fep_boot_destroy(b);
}
END_TEST

static Suite *bootstrap_suite(void)
{
	Suite *s = suite_create("bootstrap");
	TCase *tc;

	tc = tcase_create("env");
	tcase_add_test(tc, test_env_fabep);
	tcase_add_test(tc, test_env_launchers);
	tcase_add_test(tc, test_env_bad);
	tcase_add_test(tc, test_parse_size);
	tcase_add_test(tc, test_parse_long);
	tcase_add_test(tc, test_parse_hostport);
	tcase_add_test(tc, test_cgroup_cpus);
	tcase_set_timeout(tc, 5);
	suite_add_tcase(s, tc);

	tc = tcase_create("callback");
	tcase_add_test(tc, test_callback);
	tcase_set_timeout(tc, 5);
	suite_add_tcase(s, tc);

	tc = tcase_create("tcp");
	tcase_add_test(tc, test_tcp_args);
	tcase_add_test(tc, test_tcp_root_absent);
	tcase_add_test(tc, test_tcp_ranks_absent);
	tcase_add_loop_test(tc, test_tcp_allgather, 2, 7);
	tcase_add_test(tc, test_tcp_barrier);
	tcase_add_test(tc, test_tcp_len_mismatch);
	tcase_set_timeout(tc, 25);
	suite_add_tcase(s, tc);

	tc = tcase_create("tcp_faults");
	tcase_add_test(tc, test_tcp_rank_killed);
	tcase_add_test(tc, test_tcp_root_killed);
	tcase_add_loop_test(tc, test_tcp_watch_killed, 0, 4);
	tcase_add_test(tc, test_tcp_watch_bye);
	tcase_add_test(tc, test_tcp_intruders);
	tcase_add_test(tc, test_tcp_duplicate);
	tcase_add_test(tc, test_tcp_size_mismatch);
	tcase_add_test(tc, test_tcp_too_many_ranks);
	tcase_add_test(tc, test_tcp_root_unresolved);
	tcase_add_test(tc, test_tcp_wave);
	tcase_add_test(tc, test_tcp_failed_no_bye);
	tcase_add_test(tc, test_tcp_error_mid_result);
	tcase_add_test(tc, test_harness_timeout);
	tcase_set_timeout(tc, 25);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	/* The tests read the log; make sure it is on. */
	setenv("FABEP_LOG", "warn", 1);
	return fep_test_run_suite(bootstrap_suite());
}
