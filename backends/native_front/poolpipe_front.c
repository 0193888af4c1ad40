/* poolpipe_front: Triton's own gRPC/HTTP front end for the sidecar's planned models (``serve --native-grpc-port``).
 *
 * tritonserver receives, decodes and answers KServe v2 requests natively; this backend hands each request to the
 * sidecar's scheduler over a Unix socket (frames.h) and returns, and a reader thread answers each request when the
 * sidecar's answer arrives. The sidecar then spends no CPU on gRPC, HTTP/2 or protobuf for these requests: that is
 * what bounded it (docs/serving.md, "Where a request's time goes"). One socket per model instance, connected at
 * instance start to $POOLPIPE_FRONT_SOCKET; the first frame names the model. A lost sidecar fails every pending
 * and later request with UNAVAILABLE (nothing waits forever) and stops this tritonserver (SIGTERM to itself), so a
 * sidecar that crashed leaves no server holding its ports. A request Triton marks cancelled while the sidecar holds it
 * (the client cancelled, or its gRPC deadline passed) is answered CANCELLED and withdrawn from the sidecar, as
 * Triton's own schedulers drop a cancelled request: it takes no place in a batch. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cancel_watch.h"
#include "frames.h"
#include "front_common.h"
#include "front_conn.h"
#include "passthrough.h"
#include "triton_c.h"

#define EXPORT __attribute__((visibility("default")))

static void fail(TRITONBACKEND_Request* request, TRITONSERVER_Error_Code code, const char* msg) {
  answer_error(request, TRITONSERVER_ErrorNew(code, msg));
}

/* The connection is lost: every pending request gets UNAVAILABLE, later ones too (``dead``). */
static void fail_all(conn* c) {
  pthread_mutex_lock(&c->lock);
  c->dead = 1; /* no slot is taken from now on, so none at or above ``high`` */
  uint32_t high = c->high;
  pthread_mutex_unlock(&c->lock);
  for (uint32_t id = 0; id < high; id++) {
    uint64_t started = 0;
    TRITONBACKEND_Request* r = take(c, id, &started);
    if (r == NULL) continue;
    count_request(c->instance, r, 0, started);
    fail(r, TRITONSERVER_ERROR_UNAVAILABLE, "poolpipe sidecar is gone; retry once it is back");
  }
}

static int read_all(int fd, void* p, size_t n) {
  char* b = p;
  while (n > 0) {
    ssize_t k = read(fd, b, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Build and send the response of one answer frame (after its id) for ``request``; NULL or the error. */
static TRITONSERVER_Error* respond(TRITONBACKEND_Request* request, reader_t* rd) {
  uint32_t code = 0;
  if (rd_u32(rd, &code) != 0) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "poolpipe_front: short frame");
  if (code != 0) {
    char msg[1024];
    if (rd_str(rd, msg, sizeof(msg)) != 0) snprintf(msg, sizeof(msg), "poolpipe sidecar: error %u", code);
    return TRITONSERVER_ErrorNew((TRITONSERVER_Error_Code)code, msg);
  }
  TRITONBACKEND_Response* response = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, request);
  if (err != NULL) return err;
  tensor_frame t;
  uint16_t n_out = 0;
  int bad = rd_u16(rd, &n_out);
  for (uint16_t o = 0; !bad && err == NULL && o < n_out; o++) {
    if ((bad = rd_tensor(rd, &t)) != 0) break;
    err = add_output_bytes(response, t.name, t.dtype, t.shape, t.n_dims, t.data, t.nbytes);
  }
  uint16_t n_par = 0; /* the response's int64 parameters (none in a frame that ends after its outputs) */
  if (err == NULL && !bad && rd->p < rd->end) bad = rd_u16(rd, &n_par);
  for (uint16_t k = 0; !bad && err == NULL && k < n_par; k++) {
    char name[256];
    int64_t value = 0;
    bad = rd_str(rd, name, sizeof(name)) != 0 || rd_take(rd, &value, 8) != 0;
    if (!bad) err = TRITONBACKEND_ResponseSetIntParameter(response, name, value);
  }
  if (err == NULL && bad) err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "poolpipe_front: bad answer frame");
  if (err != NULL) {
    drop(TRITONBACKEND_ResponseDelete(response));
    return err;
  }
  drop(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL));
  return NULL;
}

