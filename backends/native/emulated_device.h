/* The emulated device of backends/partition/emulated.py, in C: the profiled latency table (interpolated),
 * a variable-latency distribution, lognormal noise and the per-row CRC-32 checksum of the outputs.
 * Nothing here knows Triton; poolpipe_emulated.c is the Triton backend around it. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define DIGEST_HEAD_BYTES 65536 /* bytes of each input row that enter the digest */
#define DIGEST_ELEMENTS 4       /* leading elements of each output row that carry the digest */

typedef struct {
  size_t n;          /* profiled batch sizes */
  int64_t* batch;    /* ascending */
  double* us;        /* latency at each, µs */
  size_t n_levels;   /* quantile levels of a variable-latency model (0: none) */
  double* levels;    /* ascending in [0, 1] */
  size_t n_qbatch;   /* batch sizes of the distribution */
  int64_t* qbatch;   /* ascending */
  double* qus;       /* n_qbatch x n_levels latencies */
  double sigma;      /* lognormal sigma of the noise (0: none) */
  uint64_t rng[4];   /* xoshiro256** state */
  uint32_t seed_crc; /* CRC-32 of "poolpipe-stage-<stage>" */
} emulated_device;

/* Parse the emulated_* parameters (strings as in config.pbtxt; NULL or "" for absent ones) into ``dev``.
 * 0 on success, else -1 with a message naming the parameter in ``err``. */
int device_init(emulated_device* dev, const char* latency_us, const char* stage, const char* quantiles,
                const char* cv, const char* seed, char* err, size_t errlen);
void device_free(emulated_device* dev);

/* Latency (µs) of the profiled table at ``batch`` (interpolated as emulated.latency_at). */
double device_latency_at(const emulated_device* dev, int64_t batch);

/* How long a batch of ``batch`` requests holds the device (µs), noise and distribution included. */
double device_hold_us(emulated_device* dev, int64_t batch);

/* zlib's crc32(crc, data, len). */
uint32_t crc32_update(uint32_t crc, const void* data, size_t len);

/* Write the checksum of output ``j`` for a row with input digest ``digest`` into its first elements
 * (``row`` of ``row_elems`` elements of ``elem_size`` bytes and the given Triton datatype name kind). */
void device_stamp_row(void* row, int dtype_kind, size_t elem_size, int64_t row_elems, uint32_t digest, int j);

/* Datatype kinds device_stamp_row understands. */
enum { KIND_FLOAT, KIND_HALF, KIND_DOUBLE, KIND_SIGNED, KIND_UNSIGNED, KIND_BOOL };
