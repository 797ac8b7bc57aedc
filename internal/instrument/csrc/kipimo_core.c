/*
 * kipimo_core.c: the core of Kipimo's in-process event library.
 *
 * Application threads append fixed-size events to a ring buffer of their
 * own (single producer, single consumer, no locks, no allocation, no system
 * call). One background thread, started on the first event, cuts an io_step
 * every KIPIMO_PERIOD (or sooner when a ring is three quarters full), encodes
 * it as a Kipimo binary frame (schemas/frame-binary.md) and publishes it to
 * NATS on kipimo.<run>.frames.<pid>.<rank> with a small client of NATS's text
 * protocol. When the server is slow or gone, encoded frames wait in a queue
 * bounded by KIPIMO_QUEUE_BYTES; beyond it frames are dropped and counted,
 * and the count travels on every later message (header
 * Kipimo-Source-Dropped) and in the status file written at exit. The
 * application itself never waits for any of this.
 *
 * Exact at any call rate. An entry is written only when the ring has room
 * for it and for the exits of every call open on its thread, so a full ring
 * drops whole calls (with every call and event inside them), never an exit
 * whose entry was recorded; the calls dropped are counted per function. A
 * function called more than KIPIMO_SUMMARY_RATE times a second on a thread
 * is hot there: the entry of each of its calls waits for the exit, and a
 * call that made no instrumented call, comm or counter event meanwhile (a
 * leaf) is added to its thread's summary of that call path (count, total,
 * minimum, maximum) instead of streamed. Summaries and drops go out with
 * each frame as counter events named "Kipimo Summary Calls: <path>",
 * "Kipimo Summary Time (ns): <path>", "Kipimo Summary Min (ns): <path>",
 * "Kipimo Summary Max (ns): <path>" (path "A => B => leaf"), "Kipimo Dropped
 * Calls: <function>", "Kipimo Dropped Comm Events" and "Kipimo Dropped
 * Counter Events", at the frame's t_end on the thread they happened on.
 *
 * A name (function, counter) or metadata entry goes with the first frame
 * that follows its registration, and again, with every other one, in every
 * KIPIMO_NAMES_EVERY-th frame and in the first frame after a reconnect or a
 * dropped frame, so a consumer that starts late learns every name within
 * that many frames.
 *
 * Environment (set by `kipimo run --exec` and `kipimo exec`):
 *   KIPIMO_NATS          nats://[user:pass@|token@]host:port (default nats://127.0.0.1:4222)
 *   KIPIMO_RUN           run id; without it the library stays off, so a program
 *                        linked with it runs as if it were not
 *   KIPIMO_PID           program id (default 0)
 *   KIPIMO_RANK          rank; otherwise OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
 *                        SLURM_PROCID, else 0 (MPI_Init sets it too)
 *   KIPIMO_PERIOD        io_step period: "1s", "250ms", "0.5" (seconds); default 1s
 *   KIPIMO_BUFFER_EVENTS events per thread ring (power of two; default 131072)
 *   KIPIMO_QUEUE_BYTES   bound of encoded frames waiting to be sent (default 64 MiB)
 *   KIPIMO_NAMES_EVERY   every Nth frame carries every name and metadata entry again
 *                        (default 16; 0: only after a reconnect or a dropped frame)
 *   KIPIMO_EXCLUDE       comma-separated shell patterns of function names not recorded
 *   KIPIMO_INJECT        FUNC:PROB:DELAY[@RANKS][,...] fault injection (e.g. MPI_Send:0.004:25ms,
 *                        compute:0.05:20ms@2; RANKS: ranks and ranges R-R joined by +)
 *   KIPIMO_SEED          seed of the injection draws (default 1)
 *   KIPIMO_COUNTERS      0 turns the per-step process counters off
 *   KIPIMO_CLOCK         tsc or monotonic (default: tsc where it is invariant)
 *   KIPIMO_FLUSH_TIMEOUT how long exit waits for queued frames to leave (default 5s)
 *   KIPIMO_STATUS_DIR    where status.<pid>.<rank>.<ospid>.json is written at exit
 *   KIPIMO_SUMMARY_RATE  calls per second of one function on one thread beyond which
 *                        its leaf calls are summarised instead of streamed (default
 *                        10000; 0: never)
 *   KIPIMO_DISABLE       1 turns the library off
 */
#define _GNU_SOURCE
#include "kipimo_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#define KP_VERSION "1"
#define KP_MAX_FUNCS (1u << 18)
#define KP_MAX_COUNTERS (1u << 16)
#define KP_ADDR_SLOTS (1u << 19)

/* Event types, kept in the top three bits of an event's tick. */
enum { EV_ENTRY = 0, EV_EXIT = 1, EV_ENTRY_INJECTED = 2, EV_COUNTER = 3, EV_SEND = 4, EV_RECV = 5 };
#define EV_SHIFT 61
#define EV_TICKS ((1ull << EV_SHIFT) - 1)

typedef struct kp_ev {
	uint64_t t;   /* ticks | type << 61 */
	uint64_t v;   /* counter value, message bytes */
	uint32_t id;  /* fid, cid or partner rank */
	uint32_t aux; /* tag */
} kp_ev;

/* Depth of the per-thread stack of open recorded calls that summaries name
 * their call paths from; a hot leaf deeper than this is streamed. */
#define KP_STACK 256
/* Call paths a thread can summarise, and the function ids their paths
 * hold in all; a hot leaf on a path beyond these is streamed. */
#define KP_SUMS 1024u
#define KP_SUM_SLOTS (2 * KP_SUMS)
#define KP_ARENA (16u * KP_SUMS)
/* Functions whose dropped calls a thread counts apart; the rest share the
 * last entry. */
#define KP_DROPS 512u
#define KP_DROP_SLOTS (2 * KP_DROPS)

/* A function's calls on a thread in the current window (win): beyond
 * K.win_limit the function is hot; a window that follows a hot one starts
 * at the limit, so the function stays hot while it is called as fast. */
typedef struct kp_rate {
	uint32_t win, n;
} kp_rate;

/* The summary of one call path's hot leaf calls on one thread. The owner
 * thread writes count, total and the per-epoch minimum and maximum (two
 * buffers by the parity of the io_step epoch, so the collector reads the
 * ending epoch's while the thread fills the next); the collector reads them
 * and keeps what it has reported in seen_* and the counter ids in cid. */
typedef struct kp_sum {
	uint64_t key;      /* path hash, never 0 */
	uint32_t off, len; /* the path's function ids in the thread's arena */
	_Atomic uint64_t count, total;
	_Atomic uint64_t epb[2], min[2], max[2]; /* epb: epoch + 1 the buffer holds */
	uint64_t seen_count, seen_total;
	uint32_t cid[4]; /* counter id + 1: calls, time, min, max */
} kp_sum;

/* The calls of one function dropped whole on one thread (ring full). */
typedef struct kp_drop {
	uint32_t fid;
	uint32_t cid; /* collector: counter id + 1 */
	_Atomic uint64_t n;
	uint64_t seen;
} kp_drop;

typedef struct kp_thread {
	_Atomic uint64_t head; /* written by the owner only */
	char pad0[56];
	_Atomic uint64_t tail; /* written by the collector only */
	char pad1[56];
	kp_ev *ring;
	uint64_t mask;
	_Atomic uint64_t dropped; /* events dropped: ring full, written by the owner */
	uint32_t skip;            /* open calls dropped whole (a dropped call and the calls in it) */
	uint32_t tid;
	uint64_t rng;
	_Atomic int retired; /* the thread has exited */
	int gone;            /* collector: seen retired before its last read */
	/* Owner only: the open calls whose entries are in the ring (their exits
	 * have room reserved); the outermost KP_STACK of them have their
	 * function in sfid and the hash of their call path in shash (computed
	 * when a summary first needs it). */
	uint32_t depth;
	uint32_t pend;   /* fid + 1 of a hot call whose entry waits for its exit, 0 none */
	uint64_t pend_t; /* its entry tick */
	uint32_t sfid[KP_STACK];
	uint64_t *shash;
	uint32_t hvalid; /* shash[0..hvalid) are up to date */
	kp_rate *rate;   /* per fid */
	kp_sum *sums;
	uint16_t *sum_slot; /* path hash table: index in sums + 1 */
	_Atomic uint32_t nsums;
	uint32_t *arena;
	uint32_t arena_used;
	kp_sum *last_sum;
	kp_drop *drops;
	uint16_t *drop_slot; /* fid hash table: index in drops + 1 */
	_Atomic uint32_t ndrops;
	_Atomic uint64_t dropped_comm, dropped_counter; /* comm and counter events dropped */
	uint64_t seen_comm, seen_counter;              /* collector */
	uint32_t cid_comm, cid_counter;                /* collector: counter id + 1 */
	/* A device queue's virtual thread (kipimo_device.c): only the collector
	 * writes its ring, whose times are µs since the epoch, not ticks. */
	int device;
	uint64_t dlast_us;           /* end of the last activity written, µs; 0 none */
	uint64_t dlost, dlost_seen;  /* activities dropped before the cut, reported */
	uint32_t cid_dlost;          /* counter id + 1 */
} kp_thread;

/* A dictionary of names: functions or counters. Ids are dense. Lookups by
 * name are lock-free; insertions take the lock. */
typedef struct kp_dict {
	uint32_t max;
	uint32_t slots; /* power of two, 2*max */
	_Atomic(const char *) *slot_name;
	uint32_t *slot_id;
	uint64_t *slot_hash;
	const char **names; /* NULL while an address awaits resolution */
	uintptr_t *addr;
	_Atomic uint8_t *excluded;
	_Atomic uint32_t count;
	uint32_t sent; /* collector: names sent so far */
	pthread_mutex_t mu;
} kp_dict;

typedef struct kp_meta {
	uint32_t tid;
	char *key, *value;
} kp_meta;

typedef struct kp_inject {
	char *func;
	double prob;
	uint64_t delay_ns;
	uint32_t (*ranks)[2]; /* inclusive rank ranges; none: every rank */
	int nranks;
} kp_inject;

typedef struct kp_truth {
	char *func;
	uint32_t tid;
	uint64_t entry_us;
	uint64_t delay_us;
} kp_truth;

/* A counter event the collector adds to a thread's events at the cut. */
typedef struct kp_xev {
	uint32_t cid;
	uint64_t value;
} kp_xev;

typedef struct kp_msg {
	struct kp_msg *next;
	size_t len;
	int frame; /* 1 for a frame, 0 for the end of the stream */
	char data[];
} kp_msg;

static struct {
	/* configuration */
	char nats_host[256], nats_port[16], nats_user[128], nats_pass[128], nats_token[256];
	char run[128];
	uint32_t pid;
	_Atomic uint32_t rank;
	uint64_t period_ns;
	uint64_t ring_events;
	uint64_t queue_bytes;
	uint64_t names_every; /* every Nth frame repeats the whole dictionary; 0 never */
	char **exclude;
	int nexclude;
	kp_inject *inject;
	int ninject;
	_Atomic uint64_t *inject_threshold; /* per fid: probability in 2^-64 units, 0 = none */
	_Atomic uint16_t *inject_of;        /* per fid: index in inject + 1, 0 = none */
	uint64_t seed;
	int counters_on;
	int use_tsc;
	uint64_t flush_timeout_ns;
	char status_dir[1024];
	uint64_t summary_rate; /* calls per second per thread beyond which a leaf is summarised; 0 never */

	/* Hot leaves: a thread counts each function's calls per window (the
	 * collector turns win every KP_WINDOW_NS); beyond win_limit calls in a
	 * window (or in the window before) the function is hot on that thread.
	 * epoch counts the cuts, for the per-step minimum and maximum of
	 * summaries. */
	_Atomic uint32_t win, win_limit;
	uint64_t next_win_ns; /* collector */
	_Atomic uint64_t epoch;

	/* state */
	_Atomic int on;      /* 1 while recording */
	_Atomic int started; /* 1 once the collector runs */
	pthread_once_t start_once;
	pthread_key_t key;
	uint64_t realtime_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC at start */

	kp_dict funcs, counters;
	_Atomic uintptr_t *addr_key;
	_Atomic uint32_t *addr_val;

	pthread_mutex_t reg_mu;
	kp_thread **threads;
	uint32_t nthreads, cap_threads;
	_Atomic uint32_t next_tid;

	pthread_mutex_t meta_mu;
	kp_meta *meta; /* every entry so far: a reconnect sends them all again */
	size_t nmeta, cap_meta, sent_meta;
	int resend; /* collector: the next frame repeats every name and metadata entry */

