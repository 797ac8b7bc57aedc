/*
 * Internal interface of the Kipimo event library, shared by its parts: the
 * core (kipimo_core.c: per-thread buffers, io_step cutting, frame encoding,
 * the NATS publisher), compiler instrumentation (kipimo_cyg.c), the public
 * API (kipimo_api.c), the generated MPI wrappers (kipimo_mpi.c), device
 * activity (kipimo_device.c) and its sources (kipimo_ocl.c for OpenCL,
 * kipimo_kokkos.c for Kokkos Tools, and CUDA's CUPTI source).
 *
 * Hot-path functions (kp_enter, kp_exit, kp_comm, kp_counter) never block,
 * never allocate and never make a system call, except kp_enter of a function
 * named in KIPIMO_INJECT, which sleeps by design when the injection fires.
 */
#ifndef KIPIMO_INTERNAL_H
#define KIPIMO_INTERNAL_H

#include <stdint.h>

#define KP_SEND 0u
#define KP_RECV 1u

/* Tag of the comm events that collectives record (MPI tags are never this large). */
#define KP_TAG_COLLECTIVE 0xFFFFFFFFu

#ifdef __cplusplus
extern "C" {
#endif

/* kp_func_id returns the id of the function called name, registering it on
 * first use. Slow path (takes a lock): callers cache the result. */
uint32_t kp_func_id(const char *name);

/* kp_counter_id is kp_func_id for counter names. */
uint32_t kp_counter_id(const char *name);

/* kp_enter and kp_exit record the entry and exit of function fid on the
 * calling thread. */
void kp_enter(uint32_t fid);
void kp_exit(uint32_t fid);

/* kp_comm records a communication event on the calling thread: kind is
 * KP_SEND or KP_RECV, partner a rank of MPI_COMM_WORLD, bytes the message
 * size. */
void kp_comm(uint32_t kind, uint32_t partner, uint32_t tag, uint64_t bytes);

/* kp_counter records the value of counter cid on the calling thread. */
void kp_counter(uint32_t cid, uint64_t value);

/* kp_counter_apart is kp_counter after a wait (a spin of at most 1 µs)
 * that puts the counter in a later µs than the thread's previous event, so
 * that it is attached to the call open now, not to one that just ended at
 * the same µs. For counters that must attach to their call (correlation
 * ids, bytes); kp_correlate records its counter this way. */
void kp_counter_apart(uint32_t cid, uint64_t value);

/* kp_set_rank sets the process's rank (in MPI_COMM_WORLD) once MPI knows
 * it; frames cut from then on carry it. */
void kp_set_rank(uint32_t rank);

/* kp_metadata records a key/value pair of metadata for the calling thread;
 * it goes out with the next frame. Slow path. */
void kp_metadata(const char *key, const char *value);

/* kp_step_mark cuts an io_step now (from the explicit API); the periodic
 * cut still happens too. */
void kp_step_mark(void);

/* kp_flush cuts a final io_step and sends every frame still queued, waiting
 * at most the configured flush timeout. Called at MPI_Finalize and at exit. */
void kp_flush(void);

/* kp_ensure_started starts the library if its constructor has not run yet
 * (calls from other constructors). Returns 0 when the library is disabled. */
int kp_ensure_started(void);

/* ---- device activity (kipimo_device.c) ----
 *
 * A device queue or stream is a virtual thread of the process, with a tid
 * of its own and metadata "<runtime> Context", "<runtime> Device" and
 * "<runtime> Stream" (numbers) that mark it a GPU thread. Each device
 * activity (kernel, transfer, memset) is an execution on it, from its start
 * to its end on the host clock, with a "Correlation ID" counter (the id its
 * host launch recorded with kp_correlate) and, for transfers, a "Device
 * Bytes" counter, both at the activity's end. Activities are staged in a
 * bounded lock-free queue and written out by the collector at the next cut:
 * each goes out with the io_step in which it was reported (after it
 * ended), sorted per virtual thread; one that would overlap the previous
 * activity of its thread starts at that one's end. A full queue drops the
 * activity, counted as "Kipimo Dropped Calls: [device activities]" on its
 * virtual thread. */

/* kp_device_thread returns the handle of the virtual thread of device queue/stream `queue` on device
 * `device` for runtime `runtime` ("OpenCL", "CUDA", "Kokkos", "HIP"), creating it on first use with its
 * own tid and the metadata that marks it a GPU thread (context, device, stream/queue). Slow path.
 * Returns UINT32_MAX when the library is off or the table of virtual threads is full. */
uint32_t kp_device_thread(const char *runtime, uint64_t context, uint64_t device, uint64_t queue);
/* kp_device_exec records one device activity (kernel, transfer, memset) that ran on virtual thread dth
 * from start_ns to end_ns (host clock, CLOCK_MONOTONIC ns as kp_now_ns), named fid, linked to its host
 * launch by correlation (0: none) and moving bytes (0 for kernels). Callable from any thread,
 * including a runtime's callback/buffer thread; never blocks; bounded and drop-counted. */
void kp_device_exec(uint32_t dth, uint32_t fid, uint64_t start_ns, uint64_t end_ns, uint64_t correlation, uint64_t bytes);
/* kp_correlate records a fresh correlation id as the "Correlation ID" counter on the calling thread
 * (inside the host call that launches device work) and returns it. It records it as kp_counter_apart
 * does: call it late in the launch call (after the runtime's launch) and it seldom waits. */
uint64_t kp_correlate(void);
/* kp_now_ns is the host clock the library stamps events with, in ns. */
uint64_t kp_now_ns(void);

/* ---- between the core and kipimo_device.c (not for activity sources) ---- */

/* kp_core_device_new makes a virtual thread that only the collector writes
 * and returns it (NULL when the library is off), its tid in *tid. */
void *kp_core_device_new(uint32_t *tid);
/* kp_core_metadata records metadata for thread tid. */
void kp_core_metadata(uint32_t tid, const char *key, const char *value);
/* kp_core_device_put writes one activity into virtual thread vt's ring
 * (collector only, at the cut, in start order per thread). */
void kp_core_device_put(void *vt, uint32_t fid, uint64_t start_ns, uint64_t end_ns, uint64_t correlation, uint64_t bytes, int injected);
/* kp_core_device_lost counts n activities of vt dropped before the cut. */
void kp_core_device_lost(void *vt, uint64_t n);
/* kp_inject_draw draws, on the calling thread's injection generator,
 * whether a delay injected into function fid (KIPIMO_INJECT) fires now;
 * when it does it returns 1 and the delay in *delay_ns. For sources that
 * delay device work themselves (a kernel named in KIPIMO_INJECT). */
int kp_inject_draw(uint32_t fid, uint64_t *delay_ns);
/* kp_device_exec_injected is kp_device_exec for an activity delayed on
 * purpose (injected 1): its execution is recorded as ground truth, as an
 * injected call is. */
void kp_device_exec_injected(uint32_t dth, uint32_t fid, uint64_t start_ns, uint64_t end_ns, uint64_t correlation, uint64_t bytes, int injected);

/* kp_device_drain moves the staged activities into their virtual threads
 * (collector, at the cut); kp_device_filling says the staging queue is
 * half full (the collector cuts early). */
void kp_device_drain(void);
int kp_device_filling(void);

#ifdef __cplusplus
}
#endif

#endif