/* The reader thread: one answer frame at a time until the socket closes. */
static void* read_answers(void* arg) {
  conn* c = arg;
  size_t cap = 1 << 16;
  char* buf = malloc(cap);
  for (;;) {
    uint32_t len = 0;
    if (read_all(c->fd, &len, 4) != 0) break;
    if (len > cap) {
      cap = len;
      buf = realloc(buf, cap);
    }
    if (read_all(c->fd, buf, len) != 0) break;
    reader_t rd = {buf, buf + len};
    uint32_t id = 0;
    if (rd_u32(&rd, &id) != 0) break;
    uint64_t started = 0;
    TRITONBACKEND_Request* request = take(c, id, &started);
    if (request == NULL) continue; /* withdrawn: the sidecar's answer to the cancel frame, or its answer before */
    TRITONSERVER_Error* err = respond(request, &rd);
    count_request(c->instance, request, err == NULL, started);
    if (err != NULL) {
      answer_error(request, err);
    } else {
      drop(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
    }
  }
  free(buf);
  fail_all(c);
  if (!c->closing) { /* the sidecar died: this server goes too, freeing its ports for the sidecar's successor */
    TRITONSERVER_LogMessage(TRITONSERVER_LOG_ERROR, __FILE__, __LINE__,
                            "poolpipe_front: the sidecar closed its socket; stopping this tritonserver");
    kill(getpid(), SIGTERM);
  }
  return NULL;
}

/* A request that names a sequence (Triton's reserved sequence_id, sequence_start, sequence_end): refused, since a
 * planned model is stateless (scheduler/server/front/reserved.py says the same on the sidecar's own ports). */
static TRITONSERVER_Error* refuse_sequence(TRITONBACKEND_Request* request, const char* model) {
  uint64_t correlation = 0;
  uint32_t flags = 0;
  const char* name = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestCorrelationId(request, &correlation);
  if (err != NULL) { /* not an integer: a string sequence_id */
    drop(err);
    name = "sequence_id";
  } else if (correlation != 0) {
    name = "sequence_id";
  } else if ((err = TRITONBACKEND_RequestFlags(request, &flags)) != NULL) {
    return err;
  } else if (flags & 1u) { /* TRITONSERVER_REQUEST_FLAG_SEQUENCE_START */
    name = "sequence_start";
  } else if (flags & 2u) { /* TRITONSERVER_REQUEST_FLAG_SEQUENCE_END */
    name = "sequence_end";
  }
  if (name == NULL) return NULL;
  char msg[512];
  snprintf(msg, sizeof(msg),
           "inference request to model '%s' sets the reserved parameter '%s', but '%s' is a planned model served by "
           "poolpipe and has no sequence batcher: its requests are stateless, so a sequence cannot be kept (send "
           "sequences to a stateful model on the pass-through Triton)",
           model, name, model);
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, msg);
}

/* Append one request's frame (slot, inputs, requested outputs, the client's request id and timeout) to ``w``;
 * NULL or why it cannot be forwarded. */
static TRITONSERVER_Error* encode_request(writer_t* w, TRITONBACKEND_Request* request, uint32_t id,
                                          const char* model) {
  TRITONSERVER_Error* refused = refuse_sequence(request, model);
  if (refused != NULL) return refused;
  size_t start = frame_begin(w);
  wr_u32(w, id);
  uint32_t n_in = 0, n_out = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInputCount(request, &n_in);
  if (err == NULL) err = TRITONBACKEND_RequestOutputCount(request, &n_out);
  if (err != NULL) return err;
  wr_u16(w, (uint16_t)n_in);
  for (uint32_t i = 0; i < n_in; i++) {
    input_info in;
    if ((err = input_info_at(request, i, &in)) != NULL) return err;
    wr_str(w, in.name);
    wr_str(w, TRITONSERVER_DataTypeString(in.dt));
    wr_u16(w, (uint16_t)in.n_dims);
    for (uint32_t d = 0; d < in.n_dims; d++) wr_i64(w, in.shape[d]);
    wr_u64(w, in.bytes);
    if ((err = append_input_bytes(w, in.input, in.n_buf)) != NULL) return err;
  }
  wr_u16(w, (uint16_t)n_out);
  for (uint32_t o = 0; o < n_out; o++) {
    const char* name = NULL;
    err = TRITONBACKEND_RequestOutputName(request, o, &name);
    if (err != NULL) return err;
    wr_str(w, name);
  }
  const char* rid = NULL;
  uint64_t timeout_us = 0;
  err = TRITONBACKEND_RequestId(request, &rid);
  if (err == NULL) err = TRITONBACKEND_InferenceRequestTimeoutMicroseconds(request, &timeout_us);
  if (err != NULL) return err;
  wr_str(w, rid);
  wr_u64(w, timeout_us);
  frame_end(w, start);
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                              TRITONBACKEND_Request** requests, const uint32_t count) {
  void* state = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceState(instance, &state);
  if (err != NULL) return err;
  conn* c = state;
  if (c->up != NULL) { /* pass-through: each request forwarded and answered in turn */
    passthrough_execute(instance, c->up, requests, count);
    return NULL;
  }
  writer_t w = {0};
  uint64_t handed = now_ns();
  for (uint32_t r = 0; r < count; r++) {
    pthread_mutex_lock(&c->lock);
    int dead = c->dead;
    uint32_t id = !dead && c->n_free > 0 ? c->free_ids[--c->n_free] : UINT32_MAX;
    if (id != UINT32_MAX) c->slots[id] = requests[r], c->started[id] = handed;
    if (id != UINT32_MAX && id >= c->high) c->high = id + 1;
    pthread_mutex_unlock(&c->lock);
    if (id == UINT32_MAX) {
      count_request(instance, requests[r], 0, handed);
      fail(requests[r], TRITONSERVER_ERROR_UNAVAILABLE,
           dead ? "poolpipe sidecar is gone; retry once it is back" : "poolpipe_front: too many requests in flight");
      continue;
    }
    size_t mark = w.len;
    err = encode_request(&w, requests[r], id, c->model);
    if (err != NULL) {
      w.len = mark; /* the half-written frame is dropped */
      uint64_t started = 0;
      if (take(c, id, &started) != NULL) {
        count_request(instance, requests[r], 0, started);
        answer_error(requests[r], err);
      } else { /* the connection was lost meanwhile: fail_all answered it */
        drop(err);
      }
    }
  }
  if (w.len > 0 && send_frames(c, &w) != 0) shutdown(c->fd, SHUT_RDWR); /* the reader fails them */
  free(w.data);
  uint64_t done = now_ns(); /* an execution is the hand-over; each request's own time is counted when answered */
  drop(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, handed, handed, done, done));
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  (void)backend;
  uint32_t major = 0, minor = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_ApiVersion(&major, &minor);
  if (err == NULL && major != TRITONBACKEND_API_VERSION_MAJOR) {
    err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "poolpipe_front: backend API major version is not 1");
  }
  return err;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  (void)model;
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  (void)model;
  return NULL;
}

