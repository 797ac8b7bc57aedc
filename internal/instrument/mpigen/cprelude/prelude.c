#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT, RTLD_DEFAULT */
#endif
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#include "kipimo_internal.h"

/* The wrappers stay in the dynamic symbol table even when the library is
 * built with -fvisibility=hidden: LD_PRELOAD interposition needs them. */
#define KP_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------
 * Enabled state and cached function ids
 * ------------------------------------------------------------------------ */

/* kp_state caches kp_ensure_started: 0 not asked yet, 1 recording,
 * 2 disabled (the wrappers then only call PMPI). */
static int kp_state;

static inline int kp_on(void)
{
    int s = __atomic_load_n(&kp_state, __ATOMIC_RELAXED);
    if (__builtin_expect(s == 0, 0)) {
        s = kp_ensure_started() ? 1 : 2;
        __atomic_store_n(&kp_state, s, __ATOMIC_RELAXED);
    }
    return s == 1;
}

/* kp_fid returns the id of the function called name. *slot caches id+1, so
 * that its zero value means "not registered yet"; two threads racing on the
 * first call both register, and kp_func_id gives both the same id. */
static inline uint32_t kp_fid(uint32_t *slot, const char *name)
{
    uint32_t v = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (__builtin_expect(v != 0, 1))
        return v - 1;
    v = kp_func_id(name);
    __atomic_store_n(slot, v + 1, __ATOMIC_RELAXED);
    return v;
}

/* kp_in_fortran counts the Fortran wrappers (below the C ones) under way on
 * this thread. An MPI whose Fortran bindings call the C MPI_ functions
 * (MPICH) enters a C wrapper from inside a Fortran one: that call is part of
 * the Fortran call the program made, whose wrapper records its execution and
 * its communication events, so the C wrapper records nothing. */
static __thread int kp_in_fortran __attribute__((tls_model("initial-exec")));

static inline int kp_outer(void)
{
    return kp_in_fortran == 0;
}

/* ------------------------------------------------------------------------
 * Message sizes
 * ------------------------------------------------------------------------ */

/* kp_bytes is the size of count elements of type. */
static uint64_t kp_bytes(int count, MPI_Datatype type)
{
    MPI_Count size = 0;
    if (count <= 0 || PMPI_Type_size_x(type, &size) != MPI_SUCCESS || size <= 0)
        return 0;
    return (uint64_t)count * (uint64_t)size;
}

/* kp_bytes_sum is the size of counts[0] + ... + counts[n-1] elements of type. */
static uint64_t kp_bytes_sum(const int *counts, int n, MPI_Datatype type)
{
    uint64_t total = 0;
    MPI_Count size = 0;
    if (counts == NULL)
        return 0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0)
            total += (uint64_t)counts[i];
    if (total == 0 || PMPI_Type_size_x(type, &size) != MPI_SUCCESS || size <= 0)
        return 0;
    return total * (uint64_t)size;
}

/* kp_status_bytes is the size of the message a receive status describes.
 * Counting it in MPI_BYTE (rather than in the receive's datatype) gives the
 * exact size of partial messages, does not overflow an int, and needs no
 * datatype, which the program may have freed while an MPI_Irecv was pending. */
static uint64_t kp_status_bytes(const MPI_Status *st)
{
    MPI_Count n = 0;
    if (PMPI_Get_elements_x(st, MPI_BYTE, &n) != MPI_SUCCESS || n < 0)
        return 0;
    return (uint64_t)n;
}

/* ------------------------------------------------------------------------
 * Communicator ranks to MPI_COMM_WORLD ranks
 *
 * Each communicator an event needs gets a kp_comm_info, cached as an MPI
 * attribute so that MPI deletes it whichever way the communicator goes away.
 * MPI_COMM_WORLD's lives in kp_world. Communicators whose group is the world
 * group in the same order translate by identity; the others hold their
 * (remote, for an intercommunicator) group and translate lazily, rank by
 * rank, into world[].
 * ------------------------------------------------------------------------ */

