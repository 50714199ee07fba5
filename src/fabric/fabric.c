/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * fabric.c - provider choice, endpoint, address vector, completion queues
 * and progress.
 *
 * A provider is chosen among those that offer FI_RMA on FI_EP_RDM with
 * FI_AV_TABLE: FABEP_PROVIDER/FABEP_DOMAIN when given, else shm when every
 * rank shares this host, else a NIC provider before tcp before sockets.
 * Every mr_mode bit is requested and what the provider grants is honoured
 * (mr.c).  Each candidate is described (fep_fabric_describe) by asking
 * fi_getinfo again for each capability fabep may need (write-after-write
 * ordering, FI_FENCE, FI_DELIVERY_COMPLETE, FI_ATOMIC) and by
 * fi_query_atomic; the signal strategy follows from that (signal.c).
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>
#include <signal.h>
#include <dirent.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/statvfs.h>

#include "util/util.h"
#include "fabric/fabric.h"

#define FEP_BLOB_MAGIC 0xfab3b10bu
#define FEP_CQ_BATCH 32

enum { PROBE_ATOMIC = 1, PROBE_FENCE = 2, PROBE_ORDER = 4, PROBE_DELIVERY = 8 };

static const uint64_t fep_mr_mode_all =
	FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
	FI_MR_ENDPOINT | FI_MR_RAW | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT;

static struct fi_info *fep_hints(const char *prov, const char *fabric,
				 const char *dom, unsigned probe)
{
	struct fi_info *h = fi_allocinfo();

	if (!h)
		return NULL;
	h->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ;
	if (probe & PROBE_ATOMIC)
		h->caps |= FI_ATOMIC;
	if (probe & PROBE_FENCE)
		h->caps |= FI_FENCE;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = (int)fep_mr_mode_all;
	h->domain_attr->av_type = FI_AV_TABLE;
	h->domain_attr->threading = FI_THREAD_DOMAIN;
	/* Manual progress: fabep's waits drive it.  Except sockets, whose
	 * manual mode loses RMA traffic when both sides of a pair write
	 * (seen with 1.17: warm-up exchanges that never complete); its own
	 * progress thread is reliable. */
	if (prov && fep_prov_is(prov, "sockets")) {
		h->domain_attr->data_progress = FI_PROGRESS_AUTO;
		h->domain_attr->control_progress = FI_PROGRESS_AUTO;
	} else {
		h->domain_attr->data_progress = FI_PROGRESS_MANUAL;
		h->domain_attr->control_progress = FI_PROGRESS_MANUAL;
	}
	if (probe & PROBE_ORDER) {
		h->tx_attr->msg_order = FI_ORDER_WAW;
		h->rx_attr->msg_order = FI_ORDER_WAW;
	}
	if (probe & PROBE_DELIVERY)
		h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	if (prov && !(h->fabric_attr->prov_name = strdup(prov)))
		goto err;
	if (fabric && !(h->fabric_attr->name = strdup(fabric)))
		goto err;
	if (dom && !(h->domain_attr->name = strdup(dom)))
		goto err;
	return h;
err:
	fi_freeinfo(h);
	return NULL;
}

static int fep_getinfo(const char *prov, const char *fabric, const char *dom,
		       unsigned probe, struct fi_info **out)
{
	struct fi_info *h = fep_hints(prov, fabric, dom, probe);
	int ret;

	if (!h) {
		fep_err("fi_allocinfo: out of memory");
		return -ENOMEM;
	}
	ret = FEP_FAULT("fi_getinfo",
			fi_getinfo(FEP_FI_VERSION, NULL, NULL, 0, h, out));
	fi_freeinfo(h);
	return ret;
}

/* The same provider/fabric/domain again with extra capabilities; NULL if
 * not granted. */
static struct fi_info *fep_probe(const struct fi_info *base, unsigned probe)
{
	struct fi_info *list = NULL, *it, *hit = NULL;

	if (fep_getinfo(base->fabric_attr->prov_name, base->fabric_attr->name,
			base->domain_attr->name, probe, &list))
		return NULL;
	for (it = list; it; it = it->next) {
		if (strcmp(it->fabric_attr->prov_name,
			   base->fabric_attr->prov_name) ||
		    strcmp(it->domain_attr->name, base->domain_attr->name) ||
		    it->addr_format != base->addr_format)
			continue;
		if ((probe & PROBE_ORDER) &&
		    (!(it->tx_attr->msg_order & FI_ORDER_WAW) ||
		     !(it->rx_attr->msg_order & FI_ORDER_WAW)))
			continue;
		if ((probe & PROBE_FENCE) && !(it->caps & FI_FENCE))
			continue;
		if ((probe & PROBE_ATOMIC) && !(it->caps & FI_ATOMIC))
			continue;
		hit = fi_dupinfo(it);
		break;
	}
	fi_freeinfo(list);
	return hit;
}

bool fep_prov_is(const char *name, const char *core)
{
	size_t n = strlen(core);

	return !strncmp(name, core, n) && (name[n] == '\0' || name[n] == ';');
}

/*
 * libfabric's shm offers no endpoint unless /dev/shm has room for one
 * region per online CPU (1.17's smr_shm_space_check: the CPUs times the
 * region of its default queues, 16 MiB, against f_bsize * f_bavail);
 * fi_getinfo then answers -FI_ENODATA, as if shm were not built in.
 * Containers give /dev/shm 64 MiB by default (Docker), too little for
 * shm on a machine of more than 4 CPUs, so the cause is worth naming.
 */
#define FEP_SHM_REGION_MIB 16ull

bool fep_shm_short(char *why, size_t len)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	const char *only = getenv("FI_PROVIDER");
	unsigned long long avail, need;
	struct statvfs st;

	/* shm left out by the user's FI_PROVIDER ("tcp", "^shm"): nothing
	 * to explain */
	if (only && *only && (only[0] == '^') == (strstr(only, "shm") != NULL))
		return false;
	if (cpus < 1 || statvfs("/dev/shm", &st))
		return false;
	avail = (unsigned long long)st.f_bsize * st.f_bavail;
	need = (unsigned long long)cpus * (FEP_SHM_REGION_MIB << 20);
	if (avail >= need)
		return false;
	/* the remedy with room for the regions' pages a run touches */
	snprintf(why, len, "/dev/shm has %llu MiB free, and libfabric's shm "
		 "wants %llu MiB a CPU (%ld CPUs: %llu MiB) before it offers an "
		 "endpoint; enlarge /dev/shm (docker run --shm-size=%llum, or "
		 "--ipc=host)", avail >> 20, FEP_SHM_REGION_MIB, cpus,
		 need >> 20, (need >> 20) * 2);
	return true;
}

static bool list_has_shm(const struct fi_info *list)
{
	for (; list; list = list->next)
		if (fep_prov_is(list->fabric_attr->prov_name, "shm"))
			return true;
	return false;
}

/* Lower is better.  INT_MAX: unusable. */
static int fep_rank_info(const struct fi_info *i, bool all_local)
{
	const char *p = i->fabric_attr->prov_name;
	const char *d = i->domain_attr->name ? i->domain_attr->name : "";
	bool lo = !strcmp(d, "lo");
	int base;

	if (fep_prov_is(p, "shm"))
		return all_local ? 0 : INT_MAX;
	if (fep_prov_is(p, "verbs") || fep_prov_is(p, "efa") ||
	    fep_prov_is(p, "cxi") || fep_prov_is(p, "psm3") ||
	    fep_prov_is(p, "psm2") || fep_prov_is(p, "opx") ||
	    fep_prov_is(p, "ucx"))
		base = 100;
	else if (fep_prov_is(p, "tcp"))
		base = 200;
	else if (fep_prov_is(p, "net"))
		base = 300;
	else if (fep_prov_is(p, "sockets"))
		base = 400;
	else if (fep_prov_is(p, "udp"))
		base = 500;
	else
		base = 450;
	/* On one host, loopback; across hosts, a real interface. */
	if (lo != all_local)
		base += 20;
	if (i->addr_format != FI_SOCKADDR_IN)
		base += 10;
	return base;
}

