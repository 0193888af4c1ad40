/* The KServe v2 HTTP infer call a pass-through request becomes (upstream_call.c). */
#pragma once

#include "frames.h"
#include "triton_c.h"

/* The call's JSON header into ``json`` and its binary tensors into ``bin``: the client's id, its timeout and custom
 * parameters, every input as binary data, every requested output asked for as binary data. */
TRITONSERVER_Error* upstream_encode_call(writer_t* json, writer_t* bin, TRITONBACKEND_Request* request);
