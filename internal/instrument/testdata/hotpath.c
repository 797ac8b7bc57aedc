/*
 * hotpath.c: the hot path's cost per event pair (an entry and an exit), for
 * BenchmarkHotPath. Usage: hotpath MODE PAIRS, MODE one of
 *   api       kipimo_begin_id / kipimo_end_id
 *   compiler  a call of an empty function built with -finstrument-functions
 * It times the recording loops only, in the thread's CPU time, in batches
 * of 40,000 pairs (80,000 events, within a thread's ring), waiting between
 * batches until the collector has cut the ring into a frame and sent it
 * (kp_flush, the library's own flush), so that no batch finds the ring full
 * however loaded the machine is, and prints "ns_per_pair <value>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kipimo.h"

/* kp_flush (kipimo_internal.h) cuts an io_step and waits until its frame
 * has left; a no-op when the library is off. */
void kp_flush(void);

__attribute__((noinline)) void empty(void) { __asm__ volatile(""); }

/* now is the calling thread's CPU time: time the thread spends preempted
 * on a loaded machine is not the hot path's. */
__attribute__((no_instrument_function)) static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

__attribute__((no_instrument_function)) int main(int argc, char **argv) {
	if (argc != 3)
		return 2;
	int api = strcmp(argv[1], "api") == 0;
	long pairs = atol(argv[2]);
	uint32_t id = kipimo_region_id("bench_region");
	const long batch = 40000;
	double spent = 0;
	for (long done = 0; done < pairs; done += batch) {
		long n = pairs - done < batch ? pairs - done : batch;
		double t0 = now();
		if (api) {
			for (long i = 0; i < n; i++) {
				kipimo_begin_id(id);
				kipimo_end_id(id);
			}
		} else {
			for (long i = 0; i < n; i++)
				empty();
		}
		spent += now() - t0;
		kp_flush();
	}
	printf("ns_per_pair %.3f\n", spent / (double)pairs);
	return 0;
}