	/* collector */
	pthread_t collector;
	int wake_fd;
	pthread_mutex_t flush_mu;
	pthread_cond_t flush_cv;
	uint64_t flush_req, flush_done; /* generation counters */
	int final_req, final_done;
	uint64_t step;
	uint64_t seg_tick, seg_ns; /* last cut's clock readings */
	double seg_scale;          /* ns per tick of the last segment */
	uint64_t last_us;          /* t_end of the last frame, µs */
	uint64_t cpu_us, nvcsw, nivcsw;
	uint32_t cid_cpu, cid_rss, cid_vcsw, cid_ivcsw;
	int statm_fd;
	char *buf; /* frame body being encoded */
	size_t blen, bcap;
	kp_truth *truth;
	size_t ntruth, cap_truth;
	kp_xev *xev; /* the counter events of summaries and drops of the frame being cut */
	size_t nxev, cap_xev;
	uint64_t calls_summarised, calls_dropped; /* reported in frames so far */

	/* NATS connection, owned by the collector */
	int fd;
	int state; /* 0 down, 1 connecting, 2 awaiting INFO, 3 connected */
	int headers;
	uint64_t max_payload;
	uint64_t next_retry_ns, backoff_ns;
	char in[8192];
	size_t inlen;
	char ctrl[256];
	size_t ctrllen;
	kp_msg *qhead, *qtail;
	size_t qbytes, qoff;
	uint64_t pongs, pings_sent;

	/* counts for the status file */
	uint64_t frames, frames_sent, frames_dropped, oversize, events, bytes_sent, connects, connect_failures;
	char last_error[256];
} K = {.start_once = PTHREAD_ONCE_INIT, .reg_mu = PTHREAD_MUTEX_INITIALIZER,
       .meta_mu = PTHREAD_MUTEX_INITIALIZER, .flush_mu = PTHREAD_MUTEX_INITIALIZER,
       .flush_cv = PTHREAD_COND_INITIALIZER, .fd = -1, .wake_fd = -1, .statm_fd = -1};

static __thread kp_thread *kp_self __attribute__((tls_model("initial-exec")));
static __thread int kp_dead __attribute__((tls_model("initial-exec")));

/* ---- clock ---- */

static uint64_t mono_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t ticks(void) {
#if defined(__x86_64__) || defined(__i386__)
	if (__builtin_expect(K.use_tsc, 1))
		return __rdtsc() & EV_TICKS;
#endif
	return mono_ns();
}

/* tick_to_us converts a tick of the current segment to µs since the epoch. */
static inline uint64_t tick_to_us(uint64_t t) {
	uint64_t ns;
	if (!K.use_tsc)
		ns = t;
	else if (t >= K.seg_tick)
		ns = K.seg_ns + (uint64_t)((double)(t - K.seg_tick) * K.seg_scale);
	else
		ns = K.seg_ns - (uint64_t)((double)(K.seg_tick - t) * K.seg_scale);
	return (ns + K.realtime_offset_ns) / 1000;
}

static int tsc_invariant(void) {
#if defined(__x86_64__) || defined(__i386__)
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (!f)
		return 0;
	char line[4096];
	int ok = 0;
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "flags", 5) == 0) {
			ok = strstr(line, " constant_tsc") && strstr(line, " nonstop_tsc");
			break;
		}
	}
	fclose(f);
	return ok;
#else
	return 0;
#endif
}

/* ---- configuration ---- */

static const char *env(const char *name) {
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

/* parse_duration_ns reads "25ms", "1s", "500us", "2m" or a bare number of seconds. */
static int parse_duration_ns(const char *s, uint64_t *out) {
	char *end;
	double v = strtod(s, &end);
	if (end == s || v < 0)
		return -1;
	double mul = 1e9;
	if (*end == 0 || strcmp(end, "s") == 0)
		mul = 1e9;
	else if (strcmp(end, "ms") == 0)
		mul = 1e6;
	else if (strcmp(end, "us") == 0 || strcmp(end, "µs") == 0)
		mul = 1e3;
	else if (strcmp(end, "ns") == 0)
		mul = 1;
	else if (strcmp(end, "m") == 0)
		mul = 60e9;
	else
		return -1;
	*out = (uint64_t)(v * mul);
	return 0;
}

static void set_error(const char *fmt, const char *arg) {
	snprintf(K.last_error, sizeof K.last_error, fmt, arg);
}

static void parse_nats_url(const char *url) {
	const char *p = url;
	const char *sep = strstr(p, "://");
	if (sep)
		p = sep + 3;
	const char *at = strrchr(p, '@');
	if (at) {
		char cred[512];
		snprintf(cred, sizeof cred, "%.*s", (int)(at - p), p);
		char *colon = strchr(cred, ':');
		if (colon) {
			*colon = 0;
			snprintf(K.nats_user, sizeof K.nats_user, "%s", cred);
			snprintf(K.nats_pass, sizeof K.nats_pass, "%s", colon + 1);
		} else {
			snprintf(K.nats_token, sizeof K.nats_token, "%s", cred);
		}
		p = at + 1;
	}
	/* only the first server of a comma-separated list is used */
	char hp[300];
	snprintf(hp, sizeof hp, "%s", p);
	char *comma = strchr(hp, ',');
	if (comma)
		*comma = 0;
	char *slash = strchr(hp, '/');
	if (slash)
		*slash = 0;
	char *colon = strrchr(hp, ':');
	if (colon && !strchr(colon, ']')) {
		*colon = 0;
		snprintf(K.nats_port, sizeof K.nats_port, "%s", colon + 1);
	} else {
		snprintf(K.nats_port, sizeof K.nats_port, "4222");
	}
	char *h = hp;
	if (*h == '[') { /* [ipv6] */
		h++;
		char *rb = strchr(h, ']');
		if (rb)
			*rb = 0;
	}
	snprintf(K.nats_host, sizeof K.nats_host, "%s", *h ? h : "127.0.0.1");
}

static char **split_list(const char *s, int *n) {
	*n = 0;
	if (!s)
		return NULL;
	int cap = 1;
	for (const char *c = s; *c; c++)
		cap += *c == ',';
	char **out = calloc((size_t)cap, sizeof *out);
	char *dup = strdup(s);
	char *save = NULL;
	for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		if (*tok)
			out[(*n)++] = strdup(tok);
	}
	free(dup);
	return out;
}

/* parse_ranks reads RANKS of FUNC:PROB:DELAY@RANKS: ranks and ranges
 * R-R joined by '+', e.g. 3 or 0-1+6. It returns 0 on success. */
static int parse_ranks(const char *s, kp_inject *in) {
	int n = 1;
	for (const char *c = s; *c; c++)
		n += *c == '+';
	in->ranks = calloc((size_t)n, sizeof *in->ranks);
	if (!in->ranks)
		return -1;
	const char *c = s;
	for (;;) {
		char *end;
		if (*c < '0' || *c > '9')
			return -1;
		unsigned long lo = strtoul(c, &end, 10), hi = lo;
		if (*end == '-') {
			if (end[1] < '0' || end[1] > '9')
				return -1;
			hi = strtoul(end + 1, &end, 10);
		}
		if (lo > hi || hi > UINT32_MAX)
			return -1;
		in->ranks[in->nranks][0] = (uint32_t)lo;
		in->ranks[in->nranks][1] = (uint32_t)hi;
		in->nranks++;
		if (*end == 0)
			return 0;
		if (*end != '+')
			return -1;
		c = end + 1;
	}
}

/* inject_here reports whether injection in applies to this process's rank
 * (read at each draw: MPI_Init may set the rank after the names). */
static int inject_here(const kp_inject *in) {
	if (in->nranks == 0)
		return 1;
	uint32_t r = atomic_load_explicit(&K.rank, memory_order_relaxed);
	for (int i = 0; i < in->nranks; i++)
		if (r >= in->ranks[i][0] && r <= in->ranks[i][1])
			return 1;
	return 0;
}

static void parse_inject(const char *s) {
	int n;
	char **items = split_list(s, &n);
	K.inject = calloc((size_t)n + 1, sizeof *K.inject);
	for (int i = 0; i < n; i++) {
		kp_inject in = {0};
		/* FUNC:PROB:DELAY[@RANKS]; RANKS follows the last ':' */
		char *at = strrchr(items[i], '@');
		if (at && at > strrchr(items[i], ':')) {
			*at = 0;
			if (parse_ranks(at + 1, &in) != 0) {
				set_error("KIPIMO_INJECT: bad ranks @%s (want R or R-R, joined by +)", at + 1);
				free(in.ranks);
				continue;
			}
		}
		/* FUNC:PROB:DELAY; FUNC may contain ':' (C++ names), so split from the right */
		char *d = strrchr(items[i], ':');
		if (!d) {
			set_error("KIPIMO_INJECT: %s is not FUNC:PROB:DELAY", items[i]);
			free(in.ranks);
			continue;
		}
		*d = 0;
		char *p = strrchr(items[i], ':');
		if (!p) {
			set_error("KIPIMO_INJECT: %s is not FUNC:PROB:DELAY", items[i]);
			free(in.ranks);
			continue;
		}
		*p = 0;
		char *end;
		double prob = strtod(p + 1, &end);
		uint64_t delay;
		if (*end || prob < 0 || prob > 1 || parse_duration_ns(d + 1, &delay) != 0) {
			set_error("KIPIMO_INJECT: bad probability or delay in %s", items[i]);
			free(in.ranks);
			continue;
		}
		in.func = strdup(items[i]);
		in.prob = prob;
		in.delay_ns = delay;
		K.inject[K.ninject++] = in;
		free(items[i]);
	}
	free(items);
}

static uint32_t env_rank(void) {
	static const char *vars[] = {"KIPIMO_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"};
	for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
		const char *v = env(vars[i]);
		if (v)
			return (uint32_t)strtoul(v, NULL, 10);
	}
	return 0;
}

/* ---- dictionaries ---- */

static uint64_t hash_str(const char *s) {
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h | 1;
}

static void dict_init(kp_dict *d, uint32_t max) {
	d->max = max;
	d->slots = max * 2;
	d->slot_name = calloc(d->slots, sizeof *d->slot_name);
	d->slot_id = calloc(d->slots, sizeof *d->slot_id);
	d->slot_hash = calloc(d->slots, sizeof *d->slot_hash);
	d->names = calloc(max, sizeof *d->names);
	d->addr = calloc(max, sizeof *d->addr);
	d->excluded = calloc(max, sizeof *d->excluded);
	pthread_mutex_init(&d->mu, NULL);
}

static int excluded_name(const char *name) {
	for (int i = 0; i < K.nexclude; i++)
		if (fnmatch(K.exclude[i], name, 0) == 0)
			return 1;
	return 0;
}

static void apply_inject(uint32_t fid, const char *name) {
	for (int i = 0; i < K.ninject; i++) {
		if (strcmp(K.inject[i].func, name) == 0) {
			double p = K.inject[i].prob;
			uint64_t th = p >= 1 ? UINT64_MAX : (uint64_t)(p * 18446744073709551616.0);
			atomic_store_explicit(&K.inject_of[fid], (uint16_t)(i + 1), memory_order_relaxed);
			atomic_store_explicit(&K.inject_threshold[fid], th ? th : 1, memory_order_release);
		}
	}
}

/* dict_new assigns the next id (lock held). */
static uint32_t dict_new(kp_dict *d, const char *name, uintptr_t addr) {
	uint32_t id = atomic_load_explicit(&d->count, memory_order_relaxed);
	if (id >= d->max - 1) {
		id = d->max - 1; /* every further name shares the last id */
		if (!d->names[id]) {
			d->names[id] = strdup("[more functions than the library can name]");
			atomic_store_explicit(&d->count, d->max, memory_order_release);
		}
		return id;
	}
	d->names[id] = name ? strdup(name) : NULL;
	d->addr[id] = addr;
	if (name && d == &K.funcs) {
		if (excluded_name(name))
			atomic_store_explicit(&d->excluded[id], 1, memory_order_relaxed);
		apply_inject(id, name);
	}
	atomic_store_explicit(&d->count, id + 1, memory_order_release);
	return id;
}

