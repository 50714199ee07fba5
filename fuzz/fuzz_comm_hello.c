/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz_comm_hello.c - what every rank sends at communicator creation
 * (struct fep_hello: host, signal, heap size, channels, pid and
 * PID namespace, /dev/shm's identity, CPU set and cgroup CPU limit, a
 * refusal's status), as
 * fep_comm_check_hellos (src/core/comm.c) compares and reports it.  The
 * bytes come from the bootstrap, so from a peer: nothing in them (strings
 * included) may be trusted.
 *
 * Input: world size, this rank, then the hellos back to back.
 */
#include "../src/core/comm.c"

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
	struct fabep_comm comm;
	struct fep_hello *h;
	const uint8_t *p;
	size_t got;
	int ret;

	memset(&comm, 0, sizeof(comm));
	comm.size = 1 + fuzz_u8(&in) % FUZZ_MAX_SIZE;
	comm.rank = fuzz_u8(&in) % comm.size;
	/* exactly size hellos, so ASan sees any read past them */
	h = malloc((size_t)comm.size * sizeof(*h));
	comm.peer_pid = calloc((size_t)comm.size, sizeof(*comm.peer_pid));
	if (!h || !comm.peer_pid)
		abort();
	memset(h, 0, (size_t)comm.size * sizeof(*h));
	p = fuzz_bytes(&in, (size_t)comm.size * sizeof(*h), &got);
	memcpy(h, p, got);
	ret = fep_comm_check_hellos(&comm, h);
	FUZZ_CHECK(ret == 0 || ret == -FABEP_ERR_MISMATCH ||
		   ret == -FABEP_ERR_PEER);
	/* a rank that refused its configuration fails the others, and
	 * nothing else does so */
	{
		int refused = 0;

		for (int r = 0; r < comm.size; r++)
			refused |= h[r].status != 0;
		FUZZ_CHECK(refused == (ret == -FABEP_ERR_PEER));
	}
	if (!ret) {
		FUZZ_CHECK(comm.local_size >= 1 && comm.local_size <= comm.size);
		FUZZ_CHECK(comm.local_rank >= 0 &&
			   comm.local_rank < comm.local_size);
		/* the ranks sharing this one's CPUs are ranks of this
		 * host, itself among them, and have a CPU at least */
		FUZZ_CHECK(comm.cpu_share >= 1 &&
			   comm.cpu_share <= comm.local_size);
		FUZZ_CHECK(comm.cpu_avail >= 1 &&
			   comm.cpu_avail <= CPU_SETSIZE);
		/* a rank beyond shm's reach is one of this host that sees
		 * another /dev/shm or PID namespace */
		if (comm.shm_apart >= 0) {
			const struct fep_hello *a = &h[comm.shm_apart];

			FUZZ_CHECK(comm.shm_apart < comm.size);
			FUZZ_CHECK(!strcmp(a->host, h[comm.rank].host));
			FUZZ_CHECK(a->shm_dev != h[comm.rank].shm_dev ||
				   a->shm_ino != h[comm.rank].shm_ino ||
				   a->pidns != h[comm.rank].pidns);
			FUZZ_CHECK(comm.shm_apart_why != NULL);
		}
	}
	/* a pid to watch only for another rank of this host and PID
	 * namespace (never for this rank, never from a zero namespace) */
	FUZZ_CHECK(comm.peer_pid[comm.rank] == 0);
	for (int r = 0; r < comm.size; r++)
		FUZZ_CHECK(comm.peer_pid[r] == 0 ||
			   (comm.peer_pid[r] > 0 && h[r].pidns &&
			    h[r].pidns == h[comm.rank].pidns &&
			    !strcmp(h[r].host, h[comm.rank].host)));
	free(comm.peer_pid);
	free(h);
	return 0;
}
