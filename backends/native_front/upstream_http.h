/* poolpipe_front's pass-through mode (upstream_http.c): forward a request to a Triton's KServe v2 HTTP endpoint and
 * answer it with what that Triton answered. One kept-open connection per model instance. */
#pragma once

#include <stddef.h>

#include "triton_c.h"

#define UPSTREAM_PARAMETER "poolpipe_upstream" /* config parameter: HOST:PORT of the pass-through Triton's HTTP */

typedef struct upstream upstream;

/* The forwarder of ``model`` to ``address`` (HOST:PORT; [v6]:PORT); NULL with a message in ``err`` if malformed. */
upstream* upstream_new(const char* address, const char* model, char* err, size_t errlen);
void upstream_free(upstream* u);

/* Forward ``request`` and send its response: NULL when the response was sent (the caller releases the request),
 * else the error to answer it with (nothing was sent). */
TRITONSERVER_Error* upstream_forward(upstream* u, TRITONBACKEND_Request* request);