static uint32_t dict_lookup(kp_dict *d, const char *name) {
	uint64_t h = hash_str(name);
	uint32_t mask = d->slots - 1;
	for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
		const char *s = atomic_load_explicit(&d->slot_name[i], memory_order_acquire);
		if (!s)
			break;
		if (d->slot_hash[i] == h && strcmp(s, name) == 0)
			return d->slot_id[i];
	}
	pthread_mutex_lock(&d->mu);
	uint32_t i = (uint32_t)h & mask;
	for (;; i = (i + 1) & mask) {
		const char *s = atomic_load_explicit(&d->slot_name[i], memory_order_relaxed);
		if (!s)
			break;
		if (d->slot_hash[i] == h && strcmp(s, name) == 0) {
			uint32_t id = d->slot_id[i];
			pthread_mutex_unlock(&d->mu);
			return id;
		}
	}
	uint32_t id = dict_new(d, name, 0);
	if (id < d->max - 1) {
		d->slot_id[i] = id;
		d->slot_hash[i] = h;
		atomic_store_explicit(&d->slot_name[i], d->names[id], memory_order_release);
	}
	pthread_mutex_unlock(&d->mu);
	return id;
}

uint32_t kp_func_id(const char *name) {
	if (!kp_ensure_started())
		return 0;
	return dict_lookup(&K.funcs, name ? name : "");
}

uint32_t kp_counter_id(const char *name) {
	if (!kp_ensure_started())
		return 0;
	return dict_lookup(&K.counters, name ? name : "");
}

void kp_resolve_name(uintptr_t addr, char *out, size_t n); /* kipimo_cyg.c */

/* kp_addr_id maps a code address (compiler instrumentation) to a function
 * id; the name is resolved later by the collector. Lock-free once known. */
uint32_t kp_addr_id(uintptr_t addr) {
	uint32_t mask = KP_ADDR_SLOTS - 1;
	uint32_t i = (uint32_t)((addr >> 4) * 0x9E3779B97F4A7C15ull >> 40) & mask;
	for (uint32_t probes = 0; probes < KP_ADDR_SLOTS; probes++, i = (i + 1) & mask) {
		uintptr_t k = atomic_load_explicit(&K.addr_key[i], memory_order_acquire);
		if (k == addr) {
			uint32_t v;
			while (!(v = atomic_load_explicit(&K.addr_val[i], memory_order_acquire)))
				; /* another thread is registering it right now */
			return v - 1;
		}
		if (k == 0) {
			uintptr_t zero = 0;
			if (atomic_compare_exchange_strong(&K.addr_key[i], &zero, addr)) {
				/* Named now, once per function, so that exclusions and
				 * injections apply from its first call; a function met
				 * while naming another (an instrumented allocator, say)
				 * is named later by the collector. */
				static __thread int naming;
				char name[1024];
				int named = 0;
				if (!naming) {
					naming = 1;
					kp_resolve_name(addr, name, sizeof name);
					naming = 0;
					named = 1;
				}
				pthread_mutex_lock(&K.funcs.mu);
				uint32_t id = dict_new(&K.funcs, named ? name : NULL, addr);
				pthread_mutex_unlock(&K.funcs.mu);
				atomic_store_explicit(&K.addr_val[i], id + 1, memory_order_release);
				return id;
			}
			i = (i - 1) & mask; /* lost the race: look at this slot again */
		}
	}
	return K.funcs.max - 1;
}

/* ---- threads ---- */

static void thread_retire(void *p) {
	kp_thread *t = p;
	if (t) {
		atomic_store_explicit(&t->retired, 1, memory_order_release);
		kp_self = NULL;
		kp_dead = 1;
	}
}

static void start_collector(void);

static void thread_free(kp_thread *t) {
	free(t->ring);
	free(t->shash);
	free(t->rate);
	free(t->sums);
	free(t->sum_slot);
	free(t->arena);
	free(t->drops);
	free(t->drop_slot);
	free(t);
}

/* thread_alloc makes and registers a thread's buffers; NULL when the
 * library is off or out of memory. */
static kp_thread *thread_alloc(void) {
	pthread_once(&K.start_once, start_collector);
	kp_thread *t = NULL;
	if (atomic_load(&K.on) && posix_memalign((void **)&t, 64, sizeof *t) == 0) {
		memset(t, 0, sizeof *t);
		t->ring = malloc(K.ring_events * sizeof(kp_ev));
		t->shash = malloc(KP_STACK * sizeof *t->shash);
		/* large callocs are fresh zero pages: a page costs only when used */
		t->rate = calloc(KP_MAX_FUNCS, sizeof *t->rate);
		t->sums = calloc(KP_SUMS, sizeof *t->sums);
		t->sum_slot = calloc(KP_SUM_SLOTS, sizeof *t->sum_slot);
		t->arena = malloc(KP_ARENA * sizeof *t->arena);
		t->drops = calloc(KP_DROPS, sizeof *t->drops);
		t->drop_slot = calloc(KP_DROP_SLOTS, sizeof *t->drop_slot);
		if (!t->ring || !t->shash || !t->rate || !t->sums || !t->sum_slot || !t->arena || !t->drops || !t->drop_slot) {
			thread_free(t);
			t = NULL;
		} else {
			t->drops[KP_DROPS - 1].fid = UINT32_MAX; /* every other function */
		}
	}
	if (t) {
		t->mask = K.ring_events - 1;
		pthread_mutex_lock(&K.reg_mu);
		t->tid = atomic_fetch_add(&K.next_tid, 1);
		if (K.nthreads == K.cap_threads) {
			uint32_t nc = K.cap_threads ? K.cap_threads * 2 : 16;
			kp_thread **nt = realloc(K.threads, nc * sizeof *nt);
			if (nt) {
				K.threads = nt;
				K.cap_threads = nc;
			}
		}
		if (K.nthreads < K.cap_threads) {
			K.threads[K.nthreads++] = t;
		} else {
			thread_free(t);
			t = NULL;
		}
		pthread_mutex_unlock(&K.reg_mu);
	}
	return t;
}

static kp_thread *thread_new(void) {
	if (kp_dead || !atomic_load_explicit(&K.on, memory_order_relaxed))
		return NULL;
	kp_dead = 1; /* no events from this thread while it registers */
	kp_thread *t = thread_alloc();
	if (t) {
		uint64_t z = K.seed ^ ((uint64_t)atomic_load(&K.rank) << 32) ^ t->tid ^ 0x9E3779B97F4A7C15ull;
		t->rng = z ? z : 1;
		pthread_setspecific(K.key, t);
		kp_self = t;
	}
	kp_dead = t == NULL;
	return t;
}

static inline kp_thread *self(void) {
	kp_thread *t = kp_self;
	if (__builtin_expect(t != NULL, 1))
		return t;
	return thread_new();
}

/* room says whether t's ring has space for n more events. */
static inline int room(kp_thread *t, uint64_t n) {
	uint64_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
	uint64_t tl = atomic_load_explicit(&t->tail, memory_order_acquire);
	return t->mask + 1 - (h - tl) >= n;
}

/* put appends an event to t's ring, which has room for it. */
static inline void put(kp_thread *t, uint64_t tt, uint64_t v, uint32_t id, uint32_t aux) {
	uint64_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
	kp_ev *e = &t->ring[h & t->mask];
	e->t = tt;
	e->v = v;
	e->id = id;
	e->aux = aux;
	atomic_store_explicit(&t->head, h + 1, memory_order_release);
}

/* add adds d to a counter only its owner thread writes. */
static inline void add(_Atomic uint64_t *p, uint64_t d) {
	atomic_store_explicit(p, atomic_load_explicit(p, memory_order_relaxed) + d, memory_order_relaxed);
}

static inline void count_drop(kp_thread *t) { add(&t->dropped, 1); }

static inline uint64_t path_hash(uint64_t parent, uint32_t fid) {
	uint64_t h = (parent ^ ((uint64_t)fid + 1)) * 0x9E3779B97F4A7C15ull;
	return (h ^ (h >> 29)) | 1;
}
#define KP_ROOT_HASH 0x243F6A8885A308D3ull
#define KP_WINDOW_NS 100000000ull

/* count_dropped_call counts one call of fid dropped whole on t. */
static __attribute__((noinline)) void count_dropped_call(kp_thread *t, uint32_t fid) {
	uint32_t mask = KP_DROP_SLOTS - 1, k = KP_DROPS; /* the shared last entry */
	for (uint32_t i = (fid * 0x9E3779B1u) >> 16 & mask, probes = 0; probes < KP_DROP_SLOTS; probes++, i = (i + 1) & mask) {
		uint32_t x = t->drop_slot[i];
		if (x && t->drops[x - 1].fid == fid) {
			k = x;
			break;
		}
		if (!x) {
			uint32_t n = atomic_load_explicit(&t->ndrops, memory_order_relaxed);
			if (n < KP_DROPS - 1) {
				t->drops[n].fid = fid;
				atomic_store_explicit(&t->ndrops, n + 1, memory_order_release);
				t->drop_slot[i] = (uint16_t)(n + 1);
				k = n + 1;
			}
			break;
		}
	}
	add(&t->drops[k - 1].n, 1);
}

/* drop_call drops a call of fid whole: its entry now, its exit and every
 * event until then when they come (skip). */
static __attribute__((noinline)) void drop_call(kp_thread *t, uint32_t fid) {
	t->skip++;
	count_drop(t);
	count_dropped_call(t, fid);
}

/* record_entry writes the entry of a call of fid when the ring has room for
 * it and for the exits of every open call, its own included; otherwise the
 * call is dropped whole. */
static inline int record_entry(kp_thread *t, uint32_t fid, uint64_t tk, uint64_t type) {
	uint32_t d = t->depth;
	uint64_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
	uint64_t tl = atomic_load_explicit(&t->tail, memory_order_acquire);
	if (__builtin_expect(t->mask + 1 - (h - tl) < (uint64_t)d + 2, 0)) {
		drop_call(t, fid);
		return 0;
	}
	kp_ev *e = &t->ring[h & t->mask];
	e->t = tk | type << EV_SHIFT;
	e->v = 0;
	e->id = fid;
	e->aux = 0;
	atomic_store_explicit(&t->head, h + 1, memory_order_release);
	t->depth = d + 1;
	if (d < KP_STACK) {
		t->sfid[d] = fid;
		if (d < t->hvalid)
			t->hvalid = d;
	}
	return 1;
}

/* top_hash is the path hash of the innermost open call (depth < KP_STACK). */
static inline uint64_t top_hash(kp_thread *t) {
	uint32_t d = t->depth;
	if (!d)
		return KP_ROOT_HASH;
	for (uint32_t i = t->hvalid; i < d; i++)
		t->shash[i] = path_hash(i ? t->shash[i - 1] : KP_ROOT_HASH, t->sfid[i]);
	t->hvalid = d;
	return t->shash[d - 1];
}

/* flush_pend writes the entry of the hot call waiting for its exit: the
 * call turned out not to be a leaf. */
static __attribute__((noinline)) void flush_pend(kp_thread *t) {
	uint32_t fid = t->pend - 1;
	t->pend = 0;
	record_entry(t, fid, t->pend_t, EV_ENTRY);
}

/* sum_find returns the summary of the call path (open calls, then fid)
 * whose hash is key, making it on first use; NULL when the thread's tables
 * are full. */
static __attribute__((noinline)) kp_sum *sum_find(kp_thread *t, uint64_t key, uint32_t fid) {
	uint32_t mask = KP_SUM_SLOTS - 1;
	for (uint32_t i = (uint32_t)(key >> 40) & mask, probes = 0; probes < KP_SUM_SLOTS; probes++, i = (i + 1) & mask) {
		uint32_t x = t->sum_slot[i];
		if (x && t->sums[x - 1].key == key)
			return &t->sums[x - 1];
		if (x)
			continue;
		uint32_t n = atomic_load_explicit(&t->nsums, memory_order_relaxed);
		uint32_t len = t->depth + 1; /* a hot call is deferred below KP_STACK only */
		if (n >= KP_SUMS || t->arena_used + len > KP_ARENA)
			return NULL;
		kp_sum *s = &t->sums[n];
		s->key = key;
		s->off = t->arena_used;
		s->len = len;
		for (uint32_t j = 0; j + 1 < len; j++)
			t->arena[s->off + j] = t->sfid[j];
		t->arena[s->off + len - 1] = fid;
		t->arena_used += len;
		t->sum_slot[i] = (uint16_t)(n + 1);
		atomic_store_explicit(&t->nsums, n + 1, memory_order_release);
		return s;
	}
	return NULL;
}

/* leaf_exit ends the hot call of fid waiting for its exit: no instrumented
 * call, comm or counter event came between its entry and its exit, so it
 * is summarised on its call path (streamed when the summary tables are
 * full). */
