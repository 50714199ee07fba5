/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * signals.c - the caller's signal dispositions, kept from a dependency
 * that takes them when it loads.
 *
 * libfabric's psm provider, as Debian and Ubuntu build it, links
 * libinfinipath, whose constructor installs its own handler for SIGINT,
 * SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT (even where the process
 * ignored the signal), unless IPATH_NO_BACKTRACE is set.  That handler
 * calls exit(1): a process told to stop by SIGTERM or Ctrl-C ends with
 * status 1 instead of by the signal, runs its atexit handlers inside a
 * signal handler, and a crash leaves no core.  A library must not change
 * how its caller's process ends, so every handler that lies in
 * libinfinipath gets the default action back: when libfabep loads (its
 * constructors run after those of the libraries it needs) and again
 * once a communicator's fabric is open, in case a provider loaded later
 * brought it in.  A disposition the program set itself is left alone.
 */
#include "config.h"

#include <dlfcn.h>
#include <signal.h>
#include <string.h>

#include "core/comm.h"

/* Whether handler h lies in libinfinipath */
static int from_infinipath(void *h)
{
	Dl_info di;
	const char *base;

	if (!dladdr(h, &di) || !di.dli_fname)
		return 0;
	base = strrchr(di.dli_fname, '/');
	base = base ? base + 1 : di.dli_fname;
	return !strncmp(base, "libinfinipath.so", 16);
}

int fep_signals_restore(void)
{
	int sig, n = 0;

	for (sig = 1; sig < NSIG; sig++) {
		struct sigaction sa;
		void *h;

		if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa))
			continue;
		h = sa.sa_flags & SA_SIGINFO ? (void *)sa.sa_sigaction :
					       (void *)sa.sa_handler;
		if (h == (void *)SIG_DFL || h == (void *)SIG_IGN ||
		    !from_infinipath(h))
			continue;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigemptyset(&sa.sa_mask);
		if (!sigaction(sig, &sa, NULL))
			n++;
	}
	return n;
}

__attribute__((constructor)) static void fep_signals_at_load(void)
{
	(void)fep_signals_restore();
}
