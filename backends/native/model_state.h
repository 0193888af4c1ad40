/* What the poolpipe_emulated backend keeps per model (poolpipe_emulated.c reads it from the config,
 * execute.c serves requests with it). */
#pragma once

#include <stdint.h>
#include <time.h>

#include "emulated_device.h"
#include "triton_c.h"

/* Built with -fvisibility=hidden: only the TRITONBACKEND_* entry points are seen by tritonserver, and
 * nothing of ours binds to a same-named symbol of the server's. */
#define EXPORT __attribute__((visibility("default")))
#define MAX_DIMS 16
#define START_OUTPUT "POOLPIPE_COMPUTE_START_NS"
#define END_OUTPUT "POOLPIPE_COMPUTE_END_NS"

typedef struct {
  char* name;
  TRITONSERVER_DataType dtype;
  int kind;         /* emulated_device.h KIND_* */
  size_t elem_size;
  int64_t dims[MAX_DIMS];
  uint32_t n_dims;
  int64_t row_elems;
} tensor_spec;

typedef struct {
  char* name;
  size_t n_inputs, n_outputs;
  tensor_spec* inputs;
  tensor_spec* outputs; /* the partition's outputs, without the two timing outputs */
  emulated_device dev;
} model_state;

/* A Triton error with a message formatted from ``fmt`` and up to two strings. */
TRITONSERVER_Error* error(TRITONSERVER_Error_Code code, const char* fmt, const char* a, const char* b);

/* ``clock`` now, in ns. */
uint64_t now_ns(clockid_t clock);
