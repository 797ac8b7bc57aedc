/* omp_counts: an OpenMP program with known regions per thread, for the
 * event library's OMPT test. It runs `regions` parallel regions of 4
 * threads; in each, every thread runs one implicit task, meets one loop
 * (`omp for`, whose implicit barrier it waits in) and one explicit
 * barrier. Each thread counts what it met; the program prints the counts
 * per OpenMP thread number ("thread <n> tasks <t> loops <l> barriers
 * <b>"), the regions the initial thread began ("regions <r>") and a
 * checksum, and exits with status 3 (so a changed status shows).
 *
 *   omp_counts [regions]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 4

int main(int argc, char **argv) {
	int regions = argc > 1 ? atoi(argv[1]) : 20;
	static int tasks[THREADS], loops[THREADS], barriers[THREADS];
	static double x[4096];
	int began = 0;
	for (int r = 0; r < regions; r++) {
		began++;
#pragma omp parallel num_threads(THREADS)
		{
			int t = omp_get_thread_num();
			tasks[t]++;
			loops[t]++;
#pragma omp for schedule(static)
			for (int i = 0; i < 4096; i++)
				x[i] += (double)(i % 13) * 0.5;
#pragma omp barrier
			barriers[t]++;
		}
	}
	double sum = 0;
	for (int i = 0; i < 4096; i++)
		sum += x[i];
	printf("regions %d\n", began);
	for (int t = 0; t < THREADS; t++)
		printf("thread %d tasks %d loops %d barriers %d\n", t, tasks[t], loops[t], barriers[t]);
	printf("checksum %.1f\n", sum);
	return 3;
}
