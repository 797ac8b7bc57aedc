/*
 * kipimo_device.c: device activity (kernels, transfers, memsets) of GPU and
 * accelerator runtimes, on virtual threads of the process, one per device
 * queue or stream (kipimo_internal.h describes the model).
 *
 * Sources (OpenCL, Kokkos, CUDA) call kp_device_exec from whatever thread
 * learns that an activity ended: the application's, or a runtime's callback
 * or buffer thread. It stages the activity in one bounded multi-producer
 * queue (a ring of cells with sequence numbers: a producer claims a cell
 * with one compare-and-swap, never waits, and drops and counts the activity
 * when the ring is full). At each cut the collector takes every staged
 * activity, sorts them by virtual thread and start, and writes them into
 * the virtual threads' rings, so they go out in that frame, each thread's
 * events in time order.
 *
 * Environment:
 *   KIPIMO_DEVICE_EVENTS activities staged between two cuts (power of two;
 *                        default 65536); beyond, activities are dropped and
 *                        counted. The collector cuts early when it is half full.
 */
#define _GNU_SOURCE
#include "kipimo_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KP_DEVICES 256u

typedef struct kp_dev {
	char runtime[16];
	uint64_t context, device, queue;
	void *vt; /* the core's virtual thread */
	uint32_t tid;
	_Atomic uint64_t lost; /* activities dropped: staging full */
	uint64_t lost_seen;    /* collector */
} kp_dev;

typedef struct kp_act {
	uint32_t dth, fid;
	uint64_t start, end, corr, bytes;
	int injected;
} kp_act;

typedef struct kp_cell {
	_Atomic uint64_t seq;
	kp_act a;
} kp_cell;

static struct {
	pthread_mutex_t mu; /* kp_device_thread */
	kp_dev devs[KP_DEVICES];
	_Atomic uint32_t ndevs;
	pthread_once_t once;
	kp_cell *cells;
	uint64_t mask;
	_Atomic uint64_t enq; /* next cell to claim */
	uint64_t deq;         /* collector: next cell to take */
	kp_act *batch;        /* collector: the activities of one cut */
} D = {.mu = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT};

static void staging_init(void) {
	uint64_t n = 1u << 16;
	const char *v = getenv("KIPIMO_DEVICE_EVENTS");
	if (v && *v) {
		uint64_t want = strtoull(v, NULL, 10), p = 64;
		while (p < want && p < (1ull << 24))
			p <<= 1;
		n = p;
	}
	kp_cell *c = calloc(n, sizeof *c);
	kp_act *b = malloc(n * sizeof *b);
	if (!c || !b) {
		free(c);
		free(b);
		return;
	}
	for (uint64_t i = 0; i < n; i++)
		atomic_init(&c[i].seq, i);
	D.batch = b;
	D.mask = n - 1;
	atomic_store_explicit(&D.enq, 0, memory_order_relaxed);
	D.deq = 0;
	/* published last: kp_device_exec and the collector see cells only once
	 * a virtual thread exists, which is after this returns */
	D.cells = c;
}

uint32_t kp_device_thread(const char *runtime, uint64_t context, uint64_t device, uint64_t queue) {
	if (!kp_ensure_started() || !runtime)
		return UINT32_MAX;
	pthread_once(&D.once, staging_init);
	if (!D.cells)
		return UINT32_MAX;
	pthread_mutex_lock(&D.mu);
	uint32_t n = atomic_load_explicit(&D.ndevs, memory_order_relaxed);
	for (uint32_t i = 0; i < n; i++) {
		kp_dev *d = &D.devs[i];
		if (d->context == context && d->device == device && d->queue == queue && strncmp(d->runtime, runtime, sizeof d->runtime - 1) == 0) {
			pthread_mutex_unlock(&D.mu);
			return i;
		}
	}
	uint32_t h = UINT32_MAX;
	if (n < KP_DEVICES) {
		kp_dev *d = &D.devs[n];
		d->vt = kp_core_device_new(&d->tid);
		if (d->vt) {
			snprintf(d->runtime, sizeof d->runtime, "%s", runtime);
			d->context = context;
			d->device = device;
			d->queue = queue;
			char key[64], val[32];
			static const char *what[3] = {"Context", "Device", "Stream"};
			uint64_t ids[3] = {context, device, queue};
			for (int k = 0; k < 3; k++) {
				snprintf(key, sizeof key, "%s %s", d->runtime, what[k]);
				snprintf(val, sizeof val, "%llu", (unsigned long long)ids[k]);
				kp_core_metadata(d->tid, key, val);
			}
			atomic_store_explicit(&D.ndevs, n + 1, memory_order_release);
			h = n;
		}
	}
	pthread_mutex_unlock(&D.mu);
	return h;
}