static int pci_numa_node(const struct fi_info *info)
{
	struct fi_pci_attr *pci;
	char path[128];
	FILE *f;
	int node = -1;

	if (!info->nic || !info->nic->bus_attr ||
	    info->nic->bus_attr->bus_type != FI_BUS_PCI)
		return -1;
	pci = &info->nic->bus_attr->attr.pci;
	snprintf(path, sizeof(path),
		 "/sys/bus/pci/devices/%04x:%02x:%02x.%x/numa_node",
		 pci->domain_id, pci->bus_id, pci->device_id, pci->function_id);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1)
		node = -1;
	fclose(f);
	return node;
}

static size_t query_atomic_count(struct fi_info *info)
{
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	struct fi_atomic_attr attr = { 0 };
	size_t count = 0;

	/* 1.17's net provider advertises FI_ATOMIC but returns -FI_ENOSYS. */
	if (fep_prov_is(info->fabric_attr->prov_name, "net"))
		return 0;
	if (fi_fabric(info->fabric_attr, &fabric, NULL))
		return 0;
	if (fi_domain(fabric, info, &domain, NULL))
		goto out;
	if (!fi_query_atomic(domain, FI_UINT64, FI_SUM, &attr, 0))
		count = attr.count;
	fi_close(&domain->fid);
out:
	fi_close(&fabric->fid);
	return count;
}

int fep_fab_test_no_dc;

int fep_fabric_describe(struct fi_info *info, fabep_provider_desc_t *d)
{
	struct fi_info *atom, *p;
	int s;

	memset(d, 0, sizeof(*d));
	d->size = sizeof(*d);
	snprintf(d->provider, sizeof(d->provider), "%s",
		 info->fabric_attr->prov_name);
	snprintf(d->fabric, sizeof(d->fabric), "%s",
		 info->fabric_attr->name ? info->fabric_attr->name : "");
	snprintf(d->domain, sizeof(d->domain), "%s",
		 info->domain_attr->name ? info->domain_attr->name : "");
	d->caps = info->caps;
	d->mode = info->mode;
	d->mr_mode = info->domain_attr->mr_mode;
	d->inject_size = info->tx_attr->inject_size;
	d->max_msg_size = info->ep_attr->max_msg_size;
	d->rma_iov_limit = info->tx_attr->rma_iov_limit;
	d->cq_data_size = info->domain_attr->cq_data_size;
	d->numa_node = pci_numa_node(info);

	atom = fep_probe(info, PROBE_ATOMIC);
	if (atom) {
		d->caps |= atom->caps & FI_ATOMIC;
		d->atomic_count = query_atomic_count(atom);
		d->atomic_sum_u64 = d->atomic_count > 0;
		fi_freeinfo(atom);
	}
	if ((p = fep_probe(info, PROBE_ATOMIC | PROBE_ORDER))) {
		d->msg_order = p->tx_attr->msg_order & p->rx_attr->msg_order;
		fi_freeinfo(p);
	}
	if ((p = fep_probe(info, PROBE_ATOMIC | PROBE_FENCE))) {
		d->fence = 1;
		fi_freeinfo(p);
	}
	if (!fep_fab_test_no_dc && (p = fep_probe(info, PROBE_DELIVERY))) {
		d->delivery_complete = 1;
		fi_freeinfo(p);
	}
	for (s = FABEP_SIGNAL_ORDERED; s <= FABEP_SIGNAL_CMA; s++)
		if (fep_signal_supported(d, (fabep_signal_t)s))
			d->signals |= 1u << s;
	d->signal = fep_signal_choose(d, d->signal_why, sizeof(d->signal_why));
	return 0;
}

FEP_EXPORT int fabep_provider_list(const char *provider,
				   fabep_provider_desc_t *descs, int max,
				   int *count)
{
	struct fi_info *list = NULL, *it;
	fabep_provider_desc_t *d = NULL;
	size_t stride = 0, len = 0;
	int n = 0, i, ret;

	if (!count || max < 0 || (max > 0 && !descs)) {
		fep_err("fabep_provider_list: NULL count or descs, or max < 0");
		return -EINVAL;
	}
	/* descs[0].size is the caller's element size, the array's stride */
	if (max > 0) {
		ret = fep_struct_out_size("fabep_provider_list",
					  "fabep_provider_desc_t", descs,
					  FEP_PROVIDER_DESC_SIZE0, &stride);
		if (ret)
			return ret;
	}
	ret = fep_getinfo(provider, NULL, NULL, 0, &list);
	/* shm asked for, or any provider, and shm not offered for lack of
	 * room: a caller (fabep_info) would otherwise not learn why */
	if ((ret == -FI_ENODATA || (!ret && !list_has_shm(list))) &&
	    (!provider || fep_prov_is(provider, "shm"))) {
		char why[320];

		if (fep_shm_short(why, sizeof(why)))
			fep_warn("shm is not offered: %s", why);
	}
	if (ret == -FI_ENODATA) {
		*count = 0;
		return 0;
	}
	if (ret) {
		fep_err("fi_getinfo: %s", fi_strerror(-ret));
		return ret;
	}
	for (it = list; it; it = it->next)
		len++;
	/* described here, written to the caller's array on success */
	if (max > 0 && !(d = calloc(FEP_MIN(len, (size_t)max), sizeof(*d)))) {
		fep_err("fabep_provider_list: out of memory");
		fi_freeinfo(list);
		return -ENOMEM;
	}
	for (it = list; it && n < max; it = it->next) {
		int j, dup = 0;

		/* one row per provider + domain + address format */
		for (j = 0; j < n; j++)
			if (!strcmp(d[j].provider, it->fabric_attr->prov_name) &&
			    !strcmp(d[j].fabric, it->fabric_attr->name) &&
			    !strcmp(d[j].domain, it->domain_attr->name))
				dup = 1;
		if (dup)
			continue;
		fep_fabric_describe(it, &d[n]);
		n++;
	}
	fi_freeinfo(list);
	for (i = 0; i < n; i++) {
		char *e = (char *)descs + (size_t)i * stride;

		fep_struct_out(e, stride, &d[i], sizeof(d[i]));
		memcpy(e, &stride, sizeof(stride));
	}
	free(d);
	*count = n;
	return 0;
}

/* Choose the provider entry.  Returns a dup'ed fi_info or NULL + error. */
static int fep_choose_info(const struct fep_fab_params *p,
			   struct fi_info **out)
{
	struct fi_info *list = NULL, *it, *best = NULL;
	int best_rank = INT_MAX, ret;