#define KP_RANK_UNKNOWN (-2)

typedef struct kp_comm_info {
    int refs;        /* the attribute holds one, each tracked MPI_Irecv one */
    int identity;    /* rank r of the communicator is world rank r */
    int inter;       /* an intercommunicator: peer ranks name the remote group */
    int lsize;       /* size of the local group */
    int n;           /* size of the group peer ranks name */
    int me;          /* this process's rank in the communicator */
    MPI_Group group; /* the group peer ranks name; MPI_GROUP_NULL if identity */
    int32_t world[]; /* world rank of each peer rank, -1 for none, or unknown */
} kp_comm_info;

static pthread_mutex_t kp_comm_mu = PTHREAD_MUTEX_INITIALIZER;
static int kp_keyval = MPI_KEYVAL_INVALID;        /* set under kp_comm_mu */
static kp_comm_info *kp_world;                     /* set under kp_comm_mu */
static MPI_Group kp_world_group = MPI_GROUP_NULL;  /* set under kp_comm_mu */
static int kp_finalizing;

static void kp_info_release(kp_comm_info *ci)
{
    if (ci == NULL || __atomic_sub_fetch(&ci->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    /* Groups must not be freed once MPI_Finalize is under way. */
    if (ci->group != MPI_GROUP_NULL && !__atomic_load_n(&kp_finalizing, __ATOMIC_RELAXED))
        PMPI_Group_free(&ci->group);
    free(ci);
}

/* kp_info_delete is the attribute's delete callback. */
static int kp_info_delete(MPI_Comm comm, int keyval, void *val, void *extra)
{
    (void)comm;
    (void)keyval;
    (void)extra;
    kp_info_release(val);
    return MPI_SUCCESS;
}

/* kp_info_new describes comm. Called with kp_comm_mu held. */
static kp_comm_info *kp_info_new(MPI_Comm comm)
{
    int inter = 0, lsize = 0, n = 0, me = 0, identity = 0, rc;
    if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS ||
        PMPI_Comm_size(comm, &lsize) != MPI_SUCCESS ||
        PMPI_Comm_rank(comm, &me) != MPI_SUCCESS)
        return NULL;
    n = lsize;
    if (inter) {
        if (PMPI_Comm_remote_size(comm, &n) != MPI_SUCCESS)
            return NULL;
    } else if (comm == MPI_COMM_WORLD) {
        identity = 1;
    } else {
        int cmp = MPI_UNEQUAL;
        if (PMPI_Comm_compare(comm, MPI_COMM_WORLD, &cmp) == MPI_SUCCESS)
            identity = cmp == MPI_IDENT || cmp == MPI_CONGRUENT;
    }
    if (!identity && kp_world_group == MPI_GROUP_NULL) {
        MPI_Group g;
        if (PMPI_Comm_group(MPI_COMM_WORLD, &g) != MPI_SUCCESS)
            return NULL;
        __atomic_store_n(&kp_world_group, g, __ATOMIC_RELEASE);
    }

    size_t slots = identity || n < 0 ? 0 : (size_t)n;
    kp_comm_info *ci = malloc(sizeof *ci + slots * sizeof ci->world[0]);
    if (ci == NULL)
        return NULL;
    ci->refs = 1;
    ci->identity = identity;
    ci->inter = inter;
    ci->lsize = lsize;
    ci->n = n;
    ci->me = me;
    ci->group = MPI_GROUP_NULL;
    for (size_t i = 0; i < slots; i++)
        ci->world[i] = KP_RANK_UNKNOWN;
    if (!identity) {
        rc = inter ? PMPI_Comm_remote_group(comm, &ci->group)
                   : PMPI_Comm_group(comm, &ci->group);
        if (rc != MPI_SUCCESS) {
            free(ci);
            return NULL;
        }
    }
    return ci;
}

/* kp_comm_get returns the description of comm, or NULL if MPI would not say. */
static kp_comm_info *kp_comm_get(MPI_Comm comm)
{
    kp_comm_info *ci = NULL;
    int kv, flag = 0;

    if (comm == MPI_COMM_NULL)
        return NULL;
    if (comm == MPI_COMM_WORLD) {
        ci = __atomic_load_n(&kp_world, __ATOMIC_ACQUIRE);
        if (ci != NULL)
            return ci;
    } else {
        kv = __atomic_load_n(&kp_keyval, __ATOMIC_ACQUIRE);
        if (kv != MPI_KEYVAL_INVALID &&
            PMPI_Comm_get_attr(comm, kv, &ci, &flag) == MPI_SUCCESS && flag)
            return ci;
    }

    pthread_mutex_lock(&kp_comm_mu);
    if (comm == MPI_COMM_WORLD) {
        ci = kp_world;
        if (ci == NULL) {
            ci = kp_info_new(comm);
            __atomic_store_n(&kp_world, ci, __ATOMIC_RELEASE);
        }
        goto out;
    }
    ci = NULL;
    if (kp_keyval == MPI_KEYVAL_INVALID) {
        if (PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, kp_info_delete, &kv, NULL) != MPI_SUCCESS)
            goto out;
        __atomic_store_n(&kp_keyval, kv, __ATOMIC_RELEASE);
    }
    flag = 0;
    if (PMPI_Comm_get_attr(comm, kp_keyval, &ci, &flag) == MPI_SUCCESS && flag)
        goto out;
    ci = kp_info_new(comm);
    if (ci != NULL && PMPI_Comm_set_attr(comm, kp_keyval, ci) != MPI_SUCCESS) {
        kp_info_release(ci);
        ci = NULL;
    }
out:
    pthread_mutex_unlock(&kp_comm_mu);
    return ci;
}

