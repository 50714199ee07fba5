/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fuzz_boot_msg.c - the TCP rendezvous messages (src/bootstrap/tcp.c):
 * the byte stream a peer sends, fed through a socket pair to the real
 * receive path (header decode and checks, hello, welcome, gather and
 * result payloads, error and reject messages).
 *
 * Input: mode, world size, rank, block length, then
 *   mode even (a rank talking to the root): the root's stream (welcome,
 *   then results);
 *   mode odd (the root): per other rank a 16-bit length and its stream
 *   (hello, then gather messages).
 * Each stream is written into the peer end of a socket pair whose writing
 * side is then shut down, so the code under test sees exactly those bytes
 * and then the peer closing: nothing waits for a timeout.
 */
#include "../src/bootstrap/tcp.c"

#include <sys/socket.h>

#include "fuzz.h"

#define FUZZ_MAX_SIZE 5
#define FUZZ_CALLS 3

static int fuzz_peer_fds[FUZZ_MAX_SIZE];
static int fuzz_npeer;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

static struct boot_tcp *fuzz_tcp(int rank, int size)
{
	struct boot_tcp *t = boot_tcp_new(rank, size, 2000);

	if (!t)
		abort();
	t->base.watch = NULL;
	snprintf(t->host, sizeof(t->host), "fuzz");
	t->port = 1;
	return t;
}

/* A socket pair: returns the end for the code under test, which reads
 * the len bytes at p and then the end of the stream.  The other end stays
 * open (so the code's own sends succeed) until fuzz_close_peers(). */
static int fuzz_pair(const uint8_t *p, size_t len)
{
	int sv[2];
	ssize_t n;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
		       sv))
		abort();
	while (len) {
		n = send(sv[1], p, len, MSG_NOSIGNAL);
		if (n <= 0)
			break; /* socket buffer full: the rest is cut off */
		p += n;
		len -= (size_t)n;
	}
	shutdown(sv[1], SHUT_WR);
	fuzz_peer_fds[fuzz_npeer++] = sv[1];
	return sv[0];
}

static void fuzz_close_peers(void)
{
	while (fuzz_npeer)
		close(fuzz_peer_fds[--fuzz_npeer]);
}

/* The root's side: hellos, then allgathers of blocks of len bytes. */
static void fuzz_root(struct fuzz_in *in, int size, size_t len)
{
	struct boot_tcp *t = fuzz_tcp(0, size);
	uint8_t block[256], *out;
	int r, c, all = 1;

	for (r = 1; r < size; r++) {
		struct boot_pending p;
		const uint8_t *s;
		size_t got;

		s = fuzz_bytes(in, fuzz_u16(in), &got);
		memset(&p, 0, sizeof(p));
		p.fd = fuzz_pair(s, got);
		snprintf(p.name, sizeof(p.name), "fuzz peer %d", r);
		/* All bytes are there already: one read settles it (the
		 * header completes, or the stream ends first). */
		boot_pending_read(t, &p);
		if (p.fd >= 0) {
			FUZZ_CHECK(p.got < BOOT_HDR_LEN);
			sock_close(&p.fd);
		}
	}
	for (r = 1; r < size; r++)
		if (t->fds[r] < 0)
			all = 0;
	memset(block, 0xa5, sizeof(block));
	out = malloc((size_t)size * len + 1);
	if (!out)
		abort();
	for (c = 0; all && c < FUZZ_CALLS; c++) {
		int ret = fep_boot_allgather(&t->base, block, out, len);

		FUZZ_CHECK(ret <= 0);
		if (ret)
			break;
		FUZZ_CHECK(!len || !memcmp(out, block, len));
	}
	free(out);
	fep_boot_destroy(&t->base);
}

/* A rank's side: the welcome, then allgathers of blocks of len bytes. */
static void fuzz_rank(struct fuzz_in *in, int rank, int size, size_t len)
{
	struct boot_tcp *t = fuzz_tcp(rank, size);
	struct boot_xfer x;
	uint8_t block[256], *out;
	int c, ret, failed;

	t->fds[0] = fuzz_pair(in->p, in->n);
	memset(&x, 0, sizeof(x));
	x.fd = t->fds[0];
	x.peer = 0;
	ret = xfer_run(t, &x, 1, welcome_check, NULL,
		       deadline_after(t->base.timeout_ms), "rendezvous",
		       &failed);
	FUZZ_CHECK(ret <= 0);
	memset(block, 0x5a, sizeof(block));
	out = malloc((size_t)size * len + 1);
	if (!out)
		abort();
	for (c = 0; !ret && c < FUZZ_CALLS; c++) {
		ret = fep_boot_allgather(&t->base, block, out, len);
		FUZZ_CHECK(ret <= 0);
	}
	free(out);
	fep_boot_destroy(&t->base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
	struct fuzz_in in = { data, n };
	int mode = fuzz_u8(&in);
	int size = 2 + fuzz_u8(&in) % (FUZZ_MAX_SIZE - 1);
	int rank = 1 + fuzz_u8(&in) % (size - 1);
	size_t len = fuzz_u8(&in);

	if (mode & 1)
		fuzz_root(&in, size, len);
	else
		fuzz_rank(&in, rank, size, len);
	fuzz_close_peers();
	return 0;
}
