#define _GNU_SOURCE
/* chan.c: can several shm endpoints per rank move one exchange faster?
 * 2 forked ranks, P channels (own domain, ep, cq, av) each; P threads per
 * rank each write slice j of S bytes to the peer's channel j.
 * usage: chan P S iters mode   (mode 0 fi_write, 1 fi_writedata, 2 memcpy) */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <sys/uio.h>

#define MAXP 16
struct pub { int pid; char name[64]; size_t namelen; uint64_t key; uint64_t addr; };
struct shared {
	struct pub pub[2][MAXP];
	atomic_int ready;
	atomic_long bar, done;
	double t[4096], tw[2][MAXP][4096];
};
static struct shared *sh;
static int P, mode, rank, iters;
static size_t S, SPR, BUF;
static char *buf;
struct chan { struct fid_domain *dom; struct fid_ep *ep; struct fid_cq *cq; struct fid_av *av;
	struct fid_mr *mr; fi_addr_t peer; void *desc; };
static struct chan ch[MAXP];
static struct fid_fabric *fab;
static struct fi_info *info;

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3; }
#define CK(x) do { int _r = (x); if (_r) { fprintf(stderr, "%s: %d %s\n", #x, _r, fi_strerror(-_r)); exit(1); } } while (0)

static void barrier(long gen) /* all 2P threads */
{
	atomic_fetch_add(&sh->bar, 1);
	while (atomic_load(&sh->bar) < gen * 2 * P)
		;
}