void kp_device_exec(uint32_t dth, uint32_t fid, uint64_t start_ns, uint64_t end_ns, uint64_t correlation, uint64_t bytes) {
	kp_device_exec_injected(dth, fid, start_ns, end_ns, correlation, bytes, 0);
}

void kp_device_exec_injected(uint32_t dth, uint32_t fid, uint64_t start_ns, uint64_t end_ns, uint64_t correlation, uint64_t bytes, int injected) {
	if (dth >= atomic_load_explicit(&D.ndevs, memory_order_acquire))
		return;
	uint64_t pos = atomic_load_explicit(&D.enq, memory_order_relaxed);
	for (;;) {
		kp_cell *c = &D.cells[pos & D.mask];
		uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
		int64_t dif = (int64_t)(seq - pos);
		if (dif == 0) {
			if (atomic_compare_exchange_weak_explicit(&D.enq, &pos, pos + 1, memory_order_relaxed, memory_order_relaxed)) {
				c->a = (kp_act){dth, fid, start_ns, end_ns, correlation, bytes, injected};
				atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
				return;
			}
		} else if (dif < 0) {
			atomic_fetch_add_explicit(&D.devs[dth].lost, 1, memory_order_relaxed);
			return;
		} else {
			pos = atomic_load_explicit(&D.enq, memory_order_relaxed);
		}
	}
}

int kp_device_filling(void) {
	if (!atomic_load_explicit(&D.ndevs, memory_order_acquire))
		return 0;
	uint64_t used = atomic_load_explicit(&D.enq, memory_order_relaxed) - D.deq;
	return used > (D.mask + 1) / 2;
}

static int act_cmp(const void *a, const void *b) {
	const kp_act *x = a, *y = b;
	if (x->dth != y->dth)
		return x->dth < y->dth ? -1 : 1;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return (x->end > y->end) - (x->end < y->end);
}

void kp_device_drain(void) {
	uint32_t nd = atomic_load_explicit(&D.ndevs, memory_order_acquire);
	if (!nd)
		return;
	size_t n = 0;
	for (;;) {
		kp_cell *c = &D.cells[D.deq & D.mask];
		if (atomic_load_explicit(&c->seq, memory_order_acquire) != D.deq + 1)
			break; /* empty, or a producer still writing this cell: next cut */
		D.batch[n++] = c->a;
		atomic_store_explicit(&c->seq, D.deq + D.mask + 1, memory_order_release);
		D.deq++;
		if (n > D.mask)
			break;
	}
	if (n > 1)
		qsort(D.batch, n, sizeof *D.batch, act_cmp);
	for (size_t i = 0; i < n; i++) {
		kp_act *a = &D.batch[i];
		kp_core_device_put(D.devs[a->dth].vt, a->fid, a->start, a->end, a->corr, a->bytes, a->injected);
	}
	for (uint32_t i = 0; i < nd; i++) {
		uint64_t l = atomic_load_explicit(&D.devs[i].lost, memory_order_relaxed);
		if (l != D.devs[i].lost_seen) {
			kp_core_device_lost(D.devs[i].vt, l - D.devs[i].lost_seen);
			D.devs[i].lost_seen = l;
		}
	}
}
