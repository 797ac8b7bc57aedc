/*
 * kipimo_ompt.c: OpenMP through OMPT, the OpenMP tools interface (OpenMP
 * 5.0), part of libkipimo.so.
 *
 * An OpenMP runtime with OMPT (LLVM's libomp, and the runtimes derived from
 * it: Intel's, AMD's) looks for ompt_start_tool in the process when it
 * starts; this file defines it. Parallel regions (on the thread that
 * encounters them), implicit tasks (on each thread of the team), worksharing
 * constructs (loops, sections, single, ...) and synchronisation regions
 * (barriers, taskwait, taskgroup, reductions) become executions on the
 * thread that ran them, named by the construct and the function whose code
 * starts it (for code in the compiler's outlined body of a parallel region,
 * the function of the region): "omp parallel @ main", "omp implicit task @
 * main", "omp for @ solve", "omp implicit barrier (worksharing) @ solve".
 * The implicit barrier that closes a region is recorded on the thread that
 * began the region ("omp implicit barrier (parallel) @ main"); on the other
 * threads of the team the implicit task ends where they reach it. Each
 * thread's OpenMP thread number in its team is its "OpenMP Thread"
 * metadata. GCC's libgomp has no OMPT and never calls ompt_start_tool:
 * under it this file does nothing.
 *
 * The types below are the OMPT ABI as the OpenMP specification defines it
 * (omp-tools.h is not installed with every compiler that builds the
 * library).
 */
#define _GNU_SOURCE
#include "kipimo_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kp_resolve_name(uintptr_t addr, char *out, size_t n); /* kipimo_cyg.c */

typedef union {
	uint64_t value;
	void *ptr;
} kp_ompt_data;

typedef void (*kp_ompt_fn)(void);
typedef kp_ompt_fn (*kp_ompt_lookup)(const char *name);
typedef int (*kp_ompt_set_callback)(int event, kp_ompt_fn callback);

typedef struct {
	int (*initialize)(kp_ompt_lookup lookup, int initial_device_num, kp_ompt_data *tool_data);
	void (*finalize)(kp_ompt_data *tool_data);
	kp_ompt_data tool_data;
} kp_ompt_start_result;

/* OMPT event, endpoint and flag numbers (OpenMP 5.1, section 4.4) */
enum {
	KP_OMPT_PARALLEL_BEGIN = 3,
	KP_OMPT_PARALLEL_END = 4,
	KP_OMPT_IMPLICIT_TASK = 7,
	KP_OMPT_WORK = 20,
	KP_OMPT_SYNC_REGION = 23,
	KP_OMPT_BEGIN = 1,
	KP_OMPT_END = 2,
	KP_OMPT_BEGINEND = 3,
	KP_OMPT_TASK_INITIAL = 1,
};

/* region categories: the stack pairs ends with begins by category */
enum { CAT_PARALLEL = 1, CAT_TASK = 2, CAT_WORK = 3, CAT_SYNC = 4 };

static const char *const work_names[] = {
    [1] = "omp for", [2] = "omp sections", [3] = "omp single", [4] = "omp single (other)",
    [5] = "omp workshare", [6] = "omp distribute", [7] = "omp taskloop", [8] = "omp scope",
};

static const char *const sync_names[] = {
    [1] = "omp barrier",
    [2] = "omp implicit barrier",
    [3] = "omp barrier",
    [4] = "omp barrier (runtime)",
    [5] = "omp taskwait",
    [6] = "omp taskgroup",
    [7] = "omp reduction",
    [8] = "omp implicit barrier (worksharing)",
    [9] = "omp implicit barrier (parallel)",
    [10] = "omp teams barrier",
};

static const char *construct(int cat, int kind) {
	switch (cat) {
	case CAT_PARALLEL:
		return "omp parallel";
	case CAT_TASK:
		return "omp implicit task";
	case CAT_WORK:
		return kind > 0 && kind < (int)(sizeof work_names / sizeof *work_names) && work_names[kind] ? work_names[kind] : "omp worksharing";
	default:
		return kind > 0 && kind < (int)(sizeof sync_names / sizeof *sync_names) && sync_names[kind] ? sync_names[kind] : "omp synchronisation";
	}
}

/* Function ids by (construct, code address): lock-free lookups, inserts
 * under a lock. */
