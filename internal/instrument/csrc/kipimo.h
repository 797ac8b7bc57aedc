/*
 * kipimo.h: the explicit instrumentation API of Kipimo's event library.
 *
 * Compile and link with the flags `kipimo lib --cflags --libs` prints, then run
 * the program under `kipimo run --exec` or `kipimo exec`, which set the
 * library's environment (where to stream, the run id, the period).
 *
 *   kipimo_begin("solve");  ...  kipimo_end("solve");
 *   kipimo_counter("residual e-9", (uint64_t)(r * 1e9));
 *   kipimo_metadata("input deck", "in.lj");
 *   kipimo_step();          // end the current io_step now
 *
 * Every call is safe from any thread. Regions must nest per thread, like
 * function calls. kipimo_begin/kipimo_end look the name up in a lock-free
 * table (a few ns); KIPIMO_REGION_ID caches the id per call site.
 *
 * Fortran (gfortran or any compiler that appends an underscore and passes
 * string lengths by value at the end):
 *   call kipimo_begin("solve")
 *   call kipimo_end("solve")
 *   call kipimo_counter("iterations", int(it, 8))
 *   call kipimo_metadata("input deck", "in.lj")
 *   call kipimo_step()
 */
#ifndef KIPIMO_H
#define KIPIMO_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kipimo_region_id returns the id of the region (function) called name. */
uint32_t kipimo_region_id(const char *name);
/* kipimo_begin_id and kipimo_end_id enter and leave the region of an id. */
void kipimo_begin_id(uint32_t id);
void kipimo_end_id(uint32_t id);
/* kipimo_begin and kipimo_end enter and leave the region called name. */
void kipimo_begin(const char *name);
void kipimo_end(const char *name);
/* kipimo_counter records a value of the counter called name on this thread. */
void kipimo_counter(const char *name, uint64_t value);
/* kipimo_metadata attaches a key/value pair to this thread of the run. */
void kipimo_metadata(const char *key, const char *value);
/* kipimo_step ends the current io_step now (steps are also cut every period). */
void kipimo_step(void);
/* kipimo_set_rank tells the library this process's rank, for programs that
 * are parallel without MPI (MPI programs need not call it). */
void kipimo_set_rank(uint32_t rank);

/* KIPIMO_REGION_ID(name) is kipimo_region_id cached in a static per call site. */
#define KIPIMO_REGION_ID(name) \
	__extension__({ static uint32_t kipimo_id_plus1_; \
	uint32_t kipimo_v_ = __atomic_load_n(&kipimo_id_plus1_, __ATOMIC_RELAXED); \
	if (!kipimo_v_) { kipimo_v_ = kipimo_region_id(name) + 1; \
		__atomic_store_n(&kipimo_id_plus1_, kipimo_v_, __ATOMIC_RELAXED); } \
	kipimo_v_ - 1; })

#ifdef __cplusplus
}

/* kipimo::Region enters a region for the lifetime of a scope (C++). */
namespace kipimo {
class Region {
public:
	explicit Region(const char *name) : id_(kipimo_region_id(name)) { kipimo_begin_id(id_); }
	~Region() { kipimo_end_id(id_); }
	Region(const Region &) = delete;
	Region &operator=(const Region &) = delete;
private:
	uint32_t id_;
};
}
#endif

#endif
