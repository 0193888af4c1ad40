/* poolpipe_emulated: a native Triton backend for emulated devices (``backend: "poolpipe_emulated"``).
 *
 * The same device as the Python partition backend with ``engine: emulated`` (backends/partition/model.py and
 * emulated.py) without the Python stub's round trip: each execute holds the batch for the profiled latency
 * (asleep, no CPU), returns the config's outputs (zeros, each row led by the CRC-32 checksum of its inputs) and
 * POOLPIPE_COMPUTE_START_NS / POOLPIPE_COMPUTE_END_NS. One execute at a time per instance: a GPU with instance
 * count 1 (the generated configs' instance_group; more instances would share one random state unguarded).
 * Built from this directory by backends/native/__init__.py; the headers are Triton's own (include/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json_min.h"
#include "model_state.h"

TRITONSERVER_Error* error(TRITONSERVER_Error_Code code, const char* fmt, const char* a, const char* b) {
  char msg[1024];
  snprintf(msg, sizeof(msg), fmt, a ? a : "", b ? b : "");
  return TRITONSERVER_ErrorNew(code, msg);
}

uint64_t now_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int kind_of(TRITONSERVER_DataType t) {
  switch (t) {
    case TRITONSERVER_TYPE_FP32: return KIND_FLOAT;
    case TRITONSERVER_TYPE_FP16: return KIND_HALF;
    case TRITONSERVER_TYPE_FP64: return KIND_DOUBLE;
    case TRITONSERVER_TYPE_BOOL: return KIND_BOOL;
    case TRITONSERVER_TYPE_INT8: case TRITONSERVER_TYPE_INT16: case TRITONSERVER_TYPE_INT32:
    case TRITONSERVER_TYPE_INT64: return KIND_SIGNED;
    case TRITONSERVER_TYPE_UINT8: case TRITONSERVER_TYPE_UINT16: case TRITONSERVER_TYPE_UINT32:
    case TRITONSERVER_TYPE_UINT64: return KIND_UNSIGNED;
    default: return -1;
  }
}

/* One config input/output ({"name", "data_type": "TYPE_FP32", "dims": [...]}) into ``t``. */
static TRITONSERVER_Error* read_tensor(const json_value* j, tensor_spec* t) {
  const json_value* name = json_get(j, "name");
  const json_value* dt = json_get(j, "data_type");
  const json_value* dims = json_get(j, "dims");
  if (name == NULL || name->type != JSON_STRING || dt == NULL || dt->type != JSON_STRING || dims == NULL ||
      dims->type != JSON_ARRAY || dims->count > MAX_DIMS) {
    return error(TRITONSERVER_ERROR_INVALID_ARG, "poolpipe_emulated: a config tensor lacks name, data_type or dims",
                 NULL, NULL);
  }
  t->name = strdup(name->string);
  t->dtype = TRITONSERVER_StringToDataType(strncmp(dt->string, "TYPE_", 5) == 0 ? dt->string + 5 : dt->string);
  t->kind = kind_of(t->dtype);
  t->elem_size = TRITONSERVER_DataTypeByteSize(t->dtype);
  if (t->kind < 0) {
    return error(TRITONSERVER_ERROR_INVALID_ARG, "poolpipe_emulated: tensor %s has data_type %s; emulated tensors "
                 "are numbers or booleans", t->name, dt->string);
  }
  t->n_dims = (uint32_t)dims->count;
  t->row_elems = 1;
  for (size_t i = 0; i < dims->count; i++) {
    const json_value* d = &dims->items[i];
    t->dims[i] = d->type == JSON_STRING ? atoll(d->string) : (int64_t)d->number;
    if (t->dims[i] < 1) {
      return error(TRITONSERVER_ERROR_INVALID_ARG, "poolpipe_emulated: tensor %s has variable dims; emulated "
                   "tensors need fixed shapes%s", t->name, NULL);
    }
    t->row_elems *= t->dims[i];
  }
  return NULL;
}

static const char* param(const json_value* config, const char* key) {
  const json_value* v = json_get(json_get(json_get(config, "parameters"), key), "string_value");
  return v != NULL && v->type == JSON_STRING ? v->string : NULL;
}

