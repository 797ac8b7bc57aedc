/*
 * kipimo_ocl.c: OpenCL, interposed on an unmodified program
 * (libkipimo-opencl.so, preloaded after libkipimo.so when the program loads
 * libOpenCL).
 *
 * Each enqueue call (kernels, buffer and image reads, writes, copies, fills
 * and maps), clFinish and clWaitForEvents is recorded as a function on the
 * calling thread. An enqueue call also records a fresh "Correlation ID"
 * counter inside it and asks for an event (its own when the program passed
 * none, a retained reference to the program's otherwise) with a completion
 * callback; the callback reads the command's CL_PROFILING_COMMAND_START and
 * _END, converts them to the host clock, and hands the command to the
 * device-activity interface as an execution on its queue's virtual thread,
 * named after the kernel (CL_KERNEL_FUNCTION_NAME) or the transfer
 * ("OpenCL Read Buffer", ...), with its correlation id and bytes. Our event
 * references are released on a later OpenCL call of the program's (never in
 * the runtime's callback). Command queues are created with
 * CL_QUEUE_PROFILING_ENABLE added, which changes no result.
 *
 * Clock: each device's profiling clock is tied to the host clock once, when
 * the first queue on it is created: KP_CAL markers are enqueued on that
 * (empty) queue and waited for, and the CL_PROFILING_COMMAND_QUEUED time
 * the runtime takes inside the enqueue call, against the host clock around
 * the call that took the least time, gives the offset. A device whose
 * queues were all made before the library could see them is calibrated the
 * same way from its first command.
 *
 * The OpenCL types are declared here (the ABI of the Khronos headers), so
 * the library builds without OpenCL headers; the runtime is found with
 * dlsym(RTLD_NEXT) at the first call.
 */
#define _GNU_SOURCE
#include "kipimo_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_command_queue_properties;
typedef cl_bitfield cl_map_flags;
typedef cl_ulong cl_queue_properties;
typedef cl_uint cl_profiling_info;
typedef cl_uint cl_kernel_info;
typedef cl_uint cl_command_queue_info;
typedef cl_uint cl_image_info;
typedef struct _cl_context *cl_context;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;

#define CL_SUCCESS 0
#define CL_COMPLETE 0x0
#define CL_INVALID_OPERATION (-59)
#define CL_QUEUE_PROFILING_ENABLE (1ull << 1)
#define CL_QUEUE_CONTEXT 0x1090
#define CL_QUEUE_DEVICE 0x1091
#define CL_QUEUE_PROPERTIES 0x1093
#define CL_KERNEL_FUNCTION_NAME 0x1190
#define CL_IMAGE_ELEMENT_SIZE 0x1111
#define CL_PROFILING_COMMAND_QUEUED 0x1280
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283

#define KP_QUEUES 256
#define KP_CAL 5

/* ---- the runtime's functions ---- */

