/* The emulated device in C (see emulated_device.h); it mirrors backends/partition/emulated.py. */
#include "emulated_device.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json_min.h"

static uint32_t crc_table[256];

/* Filled when the library loads: models initialize in parallel threads, so never lazily. */
__attribute__((constructor)) static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[i] = c;
  }
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t len) {
  const unsigned char* p = data;
  crc = ~crc;
  for (size_t i = 0; i < len; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

static int err_out(char* err, size_t errlen, const char* msg, const char* value) {
  snprintf(err, errlen, msg, value ? value : "");
  return -1;
}

/* A whole-string integer (the keys of the latency tables); 0 on success. */
static int parse_int(const char* s, int64_t* out) {
  if (s == NULL || *s == '\0') return -1;
  char* end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0') return -1;
  *out = v;
  return 0;
}

/* Sort (batch, row of ``width`` values) pairs by batch (insertion sort: tables are short). */
static void sort_rows(int64_t* batch, double* values, size_t n, size_t width) {
  double tmp[256];
  for (size_t i = 1; i < n; i++) {
    for (size_t j = i; j > 0 && batch[j - 1] > batch[j]; j--) {
      int64_t b = batch[j];
      batch[j] = batch[j - 1];
      batch[j - 1] = b;
      memcpy(tmp, &values[j * width], width * sizeof(double));
      memcpy(&values[j * width], &values[(j - 1) * width], width * sizeof(double));
      memcpy(&values[(j - 1) * width], tmp, width * sizeof(double));
    }
  }
}

static int parse_latency(emulated_device* dev, const char* text, char* err, size_t errlen) {
  json_value v;
  char jerr[128];
  if (text == NULL || json_parse(text, strlen(text), &v, jerr, sizeof(jerr)) != 0) {
    return err_out(err, errlen, "emulated_latency_us='%s' is not JSON (batch -> latency in µs)", text);
  }
  int rc = 0;
  if (v.type != JSON_OBJECT || v.count == 0) {
    rc = err_out(err, errlen, "emulated_latency_us='%s': expected a non-empty object batch -> latency in µs", text);
  } else {
    dev->n = v.count;
    dev->batch = calloc(v.count, sizeof(int64_t));
    dev->us = calloc(v.count, sizeof(double));
    for (size_t i = 0; rc == 0 && i < v.count; i++) {
      const json_value* us = &v.items[i];
      if (parse_int(v.keys[i], &dev->batch[i]) != 0) {
        rc = err_out(err, errlen, "emulated_latency_us: batch '%s' is not an integer", v.keys[i]);
      } else if (dev->batch[i] < 1 || us->type != JSON_NUMBER || !(us->number >= 0) || isinf(us->number)) {
        rc = err_out(err, errlen, "emulated_latency_us: batch %s; expected batch >= 1 and a latency >= 0",
                     v.keys[i]);
      } else {
        dev->us[i] = us->number;
      }
    }
    if (rc == 0) sort_rows(dev->batch, dev->us, dev->n, 1);
  }
  json_free(&v);
  return rc;
}

static int parse_quantiles(emulated_device* dev, const char* text, char* err, size_t errlen) {
  static const char* shape = "emulated_latency_quantiles_us: expected JSON {\"levels\": [...], \"latency_us\": "
                             "{\"<batch>\": [one non-decreasing latency >= 0 per level], ...}}, levels increasing "
                             "strictly within [0, 1]%s";
  if (text == NULL || *text == '\0') return 0;
  json_value v;
  if (json_parse(text, strlen(text), &v, NULL, 0) != 0) return err_out(err, errlen, shape, "");
  const json_value* levels = json_get(&v, "levels");
  const json_value* table = json_get(&v, "latency_us");
  int ok = levels != NULL && table != NULL && levels->type == JSON_ARRAY && levels->count >= 2 &&
           levels->count <= 256 && table->type == JSON_OBJECT;
  if (ok) {
    dev->n_levels = levels->count;
    dev->levels = calloc(levels->count, sizeof(double));
    for (size_t i = 0; ok && i < levels->count; i++) {
      double x = levels->items[i].number;
      ok = levels->items[i].type == JSON_NUMBER && x >= 0 && x <= 1 && (i == 0 || x > dev->levels[i - 1]);
      dev->levels[i] = x;
    }
    dev->n_qbatch = table->count;
    dev->qbatch = calloc(table->count + 1, sizeof(int64_t));
    dev->qus = calloc((table->count + 1) * dev->n_levels, sizeof(double));
    for (size_t b = 0; ok && b < table->count; b++) {
      const json_value* q = &table->items[b];
      ok = parse_int(table->keys[b], &dev->qbatch[b]) == 0 && dev->qbatch[b] >= 1 && q->type == JSON_ARRAY &&
           q->count == dev->n_levels;
      for (size_t i = 0; ok && i < q->count; i++) {
        double x = q->items[i].number;
        ok = q->items[i].type == JSON_NUMBER && x >= 0 && isfinite(x) && (i == 0 || x >= dev->qus[b * dev->n_levels + i - 1]);
        dev->qus[b * dev->n_levels + i] = x;
      }
    }
  }
  json_free(&v);
  if (!ok) return err_out(err, errlen, shape, "");
  if (dev->n_qbatch == 0) dev->n_levels = 0; /* an empty table: no distribution */
  sort_rows(dev->qbatch, dev->qus, dev->n_qbatch, dev->n_levels);
  return 0;
}

static uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static double uniform(emulated_device* dev) { /* [0, 1) */
  uint64_t* s = dev->rng;
  uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return (double)(result >> 11) * 0x1.0p-53;
}

int device_init(emulated_device* dev, const char* latency_us, const char* stage, const char* quantiles,
                const char* cv, const char* seed, char* err, size_t errlen) {
  memset(dev, 0, sizeof(*dev));
  if (parse_latency(dev, latency_us, err, errlen) != 0) return -1;
  if (parse_quantiles(dev, quantiles, err, errlen) != 0) return -1;
  int64_t stage_i = 0;
  if (stage != NULL && *stage != '\0' && (parse_int(stage, &stage_i) != 0 || stage_i < 0)) {
    return err_out(err, errlen, "emulated_stage=%s must be an integer >= 0", stage);
  }
  double cv_v = 0;
  if (cv != NULL && *cv != '\0') {
    char* end = NULL;
    cv_v = strtod(cv, &end);
    if (*end != '\0' || !(cv_v >= 0 && cv_v <= 10)) {
      return err_out(err, errlen, "emulated_latency_cv=%s must be within 0..10 (0 = no noise)", cv);
    }
  }
  dev->sigma = sqrt(log1p(cv_v * cv_v));
  int64_t seed_v = 0;
  if (seed != NULL && *seed != '\0') {
    if (parse_int(seed, &seed_v) != 0) return err_out(err, errlen, "emulated_seed=%s is not an integer", seed);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed_v = (int64_t)ts.tv_nsec ^ ((int64_t)ts.tv_sec << 20) ^ (int64_t)(uintptr_t)dev;
  }
  uint64_t x = (uint64_t)seed_v;
  for (int i = 0; i < 4; i++) dev->rng[i] = splitmix64(&x);
  char name[64];
  int n = snprintf(name, sizeof(name), "poolpipe-stage-%lld", (long long)stage_i);
  dev->seed_crc = crc32_update(0, name, (size_t)n);
  return 0;
}

void device_free(emulated_device* dev) {
  free(dev->batch);
  free(dev->us);
  free(dev->levels);
  free(dev->qbatch);
  free(dev->qus);
  memset(dev, 0, sizeof(*dev));
}

double device_latency_at(const emulated_device* dev, int64_t batch) {
  const int64_t* b = dev->batch;
  size_t n = dev->n;
  if (batch < b[0]) return dev->us[0] * (double)batch / (double)b[0];
  if (batch > b[n - 1]) {
    if (n == 1) return dev->us[0] * (double)batch / (double)b[0];
    double slope = (dev->us[n - 1] - dev->us[n - 2]) / (double)(b[n - 1] - b[n - 2]);
    return dev->us[n - 1] + (slope > 0 ? slope : 0) * (double)(batch - b[n - 1]);
  }
  size_t i = 0;
  while (b[i] < batch) i++;
  if (b[i] == batch) return dev->us[i];
  return dev->us[i - 1] + (dev->us[i] - dev->us[i - 1]) * (double)(batch - b[i - 1]) / (double)(b[i] - b[i - 1]);
}

static double interp(double u, const double* xs, const double* ys, size_t n) {
  if (u <= xs[0]) return ys[0];
  for (size_t i = 1; i < n; i++) {
    if (u <= xs[i]) return ys[i - 1] + (ys[i] - ys[i - 1]) * (u - xs[i - 1]) / (xs[i] - xs[i - 1]);
  }
  return ys[n - 1];
}

double device_hold_us(emulated_device* dev, int64_t batch) {
  double us = device_latency_at(dev, batch);
  if (dev->n_levels > 0) {
    size_t near = 0; /* the largest distribution batch <= batch, else the smallest */
    for (size_t i = 0; i < dev->n_qbatch; i++) {
      if (dev->qbatch[i] <= batch) near = i;
    }
    double u = pow(uniform(dev), 1.0 / (double)batch); /* the largest of ``batch`` uniform levels */
    double base = device_latency_at(dev, dev->qbatch[near]);
    us = interp(u, dev->levels, &dev->qus[near * dev->n_levels], dev->n_levels) * (base > 0 ? us / base : 1.0);
  }
  if (dev->sigma > 0) {
    double u1 = 1.0 - uniform(dev), u2 = uniform(dev); /* Box-Muller: u1 in (0, 1] */
    double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    us *= exp(-dev->sigma * dev->sigma / 2 + dev->sigma * z);
  }
  return us;
}

static uint16_t small_int_to_half(unsigned v) { /* exact for 0..2047 */
  if (v == 0) return 0;
  int e = 0;
  while ((v >> (e + 1)) != 0) e++;
  return (uint16_t)(((e + 15) << 10) | ((v << (10 - e)) & 0x3FF));
}

void device_stamp_row(void* row, int dtype_kind, size_t elem_size, int64_t row_elems, uint32_t digest, int j) {
  unsigned char jb = (unsigned char)j;
  uint32_t code = crc32_update(digest, &jb, 1);
  int64_t n = row_elems < DIGEST_ELEMENTS ? row_elems : DIGEST_ELEMENTS;
  for (int64_t k = 0; k < n; k++) {
    unsigned v = (code >> (8 * k)) & 0xFF;
    char* at = (char*)row + k * (int64_t)elem_size;
    switch (dtype_kind) {
      case KIND_FLOAT: *(float*)at = (float)v; break;
      case KIND_DOUBLE: *(double*)at = (double)v; break;
      case KIND_HALF: *(uint16_t*)at = small_int_to_half(v); break;
      case KIND_BOOL: *(unsigned char*)at = (unsigned char)(v & 1); break;
      default: { /* integers: the byte value, wrapped as numpy's unsafe cast wraps it */
        int64_t x = dtype_kind == KIND_SIGNED && elem_size == 1 ? (int8_t)(uint8_t)v : (int64_t)v;
        memcpy(at, &x, elem_size); /* little-endian: the low bytes */
      }
    }
  }
}