	ret = fep_getinfo(p->provider, NULL, p->domain, 0, &list);
	if (ret && ret != -FI_ENODATA) {
		/* not "nothing matches" (out of memory, a provider that
		 * failed to start): the call's own error */
		fep_err("fi_getinfo: %s", fi_strerror(-ret));
		return ret;
	}
	if (ret) {
		char why[320];

		if (p->provider && fep_prov_is(p->provider, "shm") &&
		    fep_shm_short(why, sizeof(why)))
			fep_err("provider \"%s\" offers no RMA endpoint here: %s",
				p->provider, why);
		else if (p->provider)
			fep_err("provider \"%s\"%s%s%s offers no RMA endpoint here "
				"(fi_getinfo: %s); see fabep_info for what is available",
				p->provider, p->domain ? " with domain \"" : "",
				p->domain ? p->domain : "", p->domain ? "\"" : "",
				fi_strerror(-ret));
		else
			fep_err("no libfabric provider offers RMA on an RDM endpoint "
				"(fi_getinfo: %s)", fi_strerror(-ret));
		return -FABEP_ERR_NO_PROVIDER;
	}
	for (it = list; it; it = it->next) {
		int r = fep_rank_info(it, p->all_local);

		/* providers do not all filter on the domain hint (1.17's tcp
		 * and shm answer with their own whatever it names) */
		if (p->domain && (!it->domain_attr->name ||
				  strcmp(it->domain_attr->name, p->domain)))
			continue;
		/* an explicitly named provider is used even where the ranking
		 * would exclude it (e.g. shm asked for across hosts) */
		if (r == INT_MAX && p->provider)
			r = INT_MAX - 1;
		if (r < best_rank) {
			best_rank = r;
			best = it;
		}
	}
	if (!best && p->domain) {
		char doms[256];
		size_t l = 0;

		doms[0] = '\0';
		for (it = list; it && l < sizeof(doms); it = it->next)
			if (it->domain_attr->name && !strstr(doms, it->domain_attr->name))
				l += (size_t)snprintf(doms + l, sizeof(doms) - l, "%s%s",
						      l ? ", " : "", it->domain_attr->name);
		fep_err("no domain \"%s\"%s%s%s offers an RMA endpoint here "
			"(domains offered: %s); see fabep_info", p->domain,
			p->provider ? " of provider \"" : "",
			p->provider ? p->provider : "", p->provider ? "\"" : "",
			doms[0] ? doms : "none");
		fi_freeinfo(list);
		return -FABEP_ERR_NO_PROVIDER;
	}
	if (!best || best_rank == INT_MAX) {
		fep_err("no usable provider: shm needs every rank on one host "
			"and no network provider offers RMA");
		fi_freeinfo(list);
		return -FABEP_ERR_NO_PROVIDER;
	}
	/* on one host shm was the choice; say once why another is taken */
	if (!p->provider && p->all_local && !p->rank && !p->heap_of &&
	    !list_has_shm(list)) {
		char why[320];

		if (fep_shm_short(why, sizeof(why)))
			fep_warn("shm is not offered: %s; %s is taken instead, "
				 "several times slower between the processes of "
				 "one host", why, best->fabric_attr->prov_name);
	}
	*out = fi_dupinfo(best);
	fi_freeinfo(list);
	if (!*out) {
		fep_err("fi_dupinfo: out of memory");
		return -ENOMEM;
	}
	return 0;
}

static int fep_ops_create(fep_fabric_t *fab)
{
	size_t i, n = fab->info->tx_attr->size;
	int ret;

	if (n < 64)
		n = 64;
	if (n > 4096)
		n = 4096;
	fab->nops = n;
	fab->ops = calloc(n, sizeof(*fab->ops));
	if (!fab->ops)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		fab->ops[i].next = i + 1 < n ? &fab->ops[i + 1] : NULL;
	}
	fab->free_ops = fab->ops;
	if (fab->mr_mode & FI_MR_LOCAL) {
		ret = FEP_FAULT("fi_mr_reg",
				fi_mr_reg(fab->domain, fab->ops,
					  n * sizeof(*fab->ops), FI_READ | FI_WRITE,
					  0, 0xfab0f00dull, 0, &fab->ops_mr, NULL));
		if (ret) {
			fep_err("fi_mr_reg(operation pool): %s", fi_strerror(-ret));
			free(fab->ops);
			fab->ops = fab->free_ops = NULL;
			return ret;
		}
		fab->ops_desc = fi_mr_desc(fab->ops_mr);
	}
	return 0;
}

/*
 * shm names its region /dev/shm/<pid>:<uid>:<endpoint> (1.17 to 1.22) and fails
 * with -FI_EBUSY when that name exists.  A process killed before it closed
 * its endpoint leaves its region behind, and a later process that gets the
 * same pid then cannot open shm, and the region's memory stays taken.  A
 * region named after this process's own pid can only be such a leftover:
 * fep_fabric_open removes it; launchers remove those of the ranks they
 * reap (fabep_shm_cleanup).  Returns how many were removed.
 */
int fep_shm_remove_regions(pid_t pid)
{
	char prefix[32], path[300];
	struct dirent *e;
	int removed = 0;
	size_t n;
	DIR *d;

	n = (size_t)snprintf(prefix, sizeof(prefix), "%d:", (int)pid);
	d = opendir("/dev/shm");
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		const char *rest = e->d_name + n;

		if (strncmp(e->d_name, prefix, n) || !strchr(rest, ':') ||
		    strspn(rest, "0123456789:") != strlen(rest))
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
		if (!unlink(path)) {
			fep_info("removed %s, left by a dead process", path);
			removed++;
		}
	}
	closedir(d);
	return removed;
}

FEP_EXPORT int fabep_shm_cleanup(long pid)
{
	if (pid <= 0 || pid != (long)(pid_t)pid) {
		fep_err("fabep_shm_cleanup: pid %ld is not a process id", pid);
		return -EINVAL;
	}
	/* a live process (or one of another user: EPERM) keeps its own */
	if (!kill((pid_t)pid, 0) || errno == EPERM) {
		fep_err("fabep_shm_cleanup: process %ld is alive", pid);
		return -EBUSY;
	}
	return fep_shm_remove_regions((pid_t)pid);
}

/* Take strategy s out of what this fabric may use, saying why, and
 * choose again if it was the provider's default. */
static void fep_signal_drop(fep_fabric_t *fab, const struct fep_fab_params *p,
			    fabep_signal_t s, const char *why)
{
	if (!(fab->desc.signals & (1u << s)))
		return;
	if (p->signal == s)
		fep_err("signal strategy %s cannot be used here: %s",
			fep_signal_name(s), why);
	else
		fep_dbg("signal strategy %s not usable here: %s",
			fep_signal_name(s), why);
	fab->desc.signals &= ~(1u << s);
	if (fab->desc.signal == s)
		fab->desc.signal = fep_signal_choose(&fab->desc,
						     fab->desc.signal_why,
						     sizeof(fab->desc.signal_why));
}

/*
 * Choose the signal strategy: the one asked for, or the provider's best.
 * Strategies this fabric cannot use (cma without cma between every pair
 * of ranks; cqdata where a put may need FI_DELIVERY_COMPLETE the
 * provider lacks) are taken out first.
 * Writes why it was chosen into why.
 */
