/* An LD_PRELOAD library that counts, per calling site, the pthread mutex locks and condition waits that took
 * longer than SLOW_NS (the thread slept: a futex wait), and every sched_yield, for scripts/gil_locks.py.
 * Each thread keeps its own table (no counting contention); lockcount_dump() sums them, resolving each site to
 * its library and symbol with dladdr; lockcount_reset() zeroes them. Build: see scripts/gil_locks.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define SLOTS 256
#define THREADS 512
#define SLOW_NS 1500

enum { MUTEX, COND, YIELD, KINDS };
static const char *kind_name[KINDS] = {"mutex", "cond", "yield"};

typedef struct { void *site; int kind; long calls, slow, slow_ns; } slot_t;
typedef struct { slot_t s[SLOTS]; } table_t;

static table_t tables[THREADS];
static int used = 0;  /* tables handed out */
static __thread table_t *mine = NULL;

static int (*real_lock)(pthread_mutex_t *);
static int (*real_wait)(pthread_cond_t *, pthread_mutex_t *);
static int (*real_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
static int (*real_yield)(void);

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void note(void *site, int kind, long ns) {
    if (!mine) {
        int k = __atomic_fetch_add(&used, 1, __ATOMIC_RELAXED);
        if (k >= THREADS) return;
        mine = &tables[k];
    }
    unsigned h = (unsigned)(((unsigned long)site >> 3) * 2654435761u + kind) % SLOTS;
    for (int i = 0; i < SLOTS; i++, h = (h + 1) % SLOTS) {
        slot_t *s = &mine->s[h];
        if (s->site == NULL) { s->site = site; s->kind = kind; }
        if (s->site == site && s->kind == kind) {
            s->calls++;
            if (ns >= SLOW_NS) { s->slow++; s->slow_ns += ns; }
            return;
        }
    }
}

int pthread_mutex_lock(pthread_mutex_t *m) {
    if (!real_lock) real_lock = dlsym(RTLD_NEXT, "pthread_mutex_lock");
    long t0 = now_ns();
    int r = real_lock(m);
    note(__builtin_return_address(0), MUTEX, now_ns() - t0);
    return r;
}

int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
    if (!real_wait) real_wait = dlvsym(RTLD_NEXT, "pthread_cond_wait", "GLIBC_2.3.2");
    long t0 = now_ns();
    int r = real_wait(c, m);
    note(__builtin_return_address(0), COND, now_ns() - t0);
    return r;
}

int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t) {
    if (!real_timedwait) real_timedwait = dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
    long t0 = now_ns();
    int r = real_timedwait(c, m, t);
    note(__builtin_return_address(0), COND, now_ns() - t0);
    return r;
}

int sched_yield(void) {
    if (!real_yield) real_yield = dlsym(RTLD_NEXT, "sched_yield");
    note(__builtin_return_address(0), YIELD, 0);
    return real_yield();
}

void lockcount_reset(void) {
    int n = used < THREADS ? used : THREADS;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < SLOTS; i++) { tables[k].s[i].calls = tables[k].s[i].slow = tables[k].s[i].slow_ns = 0; }
}

/* One line per (site, kind) with calls: "kind<TAB>library<TAB>symbol<TAB>calls<TAB>slow<TAB>slow_ns". */
int lockcount_dump(char *buf, int len) {
    int n = used < THREADS ? used : THREADS, at = 0;
    buf[0] = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < SLOTS; i++) {
            slot_t *s = &tables[k].s[i];
            if (!s->site || !s->calls) continue;
            Dl_info info;
            const char *lib = "?", *sym = "?";
            if (dladdr(s->site, &info)) {
                if (info.dli_fname) { lib = strrchr(info.dli_fname, '/'); lib = lib ? lib + 1 : info.dli_fname; }
                if (info.dli_sname) sym = info.dli_sname;
            }
            int w = snprintf(buf + at, len - at, "%s\t%s\t%s\t%ld\t%ld\t%ld\n", kind_name[s->kind], lib, sym,
                             s->calls, s->slow, s->slow_ns);
            if (w < 0 || w >= len - at) return -1;
            at += w;
        }
    return at;
}
