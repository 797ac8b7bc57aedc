/*
 * serial.c: a program without MPI for the instrumentation tests, built with
 * -finstrument-functions and using the explicit API. Usage: serial N.
 * main calls outer N times; outer calls inner twice; every tenth call of
 * outer also enters the region "marked" through the API and records the
 * counter "progress". It exits with status 3 so tests can check that the exit
 * status is the program's own.
 */
#include <stdio.h>
#include <stdlib.h>
#include "kipimo.h"

static volatile int sink;

__attribute__((noinline)) static void inner(int i) { sink += i; }

__attribute__((noinline)) static void outer(int i) {
	inner(i);
	inner(-i);
	if (i % 10 == 0) {
		kipimo_begin("marked");
		kipimo_counter("progress", (uint64_t)i);
		kipimo_end("marked");
	}
}

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 1000;
	kipimo_metadata("test key", "test value");
	for (int i = 0; i < n; i++)
		outer(i);
	printf("serial done %d\n", sink);
	return 3;
}
