/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * tcp.c - the TCP rendezvous: rank 0 listens on FABEP_ROOT, every other
 * rank connects to it, and collectives go through rank 0 (a star:
 * allgather = every rank sends its block to the root, the root sends the
 * concatenation back to everyone; barrier = allgather of one byte).
 *
 * Every message starts with a fixed header (magic, version, type, sender
 * rank, world size, sequence number, payload length, all big-endian)
 * that the receiver checks before it reads a payload byte.  All sockets
 * are non-blocking and every wait is a poll() bounded by the call's
 * deadline, so no call blocks longer than timeout_ms (the rendezvous:
 * longer than its own limit, which may be none).  Once a call fails
 * mid-exchange the byte streams are out of step, so the bootstrap is
 * marked broken and every later call fails with the same code.
 *
 * Between collectives the connections stay open and watch the ranks
 * (boot_tcp_watch, which the fabric's waits call): a rank whose process
 * ends closes its connection, the root sees that and tells every other
 * rank; a rank sees the root's own end the same way.  A rank that
 * destroys its bootstrap says goodbye first, so a normal end is not a
 * loss.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "util/util.h"
#include "bootstrap/bootstrap.h"

#define BOOT_MAGIC 0x46455042u /* "FEPB" */
#define BOOT_VERSION 1u
#define BOOT_HDR_LEN 32
#define BOOT_MAX_TEXT 256
#define BOOT_MAX_PENDING 64 /* strangers the root keeps beside the ranks */
/* A connected rank waits this much past its timeout for the root's
 * verdict, which comes at the root's own timeout and says why (who is
 * missing, whose hello was refused): without it, ranks that started
 * with the root would time out at the same moment and say only that. */
#define BOOT_VERDICT_GRACE_MS 500

enum boot_msg_type {
	BOOT_MSG_HELLO = 1,   /* rank -> root: who I am */
	BOOT_MSG_WELCOME,     /* root -> rank: the world is complete */
	BOOT_MSG_REJECT,      /* root -> rank: your hello is refused (+ err) */
	BOOT_MSG_GATHER,      /* rank -> root: my block */
	BOOT_MSG_RESULT,      /* root -> rank: all blocks, rank order */
	BOOT_MSG_ERROR,       /* either way: the collective failed (+ err) */
	BOOT_MSG_BYE,         /* either way: this end is being destroyed */
};

struct boot_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	int32_t rank; /* sender */
	int32_t size;
	uint64_t seq;
	uint64_t len; /* payload bytes after the header */
};

/* Payload of REJECT and ERROR: a code, the rank it concerns (-1: none)
 * and a NUL-terminated text. */
struct boot_err {
	int32_t code;
	int32_t culprit;
	char text[BOOT_MAX_TEXT];
};
#define BOOT_ERR_LEN (8 + BOOT_MAX_TEXT)

struct boot_tcp {
	fep_boot_t base;
	char host[256];
	int port;
	uint64_t seq;     /* collectives completed */
	int broken;       /* sticky error after a failed exchange */
	int *fds;         /* root: fds[r] for r >= 1; others: fds[0] = root */
	uint8_t *gone;    /* per fds[] entry: said goodbye, or reported lost */
	/* xfer_run's poll set and its transfers' indices, one per fds[]
	 * entry: taken with fds, not on the stack at every rank count */
	struct pollfd *pfd;
	int *pidx;
	uint8_t *midsend; /* per fds[] entry: a message partly sent on it */
	/* root: the last hello of this job's protocol it refused (a world
	 * size or rank that does not fit), for the timeout's message */
	int refused_code;
	char refused[BOOT_MAX_TEXT];
	/* the limit of the wait under way, for its messages: the
	 * rendezvous's (-1: none), then the calls' timeout_ms */
	int limit_ms;
};

static const char *boot_type_name(unsigned type)
{
	static const char *names[] = { "?", "hello", "welcome", "reject",
				       "gather", "result", "error", "bye" };

	return type < FEP_ARRAY_SIZE(names) ? names[type] : "?";
}

/* ---- encoding ---- */

static void put_u16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t)v; }
static void put_u32(uint8_t *p, uint32_t v)
{
	put_u16(p, (uint16_t)(v >> 16));
	put_u16(p + 2, (uint16_t)v);
}
static void put_u64(uint8_t *p, uint64_t v)
{
	put_u32(p, (uint32_t)(v >> 32));
	put_u32(p + 4, (uint32_t)v);
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)get_u16(p) << 16 | get_u16(p + 2);
}
static uint64_t get_u64(const uint8_t *p)
{
	return (uint64_t)get_u32(p) << 32 | get_u32(p + 4);
}

static void hdr_encode(uint8_t *p, unsigned type, int rank, int size,
		       uint64_t seq, uint64_t len)
{
	put_u32(p, BOOT_MAGIC);
	put_u16(p + 4, BOOT_VERSION);
	put_u16(p + 6, (uint16_t)type);
	put_u32(p + 8, (uint32_t)rank);
	put_u32(p + 12, (uint32_t)size);
	put_u64(p + 16, seq);
	put_u64(p + 24, len);
}

static void hdr_decode(const uint8_t *p, struct boot_hdr *h)
{
	h->magic = get_u32(p);
	h->version = get_u16(p + 4);
	h->type = get_u16(p + 6);
	h->rank = (int32_t)get_u32(p + 8);
	h->size = (int32_t)get_u32(p + 12);
	h->seq = get_u64(p + 16);
	h->len = get_u64(p + 24);
}

/* Build header + error payload into buf (BOOT_HDR_LEN + BOOT_ERR_LEN). */
static size_t err_encode(uint8_t *buf, unsigned type, int rank, int size,
			 uint64_t seq, int code, int culprit, const char *text)
{
	uint8_t *p = buf + BOOT_HDR_LEN;

	hdr_encode(buf, type, rank, size, seq, BOOT_ERR_LEN);
	put_u32(p, (uint32_t)code);
	put_u32(p + 4, (uint32_t)culprit);
	memset(p + 8, 0, BOOT_MAX_TEXT);
	snprintf((char *)p + 8, BOOT_MAX_TEXT, "%s", text ? text : "");
	return BOOT_HDR_LEN + BOOT_ERR_LEN;
}

