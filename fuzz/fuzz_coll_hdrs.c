/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz_coll_hdrs.c - the slot headers peers write in an allreduce
 * (src/coll/allreduce.c: struct fep_ar_hdr: call number, rows, cols,
 * status, op), as fep_ar_verdict turns them into the verdict every rank
 * returns after phase 1; and the same bytes as the views of the
 * log-step path (struct fep_ar_rdhdr), as fep_ar_rd_merge merges them
 * and fep_ar_rd_verdict judges the result.
 *
 * Input: world size, rank, slot stride, this rank's header, then the
 * slots of all ranks.
 */
#include "../src/coll/allreduce.c"

#include "fuzz.h"

#define FUZZ_MAX_SIZE 8

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
	struct fuzz_in in = { data, n };
	struct fabep_allreduce h;
	struct fabep_comm comm;
	struct fep_ar_hdr mine;
	uint8_t *slots;
	const uint8_t *p;
	size_t got, len;
	int ret;

	memset(&h, 0, sizeof(h));
	memset(&comm, 0, sizeof(comm));
	comm.size = 1 + fuzz_u8(&in) % FUZZ_MAX_SIZE;
	comm.rank = fuzz_u8(&in) % comm.size;
	h.comm = &comm;
	h.lay.blk1 = FEP_AR_HDR + 64 * (fuzz_u8(&in) % 4);
	memset(&mine, 0, sizeof(mine));
	p = fuzz_bytes(&in, sizeof(mine), &got);
	memcpy(&mine, p, got);
	/* this rank's own status is its own, never a wire value */
	if (mine.status > 0)
		mine.status = -mine.status;
	len = (size_t)comm.size * h.lay.blk1;
	slots = malloc(len);
	if (!slots)
		abort();
	memset(slots, 0, len);
	p = fuzz_bytes(&in, len, &got);
	memcpy(slots, p, got);

	ret = fep_ar_verdict(&h, &mine, slots, "fuzz allreduce");
	/* the verdict is what fabep_allreduce returns: 0 or an error */
	FUZZ_CHECK(ret <= 0);
	FUZZ_CHECK(ret != 0 || !h.broken);

	/* the log-step path: this rank's view, then the same slots as the
	 * views of the peers of its rounds, merged one by one */
	{
		struct fep_ar_state c;
		struct fep_ar_rdhdr view;
		bool proto = false;
		int r;

		memset(&c, 0, sizeof(c));
		c.h = &h;
		c.name = "fuzz allreduce";
		memset(&view, 0, sizeof(view));
		view.seq = mine.seq;
		view.rows = mine.rows;
		view.cols = mine.cols;
		view.op = mine.op;
		view.ref = comm.rank;
		view.err = mine.status ? comm.rank : -1;
		view.status = mine.status;
		view.diff = -1;
		for (r = 0; r < comm.size; r++) {
			const struct fep_ar_rdhdr *b = (const struct fep_ar_rdhdr *)(
				slots + (size_t)r * h.lay.blk1);

			if (r == comm.rank)
				continue;
			fep_ar_rd_merge(&view, b, comm.size, comm.rank, mine.seq, r,
					&proto, "fuzz allreduce");
			/* a view only ever names ranks there are */
			FUZZ_CHECK(view.ref >= 0 && view.ref < comm.size);
			FUZZ_CHECK(view.err >= -1 && view.err < comm.size);
			FUZZ_CHECK(view.diff >= -1 && view.diff < comm.size);
			/* a peer's error is a bounded negative code */
			FUZZ_CHECK(view.err < 0 || view.err == comm.rank ||
				   (view.status < 0 && view.status >= -100000));
			FUZZ_CHECK(view.ref <= comm.rank);
		}
		ret = fep_ar_rd_verdict(&c, &view);
		FUZZ_CHECK(ret <= 0);
		FUZZ_CHECK(!proto || ret != 0);
	}
	free(slots);
	return 0;
}
