/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/* log.c - leveled logging to stderr, level from FABEP_LOG, muted per
 * thread by fabep_log_quiet(); the calling thread's error messages for
 * fabep_last_error(). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <pthread.h>

#include "util/util.h"

static int log_level = -1;
static int log_rank = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

/*
 * The error messages logged on this thread since fabep_last_error() last
 * returned them, oldest first, one per line.  Per thread, because a
 * failure is reported to the thread that made the call and threads work
 * on different communicators; a fixed array, because the thread that logs
 * may be failing for want of memory.  When a new message does not fit,
 * the oldest lines go: the newest say what ended the call.
 */
#define LAST_ERROR_MAX 4096
static __thread struct {
	char text[LAST_ERROR_MAX];
	size_t len;
	bool taken; /* returned: the next error message starts a new text */
} last_error;

static void last_error_add(const char *msg)
{
	size_t n = FEP_MIN(strlen(msg), (size_t)LAST_ERROR_MAX - 1);
	size_t need;

	if (last_error.taken) {
		last_error.len = 0;
		last_error.taken = false;
	}
	need = n + (last_error.len ? 1 : 0);
	while (last_error.len && last_error.len + need >= LAST_ERROR_MAX) {
		char *nl = memchr(last_error.text, '\n', last_error.len);
		size_t drop = nl ? (size_t)(nl - last_error.text) + 1 :
				   last_error.len;

		memmove(last_error.text, last_error.text + drop,
			last_error.len - drop);
		last_error.len -= drop;
		need = n + (last_error.len ? 1 : 0);
	}
	if (last_error.len)
		last_error.text[last_error.len++] = '\n';
	memcpy(last_error.text + last_error.len, msg, n);
	last_error.len += n;
	last_error.text[last_error.len] = '\0';
}

void fep_log_adopt(const char *text)
{
	while (*text) {
		char line[LAST_ERROR_MAX];
		size_t n = strcspn(text, "\n");

		n = FEP_MIN(n, sizeof(line) - 1);
		memcpy(line, text, n);
		line[n] = '\0';
		last_error_add(line);
		text += n;
		text += *text == '\n';
	}
}

/* Set by fabep_log_quiet(): this thread's lines are not printed (its
 * error messages are still kept). */
static __thread bool log_quiet;

FEP_EXPORT int fabep_log_quiet(int quiet)
{
	int prev = log_quiet;

	log_quiet = quiet != 0;
	return prev;
}

FEP_EXPORT const char *fabep_last_error(void)
{
	if (last_error.taken || !last_error.len)
		return "";
	last_error.taken = true;
	return last_error.text;
}

static void log_init(void)
{
	const char *s = getenv("FABEP_LOG");
	int lvl = FEP_LOG_WARN;

	if (s && *s) {
		if (!strcasecmp(s, "none") || !strcmp(s, "0"))
			lvl = FEP_LOG_NONE;
		else if (!strcasecmp(s, "error"))
			lvl = FEP_LOG_ERROR;
		else if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning"))
			lvl = FEP_LOG_WARN;
		else if (!strcasecmp(s, "info"))
			lvl = FEP_LOG_INFO;
		else if (!strcasecmp(s, "debug"))
			lvl = FEP_LOG_DEBUG;
		else
			fprintf(stderr, "fabep: warning: FABEP_LOG=%s is not one of "
				"none|error|warn|info|debug; using warn\n", s);
	}
	__atomic_store_n(&log_level, lvl, __ATOMIC_RELEASE);
}

int fep_log_level(void)
{
	int lvl = __atomic_load_n(&log_level, __ATOMIC_ACQUIRE);

	if (lvl < 0) {
		pthread_once(&log_once, log_init);
		lvl = __atomic_load_n(&log_level, __ATOMIC_ACQUIRE);
	}
	return lvl;
}

void fep_log_set_rank(int rank)
{
	log_rank = rank;
}

void fep_log(int level, const char *file, int line, const char *fmt, ...)
{
	static const char *names[] = { "", "error", "warning", "info", "debug" };
	char buf[1024];
	const char *base = strrchr(file, '/');
	va_list ap;
	int n;

	if (level < FEP_LOG_ERROR || level > FEP_LOG_DEBUG)
		level = FEP_LOG_ERROR;
	/* an error's text is kept for fabep_last_error() even unprinted */
	if (level != FEP_LOG_ERROR && (log_quiet || fep_log_level() < level))
		return;
	if (log_rank >= 0)
		n = snprintf(buf, sizeof(buf), "fabep[%d:%d] %s: ", log_rank,
			     (int)getpid(), names[level]);
	else
		n = snprintf(buf, sizeof(buf), "fabep[%d] %s: ", (int)getpid(),
			     names[level]);
	if (n < 0 || (size_t)n >= sizeof(buf))
		n = 0;
	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	if (level == FEP_LOG_ERROR)
		last_error_add(buf + n);
	if (log_quiet || fep_log_level() < level)
		return;
	if (fep_log_level() >= FEP_LOG_DEBUG) {
		size_t l = strlen(buf);
		snprintf(buf + l, sizeof(buf) - l, " (%s:%d)",
			 base ? base + 1 : file, line);
	}
	fprintf(stderr, "%s\n", buf);
}
