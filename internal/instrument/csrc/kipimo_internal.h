/*
 * Internal interface of the Kipimo event library, shared by its parts: the
 * core (kipimo_core.c: per-thread buffers, io_step cutting, frame encoding,
 * the NATS publisher), compiler instrumentation (kipimo_cyg.c), the public
 * API (kipimo_api.c) and the generated MPI wrappers (kipimo_mpi.c).
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

#ifdef __cplusplus
}
#endif

#endif
