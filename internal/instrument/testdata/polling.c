/*
 * polling.c: a polling loop far faster than events can be streamed, with
 * normal calls around it, for the tests of whole-call drops and hot-leaf
 * summaries. Built with -finstrument-functions; main and the helpers marked
 * NOINSTR are not recorded. Usage: polling THREADS SECONDS.
 *
 * Each of THREADS threads (the main thread is one) runs, for SECONDS:
 *
 *   poll_loop                one call per round
 *     test_flag              the polling loop: millions of calls, leaves
 *                            but for every 65536th, which calls rare, and
 *                            every 100000th, which records the counter
 *                            "test_flag calls"
 *     progress               every 4096th test_flag call
 *       test_flag            a leaf under another parent
 *       kipimo_counter       every 16th progress call ("polls"), so that
 *                            progress is never a leaf
 *   step                     one call per round, around normal work
 *     work                   8 calls
 *       inner                2 calls each (a leaf, but never hot)
 *
 * A round polls for about 10 ms. Every instrumented function counts its own
 * calls, and the program prints, per function, the calls of all threads:
 * "calls NAME N", then "rate R" (test_flag calls per second per thread).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kipimo.h"

#define NOINSTR __attribute__((no_instrument_function))

enum { F_POLL, F_TEST_FLAG, F_RARE, F_PROGRESS, F_STEP, F_WORK, F_INNER, NFUNC };
static const char *names[NFUNC] = {"poll_loop", "test_flag", "rare", "progress", "step", "work", "inner"};

static __thread unsigned long calls[NFUNC];
static volatile unsigned long flag;
static __thread volatile double sink;

NOINSTR static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((noinline)) static void rare(void) { calls[F_RARE]++; }

__attribute__((noinline)) static int test_flag(void) {
	unsigned long n = ++calls[F_TEST_FLAG];
	if (n % 65536 == 0)
		rare();
	if (n % 100000 == 0)
		kipimo_counter("test_flag calls", n);
	return flag != 0;
}

__attribute__((noinline)) static void progress(unsigned long i) {
	calls[F_PROGRESS]++;
	test_flag();
	if (calls[F_PROGRESS] % 16 == 0)
		kipimo_counter("polls", i);
}

/* poll_loop polls until the deadline and returns the test_flag calls it made in its loop. */
__attribute__((noinline)) static unsigned long poll_loop(double until) {
	calls[F_POLL]++;
	unsigned long i = 0;
	for (;;) {
		for (int k = 0; k < 4096; k++, i++)
			if (test_flag())
				return i;
		progress(i);
		if (now() >= until)
			return i;
	}
}

__attribute__((noinline)) static void inner(int i) {
	calls[F_INNER]++;
	sink += i;
}

__attribute__((noinline)) static void work(int i) {
	calls[F_WORK]++;
	inner(i);
	inner(-i);
}

__attribute__((noinline)) static void step(int r) {
	calls[F_STEP]++;
	for (int i = 0; i < 8; i++)
		work(r + i);
}

typedef struct {
	double seconds;
	unsigned long calls[NFUNC];
	double rate;
} job;

NOINSTR static void *run(void *arg) {
	job *j = arg;
	double start = now(), end = start + j->seconds, polling = 0;
	unsigned long polled = 0;
	for (int r = 0; now() < end; r++) {
		step(r);
		double t0 = now();
		polled += poll_loop(t0 + 0.01);
		polling += now() - t0;
	}
	for (int f = 0; f < NFUNC; f++)
		j->calls[f] = calls[f];
	j->rate = polling > 0 ? (double)polled / polling : 0;
	return NULL;
}

NOINSTR int main(int argc, char **argv) {
	if (argc != 3)
		return 2;
	int threads = atoi(argv[1]);
	double seconds = atof(argv[2]);
	if (threads < 1 || threads > 64)
		return 2;
	job jobs[64];
	pthread_t tids[64];
	for (int i = 0; i < threads; i++)
		jobs[i] = (job){.seconds = seconds};
	for (int i = 1; i < threads; i++)
		if (pthread_create(&tids[i], NULL, run, &jobs[i]) != 0)
			return 1;
	run(&jobs[0]);
	for (int i = 1; i < threads; i++)
		pthread_join(tids[i], NULL);
	double rate = 0;
	for (int f = 0; f < NFUNC; f++) {
		unsigned long n = 0;
		for (int i = 0; i < threads; i++)
			n += jobs[i].calls[f];
		printf("calls %s %lu\n", names[f], n);
	}
	for (int i = 0; i < threads; i++)
		rate += jobs[i].rate / threads;
	printf("rate %.0f\n", rate);
	return 0;
}
