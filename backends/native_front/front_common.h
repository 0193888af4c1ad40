/* Helpers both halves of poolpipe_front use: the sidecar's planned models (poolpipe_front.c) and the pass-through
 * Triton's models (passthrough.c). */
#pragma once

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "frames.h"
#include "triton_c.h"

static inline void drop(TRITONSERVER_Error* err) {
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
}

/* Answer ``request`` with ``err`` and release it. ResponseSend copies the error, so it is deleted here. */
static inline void answer_error(TRITONBACKEND_Request* request, TRITONSERVER_Error* err) {
  TRITONBACKEND_Response* response = NULL;
  if (TRITONBACKEND_ResponseNew(&response, request) == NULL) {
    drop(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err));
  }
  drop(err);
  drop(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
}

/* One input of a request, as Triton describes it. */
typedef struct {
  TRITONBACKEND_Input* input;
  const char* name;
  TRITONSERVER_DataType dt;
  const int64_t* shape;
  uint32_t n_dims, n_buf;
  uint64_t bytes;
} input_info;

/* Input ``i`` of ``request`` into ``in``. */
static inline TRITONSERVER_Error* input_info_at(TRITONBACKEND_Request* request, uint32_t i, input_info* in) {
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInputByIndex(request, i, &in->input);
  if (err != NULL) return err;
  return TRITONBACKEND_InputProperties(in->input, &in->name, &in->dt, &in->shape, &in->n_dims, &in->bytes,
                                       &in->n_buf);
}

/* Append the bytes of ``input`` (its ``n_buf`` buffers, which must be in CPU memory) to ``w``. */
static inline TRITONSERVER_Error* append_input_bytes(writer_t* w, TRITONBACKEND_Input* input, uint32_t n_buf) {
  for (uint32_t b = 0; b < n_buf; b++) {
    const void* p = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
    int64_t mt_id = 0;
    TRITONSERVER_Error* err = TRITONBACKEND_InputBuffer(input, b, &p, &size, &mt, &mt_id);
    if (err != NULL) return err;
    if (mt == TRITONSERVER_MEMORY_GPU) {
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "poolpipe_front: inputs in GPU memory");
    }
    wr_bytes(w, p, size);
  }
  return NULL;
}

/* Add output ``name`` (Triton's datatype name, ``shape``) to ``response`` holding ``nbytes`` copied from ``data``. */
static inline TRITONSERVER_Error* add_output_bytes(TRITONBACKEND_Response* response, const char* name,
                                                   const char* dtype, const int64_t* shape, uint32_t n_dims,
                                                   const void* data, size_t nbytes) {
  TRITONBACKEND_Output* out = NULL;
  void* buf = NULL;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t mt_id = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(response, &out, name, TRITONSERVER_StringToDataType(dtype),
                                                         shape, n_dims);
  if (err == NULL) err = TRITONBACKEND_OutputBuffer(out, &buf, nbytes, &mt, &mt_id);
  if (err == NULL && mt == TRITONSERVER_MEMORY_GPU) {
    err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "poolpipe_front: output in GPU memory");
  }
  if (err == NULL && nbytes > 0) memcpy(buf, data, nbytes);
  return err;
}

/* Triton's statistics clock (steady_clock). */
static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Count ``request`` in the model's statistics (success or failure, from ``start`` to now) before it is answered:
 * perf_analyzer's server-side figures and Triton's statistics extension read these. */
static inline void count_request(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, int ok,
                                 uint64_t start) {
  uint64_t end = now_ns();
  drop(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, ok, start, start, end, end));
}