/* Connect to the sidecar and name the model (the hello frame: id HELLO_ID, the model's name). */
static TRITONSERVER_Error* connect_sidecar(conn* c) {
  const char* path = getenv(SOCKET_ENV);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (path == NULL || strlen(path) >= sizeof(addr.sun_path)) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                 "poolpipe_front: $" SOCKET_ENV " must name the sidecar's socket (serve sets it)");
  }
  strcpy(addr.sun_path, path);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr*)&addr, sizeof(addr)) != 0) {
    char msg[512];
    snprintf(msg, sizeof(msg), "poolpipe_front: cannot connect to the sidecar at %s: %s", path, strerror(errno));
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, msg);
  }
  writer_t w = {0};
  size_t start = frame_begin(&w);
  wr_u32(&w, HELLO_ID);
  wr_str(&w, c->model);
  frame_end(&w, start);
  int bad = write_all(c->fd, w.data, w.len);
  free(w.data);
  return bad ? TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, "poolpipe_front: the sidecar closed the socket")
             : NULL;
}

static void free_conn(conn* c) {
  upstream_free(c->up);
  if (c->fd >= 0) close(c->fd);
  free(c->slots);
  free(c->started);
  free(c->free_ids);
  free(c->model);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->wlock);
  pthread_cond_destroy(&c->wake);
  free(c);
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = NULL;
  const char* name = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (err == NULL) err = TRITONBACKEND_ModelName(model, &name);
  if (err != NULL) return err;
  conn* c = calloc(1, sizeof(conn));
  c->fd = -1;
  c->model = strdup(name);
  c->instance = instance;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->wlock, NULL);
  pthread_cond_init(&c->wake, NULL);
  err = passthrough_of(model, name, &c->up);
  if (err == NULL && c->up != NULL) return TRITONBACKEND_ModelInstanceSetState(instance, c); /* no slots, no socket */
  if (err == NULL) {
    c->slots = calloc(MAX_PENDING, sizeof(TRITONBACKEND_Request*));
    c->started = calloc(MAX_PENDING, sizeof(uint64_t));
    c->free_ids = malloc(MAX_PENDING * sizeof(uint32_t));
    for (uint32_t i = 0; i < MAX_PENDING; i++) c->free_ids[i] = MAX_PENDING - 1 - i;
    c->n_free = MAX_PENDING;
    err = connect_sidecar(c);
  }
  if (err == NULL && pthread_create(&c->reader, NULL, read_answers, c) != 0) {
    err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "poolpipe_front: cannot start the reader thread");
  }
  if (err != NULL) {
    free_conn(c);
    return err;
  }
  c->reader_started = 1;
  if (pthread_create(&c->watcher, NULL, watch_cancels, c) == 0) c->watcher_started = 1;
  return TRITONBACKEND_ModelInstanceSetState(instance, c);
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = NULL;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceState(instance, &state);
  conn* c = state;
  if (c == NULL) return err;
  pthread_mutex_lock(&c->lock);
  c->closing = 1;
  pthread_cond_signal(&c->wake);
  pthread_mutex_unlock(&c->lock);
  if (c->watcher_started) pthread_join(c->watcher, NULL);
  if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR); /* the reader sees the end, fails what is pending and exits */
  if (c->reader_started) pthread_join(c->reader, NULL);
  free_conn(c);
  return err;
}
