/* The KServe v2 HTTP infer call a pass-through request becomes: what the client sent to the front (its id, its
 * timeout and custom parameters, its inputs, the outputs it asked for) in the JSON header, tensors as binary data
 * after it, so the pass-through Triton sees the request as the client made it. Priority is not forwarded: Triton's
 * backend API does not give it to the front's backend. */
#include "upstream_call.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "front_common.h"

static void wr_text(writer_t* w, const char* s) { wr_bytes(w, s, strlen(s)); }

static void wr_json_str(writer_t* w, const char* s) {
  wr_bytes(w, "\"", 1);
  for (const unsigned char* c = (const unsigned char*)(s ? s : ""); *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') {
      esc[0] = '\\', esc[1] = (char)*c, esc[2] = 0;
    } else if (*c < 0x20) {
      snprintf(esc, sizeof(esc), "\\u%04x", *c);
    } else {
      esc[0] = (char)*c, esc[1] = 0;
    }
    wr_text(w, esc);
  }
  wr_bytes(w, "\"", 1);
}

/* One input's JSON entry into ``json`` and its bytes into ``bin``. */
static TRITONSERVER_Error* encode_input(writer_t* json, writer_t* bin, TRITONBACKEND_Request* request, uint32_t i) {
  input_info in;
  char num[32];
  TRITONSERVER_Error* err = input_info_at(request, i, &in);
  if (err != NULL) return err;
  wr_text(json, i ? ",{\"name\":" : "{\"name\":");
  wr_json_str(json, in.name);
  wr_text(json, ",\"datatype\":");
  wr_json_str(json, TRITONSERVER_DataTypeString(in.dt));
  wr_text(json, ",\"shape\":[");
  for (uint32_t d = 0; d < in.n_dims; d++) {
    snprintf(num, sizeof(num), d ? ",%lld" : "%lld", (long long)in.shape[d]);
    wr_text(json, num);
  }
  snprintf(num, sizeof(num), "%llu", (unsigned long long)in.bytes);
  wr_text(json, "],\"parameters\":{\"binary_data_size\":");
  wr_text(json, num);
  wr_text(json, "}}");
  return append_input_bytes(bin, in.input, in.n_buf);
}

/* One parameter's value (string, int, bool or double: bytes have no JSON form), as JSON, into ``json``. */
static void encode_value(writer_t* json, TRITONSERVER_ParameterType type, const void* value) {
  char num[40];
  switch (type) {
    case TRITONSERVER_PARAMETER_STRING: wr_json_str(json, (const char*)value); return;
    case TRITONSERVER_PARAMETER_INT: snprintf(num, sizeof(num), "%" PRId64, *(const int64_t*)value); break;
    case TRITONSERVER_PARAMETER_BOOL: snprintf(num, sizeof(num), "%s", *(const bool*)value ? "true" : "false"); break;
    default: snprintf(num, sizeof(num), "%.17g", *(const double*)value); break;
  }
  wr_text(json, num);
}

/* The request's parameters (its Triton timeout, then the client's custom ones) as a JSON member, if it has any. */
static TRITONSERVER_Error* encode_parameters(writer_t* json, TRITONBACKEND_Request* request) {
  uint64_t timeout_us = 0;
  uint32_t n = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_InferenceRequestTimeoutMicroseconds(request, &timeout_us);
  if (err == NULL) err = TRITONBACKEND_RequestParameterCount(request, &n);
  if (err != NULL || (timeout_us == 0 && n == 0)) return err;
  const char* sep = "";
  wr_text(json, "\"parameters\":{");
  if (timeout_us != 0) {
    char num[48];
    snprintf(num, sizeof(num), "\"timeout\":%" PRIu64, timeout_us);
    wr_text(json, num);
    sep = ",";
  }
  for (uint32_t p = 0; p < n && err == NULL; p++) {
    const char* key = NULL;
    TRITONSERVER_ParameterType type;
    const void* value = NULL;
    err = TRITONBACKEND_RequestParameter(request, p, &key, &type, &value);
    if (err != NULL || type == TRITONSERVER_PARAMETER_BYTES) continue;
    wr_text(json, sep);
    wr_json_str(json, key);
    wr_text(json, ":");
    encode_value(json, type, value);
    sep = ",";
  }
  wr_text(json, "},");
  return err;
}

TRITONSERVER_Error* upstream_encode_call(writer_t* json, writer_t* bin, TRITONBACKEND_Request* request) {
  uint32_t n_in = 0, n_out = 0;
  const char* rid = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInputCount(request, &n_in);
  if (err == NULL) err = TRITONBACKEND_RequestOutputCount(request, &n_out);
  if (err == NULL) err = TRITONBACKEND_RequestId(request, &rid);
  if (err != NULL) return err;
  wr_text(json, "{");
  if (rid != NULL && rid[0] != 0) {
    wr_text(json, "\"id\":");
    wr_json_str(json, rid);
    wr_text(json, ",");
  }
  err = encode_parameters(json, request);
  wr_text(json, "\"inputs\":[");
  for (uint32_t i = 0; i < n_in && err == NULL; i++) err = encode_input(json, bin, request, i);
  wr_text(json, "],\"outputs\":[");
  for (uint32_t o = 0; o < n_out && err == NULL; o++) {
    const char* name = NULL;
    err = TRITONBACKEND_RequestOutputName(request, o, &name);
    wr_text(json, o ? ",{\"name\":" : "{\"name\":");
    wr_json_str(json, name);
    wr_text(json, ",\"parameters\":{\"binary_data\":true}}");
  }
  wr_text(json, "]}");
  return err;
}