/* kp_world_rank translates rank, a peer rank of the communicator ci
 * describes (NULL: one whose ranks are world ranks), into MPI_COMM_WORLD.
 * It returns -1 for MPI_PROC_NULL, MPI_ANY_SOURCE and processes outside
 * MPI_COMM_WORLD. */
static int64_t kp_world_rank(kp_comm_info *ci, int rank)
{
    if (rank < 0)
        return -1;
    if (ci == NULL || ci->identity)
        return rank;
    if (rank >= ci->n)
        return -1;
    int32_t w = __atomic_load_n(&ci->world[rank], __ATOMIC_RELAXED);
    if (w == KP_RANK_UNKNOWN) {
        MPI_Group wg = __atomic_load_n(&kp_world_group, __ATOMIC_ACQUIRE);
        int out = MPI_UNDEFINED;
        if (wg == MPI_GROUP_NULL ||
            PMPI_Group_translate_ranks(ci->group, 1, &rank, wg, &out) != MPI_SUCCESS ||
            out < 0)
            out = -1;
        w = out;
        __atomic_store_n(&ci->world[rank], w, __ATOMIC_RELAXED);
    }
    return w;
}

/* kp_self is this process's world rank, or -1. */
static int64_t kp_self(void)
{
    kp_comm_info *w = kp_comm_get(MPI_COMM_WORLD);
    return w != NULL ? w->me : -1;
}

/* ------------------------------------------------------------------------
 * Point-to-point events
 * ------------------------------------------------------------------------ */

static void kp_send_event(MPI_Comm comm, int dest, int tag, int count, MPI_Datatype type)
{
    if (dest < 0) /* MPI_PROC_NULL */
        return;
    kp_comm_info *ci = kp_comm_get(comm);
    if (ci == NULL)
        return;
    int64_t p = kp_world_rank(ci, dest);
    if (p >= 0)
        kp_comm(KP_SEND, (uint32_t)p, (uint32_t)tag, kp_bytes(count, type));
}

/* kp_recv_event records the receive st describes, on a communicator ci
 * describes (NULL: one whose ranks are world ranks). */
static void kp_recv_event(kp_comm_info *ci, const MPI_Status *st)
{
    int cancelled = 0;
    if (PMPI_Test_cancelled(st, &cancelled) == MPI_SUCCESS && cancelled)
        return;
    int64_t p = kp_world_rank(ci, st->MPI_SOURCE);
    if (p >= 0)
        kp_comm(KP_RECV, (uint32_t)p, (uint32_t)st->MPI_TAG, kp_status_bytes(st));
}