static int fep_signal_select(const struct fep_fab_params *p, fep_fabric_t *fab,
			     char *why, size_t whylen)
{
	size_t msg_max = fab->desc.max_msg_size ? fab->desc.max_msg_size : SIZE_MAX;

	if (fep_fab_test_msg_max && msg_max > fep_fab_test_msg_max)
		msg_max = fep_fab_test_msg_max;
	/* some rank cannot process_vm_writev some other: shm would take its
	 * receiver-driven path, where a local completion does not mean the
	 * data is in place */
	if (!p->cma_peers)
		fep_signal_drop(fab, p, FABEP_SIGNAL_CMA, "some rank cannot "
				"process_vm_writev some other");
	/* a put of the heap past one message sends its head with
	 * FI_DELIVERY_COMPLETE before the tail that carries the CQ data */
	if (msg_max < p->heap_size && !fab->desc.delivery_complete)
		fep_signal_drop(fab, p, FABEP_SIGNAL_CQDATA, "a put can exceed "
				"max_msg_size and the provider has no "
				"FI_DELIVERY_COMPLETE");

	if (p->signal == FABEP_SIGNAL_AUTO) {
		fab->signal = fab->desc.signal;
		snprintf(why, whylen, "%s", fab->desc.signal_why);
		if (!fab->signal) {
			fep_err("provider %s (domain %s) offers no way to signal: "
				"no usable atomics and no remote CQ data",
				fab->desc.provider, fab->desc.domain);
			return -FABEP_ERR_NO_SIGNAL;
		}
	} else {
		if (!(fab->desc.signals & (1u << p->signal))) {
			fep_err("signal strategy \"%s\" is not supported by provider "
				"%s (domain %s): usable here:%s%s%s%s%s",
				fep_signal_name(p->signal), fab->desc.provider,
				fab->desc.domain,
				(fab->desc.signals & (1u << FABEP_SIGNAL_ORDERED)) ? " ordered" : "",
				(fab->desc.signals & (1u << FABEP_SIGNAL_FENCE)) ? " fence" : "",
				(fab->desc.signals & (1u << FABEP_SIGNAL_DELIVERY)) ? " delivery" : "",
				(fab->desc.signals & (1u << FABEP_SIGNAL_CQDATA)) ? " cqdata" : "",
				(fab->desc.signals & (1u << FABEP_SIGNAL_CMA)) ? " cma" : "");
			return -FABEP_ERR_NO_SIGNAL;
		}
		fab->signal = p->signal;
		snprintf(why, whylen, "requested");
	}
	return 0;
}

/*
 * Ask the provider again for the capabilities fab->signal needs.  Returns
 * the granted fi_info in *out, or an error with nothing to free.
 */
static int fep_signal_probe(fep_fabric_t *fab, const struct fi_info *base,
			    struct fi_info **out)
{
	struct fi_info *info;
	unsigned probe;

