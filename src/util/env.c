/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/* env.c - parsing of environment variables and option values. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <sched.h>

#include "util/util.h"

int fep_parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;
	int base;

	if (!s || !*s)
		return -EINVAL;
	while (isspace((unsigned char)*s))
		s++;
	/* Decimal, or hex with 0x: never octal, so "010" is ten (a rank or a
	 * port with a leading zero must not change value). */
	{
		const char *p = (*s == '+' || *s == '-') ? s + 1 : s;

		base = (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) ? 16 : 10;
	}
	errno = 0;
	v = strtol(s, &end, base);
	if (errno == ERANGE)
		return -ERANGE;
	if (errno || end == s)
		return -EINVAL;
	while (isspace((unsigned char)*end))
		end++;
	if (*end)
		return -EINVAL;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int fep_parse_size(const char *s, size_t *out)
{
	unsigned long long v, mul = 1;
	char *end;

	if (!s || !*s)
		return -EINVAL;
	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': mul = 1ull << 10; end++; break;
	case 'm': case 'M': mul = 1ull << 20; end++; break;
	case 'g': case 'G': mul = 1ull << 30; end++; break;
	default: break;
	}
	/* "64k", "64kB", "64KiB", "64B"; an "i" only after a unit. */
	if (mul > 1 && *end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	while (isspace((unsigned char)*end))
		end++;
	if (*end)
		return -EINVAL;
	if (v > SIZE_MAX / mul)
		return -ERANGE;
	*out = (size_t)(v * mul);
	return 0;
}

int fep_parse_hostport(const char *s, char *host, size_t hostlen, int *port)
{
	const char *colon, *hs, *he;
	long p;
	int ret;

	if (!s || !*s)
		return -EINVAL;
	if (*s == '[') {
		hs = s + 1;
		he = strchr(hs, ']');
		if (!he || he[1] != ':')
			return -EINVAL;
		colon = he + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -EINVAL;
		hs = s;
		he = colon;
		if (memchr(hs, ':', (size_t)(he - hs)))
			return -EINVAL; /* bare IPv6 needs brackets */
	}
	if (he == hs || (size_t)(he - hs) >= hostlen)
		return -EINVAL;
	/* no host name holds a space: " 127.0.0.1" would fail later as a
	 * host that does not resolve, without naming the variable */
	for (const char *c = hs; c < he; c++)
		if (isspace((unsigned char)*c))
			return -EINVAL;
	/* The port is plain decimal digits: no sign, space or 0x. */
	if (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))
		return -EINVAL;
	ret = fep_parse_long(colon + 1, 1, 65535, &p);
	if (ret)
		return -EINVAL;
	memcpy(host, hs, (size_t)(he - hs));
	host[he - hs] = '\0';
	*port = (int)p;
	return 0;
}

int fep_env_str(const char *name, const char **out)
{
	const char *s = getenv(name);

	if (!s || !*s)
		return 0;
	*out = s;
	return 1;
}

int fep_env_long(const char *name, long min, long max, long *out)
{
	const char *s = getenv(name);
	int ret;

	if (!s || !*s)
		return 0;
	ret = fep_parse_long(s, min, max, out);
	if (ret) {
		fep_err("%s=\"%s\" is not an integer in [%ld, %ld]", name, s,
			min, max);
		return -EINVAL;
	}
	return 1;
}

int fep_env_size(const char *name, size_t min, size_t max, size_t *out)
{
	const char *s = getenv(name);
	size_t v;

	if (!s || !*s)
		return 0;
	if (fep_parse_size(s, &v) || v < min || v > max) {
		fep_err("%s=\"%s\" is not a size in [%zu, %zu] (suffixes k, M, G)",
			name, s, min, max);
		return -EINVAL;
	}
	*out = v;
	return 1;
}

void fep_backoff_step(struct fep_backoff *b)
{
	uint64_t now;

	if (b->spins < 64) {
		b->spins++;
		__builtin_ia32_pause();
		return;
	}
	/* Then yield for up to 2 ms: sched_yield returns at once when no
	 * other thread wants this core, and lets other ranks run when there
	 * are more ranks than cores.  A sleep costs its timer slack (50 us
	 * by default) on top, so it only comes after that. */
	now = fep_now_ns();
	if (b->spins == 64) {
		b->spins++;
		b->t0 = now;
	}
	if (now - b->t0 < 2000000ull) {
		sched_yield();
		return;
	}
	{
		struct timespec ts = { 0, 20000 };
		nanosleep(&ts, NULL);
	}
}
