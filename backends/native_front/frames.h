/* The frames poolpipe_front and the sidecar exchange over their Unix socket (scheduler/server/front/
 * native_frames.py is the other side). Little-endian; a frame is u32 length, then:
 *   hello   (front -> sidecar, first): u32 HELLO_ID, str model
 *   request (front -> sidecar): u32 id, u16 n, n x tensor (the inputs), u16 m, m x str (requested outputs), str
 *           the client's request id (KServe ``id``), u64 the client's ``timeout`` parameter in µs (0: none)
 *   answer  (sidecar -> front): u32 id, u32 code (0: success, else a TRITONSERVER_Error_Code, never UNKNOWN), then
 *           str message when the code is not 0, else u16 n, n x tensor (the outputs), u16 k, k x (str name, i64
 *           value): the response's int64 parameters (the sidecar's own latency, poolpipe_sidecar_latency_us)
 *   cancel  (front -> sidecar): u32 CANCEL_ID, u32 id: the request was cancelled and answered by the front; the
 *           sidecar drops it and answers this frame (any code), unless it had answered the request already: either
 *           way exactly one answer frame carries each id, so the front frees the id on it
 * where str = u16 length, bytes; tensor = str name, str datatype (Triton's: "FP32"), u16 dims, dims x i64 shape,
 * u64 byte size, the bytes. */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HELLO_ID 0xFFFFFFFFu
#define CANCEL_ID 0xFFFFFFFEu
#define SOCKET_ENV "POOLPIPE_FRONT_SOCKET"
#define MAX_FRAME_DIMS 16

typedef struct {
  char* data;
  size_t len, cap;
} writer_t;

typedef struct {
  const char* p;
  const char* end;
} reader_t;

typedef struct {
  char name[256];
  char dtype[32];
  int64_t shape[MAX_FRAME_DIMS];
  uint32_t n_dims;
  uint64_t nbytes;
  const char* data;
} tensor_frame;

static inline void wr_bytes(writer_t* w, const void* p, size_t n) {
  if (w->len + n > w->cap) {
    w->cap = (w->len + n) * 2 + 256;
    w->data = realloc(w->data, w->cap);
  }
  memcpy(w->data + w->len, p, n);
  w->len += n;
}
static inline void wr_u16(writer_t* w, uint16_t v) { wr_bytes(w, &v, 2); }
static inline void wr_u32(writer_t* w, uint32_t v) { wr_bytes(w, &v, 4); }
static inline void wr_u64(writer_t* w, uint64_t v) { wr_bytes(w, &v, 8); }
static inline void wr_i64(writer_t* w, int64_t v) { wr_bytes(w, &v, 8); }
static inline void wr_str(writer_t* w, const char* s) {
  size_t n = s == NULL ? 0 : strlen(s);
  wr_u16(w, (uint16_t)n);
  wr_bytes(w, s, n);
}
/* Reserve the length of a frame; frame_end fills it in. */
static inline size_t frame_begin(writer_t* w) {
  size_t at = w->len;
  wr_u32(w, 0);
  return at;
}
static inline void frame_end(writer_t* w, size_t at) {
  uint32_t n = (uint32_t)(w->len - at - 4);
  memcpy(w->data + at, &n, 4);
}

static inline int rd_take(reader_t* r, void* out, size_t n) {
  if ((size_t)(r->end - r->p) < n) return -1;
  memcpy(out, r->p, n);
  r->p += n;
  return 0;
}
static inline int rd_u16(reader_t* r, uint16_t* v) { return rd_take(r, v, 2); }
static inline int rd_u32(reader_t* r, uint32_t* v) { return rd_take(r, v, 4); }
/* A str into ``out`` (NUL-terminated; -1 if it does not fit or the frame is short). */
static inline int rd_str(reader_t* r, char* out, size_t cap) {
  uint16_t n = 0;
  if (rd_u16(r, &n) != 0 || n >= cap) return -1;
  if (rd_take(r, out, n) != 0) return -1;
  out[n] = 0;
  return 0;
}
/* A tensor; its bytes stay in the frame (t->data). */
static inline int rd_tensor(reader_t* r, tensor_frame* t) {
  uint16_t dims = 0;
  if (rd_str(r, t->name, sizeof(t->name)) != 0 || rd_str(r, t->dtype, sizeof(t->dtype)) != 0) return -1;
  if (rd_u16(r, &dims) != 0 || dims > MAX_FRAME_DIMS) return -1;
  t->n_dims = dims;
  if (rd_take(r, t->shape, 8u * dims) != 0 || rd_take(r, &t->nbytes, 8) != 0) return -1;
  if ((uint64_t)(r->end - r->p) < t->nbytes) return -1;
  t->data = r->p;
  r->p += t->nbytes;
  return 0;
}