	switch (fab->signal) {
	case FABEP_SIGNAL_ORDERED: probe = PROBE_ATOMIC | PROBE_ORDER; break;
	case FABEP_SIGNAL_FENCE: probe = PROBE_ATOMIC | PROBE_FENCE; break;
	case FABEP_SIGNAL_DELIVERY: probe = PROBE_ATOMIC; break;
	case FABEP_SIGNAL_CMA: probe = PROBE_ATOMIC; break;
	default: probe = 0; break;
	}
	info = fep_probe(base, probe);
	if (!info) {
		fep_err("provider %s refused the capabilities of signal strategy %s",
			fab->desc.provider, fep_signal_name(fab->signal));
		return -FABEP_ERR_NO_SIGNAL;
	}
	/* cma relies on shm's fast path, which its domain takes only with
	 * FI_MR_VIRT_ADDR and no RMA ordering (smr_fast_rma_enabled), and
	 * a write only without FI_DELIVERY_COMPLETE */
	if (fab->signal == FABEP_SIGNAL_CMA &&
	    (!(info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ||
	     (info->tx_attr->msg_order & (FI_ORDER_RAR | FI_ORDER_RAW |
					  FI_ORDER_WAR | FI_ORDER_WAW |
					  FI_ORDER_RMA_WAW | FI_ORDER_RMA_RAW |
					  FI_ORDER_RMA_WAR | FI_ORDER_RMA_RAR)) ||
	     (info->tx_attr->op_flags & FI_DELIVERY_COMPLETE))) {
		fep_err("provider %s granted ordering 0x%llx, mr_mode 0x%x, op "
			"flags 0x%llx: its fast path is off, signal strategy cma "
			"cannot be used", fab->desc.provider,
			(unsigned long long)info->tx_attr->msg_order,
			info->domain_attr->mr_mode,
			(unsigned long long)info->tx_attr->op_flags);
		fi_freeinfo(info);
		return -FABEP_ERR_NO_SIGNAL;
	}
	*out = info;
	return 0;
}

uint64_t fep_fab_test_mr_mode;
size_t fep_fab_test_cq_data_max;
size_t fep_fab_test_msg_max;
size_t fep_fab_test_iov_max;

/* Keep the granted info and the limits the data path reads from it. */
static void fep_fabric_take_info(fep_fabric_t *fab, struct fi_info *info,
				 const char *why)
{
	fab->info = info;
	fab->inject_size = info->tx_attr->inject_size;
	fab->max_msg_size = info->ep_attr->max_msg_size ? info->ep_attr->max_msg_size : SIZE_MAX;
	if (fep_fab_test_msg_max && fab->max_msg_size > fep_fab_test_msg_max)
		fab->max_msg_size = fep_fab_test_msg_max;
	fab->mr_mode = info->domain_attr->mr_mode | fep_fab_test_mr_mode;
	fab->iov_max = FEP_MAX((size_t)1, FEP_MIN(info->tx_attr->iov_limit,
						  (size_t)FEP_IOV_MAX));
	if (fep_fab_test_iov_max && fab->iov_max > fep_fab_test_iov_max)
		fab->iov_max = fep_fab_test_iov_max;
	fab->cq_data_size = info->domain_attr->cq_data_size;
	if (fep_fab_test_cq_data_max && fab->cq_data_size > fep_fab_test_cq_data_max)
		fab->cq_data_size = fep_fab_test_cq_data_max;
	fab->atomic_count = fab->desc.atomic_count;
	fab->cq_idx_bits = fab->cq_data_size >= 8 ? 40 : 24;
	/* tcp;ofi_rxm pushes a write into its socket only inside this rank's
	 * progress: a 30 MB run left half sent when dispatch returned held its
	 * receiver for the 0.5-0.9 s of the caller's next computation */
	fab->tx_progress = fep_prov_is(info->fabric_attr->prov_name, "tcp") ||
			   fep_prov_is(info->fabric_attr->prov_name, "udp") ||
			   fep_prov_is(info->fabric_attr->prov_name, "net") ||
			   fep_prov_is(info->fabric_attr->prov_name, "efa");
	fep_info("provider %s, fabric %s, domain %s, signal %s (%s), mr_mode 0x%x, "
		 "inject %zu, max_msg %zu", info->fabric_attr->prov_name,
		 info->fabric_attr->name, info->domain_attr->name,
		 fep_signal_name(fab->signal), why, fab->mr_mode,
		 fab->inject_size, fab->max_msg_size);
}

/* Open fab->fabric and fab->domain; on error neither is left open. */
static int fep_fabric_open_domain(const struct fep_fab_params *p,
				  fep_fabric_t *fab)
{
	struct fi_info *info = fab->info;
	int ret;

	if (fep_prov_is(info->fabric_attr->prov_name, "shm") && !p->heap_of)
		fep_shm_remove_regions(getpid());
	ret = FEP_FAULT("fi_fabric", fi_fabric(info->fabric_attr, &fab->fabric, NULL));
	if (ret) {
		fep_err("fi_fabric(%s): %s", info->fabric_attr->prov_name, fi_strerror(-ret));
		return ret;
	}
	ret = FEP_FAULT("fi_domain", fi_domain(fab->fabric, info, &fab->domain, NULL));
	if (ret) {
		fep_err("fi_domain(%s): %s", info->domain_attr->name, fi_strerror(-ret));
		goto err_fabric;
	}
	return 0;

err_fabric:
	fi_close(&fab->fabric->fid);
	return ret;
}

/*
 * Open the completion queues, the address vector and the endpoint, and bind
 * them together; on error none is left open.
 */
static int fep_fabric_open_ep(const struct fep_fab_params *p, fep_fabric_t *fab)
{
	struct fi_info *info = fab->info;
	struct fi_cq_attr cq_attr = { 0 };
	struct fi_av_attr av_attr = { 0 };
	int ret;

	cq_attr.format = FI_CQ_FORMAT_DATA;
	cq_attr.wait_obj = FI_WAIT_NONE;
	cq_attr.size = FEP_MAX(info->tx_attr->size, 1024);
	ret = FEP_FAULT("fi_cq_open",
			fi_cq_open(fab->domain, &cq_attr, &fab->txcq, NULL));
	if (ret) {
		fep_err("fi_cq_open(tx): %s", fi_strerror(-ret));
		return ret;
	}
	/* remote CQ data: one entry per signal from every sender */
	cq_attr.size = FEP_MAX(FEP_MAX(info->rx_attr->size, 1024),
			       (size_t)p->size * 256);
	ret = FEP_FAULT("fi_cq_open",
			fi_cq_open(fab->domain, &cq_attr, &fab->rxcq, NULL));
	if (ret) {
		fep_err("fi_cq_open(rx): %s", fi_strerror(-ret));
		goto err_txcq;
	}
	av_attr.type = FI_AV_TABLE;
	av_attr.count = (size_t)p->size;
	ret = FEP_FAULT("fi_av_open",
			fi_av_open(fab->domain, &av_attr, &fab->av, NULL));
	if (ret) {
		fep_err("fi_av_open: %s", fi_strerror(-ret));
		goto err_rxcq;
	}
	ret = FEP_FAULT("fi_endpoint", fi_endpoint(fab->domain, info, &fab->ep, NULL));
	if (ret) {
		fep_err("fi_endpoint: %s", fi_strerror(-ret));
		goto err_av;
	}
	if ((ret = FEP_FAULT("fi_ep_bind", fi_ep_bind(fab->ep, &fab->av->fid, 0))) ||
	    (ret = fi_ep_bind(fab->ep, &fab->txcq->fid, FI_TRANSMIT)) ||
	    (ret = fi_ep_bind(fab->ep, &fab->rxcq->fid, FI_RECV))) {
		fep_err("fi_ep_bind: %s", fi_strerror(-ret));
		goto err_ep;
	}
	return 0;

err_ep:
	fi_close(&fab->ep->fid);
err_av:
	fi_close(&fab->av->fid);
err_rxcq:
	fi_close(&fab->rxcq->fid);
err_txcq:
	fi_close(&fab->txcq->fid);
	return ret;
}

/*
 * Memory the endpoint works on: the operation pool and the symmetric heap
 * (this channel's own or shared with channel 0), registered and bound once
 * the endpoint is enabled.  On error neither is left.
 */
static int fep_fabric_open_memory(const struct fep_fab_params *p,
				  fep_fabric_t *fab)
{
	int ret;

	ret = fep_ops_create(fab);
	if (ret)
		return ret;
	ret = p->heap_of ? fep_heap_share(fab, p->heap_of) :
		fep_heap_create(fab, p->heap_size, p->numa_node);
	if (ret)
		goto err_ops;
	ret = FEP_FAULT("fi_enable", fi_enable(fab->ep));
	if (ret) {
		fep_err("fi_enable: %s", fi_strerror(-ret));
		goto err_heap;
	}
	ret = fep_heap_bind(fab);
	if (ret)
		goto err_heap;
	return 0;

err_heap:
	fep_heap_destroy(fab);
err_ops:
	if (fab->ops_mr)
		fi_close(&fab->ops_mr->fid);
	free(fab->ops);
	return ret;
}

int fep_fabric_open(const struct fep_fab_params *p, fep_fabric_t **out)
{
	fep_fabric_t *fab;
	struct fi_info *base = NULL, *info = NULL;
	char why[192];
	int ret;

	fab = calloc(1, sizeof(*fab));
	if (!fab)
		return -ENOMEM;
	fab->rank = p->rank;
	fab->size = p->size;
	fab->timeout_ms = p->timeout_ms;
	fab->nchan = 1;

	ret = fep_choose_info(p, &base);
	if (ret)
		goto err_free;
	fep_fabric_describe(base, &fab->desc);
	ret = fep_signal_select(p, fab, why, sizeof(why));
	if (ret)
		goto err_base;
	ret = fep_signal_probe(fab, base, &info);
	if (ret)
		goto err_base;
	fep_fabric_take_info(fab, info, why);

	ret = fep_fabric_open_domain(p, fab);
	if (ret)
		goto err_info;
	ret = fep_fabric_open_ep(p, fab);
	if (ret)
		goto err_domain;
	ret = fep_fabric_open_memory(p, fab);
	if (ret)
		goto err_ep;
	fab->peers = calloc((size_t)p->size, sizeof(*fab->peers));
	if (!fab->peers) {
		ret = -ENOMEM;
		goto err_memory;
	}
	fi_freeinfo(base);
	*out = fab;
	return 0;

err_memory:
	fep_heap_destroy(fab);
	if (fab->ops_mr)
		fi_close(&fab->ops_mr->fid);
	free(fab->ops);
err_ep:
	fi_close(&fab->ep->fid);
	fi_close(&fab->av->fid);
	fi_close(&fab->rxcq->fid);
	fi_close(&fab->txcq->fid);
err_domain:
	fi_close(&fab->domain->fid);
	fi_close(&fab->fabric->fid);
err_info:
	fi_freeinfo(info);
err_base:
	fi_freeinfo(base);
err_free:
	free(fab);
	return ret;
}

void fep_fabric_close(fep_fabric_t *fab)
{
	int c;

	if (!fab)
		return;
	/* Reap what can still complete, within a short bound. */
	if (fab->outstanding || fab->nchan > 1) {
		int saved = fab->timeout_ms;

		fab->timeout_ms = FEP_MIN(saved, 1000);
		(void)fep_fabric_quiet(fab);
		fab->timeout_ms = saved;
	}
	/* from the last channel down: a channel's quiet may stall into
	 * this fabric's progress of channels 0..nchan-1, which must then
	 * hold no channel already freed (and still the one closing) */
	for (c = fab->nchan - 1; c >= 1; c--) {
		fab->nchan = c + 1;
		fep_fabric_close(fab->chan[c]);
	}
	fab->nchan = 1;
	free(fab->chan);
	free(fab->slices);
	fi_close(&fab->ep->fid);
	/* FI_MR_RAW: the keys fi_mr_map_raw made hold domain resources */
	for (c = 0; fab->peers && c < fab->size; c++)
		if (fab->peers[c].key_mapped)
			(void)fi_mr_unmap_key(fab->domain, fab->peers[c].key);
	fep_heap_destroy(fab);
	if (fab->ops_mr)
		fi_close(&fab->ops_mr->fid);
	fi_close(&fab->av->fid);
	fi_close(&fab->rxcq->fid);
	fi_close(&fab->txcq->fid);
	fi_close(&fab->domain->fid);
	fi_close(&fab->fabric->fid);
	fi_freeinfo(fab->info);
	free(fab->ops);
	free(fab->peers);
	free(fab);
}

int fep_fabric_blob(fep_fabric_t *fab, struct fep_fab_blob *b)
{
	size_t len = sizeof(b->name);
	int ret;

	memset(b, 0, sizeof(*b));
	b->magic = FEP_BLOB_MAGIC;
	ret = FEP_FAULT("fi_getname", fi_getname(&fab->ep->fid, b->name, &len));
	if (ret) {
		fep_err("fi_getname: %s (address needs %zu bytes, room for %zu)",
			fi_strerror(-ret), len, sizeof(b->name));
		return ret;
	}
	b->name_len = (uint32_t)len;
	b->heap_base = (uint64_t)(uintptr_t)fab->heap;
	b->heap_size = fab->heap_size;
	b->key = fab->heap_key;
	b->signal = (uint32_t)fab->signal;
	snprintf(b->provider, sizeof(b->provider), "%s", fab->desc.provider);
	if (fab->mr_mode & FI_MR_RAW) {
		uint64_t base = 0;
		size_t ksz = sizeof(b->raw_key);

		ret = fi_mr_raw_attr(fab->heap_mr, &base, b->raw_key, &ksz, 0);
		if (ret) {
			fep_err("fi_mr_raw_attr: %s", fi_strerror(-ret));
			return ret;
		}
		b->raw_key_len = (uint32_t)ksz;
		b->heap_base = base;
	}
	return 0;
}

int fep_fabric_connect(fep_fabric_t *fab, const struct fep_fab_blob *blobs)
{
	int r, ret;

	for (r = 0; r < fab->size; r++) {
		const struct fep_fab_blob *b = &blobs[r];
		fi_addr_t addr = FI_ADDR_NOTAVAIL;

		if (b->magic != FEP_BLOB_MAGIC || b->name_len == 0 ||
		    b->name_len > sizeof(b->name) ||
		    b->raw_key_len > sizeof(b->raw_key)) {
			fep_err("rank %d published a malformed address", r);
			return -FABEP_ERR_PROTOCOL;
		}
		if (b->heap_size != fab->heap_size) {
			fep_err("rank %d has a heap of %llu bytes, this rank %zu: "
				"FABEP_HEAP_SIZE must be the same everywhere", r,
				(unsigned long long)b->heap_size, fab->heap_size);
			return -FABEP_ERR_MISMATCH;
		}
		if (strncmp(b->provider, fab->desc.provider, sizeof(b->provider)) ||
		    !memchr(b->provider, '\0', sizeof(b->provider))) {
			fep_err("rank %d opened provider \"%.*s\", this rank \"%s\": "
				"every rank must use the same provider (FABEP_PROVIDER "
				"or attr.provider; the domain may differ)", r,
				(int)sizeof(b->provider), b->provider, fab->desc.provider);
			return -FABEP_ERR_MISMATCH;
		}
		if (b->signal != (uint32_t)fab->signal) {
			fep_err("rank %d chose signal strategy %s, this rank %s",
				r, fep_signal_name((fabep_signal_t)b->signal),
				fep_signal_name(fab->signal));
			return -FABEP_ERR_MISMATCH;
		}
		ret = FEP_FAULT("fi_av_insert",
				fi_av_insert(fab->av, b->name, 1, &addr, 0, NULL));
		if (ret != 1) {
			fep_err("fi_av_insert(rank %d): %s", r,
				fi_strerror(ret < 0 ? -ret : FI_EOTHER));
			return ret < 0 ? ret : -FI_EOTHER;
		}
		fab->peers[r].addr = addr;
		fab->peers[r].base = (fab->mr_mode & FI_MR_VIRT_ADDR) ? b->heap_base : 0;
		if (fab->mr_mode & FI_MR_RAW) {
			uint64_t key;

			ret = fi_mr_map_raw(fab->domain, b->heap_base,
					    (uint8_t *)b->raw_key, b->raw_key_len,
					    &key, 0);
			if (ret) {
				fep_err("fi_mr_map_raw(rank %d): %s", r, fi_strerror(-ret));
				return ret;
			}
			fab->peers[r].key = key;
			fab->peers[r].key_mapped = true;
		} else {
			fab->peers[r].key = b->key;
		}
	}
	return 0;
}

static void fep_op_put(fep_fabric_t *fab, struct fep_op *op)
{
	if (op->dc) {
		op->dc = false;
		fab->peers[op->peer].dc_out--;
	}
	op->next = fab->free_ops;
	fab->free_ops = op;
	fab->outstanding--;
	if (op->kind != FEP_OP_ATOMIC)
		fab->writes--;
}

int fep_fabric_name_lost(fep_fabric_t *fab, bool grace)
{
	uint64_t end = fep_now_ns() + (uint64_t)FEP_LOST_GRACE_MS * 1000000ull;
	int ret;

	if (!fab->alive)
		return 0;
	while (!(ret = fab->alive(fab->alive_ctx, true)) && grace &&
	       fep_now_ns() < end)
		usleep(1000);
	return ret;
}

static int fep_cq_tx(fep_fabric_t *fab)
{
	struct fi_cq_data_entry e[FEP_CQ_BATCH];
	ssize_t n, i;

	for (;;) {
		n = FEP_FAULT("fi_cq_read", fi_cq_read(fab->txcq, e, FEP_CQ_BATCH));
		if (n == -FI_EAGAIN)
			return 0;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			struct fep_op *op;

			if (fi_cq_readerr(fab->txcq, &err, 0) < 0)
				return -FI_EOTHER;
			op = err.op_context;
			if (op) {
				fep_err("transfer to rank %d failed: %s (%s)", op->peer,
					fi_strerror(err.err),
					fi_cq_strerror(fab->txcq, err.prov_errno,
						       err.err_data, NULL, 0));
				if (op->peer >= 0 && op->peer < fab->size)
					fab->peers[op->peer].lost = 1;
				fep_op_put(fab, op);
				/* sockets fails transfers to the ranks still
				 * there once one is gone: name that one (the
				 * liveness check) */
				if (fep_fab_lost_grace(fab))
					fep_fabric_name_lost(fab, true);
			} else {
				fep_err("transfer failed: %s", fi_strerror(err.err));
			}
			if (!fab->tx_error)
				fab->tx_error = -FABEP_ERR_PEER_LOST;
			continue;
		}
		if (n < 0) {
			/* completions lost: no wait can tell when a write
			 * is done, so nothing more is sent (tx_error) */
			fep_err("fi_cq_read(tx): %s", fi_strerror((int)-n));
			if (!fab->tx_error)
				fab->tx_error = (int)n;
			return (int)n;
		}
		for (i = 0; i < n; i++)
			if (e[i].op_context)
				fep_op_put(fab, e[i].op_context);
		if (n < FEP_CQ_BATCH)
			return 0;
	}
}