#define SLOTS 8192u
static struct {
	_Atomic uint64_t key[SLOTS];
	uint32_t fid[SLOTS];
	pthread_mutex_t mu;
	kp_ompt_start_result result;
} O = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* outlined reports whether fn is a compiler's outlined body of a parallel
 * region (clang: .omp_outlined., GCC: main._omp_fn.0). */
static int outlined(const char *fn) { return strstr(fn, ".omp_outlined") || strstr(fn, "_omp_fn."); }

/* region_fid returns the id of construct (cat, kind) at code address code,
 * named by the function that holds code or, when that is the outlined body
 * of a parallel region, by the function of the region (at address outer). */
static uint32_t region_fid(int cat, int kind, uintptr_t code, uintptr_t outer) {
	uint64_t key = (uint64_t)(cat * 16 + kind) << 56 | (code & 0x00FFFFFFFFFFFFFFull);
	uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (SLOTS - 1);
	for (uint32_t i = 0; i < 32; i++) {
		uint64_t k = atomic_load_explicit(&O.key[(h + i) & (SLOTS - 1)], memory_order_acquire);
		if (k == key)
			return O.fid[(h + i) & (SLOTS - 1)];
		if (!k)
			break;
	}
	char fn[512], name[640];
	fn[0] = 0;
	if (code)
		kp_resolve_name(code, fn, sizeof fn);
	if (outer && (!fn[0] || outlined(fn)))
		kp_resolve_name(outer, fn, sizeof fn);
	if (fn[0])
		snprintf(name, sizeof name, "%s @ %s", construct(cat, kind), fn);
	else
		snprintf(name, sizeof name, "%s", construct(cat, kind));
	uint32_t fid = kp_func_id(name);
	pthread_mutex_lock(&O.mu);
	for (uint32_t i = 0; i < 32; i++) {
		uint32_t s = (h + i) & (SLOTS - 1);
		uint64_t k = atomic_load_explicit(&O.key[s], memory_order_relaxed);
		if (k == key)
			break;
		if (!k) {
			O.fid[s] = fid;
			atomic_store_explicit(&O.key[s], key, memory_order_release);
			break;
		}
	}
	pthread_mutex_unlock(&O.mu);
	return fid;
}

/* The regions this file entered on this thread. An end closes the most
 * recent region of its category and any region still open above it (in
 * libomp a worker's implicit task ends inside the barrier that closes it;
 * that barrier's own end then finds nothing and is left out), so the
 * thread's calls always nest. */
#define DEPTH 64
static __thread struct {
	uint32_t fid;
	uint8_t cat;
	int64_t outer_num; /* of an implicit task: the thread number before it */
} stack_[DEPTH];
static __thread int depth_, overflow_;
/* thread_num_ is the thread's number in the team of its innermost implicit
 * task (-1: none); shown_num_ the number its metadata last said */
static __thread int64_t thread_num_ = -1, shown_num_ = -1;

static void begin(int cat, uint32_t fid) {
	if (depth_ == DEPTH) {
		overflow_++;
		return;
	}
	stack_[depth_].fid = fid;
	stack_[depth_].cat = (uint8_t)cat;
	stack_[depth_].outer_num = thread_num_;
	depth_++;
	kp_enter(fid);
}

static void end(int cat) {
	if (overflow_) {
		overflow_--;
		return;
	}
	int i = depth_ - 1;
	while (i >= 0 && stack_[i].cat != cat)
		i--;
	if (i < 0)
		return;
	while (depth_ > i) {
		depth_--;
		kp_exit(stack_[depth_].fid);
		if (stack_[depth_].cat == CAT_TASK)
			thread_num_ = stack_[depth_].outer_num;
	}
}

static void on_parallel_begin(kp_ompt_data *task, const void *frame, kp_ompt_data *parallel, unsigned int requested, int flags,
                              const void *code) {
	(void)task, (void)frame, (void)requested, (void)flags;
	if (parallel)
		parallel->value = (uint64_t)(uintptr_t)code;
	begin(CAT_PARALLEL, region_fid(CAT_PARALLEL, 0, (uintptr_t)code, 0));
}

static void on_parallel_end(kp_ompt_data *parallel, kp_ompt_data *task, int flags, const void *code) {
	(void)parallel, (void)task, (void)flags, (void)code;
	end(CAT_PARALLEL);
}