static inline void leaf_exit(kp_thread *t, uint32_t fid, uint64_t tk) {
	uint64_t d = tk - t->pend_t;
	if ((int64_t)d < 0)
		d = 0;
	t->pend = 0;
	uint64_t key = path_hash(top_hash(t), fid);
	kp_sum *s = t->last_sum;
	if (__builtin_expect(!s || s->key != key, 0)) {
		s = sum_find(t, key, fid);
		if (!s) {
			if (room(t, (uint64_t)t->depth + 2)) {
				put(t, t->pend_t | (uint64_t)EV_ENTRY << EV_SHIFT, 0, fid, 0);
				put(t, tk | (uint64_t)EV_EXIT << EV_SHIFT, 0, fid, 0);
			} else {
				count_drop(t);
				count_drop(t);
				count_dropped_call(t, fid);
			}
			return;
		}
		t->last_sum = s;
	}
	add(&s->count, 1);
	add(&s->total, d);
	uint64_t e = atomic_load_explicit(&K.epoch, memory_order_relaxed);
	unsigned b = (unsigned)(e & 1);
	if (atomic_load_explicit(&s->epb[b], memory_order_relaxed) != e + 1) {
		atomic_store_explicit(&s->min[b], d, memory_order_relaxed);
		atomic_store_explicit(&s->max[b], d, memory_order_relaxed);
		atomic_store_explicit(&s->epb[b], e + 1, memory_order_release);
	} else {
		if (d < atomic_load_explicit(&s->min[b], memory_order_relaxed))
			atomic_store_explicit(&s->min[b], d, memory_order_relaxed);
		if (d > atomic_load_explicit(&s->max[b], memory_order_relaxed))
			atomic_store_explicit(&s->max[b], d, memory_order_relaxed);
	}
}

static inline uint64_t xorshift(kp_thread *t) {
	uint64_t x = t->rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	t->rng = x;
	return x * 0x2545F4914F6CDD1Dull;
}

/* count_call counts a call of fid on t in the current window and says
 * whether fid is hot on t: called beyond the limit in this window or the
 * one before. */
static inline int count_call(kp_thread *t, uint32_t fid) {
	kp_rate *r = &t->rate[fid];
	uint32_t w = atomic_load_explicit(&K.win, memory_order_relaxed);
	uint32_t lim = atomic_load_explicit(&K.win_limit, memory_order_relaxed);
	if (__builtin_expect(r->win != w, 0)) {
		r->n = r->win + 1 == w && r->n > lim ? lim : 0;
		r->win = w;
	}
	return ++r->n > lim;
}

/* enter_slow is kp_enter when a hot call waits for its exit, a call is
 * being dropped, or fid is one to inject delays into. */
static __attribute__((noinline)) void enter_slow(kp_thread *t, uint32_t fid) {
	if (t->pend)
		flush_pend(t);
	if (t->skip) {
		drop_call(t, fid); /* a call inside a dropped call */
		return;
	}
	uint64_t th = atomic_load_explicit(&K.inject_threshold[fid], memory_order_relaxed);
	uint64_t type = EV_ENTRY;
	if (th != 0 && (th == UINT64_MAX || xorshift(t) < th)) {
		uint16_t k = atomic_load_explicit(&K.inject_of[fid], memory_order_relaxed);
		if (k && inject_here(&K.inject[k - 1]))
			type = EV_ENTRY_INJECTED;
	}
	uint64_t tk = ticks();
	/* injected calls are never summarised */
	if (count_call(t, fid) && type == EV_ENTRY && t->depth < KP_STACK) {
		t->pend = fid + 1;
		t->pend_t = tk;
		return;
	}
	if (!record_entry(t, fid, tk, type) || type != EV_ENTRY_INJECTED)
		return;
	uint16_t k = atomic_load_explicit(&K.inject_of[fid], memory_order_relaxed);
	if (k) {
		uint64_t d = K.inject[k - 1].delay_ns;
		struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
		while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
			;
	}
}

void kp_enter(uint32_t fid) {
	kp_thread *t = self();
	if (__builtin_expect(!t, 0))
		return;
	if (atomic_load_explicit(&K.funcs.excluded[fid], memory_order_relaxed))
		return;
	if (__builtin_expect(t->pend | t->skip | (atomic_load_explicit(&K.inject_threshold[fid], memory_order_relaxed) != 0), 0)) {
		enter_slow(t, fid);
		return;
	}
	uint64_t tk = ticks();
	/* a hot call waits for its exit to learn whether it is a leaf */
	if (__builtin_expect(count_call(t, fid), 0) && t->depth < KP_STACK) {
		t->pend = fid + 1;
		t->pend_t = tk;
		return;
	}
	record_entry(t, fid, tk, EV_ENTRY);
}

/* exit_slow is kp_exit when a hot call waits for its exit or a call is
 * being dropped. */
static __attribute__((noinline)) void exit_slow(kp_thread *t, uint32_t fid) {
	if (t->pend) {
		if (t->pend == fid + 1) {
			leaf_exit(t, fid, ticks());
			return;
		}
		flush_pend(t); /* exits out of order: not a leaf */
	}
	if (t->skip) {
		t->skip--;
		count_drop(t);
		return;
	}
	if (!room(t, 1)) {
		count_drop(t);
		return;
	}
	if (t->depth)
		t->depth--;
	put(t, ticks() | (uint64_t)EV_EXIT << EV_SHIFT, 0, fid, 0);
}

void kp_exit(uint32_t fid) {
	kp_thread *t = self();
	if (__builtin_expect(!t, 0))
		return;
	if (atomic_load_explicit(&K.funcs.excluded[fid], memory_order_relaxed))
		return;
	if (__builtin_expect(t->pend | t->skip, 0)) {
		exit_slow(t, fid);
		return;
	}
	/* The entry reserved room for this exit; the check only guards against
	 * exits without an entry (regions ended twice, calls begun before the
	 * thread's first event). */
	uint64_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
	if (__builtin_expect(h - atomic_load_explicit(&t->tail, memory_order_acquire) > t->mask, 0)) {
		count_drop(t);
		return;
	}
	t->depth -= t->depth != 0;
	kp_ev *e = &t->ring[h & t->mask];
	e->t = ticks() | (uint64_t)EV_EXIT << EV_SHIFT;
	e->v = 0;
	e->id = fid;
	e->aux = 0;
	atomic_store_explicit(&t->head, h + 1, memory_order_release);
}

void kp_comm(uint32_t kind, uint32_t partner, uint32_t tag, uint64_t bytes) {
	kp_thread *t = self();
	if (__builtin_expect(!t, 0))
		return;
	if (__builtin_expect(t->pend != 0, 0))
		flush_pend(t);
	uint64_t type = kind == KP_RECV ? EV_RECV : EV_SEND;
	if (t->skip || !room(t, (uint64_t)t->depth + 1)) {
		count_drop(t);
		add(&t->dropped_comm, 1);
		return;
	}
	put(t, ticks() | type << EV_SHIFT, bytes, partner, tag);
}

void kp_counter(uint32_t cid, uint64_t value) {
	kp_thread *t = self();
	if (__builtin_expect(!t, 0))
		return;
	if (__builtin_expect(t->pend != 0, 0))
		flush_pend(t);
	if (t->skip || !room(t, (uint64_t)t->depth + 1)) {
		count_drop(t);
		add(&t->dropped_counter, 1);
		return;
	}
	put(t, ticks() | (uint64_t)EV_COUNTER << EV_SHIFT, value, cid, 0);
}

void kp_set_rank(uint32_t rank) { atomic_store(&K.rank, rank); }

static void add_meta(uint32_t tid, const char *key, const char *value) {
	pthread_mutex_lock(&K.meta_mu);
	if (K.nmeta == K.cap_meta) {
		size_t nc = K.cap_meta ? K.cap_meta * 2 : 16;
		kp_meta *nm = realloc(K.meta, nc * sizeof *nm);
		if (!nm) {
			pthread_mutex_unlock(&K.meta_mu);
			return;
		}
		K.meta = nm;
		K.cap_meta = nc;
	}
	K.meta[K.nmeta++] = (kp_meta){tid, strdup(key), strdup(value ? value : "")};
	pthread_mutex_unlock(&K.meta_mu);
}

void kp_metadata(const char *key, const char *value) {
	kp_thread *t = self();
	if (t && key)
		add_meta(t->tid, key, value);
}

/* ---- device queues' virtual threads (kipimo_device.c stages activities) ---- */

uint64_t kp_now_ns(void) { return mono_ns(); }

void kp_core_metadata(uint32_t tid, const char *key, const char *value) {
	if (key)
		add_meta(tid, key, value);
}

void *kp_core_device_new(uint32_t *tid) {
	if (!atomic_load_explicit(&K.on, memory_order_relaxed))
		return NULL;
	/* the thread that makes the first queue (the program's main thread,
	 * usually) is a thread of the process before its queues are: tid 0
	 * stays the main thread's */
	(void)self();
	kp_thread *t = thread_alloc();
	if (!t)
		return NULL;
	t->device = 1;
	*tid = t->tid;
	return t;
}

/* wait_past_last spins until 1 µs has passed since the last event of t, so
 * that a counter recorded next does not share that event's µs: a consumer
 * attaches a counter at an exit's µs to the call that exits. */
static void wait_past_last(kp_thread *t) {
	uint64_t h = atomic_load_explicit(&t->head, memory_order_relaxed);
	uint64_t last = t->pend ? t->pend_t : h ? t->ring[(h - 1) & t->mask].t & EV_TICKS : 0;
	if (!last)
		return;
	double nspt = K.use_tsc ? K.seg_scale : 1.0;
	/* before the first cut the TSC's rate is not known yet: at most 5 GHz */
	uint64_t need = nspt > 0 ? (uint64_t)(1000.0 / nspt) + 1 : 5000;
	while (ticks() - last < need)
		;
}

void kp_counter_apart(uint32_t cid, uint64_t value) {
	kp_thread *t = self();
	if (!t)
		return;
	wait_past_last(t);
	kp_counter(cid, value);
}

int kp_inject_draw(uint32_t fid, uint64_t *delay_ns) {
	uint64_t th = atomic_load_explicit(&K.inject_threshold[fid], memory_order_acquire);
	if (!th)
		return 0;
	kp_thread *t = self();
	uint16_t k = atomic_load_explicit(&K.inject_of[fid], memory_order_relaxed);
	if (!t || !k || !(th == UINT64_MAX || xorshift(t) < th) || !inject_here(&K.inject[k - 1]))
		return 0;
	*delay_ns = K.inject[k - 1].delay_ns;
	return 1;
}

/* kp_correlate waits as kp_counter_apart does: called late in a launch
 * call, after the runtime's work, it seldom waits. */
uint64_t kp_correlate(void) {
	static _Atomic uint64_t next;
	static _Atomic uint32_t cid1; /* counter id + 1 */
	uint64_t id = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) + 1;
	uint32_t c = atomic_load_explicit(&cid1, memory_order_relaxed);
	if (!c) {
		c = kp_counter_id("Correlation ID") + 1;
		atomic_store_explicit(&cid1, c, memory_order_relaxed);
	}
	kp_counter_apart(c - 1, id);
	return id;
}

void kp_core_device_lost(void *vt, uint64_t n) { ((kp_thread *)vt)->dlost += n; }

/* kp_core_device_put writes entry, counters and exit of one activity. The
 * times are µs on the frames' clock; an activity never starts before the
 * end of the one written before it on its queue, and its counters (at its
 * end) come strictly after that end, so a consumer attaches them to it. */
void kp_core_device_put(void *vt, uint32_t fid, uint64_t start_ns, uint64_t end_ns, uint64_t correlation, uint64_t bytes, int injected) {
	kp_thread *t = vt;
	static uint32_t cid_corr, cid_bytes; /* collector only: counter id + 1 */
	uint64_t n = 2 + (correlation != 0) + (bytes != 0);
	if (!room(t, n)) {
		count_drop(t);
		count_dropped_call(t, fid);
		return;
	}
	if (!cid_corr) {
		cid_corr = kp_counter_id("Correlation ID") + 1;
		cid_bytes = kp_counter_id("Device Bytes") + 1;
	}
	uint64_t s = (start_ns + K.realtime_offset_ns) / 1000, e = (end_ns + K.realtime_offset_ns) / 1000;
	if (s < t->dlast_us)
		s = t->dlast_us;
	if (e < s)
		e = s;
	if (t->dlast_us && e <= t->dlast_us)
		e = t->dlast_us + 1;
	t->dlast_us = e;
	put(t, s | (uint64_t)(injected ? EV_ENTRY_INJECTED : EV_ENTRY) << EV_SHIFT, 0, fid, 0);
	if (correlation)
		put(t, e | (uint64_t)EV_COUNTER << EV_SHIFT, correlation, cid_corr - 1, 0);
	if (bytes)
		put(t, e | (uint64_t)EV_COUNTER << EV_SHIFT, bytes, cid_bytes - 1, 0);
	put(t, e | (uint64_t)EV_EXIT << EV_SHIFT, 0, fid, 0);
}

