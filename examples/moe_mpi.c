/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * moe_mpi.c - fabep in a program that already runs MPI: the communicator
 * is made with MPI_Allgather as its rendezvous (no FABEP_ROOT), then one
 * MoE layer's dispatch and combine and a tensor-parallel allreduce, each
 * checked against what this rank computes alone.
 *
 *     mpicc moe_mpi.c -o moe_mpi $(pkg-config --cflags --libs fabep)
 *     mpirun -n 4 ./moe_mpi          # --oversubscribe beyond the cores
 *
 * Tokens are bf16 rows of HIDDEN values; each token picks TOPK distinct
 * experts of EXPERTS with router weights that sum to 1.  The toy expert e
 * multiplies its row by (e + 1), so token t's combined row must be
 * x_t * sum_k w_k (e_k + 1), which every rank checks for its own tokens.
 * Prints "result: correct" on rank 0 and exits 0 when every check on
 * every rank passed.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <fabep.h>

#define EXPERTS 64
#define TOPK 4
#define HIDDEN 1024
#define TOKENS 32
#define AR_ROWS 8

static float bf16_to_f32(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint16_t f32_to_bf16(float f)  /* round to nearest even */
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* fabep's rendezvous over MPI: every rank's len bytes, in rank order. */
static int mpi_allgather(const void *send, void *recv, size_t len, void *ctx)
{
	MPI_Comm comm = *(MPI_Comm *)ctx;

	if (len > (size_t)INT32_MAX)
		return -EINVAL;
	return MPI_Allgather(send, (int)len, MPI_BYTE, recv, (int)len, MPI_BYTE,
			     comm) == MPI_SUCCESS ? 0 : -EIO;
}

/* A small deterministic generator, so every run routes the same way. */
static uint32_t next(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*s >> 33);
}

static int moe_layer(fabep_comm_t *comm, int rank)
{
	static uint16_t x[TOKENS * HIDDEN], out[TOKENS * HIDDEN];
	static int32_t ids[TOKENS * TOPK];
	static float w[TOKENS * TOPK];
	fabep_moe_config_t cfg;
	fabep_moe_recv_t rv = { .size = sizeof(rv) };
	fabep_moe_t *moe;
	uint16_t *y = NULL;
	uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)rank;
	int ret, bad = 0;

	for (int t = 0; t < TOKENS; t++) {
		float sum = 0;

		for (int k = 0; k < TOPK; k++) {
			int e, dup;

			do {  /* distinct experts per token */
				e = (int)(next(&seed) % EXPERTS);
				dup = 0;
				for (int j = 0; j < k; j++)
					dup |= ids[t * TOPK + j] == e;
			} while (dup);
			ids[t * TOPK + k] = e;
			w[t * TOPK + k] = 1.0f + (float)(next(&seed) % 16);
			sum += w[t * TOPK + k];
		}
		for (int k = 0; k < TOPK; k++)
			w[t * TOPK + k] /= sum;
		for (int h = 0; h < HIDDEN; h++)
			x[t * HIDDEN + h] = f32_to_bf16(
				(float)((int)(next(&seed) % 64) - 32) / 16.0f);
	}

	fabep_moe_config_init(&cfg);
	cfg.num_experts = EXPERTS;
	cfg.top_k = TOPK;
	cfg.hidden = HIDDEN;
	cfg.max_tokens = TOKENS;
	ret = fabep_moe_create(comm, &cfg, &moe);
	if (ret) {
		fprintf(stderr, "rank %d: fabep_moe_create: %s\n", rank,
			fabep_strerror(ret));
		return ret;
	}

	/* dispatch: the rows of this rank's experts, in expert-major order */
	ret = fabep_moe_dispatch(moe, x, NULL, TOKENS, ids, w, &rv);
	if (ret) {
		fprintf(stderr, "rank %d: fabep_moe_dispatch: %s\n", rank,
			fabep_strerror(ret));
		goto out;
	}
	/* the experts: local expert i's rows are row_offsets[i] .. [i + 1] */
	y = malloc((rv.rows ? rv.rows : 1) * HIDDEN * sizeof(*y));
	if (!y)  /* combine refuses a NULL y with rows on every rank alike */
		fprintf(stderr, "rank %d: out of memory\n", rank);
	for (int i = 0; y && i < rv.local_experts; i++) {
		float f = (float)(rv.first_expert + i + 1);

		for (uint32_t r = rv.row_offsets[i]; r < rv.row_offsets[i + 1]; r++) {
			const uint16_t *xr = (const uint16_t *)rv.x + (size_t)r * HIDDEN;

			for (int h = 0; h < HIDDEN; h++)
				y[(size_t)r * HIDDEN + h] = f32_to_bf16(bf16_to_f32(xr[h]) * f);
		}
	}
	/* combine: every token's expert outputs, weighted and summed, back */
	ret = fabep_moe_combine(moe, y, HIDDEN, 0, out, HIDDEN, NULL, NULL);
	if (ret) {
		fprintf(stderr, "rank %d: fabep_moe_combine: %s\n", rank,
			fabep_strerror(ret));
		goto out;
	}
	for (int t = 0; t < TOKENS && !bad; t++) {
		float g = 0;

		for (int k = 0; k < TOPK; k++)
			g += w[t * TOPK + k] * (float)(ids[t * TOPK + k] + 1);
		for (int h = 0; h < HIDDEN; h++) {
			float want = bf16_to_f32(x[t * HIDDEN + h]) * g;
			float got = bf16_to_f32(out[t * HIDDEN + h]);

			/* bf16 expert outputs and output: a few units of 2^-8 */
			if (fabsf(got - want) > 0.02f * fabsf(want) + 1e-3f) {
				fprintf(stderr, "rank %d: token %d value %d: %g, want %g\n",
					rank, t, h, got, want);
				bad = 1;
				break;
			}
		}
	}