static void err_decode(const uint8_t *p, struct boot_err *e)
{
	e->code = (int32_t)get_u32(p);
	e->culprit = (int32_t)get_u32(p + 4);
	memcpy(e->text, p + 8, BOOT_MAX_TEXT);
	e->text[BOOT_MAX_TEXT - 1] = '\0';
	/* A code from the wire is only trusted when it is an error. */
	if (e->code >= 0 || e->code < -FABEP_ERR_LAST)
		e->code = -FABEP_ERR_PEER;
}

/* ---- time ---- */

/* timeout_ms < 0: no deadline (UINT64_MAX, which ms_left caps) */
static uint64_t deadline_after(int timeout_ms)
{
	if (timeout_ms < 0)
		return UINT64_MAX;
	return fep_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* deadline + ms, no deadline staying none */
static uint64_t deadline_plus(uint64_t deadline, int ms)
{
	return deadline == UINT64_MAX ? deadline : deadline + (uint64_t)ms * 1000000ull;
}

/* Milliseconds left until deadline (rounded up), 0 once passed. */
static int ms_left(uint64_t deadline)
{
	uint64_t now = fep_now_ns();

	if (now >= deadline)
		return 0;
	return (int)FEP_MIN((deadline - now + 999999) / 1000000, (uint64_t)INT_MAX);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* ---- sockets ---- */

static void sock_close(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

static void sock_tune(int fd)
{
	int one = 1;

	/* Small messages must not wait for Nagle; failure only costs time. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void sock_peer_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char h[INET6_ADDRSTRLEN + 1], p[16];

	if (getpeername(fd, (struct sockaddr *)&ss, &sl) ||
	    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof(h), p, sizeof(p),
			NI_NUMERICHOST | NI_NUMERICSERV)) {
		snprintf(buf, len, "(unknown peer)");
		return;
	}
	snprintf(buf, len, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
}

static int errno_is_peer_gone(int e)
{
	return e == ECONNRESET || e == EPIPE || e == ENOTCONN ||
	       e == ECONNABORTED || e == ETIMEDOUT || e == EHOSTUNREACH;
}

/*
 * One direction of one message on one socket.  A send moves sbuf; a
 * receive first takes the header into hbuf, lets check() validate it and
 * point dst at where the payload goes, then takes the payload.
 */
struct boot_xfer {
	int fd;
	int peer;            /* rank at the other end */
	int send;
	int done;
	const uint8_t *sbuf;
	size_t slen, soff;
	uint8_t hbuf[BOOT_HDR_LEN];
	size_t hoff;
	struct boot_hdr hdr;
	int have_hdr;
	uint8_t *dst;
	size_t dlen, doff;
	uint8_t ebuf[BOOT_ERR_LEN]; /* payload of an ERROR/REJECT */
};

/* Validates a received header; sets x->dst/x->dlen for the payload.
 * Returns 0 or a negative code (already logged). */
typedef int (*boot_check_fn)(struct boot_tcp *t, struct boot_xfer *x,
			     void *arg);

/* Move what can move now on x; returns 0, 1 when x finished, or a negative
 * code (logged). */
static int xfer_step(struct boot_tcp *t, struct boot_xfer *x,
		     boot_check_fn check, void *arg, const char *what)
{
	ssize_t n;
	int ret;

	for (;;) {
		if (x->send) {
			if (x->soff == x->slen)
				return x->done = 1;
			n = send(x->fd, x->sbuf + x->soff, x->slen - x->soff,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		} else if (!x->have_hdr) {
			n = recv(x->fd, x->hbuf + x->hoff,
				 BOOT_HDR_LEN - x->hoff, MSG_DONTWAIT);
		} else {
			if (x->doff == x->dlen)
				return x->done = 1;
			n = recv(x->fd, x->dst + x->doff, x->dlen - x->doff,
				 MSG_DONTWAIT);
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			if (errno_is_peer_gone(errno)) {
				fep_err("bootstrap %s: rank %d is lost: its "
					"connection failed (%s)", what, x->peer,
					strerror(errno));
				return -FABEP_ERR_PEER_LOST;
			}
			ret = -errno;
			fep_err("bootstrap %s: %s rank %d failed: %s", what,
				x->send ? "send to" : "receive from", x->peer,
				strerror(errno));
			return ret;
		}
		if (n == 0 && !x->send) {
			fep_err("bootstrap %s: rank %d is lost: it closed its "
				"connection", what, x->peer);
			return -FABEP_ERR_PEER_LOST;
		}
		if (x->send) {
			x->soff += (size_t)n;
			t->midsend[x->peer] = x->soff < x->slen;
			continue;
		}
		if (x->have_hdr) {
			x->doff += (size_t)n;
			continue;
		}
		x->hoff += (size_t)n;
		if (x->hoff < BOOT_HDR_LEN)
			continue;
		hdr_decode(x->hbuf, &x->hdr);
		x->have_hdr = 1;
		if (x->hdr.magic != BOOT_MAGIC ||
		    x->hdr.version != BOOT_VERSION) {
			fep_err("bootstrap %s: rank %d sent a malformed header "
				"(magic 0x%08x version %u; expected 0x%08x "
				"version %u)", what, x->peer, x->hdr.magic,
				x->hdr.version, BOOT_MAGIC, BOOT_VERSION);
			return -FABEP_ERR_PROTOCOL;
		}
		if (x->hdr.type == BOOT_MSG_ERROR ||
		    x->hdr.type == BOOT_MSG_REJECT) {
			if (x->hdr.len != BOOT_ERR_LEN) {
				fep_err("bootstrap %s: rank %d sent an %s "
					"message of %llu bytes", what, x->peer,
					boot_type_name(x->hdr.type),
					(unsigned long long)x->hdr.len);
				return -FABEP_ERR_PROTOCOL;
			}
			x->dst = x->ebuf;
			x->dlen = BOOT_ERR_LEN;
			continue;
		}
		if (x->hdr.type == BOOT_MSG_BYE) {
			fep_err("bootstrap %s: rank %d is lost: it destroyed its "
				"communicator", what, x->peer);
			return -FABEP_ERR_PEER_LOST;
		}
		if (x->hdr.size != t->base.size) {
			fep_err("bootstrap %s: rank %d says the world has %d "
				"ranks, this rank has %d", what, x->peer,
				(int)x->hdr.size, t->base.size);
			return -FABEP_ERR_MISMATCH;
		}
		if (x->hdr.rank != x->peer) {
			fep_err("bootstrap %s: message on rank %d's connection "
				"claims to come from rank %d", what, x->peer,
				(int)x->hdr.rank);
			return -FABEP_ERR_PROTOCOL;
		}
		ret = check(t, x, arg);
		if (ret)
			return ret;
	}
}

/*
 * Drive xfers until all are done, one fails, or the deadline passes.  A
 * message of type ERROR or REJECT in place of the expected one ends the
 * run with the code it carries.  On a timeout, the ranks whose transfers
 * were unfinished are named.  *failed gets the rank concerned by a
 * failure (-1 if none).
 */
static int xfer_run(struct boot_tcp *t, struct boot_xfer *xs, int n,
		    boot_check_fn check, void *arg, uint64_t deadline,
		    const char *what, int *failed)
{
	struct pollfd *pfd = t->pfd;
	int *idx = t->pidx;
	int i, np, ret;

	*failed = -1;
	for (;;) {
		np = 0;
		for (i = 0; i < n; i++) {
			struct boot_xfer *x = &xs[i];

			if (x->done)
				continue;
			ret = xfer_step(t, x, check, arg, what);
			if (ret < 0) {
				*failed = x->peer;
				return ret;
			}
			if (!x->send && x->have_hdr && x->dst == x->ebuf &&
			    x->doff == x->dlen) {
				struct boot_err e;

				err_decode(x->ebuf, &e);
				fep_err("bootstrap %s: rank %d reports: %s",
					what, x->peer, e.text);
				*failed = e.culprit;
				return e.code;
			}
			if (ret == 1)
				continue;
			pfd[np].fd = x->fd;
			pfd[np].events = x->send ? POLLOUT : POLLIN;
			pfd[np].revents = 0;
			idx[np++] = i;
		}
		if (!np)
			return 0;
		if (!ms_left(deadline)) {
			char list[512];
			size_t off = 0;

			for (i = 0; i < np && off < sizeof(list) - 16; i++)
				off += (size_t)snprintf(list + off,
					sizeof(list) - off, "%s%d",
					i ? ", " : "", xs[idx[i]].peer);
			fep_err("bootstrap %s: timed out after %d ms waiting "
				"for rank%s %s%s", what, t->limit_ms,
				np > 1 ? "s" : "", list,
				t->base.rank ? " (the rendezvous root, which "
				"waits for every rank)" : "");
			*failed = xs[idx[0]].peer;
			return -ETIMEDOUT;
		}
		if (t->base.idle) {
			t->base.idle(t->base.idle_ctx);
			/* the idle work may have run the watch, which takes
			 * an ERROR meant for this collective off the socket */
			if (t->broken) {
				*failed = -1;
				return t->broken;
			}
		}
		ret = poll(pfd, (nfds_t)np, t->base.idle ?
			   FEP_MIN(ms_left(deadline), 1) : ms_left(deadline));
		if (ret < 0 && errno != EINTR) {
			ret = -errno;
			fep_err("bootstrap %s: poll: %s", what, strerror(errno));
			return ret;
		}
		/* POLLHUP/POLLERR: the next step's send/recv reports it. */
	}
}

/* Best effort: tell the peers in ranks (fd >= 0) that this collective
 * failed, so they fail now instead of at their timeout. */
static void boot_tcp_tell_error(struct boot_tcp *t, int code, int culprit,
				const char *text)
{
	uint8_t msg[BOOT_HDR_LEN + BOOT_ERR_LEN];
	size_t len;
	int r, fd_count;

	len = err_encode(msg, BOOT_MSG_ERROR, t->base.rank, t->base.size,
			 t->seq, code, culprit, text);
	fd_count = t->base.rank == 0 ? t->base.size : 1;
	for (r = 0; r < fd_count; r++) {
		ssize_t n;

		/* A lost rank's socket is dead; any other culprit is told
		 * too, so that every rank returns the same code. */
		if (t->fds[r] < 0 ||
		    (r == culprit && code == -FABEP_ERR_PEER_LOST))
			continue;
		/* Where a message is partly sent, an ERROR would be read as
		 * the rest of it: the peer is told by the end of the stream
		 * instead, as it is where the ERROR does not fit whole (the
		 * bootstrap is broken from now on either way). */
		if (!t->midsend[r]) {
			/* Non-blocking, one try: a full socket buffer means
			 * the peer will find out by its own timeout. */
			n = send(t->fds[r], msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0 || (size_t)n == len)
				continue;
		}
		(void)shutdown(t->fds[r], SHUT_WR);
		t->midsend[r] = 0;
	}
}

/* ---- allgather / barrier ---- */

struct gather_check {
	unsigned type;
	uint64_t len;
	uint8_t *base; /* payload of rank r goes to base + r * stride */
	size_t stride;
};

static int gather_check(struct boot_tcp *t, struct boot_xfer *x, void *arg)
{
	struct gather_check *g = arg;

	if (x->hdr.type != g->type) {
		fep_err("bootstrap allgather: rank %d sent a %s message where "
			"a %s was expected", x->peer,
			boot_type_name(x->hdr.type), boot_type_name(g->type));
		return -FABEP_ERR_PROTOCOL;
	}
	if (x->hdr.seq != t->seq) {
		fep_err("bootstrap allgather: rank %d is at collective %llu, "
			"this rank at %llu (ranks called the bootstrap in a "
			"different order)", x->peer,
			(unsigned long long)x->hdr.seq,
			(unsigned long long)t->seq);
		return -FABEP_ERR_MISMATCH;
	}
	if (x->hdr.len != g->len) {
		fep_err("bootstrap allgather: rank %d sent %llu bytes, this "
			"rank expected %llu (every rank must pass the same "
			"length)", x->peer, (unsigned long long)x->hdr.len,
			(unsigned long long)g->len);
		return -FABEP_ERR_MISMATCH;
	}
	x->dst = g->base + (size_t)x->peer * g->stride;
	x->dlen = (size_t)g->len;
	return 0;
}

static int boot_tcp_fail(struct boot_tcp *t, int ret, int culprit,
			 const char *what, const char *detail)
{
	char text[BOOT_MAX_TEXT];

	if (detail)
		snprintf(text, sizeof(text), "%s", detail);
	else if (culprit >= 0)
		snprintf(text, sizeof(text), "%s failed at rank %d: %s", what,
			 culprit, fabep_strerror(ret));
	else
		snprintf(text, sizeof(text), "%s failed: %s", what,
			 fabep_strerror(ret));
	boot_tcp_tell_error(t, ret, culprit, text);
	t->broken = ret;
	return ret;
}

static int boot_tcp_allgather_root(struct boot_tcp *t, const void *in,
				   void *out, size_t len)
{
	int size = t->base.size, n = size - 1, r, ret, failed;
	size_t total = (size_t)size * len;
	struct boot_xfer *xs;
	struct gather_check g;
	uint8_t *msg;
	uint64_t deadline = deadline_after(t->base.timeout_ms);

	msg = malloc(BOOT_HDR_LEN + total);
	xs = calloc((size_t)n, sizeof(*xs));
	if (!msg || !xs) {
		free(msg);
		free(xs);
		fep_err("bootstrap allgather: out of memory for %zu bytes",
			total);
		return boot_tcp_fail(t, -ENOMEM, -1, "allgather", NULL);
	}
	if (len)
		memcpy(msg + BOOT_HDR_LEN, in, len);

	g.type = BOOT_MSG_GATHER;
	g.len = len;
	g.base = msg + BOOT_HDR_LEN;
	g.stride = len;
	for (r = 1; r < size; r++) {
		xs[r - 1].fd = t->fds[r];
		xs[r - 1].peer = r;
	}
	ret = xfer_run(t, xs, n, gather_check, &g, deadline, "allgather",
		       &failed);
	if (ret)
		goto err;

	hdr_encode(msg, BOOT_MSG_RESULT, 0, size, t->seq, total);
	memset(xs, 0, (size_t)n * sizeof(*xs));
	for (r = 1; r < size; r++) {
		xs[r - 1].fd = t->fds[r];
		xs[r - 1].peer = r;
		xs[r - 1].send = 1;
		xs[r - 1].sbuf = msg;
		xs[r - 1].slen = BOOT_HDR_LEN + total;
	}
	ret = xfer_run(t, xs, n, gather_check, &g, deadline, "allgather",
		       &failed);
	if (ret)
		goto err;

	if (total)
		memcpy(out, msg + BOOT_HDR_LEN, total);
	t->seq++;
	free(xs);
	free(msg);
	return 0;
err:
	free(xs);
	free(msg);
	return boot_tcp_fail(t, ret, failed, "allgather", NULL);
}

static int boot_tcp_allgather_rank(struct boot_tcp *t, const void *in,
				   void *out, size_t len)
{
	size_t total = (size_t)t->base.size * len;
	struct boot_xfer x;
	struct gather_check g;
	uint8_t *msg, *res;
	uint64_t deadline = deadline_after(t->base.timeout_ms);
	int ret, failed;

	msg = malloc(BOOT_HDR_LEN + len);
	res = malloc(total ? total : 1);
	if (!msg || !res) {
		free(msg);
		free(res);
		fep_err("bootstrap allgather: out of memory for %zu bytes",
			total);
		return boot_tcp_fail(t, -ENOMEM, t->base.rank, "allgather",
				     "out of memory");
	}
	hdr_encode(msg, BOOT_MSG_GATHER, t->base.rank, t->base.size, t->seq,
		   len);
	if (len)
		memcpy(msg + BOOT_HDR_LEN, in, len);

	memset(&x, 0, sizeof(x));
	x.fd = t->fds[0];
	x.peer = 0;
	x.send = 1;
	x.sbuf = msg;
	x.slen = BOOT_HDR_LEN + len;
	ret = xfer_run(t, &x, 1, gather_check, &g, deadline, "allgather",
		       &failed);
	if (ret)
		goto err;

	g.type = BOOT_MSG_RESULT;
	g.len = total;
	g.base = res;
	g.stride = 0;
	memset(&x, 0, sizeof(x));
	x.fd = t->fds[0];
	x.peer = 0;
	ret = xfer_run(t, &x, 1, gather_check, &g, deadline, "allgather",
		       &failed);
	if (ret)
		goto err;

	if (total)
		memcpy(out, res, total);
	t->seq++;
	free(res);
	free(msg);
	return 0;
err:
	free(res);
	free(msg);
	/* The failure came from the root or its connection: the root knows
	 * or will find out by its own deadline. */
	t->broken = ret;
	return ret;
}

static int boot_tcp_allgather(fep_boot_t *b, const void *in, void *out,
			      size_t len)
{
	struct boot_tcp *t = fep_container_of(b, struct boot_tcp, base);

	if (len && (!in || !out)) {
		fep_err("bootstrap allgather: NULL %s buffer with length %zu",
			in ? "output" : "input", len);
		return -EINVAL;
	}
	if (len > (SIZE_MAX - BOOT_HDR_LEN) / (size_t)b->size) {
		fep_err("bootstrap allgather: %zu bytes times %d ranks "
			"overflows", len, b->size);
		return -EINVAL;
	}
	if (t->broken) {
		fep_err("bootstrap allgather: the bootstrap failed earlier "
			"(%s) and cannot be used any more",
			fabep_strerror(t->broken));
		return t->broken;
	}
	if (b->size == 1) {
		if (len)
			memmove(out, in, len);
		return 0;
	}
	return b->rank == 0 ? boot_tcp_allgather_root(t, in, out, len)
			    : boot_tcp_allgather_rank(t, in, out, len);
}

static int boot_tcp_barrier(fep_boot_t *b)
{
	uint8_t one = 1, *all;
	int ret;

	if (b->size == 1)
		return boot_tcp_allgather(b, &one, &one, 1);
	all = malloc((size_t)b->size);
	if (!all) {
		fep_err("bootstrap barrier: out of memory");
		return -ENOMEM;
	}
	ret = boot_tcp_allgather(b, &one, all, 1);
	free(all);
	return ret;
}

/* Where the watch stands on connection i of fds[]: 0 nothing new (or a
 * message that belongs to a later collective, left in place), 1 the
 * other end said goodbye, 2 its connection closed or failed, 3 an ERROR
 * message was taken into e. */
static int watch_one(struct boot_tcp *t, int i, struct boot_err *e)
{
	uint8_t buf[BOOT_HDR_LEN + BOOT_ERR_LEN];
	struct boot_hdr h;
	size_t want;
	ssize_t n;

	n = recv(t->fds[i], buf, BOOT_HDR_LEN, MSG_PEEK | MSG_DONTWAIT);
	if (n == 0)
		return 2;
	if (n < 0)
		return errno_is_peer_gone(errno) ? 2 : 0;
	if ((size_t)n < BOOT_HDR_LEN)
		return 0;
	hdr_decode(buf, &h);
	if (h.magic != BOOT_MAGIC || h.version != BOOT_VERSION)
		return 0;  /* the next collective reports it */
	if (h.type == BOOT_MSG_BYE && h.len == 0) {
		(void)recv(t->fds[i], buf, BOOT_HDR_LEN, MSG_DONTWAIT);
		return 1;
	}
	if (h.type != BOOT_MSG_ERROR || h.len != BOOT_ERR_LEN)
		return 0;
	want = BOOT_HDR_LEN + BOOT_ERR_LEN;
	n = recv(t->fds[i], buf, want, MSG_PEEK | MSG_DONTWAIT);
	if (n < 0 || (size_t)n < want)
		return 0;  /* the rest is on its way */
	(void)recv(t->fds[i], buf, want, MSG_DONTWAIT);
	err_decode(buf + BOOT_HDR_LEN, e);
	return 3;
}

/*
 * Whether every rank is still there, without blocking: 0, or the code of
 * a loss (logged once).  The root watches every rank's connection; a
 * rank whose connection closes without a goodbye is lost, and the root
 * tells the others (an ERROR message, which also ends a collective they
 * may be in).  A rank watches the root's connection for that message and
 * for the root's own end.  Messages of a later collective stay where
 * they are.
 */
static int boot_tcp_watch(fep_boot_t *b)
{
	struct boot_tcp *t = fep_container_of(b, struct boot_tcp, base);
	int i, n = b->rank == 0 ? b->size : 1, st;
	struct boot_err e;
	char text[BOOT_MAX_TEXT];

	/* a loss already reported fails every later call silently; any
	 * other failure is the collectives' to report */
	if (t->broken == -FABEP_ERR_PEER_LOST)
		return t->broken;
	if (b->size == 1 || t->broken)
		return 0;
	for (i = b->rank == 0 ? 1 : 0; i < n; i++) {
		if (t->fds[i] < 0 || t->gone[i])
			continue;
		st = watch_one(t, i, &e);
		if (st == 1) {
			t->gone[i] = 1;  /* a normal end */
			continue;
		}
		if (st == 2) {
			t->gone[i] = 1;
			snprintf(text, sizeof(text), "rank %d is lost: its "
				 "bootstrap connection closed (its process "
				 "ended or its host is unreachable)", i);
			fep_err("%s", text);
			if (b->rank == 0)
				boot_tcp_tell_error(t, -FABEP_ERR_PEER_LOST, i, text);
			t->broken = -FABEP_ERR_PEER_LOST;
			return t->broken;
		}
		if (st == 3) {
			fep_err("rank %d reports: %s", i, e.text);
			t->broken = e.code;
			return e.code;
		}
	}
	return 0;
}

/* A bootstrap's memory (its sockets closed or never opened); t may be
 * NULL or partly allocated. */
static void boot_tcp_free(struct boot_tcp *t)
{
	if (!t)
		return;
	free(t->fds);
	free(t->gone);
	free(t->midsend);
	free(t->pfd);
	free(t->pidx);
	free(t);
}

static void boot_tcp_destroy(fep_boot_t *b)
{
	struct boot_tcp *t = fep_container_of(b, struct boot_tcp, base);
	int r, n = b->rank == 0 ? b->size : 1;
	uint8_t bye[BOOT_HDR_LEN];

	/* goodbye first: the other end's watch must not take this for a
	 * loss (non-blocking, one try: a full buffer means a peer that is
	 * not reading, which its own watch or timeout settles) */
	hdr_encode(bye, BOOT_MSG_BYE, b->rank, b->size, t->seq, 0);
	if (t->fds)
		for (r = 0; r < n; r++) {
			if (t->fds[r] >= 0 && !t->midsend[r] && !b->failed)
				(void)send(t->fds[r], bye, sizeof(bye),
					   MSG_NOSIGNAL | MSG_DONTWAIT);
			sock_close(&t->fds[r]);
		}
	boot_tcp_free(t);
}

/* ---- rendezvous: root side ---- */

struct boot_pending {
	int fd;
	size_t got;
	uint8_t hbuf[BOOT_HDR_LEN];
	char name[64];
};

static int boot_listen(const char *host, int port, int size, int *out_fd)
{
	struct addrinfo hints, *res, *ai;
	char portstr[16];
	int fd = -1, one = 1, ret, err = 0;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(portstr, sizeof(portstr), "%d", port);
	ret = getaddrinfo(host, portstr, &hints, &res);
	if (ret) {
		fep_err("bootstrap root: cannot resolve rendezvous host "
			"\"%s\": %s", host, gai_strerror(ret));
		return -EINVAL;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family,
			    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			    ai->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
		    bind(fd, ai->ai_addr, ai->ai_addrlen) ||
		    listen(fd, FEP_MAX(size, 128))) {
			err = errno;
			sock_close(&fd);
			continue;
		}
		break;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		fep_err("bootstrap root: cannot listen on %s:%d: %s", host,
			port, strerror(err ? err : EADDRNOTAVAIL));
		return -(err ? err : EADDRNOTAVAIL);
	}
	*out_fd = fd;
	return 0;
}

/* Answer a refused hello (best effort) and close the connection. */
static void boot_reject(struct boot_tcp *t, struct boot_pending *p, int code,
			const char *text)
{
	uint8_t msg[BOOT_HDR_LEN + BOOT_ERR_LEN];
	size_t len;

	len = err_encode(msg, BOOT_MSG_REJECT, 0, t->base.size, 0, code, -1,
			 text);
	(void)send(p->fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	sock_close(&p->fd);
}

/* Refuse a hello of this protocol that does not fit this world, and
 * keep why: a rank refused so never arrives, and the rendezvous's
 * timeout then names the refusal (its code) instead of a plain
 * absence.  A stranger's hello does not end the rendezvous at once:
 * the ranks it was meant for may still come. */
static void boot_refuse(struct boot_tcp *t, struct boot_pending *p, int code,
			const char *text)
{
	fep_err("bootstrap root %s:%d: connection from %s refused: %s",
		t->host, t->port, p->name, text);
	t->refused_code = code;
	snprintf(t->refused, sizeof(t->refused), "%s", text);
	boot_reject(t, p, code, text);
}

/* A pending connection has sent its header: accept it as a rank or refuse
 * it.  Either way it leaves the pending list. */
static void boot_hello(struct boot_tcp *t, struct boot_pending *p)
{
	struct boot_hdr h;
	char text[BOOT_MAX_TEXT];
	int size = t->base.size;

	hdr_decode(p->hbuf, &h);
	if (h.magic != BOOT_MAGIC) {
		fep_err("bootstrap root %s:%d: connection from %s is not a "
			"fabep rank (bad magic 0x%08x); closing it", t->host,
			t->port, p->name, h.magic);
		sock_close(&p->fd);
		return;
	}
	if (h.version != BOOT_VERSION || h.type != BOOT_MSG_HELLO ||
	    h.len != 0) {
		snprintf(text, sizeof(text), "expected a hello of protocol "
			 "version %u, got a %s (type %u) of version %u with "
			 "%llu payload bytes", BOOT_VERSION,
			 boot_type_name(h.type), h.type, h.version,
			 (unsigned long long)h.len);
		fep_err("bootstrap root %s:%d: connection from %s: %s; "
			"closing it", t->host, t->port, p->name, text);
		boot_reject(t, p, -FABEP_ERR_PROTOCOL, text);
		return;
	}
	if (h.size != size) {
		snprintf(text, sizeof(text), "rank %d says the world has %d "
			 "ranks, but the root's world has %d (check "
			 "FABEP_WORLD_SIZE)", (int)h.rank, (int)h.size, size);
		boot_refuse(t, p, -FABEP_ERR_MISMATCH, text);
		return;
	}
	if (h.rank < 1 || h.rank >= size) {
		snprintf(text, sizeof(text), "rank %d is not in 1..%d",
			 (int)h.rank, size - 1);
		boot_refuse(t, p, -EINVAL, text);
		return;
	}
	if (t->fds[h.rank] >= 0) {
		snprintf(text, sizeof(text), "rank %d has already connected "
			 "(two processes were given the same rank)",
			 (int)h.rank);
		boot_refuse(t, p, -EINVAL, text);
		return;
	}
	fep_dbg("bootstrap root: rank %d connected from %s", (int)h.rank,
		p->name);
	t->fds[h.rank] = p->fd;
	p->fd = -1;
}

static void boot_pending_read(struct boot_tcp *t, struct boot_pending *p)
{
	ssize_t n;

	for (;;) {
		n = recv(p->fd, p->hbuf + p->got, BOOT_HDR_LEN - p->got,
			 MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			fep_warn("bootstrap root %s:%d: connection from %s "
				 "closed before it said which rank it is%s%s",
				 t->host, t->port, p->name, n ? ": " : "",
				 n ? strerror(errno) : "");
			sock_close(&p->fd);
			return;
		}
		p->got += (size_t)n;
		if (p->got == BOOT_HDR_LEN) {
			boot_hello(t, p);
			return;
		}
	}
}

static int boot_missing_list(struct boot_tcp *t, char *buf, size_t len)
{
	size_t off = 0;
	int r, missing = 0;

	buf[0] = '\0';
	for (r = 1; r < t->base.size; r++) {
		if (t->fds[r] >= 0)
			continue;
		if (off < len - 16)
			off += (size_t)snprintf(buf + off, len - off, "%s%d",
						missing ? ", " : "", r);
		else if (off < len - 5)
			off += (size_t)snprintf(buf + off, len - off, ", ...");
		missing++;
	}
	return missing;
}

static int boot_root_rendezvous(struct boot_tcp *t, uint64_t deadline)
{
	/* room for every rank at once, as they arrive in waves, and for
	 * BOOT_MAX_PENDING strangers besides */
	int size = t->base.size, cap = size - 1 + BOOT_MAX_PENDING;
	struct boot_pending *pend = NULL;
	struct pollfd *pfd = NULL;
	struct boot_xfer *xs;
	uint8_t welcome[BOOT_HDR_LEN];
	int lfd = -1, npend = 0, i, ret, failed, missing;
	char list[200], detail[640] = "";

	pend = calloc((size_t)cap, sizeof(*pend));
	pfd = calloc((size_t)cap + 1, sizeof(*pfd));
	if (!pend || !pfd) {
		snprintf(detail, sizeof(detail), "rendezvous root: no memory "
			 "for %d connections", cap);
		fep_err("bootstrap %s", detail);
		ret = -ENOMEM;
		goto err;
	}
	ret = boot_listen(t->host, t->port, size, &lfd);
	if (ret) {
		free(pend);
		free(pfd);
		return ret;
	}
	detail[0] = '\0';

	for (;;) {
		missing = boot_missing_list(t, list, sizeof(list));
		if (!missing)
			break;
		if (!ms_left(deadline)) {
			int len = snprintf(detail, sizeof(detail), "rendezvous "
					   "root %s:%d: rank%s %s never connected "
					   "within %d ms (%d of %d arrived)",
					   t->host, t->port, missing > 1 ? "s" : "",
					   list, t->limit_ms,
					   size - 1 - missing, size - 1);

			/* the refusal, as far as it fits (a message cut
			 * short beats none) */
			if (t->refused_code && len > 0 && (size_t)len < sizeof(detail) &&
			    snprintf(detail + len, sizeof(detail) - (size_t)len,
				     "; refused meanwhile: %s", t->refused) < 0)
				detail[len] = '\0';
			fep_err("bootstrap %s", detail);
			ret = t->refused_code ? t->refused_code : -ETIMEDOUT;
			goto err;
		}
		pfd[0].fd = lfd;
		pfd[0].events = POLLIN;
		pfd[0].revents = 0;
		for (i = 0; i < npend; i++) {
			pfd[i + 1].fd = pend[i].fd;
			pfd[i + 1].events = POLLIN;
			pfd[i + 1].revents = 0;
		}
		ret = poll(pfd, (nfds_t)npend + 1, ms_left(deadline));
		if (ret < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			fep_err("bootstrap root: poll: %s", strerror(errno));
			goto err;
		}
		for (i = 0; i < npend; i++)
			if (pfd[i + 1].revents)
				boot_pending_read(t, &pend[i]);
		/* Drop the connections that were settled. */
		for (i = 0; i < npend;) {
			if (pend[i].fd < 0)
				pend[i] = pend[--npend];
			else
				i++;
		}
		if (!(pfd[0].revents & POLLIN))
			continue;
		for (;;) {
			int fd = accept4(lfd, NULL, NULL,
					 SOCK_NONBLOCK | SOCK_CLOEXEC);

			if (fd < 0) {
				if (errno == EINTR || errno == ECONNABORTED)
					continue;
				if (errno == EMFILE || errno == ENFILE) {
					/* the listener stays readable: waiting
					 * would spin to the timeout */
					ret = -errno;
					snprintf(detail, sizeof(detail),
						 "rendezvous root %s:%d: accept: %s "
						 "(rank 0 needs a descriptor per "
						 "rank: raise its limit, ulimit -n)",
						 t->host, t->port, strerror(errno));
					fep_err("bootstrap %s", detail);
					goto err;
				}
				if (errno != EAGAIN && errno != EWOULDBLOCK)
					fep_warn("bootstrap root: accept: %s",
						 strerror(errno));
				break;
			}
			if (npend == cap) {
				/* Unidentified connections are flooding the
				 * port: drop the oldest. */
				fep_warn("bootstrap root %s:%d: more than %d "
					 "connections that never said which "
					 "rank they are; dropping %s", t->host,
					 t->port, cap, pend[0].name);
				sock_close(&pend[0].fd);
				pend[0] = pend[--npend];
			}
			sock_tune(fd);
			memset(&pend[npend], 0, sizeof(pend[npend]));
			pend[npend].fd = fd;
			sock_peer_name(fd, pend[npend].name,
				       sizeof(pend[npend].name));
			npend++;
		}
	}
	for (i = 0; i < npend; i++)
		sock_close(&pend[i].fd);
	npend = 0;
	sock_close(&lfd);
	free(pend);
	free(pfd);
	pend = NULL;
	pfd = NULL;

	/* Everyone is here: tell them. */
	xs = calloc((size_t)size - 1, sizeof(*xs));
	if (!xs) {
		fep_err("bootstrap root: out of memory");
		ret = -ENOMEM;
		goto err;
	}
	hdr_encode(welcome, BOOT_MSG_WELCOME, 0, size, 0, 0);
	for (i = 1; i < size; i++) {
		xs[i - 1].fd = t->fds[i];
		xs[i - 1].peer = i;
		xs[i - 1].send = 1;
		xs[i - 1].sbuf = welcome;
		xs[i - 1].slen = BOOT_HDR_LEN;
	}
	ret = xfer_run(t, xs, size - 1, NULL, NULL, deadline, "rendezvous",
		       &failed);
	free(xs);
	if (ret) {
		boot_tcp_fail(t, ret, failed, "rendezvous", NULL);
		return ret;
	}
	return 0;
err:
	for (i = 0; i < npend; i++)
		sock_close(&pend[i].fd);
	if (lfd >= 0)
		sock_close(&lfd);
	free(pend);
	free(pfd);
	boot_tcp_fail(t, ret, -1, "rendezvous", detail);
	return ret;
}

/* ---- rendezvous: the other ranks ---- */

static int errno_is_retry(int e)
{
	return e == ECONNREFUSED || e == ETIMEDOUT || e == ECONNRESET ||
	       e == EHOSTUNREACH || e == ENETUNREACH || e == ECONNABORTED ||
	       e == EAGAIN || e == EADDRNOTAVAIL;
}

/* Whether a socket got connected to itself (a TCP simultaneous open when
 * the root's port is in the ephemeral range and nobody listens yet). */
static int sock_is_self(int fd)
{
	struct sockaddr_storage a, b;
	socklen_t la = sizeof(a), lb = sizeof(b);

	if (getsockname(fd, (struct sockaddr *)&a, &la) ||
	    getpeername(fd, (struct sockaddr *)&b, &lb))
		return 0;
	return la == lb && !memcmp(&a, &b, la);
}

/* One connect attempt to ai, bounded by deadline.  Returns the fd, or a
 * negative errno (not logged). */
static int boot_connect_one(const struct addrinfo *ai, uint64_t deadline)
{
	struct pollfd pfd;
	socklen_t sl;
	int fd, err = 0, ret;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
	if (fd < 0)
		return -errno;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
		goto connected;
	if (errno != EINPROGRESS) {
		err = errno;
		goto fail;
	}
	pfd.fd = fd;
	pfd.events = POLLOUT;
	for (;;) {
		pfd.revents = 0;
		ret = poll(&pfd, 1, ms_left(deadline));
		if (ret < 0 && errno == EINTR)
			continue;
		if (ret < 0) {
			err = errno;
			goto fail;
		}
		if (ret == 0) {
			err = ETIMEDOUT;
			goto fail;
		}
		break;
	}
	sl = sizeof(err);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl))
		err = errno;
	if (err)
		goto fail;
connected:
	if (sock_is_self(fd)) {
		err = ECONNREFUSED;
		goto fail;
	}
	sock_tune(fd);
	return fd;
fail:
	close(fd);
	return -err;
}

/* The WELCOME check: reached only for messages other than ERROR/REJECT. */
static int welcome_check(struct boot_tcp *t, struct boot_xfer *x, void *arg)
{
	if (x->hdr.type != BOOT_MSG_WELCOME || x->hdr.len != 0) {
		fep_err("bootstrap rendezvous: rank %d sent a %s message of "
			"%llu bytes where a welcome was expected", x->peer,
			boot_type_name(x->hdr.type),
			(unsigned long long)x->hdr.len);
		return -FABEP_ERR_PROTOCOL;
	}
	x->dst = NULL;
	x->dlen = 0;
	return 0;
}

static int boot_rank_rendezvous(struct boot_tcp *t, uint64_t deadline)
{
	struct addrinfo hints, *res = NULL, *ai;
	char portstr[16];
	uint8_t hello[BOOT_HDR_LEN];
	struct boot_xfer x;
	int fd = -1, ret, err = ECONNREFUSED, delay_ms = 5, failed;
	int gai_said = 0;  /* the name's resolution error, while it lasts */

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(portstr, sizeof(portstr), "%d", t->port);

	while (fd < 0) {
		if (!res) {
			ret = getaddrinfo(t->host, portstr, &hints, &res);
			if (ret == EAI_AGAIN || ret == EAI_NONAME
#ifdef EAI_NODATA
			    || ret == EAI_NODATA
#endif
			    ) {
				/* a name that does not resolve yet, as a
				 * job's root whose DNS record comes with it
				 * (a Kubernetes headless service): retried
				 * until the timeout, as a refused connect */
				if (ret != EAI_AGAIN && !gai_said)
					fep_warn("bootstrap: rendezvous host \"%s\" "
						 "does not resolve (%s); trying "
						 "again until the timeout", t->host,
						 gai_strerror(ret));
				gai_said = ret;
				res = NULL;
				err = EAGAIN;
			} else if (ret) {
				fep_err("bootstrap: cannot resolve rendezvous "
					"host \"%s\": %s", t->host,
					gai_strerror(ret));
				return -EINVAL;
			} else {
				gai_said = 0;
			}
		}
		/* every address the name has: one this host cannot reach
		 * at all (an IPv6 one without IPv6: EAFNOSUPPORT) gives way
		 * to the next; only where none may answer later, fail now */
		bool retry = res == NULL;
		int hard = 0;

		for (ai = res; ai && fd < 0; ai = ai->ai_next) {
			fd = boot_connect_one(ai, deadline);
			if (fd >= 0)
				break;
			if (errno_is_retry(-fd)) {
				err = -fd;
				retry = true;
			} else {
				hard = -fd;
			}
		}
		if (fd >= 0)
			break;
		if (!retry) {
			fep_err("bootstrap: connect to rendezvous root %s:%d: %s",
				t->host, t->port, strerror(hard));
			freeaddrinfo(res);
			return -hard;
		}
		if (!ms_left(deadline)) {
			fep_err("bootstrap: rendezvous root %s:%d never "
				"answered within %d ms (last error: %s)",
				t->host, t->port, t->limit_ms,
				gai_said ? gai_strerror(gai_said) : strerror(err));
			if (res)
				freeaddrinfo(res);
			return -ETIMEDOUT;
		}
		sleep_ms(FEP_MIN(delay_ms, ms_left(deadline)));
		delay_ms = FEP_MIN(delay_ms * 2, 100);
	}
	freeaddrinfo(res);
	t->fds[0] = fd;

	hdr_encode(hello, BOOT_MSG_HELLO, t->base.rank, t->base.size, 0, 0);
	memset(&x, 0, sizeof(x));
	x.fd = fd;
	x.peer = 0;
	x.send = 1;
	x.sbuf = hello;
	x.slen = BOOT_HDR_LEN;
	ret = xfer_run(t, &x, 1, NULL, NULL, deadline, "rendezvous", &failed);
	if (ret)
		goto err;

	memset(&x, 0, sizeof(x));
	x.fd = fd;
	x.peer = 0;
	ret = xfer_run(t, &x, 1, welcome_check, NULL,
		       deadline_plus(deadline, BOOT_VERDICT_GRACE_MS), "rendezvous",
		       &failed);
	if (ret == -ETIMEDOUT) {
		fep_err("bootstrap: connected to the rendezvous root %s:%d, "
			"but the world of %d ranks was not complete within "
			"%d ms", t->host, t->port, t->base.size,
			t->limit_ms);
	}
	if (ret)
		goto err;
	return 0;
err:
	sock_close(&t->fds[0]);
	return ret;
}

/* A bootstrap of rank of size, not yet connected (its fds all -1); NULL
 * when memory runs out. */
static struct boot_tcp *boot_tcp_new(int rank, int size, int timeout_ms)
{
	struct boot_tcp *t = calloc(1, sizeof(*t));
	int r, n = rank == 0 ? size : 1;

	if (t) {
		t->fds = malloc((size_t)n * sizeof(int));
		t->gone = calloc((size_t)n, 1);
		t->midsend = calloc((size_t)n, 1);
		t->pfd = calloc((size_t)n, sizeof(*t->pfd));
		t->pidx = calloc((size_t)n, sizeof(*t->pidx));
	}
	if (!t || !t->fds || !t->gone || !t->midsend || !t->pfd || !t->pidx) {
		boot_tcp_free(t);
		return NULL;
	}
	for (r = 0; r < n; r++)
		t->fds[r] = -1;
	t->base.rank = rank;
	t->base.size = size;
	t->base.timeout_ms = timeout_ms;
	t->limit_ms = timeout_ms;
	t->base.allgather = boot_tcp_allgather;
	t->base.barrier = boot_tcp_barrier;
	t->base.destroy = boot_tcp_destroy;
	t->base.watch = boot_tcp_watch;
	return t;
}

int fep_boot_tcp_create(int rank, int size, const char *root_host,
			int root_port, int timeout_ms, fep_boot_t **out)
{
	return fep_boot_tcp_create_rdv(rank, size, root_host, root_port,
				       timeout_ms, timeout_ms, out);
}

int fep_boot_tcp_create_rdv(int rank, int size, const char *root_host,
			    int root_port, int timeout_ms, int rdv_ms,
			    fep_boot_t **out)
{
	struct boot_tcp *t;
	uint64_t deadline;
	int ret;

	ret = fep_boot_check_world(rank, size, out);
	if (ret)
		return ret;
	if (timeout_ms <= 0) {
		fep_err("bootstrap: timeout %d ms must be positive", timeout_ms);
		return -EINVAL;
	}
	if (rdv_ms <= 0 && rdv_ms != -1) {
		fep_err("bootstrap: rendezvous timeout %d ms must be positive, "
			"or -1 for none", rdv_ms);
		return -EINVAL;
	}
	if (size > 1 && (!root_host || !*root_host ||
			 strlen(root_host) >= sizeof(t->host))) {
		fep_err("bootstrap: a world of %d ranks needs the rendezvous "
			"host (FABEP_ROOT=host:port)", size);
		return -EINVAL;
	}
	if (size > 1 && (root_port < 1 || root_port > 65535)) {
		fep_err("bootstrap: rendezvous port %d is not in 1..65535",
			root_port);
		return -EINVAL;
	}

	t = boot_tcp_new(rank, size, timeout_ms);
	if (!t) {
		fep_err("bootstrap: out of memory for %d ranks", size);
		return -ENOMEM;
	}
	if (size > 1) {
		snprintf(t->host, sizeof(t->host), "%s", root_host);
		t->port = root_port;
	}

	if (size > 1) {
		t->limit_ms = rdv_ms;
		deadline = deadline_after(rdv_ms);
		ret = rank == 0 ? boot_root_rendezvous(t, deadline)
				: boot_rank_rendezvous(t, deadline);
		t->limit_ms = timeout_ms;
		if (ret) {
			boot_tcp_destroy(&t->base);
			return ret;
		}
	}
	*out = &t->base;
	return 0;
}
