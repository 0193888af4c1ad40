/* Helpers both halves of poolpipe_front use: the sidecar's planned models (poolpipe_front.c) and the pass-through
 * Triton's models (passthrough.c). */
#pragma once

#include <stdint.h>
#include <time.h>

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
