/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * cpus.c - how many CPUs this process may really use: the CPU
 * bandwidth limit of its cgroup (a container's --cpus, a Kubernetes CPU
 * limit, systemd's CPUQuota), which sched_getaffinity does not show; and
 * which physical core a CPU belongs to.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/util.h"

/* A limit in CPUs from quota and period, rounded up; 0 for none. */
static int quota_cpus(long long quota, long long period)
{
	long long n;

	if (quota <= 0 || period <= 0)
		return 0;
	n = (quota + period - 1) / period;
	return n > 65536 ? 65536 : (int)n;
}

/* The limit set in one cgroup directory: cgroup v2's cpu.max
 * ("max 100000" or "<quota> <period>"), else v1's cpu.cfs_quota_us
 * (-1 for none) and cpu.cfs_period_us; 0 where none is set or readable. */
static int dir_limit(const char *dir)
{
	char path[4096 + 32], word[32];
	long long quota = -1, period = 0;
	FILE *f;
	int n;

	snprintf(path, sizeof(path), "%s/cpu.max", dir);
	if ((f = fopen(path, "r"))) {
		n = fscanf(f, "%31s %lld", word, &period);
		fclose(f);
		if (n != 2 || !strcmp(word, "max"))
			return 0;
		quota = strtoll(word, NULL, 10);
		return quota_cpus(quota, period);
	}
	snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", dir);
	if (!(f = fopen(path, "r")))
		return 0;
	n = fscanf(f, "%lld", &quota);
	fclose(f);
	if (n != 1)
		return 0;
	snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", dir);
	if (!(f = fopen(path, "r")))
		return 0;
	n = fscanf(f, "%lld", &period);
	fclose(f);
	return n == 1 ? quota_cpus(quota, period) : 0;
}

/* The tightest limit of mount/cg and of every directory above it up to
 * mount itself.  A directory that is not there is skipped: in a
 * container without its own cgroup namespace /proc/self/cgroup names
 * the host's path, while the container sees its own cgroup at the
 * mount point. */
static int path_limit(const char *mount, const char *cg)
{
	char dir[4096];
	struct stat st;
	size_t len;
	int best = 0, lim;
	char *slash;

	if (snprintf(dir, sizeof(dir), "%s%s", mount, cg) >= (int)sizeof(dir))
		return 0;
	len = strlen(mount);
	for (;;) {
		if (!stat(dir, &st) && S_ISDIR(st.st_mode)) {
			lim = dir_limit(dir);
			if (lim && (!best || lim < best))
				best = lim;
		}
		if (strlen(dir) <= len)
			break;
		slash = strrchr(dir + len, '/');
		if (!slash)
			break;
		*slash = '\0';
	}
	return best;
}

int fep_cgroup_cpus_at(const char *root, const char *self)
{
	char line[4096 + 128], mount[4096 + 64];
	int best = 0, lim;
	FILE *f;

	if (!root || !self || !(f = fopen(self, "r")))
		return 0;
	/* lines of "<hierarchy>:<controllers>:<path>"; v2's is "0::<path>" */
	while (fgets(line, sizeof(line), f)) {
		char *ctl = strchr(line, ':'), *path, *nl, *c;
		bool cpu = false;

		if (!ctl)
			continue;
		path = strchr(++ctl, ':');
		if (!path)
			continue;
		*path++ = '\0';
		if ((nl = strchr(path, '\n')))
			*nl = '\0';
		if (path[0] != '/')
			continue;
		if (!*ctl) {
			/* v2: the unified hierarchy, under "unified" where
			 * v1's hierarchies hold the mount point (hybrid) */
			snprintf(mount, sizeof(mount), "%s/unified", root);
			lim = path_limit(mount, path);
			if (!lim)
				lim = path_limit(root, path);
		} else {
			/* v1: the hierarchy whose controllers include cpu,
			 * mounted under its list ("cpu,cpuacct") or "cpu" */
			char list[512], *save = NULL;

			snprintf(list, sizeof(list), "%s", ctl);
			for (c = strtok_r(list, ",", &save); c;
			     c = strtok_r(NULL, ",", &save))
				cpu = cpu || !strcmp(c, "cpu");
			if (!cpu)
				continue;
			snprintf(mount, sizeof(mount), "%s/%s", root, ctl);
			lim = path_limit(mount, path);
			if (!lim) {
				snprintf(mount, sizeof(mount), "%s/cpu", root);
				lim = path_limit(mount, path);
			}
		}
		if (lim && (!best || lim < best))
			best = lim;
	}
	fclose(f);
	return best;
}

int fep_cpu_core_key(int cpu)
{
	char path[96];
	int core = -1, pkg = 0;
	FILE *f;

	snprintf(path, sizeof(path),
		 "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
	if ((f = fopen(path, "r"))) {
		if (fscanf(f, "%d", &core) != 1)
			core = -1;
		fclose(f);
	}
	snprintf(path, sizeof(path),
		 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
	if ((f = fopen(path, "r"))) {
		if (fscanf(f, "%d", &pkg) != 1)
			pkg = 0;
		fclose(f);
	}
	return core < 0 ? -1 - cpu : pkg * 65536 + core;
}

int fep_cgroup_cpus(void)
{
	return fep_cgroup_cpus_at("/sys/fs/cgroup", "/proc/self/cgroup");
}
