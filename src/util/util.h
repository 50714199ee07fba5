/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * util.h - logging, environment parsing, errors, time.  The bottom layer:
 * uses nothing else of fabep.
 */
#ifndef FEP_UTIL_H
#define FEP_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdarg.h>
#include <time.h>

#include "fabep.h"

#define FEP_EXPORT __attribute__((visibility("default")))

#define fep_container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#define FEP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FEP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define FEP_ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define FEP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ---- logging ---- */
enum fep_log_level {
	FEP_LOG_NONE = 0,
	FEP_LOG_ERROR,
	FEP_LOG_WARN,
	FEP_LOG_INFO,
	FEP_LOG_DEBUG,
};

int fep_log_level(void);
void fep_log_set_rank(int rank);
void fep_log(int level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Keep text, error messages that another thread logged (and printed) for
 * this thread's call, for this thread's fabep_last_error(). */
void fep_log_adopt(const char *text);

/* Error messages reach fep_log whatever FABEP_LOG says: it keeps them for
 * fabep_last_error() and prints only what the level allows. */
#define FEP_LOG_(lvl, ...)                                                   \
	do {                                                                 \
		if ((lvl) == FEP_LOG_ERROR || fep_log_level() >= (lvl))      \
			fep_log((lvl), __FILE__, __LINE__, __VA_ARGS__);     \
	} while (0)
#define fep_err(...) FEP_LOG_(FEP_LOG_ERROR, __VA_ARGS__)
#define fep_warn(...) FEP_LOG_(FEP_LOG_WARN, __VA_ARGS__)
#define fep_info(...) FEP_LOG_(FEP_LOG_INFO, __VA_ARGS__)
#define fep_dbg(...) FEP_LOG_(FEP_LOG_DEBUG, __VA_ARGS__)

/* ---- memory ---- */
/* Buffers of rows that the library fills and its callers read in full
 * (the received rows of a dispatch) take size bytes from here and go
 * back with free(): from FEP_HUGE_PAGE up aligned to it and advised as
 * transparent huge pages, as the heap is (mr.c).  Reading or writing
 * rows over 4 KiB pages takes a page walk every 4 KiB, which on some
 * virtual machines costs more than the copy itself.  Where the kernel
 * has no THP, or it is off, the advice fails and 4 KiB pages remain.
 * NULL (errno set) when the memory is not there. */
#define FEP_HUGE_PAGE ((size_t)2 << 20)
void *fep_huge_alloc(size_t size);

/* ---- environment ---- */
/* Each returns 0 when the variable is unset (out untouched), 1 when set and
 * parsed, -EINVAL (logged, naming the variable) when set but malformed. */
int fep_env_str(const char *name, const char **out);
int fep_env_long(const char *name, long min, long max, long *out);
int fep_env_size(const char *name, size_t min, size_t max, size_t *out);
/* Parse "123", "64k", "4M", "1G" (binary units). */
int fep_parse_size(const char *s, size_t *out);
int fep_parse_long(const char *s, long min, long max, long *out);
/* "host:port" (IPv4, IPv6 in [brackets], or a name). */
int fep_parse_hostport(const char *s, char *host, size_t hostlen, int *port);

/* ---- CPUs ---- */
/* The CPUs the CPU bandwidth limit of this process's cgroup allows
 * (quota / period rounded up; the tightest on the path to the root,
 * cgroup v1 or v2), 0 where none is set or none can be read.  _at reads
 * the cgroup mounts under root and the process's cgroups from the file
 * self (the format of /proc/self/cgroup). */
int fep_cgroup_cpus(void);
int fep_cgroup_cpus_at(const char *root, const char *self);
/* The physical core of CPU cpu, from sysfs, as a key equal for the
 * hardware threads of one core (package and core id), or a key of its
 * own (negative) where the topology is unknown. */
int fep_cpu_core_key(int cpu);

/* ---- caller-allocated structs (fabep.h, "Extensible structs") ---- */
/* The size of a layout of `type` that ends with member m: its end,
 * rounded up to the alignment of the struct (as sizeof is). */
#define FEP_SIZEOF_TO(type, m)                                               \
	FEP_ALIGN_UP(offsetof(type, m) + sizeof(((type *)0)->m), _Alignof(type))
/* The first extensible layouts (fabep 0.2): the smallest size accepted,
 * sizeof each struct in 0.2.  Fields appended later start at or after
 * these ends (never in 0.2's tail padding, which callers need not zero)
 * and raise no struct's alignment. */
#define FEP_COMM_ATTR_SIZE0 FEP_SIZEOF_TO(fabep_comm_attr_t, numa_node)
#define FEP_MOE_CONFIG_SIZE0 FEP_SIZEOF_TO(fabep_moe_config_t, flags)
#define FEP_RMSNORM_PARAMS_SIZE0 FEP_SIZEOF_TO(fabep_rmsnorm_params_t, residual)
#define FEP_MOE_RECV_SIZE0 FEP_SIZEOF_TO(fabep_moe_recv_t, scale_stride)
#define FEP_MOE_TIMING_SIZE0 FEP_SIZEOF_TO(fabep_moe_timing_t, combine_wire_bytes)
#define FEP_PROVIDER_DESC_SIZE0 FEP_SIZEOF_TO(fabep_provider_desc_t, numa_node)

/* Copy the caller's input struct src (of type name `type`, checked for
 * function fn) into dst, `known` bytes: its size checked against `min`,
 * bytes past `known` required zero, fields past its size zeroed.  0,
 * -EINVAL or -E2BIG, logged. */
int fep_struct_in(const char *fn, const char *type, void *dst, size_t known,
		  size_t min, const void *src);
/* Check the size field of the caller's output struct dst; *size gets it.
 * 0 or -EINVAL, logged. */
int fep_struct_out_size(const char *fn, const char *type, const void *dst,
			size_t min, size_t *size);
/* Write src (`known` bytes) to dst up to min(size, known), leaving
 * dst's size field alone. */
void fep_struct_out(void *dst, size_t size, const void *src, size_t known);

/* ---- time ---- */
static inline uint64_t fep_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- waiting ---- */
/* Spin-then-yield backoff for waits: call once per failed poll. */
struct fep_backoff {
	unsigned spins;
	uint64_t t0;   /* when the yield phase began */
};
void fep_backoff_step(struct fep_backoff *b);

/* ---- test-only fault injection ---- */
/* Where fep_test_fault.step names a step (a libfabric call such as
 * "fi_domain" or "fi_write", or "heap_map", "pthread_create"), the nth
 * call of that step in this process from then on fails with code, as the
 * provider or the system would fail it; the error paths that only real
 * providers and exhausted machines reach run so in the tests.  step is
 * NULL outside them.  Set it before the threads that take the step start. */
struct fep_fault {
	const char *step;
	unsigned nth;        /* the call that fails, from 1; 0: every call */
	int code;            /* what it returns: -errno or -FI_* */
	unsigned seen;       /* calls of the step so far (atomic) */
	unsigned hits;       /* faults injected (atomic) */
};
extern struct fep_fault fep_test_fault;
int fep_fault_hit(const char *step);
/* call, or the injected code where the fault is armed for step what;
 * call is then not made */
#define FEP_FAULT(what, call)                                                \
	(fep_test_fault.step && fep_fault_hit(what) ? fep_test_fault.code : (call))

#endif
