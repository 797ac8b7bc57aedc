/*
 * mpiextra.c: MPI functions that only wrappers generated from mpi.h record.
 * Each rank makes, from main:
 *
 *   MPI_Dims_create, MPI_Cart_create     1 call each
 *   MPI_Cart_get, MPI_Cart_rank          ITERS calls each
 *   MPI_Irecv, MPI_Cancel, MPI_Wait,     1 call each (a receive that no
 *   MPI_Test_cancelled                   message matches, cancelled)
 *   MPI_Comm_free                        1 call
 *
 * Usage: mpiextra ITERS. It prints one line per rank.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
	int rank, size, iters = argc > 1 ? atoi(argv[1]) : 100;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int dims[1] = {0}, periods[1] = {1}, coords[1], sum = 0;
	MPI_Comm cart;
	MPI_Dims_create(size, 1, dims);
	MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &cart);
	for (int i = 0; i < iters; i++) {
		int r;
		MPI_Cart_get(cart, 1, dims, periods, coords);
		MPI_Cart_rank(cart, coords, &r);
		sum += r;
	}
	int buf, cancelled = 0;
	MPI_Request req;
	MPI_Status st;
	MPI_Irecv(&buf, 1, MPI_INT, MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, &req);
	MPI_Cancel(&req);
	MPI_Wait(&req, &st);
	MPI_Test_cancelled(&st, &cancelled);
	MPI_Comm_free(&cart);
	printf("rank %d of %d: sum %d cancelled %d\n", rank, size, sum, cancelled);
	MPI_Finalize();
	return 0;
}
