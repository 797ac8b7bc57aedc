/*
 * kipimo_api.c: the explicit instrumentation API (kipimo.h) for C, C++ and
 * Fortran, on top of the core's hot path.
 */
#include "kipimo.h"
#include "kipimo_internal.h"

#include <stddef.h>
#include <string.h>

uint32_t kipimo_region_id(const char *name) { return kp_func_id(name); }

void kipimo_begin_id(uint32_t id) {
	if (kp_ensure_started())
		kp_enter(id);
}

void kipimo_end_id(uint32_t id) {
	if (kp_ensure_started())
		kp_exit(id);
}

void kipimo_begin(const char *name) {
	if (kp_ensure_started())
		kp_enter(kp_func_id(name));
}

void kipimo_end(const char *name) {
	if (kp_ensure_started())
		kp_exit(kp_func_id(name));
}

void kipimo_counter(const char *name, uint64_t value) {
	if (kp_ensure_started())
		kp_counter(kp_counter_id(name), value);
}

void kipimo_metadata(const char *key, const char *value) {
	if (kp_ensure_started())
		kp_metadata(key, value);
}

void kipimo_step(void) { kp_step_mark(); }

void kipimo_set_rank(uint32_t rank) { kp_set_rank(rank); }

/* Fortran: names arrive blank-padded with their length passed last. */

static void fstring(char *out, size_t n, const char *s, size_t len) {
	while (len > 0 && s[len - 1] == ' ')
		len--;
	if (len >= n)
		len = n - 1;
	memcpy(out, s, len);
	out[len] = 0;
}

void kipimo_begin_(const char *name, size_t len) {
	char b[512];
	fstring(b, sizeof b, name, len);
	kipimo_begin(b);
}

void kipimo_end_(const char *name, size_t len) {
	char b[512];
	fstring(b, sizeof b, name, len);
	kipimo_end(b);
}

void kipimo_counter_(const char *name, const int64_t *value, size_t len) {
	char b[512];
	fstring(b, sizeof b, name, len);
	kipimo_counter(b, (uint64_t)*value);
}

void kipimo_metadata_(const char *key, const char *value, size_t klen, size_t vlen) {
	char k[512], v[4096];
	fstring(k, sizeof k, key, klen);
	fstring(v, sizeof v, value, vlen);
	kipimo_metadata(k, v);
}

void kipimo_step_(void) { kipimo_step(); }