static void wake(void) {
	uint64_t one = 1;
	if (K.wake_fd >= 0)
		(void)!write(K.wake_fd, &one, sizeof one);
}

/* request asks the collector for a cut (and, when final, the end of the
 * stream) and waits until it is done or the flush timeout passes. */
static void request(int final) {
	if (!atomic_load(&K.started))
		return;
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	uint64_t ns = (uint64_t)dl.tv_nsec + K.flush_timeout_ns;
	dl.tv_sec += (time_t)(ns / 1000000000ull);
	dl.tv_nsec = (long)(ns % 1000000000ull);
	pthread_mutex_lock(&K.flush_mu);
	uint64_t gen = ++K.flush_req;
	if (final)
		K.final_req = 1;
	wake();
	while (final ? !K.final_done : K.flush_done < gen) {
		if (pthread_cond_timedwait(&K.flush_cv, &K.flush_mu, &dl) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&K.flush_mu);
}

void kp_step_mark(void) {
	if (!atomic_load(&K.started))
		return;
	pthread_mutex_lock(&K.flush_mu);
	K.flush_req++;
	pthread_mutex_unlock(&K.flush_mu);
	wake();
}

void kp_flush(void) { request(0); }

/* ---- frame encoding ---- */

/* bgrow makes room for n more bytes in the frame being encoded; the check
 * is inlined into every writer, the growing (rare) is not. */
static __attribute__((noinline)) void bgrow_slow(size_t n) {
	size_t nc = K.bcap ? K.bcap : 1 << 16;
	while (nc < K.blen + n)
		nc *= 2;
	char *nb = realloc(K.buf, nc);
	if (!nb)
		abort();
	K.buf = nb;
	K.bcap = nc;
}

static inline void bgrow(size_t n) {
	if (__builtin_expect(K.blen + n > K.bcap, 0))
		bgrow_slow(n);
}

static inline void put_uvarint(uint64_t v) {
	bgrow(10);
	while (v >= 0x80) {
		K.buf[K.blen++] = (char)(v | 0x80);
		v >>= 7;
	}
	K.buf[K.blen++] = (char)v;
}

static inline void put_zigzag(uint64_t a, uint64_t b) {
	int64_t d = (int64_t)(a - b);
	put_uvarint(((uint64_t)d << 1) ^ (uint64_t)(d >> 63));
}

/* put_string writes s, replacing bytes that are not valid UTF-8 by '?'. */
static void put_string(const char *s) {
	size_t n = strlen(s);
	put_uvarint(n);
	bgrow(n);
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;
	while (i < n) {
		unsigned c = p[i];
		size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
		int ok = len > 0 && i + len <= n;
		for (size_t k = 1; ok && k < len; k++)
			ok = (p[i + k] & 0xC0) == 0x80;
		if (ok && len == 2)
			ok = c >= 0xC2;
		if (ok && len == 3) {
			unsigned cp = (c & 0x0F) << 12 | (p[i + 1] & 0x3Fu) << 6 | (p[i + 2] & 0x3Fu);
			ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
		}
		if (ok && len == 4) {
			unsigned cp = (c & 0x07) << 18 | (p[i + 1] & 0x3Fu) << 12 | (p[i + 2] & 0x3Fu) << 6 | (p[i + 3] & 0x3Fu);
			ok = cp >= 0x10000 && cp <= 0x10FFFF;
		}
		if (!ok) {
			K.buf[K.blen++] = '?';
			i++;
			continue;
		}
		memcpy(K.buf + K.blen, p + i, len);
		K.blen += len;
		i += len;
	}
}

static unsigned bitlen(uint64_t v) { return v ? 64u - (unsigned)__builtin_clzll(v) : 0; }


/* resolve_names names the functions known only by address. */
static void resolve_names(uint32_t from, uint32_t to) {
	char name[1024];
	for (uint32_t id = from; id < to; id++) {
		if (K.funcs.names[id])
			continue;
		kp_resolve_name(K.funcs.addr[id], name, sizeof name);
		K.funcs.names[id] = strdup(name);
		if (excluded_name(name))
			atomic_store_explicit(&K.funcs.excluded[id], 1, memory_order_relaxed);
		apply_inject(id, name);
	}
}

static void enqueue(kp_msg *m);

typedef struct {
	kp_thread *t;
	uint64_t from, to;
	uint32_t nf, nc, nk;
	size_t xfrom, xto; /* its summary and drop counter events in K.xev */
} kp_span;

static void add_truth(uint32_t fid, uint32_t tid, uint64_t us) {
	uint16_t k = atomic_load_explicit(&K.inject_of[fid], memory_order_relaxed);
	if (k) {
		int i = k - 1;
		if (K.ntruth == K.cap_truth) {
			size_t nc = K.cap_truth ? K.cap_truth * 2 : 64;
			kp_truth *nt = realloc(K.truth, nc * sizeof *nt);
			if (!nt)
				return;
			K.truth = nt;
			K.cap_truth = nc;
		}
		K.truth[K.ntruth++] = (kp_truth){K.inject[i].func, tid, us, K.inject[i].delay_ns / 1000};
		return;
	}
}

static void sample_counters(uint64_t *cpu, uint64_t *rss, uint64_t *vcsw, uint64_t *ivcsw) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	uint64_t c = (uint64_t)ru.ru_utime.tv_sec * 1000000u + (uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec;
	*cpu = c - K.cpu_us;
	K.cpu_us = c;
	*vcsw = (uint64_t)ru.ru_nvcsw - K.nvcsw;
	K.nvcsw = (uint64_t)ru.ru_nvcsw;
	*ivcsw = (uint64_t)ru.ru_nivcsw - K.nivcsw;
	K.nivcsw = (uint64_t)ru.ru_nivcsw;
	*rss = 0;
	if (K.statm_fd >= 0) {
		char b[128];
		ssize_t n = pread(K.statm_fd, b, sizeof b - 1, 0);
		if (n > 0) {
			b[n] = 0;
			unsigned long size, res;
			if (sscanf(b, "%lu %lu", &size, &res) == 2)
				*rss = (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
		}
	}
}

/* ev_us is the time of event e of thread t in µs since the epoch. */
static inline uint64_t ev_us(const kp_thread *t, const kp_ev *e) {
	return t->device ? e->t & EV_TICKS : tick_to_us(e->t & EV_TICKS);
}

/* The three event sections of a frame, in their order. */
enum { SEC_FUNC, SEC_COUNTER, SEC_COMM, SEC_NONE };

/* section_of is the section event e goes to (SEC_NONE: an excluded
 * function's event, never encoded). */
static int section_of(const kp_ev *e) {
	unsigned type = (unsigned)(e->t >> EV_SHIFT);
	if (type <= EV_ENTRY_INJECTED)
		return atomic_load_explicit(&K.funcs.excluded[e->id], memory_order_relaxed) ? SEC_NONE : SEC_FUNC;
	return type == EV_COUNTER ? SEC_COUNTER : SEC_COMM;
}

/* encode_section writes the events of one section, thread by thread in the
 * thread table's order, each timestamp a delta from the previous one of its
 * thread in the section. pvals, when set, are the process counters, added to
 * the first thread's counter events at tend. */
static void encode_section(const kp_span *sp, uint32_t nt, unsigned B, uint64_t tstart, int sec, const uint64_t *pvals, uint64_t tend) {
	uint32_t ti = 0;
	for (uint32_t i = 0; i < nt; i++) {
		if (sp[i].nf + sp[i].nc + sp[i].nk == 0)
			continue;
		/* a thread with no event in this section keeps its table index
		 * but its ring is not read again */
		if ((sec == SEC_FUNC ? sp[i].nf : sec == SEC_COUNTER ? sp[i].nc : sp[i].nk) == 0) {
			ti++;
			continue;
		}
		uint64_t prev = tstart;
		for (uint64_t j = sp[i].from; j < sp[i].to; j++) {
			const kp_ev *e = &sp[i].t->ring[j & sp[i].t->mask];
			if (section_of(e) != sec)
				continue;
			unsigned type = (unsigned)(e->t >> EV_SHIFT);
			uint64_t us = ev_us(sp[i].t, e);
			switch (sec) {
			case SEC_FUNC:
				put_uvarint((((uint64_t)e->id << 1 | (type == EV_EXIT)) << B) | ti);
				break;
			case SEC_COUNTER:
				put_uvarint(((uint64_t)e->id << B) | ti);
				put_uvarint(e->v);
				break;
			default:
				put_uvarint((((uint64_t)e->id << 1 | (type == EV_RECV)) << B) | ti);
				put_uvarint(e->aux);
				put_uvarint(e->v);
			}
			put_zigzag(us, prev);
			prev = us;
			if (type == EV_ENTRY_INJECTED)
				add_truth(e->id, sp[i].t->tid, us);
		}
		if (sec == SEC_COUNTER) {
			for (size_t x = sp[i].xfrom; x < sp[i].xto; x++) {
				put_uvarint(((uint64_t)K.xev[x].cid << B) | ti);
				put_uvarint(K.xev[x].value);
				put_zigzag(tend, prev);
				prev = tend;
			}
		}
		if (pvals && i == 0) {
			uint32_t ids[4] = {K.cid_cpu, K.cid_rss, K.cid_vcsw, K.cid_ivcsw};
			for (int k = 0; k < 4; k++) {
				put_uvarint(((uint64_t)ids[k] << B) | ti);
				put_uvarint(pvals[k]);
				put_zigzag(tend, prev);
				prev = tend;
			}
		}
		ti++;
	}
}

/* xev_add adds a counter event for the thread being collected. */
static void xev_add(uint32_t cid, uint64_t value) {
	if (K.nxev == K.cap_xev) {
		size_t nc = K.cap_xev ? K.cap_xev * 2 : 256;
		kp_xev *nx = realloc(K.xev, nc * sizeof *nx);
		if (!nx)
			abort();
		K.xev = nx;
		K.cap_xev = nc;
	}
	K.xev[K.nxev++] = (kp_xev){cid, value};
}

/* counter_named returns the id + 1 of the counter called prefix + name. */
static uint32_t counter_named(const char *prefix, const char *name) {
	size_t a = strlen(prefix), b = strlen(name);
	char *s = malloc(a + b + 1);
	if (!s)
		return 0;
	memcpy(s, prefix, a);
	memcpy(s + a, name, b + 1);
	uint32_t id = dict_lookup(&K.counters, s);
	free(s);
	return id + 1;
}

/* name_sum names the counters of a summary after its call path; 0 while a
 * function on the path has no name yet. */
static int name_sum(kp_thread *t, kp_sum *s, uint32_t fn_to) {
	size_t n = 1;
	for (uint32_t j = 0; j < s->len; j++) {
		uint32_t fid = t->arena[s->off + j];
		if (fid >= fn_to || !K.funcs.names[fid])
			return 0;
		n += strlen(K.funcs.names[fid]) + 4;
	}
	char *path = malloc(n);
	if (!path)
		return 0;
	size_t k = 0;
	for (uint32_t j = 0; j < s->len; j++) {
		const char *name = K.funcs.names[t->arena[s->off + j]];
		if (j) {
			memcpy(path + k, " => ", 4);
			k += 4;
		}
		size_t l = strlen(name);
		memcpy(path + k, name, l);
		k += l;
	}
	path[k] = 0;
	static const char *prefix[4] = {"Kipimo Summary Calls: ", "Kipimo Summary Time (ns): ", "Kipimo Summary Min (ns): ", "Kipimo Summary Max (ns): "};
	for (int i = 0; i < 4; i++)
		s->cid[i] = counter_named(prefix[i], path);
	free(path);
	return s->cid[0] && s->cid[1] && s->cid[2] && s->cid[3];
}

/* collect_extras turns what each thread summarised and dropped since the
 * last cut into counter events of the frame (K.xev), and starts the next
 * epoch of the summaries' minimum and maximum. */
static void collect_extras(kp_span *sp, uint32_t nt, uint32_t fn_to) {
	K.nxev = 0;
	uint64_t E = atomic_load(&K.epoch);
	atomic_store(&K.epoch, E + 1);
	double nspt = K.use_tsc ? K.seg_scale : 1.0; /* ns per tick */
	for (uint32_t i = 0; i < nt; i++) {
		kp_thread *t = sp[i].t;
		sp[i].xfrom = K.nxev;
		uint32_t ns = atomic_load_explicit(&t->nsums, memory_order_acquire);
		for (uint32_t j = 0; j < ns; j++) {
			kp_sum *s = &t->sums[j];
			uint64_t c = atomic_load_explicit(&s->count, memory_order_relaxed);
			uint64_t tot = atomic_load_explicit(&s->total, memory_order_relaxed);
			if (c == s->seen_count)
				continue;
			if (!s->cid[0] && !name_sum(t, s, fn_to)) {
				t->gone = 0; /* keep the thread until the next cut reports it */
				continue;
			}
			uint64_t dc = c - s->seen_count, dt = tot - s->seen_total;
			/* the ending epoch's extremes, else (every call of the step
			 * ended after the epoch turned) the next one's */
			uint64_t mn = dt / dc, mx = dt / dc;
			for (uint64_t e = E; e <= E + 1; e++) {
				unsigned b = (unsigned)(e & 1);
				if (atomic_load_explicit(&s->epb[b], memory_order_acquire) == e + 1) {
					mn = atomic_load_explicit(&s->min[b], memory_order_relaxed);
					mx = atomic_load_explicit(&s->max[b], memory_order_relaxed);
					break;
				}
			}
			s->seen_count = c;
			s->seen_total = tot;
			K.calls_summarised += dc;
			xev_add(s->cid[0] - 1, dc);
			xev_add(s->cid[1] - 1, (uint64_t)((double)dt * nspt + 0.5));
			xev_add(s->cid[2] - 1, (uint64_t)((double)mn * nspt + 0.5));
			xev_add(s->cid[3] - 1, (uint64_t)((double)mx * nspt + 0.5));
		}
		uint32_t nd = atomic_load_explicit(&t->ndrops, memory_order_acquire);
		for (uint32_t j = 0; j < KP_DROPS; j++) {
			if (j == nd)
				j = KP_DROPS - 1;
			kp_drop *d = &t->drops[j];
			uint64_t n = atomic_load_explicit(&d->n, memory_order_relaxed);
			if (n == d->seen)
				continue;
			if (!d->cid) {
				const char *name = d->fid == UINT32_MAX ? "[functions beyond the per-thread table]"
				                   : d->fid < fn_to && K.funcs.names[d->fid] ? K.funcs.names[d->fid] : NULL;
				if (name)
					d->cid = counter_named("Kipimo Dropped Calls: ", name);
				if (!d->cid) {
					t->gone = 0;
					continue;
				}
			}
			K.calls_dropped += n - d->seen;
			xev_add(d->cid - 1, n - d->seen);
			d->seen = n;
		}
		uint64_t dcomm = atomic_load_explicit(&t->dropped_comm, memory_order_relaxed);
		if (dcomm != t->seen_comm) {
			if (!t->cid_comm)
				t->cid_comm = counter_named("Kipimo Dropped Comm Events", "");
			xev_add(t->cid_comm - 1, dcomm - t->seen_comm);
			t->seen_comm = dcomm;
		}
		uint64_t dctr = atomic_load_explicit(&t->dropped_counter, memory_order_relaxed);
		if (dctr != t->seen_counter) {
			if (!t->cid_counter)
				t->cid_counter = counter_named("Kipimo Dropped Counter Events", "");
			xev_add(t->cid_counter - 1, dctr - t->seen_counter);
			t->seen_counter = dctr;
		}
		if (t->dlost != t->dlost_seen) {
			if (!t->cid_dlost)
				t->cid_dlost = counter_named("Kipimo Dropped Calls: ", "[device activities]");
			if (t->cid_dlost) {
				K.calls_dropped += t->dlost - t->dlost_seen;
				xev_add(t->cid_dlost - 1, t->dlost - t->dlost_seen);
				t->dlost_seen = t->dlost;
			}
		}
		sp[i].xto = K.nxev;
		sp[i].nc += (uint32_t)(sp[i].xto - sp[i].xfrom);
	}
}

/* cut encodes every event recorded since the last cut as one frame and
 * queues it for sending. */
static void cut(void) {
	uint64_t tk = ticks(), ns = mono_ns();
	if (K.use_tsc && tk > K.seg_tick) {
		if (tk - K.seg_tick > 1000000 || K.seg_scale == 0)
			K.seg_scale = (double)(ns - K.seg_ns) / (double)(tk - K.seg_tick);
	}
	/* the segment ends now: convert this step's ticks between the last cut
	 * and this one. seg_* still hold the last cut's readings. */
	uint64_t tstart = K.last_us;
	/* device activity reported since the last cut goes out with this one */
	kp_device_drain();

	pthread_mutex_lock(&K.reg_mu);
	uint32_t nt = K.nthreads;
	kp_span *sp = calloc(nt ? nt : 1, sizeof *sp);
	for (uint32_t i = 0; i < nt; i++)
		sp[i].t = K.threads[i];
	pthread_mutex_unlock(&K.reg_mu);
	if (!sp)
		return;

	uint32_t fn_to = atomic_load_explicit(&K.funcs.count, memory_order_acquire);
	uint32_t cn_to = atomic_load_explicit(&K.counters.count, memory_order_acquire);
	for (uint32_t i = 0; i < nt; i++) {
		/* a thread seen retired here has recorded all it ever will */
		sp[i].t->gone = atomic_load_explicit(&sp[i].t->retired, memory_order_acquire);
		sp[i].from = atomic_load_explicit(&sp[i].t->tail, memory_order_relaxed);
		sp[i].to = atomic_load_explicit(&sp[i].t->head, memory_order_acquire);
	}
	/* names registered after the head snapshot may be used by events after
	 * it only; read the counts again so every id in the events is named */
	fn_to = atomic_load_explicit(&K.funcs.count, memory_order_acquire);
	cn_to = atomic_load_explicit(&K.counters.count, memory_order_acquire);
	resolve_names(K.funcs.sent, fn_to);
	collect_extras(sp, nt, fn_to);
	cn_to = atomic_load_explicit(&K.counters.count, memory_order_acquire);

	uint64_t tend = tick_to_us(tk);
	uint64_t pcpu = 0, prss = 0, pvcsw = 0, pivcsw = 0;
	int pc = K.counters_on;
	if (pc)
		sample_counters(&pcpu, &prss, &pvcsw, &pivcsw);

	uint64_t nev = 0;
	for (uint32_t i = 0; i < nt; i++) {
		for (uint64_t j = sp[i].from; j < sp[i].to; j++) {
			kp_ev *e = &sp[i].t->ring[j & sp[i].t->mask];
			switch (section_of(e)) {
			case SEC_FUNC:
				sp[i].nf++;
				break;
			case SEC_COUNTER:
				sp[i].nc++;
				break;
			case SEC_COMM:
				sp[i].nk++;
				break;
			}
			uint64_t us = ev_us(sp[i].t, e);
			if (us > tend)
				tend = us;
		}
	}
	if (pc && nt > 0)
		sp[0].nc += 4;
	uint32_t ntab = 0;
	for (uint32_t i = 0; i < nt; i++)
		ntab += sp[i].nf + sp[i].nc + sp[i].nk > 0;
	unsigned B = ntab <= 1 ? 0 : bitlen(ntab - 1);

	K.blen = 0;
	bgrow(9);
	memcpy(K.buf, "KPFR\x01\0\0\0\0", 9);
	K.blen = 9;
	put_uvarint(K.pid);
	put_uvarint(atomic_load(&K.rank));
	put_uvarint(K.step);
	put_uvarint(tstart);
	put_zigzag(tend, tstart);
	put_uvarint(ntab);
	{
		uint32_t prev = 0, k = 0;
		for (uint32_t i = 0; i < nt; i++) {
			if (sp[i].nf + sp[i].nc + sp[i].nk == 0)
				continue;
			put_uvarint(k == 0 ? sp[i].t->tid : sp[i].t->tid - prev - 1);
			prev = sp[i].t->tid;
			k++;
		}
	}
	/* After a reconnect the server may have consumers that never saw the
	 * names: the next frame carries them all again; so does every
	 * names_every-th frame, for consumers that start late. */
	if (K.names_every && K.step > 0 && K.step % K.names_every == 0)
		K.resend = 1;
	if (K.resend) {
		K.funcs.sent = 0;
		K.counters.sent = 0;
		K.sent_meta = 0;
		K.resend = 0;
	}
	/* function dictionary: names new since the last frame, excluded ones left out */
	{
		uint32_t n = 0;
		for (uint32_t id = K.funcs.sent; id < fn_to; id++)
			n += !atomic_load_explicit(&K.funcs.excluded[id], memory_order_relaxed);
		put_uvarint(n);
		for (uint32_t id = K.funcs.sent; id < fn_to; id++) {
			if (atomic_load_explicit(&K.funcs.excluded[id], memory_order_relaxed))
				continue;
			put_uvarint(id);
			put_string(K.funcs.names[id]);
		}
		K.funcs.sent = fn_to;
	}
	put_uvarint(cn_to - K.counters.sent);
	for (uint32_t id = K.counters.sent; id < cn_to; id++) {
		put_uvarint(id);
		put_string(K.counters.names[id]);
	}
	K.counters.sent = cn_to;
	pthread_mutex_lock(&K.meta_mu);
	put_uvarint(K.nmeta - K.sent_meta);
	for (size_t i = K.sent_meta; i < K.nmeta; i++) {
		put_uvarint(K.meta[i].tid);
		put_string(K.meta[i].key);
		put_string(K.meta[i].value);
	}
	K.sent_meta = K.nmeta;
	pthread_mutex_unlock(&K.meta_mu);

	uint64_t nf = 0, nc = 0, nk = 0;
	for (uint32_t i = 0; i < nt; i++) {
		nf += sp[i].nf;
		nc += sp[i].nc;
		nk += sp[i].nk;
	}
	/* the process counters go on the first thread, at the cut */
	uint64_t pvals[4] = {pcpu, prss, pvcsw, pivcsw};
	put_uvarint(nf);
	encode_section(sp, nt, B, tstart, SEC_FUNC, NULL, 0);
	put_uvarint(nc);
	encode_section(sp, nt, B, tstart, SEC_COUNTER, pc ? pvals : NULL, tend);
	put_uvarint(nk);
	encode_section(sp, nt, B, tstart, SEC_COMM, NULL, 0);
	nev = nf + nc + nk;
	/* the events are encoded: give the ring space back */
	for (uint32_t i = 0; i < nt; i++)
		atomic_store_explicit(&sp[i].t->tail, sp[i].to, memory_order_release);
	/* threads that exited and whose events are all sent are forgotten */
	pthread_mutex_lock(&K.reg_mu);
	for (uint32_t i = 0; i < K.nthreads;) {
		kp_thread *t = K.threads[i];
		if (t->gone && atomic_load(&t->tail) == atomic_load(&t->head)) {
			memmove(&K.threads[i], &K.threads[i + 1], (K.nthreads - i - 1) * sizeof *K.threads);
			K.nthreads--;
			thread_free(t);
			continue;
		}
		i++;
	}
	pthread_mutex_unlock(&K.reg_mu);
	free(sp);

	uint32_t body = (uint32_t)(K.blen - 9);
	memcpy(K.buf + 5, &body, 4); /* little-endian hosts only */
	K.seg_tick = tk;
	K.seg_ns = ns;
	K.last_us = tend;
	K.step++;
	K.frames++;
	K.events += nev;

	/* the NATS message: HPUB subject hdrlen totlen\r\nheaders\r\n\r\nbody\r\n */
	char subj[300], hdr[160];
	snprintf(subj, sizeof subj, "kipimo.%s.frames.%u.%u", K.run, K.pid, atomic_load(&K.rank));
	int hl = snprintf(hdr, sizeof hdr, "NATS/1.0\r\nKipimo-Source-Dropped: %llu\r\n\r\n", (unsigned long long)K.frames_dropped);
	if (K.max_payload && K.blen + (size_t)hl > K.max_payload) {
		K.oversize++;
		K.frames_dropped++;
		K.resend = 1; /* the names it carried go with the next frame */
		snprintf(K.last_error, sizeof K.last_error,
		         "a frame of %zu bytes exceeds the server's max_payload of %llu: raise max_payload or shorten KIPIMO_PERIOD",
		         K.blen, (unsigned long long)K.max_payload);
		return;
	}
	/* the bound applies to what waits behind the frame being sent */
	if (K.qhead && K.qbytes + K.blen > K.queue_bytes) {
		K.frames_dropped++;
		K.resend = 1;
		return;
	}
	char line[400];
	int ll = snprintf(line, sizeof line, "HPUB %s %d %zu\r\n", subj, hl, (size_t)hl + K.blen);
	kp_msg *m = malloc(sizeof *m + (size_t)ll + (size_t)hl + K.blen + 2);
	if (!m) {
		K.frames_dropped++;
		K.resend = 1;
		return;
	}
	m->next = NULL;
	m->frame = 1;
	m->len = (size_t)ll + (size_t)hl + K.blen + 2;
	memcpy(m->data, line, (size_t)ll);
	memcpy(m->data + ll, hdr, (size_t)hl);
	memcpy(m->data + ll + hl, K.buf, K.blen);
	memcpy(m->data + ll + hl + K.blen, "\r\n", 2);
	enqueue(m);
}

/* end_of_stream queues the message that ends this rank's stream. */
static void end_of_stream(void) {
	char subj[300], hdr[200], line[400];
	snprintf(subj, sizeof subj, "kipimo.%s.frames.%u.%u", K.run, K.pid, atomic_load(&K.rank));
	int hl = snprintf(hdr, sizeof hdr, "NATS/1.0\r\nKipimo-End-Of-Stream: 1\r\nKipimo-Source-Dropped: %llu\r\n\r\n", (unsigned long long)K.frames_dropped);
	int ll = snprintf(line, sizeof line, "HPUB %s %d %d\r\n", subj, hl, hl);
	kp_msg *m = malloc(sizeof *m + (size_t)ll + (size_t)hl + 2 + 8);
	if (!m)
		return;
	m->next = NULL;
	m->frame = 0;
	m->len = (size_t)ll + (size_t)hl + 2;
	memcpy(m->data, line, (size_t)ll);
	memcpy(m->data + ll, hdr, (size_t)hl);
	memcpy(m->data + ll + hl, "\r\n", 2);
	enqueue(m);
}

/* ---- NATS ---- */

static void enqueue(kp_msg *m) {
	if (K.qtail)
		K.qtail->next = m;
	else
		K.qhead = m;
	K.qtail = m;
	K.qbytes += m->len;
}

static void disconnect(const char *why) {
	if (K.fd >= 0)
		close(K.fd);
	K.fd = -1;
	K.state = 0;
	K.inlen = 0;
	K.ctrllen = 0;
	if (K.qoff && K.qhead) {
		/* the message half sent is lost */
		kp_msg *m = K.qhead;
		K.qhead = m->next;
		if (!K.qhead)
			K.qtail = NULL;
		K.qbytes -= m->len;
		if (m->frame)
			K.frames_dropped++;
		free(m);
	}
	K.qoff = 0;
	if (why)
		snprintf(K.last_error, sizeof K.last_error, "%s", why);
	K.backoff_ns = K.backoff_ns ? (K.backoff_ns * 2 > 2000000000ull ? 2000000000ull : K.backoff_ns * 2) : 100000000ull;
	K.next_retry_ns = mono_ns() + K.backoff_ns;
}

static void nats_connect(void) {
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
	int rc = getaddrinfo(K.nats_host, K.nats_port, &hints, &res);
	if (rc != 0 || !res) {
		K.connect_failures++;
		snprintf(K.last_error, sizeof K.last_error, "resolve %s: %s", K.nats_host, gai_strerror(rc));
		disconnect(NULL);
		return;
	}
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		freeaddrinfo(res);
		K.connect_failures++;
		disconnect("socket failed");
		return;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	rc = connect(fd, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	K.fd = fd;
	if (rc == 0 || errno == EINPROGRESS) {
		K.state = 1;
		return;
	}
	K.connect_failures++;
	disconnect("connect failed");
}

static void json_str(char *out, size_t n, const char *s) {
	size_t j = 0;
	for (; *s && j + 7 < n; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			out[j++] = '\\';
			out[j++] = (char)c;
		} else if (c < 0x20) {
			j += (size_t)snprintf(out + j, n - j, "\\u%04x", c);
		} else {
			out[j++] = (char)c;
		}
	}
	out[j] = 0;
}

static void send_connect(void) {
	char user[300], pass[300], tok[520], msg[1400];
	json_str(user, sizeof user, K.nats_user);
	json_str(pass, sizeof pass, K.nats_pass);
	json_str(tok, sizeof tok, K.nats_token);
	int n = snprintf(msg, sizeof msg,
	                 "CONNECT {\"verbose\":false,\"pedantic\":false,\"tls_required\":false,\"headers\":true,"
	                 "\"no_responders\":false,\"name\":\"kipimo-lib rank %u\",\"lang\":\"c\",\"version\":\"" KP_VERSION "\",\"protocol\":1",
	                 atomic_load(&K.rank));
	if (*K.nats_token)
		n += snprintf(msg + n, sizeof msg - (size_t)n, ",\"auth_token\":\"%s\"", tok);
	if (*K.nats_user)
		n += snprintf(msg + n, sizeof msg - (size_t)n, ",\"user\":\"%s\",\"pass\":\"%s\"", user, pass);
	n += snprintf(msg + n, sizeof msg - (size_t)n, "}\r\nPING\r\n");
	/* the socket is fresh: this small write goes out whole or fails */
	ssize_t w = send(K.fd, msg, (size_t)n, MSG_NOSIGNAL);
	if (w != n) {
		disconnect("send CONNECT failed");
		return;
	}
	K.pings_sent++;
	K.state = 3;
	if (K.connects > 0)
		K.resend = 1;
	K.connects++;
	K.backoff_ns = 0;
}

static void handle_line(char *line) {
	if (strncmp(line, "PING", 4) == 0) {
		if (K.ctrllen + 6 <= sizeof K.ctrl) {
			memcpy(K.ctrl + K.ctrllen, "PONG\r\n", 6);
			K.ctrllen += 6;
		}
	} else if (strncmp(line, "PONG", 4) == 0) {
		K.pongs++;
	} else if (strncmp(line, "INFO", 4) == 0) {
		char *mp = strstr(line, "\"max_payload\":");
		if (mp)
			K.max_payload = strtoull(mp + 14, NULL, 10);
		if (strstr(line, "\"tls_required\":true")) {
			disconnect("the NATS server requires TLS, which the event library does not speak: point KIPIMO_NATS at a node-local server or leaf node without TLS");
			return;
		}
		if (K.state == 2)
			send_connect();
	} else if (strncmp(line, "-ERR", 4) == 0) {
		snprintf(K.last_error, sizeof K.last_error, "NATS server: %s", line + 4);
	}
}

/* consume_input takes bytes the server sent and handles every complete
 * line; a line longer than the buffer (an INFO with huge lists) is skipped.
 * It stops when a line made the connection drop. */
static void consume_input(const char *p, size_t n) {
	while (n > 0 && K.fd >= 0) {
		size_t room = sizeof K.in - 1 - K.inlen;
		size_t take = n < room ? n : room;
		memcpy(K.in + K.inlen, p, take);
		K.inlen += take;
		K.in[K.inlen] = 0;
		p += take;
		n -= take;
		char *start = K.in, *end = K.in + K.inlen, *nl;
		while (K.fd >= 0 && start < end && (nl = memmem(start, (size_t)(end - start), "\r\n", 2))) {
			*nl = 0;
			handle_line(start);
			start = nl + 2;
		}
		if (K.fd < 0)
			return;
		K.inlen -= (size_t)(start - K.in);
		memmove(K.in, start, K.inlen);
		if (K.inlen == sizeof K.in - 1)
			K.inlen = 0;
	}
}

static void nats_read(void) {
	char b[4096];
	for (;;) {
		ssize_t n = recv(K.fd, b, sizeof b, 0);
		if (n == 0) {
			disconnect("the NATS server closed the connection");
			return;
		}
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
				return;
			disconnect("read from the NATS server failed");
			return;
		}
		consume_input(b, (size_t)n);
		if (K.fd < 0)
			return;
	}
}

static void nats_write(void) {
	while (K.fd >= 0) {
		if (K.qoff == 0 && K.ctrllen) {
			ssize_t w = send(K.fd, K.ctrl, K.ctrllen, MSG_NOSIGNAL);
			if (w < 0) {
				if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
					disconnect("write to the NATS server failed");
				return;
			}
			memmove(K.ctrl, K.ctrl + w, K.ctrllen - (size_t)w);
			K.ctrllen -= (size_t)w;
			continue;
		}
		kp_msg *m = K.qhead;
		if (!m)
			return;
		ssize_t w = send(K.fd, m->data + K.qoff, m->len - K.qoff, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				disconnect("write to the NATS server failed");
			return;
		}
		K.qoff += (size_t)w;
		K.bytes_sent += (size_t)w;
		if (K.qoff == m->len) {
			K.qhead = m->next;
			if (!K.qhead)
				K.qtail = NULL;
			K.qbytes -= m->len;
			if (m->frame)
				K.frames_sent++;
			free(m);
			K.qoff = 0;
		}
	}
}

/* ---- status file ---- */

static void write_status(void) {
	if (!*K.status_dir)
		return;
	char path[1200], tmp[1300];
	snprintf(path, sizeof path, "%s/status.%u.%u.%d.json", K.status_dir, K.pid, atomic_load(&K.rank), (int)getpid());
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	uint64_t dropped_events = 0;
	pthread_mutex_lock(&K.reg_mu);
	for (uint32_t i = 0; i < K.nthreads; i++)
		dropped_events += atomic_load(&K.threads[i]->dropped);
	uint32_t nthreads = atomic_load(&K.next_tid);
	pthread_mutex_unlock(&K.reg_mu);
	char err[600], run[300];
	json_str(err, sizeof err, K.last_error);
	json_str(run, sizeof run, K.run);
	fprintf(f,
	        "{\"run\":\"%s\",\"pid\":%u,\"rank\":%u,\"os_pid\":%d,\"threads\":%u,\"frames\":%llu,\"frames_sent\":%llu,"
	        "\"frames_dropped\":%llu,\"oversize_frames\":%llu,\"events\":%llu,\"events_dropped\":%llu,"
	        "\"calls_summarised\":%llu,\"calls_dropped\":%llu,"
	        "\"bytes_sent\":%llu,\"connects\":%llu,\"connect_failures\":%llu,\"last_error\":\"%s\",\"injected\":[",
	        run, K.pid, atomic_load(&K.rank), (int)getpid(), nthreads, (unsigned long long)K.frames,
	        (unsigned long long)K.frames_sent, (unsigned long long)K.frames_dropped, (unsigned long long)K.oversize,
	        (unsigned long long)K.events, (unsigned long long)dropped_events, (unsigned long long)K.calls_summarised,
	        (unsigned long long)K.calls_dropped, (unsigned long long)K.bytes_sent,
	        (unsigned long long)K.connects, (unsigned long long)K.connect_failures, err);
	for (size_t i = 0; i < K.ntruth; i++) {
		char fn[600];
		json_str(fn, sizeof fn, K.truth[i].func);
		fprintf(f, "%s{\"func\":\"%s\",\"tid\":%u,\"entry\":%llu,\"delay_us\":%llu}", i ? "," : "", fn, K.truth[i].tid,
		        (unsigned long long)K.truth[i].entry_us, (unsigned long long)K.truth[i].delay_us);
	}
	fprintf(f, "]}\n");
	if (fclose(f) == 0)
		rename(tmp, path);
}

/* ---- the collector thread ---- */

static int rings_filling(void) {
	int full = 0;
	pthread_mutex_lock(&K.reg_mu);
	for (uint32_t i = 0; i < K.nthreads && !full; i++) {
		kp_thread *t = K.threads[i];
		uint64_t used = atomic_load_explicit(&t->head, memory_order_relaxed) - atomic_load_explicit(&t->tail, memory_order_relaxed);
		full = used > (t->mask + 1) / 4 * 3;
	}
	pthread_mutex_unlock(&K.reg_mu);
	return full || kp_device_filling();
}

static void *collector_main(void *arg) {
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	uint64_t next_cut = mono_ns() + K.period_ns;
	uint64_t served = 0, cut_served = 0;
	int final = 0, eos_queued = 0;
	uint64_t final_deadline = 0, eos_ping = 0;
	for (;;) {
		uint64_t now = mono_ns();
		if (now >= K.next_win_ns) {
			atomic_fetch_add_explicit(&K.win, 1, memory_order_relaxed);
			K.next_win_ns = now + KP_WINDOW_NS;
		}
		pthread_mutex_lock(&K.flush_mu);
		uint64_t req = K.flush_req;
		int freq = K.final_req;
		pthread_mutex_unlock(&K.flush_mu);
		if (freq && !final) {
			final = 1;
			final_deadline = now + K.flush_timeout_ns;
		}
		if (now >= next_cut || req > cut_served || rings_filling() || (final && !eos_queued)) {
			cut();
			cut_served = req;
			next_cut = now + K.period_ns;
			if (final && !eos_queued) {
				end_of_stream();
				eos_queued = 1;
			}
		}
		if (K.state == 0 && now >= K.next_retry_ns)
			nats_connect();
		if (K.state == 3)
			nats_write();
		/* a final PING once everything is written: its PONG means the server has it all */
		if (eos_queued && !K.qhead && K.state == 3 && !eos_ping) {
			if (K.ctrllen + 6 <= sizeof K.ctrl) {
				memcpy(K.ctrl + K.ctrllen, "PING\r\n", 6);
				K.ctrllen += 6;
				eos_ping = K.pongs + 1;
				nats_write();
			}
		}
		int idle = !K.qhead && !K.ctrllen;
		if (req > served && (idle || K.state != 3)) {
			/* flushes wait for the queue to drain (or for the server to be gone) */
			served = req;
			pthread_mutex_lock(&K.flush_mu);
			K.flush_done = served;
			pthread_cond_broadcast(&K.flush_cv);
			pthread_mutex_unlock(&K.flush_mu);
		}
		/* the end: everything acknowledged, or the timeout, or no server to wait for */
		if (final && ((eos_ping && K.pongs >= eos_ping) || now >= final_deadline || K.state == 0)) {
			/* whatever is still queued will never be sent */
			for (kp_msg *m = K.qhead; m;) {
				kp_msg *n = m->next;
				if (m->frame)
					K.frames_dropped++;
				free(m);
				m = n;
			}
			K.qhead = K.qtail = NULL;
			K.qbytes = 0;
			if (K.fd >= 0)
				close(K.fd);
			K.fd = -1;
			pthread_mutex_lock(&K.flush_mu);
			K.final_done = 1;
			K.flush_done = K.flush_req;
			pthread_cond_broadcast(&K.flush_cv);
			pthread_mutex_unlock(&K.flush_mu);
			return NULL;
		}
		struct pollfd pf[2] = {{.fd = K.wake_fd, .events = POLLIN}, {.fd = K.fd, .events = 0}};
		if (K.state == 1)
			pf[1].events = POLLOUT;
		else if (K.state >= 2)
			pf[1].events = (short)(POLLIN | ((K.state == 3 && (K.qhead || K.ctrllen)) ? POLLOUT : 0));
		now = mono_ns();
		uint64_t wait = next_cut > now ? next_cut - now : 0;
		if (wait > 10000000ull)
			wait = 10000000ull; /* look at the rings' fill (and turn the window) every 10 ms */
		if (K.state == 0 && K.next_retry_ns > now && K.next_retry_ns - now < wait)
			wait = K.next_retry_ns - now;
		if (final)
			wait = wait > 5000000ull ? 5000000ull : wait;
		int n = poll(pf, K.fd >= 0 ? 2 : 1, (int)(wait / 1000000ull));
		if (n <= 0)
			continue;
		if (pf[0].revents & POLLIN) {
			uint64_t v;
			(void)!read(K.wake_fd, &v, sizeof v);
		}
		if (K.fd < 0 || !pf[1].revents)
			continue;
		if (K.state == 1) {
			int err = 0;
			socklen_t len = sizeof err;
			getsockopt(K.fd, SOL_SOCKET, SO_ERROR, &err, &len);
			if (err) {
				K.connect_failures++;
				char why[300];
				snprintf(why, sizeof why, "connect to nats://%s:%s: %s", K.nats_host, K.nats_port, strerror(err));
				disconnect(why);
				continue;
			}
			K.state = 2;
			continue;
		}
		if (pf[1].revents & (POLLIN | POLLHUP | POLLERR))
			nats_read();
		if (K.fd >= 0 && (pf[1].revents & POLLOUT))
			nats_write();
	}
}

static void at_exit(void) {
	if (!atomic_load(&K.started))
		return;
	request(1);
	pthread_join(K.collector, NULL);
	atomic_store(&K.on, 0);
	write_status();
}

static void after_fork_child(void) {
	/* the child has no collector: it records nothing (this runs on the one
	 * thread the child has, the one that forked) */
	atomic_store(&K.on, 0);
	atomic_store(&K.started, 0);
	kp_self = NULL;
	kp_dead = 1;
}

static void add_process_metadata(void) {
	char host[256] = "";
	gethostname(host, sizeof host - 1);
	add_meta(0, "Hostname", host);
	char exe[1024];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n > 0) {
		exe[n] = 0;
		add_meta(0, "Executable", exe);
	}
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		char cmd[4096];
		ssize_t m = read(fd, cmd, sizeof cmd - 1);
		close(fd);
		if (m > 0) {
			for (ssize_t i = 0; i < m - 1; i++)
				if (!cmd[i])
					cmd[i] = ' ';
			cmd[m] = 0;
			add_meta(0, "Command Line", cmd);
		}
	}
	struct utsname u;
	if (uname(&u) == 0) {
		add_meta(0, "OS Name", u.sysname);
		add_meta(0, "OS Release", u.release);
		add_meta(0, "Architecture", u.machine);
	}
	char num[64];
	snprintf(num, sizeof num, "%ld", sysconf(_SC_NPROCESSORS_ONLN));
	add_meta(0, "CPU Cores", num);
	snprintf(num, sizeof num, "%d", (int)getpid());
	add_meta(0, "PID", num);
	const char *omp = env("OMP_NUM_THREADS");
	if (omp)
		add_meta(0, "OMP_NUM_THREADS", omp);
	add_meta(0, "Kipimo Clock", K.use_tsc ? "tsc" : "monotonic");
	snprintf(num, sizeof num, "%llu", (unsigned long long)(K.period_ns / 1000));
	add_meta(0, "Kipimo Period (us)", num);
	snprintf(num, sizeof num, "%llu", (unsigned long long)K.summary_rate);
	add_meta(0, "Kipimo Summary Rate (calls/s)", num);
}