static void kp_recv_done(MPI_Comm comm, const MPI_Status *st)
{
    kp_comm_info *ci = kp_comm_get(comm);
    if (ci != NULL)
        kp_recv_event(ci, st);
}

/* ------------------------------------------------------------------------
 * Requests: pending receives and persistent requests
 *
 * Two open-addressing tables (linear probing, backward-shift deletion) map
 * request handles to what their events need. kp_pending holds the
 * receives under way: each MPI_Irecv, and each started persistent receive,
 * until it completes. kp_persist holds the persistent requests, from
 * MPI_Send_init or MPI_Recv_init (and the Bsend, Ssend, Rsend variants) to
 * MPI_Request_free, with what MPI_Start records for them: a send's partner,
 * tag and bytes, a receive's communicator. The completion wrappers take
 * their requests' entries out of kp_pending before calling PMPI, since MPI
 * may hand a completed request's handle to another thread's new request as
 * soon as it returns, and put back the ones still pending. A persistent
 * request keeps its handle when it completes (it becomes inactive, not
 * MPI_REQUEST_NULL): its entry says so.
 * ------------------------------------------------------------------------ */

/* Kinds of entries. */
enum {
    KP_REQ_IRECV, /* kp_pending: an MPI_Irecv; set to MPI_REQUEST_NULL when it completes */
    KP_REQ_START, /* kp_pending: a started persistent receive; inactive when it completes */
    KP_REQ_PSEND, /* kp_persist: a persistent send */
    KP_REQ_PRECV  /* kp_persist: a persistent receive */
};

typedef struct {
    kp_comm_info *info; /* receives: NULL when the communicator's ranks are world ranks */
    int kind;
    uint32_t tag;    /* KP_REQ_PSEND: the send's tag, */
    int64_t partner; /* its destination's world rank (-1: none), */
    uint64_t bytes;  /* and its size */
} kp_reqval;

typedef struct {
    MPI_Request req;
    kp_reqval v;
    int used;
} kp_req_slot;

typedef struct {
    kp_req_slot *slots; /* cap slots */
    size_t cap;         /* a power of two, or 0 */
    size_t len;         /* written under kp_req_mu; read without it as a hint */
} kp_reqtab;

/* kp_req_mu guards both tables. */
static pthread_mutex_t kp_req_mu = PTHREAD_MUTEX_INITIALIZER;
static kp_reqtab kp_pending, kp_persist;

static size_t kp_req_home(const kp_reqtab *t, MPI_Request r)
{
    uint64_t h = (uint64_t)(uintptr_t)r;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h & (t->cap - 1);
}

static int kp_req_grow(kp_reqtab *t)
{
    size_t oldcap = t->cap, cap = oldcap != 0 ? oldcap * 2 : 64;
    kp_req_slot *old = t->slots, *s = calloc(cap, sizeof *s);
    if (s == NULL)
        return 0;
    t->slots = s;
    t->cap = cap;
    for (size_t i = 0; i < oldcap; i++) {
        if (!old[i].used)
            continue;
        size_t j = kp_req_home(t, old[i].req);
        while (s[j].used)
            j = (j + 1) & (cap - 1);
        s[j] = old[i];
    }
    free(old);
    return 1;
}

/* kp_req_put_locked adds r to t with the value v; an entry r already had
 * (a request completed or freed where the wrappers could not see it) is
 * replaced and its info handed back in *stale. Returns 0 when out of
 * memory. */