out:
	free(y);
	fabep_moe_destroy(moe);
	return ret ? ret : bad ? 1 : 0;
}

static int tp_allreduce(fabep_comm_t *comm, int rank, int size)
{
	static float in[AR_ROWS * HIDDEN], sum[AR_ROWS * HIDDEN];
	fabep_allreduce_t *ar = NULL;
	int ret, bad = 0;

	/* small integers: the sum is exact whatever the order */
	for (int i = 0; i < AR_ROWS * HIDDEN; i++)
		in[i] = (float)((i + rank) % 7);
	ret = fabep_allreduce_create(comm, AR_ROWS, HIDDEN, FABEP_AR_F32, &ar);
	if (!ret)
		ret = fabep_allreduce(ar, in, sum, AR_ROWS, HIDDEN);
	if (ret) {
		fprintf(stderr, "rank %d: allreduce: %s\n", rank, fabep_strerror(ret));
		fabep_allreduce_destroy(ar);
		return ret;
	}
	for (int i = 0; i < AR_ROWS * HIDDEN && !bad; i++) {
		float want = 0;

		for (int r = 0; r < size; r++)
			want += (float)((i + r) % 7);
		if (sum[i] != want) {
			fprintf(stderr, "rank %d: allreduce value %d: %g, want %g\n",
				rank, i, sum[i], want);
			bad = 1;
		}
	}
	fabep_allreduce_destroy(ar);
	return bad;
}

int main(int argc, char **argv)
{
	MPI_Comm world = MPI_COMM_WORLD;
	fabep_comm_attr_t attr;
	fabep_comm_t *comm;
	fabep_moe_config_t cfg;
	int rank, size, ret, bad = 0, all_bad;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(world, &rank);
	MPI_Comm_size(world, &size);
	if (EXPERTS % size) {
		if (!rank)
			fprintf(stderr, "moe_mpi: %d experts do not split over %d ranks\n",
				EXPERTS, size);
		MPI_Finalize();
		return 2;
	}

	/* the heap: what the handles below take, and some room */
	fabep_moe_config_init(&cfg);
	cfg.num_experts = EXPERTS;
	cfg.top_k = TOPK;
	cfg.hidden = HIDDEN;
	cfg.max_tokens = TOKENS;
	fabep_comm_attr_init(&attr);
	attr.allgather = mpi_allgather;
	attr.allgather_ctx = &world;
	attr.rank = rank;
	attr.nranks = size;
	attr.heap_size = fabep_moe_heap_bytes(&cfg, size) +
			 fabep_allreduce_heap_bytes(AR_ROWS, HIDDEN, FABEP_AR_F32, size) +
			 (1u << 20);
	ret = fabep_comm_create(&attr, &comm);
	if (ret) {
		/* creation fails on every rank alike */
		fprintf(stderr, "rank %d: fabep_comm_create: %s\n", rank,
			fabep_strerror(ret));
		MPI_Finalize();
		return 1;
	}
	if (!rank)
		printf("fabep %s on %s (%s), %d ranks\n", fabep_version(),
		       fabep_comm_provider(comm), fabep_signal_name(fabep_comm_signal(comm)),
		       size);

	bad |= moe_layer(comm, rank) != 0;
	bad |= tp_allreduce(comm, rank, size) != 0;
	fabep_comm_destroy(comm);

	MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_LOR, world);
	if (!rank)
		printf("result: %s\n", all_bad ? "WRONG" : "correct");
	MPI_Finalize();
	return all_bad ? 1 : 0;
}