static void start_collector(void) {
	K.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	K.statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
	struct timespec rt, mo;
	clock_gettime(CLOCK_REALTIME, &rt);
	clock_gettime(CLOCK_MONOTONIC, &mo);
	K.realtime_offset_ns = ((uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec) - ((uint64_t)mo.tv_sec * 1000000000ull + (uint64_t)mo.tv_nsec);
	K.seg_tick = ticks();
	K.seg_ns = mono_ns();
	K.last_us = (K.seg_ns + K.realtime_offset_ns) / 1000;
	if (K.counters_on) {
		K.cid_cpu = dict_lookup(&K.counters, "CPU Time (us)");
		K.cid_rss = dict_lookup(&K.counters, "Memory Footprint (VmRSS) (KB)");
		K.cid_vcsw = dict_lookup(&K.counters, "Voluntary Context Switches");
		K.cid_ivcsw = dict_lookup(&K.counters, "Involuntary Context Switches");
		uint64_t a, b, c, d;
		sample_counters(&a, &b, &c, &d);
	}
	add_process_metadata();
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 1 << 20);
	if (pthread_create(&K.collector, &attr, collector_main, NULL) != 0) {
		atomic_store(&K.on, 0);
		pthread_attr_destroy(&attr);
		return;
	}
	pthread_attr_destroy(&attr);
	atomic_store(&K.started, 1);
	atexit(at_exit);
}