static void fep_cqdata_apply(fep_fabric_t *fab, uint64_t data)
{
	unsigned addbits = (fab->cq_data_size >= 8 ? 64 : 32) - fab->cq_idx_bits;
	uint64_t idx = data & ((1ull << fab->cq_idx_bits) - 1);
	uint64_t add = (data >> fab->cq_idx_bits) & ((1ull << addbits) - 1);
	uint64_t off = idx * 8;

	if (!fep_heap_range_ok(fab, off, 8)) {
		fep_err("remote CQ data names counter offset %llu outside the heap; "
			"ignored", (unsigned long long)off);
		return;
	}
	__atomic_fetch_add((uint64_t *)fep_heap_at(fab, off), add, __ATOMIC_SEQ_CST);
}

static int fep_cq_rx(fep_fabric_t *fab)
{
	struct fi_cq_data_entry e[FEP_CQ_BATCH];
	ssize_t n, i;

	for (;;) {
		n = FEP_FAULT("rx_error", fi_cq_read(fab->rxcq, e, FEP_CQ_BATCH));
		if (n == -FI_EAGAIN)
			return 0;
		if (n == -FI_EAVAIL) {
			/* a write into this rank failed: what some wait here
			 * counts on may never come or be wrong, so the fabric
			 * is failed, as after a transfer of its own, and every
			 * wait ends now instead of at its timeout */
			struct fi_cq_err_entry err = { 0 };

			if (fi_cq_readerr(fab->rxcq, &err, 0) < 0)
				err.err = FI_EIO;  /* entry unreadable */
			fep_err("a transfer into this rank failed: %s (%s)",
				fi_strerror(err.err),
				fi_cq_strerror(fab->rxcq, err.prov_errno,
					       err.err_data, NULL, 0));
			/* most often its source died (shm's copy from it
			 * failed): name it, as a wait would have, once */
			if (!fab->tx_error) {
				fep_fabric_name_lost(fab, true);
				fab->tx_error = -FABEP_ERR_PEER_LOST;
			}
			return fab->tx_error;
		}
		if (n < 0) {
			fep_err("fi_cq_read(rx): %s", fi_strerror((int)-n));
			return (int)n;
		}
		for (i = 0; i < n; i++)
			if (e[i].flags & FI_REMOTE_CQ_DATA)
				fep_cqdata_apply(fab, e[i].data);
		if (n < FEP_CQ_BATCH)
			return 0;
	}
}

