/*
 * malloc_threads.c - a glibc program with many threads doing malloc/free,
 * for the census: THREADS threads (each soon on its own malloc arena) for
 * SECONDS allocate 16 B to 512 KiB (the large ones through mmap), keep a
 * rotating window alive and free the rest, so arenas grow and trim.
 *
 *   malloc_threads THREADS SECONDS
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEPT 512

static double seconds;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *worker(void *arg)
{
	unsigned seed = (unsigned)(long)arg;
	void *kept[KEPT] = { 0 };
	const double end = now() + seconds;
	long ops = 0;
	while (now() < end) {
		for (int i = 0; i < 1000; i++, ops++) {
			size_t size = (size_t)16 << (rand_r(&seed) % 16);
			char *p = malloc(size);
			memset(p, 1, size < 4096 ? size : 4096);
			int slot = rand_r(&seed) % KEPT;
			free(kept[slot]);
			kept[slot] = p;
		}
	}
	for (int i = 0; i < KEPT; i++)
		free(kept[i]);
	return (void *)ops;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: malloc_threads THREADS SECONDS\n");
		return 2;
	}
	const int n = atoi(argv[1]);
	seconds = atof(argv[2]);
	pthread_t *t = calloc((size_t)n, sizeof(*t));
	long total = 0;
	for (long i = 0; i < n; i++)
		pthread_create(&t[i], NULL, worker, (void *)(i + 1));
	for (int i = 0; i < n; i++) {
		void *ops;
		pthread_join(t[i], &ops);
		total += (long)ops;
	}
	printf("threads=%d malloc_free_pairs=%ld\n", n, total);
	return 0;
}
