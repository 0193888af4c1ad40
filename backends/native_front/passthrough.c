/* poolpipe_front's pass-through models (serve --passthrough-http): which models are (their config's
 * ``poolpipe_upstream``), and their execute: each request forwarded (upstream_http.c), answered and counted. */
#include "passthrough.h"

#include <stdlib.h>

#include "front_common.h"
#include "json_min.h"

TRITONSERVER_Error* passthrough_of(TRITONBACKEND_Model* model, const char* name, upstream** up) {
  TRITONSERVER_Message* message = NULL;
  const char* text = NULL;
  size_t len = 0;
  json_value config;
  char why[512];
  TRITONSERVER_Error* err = TRITONBACKEND_ModelConfig(model, 1, &message);
  if (err == NULL) err = TRITONSERVER_MessageSerializeToJson(message, &text, &len);
  if (err == NULL && json_parse(text, len, &config, why, sizeof(why)) == 0) {
    const json_value* v = json_get(json_get(json_get(&config, "parameters"), UPSTREAM_PARAMETER), "string_value");
    if (v != NULL && v->type == JSON_STRING && (*up = upstream_new(v->string, name, why, sizeof(why))) == NULL) {
      err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, why);
    }
    json_free(&config);
  } else if (err == NULL) {
    err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "poolpipe_front: the model config is not JSON");
  }
  if (message != NULL) drop(TRITONSERVER_MessageDelete(message));
  return err;
}

void passthrough_execute(TRITONBACKEND_ModelInstance* instance, upstream* up, TRITONBACKEND_Request** requests,
                         uint32_t count) {
  uint64_t first = now_ns();
  for (uint32_t r = 0; r < count; r++) {
    uint64_t start = now_ns();
    TRITONSERVER_Error* err = upstream_forward(up, requests[r]);
    count_request(instance, requests[r], err == NULL, start);
    if (err != NULL) {
      answer_error(requests[r], err);
    } else {
      drop(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
    }
  }
  uint64_t last = now_ns();
  drop(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, first, first, last, last));
}
