/* An LD_PRELOAD library that counts, per calling site, the pthread mutex locks and condition waits that took
 * longer than SLOW_NS (the thread slept: a futex wait), and every sched_yield, for lab/gil/gil_locks.py. A slow
 * condition wait is also counted under its origin: the first caller up its stack outside libc and the
 * interpreter (e.g. the torch binding whose GIL release it waited after), kind "cond-origin", and under the
 * frame above that one, kind "cond-caller".
 * Each thread keeps its own table (no counting contention); lockcount_dump() sums them, resolving each site to
 * its library and symbol with dladdr; lockcount_reset() zeroes them. Build: see lab/gil/gil_locks.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define SLOTS 256
#define THREADS 512
#define SLOW_NS 1500

enum { MUTEX, COND, YIELD, ORIGIN, CALLER, KINDS };
static const char *kind_name[KINDS] = {"mutex", "cond", "yield", "cond-origin", "cond-caller"};

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

static int outside(void *pc) {  /* a frame outside libc, the interpreter and this library */
    Dl_info info;
    if (!dladdr(pc, &info) || !info.dli_fname) return 0;
    const char *name = strrchr(info.dli_fname, '/');
    name = name ? name + 1 : info.dli_fname;
    return strncmp(name, "libc.so", 7) && strncmp(name, "libpython", 9) && strncmp(name, "python", 6) &&
           strncmp(name, "liblockcount", 12);
}

static void note_origin(long ns) {
    if (ns < SLOW_NS) return;
    void *frames[12];
    int n = backtrace(frames, 12);
    for (int i = 1; i < n; i++)
        if (outside(frames[i])) {  /* and the frame above it: the origin is often a GIL guard's destructor */
            note(frames[i], ORIGIN, ns);
            if (i + 1 < n) note(frames[i + 1], CALLER, ns);
            return;
        }
    note((void *)1, ORIGIN, ns);  /* the interpreter's own (no extension frame): a sentinel site */
}

__attribute__((constructor)) static void warm(void) {  /* backtrace's first call loads libgcc: not in a wait */
    void *frames[2];
    backtrace(frames, 2);
}

int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
    if (!real_wait) real_wait = dlvsym(RTLD_NEXT, "pthread_cond_wait", "GLIBC_2.3.2");
    long t0 = now_ns();
    int r = real_wait(c, m);
    long ns = now_ns() - t0;
    note(__builtin_return_address(0), COND, ns);
    note_origin(ns);
    return r;
}

int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t) {
    if (!real_timedwait) real_timedwait = dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
    long t0 = now_ns();
    int r = real_timedwait(c, m, t);
    long ns = now_ns() - t0;
    note(__builtin_return_address(0), COND, ns);
    note_origin(ns);
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
            unsigned long offset = 0;
            if (dladdr(s->site, &info)) {
                if (info.dli_fname) lib = info.dli_fname;
                if (info.dli_sname) sym = info.dli_sname;
                offset = (unsigned long)s->site - (unsigned long)(info.dli_sname ? info.dli_saddr : info.dli_fbase);
            }
            int w = snprintf(buf + at, len - at, "%s\t%s\t%s+0x%lx\t%ld\t%ld\t%ld\n", kind_name[s->kind], lib,
                             sym, offset, s->calls, s->slow, s->slow_ns);
            if (w < 0 || w >= len - at) return -1;
            at += w;
        }
    return at;
}
