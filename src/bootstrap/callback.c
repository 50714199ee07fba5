/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * callback.c - bootstrap over an allgather the caller supplies (servers
 * with their own control plane).  Barrier = allgather of one byte.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "bootstrap/bootstrap.h"

struct boot_cb {
	fep_boot_t base;
	fabep_allgather_fn fn;
	void *ctx;
};

static int boot_cb_allgather(fep_boot_t *b, const void *in, void *out,
			     size_t len)
{
	struct boot_cb *c = fep_container_of(b, struct boot_cb, base);
	size_t total;
	uint8_t *tmp;
	int ret;

	if (len && (!in || !out)) {
		fep_err("bootstrap allgather: NULL %s buffer with length %zu",
			in ? "output" : "input", len);
		return -EINVAL;
	}
	if (len > SIZE_MAX / (size_t)b->size) {
		fep_err("bootstrap allgather: %zu bytes times %d ranks "
			"overflows", len, b->size);
		return -EINVAL;
	}
	total = len * (size_t)b->size;
	/* The caller's function writes into a buffer of ours, so out is
	 * written only when it succeeded. */
	tmp = malloc(total ? total : 1);
	if (!tmp) {
		fep_err("bootstrap allgather: out of memory for %zu bytes",
			total);
		return -ENOMEM;
	}
	ret = c->fn(in, tmp, len, c->ctx);
	if (ret > 0) {
		fep_err("bootstrap allgather: the caller's allgather function "
			"returned %d, which is not 0 or a negative error code",
			ret);
		ret = -FABEP_ERR_PEER;
		goto out;
	}
	if (ret) {
		fep_err("bootstrap allgather: the caller's allgather function "
			"failed: %d (%s)", ret, fabep_strerror(ret));
		goto out;
	}
	if (len && memcmp(tmp + (size_t)b->rank * len, in, len)) {
		fep_err("bootstrap allgather: the caller's allgather function "
			"did not put this rank's block at position %d of %d "
			"(wrong rank order, or ranks passed different data)",
			b->rank, b->size);
		ret = -FABEP_ERR_PROTOCOL;
		goto out;
	}
	if (total)
		memcpy(out, tmp, total);
out:
	free(tmp);
	return ret;
}

static int boot_cb_barrier(fep_boot_t *b)
{
	uint8_t one = 1;
	uint8_t *all = malloc((size_t)b->size);
	int ret;

	if (!all) {
		fep_err("bootstrap barrier: out of memory");
		return -ENOMEM;
	}
	ret = boot_cb_allgather(b, &one, all, 1);
	free(all);
	return ret;
}

static void boot_cb_destroy(fep_boot_t *b)
{
	free(fep_container_of(b, struct boot_cb, base));
}

int fep_boot_check_world(int rank, int size, fep_boot_t **out)
{
	if (!out) {
		fep_err("bootstrap: NULL output handle");
		return -EINVAL;
	}
	if (size < 1 || size > FEP_BOOT_MAX_RANKS || rank < 0 || rank >= size) {
		fep_err("bootstrap: rank %d of a world of %d ranks is not "
			"valid (need 0 <= rank < size <= %d)", rank, size,
			FEP_BOOT_MAX_RANKS);
		return -EINVAL;
	}
	return 0;
}

int fep_boot_callback_create(int rank, int size, fabep_allgather_fn fn,
			     void *ctx, int timeout_ms, fep_boot_t **out)
{
	struct boot_cb *c;
	int ret = fep_boot_check_world(rank, size, out);

	if (ret)
		return ret;
	if (!fn) {
		fep_err("bootstrap: NULL allgather function");
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		fep_err("bootstrap: out of memory");
		return -ENOMEM;
	}
	c->fn = fn;
	c->ctx = ctx;
	c->base.rank = rank;
	c->base.size = size;
	c->base.timeout_ms = timeout_ms;
	c->base.allgather = boot_cb_allgather;
	c->base.barrier = boot_cb_barrier;
	c->base.destroy = boot_cb_destroy;
	*out = &c->base;
	return 0;
}