int kp_ensure_started(void) { return atomic_load_explicit(&K.on, memory_order_relaxed); }

__attribute__((constructor)) static void kp_init(void) {
	const char *dis = env("KIPIMO_DISABLE");
	if ((dis && strcmp(dis, "0") != 0) || !env("KIPIMO_RUN"))
		return;
	parse_nats_url(env("KIPIMO_NATS") ? env("KIPIMO_NATS") : "nats://127.0.0.1:4222");
	snprintf(K.run, sizeof K.run, "%s", env("KIPIMO_RUN"));
	for (const char *c = K.run; *c; c++) {
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_'))
			return; /* not a subject token: the run cannot be named, stay off */
	}
	K.pid = env("KIPIMO_PID") ? (uint32_t)strtoul(env("KIPIMO_PID"), NULL, 10) : 0;
	atomic_store(&K.rank, env_rank());
	K.period_ns = 1000000000ull;
	if (env("KIPIMO_PERIOD") && (parse_duration_ns(env("KIPIMO_PERIOD"), &K.period_ns) != 0 || K.period_ns < 1000000ull)) {
		set_error("KIPIMO_PERIOD %s: want a duration of at least 1ms; using 1s", env("KIPIMO_PERIOD"));
		K.period_ns = 1000000000ull;
	}
	K.ring_events = 1u << 17;
	if (env("KIPIMO_BUFFER_EVENTS")) {
		uint64_t v = strtoull(env("KIPIMO_BUFFER_EVENTS"), NULL, 10), p = 1024;
		while (p < v && p < (1ull << 30))
			p <<= 1;
		K.ring_events = p;
	}
	K.queue_bytes = env("KIPIMO_QUEUE_BYTES") ? strtoull(env("KIPIMO_QUEUE_BYTES"), NULL, 10) : 64ull << 20;
	K.names_every = 16;
	if (env("KIPIMO_NAMES_EVERY")) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(env("KIPIMO_NAMES_EVERY"), &end, 10);
		if (errno || end == env("KIPIMO_NAMES_EVERY") || *end || v > 1000000ull || env("KIPIMO_NAMES_EVERY")[0] == '-')
			set_error("KIPIMO_NAMES_EVERY %s: want a number of frames from 0 to 1000000; using 16", env("KIPIMO_NAMES_EVERY"));
		else
			K.names_every = v;
	}
	K.exclude = split_list(env("KIPIMO_EXCLUDE"), &K.nexclude);
	K.seed = env("KIPIMO_SEED") ? strtoull(env("KIPIMO_SEED"), NULL, 10) : 1;
	K.counters_on = !(env("KIPIMO_COUNTERS") && strcmp(env("KIPIMO_COUNTERS"), "0") == 0);
	K.flush_timeout_ns = 5000000000ull;
	if (env("KIPIMO_FLUSH_TIMEOUT"))
		parse_duration_ns(env("KIPIMO_FLUSH_TIMEOUT"), &K.flush_timeout_ns);
	snprintf(K.status_dir, sizeof K.status_dir, "%s", env("KIPIMO_STATUS_DIR") ? env("KIPIMO_STATUS_DIR") : "");
	const char *clk = env("KIPIMO_CLOCK");
	K.use_tsc = clk ? strcmp(clk, "tsc") == 0 : tsc_invariant();
	K.summary_rate = 10000;
	if (env("KIPIMO_SUMMARY_RATE")) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(env("KIPIMO_SUMMARY_RATE"), &end, 10);
		if (errno || end == env("KIPIMO_SUMMARY_RATE") || *end || env("KIPIMO_SUMMARY_RATE")[0] == '-')
			set_error("KIPIMO_SUMMARY_RATE %s: want calls per second (0: never summarise); using 10000", env("KIPIMO_SUMMARY_RATE"));
		else
			K.summary_rate = v;
	}
	{
		double lim = (double)K.summary_rate * (double)KP_WINDOW_NS / 1e9;
		atomic_store(&K.win_limit, !K.summary_rate ? UINT32_MAX : lim < 1 ? 1 : lim > 4e9 ? 4000000000u : (uint32_t)lim);
	}
	dict_init(&K.funcs, KP_MAX_FUNCS);
	dict_init(&K.counters, KP_MAX_COUNTERS);
	K.inject_threshold = calloc(KP_MAX_FUNCS, sizeof *K.inject_threshold);
	K.inject_of = calloc(KP_MAX_FUNCS, sizeof *K.inject_of);
	K.addr_key = calloc(KP_ADDR_SLOTS, sizeof *K.addr_key);
	K.addr_val = calloc(KP_ADDR_SLOTS, sizeof *K.addr_val);
	if (env("KIPIMO_INJECT"))
		parse_inject(env("KIPIMO_INJECT"));
	if (!K.funcs.slot_name || !K.counters.slot_name || !K.inject_threshold || !K.inject_of || !K.addr_key || !K.addr_val)
		return;
	pthread_key_create(&K.key, thread_retire);
	pthread_atfork(NULL, NULL, after_fork_child);
	atomic_store(&K.on, 1);
}