#define REAL(name) \
	static __typeof__(name) *real_##name##_p; \
	static __typeof__(name) *real_##name(void) { \
		__typeof__(name) *f = __atomic_load_n(&real_##name##_p, __ATOMIC_ACQUIRE); \
		if (!f) { \
			f = (__typeof__(name) *)dlsym(RTLD_NEXT, #name); \
			__atomic_store_n(&real_##name##_p, f, __ATOMIC_RELEASE); \
		} \
		return f; \
	}

cl_int clRetainEvent(cl_event);
cl_int clReleaseEvent(cl_event);
cl_int clGetEventProfilingInfo(cl_event, cl_profiling_info, size_t, void *, size_t *);
cl_int clSetEventCallback(cl_event, cl_int, void (*)(cl_event, cl_int, void *), void *);
cl_int clGetKernelInfo(cl_kernel, cl_kernel_info, size_t, void *, size_t *);
cl_int clGetCommandQueueInfo(cl_command_queue, cl_command_queue_info, size_t, void *, size_t *);
cl_int clGetImageInfo(cl_mem, cl_image_info, size_t, void *, size_t *);
cl_int clEnqueueMarkerWithWaitList(cl_command_queue, cl_uint, const cl_event *, cl_event *);
cl_int clWaitForEvents(cl_uint n, const cl_event *list);
REAL(clRetainEvent)
REAL(clReleaseEvent)
REAL(clGetEventProfilingInfo)
REAL(clSetEventCallback)
REAL(clGetKernelInfo)
REAL(clGetCommandQueueInfo)
REAL(clGetImageInfo)
REAL(clEnqueueMarkerWithWaitList)
REAL(clWaitForEvents)

/* ---- queues, devices, contexts ---- */

typedef struct kp_dev_cal {
	void *dev;
	_Atomic int64_t offset; /* host ns - device ns */
	_Atomic int done;       /* the offset is set */
} kp_dev_cal;

typedef struct kp_queue {
	void *q;
	uint32_t dth;
	kp_dev_cal *cal;
	_Atomic uint64_t pending; /* commands whose callback has not finished */
} kp_queue;

static struct {
	pthread_mutex_t mu;
	kp_queue queues[KP_QUEUES];
	_Atomic uint32_t nqueues;
	kp_dev_cal devs[KP_QUEUES];
	uint32_t ndevs;
	void *ctxs[KP_QUEUES];
	uint32_t nctxs;
	_Atomic uint64_t pending; /* all queues */
	_Atomic(struct kp_cmd *) release; /* commands whose event we still hold */
	int exit_hook;
} O = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* one command in flight */
typedef struct kp_cmd {
	struct kp_cmd *next;
	cl_event ev;
	kp_queue *q;
	uint32_t fid;
	int injected;
	uint64_t corr, bytes, t0, t1;
} kp_cmd;

static uint32_t ordinal(void **tab, uint32_t *n, void *p) {
	for (uint32_t i = 0; i < *n; i++)
		if (tab[i] == p)
			return i;
	if (*n < KP_QUEUES)
		tab[(*n)++] = p;
	return *n - 1;
}

static kp_dev_cal *device_cal(void *dev) {
	for (uint32_t i = 0; i < O.ndevs; i++)
		if (O.devs[i].dev == dev)
			return &O.devs[i];
	if (O.ndevs == KP_QUEUES)
		return NULL;
	kp_dev_cal *c = &O.devs[O.ndevs++];
	c->dev = dev;
	return c;
}

/* queue_of returns q's entry, making it (and its virtual thread) on first
 * use; fresh (a queue just created) replaces an entry of a released queue
 * at the same address. */
static kp_queue *queue_of(cl_command_queue q, int fresh) {
	uint32_t n = atomic_load_explicit(&O.nqueues, memory_order_acquire);
	if (!fresh) {
		for (uint32_t i = 0; i < n; i++)
			if (O.queues[i].q == q)
				return &O.queues[i];
	}
	if (!real_clGetCommandQueueInfo())
		return NULL;
	cl_context ctx = NULL;
	cl_device_id dev = NULL;
	real_clGetCommandQueueInfo()(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, NULL);
	real_clGetCommandQueueInfo()(q, CL_QUEUE_DEVICE, sizeof dev, &dev, NULL);
	pthread_mutex_lock(&O.mu);
	kp_queue *e = NULL;
	n = atomic_load_explicit(&O.nqueues, memory_order_relaxed);
	for (uint32_t i = 0; i < n && !e; i++)
		if (O.queues[i].q == q && !fresh)
			e = &O.queues[i];
	if (!e && n < KP_QUEUES) {
		kp_dev_cal *cal = device_cal(dev);
		uint32_t dord = cal ? (uint32_t)(cal - O.devs) : 0;
		uint32_t dth = kp_device_thread("OpenCL", ordinal(O.ctxs, &O.nctxs, ctx), dord, n);
		if (cal && dth != UINT32_MAX) {
			e = &O.queues[n];
			e->dth = dth;
			e->cal = cal;
			/* a reused address: the old entry stops matching */
			for (uint32_t i = 0; i < n; i++)
				if (O.queues[i].q == q)
					O.queues[i].q = NULL;
			e->q = q;
			atomic_store_explicit(&O.nqueues, n + 1, memory_order_release);
		}
	}
	pthread_mutex_unlock(&O.mu);
	return e;
}

/* calibrate ties the clock of q's device to the host clock, once per
 * device, with markers on q (just created, so empty). */
static void calibrate(kp_queue *q) {
	if (!q || atomic_load_explicit(&q->cal->done, memory_order_acquire) || !real_clEnqueueMarkerWithWaitList() ||
	    !real_clWaitForEvents() || !real_clGetEventProfilingInfo() || !real_clReleaseEvent())
		return;
	uint64_t best = UINT64_MAX;
	int64_t off = 0;
	for (int i = 0; i < KP_CAL; i++) {
		cl_event ev = NULL;
		uint64_t t0 = kp_now_ns();
		cl_int rc = real_clEnqueueMarkerWithWaitList()(q->q, 0, NULL, &ev);
		uint64_t t1 = kp_now_ns();
		if (rc != CL_SUCCESS || !ev)
			return;
		cl_ulong queued = 0;
		if (real_clWaitForEvents()(1, &ev) == CL_SUCCESS &&
		    real_clGetEventProfilingInfo()(ev, CL_PROFILING_COMMAND_QUEUED, sizeof queued, &queued, NULL) == CL_SUCCESS &&
		    t1 - t0 < best) {
			best = t1 - t0;
			off = (int64_t)(t0 + best / 2) - (int64_t)queued;
		}
		real_clReleaseEvent()(ev);
	}
	if (best == UINT64_MAX)
		return;
	pthread_mutex_lock(&O.mu);
	if (!atomic_load(&q->cal->done)) {
		atomic_store(&q->cal->offset, off);
		atomic_store_explicit(&q->cal->done, 1, memory_order_release);
	}
	pthread_mutex_unlock(&O.mu);
}

/* ---- completion ---- */

static void release_done(void) {
	kp_cmd *c = atomic_exchange_explicit(&O.release, NULL, memory_order_acquire);
	while (c) {
		kp_cmd *next = c->next;
		real_clReleaseEvent()(c->ev);
		free(c);
		c = next;
	}
}

static void on_complete(cl_event ev, cl_int status, void *data) {
	kp_cmd *c = data;
	cl_ulong queued = 0, start = 0, end = 0;
	if (status == CL_COMPLETE &&
	    real_clGetEventProfilingInfo()(ev, CL_PROFILING_COMMAND_QUEUED, sizeof queued, &queued, NULL) == CL_SUCCESS &&
	    real_clGetEventProfilingInfo()(ev, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) == CL_SUCCESS &&
	    real_clGetEventProfilingInfo()(ev, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) == CL_SUCCESS) {
		kp_dev_cal *cal = c->q->cal;
		if (!atomic_load_explicit(&cal->done, memory_order_acquire)) {
			pthread_mutex_lock(&O.mu);
			if (!atomic_load(&cal->done)) {
				atomic_store(&cal->offset, (int64_t)(c->t0 + (c->t1 - c->t0) / 2) - (int64_t)queued);
				atomic_store_explicit(&cal->done, 1, memory_order_release);
			}
			pthread_mutex_unlock(&O.mu);
		}
		int64_t off = atomic_load_explicit(&cal->offset, memory_order_relaxed);
		uint64_t s = (uint64_t)((int64_t)start + off), e = (uint64_t)((int64_t)end + off);
		if (e < s)
			e = s;
		kp_device_exec_injected(c->q->dth, c->fid, s, e, c->corr, c->bytes, c->injected);
	}
	kp_queue *q = c->q;
	kp_cmd *head = atomic_load_explicit(&O.release, memory_order_relaxed);
	do
		c->next = head;
	while (!atomic_compare_exchange_weak_explicit(&O.release, &head, c, memory_order_release, memory_order_relaxed));
	atomic_fetch_sub_explicit(&q->pending, 1, memory_order_release);
	atomic_fetch_sub_explicit(&O.pending, 1, memory_order_release);
}

/* wait_pending waits, at most limit ns, until no callback of q (every
 * queue when NULL) is still to run. */
static void wait_pending(kp_queue *q, uint64_t limit) {
	_Atomic uint64_t *p = q ? &q->pending : &O.pending;
	uint64_t until = kp_now_ns() + limit;
	while (atomic_load_explicit(p, memory_order_acquire) && kp_now_ns() < until) {
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
}

static void at_exit_ocl(void) {
	wait_pending(NULL, 2000000000ull);
	release_done();
}

/* ---- the host side of a call ---- */

static __thread int in_call;

typedef struct kp_call {
	int on;
	int injected; /* the command was delayed on purpose */
	uint32_t hfid;
	uint64_t corr, t0;
	cl_event tmp;
	cl_event *ev;
} kp_call;

/* call_begin enters the host call of name (id cached in *cache) and, for
 * an enqueue (ev set), records its correlation id and makes *ev point to
 * an event. */
static void call_begin(kp_call *c, _Atomic uint32_t *cache, const char *name, cl_event **ev) {
	c->on = 0;
	c->injected = 0;
	c->ev = NULL;
	if (in_call || !kp_ensure_started())
		return;
	c->on = 1;
	in_call = 1;
	uint32_t id = atomic_load_explicit(cache, memory_order_relaxed);
	if (!id) {
		id = kp_func_id(name) + 1;
		atomic_store_explicit(cache, id, memory_order_relaxed);
	}
	c->hfid = id - 1;
	kp_enter(c->hfid);
	if (!O.exit_hook) {
		/* after the core's own exit handler was registered (by the entry
		 * above), so it runs first: the last callbacks reach the last frame */
		pthread_mutex_lock(&O.mu);
		if (!O.exit_hook) {
			O.exit_hook = 1;
			atexit(at_exit_ocl);
		}
		pthread_mutex_unlock(&O.mu);
	}
	if (atomic_load_explicit(&O.release, memory_order_relaxed))
		release_done();
	if (!ev)
		return;
	c->tmp = NULL;
	if (!*ev)
		*ev = &c->tmp;
	c->ev = *ev;
	c->t0 = kp_now_ns();
}

/* call_end leaves the host call; for an enqueue that succeeded it follows
 * the command's event to its completion. */
static void call_end(kp_call *c, cl_int rc, cl_command_queue q, uint32_t fid, uint64_t bytes) {
	if (!c->on)
		return;
	if (c->ev && rc == CL_SUCCESS && *c->ev && real_clSetEventCallback() && real_clGetEventProfilingInfo() && real_clReleaseEvent()) {
		uint64_t t1 = kp_now_ns();
		/* late in the call: the counter's µs is then past the entry's
		 * without waiting (kp_correlate) */
		c->corr = kp_correlate();
		kp_queue *qe = queue_of(q, 0);
		kp_cmd *cmd = qe ? malloc(sizeof *cmd) : NULL;
		int own = c->ev == &c->tmp;
		if (cmd && (own || real_clRetainEvent()(*c->ev) == CL_SUCCESS)) {
			*cmd = (kp_cmd){NULL, *c->ev, qe, fid, c->injected, c->corr, bytes, c->t0, t1};
			atomic_fetch_add(&qe->pending, 1);
			atomic_fetch_add(&O.pending, 1);
			if (real_clSetEventCallback()(*c->ev, CL_COMPLETE, on_complete, cmd) != CL_SUCCESS) {
				atomic_fetch_sub(&qe->pending, 1);
				atomic_fetch_sub(&O.pending, 1);
				real_clReleaseEvent()(cmd->ev);
				free(cmd);
			}
		} else {
			free(cmd);
			if (own)
				real_clReleaseEvent()(c->tmp);
		}
	}
	kp_exit(c->hfid);
	in_call = 0;
}

/* ---- names and sizes ---- */

static uint32_t kernel_fid(cl_kernel k) {
	char name[512];
	size_t n = 0;
	if (!real_clGetKernelInfo() || real_clGetKernelInfo()(k, CL_KERNEL_FUNCTION_NAME, sizeof name, name, &n) != CL_SUCCESS || n == 0)
		snprintf(name, sizeof name, "OpenCL Kernel");
	name[sizeof name - 1] = 0;
	return kp_func_id(name);
}

static uint32_t named(_Atomic uint32_t *cache, const char *name) {
	uint32_t id = atomic_load_explicit(cache, memory_order_relaxed);
	if (!id) {
		id = kp_func_id(name) + 1;
		atomic_store_explicit(cache, id, memory_order_relaxed);
	}
	return id - 1;
}

static uint64_t region_bytes(const size_t *r) { return r ? (uint64_t)r[0] * r[1] * r[2] : 0; }

static uint64_t image_bytes(cl_mem img, const size_t *r) {
	size_t el = 0;
	if (real_clGetImageInfo())
		real_clGetImageInfo()(img, CL_IMAGE_ELEMENT_SIZE, sizeof el, &el, NULL);
	return region_bytes(r) * (el ? el : 1);
}

/* ---- queues with profiling ---- */

cl_command_queue clCreateCommandQueue(cl_context ctx, cl_device_id dev, cl_command_queue_properties props, cl_int *err);
cl_command_queue clCreateCommandQueueWithProperties(cl_context ctx, cl_device_id dev, const cl_queue_properties *props, cl_int *err);
REAL(clCreateCommandQueue)
REAL(clCreateCommandQueueWithProperties)

cl_command_queue clCreateCommandQueue(cl_context ctx, cl_device_id dev, cl_command_queue_properties props, cl_int *err) {
	if (!real_clCreateCommandQueue()) {
		if (err)
			*err = CL_INVALID_OPERATION;
		return NULL;
	}
	int on = kp_ensure_started();
	cl_command_queue q = real_clCreateCommandQueue()(ctx, dev, props | (on ? CL_QUEUE_PROFILING_ENABLE : 0), err);
	if (q && on)
		calibrate(queue_of(q, 1));
	return q;
}

cl_command_queue clCreateCommandQueueWithProperties(cl_context ctx, cl_device_id dev, const cl_queue_properties *props, cl_int *err) {
	if (!real_clCreateCommandQueueWithProperties()) {
		if (err)
			*err = CL_INVALID_OPERATION;
		return NULL;
	}
	if (!kp_ensure_started())
		return real_clCreateCommandQueueWithProperties()(ctx, dev, props, err);
	/* the same list with CL_QUEUE_PROFILING_ENABLE in CL_QUEUE_PROPERTIES */
	cl_queue_properties list[64];
	size_t n = 0;
	int found = 0;
	for (; props && props[n] && n + 3 < 64; n += 2) {
		list[n] = props[n];
		list[n + 1] = props[n + 1];
		if (props[n] == CL_QUEUE_PROPERTIES) {
			list[n + 1] |= CL_QUEUE_PROFILING_ENABLE;
			found = 1;
		}
	}
	if (props && props[n]) /* longer than any real list: leave it alone */
		return real_clCreateCommandQueueWithProperties()(ctx, dev, props, err);
	if (!found) {
		list[n++] = CL_QUEUE_PROPERTIES;
		list[n++] = CL_QUEUE_PROFILING_ENABLE;
	}
	list[n] = 0;
	cl_command_queue q = real_clCreateCommandQueueWithProperties()(ctx, dev, list, err);
	if (q)
		calibrate(queue_of(q, 1));
	return q;
}

/* ---- enqueue calls ---- */

/* ENQ defines wrapper `name`: params its parameter list (with q the queue
 * and ev the event pointer), args the arguments passed on; FID (the device
 * activity's name) and BYTES are expressions of the parameters. */
#define ENQ(name, params, args, FID, BYTES) \
	cl_int name params; \
	REAL(name) \
	cl_int name params { \
		if (!real_##name()) \
			return CL_INVALID_OPERATION; \
		static _Atomic uint32_t host; \
		kp_call c; \
		call_begin(&c, &host, #name, &ev); \
		cl_int rc = real_##name() args; \
		if (c.on) \
			call_end(&c, rc, q, FID, BYTES); \
		return rc; \
	}

#define DEV(label) \
	__extension__({ static _Atomic uint32_t dev_; named(&dev_, label); })

/* ---- kernels, and delays injected into them ----
 *
 * A kernel named in KIPIMO_INJECT is delayed on the device: when the draw
 * fires, the launch waits on a user event of ours as well as on the
 * program's wait list, a CL_RUNNING callback that sleeps the delay is set on
 * the command (a CPU device such as pocl runs it between the command's start
 * and end), and then the user event is completed. The kernel's device
 * execution is recorded as injected (ground truth). A runtime that runs
 * CL_RUNNING callbacks outside the command's time delays the queue instead. */

typedef cl_event (*create_user_event_fn)(cl_context, cl_int *);
typedef cl_int (*set_user_event_status_fn)(cl_event, cl_int);
static create_user_event_fn create_user_event; /* set before set_user_event_status */
static _Atomic(set_user_event_status_fn) set_user_event_status;

static void on_running(cl_event ev, cl_int status, void *data) {
	(void)ev;
	(void)status;
	uint64_t d = (uint64_t)(uintptr_t)data;
	struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

/* kernel_gate prepares an injected delay for a launch of fid on q: it
 * returns the user event the launch must also wait for (NULL: no delay now)
 * and the wait list to pass in *wl2 (to free when it differs from wl). */
static cl_event kernel_gate(kp_call *c, cl_command_queue q, uint32_t fid, cl_uint n, const cl_event *wl, const cl_event **wl2, uint64_t *delay) {
	*wl2 = wl;
	if (!c->on || !kp_inject_draw(fid, delay))
		return NULL;
	if (!atomic_load(&set_user_event_status)) {
		create_user_event = (create_user_event_fn)dlsym(RTLD_NEXT, "clCreateUserEvent");
		atomic_store(&set_user_event_status, (set_user_event_status_fn)dlsym(RTLD_NEXT, "clSetUserEventStatus"));
	}
	set_user_event_status_fn set = atomic_load(&set_user_event_status);
	create_user_event_fn create = create_user_event;
	cl_context ctx = NULL;
	if (!create || !set || !real_clGetCommandQueueInfo() ||
	    real_clGetCommandQueueInfo()(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, NULL) != CL_SUCCESS)
		return NULL;
	cl_event *list = malloc(((size_t)n + 1) * sizeof *list);
	if (!list)
		return NULL;
	cl_int err = CL_SUCCESS;
	cl_event gate = create(ctx, &err);
	if (!gate || err != CL_SUCCESS) {
		free(list);
		return NULL;
	}
	if (n)
		memcpy(list, wl, n * sizeof *list);
	list[n] = gate;
	*wl2 = list;
	return gate;
}

/* kernel_release sets the delay on the launched command and lets it run. */
static void kernel_release(kp_call *c, cl_int rc, cl_event gate, const cl_event *wl, const cl_event *wl2, uint64_t delay) {
	if (!gate)
		return;
	if (rc == CL_SUCCESS && c->ev && *c->ev && real_clSetEventCallback() &&
	    real_clSetEventCallback()(*c->ev, 1 /* CL_RUNNING */, on_running, (void *)(uintptr_t)delay) == CL_SUCCESS)
		c->injected = 1;
	atomic_load(&set_user_event_status)(gate, CL_COMPLETE);
	real_clReleaseEvent()(gate);
	if (wl2 != wl)
		free((void *)wl2);
}

cl_int clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dim, const size_t *off, const size_t *gws, const size_t *lws, cl_uint n, const cl_event *wl, cl_event *ev);
REAL(clEnqueueNDRangeKernel)
cl_int clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dim, const size_t *off, const size_t *gws, const size_t *lws, cl_uint n, const cl_event *wl, cl_event *ev) {
	if (!real_clEnqueueNDRangeKernel())
		return CL_INVALID_OPERATION;
	static _Atomic uint32_t host;
	kp_call c;
	call_begin(&c, &host, "clEnqueueNDRangeKernel", &ev);
	uint32_t fid = c.on ? kernel_fid(k) : 0;
	const cl_event *wl2;
	uint64_t delay = 0;
	cl_event gate = kernel_gate(&c, q, fid, n, wl, &wl2, &delay);
	cl_int rc = real_clEnqueueNDRangeKernel()(q, k, dim, off, gws, lws, gate ? n + 1 : n, wl2, ev);
	kernel_release(&c, rc, gate, wl, wl2, delay);
	if (c.on)
		call_end(&c, rc, q, fid, 0);
	return rc;
}

cl_int clEnqueueTask(cl_command_queue q, cl_kernel k, cl_uint n, const cl_event *wl, cl_event *ev);
REAL(clEnqueueTask)
cl_int clEnqueueTask(cl_command_queue q, cl_kernel k, cl_uint n, const cl_event *wl, cl_event *ev) {
	if (!real_clEnqueueTask())
		return CL_INVALID_OPERATION;
	static _Atomic uint32_t host;
	kp_call c;
	call_begin(&c, &host, "clEnqueueTask", &ev);
	uint32_t fid = c.on ? kernel_fid(k) : 0;
	const cl_event *wl2;
	uint64_t delay = 0;
	cl_event gate = kernel_gate(&c, q, fid, n, wl, &wl2, &delay);
	cl_int rc = real_clEnqueueTask()(q, k, gate ? n + 1 : n, wl2, ev);
	kernel_release(&c, rc, gate, wl, wl2, delay);
	if (c.on)
		call_end(&c, rc, q, fid, 0);
	return rc;
}

ENQ(clEnqueueReadBuffer,
    (cl_command_queue q, cl_mem m, cl_bool b, size_t off, size_t size, void *p, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, b, off, size, p, n, wl, ev), DEV("OpenCL Read Buffer"), size)
ENQ(clEnqueueWriteBuffer,
    (cl_command_queue q, cl_mem m, cl_bool b, size_t off, size_t size, const void *p, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, b, off, size, p, n, wl, ev), DEV("OpenCL Write Buffer"), size)
ENQ(clEnqueueCopyBuffer,
    (cl_command_queue q, cl_mem s, cl_mem d, size_t so, size_t dof, size_t size, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, s, d, so, dof, size, n, wl, ev), DEV("OpenCL Copy Buffer"), size)
ENQ(clEnqueueFillBuffer,
    (cl_command_queue q, cl_mem m, const void *pat, size_t psize, size_t off, size_t size, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, pat, psize, off, size, n, wl, ev), DEV("OpenCL Fill Buffer"), size)
ENQ(clEnqueueReadBufferRect,
    (cl_command_queue q, cl_mem m, cl_bool b, const size_t *bo, const size_t *ho, const size_t *r, size_t brp, size_t bsp, size_t hrp, size_t hsp, void *p, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, b, bo, ho, r, brp, bsp, hrp, hsp, p, n, wl, ev), DEV("OpenCL Read Buffer Rect"), region_bytes(r))
ENQ(clEnqueueWriteBufferRect,
    (cl_command_queue q, cl_mem m, cl_bool b, const size_t *bo, const size_t *ho, const size_t *r, size_t brp, size_t bsp, size_t hrp, size_t hsp, const void *p, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, b, bo, ho, r, brp, bsp, hrp, hsp, p, n, wl, ev), DEV("OpenCL Write Buffer Rect"), region_bytes(r))
ENQ(clEnqueueCopyBufferRect,
    (cl_command_queue q, cl_mem s, cl_mem d, const size_t *so, const size_t *dof, const size_t *r, size_t srp, size_t ssp, size_t drp, size_t dsp, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, s, d, so, dof, r, srp, ssp, drp, dsp, n, wl, ev), DEV("OpenCL Copy Buffer Rect"), region_bytes(r))
ENQ(clEnqueueUnmapMemObject, (cl_command_queue q, cl_mem m, void *p, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, p, n, wl, ev), DEV("OpenCL Unmap"), 0)
ENQ(clEnqueueReadImage,
    (cl_command_queue q, cl_mem m, cl_bool b, const size_t *o, const size_t *r, size_t rp, size_t sp, void *p, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, b, o, r, rp, sp, p, n, wl, ev), DEV("OpenCL Read Image"), image_bytes(m, r))
ENQ(clEnqueueWriteImage,
    (cl_command_queue q, cl_mem m, cl_bool b, const size_t *o, const size_t *r, size_t rp, size_t sp, const void *p, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, b, o, r, rp, sp, p, n, wl, ev), DEV("OpenCL Write Image"), image_bytes(m, r))
ENQ(clEnqueueCopyImage,
    (cl_command_queue q, cl_mem s, cl_mem d, const size_t *so, const size_t *dof, const size_t *r, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, s, d, so, dof, r, n, wl, ev), DEV("OpenCL Copy Image"), image_bytes(s, r))
ENQ(clEnqueueFillImage,
    (cl_command_queue q, cl_mem m, const void *color, const size_t *o, const size_t *r, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, m, color, o, r, n, wl, ev), DEV("OpenCL Fill Image"), image_bytes(m, r))
ENQ(clEnqueueCopyImageToBuffer,
    (cl_command_queue q, cl_mem s, cl_mem d, const size_t *so, const size_t *r, size_t dof, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, s, d, so, r, dof, n, wl, ev), DEV("OpenCL Copy Image To Buffer"), image_bytes(s, r))
ENQ(clEnqueueCopyBufferToImage,
    (cl_command_queue q, cl_mem s, cl_mem d, size_t so, const size_t *dof, const size_t *r, cl_uint n, const cl_event *wl, cl_event *ev),
    (q, s, d, so, dof, r, n, wl, ev), DEV("OpenCL Copy Buffer To Image"), image_bytes(d, r))

/* the map calls return the mapped pointer and the status in *err */
void *clEnqueueMapBuffer(cl_command_queue q, cl_mem m, cl_bool b, cl_map_flags f, size_t off, size_t size, cl_uint n, const cl_event *wl, cl_event *ev, cl_int *err);
REAL(clEnqueueMapBuffer)
void *clEnqueueMapBuffer(cl_command_queue q, cl_mem m, cl_bool b, cl_map_flags f, size_t off, size_t size, cl_uint n, const cl_event *wl, cl_event *ev, cl_int *err) {
	cl_int rc = CL_INVALID_OPERATION;
	if (!real_clEnqueueMapBuffer()) {
		if (err)
			*err = rc;
		return NULL;
	}
	static _Atomic uint32_t host;
	kp_call c;
	call_begin(&c, &host, "clEnqueueMapBuffer", &ev);
	void *p = real_clEnqueueMapBuffer()(q, m, b, f, off, size, n, wl, ev, &rc);
	if (c.on)
		call_end(&c, rc, q, DEV("OpenCL Map Buffer"), size);
	if (err)
		*err = rc;
	return p;
}

void *clEnqueueMapImage(cl_command_queue q, cl_mem m, cl_bool b, cl_map_flags f, const size_t *o, const size_t *r, size_t *rp, size_t *sp, cl_uint n, const cl_event *wl, cl_event *ev, cl_int *err);
REAL(clEnqueueMapImage)
void *clEnqueueMapImage(cl_command_queue q, cl_mem m, cl_bool b, cl_map_flags f, const size_t *o, const size_t *r, size_t *rp, size_t *sp, cl_uint n, const cl_event *wl, cl_event *ev, cl_int *err) {
	cl_int rc = CL_INVALID_OPERATION;
	if (!real_clEnqueueMapImage()) {
		if (err)
			*err = rc;
		return NULL;
	}
	static _Atomic uint32_t host;
	kp_call c;
	call_begin(&c, &host, "clEnqueueMapImage", &ev);
	void *p = real_clEnqueueMapImage()(q, m, b, f, o, r, rp, sp, n, wl, ev, &rc);
	if (c.on)
		call_end(&c, rc, q, DEV("OpenCL Map Image"), image_bytes(m, r));
	if (err)
		*err = rc;
	return p;
}

/* ---- synchronisation ---- */

cl_int clFinish(cl_command_queue q);
REAL(clFinish)

cl_int clFinish(cl_command_queue q) {
	if (!real_clFinish())
		return CL_INVALID_OPERATION;
	static _Atomic uint32_t host;
	kp_call c;
	call_begin(&c, &host, "clFinish", NULL);
	cl_int rc = real_clFinish()(q);
	if (c.on) {
		/* the queue is done: let its last callbacks report, briefly */
		uint32_t nq = atomic_load_explicit(&O.nqueues, memory_order_acquire);
		for (uint32_t i = 0; i < nq; i++)
			if (O.queues[i].q == q)
				wait_pending(&O.queues[i], 100000000ull);
		call_end(&c, rc, q, 0, 0);
	}
	return rc;
}

cl_int clWaitForEvents(cl_uint n, const cl_event *list) {
	if (!real_clWaitForEvents())
		return CL_INVALID_OPERATION;
	static _Atomic uint32_t host;
	kp_call c;
	call_begin(&c, &host, "clWaitForEvents", NULL);
	cl_int rc = real_clWaitForEvents()(n, list);
	if (c.on) {
		call_end(&c, rc, NULL, 0, 0);
	}
	return rc;
}
