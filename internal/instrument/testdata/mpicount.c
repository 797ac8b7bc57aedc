/*
 * mpicount.c: an independent count of a program's MPI traffic, for checking
 * what Kipimo's event library reports. Preloaded alone (never together with
 * Kipimo's wrappers), it counts the calls of a fixed set of MPI functions and
 * the point-to-point messages sent (per destination rank of MPI_COMM_WORLD:
 * messages and bytes), and at MPI_Finalize writes $MPICOUNT_DIR/count.<rank>:
 *
 *   call MPI_Send 3245
 *   send 1 3245 1234567      (destination, messages, bytes)
 *
 * Written by hand, sharing nothing with the library it checks.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { SEND, ISEND, RECV, IRECV, SENDRECV, WAIT, WAITALL, WAITANY, ALLREDUCE, BCAST, BARRIER, REDUCE, ALLGATHER,
       CART_GET, CART_RANK, CANCEL, NFUNCS };
static const char *names[NFUNCS] = {"MPI_Send", "MPI_Isend", "MPI_Recv", "MPI_Irecv", "MPI_Sendrecv", "MPI_Wait",
                                    "MPI_Waitall", "MPI_Waitany", "MPI_Allreduce", "MPI_Bcast", "MPI_Barrier", "MPI_Reduce", "MPI_Allgather",
                                    "MPI_Cart_get", "MPI_Cart_rank", "MPI_Cancel"};
static long calls[NFUNCS];
#define MAXR 64
static long msgs[MAXR], bytes[MAXR];

static int world(MPI_Comm comm, int r) {
	if (comm == MPI_COMM_WORLD)
		return r;
	MPI_Group g, w;
	int out;
	PMPI_Comm_group(comm, &g);
	PMPI_Comm_group(MPI_COMM_WORLD, &w);
	PMPI_Group_translate_ranks(g, 1, &r, w, &out);
	PMPI_Group_free(&g);
	PMPI_Group_free(&w);
	return out;
}

static void sent(MPI_Comm comm, int dest, int count, MPI_Datatype t) {
	if (dest == MPI_PROC_NULL)
		return;
	int size, d = world(comm, dest);
	PMPI_Type_size(t, &size);
	if (d >= 0 && d < MAXR) {
		msgs[d]++;
		bytes[d] += (long)count * size;
	}
}

int MPI_Send(const void *b, int c, MPI_Datatype t, int d, int tag, MPI_Comm comm) {
	calls[SEND]++;
	sent(comm, d, c, t);
	return PMPI_Send(b, c, t, d, tag, comm);
}

int MPI_Isend(const void *b, int c, MPI_Datatype t, int d, int tag, MPI_Comm comm, MPI_Request *r) {
	calls[ISEND]++;
	sent(comm, d, c, t);
	return PMPI_Isend(b, c, t, d, tag, comm, r);
}

int MPI_Recv(void *b, int c, MPI_Datatype t, int s, int tag, MPI_Comm comm, MPI_Status *st) {
	calls[RECV]++;
	return PMPI_Recv(b, c, t, s, tag, comm, st);
}

int MPI_Irecv(void *b, int c, MPI_Datatype t, int s, int tag, MPI_Comm comm, MPI_Request *r) {
	calls[IRECV]++;
	return PMPI_Irecv(b, c, t, s, tag, comm, r);
}

int MPI_Sendrecv(const void *sb, int sc, MPI_Datatype st, int d, int stag, void *rb, int rc, MPI_Datatype rt, int s,
                 int rtag, MPI_Comm comm, MPI_Status *status) {
	calls[SENDRECV]++;
	sent(comm, d, sc, st);
	return PMPI_Sendrecv(sb, sc, st, d, stag, rb, rc, rt, s, rtag, comm, status);
}

int MPI_Wait(MPI_Request *r, MPI_Status *s) {
	calls[WAIT]++;
	return PMPI_Wait(r, s);
}

int MPI_Waitall(int n, MPI_Request r[], MPI_Status s[]) {
	calls[WAITALL]++;
	return PMPI_Waitall(n, r, s);
}

int MPI_Waitany(int n, MPI_Request r[], int *i, MPI_Status *s) {
	calls[WAITANY]++;
	return PMPI_Waitany(n, r, i, s);
}

int MPI_Allreduce(const void *a, void *b, int c, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
	calls[ALLREDUCE]++;
	return PMPI_Allreduce(a, b, c, t, op, comm);
}

int MPI_Bcast(void *b, int c, MPI_Datatype t, int root, MPI_Comm comm) {
	calls[BCAST]++;
	return PMPI_Bcast(b, c, t, root, comm);
}

int MPI_Barrier(MPI_Comm comm) {
	calls[BARRIER]++;
	return PMPI_Barrier(comm);
}

int MPI_Reduce(const void *a, void *b, int c, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm) {
	calls[REDUCE]++;
	return PMPI_Reduce(a, b, c, t, op, root, comm);
}

int MPI_Allgather(const void *a, int ac, MPI_Datatype at, void *b, int bc, MPI_Datatype bt, MPI_Comm comm) {
	calls[ALLGATHER]++;
	return PMPI_Allgather(a, ac, at, b, bc, bt, comm);
}

int MPI_Cart_get(MPI_Comm comm, int maxdims, int dims[], int periods[], int coords[]) {
	calls[CART_GET]++;
	return PMPI_Cart_get(comm, maxdims, dims, periods, coords);
}

int MPI_Cart_rank(MPI_Comm comm, const int coords[], int *rank) {
	calls[CART_RANK]++;
	return PMPI_Cart_rank(comm, coords, rank);
}

int MPI_Cancel(MPI_Request *r) {
	calls[CANCEL]++;
	return PMPI_Cancel(r);
}

int MPI_Finalize(void) {
	int rank;
	PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
	const char *dir = getenv("MPICOUNT_DIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/count.%d", dir ? dir : ".", rank);
	FILE *f = fopen(path, "w");
	if (f) {
		for (int i = 0; i < NFUNCS; i++)
			fprintf(f, "call %s %ld\n", names[i], calls[i]);
		for (int d = 0; d < MAXR; d++)
			if (msgs[d])
				fprintf(f, "send %d %ld %ld\n", d, msgs[d], bytes[d]);
		fclose(f);
	}
	return PMPI_Finalize();
}