#ifdef FEP_TSAN
/* Writer-preferring: a waiting load is not held off by a stream of
 * progress calls on other threads. */
static pthread_rwlock_t fep_tsan_lock =
	PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;

void fep_tsan_progress_begin(void)
{
	pthread_rwlock_rdlock(&fep_tsan_lock);
}

void fep_tsan_progress_end(void)
{
	pthread_rwlock_unlock(&fep_tsan_lock);
}

void fep_tsan_observe(void)
{
	pthread_rwlock_wrlock(&fep_tsan_lock);
	pthread_rwlock_unlock(&fep_tsan_lock);
}
#endif

int fep_fabric_progress(fep_fabric_t *fab)
{
	int ret;

	FEP_TSAN_PROGRESS_BEGIN();
	ret = fep_cq_tx(fab);
	if (!ret)
		ret = fep_cq_rx(fab);
	FEP_TSAN_PROGRESS_END();
	if (ret)
		return ret;
	return fab->tx_error;
}

int fep_fabric_progress_all(fep_fabric_t *fab)
{
	int c, ret = fep_fabric_progress(fab);

	for (c = 1; !ret && c < fab->nchan; c++)
		ret = fep_fabric_progress(fab->chan[c]);
	return ret;
}

/* Progress channel ch; when another thread does now, wait for it (wait)
 * or leave it to that thread. */
static int progress_chan(fep_fabric_t *ch, bool wait)
{
	int ret;

	while (atomic_exchange_explicit(&ch->pbusy, 1, memory_order_acquire)) {
		if (!wait)
			return 0;
		sched_yield();
	}
	ret = fep_fabric_progress(ch);
	atomic_store_explicit(&ch->pcount,
			      atomic_load_explicit(&ch->pcount, memory_order_relaxed) + 1,
			      memory_order_relaxed);
	atomic_store_explicit(&ch->pbusy, 0, memory_order_release);
	return ret;
}

void fep_fabric_lane_enter(fep_fabric_t *ch)
{
	while (atomic_exchange_explicit(&ch->pbusy, 1, memory_order_acquire))
		sched_yield();
	ch->lane = true;
}

void fep_fabric_lane_leave(fep_fabric_t *ch)
{
	ch->lane = false;
	atomic_store_explicit(&ch->pbusy, 0, memory_order_release);
}

int fep_fabric_progress_free(fep_fabric_t *fab)
{
	int c, ret = 0;

	for (c = 0; !ret && c < fab->nchan; c++)
		ret = progress_chan(fab->nchan > 1 ? fab->chan[c] : fab, false);
	return ret;
}

int fep_fabric_progress_mine(fep_fabric_t *fab, int tid, int nthreads,
			     struct fep_chan_watch *w, unsigned scan_every)
{
	int c, ret = 0;

	for (c = tid; !ret && c < fab->nchan; c += nthreads)
		ret = progress_chan(fab->chan[c], false);
	if (ret || ++w->calls % scan_every)
		return ret;
	for (c = 0; !ret && c < fab->nchan; c++) {
		unsigned n;

		if (c % nthreads == tid)
			continue;
		n = atomic_load_explicit(&fab->chan[c]->pcount, memory_order_relaxed);
		if (n != w->seen[c]) {
			w->seen[c] = n;
			w->still[c] = 0;
		} else if (++w->still[c] >= 2) {
			ret = progress_chan(fab->chan[c], false);
		}
	}
	return ret;
}

int fep_fabric_chan_open(fep_fabric_t *fab, int n, struct fep_fab_blob *blobs)
{
	struct fep_fab_params p = { 0 };
	int c, ret;

	if (n <= 1)
		return 0;
	if (fab->signal != FABEP_SIGNAL_CQDATA && fab->signal != FABEP_SIGNAL_CMA) {
		fep_err("%d channels need the cqdata or cma signal strategy "
			"(this communicator's is %s)", n, fep_signal_name(fab->signal));
		return -FABEP_ERR_NO_SIGNAL;
	}
	fab->chan = calloc((size_t)n, sizeof(*fab->chan));
	if (!fab->chan)
		return -ENOMEM;
	fab->chan[0] = fab;
	p.provider = fab->info->fabric_attr->prov_name;
	p.domain = fab->info->domain_attr->name;
	/* the same strategy: under cma its atomics and the fast path's
	 * conditions, checked again for each channel's endpoint */
	p.signal = fab->signal;
	p.cma_peers = fab->signal == FABEP_SIGNAL_CMA;
	p.rank = fab->rank;
	p.size = fab->size;
	p.timeout_ms = fab->timeout_ms;
	p.heap_size = fab->heap_size;
	p.numa_node = -1;
	p.heap_of = fab;
	for (c = 1; c < n; c++) {
		ret = fep_fabric_open(&p, &fab->chan[c]);
		if (!ret)
			ret = fep_fabric_blob(fab->chan[c], &blobs[c - 1]);
		if (ret) {
			fep_err("opening channel %d of %d: %s", c + 1, n, fabep_strerror(ret));
			if (fab->chan[c])
				fep_fabric_close(fab->chan[c]);
			while (--c >= 1)
				fep_fabric_close(fab->chan[c]);
			free(fab->chan);
			fab->chan = NULL;
			return ret;
		}
		/* its posts' retries watch the peers too */
		fep_fabric_set_alive(fab->chan[c], fab->alive, fab->stalled,
				     fab->alive_ctx);
		fab->chan[c]->owner = fab;
	}
	fab->nchan = n;   /* counters count in these units from now */
	return 0;
}

int fep_fabric_chan_connect(fep_fabric_t *fab, const struct fep_fab_blob *all)
{
	int c, ret;

	for (c = 1; c < fab->nchan; c++) {
		ret = fep_fabric_connect(fab->chan[c], all + (size_t)(c - 1) * fab->size);
		if (ret)
			return ret;
	}
	return 0;
}

void fep_fabric_set_alive(fep_fabric_t *fab, int (*alive)(void *ctx, bool report),
			  void (*stalled)(void *ctx), void *ctx)
{
	fab->alive = alive;
	fab->stalled = stalled;
	fab->alive_ctx = ctx;
	fab->alive_next = 0;
}

static int clock_check(fep_fabric_t *fab, uint64_t *deadline, int timeout_ms,
		       bool report)
{
	const uint64_t every = (uint64_t)FEP_ALIVE_EVERY_MS * 1000000ull;
	uint64_t now = fep_now_ns(), tmo = (uint64_t)timeout_ms * 1000000ull;

	if (!*deadline) {
		*deadline = now + tmo;
		return 0;
	}
	if (now > *deadline)
		return -ETIMEDOUT;
	/* waiting for `every` already, and no check for as long */
	if (!fab->alive || now - (*deadline - tmo) < every || now < fab->alive_next)
		return 0;
	fab->alive_next = now + every;
	return fab->alive(fab->alive_ctx, report);
}

int fep_fabric_alive_due(fep_fabric_t *fab)
{
	const uint64_t every = (uint64_t)FEP_ALIVE_EVERY_MS * 1000000ull;
	uint64_t now;

	if (!fab->alive)
		return 0;
	now = fep_now_ns();
	if (now < fab->alive_next)
		return 0;
	fab->alive_next = now + every;
	return fab->alive(fab->alive_ctx, true);
}