static void on_implicit_task(int endpoint, kp_ompt_data *parallel, kp_ompt_data *task, unsigned int team, unsigned int index, int flags) {
	(void)task, (void)team;
	if (flags & KP_OMPT_TASK_INITIAL)
		return; /* the program's initial task: no region */
	if (endpoint == KP_OMPT_END) {
		end(CAT_TASK);
		return;
	}
	if ((int64_t)index != shown_num_) {
		char v[16];
		snprintf(v, sizeof v, "%u", index);
		kp_metadata("OpenMP Thread", v);
		shown_num_ = index;
	}
	begin(CAT_TASK, region_fid(CAT_TASK, 0, parallel ? (uintptr_t)parallel->value : 0, 0));
	thread_num_ = index;
}

static void on_work(int kind, int endpoint, kp_ompt_data *parallel, kp_ompt_data *task, uint64_t count, const void *code) {
	(void)task, (void)count;
	if (endpoint != KP_OMPT_END)
		begin(CAT_WORK, region_fid(CAT_WORK, kind & 15, (uintptr_t)code, parallel ? (uintptr_t)parallel->value : 0));
	if (endpoint != KP_OMPT_BEGIN)
		end(CAT_WORK);
}

static void on_sync_region(int kind, int endpoint, kp_ompt_data *parallel, kp_ompt_data *task, const void *code) {
	(void)task;
	uintptr_t region = parallel ? (uintptr_t)parallel->value : 0;
	/* the implicit barrier that closes a parallel region: libomp reports it
	 * as a plain implicit barrier, from the region's fork on the thread
	 * that began the region and from nowhere (NULL) on the others */
	int closing = kind == 9 || (kind == 2 && (!code || (uintptr_t)code == region));
	if (closing && thread_num_ > 0) {
		/* Another thread of the team: its share of the region is done.
		 * libomp reports the end of this barrier (and of the implicit task)
		 * only when the thread is woken for the next region, so its wait
		 * would span the serial code in between: the implicit task ends
		 * here and the barrier is not recorded. */
		if (endpoint != KP_OMPT_END)
			end(CAT_TASK);
		return;
	}
	if (endpoint != KP_OMPT_END)
		begin(CAT_SYNC, region_fid(CAT_SYNC, closing ? 9 : kind == 2 ? 8 : kind & 15, (uintptr_t)code, region));
	if (endpoint != KP_OMPT_BEGIN)
		end(CAT_SYNC);
}

static int on_initialize(kp_ompt_lookup lookup, int initial_device_num, kp_ompt_data *tool_data) {
	(void)initial_device_num, (void)tool_data;
	if (!kp_ensure_started())
		return 0;
	kp_ompt_set_callback set = (kp_ompt_set_callback)lookup("ompt_set_callback");
	if (!set)
		return 0;
	set(KP_OMPT_PARALLEL_BEGIN, (kp_ompt_fn)on_parallel_begin);
	set(KP_OMPT_PARALLEL_END, (kp_ompt_fn)on_parallel_end);
	set(KP_OMPT_IMPLICIT_TASK, (kp_ompt_fn)on_implicit_task);
	set(KP_OMPT_WORK, (kp_ompt_fn)on_work);
	set(KP_OMPT_SYNC_REGION, (kp_ompt_fn)on_sync_region);
	return 1;
}

static void on_finalize(kp_ompt_data *tool_data) { (void)tool_data; }

/* ompt_start_tool is what an OMPT runtime calls when it starts. It declines
 * (NULL) when the library is off, when KIPIMO_OMPT=0, and when the user
 * named tools of their own in OMP_TOOL_LIBRARIES (the runtime then loads
 * those). */
kp_ompt_start_result *ompt_start_tool(unsigned int omp_version, const char *runtime_version);
kp_ompt_start_result *ompt_start_tool(unsigned int omp_version, const char *runtime_version) {
	(void)omp_version, (void)runtime_version;
	const char *off = getenv("KIPIMO_OMPT"), *other = getenv("OMP_TOOL_LIBRARIES");
	if (!kp_ensure_started() || (off && strcmp(off, "0") == 0) || (other && *other))
		return NULL;
	O.result.initialize = on_initialize;
	O.result.finalize = on_finalize;
	return &O.result;
}