static int kp_req_put_locked(kp_reqtab *t, MPI_Request r, const kp_reqval *v, kp_comm_info **stale)
{
    size_t i, mask;
    if ((t->len + 1) * 2 > t->cap && !kp_req_grow(t))
        return 0;
    mask = t->cap - 1;
    for (i = kp_req_home(t, r); t->slots[i].used; i = (i + 1) & mask) {
        if (t->slots[i].req == r) {
            *stale = t->slots[i].v.info;
            t->slots[i].v = *v;
            return 1;
        }
    }
    t->slots[i].req = r;
    t->slots[i].v = *v;
    t->slots[i].used = 1;
    __atomic_store_n(&t->len, t->len + 1, __ATOMIC_RELAXED);
    return 1;
}

/* kp_req_find_locked returns r's entry in t, or NULL. */
static kp_req_slot *kp_req_find_locked(kp_reqtab *t, MPI_Request r)
{
    size_t i, mask;
    if (t->cap == 0)
        return NULL;
    mask = t->cap - 1;
    for (i = kp_req_home(t, r); t->slots[i].used; i = (i + 1) & mask)
        if (t->slots[i].req == r)
            return &t->slots[i];
    return NULL; /* the end of r's probe run: r is not here */
}

/* kp_req_take_locked removes r's entry from t and returns 1 and its value,
 * or 0. */
static int kp_req_take_locked(kp_reqtab *t, MPI_Request r, kp_reqval *v)
{
    size_t i, j, k, mask;
    kp_req_slot *s = kp_req_find_locked(t, r);
    if (s == NULL)
        return 0;
    *v = s->v;
    s->used = 0;
    mask = t->cap - 1;
    i = (size_t)(s - t->slots);
    /* Shift later members of the probe run back over the hole. */
    for (j = (i + 1) & mask; t->slots[j].used; j = (j + 1) & mask) {
        k = kp_req_home(t, t->slots[j].req);
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
            continue; /* already between its home and the hole */
        t->slots[i] = t->slots[j];
        t->slots[j].used = 0;
        i = j;
    }
    __atomic_store_n(&t->len, t->len - 1, __ATOMIC_RELAXED);
    return 1;
}

static int kp_req_any(const kp_reqtab *t)
{
    return __atomic_load_n(&t->len, __ATOMIC_RELAXED) != 0;
}

/* kp_req_info returns comm's description as an entry holds it: NULL for a
 * communicator whose ranks are world ranks, else ci with one more
 * reference. It returns 0 when MPI would not describe comm. */
static int kp_req_info(MPI_Comm comm, kp_comm_info **info)
{
    kp_comm_info *ci = kp_comm_get(comm);
    if (ci == NULL)
        return 0;
    if (ci->identity)
        ci = NULL;
    else
        __atomic_add_fetch(&ci->refs, 1, __ATOMIC_RELAXED);
    *info = ci;
    return 1;
}

/* kp_req_put adds r to t with the value v, which owns a reference to its
 * info; when the table cannot take it, the reference goes. */
static void kp_req_put(kp_reqtab *t, MPI_Request r, const kp_reqval *v)
{
    kp_comm_info *stale = NULL;
    int ok;
    pthread_mutex_lock(&kp_req_mu);
    ok = kp_req_put_locked(t, r, v, &stale);
    pthread_mutex_unlock(&kp_req_mu);
    kp_info_release(stale);
    if (!ok)
        kp_info_release(v->info);
}

/* kp_req_track remembers the pending receive r (MPI_Irecv) on comm. */
static void kp_req_track(MPI_Request r, MPI_Comm comm)
{
    kp_reqval v = {.kind = KP_REQ_IRECV};
    if (r != MPI_REQUEST_NULL && kp_req_info(comm, &v.info))
        kp_req_put(&kp_pending, r, &v);
}

/* kp_preq_send remembers the persistent send r (MPI_Send_init and its
 * variants): each MPI_Start of r records a KP_SEND of count elements of
 * type to dest on comm, with tag. The size and partner are worked out
 * here, once: the program may free the datatype or the communicator while
 * the request lives. */
