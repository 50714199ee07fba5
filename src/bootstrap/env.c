/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * env.c - where this process sits in the world, from the environment:
 * FABEP_RANK / FABEP_WORLD_SIZE / FABEP_ROOT first, else what mpirun
 * (OMPI_COMM_WORLD_*), a PMI launcher (PMI_RANK / PMI_SIZE) or Slurm
 * (SLURM_PROCID / SLURM_NTASKS) set.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "bootstrap/bootstrap.h"

/* One launcher's names for rank, size, local rank and local size (NULL:
 * this launcher has no such variable). */
struct boot_env_source {
	const char *source;
	const char *rank;
	const char *size;
	const char *local_rank;
	const char *local_size;
};

static const struct boot_env_source boot_env_sources[] = {
	{ "FABEP", "FABEP_RANK", "FABEP_WORLD_SIZE",
	  "FABEP_LOCAL_RANK", "FABEP_LOCAL_SIZE" },
	{ "OMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE" },
	{ "PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS" },
	{ "SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL },
};

static int boot_env_isset(const char *name)
{
	const char *s = name ? getenv(name) : NULL;

	return s && *s;
}

/* Read a pair (index, count) of variables, either of which may be absent
 * as a whole (both unset: 0), never one without the other.  Returns 1 when
 * both were read, 0 when neither is set, -EINVAL (logged) otherwise. */
static int boot_env_pair(const char *iname, const char *nname, int *idx,
			 int *cnt)
{
	long i = -1, n = -1;
	int ri, rn;

	rn = nname ? fep_env_long(nname, 1, FEP_BOOT_MAX_RANKS, &n) : 0;
	if (rn < 0)
		return rn;
	ri = iname ? fep_env_long(iname, 0, FEP_BOOT_MAX_RANKS - 1, &i) : 0;
	if (ri < 0)
		return ri;
	if (!ri && !rn)
		return 0;
	if (ri && !rn && nname) {
		fep_err("%s is set but %s is not; set both or neither", iname,
			nname);
		return -EINVAL;
	}
	if (rn && !ri && iname) {
		fep_err("%s is set but %s is not; set both or neither", nname,
			iname);
		return -EINVAL;
	}
	if (ri && rn && i >= n) {
		fep_err("%s=%ld is not below %s=%ld", iname, i, nname, n);
		return -EINVAL;
	}
	*idx = ri ? (int)i : -1;
	*cnt = rn ? (int)n : -1;
	return 1;
}

int fep_boot_env_read(struct fep_boot_env *out)
{
	struct fep_boot_env env;
	const struct boot_env_source *src = NULL;
	const char *root;
	size_t i;
	int ret;

	if (!out) {
		fep_err("fep_boot_env_read: NULL output");
		return -EINVAL;
	}
	memset(&env, 0, sizeof(env));
	env.rank = env.size = env.local_rank = env.local_size = -1;

	/* The first launcher with any of its rank/size variables set wins. */
	for (i = 0; i < FEP_ARRAY_SIZE(boot_env_sources); i++) {
		const struct boot_env_source *s = &boot_env_sources[i];

		if (boot_env_isset(s->rank) || boot_env_isset(s->size)) {
			src = s;
			break;
		}
	}
	if (src) {
		ret = boot_env_pair(src->rank, src->size, &env.rank, &env.size);
		if (ret < 0)
			return ret;
		ret = boot_env_pair(src->local_rank, src->local_size,
				    &env.local_rank, &env.local_size);
		if (ret < 0) {
			env.local_status = ret;
		} else if (env.local_size > env.size) {
			fep_err("%s=%d is larger than %s=%d", src->local_size,
				env.local_size, src->size, env.size);
			env.local_status = -EINVAL;
		} else if (env.local_rank >= env.size) {
			fep_err("%s=%d is not below %s=%d", src->local_rank,
				env.local_rank, src->size, env.size);
			env.local_status = -EINVAL;
		}
		if (env.local_status)
			env.local_rank = env.local_size = -1;
		env.source = src->source;
	}

	if (fep_env_str("FABEP_ROOT", &root)) {
		if (fep_parse_hostport(root, env.root_host,
				       sizeof(env.root_host), &env.root_port)) {
			fep_err("FABEP_ROOT=\"%s\" is not host:port (an IPv4 "
				"address, [IPv6] or a name, and a port in "
				"1..65535)", root);
			return -EINVAL;
		}
	} else if (env.size > 1) {
		fep_err("%s=%d but FABEP_ROOT is not set: a world of more than "
			"one rank needs FABEP_ROOT=host:port of rank 0's "
			"rendezvous", src->size, env.size);
		return -EINVAL;
	}

	*out = env;
	return 0;
}
