/* TRITONBACKEND_ModelInstanceExecute of poolpipe_emulated: all requests of one call form one batch, held
 * together for the profiled latency of the total; a bad request gets its own error and the rest are served. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model_state.h"

typedef struct {
  TRITONBACKEND_Request* request;
  TRITONBACKEND_Response* response;
  TRITONSERVER_Error* err;
  int64_t batch;
  int64_t* start_out; /* POOLPIPE_COMPUTE_START_NS buffer, if requested */
  int64_t* end_out;
} pending;

/* CRC-32 of ``len`` bytes at logical offset ``off`` of an input split over ``n_buf`` buffers. */
static TRITONSERVER_Error* crc_range(TRITONBACKEND_Input* input, uint32_t n_buf, uint64_t off, uint64_t len,
                                     uint32_t* crc) {
  for (uint32_t b = 0; b < n_buf && len > 0; b++) {
    const void* buf = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
    int64_t mt_id = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_InputBuffer(input, b, &buf, &size, &mt, &mt_id);
    if (err != NULL) return err;
    if (mt == TRITONSERVER_MEMORY_GPU) {
      return error(TRITONSERVER_ERROR_UNSUPPORTED, "poolpipe_emulated: inputs in GPU memory are not supported%s%s",
                   NULL, NULL);
    }
    if (off >= size) {
      off -= size;
      continue;
    }
    uint64_t take = size - off < len ? size - off : len;
    *crc = crc32_update(*crc, (const char*)buf + off, take);
    len -= take;
    off = 0;
  }
  return NULL;
}

/* The request's batch size and the digest of each row (``*digests``, malloc'd); checks every input. */
static TRITONSERVER_Error* read_inputs(model_state* s, TRITONBACKEND_Request* request, int64_t* batch,
                                       uint32_t** digests) {
  TRITONBACKEND_Input* inputs[64];
  uint32_t n_bufs[64];
  if (s->n_inputs > 64) return error(TRITONSERVER_ERROR_UNSUPPORTED, "model %s: more than 64 inputs%s", s->name, NULL);
  *batch = -1;
  for (size_t k = 0; k < s->n_inputs; k++) {
    const tensor_spec* t = &s->inputs[k];
    TRITONSERVER_DataType dt;
    const int64_t* shape = NULL;
    uint32_t n_dims = 0;
    uint64_t bytes = 0;
    TRITONSERVER_Error* missing = TRITONBACKEND_RequestInput(request, t->name, &inputs[k]);
    if (missing != NULL) {
      TRITONSERVER_ErrorDelete(missing);
      return error(TRITONSERVER_ERROR_INVALID_ARG, "bad request: input '%s' is missing%s", t->name, NULL);
    }
    TRITONSERVER_Error* err = TRITONBACKEND_InputProperties(inputs[k], NULL, &dt, &shape, &n_dims, &bytes, &n_bufs[k]);
    if (err != NULL) return err;
    int ok = dt == t->dtype && n_dims == t->n_dims + 1 && (*batch < 0 || shape[0] == *batch);
    for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = shape[d + 1] == t->dims[d];
    if (!ok || shape[0] < 1 || bytes != (uint64_t)shape[0] * (uint64_t)t->row_elems * t->elem_size) {
      return error(TRITONSERVER_ERROR_INVALID_ARG, "bad request: input '%s' does not match the config (datatype, "
                   "[batch, dims] of model %s, one batch size for all inputs)", t->name, s->name);
    }
    *batch = shape[0];
  }
  if (*batch < 1) return error(TRITONSERVER_ERROR_INVALID_ARG, "model %s: no inputs%s", s->name, NULL);
  *digests = malloc(sizeof(uint32_t) * (size_t)*batch);
  for (int64_t i = 0; i < *batch; i++) {
    uint32_t d = s->dev.seed_crc;
    for (size_t k = 0; k < s->n_inputs; k++) {
      uint64_t row = (uint64_t)s->inputs[k].row_elems * s->inputs[k].elem_size;
      TRITONSERVER_Error* err = crc_range(inputs[k], n_bufs[k], (uint64_t)i * row,
                                          row < DIGEST_HEAD_BYTES ? row : DIGEST_HEAD_BYTES, &d);
      if (err != NULL) {
        free(*digests);
        return err;
      }
    }
    (*digests)[i] = d;
  }
  return NULL;
}

