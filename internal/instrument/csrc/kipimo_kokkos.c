/*
 * kipimo_kokkos.c: a Kokkos Tools connector (libkipimo-kokkos.so), loaded
 * by Kokkos from KOKKOS_TOOLS_LIBS (or the older KOKKOS_PROFILE_LIBRARY)
 * into a program that has libkipimo.so preloaded.
 *
 * Every callback becomes an execution on the calling thread:
 *   parallel_for/reduce/scan   "Kokkos::parallel_for <label>" (_reduce, _scan)
 *   push/pop_profile_region    "<label>"
 *   deep_copy                  "Kokkos::deep_copy <dst space> <- <src space>",
 *                              with a "Device Bytes" counter (the bytes copied,
 *                              recorded at its end)
 *   fence                      "Kokkos::fence <label>"
 * The regions nest as the program opens them; a pop, end or fence end
 * without its begin records nothing. The kernel id Kokkos hands back to an
 * end is the function id of the execution.
 *
 * The Kokkos Tools C interface (Kokkos_Profiling_C_Interface.h) is declared
 * here, so the connector builds without Kokkos headers.
 */
#define _GNU_SOURCE
#include "kipimo_internal.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

struct Kokkos_Profiling_KokkosPDeviceInfo {
	size_t deviceID;
};

struct Kokkos_Profiling_SpaceHandle {
	char name[64];
};

#define KP_KSTACK 256

/* the calling thread's open regions and deep copies, innermost last, with
 * the bytes of each deep copy (0 for regions) */
static __thread uint32_t kstack[KP_KSTACK];
static __thread uint64_t kbytes[KP_KSTACK];
static __thread uint32_t kdepth;

static uint32_t id_of(const char *prefix, const char *label) {
	char name[1024];
	snprintf(name, sizeof name, "%s%s", prefix, label ? label : "");
	return kp_func_id(name);
}

static void open_id(uint32_t fid, uint64_t bytes) {
	kp_enter(fid);
	if (kdepth < KP_KSTACK) {
		kstack[kdepth] = fid;
		kbytes[kdepth] = bytes;
	}
	kdepth++;
}

/* close_top ends the innermost open region or deep copy; a deep copy's
 * bytes go out as a "Device Bytes" counter just before its exit (by then
 * the copy has usually taken the µs that kp_counter_apart waits for). */
static void close_top(void) {
	if (!kdepth)
		return;
	kdepth--;
	if (kdepth >= KP_KSTACK)
		return;
	if (kbytes[kdepth]) {
		static _Atomic uint32_t cid1; /* counter id + 1 */
		uint32_t c = atomic_load_explicit(&cid1, memory_order_relaxed);
		if (!c) {
			c = kp_counter_id("Device Bytes") + 1;
			atomic_store_explicit(&cid1, c, memory_order_relaxed);
		}
		kp_counter_apart(c - 1, kbytes[kdepth]);
	}
	kp_exit(kstack[kdepth]);
}

static void begin(const char *prefix, const char *label, uint64_t *kid) {
	if (!kp_ensure_started()) {
		if (kid)
			*kid = UINT64_MAX;
		return;
	}
	uint32_t fid = id_of(prefix, label);
	if (kid)
		*kid = fid;
	kp_enter(fid);
}

static void end(uint64_t kid) {
	if (kid != UINT64_MAX && kp_ensure_started())
		kp_exit((uint32_t)kid);
}

void kokkosp_init_library(const int seq, const uint64_t version, const uint32_t ndev, struct Kokkos_Profiling_KokkosPDeviceInfo *info) {
	(void)info;
	if (!kp_ensure_started())
		return;
	char v[64];
	snprintf(v, sizeof v, "%llu", (unsigned long long)version);
	kp_metadata("Kokkos Tools Interface", v);
	snprintf(v, sizeof v, "%d", seq);
	kp_metadata("Kokkos Tools Load Sequence", v);
	snprintf(v, sizeof v, "%u", ndev);
	kp_metadata("Kokkos Devices", v);
}

/* kokkosp_finalize_library closes the regions the calling thread left open. */
void kokkosp_finalize_library(void) {
	if (!kp_ensure_started())
		return;
	while (kdepth)
		close_top();
}

void kokkosp_begin_parallel_for(const char *name, const uint32_t dev, uint64_t *kid) {
	(void)dev;
	begin("Kokkos::parallel_for ", name, kid);
}

void kokkosp_end_parallel_for(const uint64_t kid) { end(kid); }

void kokkosp_begin_parallel_reduce(const char *name, const uint32_t dev, uint64_t *kid) {
	(void)dev;
	begin("Kokkos::parallel_reduce ", name, kid);
}

void kokkosp_end_parallel_reduce(const uint64_t kid) { end(kid); }

void kokkosp_begin_parallel_scan(const char *name, const uint32_t dev, uint64_t *kid) {
	(void)dev;
	begin("Kokkos::parallel_scan ", name, kid);
}

void kokkosp_end_parallel_scan(const uint64_t kid) { end(kid); }

void kokkosp_begin_fence(const char *name, const uint32_t dev, uint64_t *kid) {
	(void)dev;
	begin("Kokkos::fence ", name, kid);
}

void kokkosp_end_fence(const uint64_t kid) { end(kid); }

void kokkosp_push_profile_region(const char *name) {
	if (kp_ensure_started())
		open_id(id_of("", name), 0);
}

void kokkosp_pop_profile_region(void) {
	if (kp_ensure_started())
		close_top();
}

void kokkosp_begin_deep_copy(struct Kokkos_Profiling_SpaceHandle dst, const char *dst_name, const void *dst_ptr,
                             struct Kokkos_Profiling_SpaceHandle src, const char *src_name, const void *src_ptr, uint64_t size) {
	(void)dst_name;
	(void)dst_ptr;
	(void)src_name;
	(void)src_ptr;
	if (!kp_ensure_started())
		return;
	char label[160];
	dst.name[sizeof dst.name - 1] = 0;
	src.name[sizeof src.name - 1] = 0;
	snprintf(label, sizeof label, "%s <- %s", dst.name, src.name);
	/* an empty copy has no bytes to count */
	open_id(id_of("Kokkos::deep_copy ", label), size);
}

void kokkosp_end_deep_copy(void) {
	if (kp_ensure_started())
		close_top();
}