int fep_fabric_clock(fep_fabric_t *fab, uint64_t *deadline, int timeout_ms)
{
	return clock_check(fab, deadline, timeout_ms, true);
}

int fep_fabric_clock_ctr(fep_fabric_t *fab, uint64_t *deadline, int timeout_ms,
			 uint64_t off, uint64_t target)
{
	int c, ret = clock_check(fab, deadline, timeout_ms, false);

	if (ret != -FABEP_ERR_PEER_LOST)
		return ret;
	/* what arrived before the peer left counts: every channel once
	 * more, each taken from whichever thread holds it */
	ret = 0;
	for (c = 0; !ret && c < fab->nchan; c++)
		ret = progress_chan(fab->nchan > 1 ? fab->chan[c] : fab, true);
	if (!ret && fep_counter_load(fab, off) >= target)
		return 0;
	return ret ? ret : fab->alive(fab->alive_ctx, true);
}

/* A stall in a lane progresses its channel alone (the other threads
 * hold theirs).  A stall on another channel (a post's retry, a reap)
 * progresses every channel that no pool thread holds: a peer may be
 * stalled itself on another of this rank's channels, waiting for this
 * rank to take what it sent there, and two ranks each progressing only
 * the channel of its own stall would wait for each other for ever. */
int fep_fabric_stall(fep_fabric_t *fab, struct fep_stall *st)
{
	int ret = fab->lane ? fep_fabric_progress(fab) :
		  fab->owner ? fep_fabric_progress_free(fab->owner) :
			       fep_fabric_progress_all(fab);

	if (fab->oversubscribed && st->bo.spins < 64)
		st->bo.spins = 64;  /* straight to yielding */

	if (!ret)
		ret = fep_fabric_clock(fab, &st->deadline, fab->timeout_ms);
	if (ret)
		return ret;
	fep_backoff_step(&st->bo);
	return 0;
}

/* Ranks marked in set (of n), as "rank 2" or "ranks 1, 3", appended to
 * buf at *l. */
static void fep_rank_list(const uint8_t *set, int size, size_t n, char *buf,
			  size_t len, size_t *l)
{
	bool first = true;
	int r;

	for (r = 0; r < size && *l < len; r++)
		if (set[r]) {
			*l += (size_t)snprintf(buf + *l, len - *l, "%s%d",
					       !first ? ", " : n > 1 ? "ranks " :
					       "rank ", r);
			first = false;
		}
}

/* The peers of the operations in flight on the first nchan channels, as
 * "rank 2" or "ranks 0, 2", into buf (for a timeout's message), with
 * the peers of each channel's oldest operation where they are not all
 * of them: "ranks 0, 2; the oldest to rank 2".  A provider may complete
 * an endpoint's operations in the order they were posted (shm: a
 * sender's responses queue in post order, and one not yet answered
 * holds back those behind it), so transfers to a live rank can wait
 * behind one to a stopped rank; the oldest names that rank. */
static void fep_busy_peers(const fep_fabric_t *fab, int nchan, char *buf,
			   size_t len)
{
	uint8_t *hit = calloc(2 * ((size_t)fab->size + 1), 1), *old, *free_op = NULL;
	const struct fep_fabric *ch;
	size_t i, n = 0, nold = 0, l = 0;
	int c;

	buf[0] = '\0';
	if (!hit)
		return;
	old = hit + fab->size + 1;
	for (c = 0; c < nchan; c++) {
		const struct fep_op *op, *oldest = NULL;

		ch = c ? fab->chan[c] : fab;
		free(free_op);
		free_op = calloc(ch->nops + 1, 1);
		if (!free_op)
			goto out;
		for (op = ch->free_ops; op; op = op->next)
			free_op[op - ch->ops] = 1;
		for (i = 0; i < ch->nops; i++) {
			op = &ch->ops[i];
			if (free_op[i] || op->peer < 0 || op->peer >= fab->size)
				continue;
			n += !hit[op->peer];
			hit[op->peer] = 1;
			if (!oldest || op->seq < oldest->seq)
				oldest = op;
		}
		if (oldest && !old[oldest->peer]) {
			old[oldest->peer] = 1;
			nold++;
		}
	}
	fep_rank_list(hit, fab->size, n, buf, len, &l);
	if (nold < n && l < len) {
		l += (size_t)snprintf(buf + l, len - l, "; the oldest to ");
		fep_rank_list(old, fab->size, nold, buf, len, &l);
	}
out:
	free(free_op);
	free(hit);
}

int fep_fabric_tx_error(const fep_fabric_t *fab)
{
	int c;

	for (c = 1; c < fab->nchan && !fab->tx_error; c++)
		if (fab->chan[c]->tx_error)
			return fab->chan[c]->tx_error;
	return fab->tx_error;
}

/* What a wait for completions waits for: every operation of every
 * channel (quiet), the writes (and reads) of every channel, or those of
 * this endpoint alone.  A sliced put, and every put under cma with
 * channels, goes out on channels other than chan[0]. */
enum fep_pending { FEP_PEND_OPS, FEP_PEND_WRITES, FEP_PEND_OWN_WRITES };

static size_t fep_pending(const fep_fabric_t *fab, enum fep_pending what)
{
	size_t n = what == FEP_PEND_OPS ? fab->outstanding : fab->writes;
	int c;

	for (c = 1; what != FEP_PEND_OWN_WRITES && c < fab->nchan; c++)
		n += what == FEP_PEND_OPS ? fab->chan[c]->outstanding :
					    fab->chan[c]->writes;
	return n;
}

/* Progress until none of `what` is pending; the first error of the
 * channels waited for. */
static int fep_wait_pending(fep_fabric_t *fab, enum fep_pending what)
{
	struct fep_stall st = { { 0, 0 }, 0 };
	int ret;

	while (fep_pending(fab, what)) {
		ret = fep_fabric_stall(fab, &st);
		if (ret == -FABEP_ERR_PEER_LOST && !fab->tx_error)
			fab->tx_error = ret;  /* as after a timeout, below */
		/* this wait's own clock ran out (not the sticky error of an
		 * earlier one, which progress returns at once) */
		if (ret == -ETIMEDOUT && st.deadline && fep_now_ns() > st.deadline) {
			char peers[200];

			fep_busy_peers(fab, what == FEP_PEND_OWN_WRITES ? 1 :
				       fab->nchan, peers, sizeof(peers));
			size_t n = fep_pending(fab, what);

			fep_err("%zu %s%s still incomplete after %d ms%s%s%s", n,
				what == FEP_PEND_OPS ? "transfer" : "write",
				n == 1 ? "" : "s",
				fab->timeout_ms, peers[0] ? " (to " : "", peers,
				peers[0] ? ")" : "");
			if (fab->stalled)
				fab->stalled(fab->alive_ctx);
			/* as after a failed wait: the peers may be gone, so
			 * nothing (fabep_comm_destroy included) waits for them
			 * again */
			if (!fab->tx_error)
				fab->tx_error = -ETIMEDOUT;
		}
		if (ret)
			return ret;
	}
	return what == FEP_PEND_OWN_WRITES ? fab->tx_error : fep_fabric_tx_error(fab);
}

int fep_fabric_quiet(fep_fabric_t *fab)
{
	return fep_wait_pending(fab, FEP_PEND_OPS);
}

int fep_fabric_reap_writes(fep_fabric_t *fab)
{
	return fep_wait_pending(fab, FEP_PEND_WRITES);
}

int fep_fabric_reap_own(fep_fabric_t *fab)
{
	return fep_wait_pending(fab, FEP_PEND_OWN_WRITES);
}

int fep_fabric_drain(fep_fabric_t *fab)
{
	return fab->tx_progress ? fep_fabric_quiet(fab) : 0;
}
