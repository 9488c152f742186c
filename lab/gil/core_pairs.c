/* Round trip of one cache line between two CPUs: for every pair of the CPUs given, two threads pinned to them pass
   a counter back and forth through one atomic word. Prints "a b ns_per_round_trip" a line. (lab/gil/core_pairs.py) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(64) atomic_long word;
static long trips;

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *answer(void *arg) {
    pin(*(int *)arg);
    for (long i = 0; i < trips; i++) {
        while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 1) {}
        atomic_store_explicit(&word, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

static double round_trip_ns(int a, int b) {
    pthread_t other;
    atomic_store(&word, 0);
    pthread_create(&other, NULL, answer, &b);
    pin(a);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < trips; i++) {
        atomic_store_explicit(&word, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&word, memory_order_acquire) != 2 * i + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(other, NULL);
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / trips;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: core_pairs TRIPS CPU [CPU ...]\n");
        return 2;
    }
    trips = atol(argv[1]);
    int n = argc - 2;
    int *cpus = malloc(n * sizeof *cpus);
    for (int i = 0; i < n; i++) cpus[i] = atoi(argv[i + 2]);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            printf("%d %d %.1f\n", cpus[i], cpus[j], round_trip_ns(cpus[i], cpus[j]));
    return 0;
}