static TRITONSERVER_Error* read_tensors(const json_value* list, tensor_spec** out, size_t* n, int skip_timing) {
  size_t count = list != NULL && list->type == JSON_ARRAY ? list->count : 0;
  *out = calloc(count + 1, sizeof(tensor_spec));
  *n = 0;
  for (size_t i = 0; i < count; i++) {
    const json_value* name = json_get(&list->items[i], "name");
    if (skip_timing && name != NULL && name->type == JSON_STRING &&
        (strcmp(name->string, START_OUTPUT) == 0 || strcmp(name->string, END_OUTPUT) == 0)) {
      continue;
    }
    TRITONSERVER_Error* err = read_tensor(&list->items[i], &(*out)[*n]);
    (*n)++;
    if (err != NULL) return err;
  }
  return NULL;
}

static TRITONSERVER_Error* read_config(model_state* s, const json_value* config) {
  const char* engine = param(config, "engine");
  if (engine == NULL || strcmp(engine, "emulated") != 0) {
    return error(TRITONSERVER_ERROR_INVALID_ARG, "model %s: the poolpipe_emulated backend runs only config "
                 "parameter engine=emulated (got '%s'); use backend \"python\" for engines", s->name, engine);
  }
  const json_value* max_batch = json_get(config, "max_batch_size");
  if (max_batch == NULL || (max_batch->type == JSON_NUMBER ? max_batch->number : atof(max_batch->string)) < 1) {
    return error(TRITONSERVER_ERROR_INVALID_ARG, "model %s: the poolpipe_emulated backend needs max_batch_size >= 1 "
                 "(its tensors' first dimension is the batch)%s", s->name, NULL);
  }
  TRITONSERVER_Error* err = read_tensors(json_get(config, "input"), &s->inputs, &s->n_inputs, 0);
  if (err == NULL) err = read_tensors(json_get(config, "output"), &s->outputs, &s->n_outputs, 1);
  if (err == NULL && s->n_inputs == 0) {
    err = error(TRITONSERVER_ERROR_INVALID_ARG, "model %s: an emulated partition needs an input", s->name, NULL);
  }
  if (err != NULL) return err;
  char msg[900];
  if (device_init(&s->dev, param(config, "emulated_latency_us"), param(config, "emulated_stage"),
                  param(config, "emulated_latency_quantiles_us"), param(config, "emulated_latency_cv"),
                  param(config, "emulated_seed"), msg, sizeof(msg)) != 0) {
    return error(TRITONSERVER_ERROR_INVALID_ARG, "model %s: %s", s->name, msg);
  }
  return NULL;
}

static void free_tensors(tensor_spec* t, size_t n) {
  for (size_t i = 0; i < n; i++) free(t[i].name);
  free(t);
}

static void free_state(model_state* s) {
  if (s == NULL) return;
  free_tensors(s->inputs, s->n_inputs);
  free_tensors(s->outputs, s->n_outputs);
  device_free(&s->dev);
  free(s->name);
  free(s);
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  uint32_t major = 0, minor = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_ApiVersion(&major, &minor);
  if (err != NULL) return err;
  if (major != TRITONBACKEND_API_VERSION_MAJOR) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                 "poolpipe_emulated: this tritonserver's backend API major version is not 1");
  }
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name = NULL;
  TRITONSERVER_Message* message = NULL;
  const char* text = NULL;
  size_t len = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelName(model, &name);
  if (err == NULL) err = TRITONBACKEND_ModelConfig(model, 1, &message);
  if (err == NULL) err = TRITONSERVER_MessageSerializeToJson(message, &text, &len);
  if (err != NULL) {
    if (message != NULL) TRITONSERVER_MessageDelete(message);
    return err;
  }
  model_state* s = calloc(1, sizeof(model_state));
  s->name = strdup(name);
  json_value config;
  char jerr[128];
  if (json_parse(text, len, &config, jerr, sizeof(jerr)) != 0) {
    err = error(TRITONSERVER_ERROR_INTERNAL, "poolpipe_emulated: model config is not JSON: %s%s", jerr, NULL);
  } else {
    err = read_config(s, &config);
    json_free(&config);
  }
  TRITONSERVER_MessageDelete(message);
  if (err != NULL) {
    free_state(s);
    return err;
  }
  char msg[512];
  snprintf(msg, sizeof(msg), "poolpipe partition %s: emulated device (native backend, latency sigma %g)", s->name,
           s->dev.sigma);
  TRITONSERVER_LogMessage(TRITONSERVER_LOG_INFO, __FILE__, __LINE__, msg);
  return TRITONBACKEND_ModelSetState(model, s);
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* s = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelState(model, &s);
  free_state(s);
  return err;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  (void)instance;
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  (void)instance;
  return NULL;
}
