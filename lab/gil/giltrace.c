/* An LD_PRELOAD library that logs, while tracing is on, every pthread mutex lock (its call, "l", and once held,
 * "L"), unlock (before it, "U", and its return, "u"), condition wait (its start and end, "W" and "w") and condition
 * signal (its call and return, "s" and "S", the condition in the mutex's place) with the time, the mutex and the
 * calling site, each thread into a buffer of its own (the time-stamp counter, turned into ns at the dump), for
 * lab/gil/gil_trace.py and lab/gil/gil_stalls.py: CPython's GIL is a flag under a mutex, so its take_gil and
 * drop_gil show as locks and unlocks of that mutex from two sites of the interpreter, and each interval the GIL was
 * held or free is read from them, and how long each lock, unlock and signal took. giltrace_start() empties the
 * buffers and starts; giltrace_stop() stops; giltrace_dump(path) writes "thread<TAB>ns<TAB>kind<TAB>mutex<TAB>site"
 * lines, then "site<TAB>address<TAB>library<TAB>symbol+offset". Build: see lab/gil/preload.py. (The "l", "u", "s"
 * and "S" events came on 2026-11-25 at 05:3x-05:4x UTC, after the gil-trace data; gil_trace.py reads past them.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>

#define THREADS 64
#define CAP 400000

enum { LOCK, UNLOCK, WAIT, WOKE, LOCKING, UNLOCKED, SIGNAL, SIGNALLED };
static const char kind_char[] = "LUWwlusS";

typedef struct { long ns; void *mutex, *site; int kind; } event_t;  /* ns: time-stamp counter ticks until dumped */
typedef struct { event_t *e; int n; } log_t;

static log_t logs[THREADS];
static int used = 0;
static long start_ns, stop_ns;  /* the clock and the time-stamp counter at start and stop: ticks to ns */
static unsigned long long start_tsc, stop_tsc;
static volatile int tracing = 0;
static __thread log_t *mine = NULL;
static __thread int inside = 0;

static int (*real_lock)(pthread_mutex_t *);
static int (*real_unlock)(pthread_mutex_t *);
static int (*real_wait)(pthread_cond_t *, pthread_mutex_t *);
static int (*real_signal)(pthread_cond_t *);
static int (*real_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void note(int kind, void *mutex, void *site) {
    if (!tracing || inside) return;
    inside = 1;
    if (!mine) {
        int k = __atomic_fetch_add(&used, 1, __ATOMIC_RELAXED);
        if (k < THREADS) {
            logs[k].e = malloc(sizeof(event_t) * CAP);
            mine = &logs[k];
        }
    }
    if (mine && mine->e && mine->n < CAP) mine->e[mine->n++] = (event_t){(long)__rdtsc(), mutex, site, kind};
    inside = 0;
}

int pthread_mutex_lock(pthread_mutex_t *m) {
    if (!real_lock) real_lock = dlsym(RTLD_NEXT, "pthread_mutex_lock");
    note(LOCKING, m, __builtin_return_address(0));
    int r = real_lock(m);
    note(LOCK, m, __builtin_return_address(0));
    return r;
}

int pthread_mutex_unlock(pthread_mutex_t *m) {
    if (!real_unlock) real_unlock = dlsym(RTLD_NEXT, "pthread_mutex_unlock");
    note(UNLOCK, m, __builtin_return_address(0));
    int r = real_unlock(m);
    note(UNLOCKED, m, __builtin_return_address(0));
    return r;
}

int pthread_cond_signal(pthread_cond_t *c) {
    if (!real_signal) real_signal = dlvsym(RTLD_NEXT, "pthread_cond_signal", "GLIBC_2.3.2");
    note(SIGNAL, c, __builtin_return_address(0));
    int r = real_signal(c);
    note(SIGNALLED, c, __builtin_return_address(0));
    return r;
}

int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
    if (!real_wait) real_wait = dlvsym(RTLD_NEXT, "pthread_cond_wait", "GLIBC_2.3.2");
    note(WAIT, m, __builtin_return_address(0));
    int r = real_wait(c, m);
    note(WOKE, m, __builtin_return_address(0));
    return r;
}

int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t) {
    if (!real_timedwait) real_timedwait = dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
    note(WAIT, m, __builtin_return_address(0));
    int r = real_timedwait(c, m, t);
    note(WOKE, m, __builtin_return_address(0));
    return r;
}

void giltrace_start(void) {
    int n = used < THREADS ? used : THREADS;
    for (int k = 0; k < n; k++) logs[k].n = 0;
    start_ns = now_ns();
    start_tsc = __rdtsc();
    tracing = 1;
}

void giltrace_stop(void) {
    tracing = 0;
    stop_ns = now_ns();
    stop_tsc = __rdtsc();
}

int giltrace_dump(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int n = used < THREADS ? used : THREADS;
    void *sites[4096];
    int nsites = 0;
    double ns_per_tick = (double)(stop_ns - start_ns) / (double)(stop_tsc - start_tsc);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < logs[k].n; i++) {
            event_t *e = &logs[k].e[i];
            int s = 0;
            while (s < nsites && sites[s] != e->site) s++;
            if (s == nsites && nsites < 4096) sites[nsites++] = e->site;
            long ns = start_ns + (long)((double)(e->ns - (long)start_tsc) * ns_per_tick);
            fprintf(f, "%d\t%ld\t%c\t%p\t%d\n", k, ns, kind_char[e->kind], e->mutex, s);
        }
    for (int s = 0; s < nsites; s++) {
        Dl_info info;
        const char *lib = "?", *sym = "?";
        unsigned long offset = 0;
        if (dladdr(sites[s], &info)) {
            if (info.dli_fname) lib = info.dli_fname;
            if (info.dli_sname) sym = info.dli_sname;
            offset = (unsigned long)sites[s] - (unsigned long)(info.dli_sname ? info.dli_saddr : info.dli_fbase);
        }
        fprintf(f, "site\t%d\t%s\t%s+0x%lx\n", s, lib, sym, offset);
    }
    return fclose(f);
}
