/*
 * names.c: a program whose names appear over time, for the test of the
 * dictionary's re-sends. Usage: names STEPS. Every step (ended with
 * kipimo_step) enters "step", one of the five regions "early_0".."early_4"
 * (all registered in the first five steps and used to the end), the region
 * "late_<step/10>" (a new name every ten steps), and records the counters
 * "progress" and "ctr_<step/20>"; metadata "phase" changes key every 25
 * steps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kipimo.h"

int main(int argc, char **argv) {
	int steps = argc > 1 ? atoi(argv[1]) : 60;
	char name[64];
	struct timespec pause = {0, 2000000};
	kipimo_metadata("deck", "names-test");
	for (int s = 0; s < steps; s++) {
		kipimo_begin("step");
		snprintf(name, sizeof name, "early_%d", s % 5);
		kipimo_begin(name);
		kipimo_end(name);
		snprintf(name, sizeof name, "late_%d", s / 10);
		kipimo_begin(name);
		kipimo_counter("progress", (uint64_t)s);
		kipimo_end(name);
		snprintf(name, sizeof name, "ctr_%d", s / 20);
		kipimo_counter(name, (uint64_t)s);
		if (s % 25 == 0) {
			snprintf(name, sizeof name, "phase_%d", s / 25);
			kipimo_metadata(name, "on");
		}
		kipimo_end("step");
		kipimo_step();
		nanosleep(&pause, NULL);
	}
	printf("names done %d\n", steps);
	return 0;
}