static void *thr(void *arg)
{
	int j = (int)(long)arg, it;
	size_t sl = S / P, off = j * sl;
	size_t doff = SPR ? S + j * SPR : S + off;
	char *src = buf + off, *dst = buf + doff;
	uint64_t raddr = sh->pub[!rank][j].addr + doff;
	struct fi_cq_data_entry e[8];

	for (it = 0; it < iters; it++) {
		double t0;
		int got_tx = 0, got_rx = 0;
		barrier(it + 1);
		t0 = now();
		if (mode == 2) {
			memcpy(dst, src, sl);
			got_tx = got_rx = 1;
		} else if (mode == 3) {
			struct iovec l = { src, sl }, rm = { (void *)raddr, sl };
			if (process_vm_writev(sh->pub[!rank][0].pid, &l, 1, &rm, 1, 0) != (ssize_t)sl) { perror("pvw"); exit(1); }
			got_tx = got_rx = 1;
		} else {
			ssize_t r;
			do {
				r = mode ? fi_writedata(ch[j].ep, src, sl, ch[j].desc, 1, ch[j].peer, raddr, sh->pub[!rank][j].key, NULL)
					 : fi_write(ch[j].ep, src, sl, ch[j].desc, ch[j].peer, raddr, sh->pub[!rank][j].key, NULL);
				if (r == -FI_EAGAIN)
					fi_cq_read(ch[j].cq, e, 8);
			} while (r == -FI_EAGAIN);
			if (r) { fprintf(stderr, "write %zd\n", r); exit(1); }
			if (!mode) got_rx = 1;
		}
		sh->tw[rank][j][it] = now() - t0;
		while (!got_tx || !got_rx) {
			ssize_t n = fi_cq_read(ch[j].cq, e, 8), k;
			for (k = 0; k < n; k++) {
				if (e[k].flags & FI_REMOTE_CQ_DATA) got_rx = 1; else got_tx = 1;
			}
			if (n < 0 && n != -FI_EAGAIN) { fprintf(stderr, "cq %zd\n", n); exit(1); }
		}
		atomic_fetch_add(&sh->done, 1);
		while (atomic_load(&sh->done) < (long)(it + 1) * 2 * P)
			fi_cq_read(ch[j].cq, e, 8);
		if (j == 0 && rank == 0)
			sh->t[it] = now() - t0;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int r, j;
	P = atoi(argv[1]); S = strtoul(argv[2], 0, 0); iters = atoi(argv[3]); mode = atoi(argv[4]);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	memset(sh, 0, sizeof(*sh));
	for (r = 0; r < 2; r++)
		if (!fork()) { rank = r; goto child; }
	while (wait(&r) > 0)
		;
	{
		double v[4096], med; int i, k;
		memcpy(v, sh->t, sizeof(double) * iters);
		for (i = 0; i < iters; i++) for (k = i + 1; k < iters; k++) if (v[k] < v[i]) { double x = v[i]; v[i] = v[k]; v[k] = x; }
		med = v[iters / 2];
		printf("P %d S %zu mode %d: median %.1f us min %.1f us  %.2f GB/s per rank", P, S, mode, med, v[0], S / med / 1e3);
		{ int jj; double w[4096]; printf("  own-op medians:");
		  for (jj = 0; jj < P; jj++) { memcpy(w, sh->tw[0][jj], sizeof(double) * iters);
		    for (i = 0; i < iters; i++) for (k = i + 1; k < iters; k++) if (w[k] < w[i]) { double x = w[i]; w[i] = w[k]; w[k] = x; }
		    printf(" %.0f", w[iters / 2]); } printf("\n"); }
	}
	return 0;
child:
	if (getenv("CHAN_SPREAD")) SPR = ((S / P + (2 << 20) - 1) / (2 << 20)) * (2 << 20);
	BUF = SPR ? S + P * SPR : 2 * S;
	buf = aligned_alloc(1 << 21, BUF);
	if (getenv("CHAN_THP")) madvise(buf, BUF, MADV_HUGEPAGE);
	memset(buf, rank + 1, BUF);
	{
		struct fi_info *h = fi_allocinfo();
		h->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
		h->mode = FI_CONTEXT | FI_CONTEXT2;
		h->ep_attr->type = FI_EP_RDM;
		h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
		h->domain_attr->av_type = FI_AV_TABLE;
		h->domain_attr->threading = FI_THREAD_DOMAIN;
		h->domain_attr->data_progress = FI_PROGRESS_MANUAL;
		h->fabric_attr->prov_name = strdup("shm");
		CK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info));
	}
	CK(fi_fabric(info->fabric_attr, &fab, NULL));
	for (j = 0; j < P; j++) {
		struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_DATA, .size = 64 };
		struct fi_av_attr aa = { .type = FI_AV_TABLE };
		size_t l = 64;
		CK(fi_domain(fab, info, &ch[j].dom, NULL));
		CK(fi_endpoint(ch[j].dom, info, &ch[j].ep, NULL));
		CK(fi_cq_open(ch[j].dom, &ca, &ch[j].cq, NULL));
		CK(fi_av_open(ch[j].dom, &aa, &ch[j].av, NULL));
		CK(fi_ep_bind(ch[j].ep, &ch[j].cq->fid, FI_TRANSMIT | FI_RECV));
		CK(fi_ep_bind(ch[j].ep, &ch[j].av->fid, 0));
		CK(fi_enable(ch[j].ep));
		CK(fi_mr_reg(ch[j].dom, buf, BUF, FI_WRITE | FI_REMOTE_WRITE, 0, j + 1 + 100 * rank, 0, &ch[j].mr, NULL));
		if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
			CK(fi_mr_bind(ch[j].mr, &ch[j].ep->fid, 0));
			CK(fi_mr_enable(ch[j].mr));
		}
		ch[j].desc = fi_mr_desc(ch[j].mr);
		CK(fi_getname(&ch[j].ep->fid, sh->pub[rank][j].name, &l));
		sh->pub[rank][j].namelen = l;
		sh->pub[rank][j].key = fi_mr_key(ch[j].mr);
		sh->pub[rank][j].addr = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0;
	}
	sh->pub[rank][0].pid = getpid();
	atomic_fetch_add(&sh->ready, 1);
	while (atomic_load(&sh->ready) < 2)
		usleep(100);
	for (j = 0; j < P; j++)
		if (fi_av_insert(ch[j].av, sh->pub[!rank][j].name, 1, &ch[j].peer, 0, NULL) != 1) { fprintf(stderr, "av\n"); exit(1); }
	{
		pthread_t t[MAXP];
		for (j = 0; j < P; j++) pthread_create(&t[j], NULL, thr, (void *)(long)j);
		for (j = 0; j < P; j++) pthread_join(t[j], NULL);
	}
	if (mode != 2) /* check the data */
	for (size_t i = 0; i < S; i += 4096)
		if (buf[SPR ? S + (i / (S / P)) * SPR + i % (S / P) : S + i] != (char)(!rank + 1)) { fprintf(stderr, "rank %d: bad data at %zu\n", rank, i); exit(1); }
	_exit(0);
}