/* One requested output of ``p``'s response: a timing output (filled after the hold) or partition output j. */
static TRITONSERVER_Error* write_output(model_state* s, pending* p, const char* name, const uint32_t* digests) {
  int timing = strcmp(name, START_OUTPUT) == 0 || strcmp(name, END_OUTPUT) == 0;
  const tensor_spec* t = NULL;
  size_t j = 0;
  for (; !timing && j < s->n_outputs && t == NULL; j++) {
    if (strcmp(s->outputs[j].name, name) == 0) t = &s->outputs[j];
  }
  if (!timing && t == NULL) {
    return error(TRITONSERVER_ERROR_INVALID_ARG, "bad request: output '%s' is not an output of model %s", name,
                 s->name);
  }
  int64_t shape[MAX_DIMS + 1] = {p->batch, 1};
  uint32_t n_dims = 2;
  if (!timing) {
    memcpy(&shape[1], t->dims, t->n_dims * sizeof(int64_t));
    n_dims = t->n_dims + 1;
  }
  TRITONBACKEND_Output* out = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(p->response, &out, name,
                                                         timing ? TRITONSERVER_TYPE_INT64 : t->dtype, shape, n_dims);
  size_t row = timing ? sizeof(int64_t) : (size_t)t->row_elems * t->elem_size;
  void* buf = NULL;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t mt_id = 0;
  if (err == NULL) err = TRITONBACKEND_OutputBuffer(out, &buf, row * (size_t)p->batch, &mt, &mt_id);
  if (err == NULL && mt == TRITONSERVER_MEMORY_GPU) {
    err = error(TRITONSERVER_ERROR_UNSUPPORTED, "poolpipe_emulated: output '%s' in GPU memory%s", name, NULL);
  }
  if (err != NULL) return err;
  if (timing) {
    *(strcmp(name, START_OUTPUT) == 0 ? &p->start_out : &p->end_out) = buf;
    return NULL;
  }
  memset(buf, 0, row * (size_t)p->batch);
  for (int64_t i = 0; i < p->batch; i++) {
    device_stamp_row((char*)buf + (size_t)i * row, t->kind, t->elem_size, t->row_elems, digests[i], (int)(j - 1));
  }
  return NULL;
}

/* Read ``p``'s inputs and write its outputs; the error, if any, goes to p->err. */
static void prepare(model_state* s, pending* p) {
  uint32_t* digests = NULL;
  p->err = read_inputs(s, p->request, &p->batch, &digests);
  if (p->err == NULL) p->err = TRITONBACKEND_ResponseNew(&p->response, p->request);
  uint32_t n_out = 0;
  if (p->err == NULL) p->err = TRITONBACKEND_RequestOutputCount(p->request, &n_out);
  for (uint32_t o = 0; p->err == NULL && o < n_out; o++) {
    const char* name = NULL;
    p->err = TRITONBACKEND_RequestOutputName(p->request, o, &name);
    if (p->err == NULL) p->err = write_output(s, p, name, digests);
  }
  free(digests);
}

static void drop(TRITONSERVER_Error* err) {
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
}

static void sleep_until(uint64_t until_ns) {
  struct timespec ts = {(time_t)(until_ns / 1000000000ull), (long)(until_ns % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

/* Send ``p``'s response (or its error, on a fresh response if it had none) and release its request. */
static void finish(TRITONBACKEND_ModelInstance* instance, pending* p, uint64_t exec_start, uint64_t start,
                   uint64_t end) {
  TRITONBACKEND_Response* response = p->response;
  if (p->err != NULL && response != NULL) { /* a half-written response is dropped for a clean error one */
    drop(TRITONBACKEND_ResponseDelete(response));
    response = NULL;
  }
  if (response == NULL && TRITONBACKEND_ResponseNew(&response, p->request) != NULL) response = NULL;
  if (response != NULL) {
    drop(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, p->err));
  }
  drop(TRITONBACKEND_ModelInstanceReportStatistics(instance, p->request, p->err == NULL, exec_start, start, end,
                                                   now_ns(CLOCK_MONOTONIC)));
  drop(p->err);
  drop(TRITONBACKEND_RequestRelease(p->request, TRITONSERVER_REQUEST_RELEASE_ALL));
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                              TRITONBACKEND_Request** requests, const uint32_t count) {
  uint64_t exec_start = now_ns(CLOCK_MONOTONIC);
  int64_t wall_start = (int64_t)now_ns(CLOCK_REALTIME);
  TRITONBACKEND_Model* model = NULL;
  void* state = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (err == NULL) err = TRITONBACKEND_ModelState(model, &state);
  if (err != NULL) return err; /* Triton answers every request with this error */
  model_state* s = state;
  pending* ps = calloc(count, sizeof(pending));
  int64_t total = 0;
  for (uint32_t r = 0; r < count; r++) {
    ps[r].request = requests[r];
    prepare(s, &ps[r]);
    if (ps[r].err == NULL) total += ps[r].batch;
  }
  if (total > 0) sleep_until(exec_start + (uint64_t)(device_hold_us(&s->dev, total) * 1e3));
  uint64_t compute_end = now_ns(CLOCK_MONOTONIC);
  int64_t wall_end = (int64_t)now_ns(CLOCK_REALTIME);
  for (uint32_t r = 0; r < count; r++) {
    for (int64_t i = 0; ps[r].err == NULL && i < ps[r].batch; i++) {
      if (ps[r].start_out != NULL) ps[r].start_out[i] = wall_start;
      if (ps[r].end_out != NULL) ps[r].end_out[i] = wall_end;
    }
    finish(instance, &ps[r], exec_start, exec_start, compute_end);
  }
  if (total > 0) {
    drop(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, (uint64_t)total, exec_start, exec_start,
                                                          compute_end, now_ns(CLOCK_MONOTONIC)));
  }
  free(ps);
  return NULL;
}
