/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/* error.c - fabep_strerror, fabep_version. */
#include "config.h"

#include <limits.h>
#include <string.h>
#include <rdma/fi_errno.h>

#include "util/util.h"

FEP_EXPORT const char *fabep_strerror(int err)
{
	static __thread char buf[128];

	if (err == INT_MIN)
		return "unknown error"; /* -INT_MIN overflows */
	if (err < 0)
		err = -err;
	switch (err) {
	case 0: return "success";
	case FABEP_ERR_MISMATCH: return "configuration differs between ranks";
	case FABEP_ERR_PEER: return "a peer rank reported an error";
	case FABEP_ERR_PEER_LOST: return "a peer rank was lost (died or disconnected)";
	case FABEP_ERR_PROTOCOL: return "malformed message or count from a peer";
	case FABEP_ERR_NO_PROVIDER: return "no libfabric provider fits the request";
	case FABEP_ERR_NO_SIGNAL: return "signal strategy not supported by the provider";
	case FABEP_ERR_HEAP_FULL: return "symmetric heap exhausted";
	case FABEP_ERR_BUSY: return "all buffer sets are in use";
	default: break;
	}
	if (err >= FI_ERRNO_OFFSET && err < FI_ERRNO_MAX)
		return fi_strerror(err);
	if (err < FI_ERRNO_OFFSET) {
		/* errno values: strerror_r (GNU) */
		const char *s = strerror_r(err, buf, sizeof(buf));
		return s;
	}
	return "unknown error";
}

FEP_EXPORT const char *fabep_version(void)
{
	return PACKAGE_VERSION;
}

struct fep_fault fep_test_fault;

int fep_fault_hit(const char *step)
{
	unsigned n;

	if (strcmp(step, fep_test_fault.step))
		return 0;
	n = __atomic_add_fetch(&fep_test_fault.seen, 1, __ATOMIC_RELAXED);
	if (fep_test_fault.nth && n != fep_test_fault.nth)
		return 0;
	__atomic_add_fetch(&fep_test_fault.hits, 1, __ATOMIC_RELAXED);
	fep_dbg("injected fault: %s call %u fails with %d", step, n,
		fep_test_fault.code);
	return 1;
}
