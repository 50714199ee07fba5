/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz_env.c - everything fabep reads from the environment: the value
 * parsers of src/util/env.c (fep_parse_long, fep_parse_size,
 * fep_parse_hostport), where this process sits (fep_boot_env_read: FABEP_*,
 * OMPI_*, PMI_*, SLURM_*), the communicator's FABEP_* settings
 * (fep_attr_from_env in src/core/comm.c), the allreduce threshold, the
 * pool's FABEP_NUMA_NODE and FABEP_ISA's parser.
 *
 * Input: lines; each line's first byte picks a variable, the rest is its
 * value (NULs cut it short).  A parser is also run on every value itself.
 */
#include "../src/core/comm.c"

#include <limits.h>

#include "coll/coll.h"
#include "fuzz.h"

static const char *const fuzz_vars[] = {
	"FABEP_RANK", "FABEP_WORLD_SIZE", "FABEP_LOCAL_RANK", "FABEP_LOCAL_SIZE",
	"FABEP_ROOT",
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
	"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
	"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
	"FABEP_PROVIDER", "FABEP_DOMAIN", "FABEP_SIGNAL", "FABEP_TIMEOUT_MS",
	"FABEP_HEAP_SIZE", "FABEP_THREADS", "FABEP_NUMA_NODE",
	"FABEP_AR_ONESTAGE_MAX", "FABEP_AR_HALVING_MAX",
	"FABEP_RENDEZVOUS_TIMEOUT_MS",
};
#define FUZZ_NVARS ((int)(sizeof(fuzz_vars) / sizeof(fuzz_vars[0])))

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	int i;

	fuzz_quiet();
	for (i = 0; i < FUZZ_NVARS; i++)
		unsetenv(fuzz_vars[i]);
	return 0;
}

/* The parsers on one value, with what each promises on success. */
static void fuzz_parse(const char *s)
{
	char host[256];
	long v;
	size_t sz;
	int port = -1, ret;
	fabep_signal_t sig;
	fabep_isa_t isa;

	ret = fep_parse_long(s, -1000, 1000, &v);
	FUZZ_CHECK(ret == 0 || ret == -EINVAL || ret == -ERANGE);
	FUZZ_CHECK(ret || (v >= -1000 && v <= 1000));
	ret = fep_parse_long(s, LONG_MIN, LONG_MAX, &v);
	FUZZ_CHECK(ret == 0 || ret == -EINVAL || ret == -ERANGE);
	ret = fep_parse_size(s, &sz);
	FUZZ_CHECK(ret == 0 || ret == -EINVAL || ret == -ERANGE);
	memset(host, 0x7f, sizeof(host));
	ret = fep_parse_hostport(s, host, 16, &port);
	FUZZ_CHECK(ret == 0 || ret == -EINVAL);
	FUZZ_CHECK(ret || (port >= 1 && port <= 65535 && *host &&
			   strlen(host) < 16));
	FUZZ_CHECK(host[16] == 0x7f); /* never writes past hostlen */
	ret = fabep_signal_parse(s, &sig);
	FUZZ_CHECK(ret || (sig >= FABEP_SIGNAL_AUTO && sig <= FABEP_SIGNAL_CMA));
	ret = fep_k_isa_parse(s, &isa);
	FUZZ_CHECK(ret <= 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
	struct fuzz_in in = { data, n };
	struct fep_boot_env env;
	fabep_comm_attr_t a;
	size_t os_max, os_sum, hv_max, hv_sum;
	const char *hv;
	int i, ret;

	while (in.n) {
		int var = fuzz_u8(&in) % FUZZ_NVARS;
		char *val = fuzz_line(&in);

		fuzz_parse(val);
		setenv(fuzz_vars[var], val, 1);
		free(val);
	}

	ret = fep_boot_env_read(&env);
	FUZZ_CHECK(ret == 0 || ret == -EINVAL);
	if (!ret) {
		FUZZ_CHECK(env.size == -1 || env.size >= 1);
		FUZZ_CHECK(env.rank == -1 || (env.rank >= 0 &&
					      (env.size < 0 || env.rank < env.size)));
		FUZZ_CHECK(env.local_rank == -1 || env.local_rank >= 0);
		FUZZ_CHECK(env.local_size == -1 ||
			   (env.local_size >= 1 && env.local_size <= env.size));
		FUZZ_CHECK(env.root_port == 0 ||
			   (env.root_port >= 1 && env.root_port <= 65535 &&
			    memchr(env.root_host, '\0', sizeof(env.root_host))));
		FUZZ_CHECK(env.size <= 1 || env.root_port);
	}

	fabep_comm_attr_init(&a);
	ret = fep_attr_from_env(&a);
	FUZZ_CHECK(ret <= 0);
	if (!ret) {
		FUZZ_CHECK(a.timeout_ms >= 1 && a.timeout_ms <= 86400000);
		FUZZ_CHECK(a.rendezvous_timeout_ms == -1 ||
			   (a.rendezvous_timeout_ms >= 1 &&
			    a.rendezvous_timeout_ms <= 86400000));
		FUZZ_CHECK(a.heap_size >= (1ul << 16) && a.heap_size <= (1ul << 40));
		FUZZ_CHECK(a.threads >= 0 && a.threads <= 1024);
		FUZZ_CHECK(a.numa_node >= -1 && a.numa_node <= 4095);
		FUZZ_CHECK(a.signal >= FABEP_SIGNAL_AUTO &&
			   a.signal <= FABEP_SIGNAL_CMA);
	}

	ret = fep_ar_onestage_env(2, 16, &os_max, &os_sum);
	FUZZ_CHECK(ret <= 0);
	FUZZ_CHECK(ret || (os_max <= ((size_t)1 << 40) && os_sum == os_max));
	ret = fep_ar_onestage_env(4, 2, &os_max, &os_sum);
	FUZZ_CHECK(ret <= 0);
	FUZZ_CHECK(ret || (os_sum >= os_max && os_sum <= ((size_t)1 << 40)));
	/* set, one limit for both; unset, the plain sum's is no smaller */
	ret = fep_ar_halving_env(2, 16, &hv_max, &hv_sum);
	hv = getenv("FABEP_AR_HALVING_MAX");
	FUZZ_CHECK(ret <= 0);
	FUZZ_CHECK(ret || (hv_max <= ((size_t)1 << 40) && hv_sum <= ((size_t)1 << 40) &&
			   (hv && *hv ? hv_sum == hv_max : hv_sum >= hv_max)));
	ret = fep_pool_default_node(-1);
	FUZZ_CHECK(ret >= -EINVAL);

	for (i = 0; i < FUZZ_NVARS; i++)
		unsetenv(fuzz_vars[i]);
	return 0;
}