static void kp_preq_send(MPI_Request r, MPI_Comm comm, int dest, int tag, int count, MPI_Datatype type)
{
    kp_reqval v = {.kind = KP_REQ_PSEND, .tag = (uint32_t)tag, .partner = -1};
    kp_comm_info *ci;
    if (r == MPI_REQUEST_NULL)
        return;
    if (dest >= 0 && (ci = kp_comm_get(comm)) != NULL) { /* not MPI_PROC_NULL */
        v.partner = kp_world_rank(ci, dest);
        v.bytes = kp_bytes(count, type);
    }
    kp_req_put(&kp_persist, r, &v);
}

/* kp_preq_recv remembers the persistent receive r on comm (MPI_Recv_init):
 * each MPI_Start of r makes it a pending receive. */
static void kp_preq_recv(MPI_Request r, MPI_Comm comm)
{
    kp_reqval v = {.kind = KP_REQ_PRECV};
    if (r != MPI_REQUEST_NULL && kp_req_info(comm, &v.info))
        kp_req_put(&kp_persist, r, &v);
}

/* kp_preq_start records the start of r (MPI_Start, MPI_Startall), if it is
 * a persistent request the wrappers saw made: the KP_SEND of a send; a
 * receive becomes pending, to be recorded when it completes. */
static void kp_preq_start(MPI_Request r)
{
    kp_reqval v = {.kind = KP_REQ_START};
    kp_req_slot *s;
    int64_t partner = -1;
    uint32_t tag = 0;
    uint64_t bytes = 0;
    if (r == MPI_REQUEST_NULL || !kp_req_any(&kp_persist))
        return;
    pthread_mutex_lock(&kp_req_mu);
    s = kp_req_find_locked(&kp_persist, r);
    if (s != NULL && s->v.kind == KP_REQ_PSEND) {
        partner = s->v.partner;
        tag = s->v.tag;
        bytes = s->v.bytes;
    } else if (s != NULL) {
        kp_comm_info *stale = NULL;
        v.info = s->v.info;
        if (v.info != NULL)
            __atomic_add_fetch(&v.info->refs, 1, __ATOMIC_RELAXED);
        if (kp_req_put_locked(&kp_pending, r, &v, &stale))
            v.info = stale;
    }
    pthread_mutex_unlock(&kp_req_mu);
    kp_info_release(v.info); /* what the table did not take, or replaced */
    if (partner >= 0)
        kp_comm(KP_SEND, (uint32_t)partner, tag, bytes);
}

/* kp_req_drop forgets r (MPI_Request_free): a pending MPI_Irecv, or a
 * persistent request and its start. */
static void kp_req_drop(MPI_Request r)
{
    kp_reqval p = {0}, q = {0};
    if (!kp_req_any(&kp_pending) && !kp_req_any(&kp_persist))
        return;
    pthread_mutex_lock(&kp_req_mu);
    (void)kp_req_take_locked(&kp_pending, r, &p);
    (void)kp_req_take_locked(&kp_persist, r, &q);
    pthread_mutex_unlock(&kp_req_mu);
    kp_info_release(p.info);
    kp_info_release(q.info);
}

/* Completion calls: kp_completion_take takes the entries of the pending
 * receives among reqs[0..count); kp_completion_begin does that and, if it
 * took any and the caller passed MPI_STATUS(ES)_IGNORE, points *st at local
 * statuses (nst of them: on the stack when few, else on the heap).
 * kp_completion_end records a KP_RECV for each taken request that completed,
 * and puts back those still pending. */

#define KP_SMALL 16

typedef struct {
    int index;      /* position in the caller's request array */
    int done;       /* its receive is recorded */
    int persistent; /* a started persistent receive: inactive, not MPI_REQUEST_NULL, once complete */
    MPI_Request req;
    kp_comm_info *info;
} kp_taken;

typedef struct {
    int n;
    kp_taken *taken;
    kp_taken *heap_taken;
    MPI_Status *heap_st;
    kp_taken small[KP_SMALL];
    MPI_Status small_st[KP_SMALL];
} kp_completion;

/* How kp_completion_end finds the status of a completed request: */
enum {
    KP_BY_POSITION, /* status i belongs to request i (Wait, Waitall, Test, Testall) */
    KP_BY_INDEX     /* status j belongs to request idx[j] (Waitany, Waitsome, ...) */
};

