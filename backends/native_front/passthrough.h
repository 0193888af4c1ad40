/* The pass-through Triton's models in poolpipe_front (passthrough.c; the HTTP forwarding: upstream_http.c). */
#pragma once

#include "upstream_http.h"

/* The forwarder ``model``'s config names (parameter UPSTREAM_PARAMETER) into ``*up``; NULL stays there for the
 * sidecar's planned models. */
TRITONSERVER_Error* passthrough_of(TRITONBACKEND_Model* model, const char* name, upstream** up);

/* Forward each request in turn, answer it and count it in the model's statistics. */
void passthrough_execute(TRITONBACKEND_ModelInstance* instance, upstream* up, TRITONBACKEND_Request** requests,
                         uint32_t count);