static void kp_completion_take(kp_completion *cp, int count, const MPI_Request *reqs)
{
    kp_reqval v;
    cp->n = 0;
    cp->taken = cp->small;
    cp->heap_taken = NULL;
    cp->heap_st = NULL;
    if (count <= 0 || reqs == NULL || !kp_req_any(&kp_pending))
        return;

    pthread_mutex_lock(&kp_req_mu);
    for (int i = 0; i < count; i++) {
        if (reqs[i] == MPI_REQUEST_NULL || !kp_req_take_locked(&kp_pending, reqs[i], &v))
            continue;
        /* (n reaches KP_SMALL only when count exceeds it; saying so keeps
         * -Warray-bounds quiet where count is a constant 1.) */
        if (cp->n == KP_SMALL && count > KP_SMALL && cp->heap_taken == NULL) {
            cp->heap_taken = malloc((size_t)count * sizeof *cp->heap_taken);
            if (cp->heap_taken != NULL) {
                for (int k = 0; k < KP_SMALL; k++)
                    cp->heap_taken[k] = cp->small[k];
                cp->taken = cp->heap_taken;
            }
        }
        if (cp->n == KP_SMALL && cp->heap_taken == NULL) {
            kp_info_release(v.info); /* out of memory: forget this receive */
            continue;
        }
        cp->taken[cp->n++] = (kp_taken){.index = i, .done = 0, .persistent = v.kind == KP_REQ_START,
                                        .req = reqs[i], .info = v.info};
    }
    pthread_mutex_unlock(&kp_req_mu);
}

static void kp_completion_begin(kp_completion *cp, int count, const MPI_Request *reqs,
                                MPI_Status **st, int nst, MPI_Status *ignore)
{
    kp_completion_take(cp, count, reqs);
    if (cp->n == 0 || *st != ignore)
        return;
    if (nst <= KP_SMALL) {
        *st = cp->small_st;
        return;
    }
    cp->heap_st = malloc((size_t)nst * sizeof *cp->heap_st);
    if (cp->heap_st != NULL) {
        *st = cp->heap_st;
        return;
    }
    /* Out of memory: without statuses the receives cannot be recorded. */
    for (int k = 0; k < cp->n; k++)
        kp_info_release(cp->taken[k].info);
    cp->n = 0;
    free(cp->heap_taken);
    cp->heap_taken = NULL;
}

static kp_taken *kp_taken_find(const kp_completion *cp, int index)
{
    int lo = 0, hi = cp->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (cp->taken[mid].index < index)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < cp->n && cp->taken[lo].index == index ? &cp->taken[lo] : NULL;
}

/* kp_completion_end ends a completion call that returned rc. Under
 * KP_BY_POSITION, flag says whether the call completed its requests (1 for
 * MPI_Wait and MPI_Waitall, *flag for MPI_Test and MPI_Testall): an
 * MPI_Irecv completed is MPI_REQUEST_NULL, a persistent receive keeps its
 * handle. Under KP_BY_INDEX, the requests idx[0..nidx) completed. */
static void kp_completion_end(kp_completion *cp, int rc, const MPI_Request *reqs,
                              const MPI_Status *st, int flag, int how, int nidx, const int *idx)
{
    kp_taken *t;
    if (cp->n == 0)
        return;
    if (rc == MPI_SUCCESS) {
        if (how == KP_BY_POSITION) {
            for (int k = 0; k < cp->n; k++) {
                t = &cp->taken[k];
                if (t->persistent ? flag : reqs[t->index] == MPI_REQUEST_NULL) {
                    kp_recv_event(t->info, &st[t->index]);
                    t->done = 1;
                }
            }
        } else {
            for (int j = 0; j < nidx; j++) {
                t = kp_taken_find(cp, idx[j]);
                if (t != NULL && !t->done && (t->persistent || reqs[t->index] == MPI_REQUEST_NULL)) {
                    kp_recv_event(t->info, &st[j]);
                    t->done = 1;
                }
            }
        }
    }

    /* Put back what is still pending; what completed (recorded, or not
     * because the call failed) lets go of its info. */
    pthread_mutex_lock(&kp_req_mu);
    for (int k = 0; k < cp->n; k++) {
        kp_comm_info *stale = NULL;
        t = &cp->taken[k];
        kp_reqval v = {.info = t->info, .kind = t->persistent ? KP_REQ_START : KP_REQ_IRECV};
        if (!t->done && reqs[t->index] != MPI_REQUEST_NULL &&
            kp_req_put_locked(&kp_pending, t->req, &v, &stale)) {
            t->info = stale;
        }
    }
    pthread_mutex_unlock(&kp_req_mu);
    for (int k = 0; k < cp->n; k++)
        kp_info_release(cp->taken[k].info);
    free(cp->heap_taken);
    free(cp->heap_st);
}

/* ------------------------------------------------------------------------
 * Collectives
 * ------------------------------------------------------------------------ */

/* Root argument of the collectives that have none. */
#define KP_NO_ROOT INT_MIN

/* kp_coll is this process's part in a collective. */
typedef struct {
    int n;      /* size of the group peer ranks name (remote, for an intercommunicator) */
    int lsize;  /* size of the local group */
    int me;     /* this process's rank in the communicator */
    int root;   /* this process is the root */
    int peer;   /* this process moves its own block: all but an intercommunicator's root */
    int64_t partner;
} kp_coll;

/* kp_coll_begin fills c for a collective on comm; it returns 0 when this
 * process records nothing (an intercommunicator's MPI_PROC_NULL side, or a
 * root outside MPI_COMM_WORLD). */
static int kp_coll_begin(kp_coll *c, MPI_Comm comm, int root)
{
    kp_comm_info *ci = kp_comm_get(comm);
    if (ci == NULL)
        return 0;
    c->n = ci->n;
    c->lsize = ci->lsize;
    c->me = ci->me;
    c->root = 0;
    c->peer = 1;
    if (root == KP_NO_ROOT) {
        c->partner = kp_self();
    } else if (ci->inter) {
        if (root == MPI_ROOT) {
            c->root = 1;
            c->peer = 0;
            c->partner = kp_self();
        } else if (root < 0) {
            return 0;
        } else {
            c->partner = kp_world_rank(ci, root);
        }
    } else {
        c->root = root == ci->me;
        c->partner = c->root ? kp_self() : kp_world_rank(ci, root);
    }
    return c->partner >= 0;
}

static void kp_coll_emit(const kp_coll *c, uint64_t sent, uint64_t got)
{
    if (sent > 0)
        kp_comm(KP_SEND, (uint32_t)c->partner, KP_TAG_COLLECTIVE, sent);
    if (got > 0)
        kp_comm(KP_RECV, (uint32_t)c->partner, KP_TAG_COLLECTIVE, got);
}

/* ------------------------------------------------------------------------
 * Start and end of MPI
 * ------------------------------------------------------------------------ */

static void kp_after_init(void)
{
    kp_comm_info *w = kp_comm_get(MPI_COMM_WORLD);
    if (w != NULL)
        kp_set_rank((uint32_t)w->me);
}

static void kp_before_finalize(void)
{
    __atomic_store_n(&kp_finalizing, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&kp_comm_mu);
    if (kp_world_group != MPI_GROUP_NULL) {
        MPI_Group g = kp_world_group;
        __atomic_store_n(&kp_world_group, MPI_GROUP_NULL, __ATOMIC_RELEASE);
        PMPI_Group_free(&g);
    }
    if (kp_keyval != MPI_KEYVAL_INVALID) {
        /* Attributes still set keep their values; MPI frees the key with the last one. */
        int kv = kp_keyval;
        __atomic_store_n(&kp_keyval, MPI_KEYVAL_INVALID, __ATOMIC_RELEASE);
        PMPI_Comm_free_keyval(&kv);
    }
    pthread_mutex_unlock(&kp_comm_mu);
}
