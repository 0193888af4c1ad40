/* poolpipe_front's pass-through mode: a front model whose config names ``poolpipe_upstream`` (HOST:PORT of the
 * pass-through Triton's HTTP endpoint; serve --passthrough-http) forwards each request there as a KServe v2 HTTP
 * infer call with binary tensors, on one kept-open connection per model instance, and answers it with what that
 * Triton answered (its error message and code too). No Python is on this path, so a pass-through request costs one
 * extra Triton hop, not a Python gRPC proxy's. Requests run one at a time per instance: the front's config gives
 * each pass-through model several instances. */
#define _GNU_SOURCE /* memmem */
#include "upstream_http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "frames.h"
#include "front_common.h"
#include "json_min.h"
#include "upstream_call.h"

#define MAX_HEAD (64 * 1024)
#define MAX_BODY ((size_t)1 << 31) /* an answer with a larger Content-Length is refused */
#define WAIT_SLICE_MS 50            /* how often a wait looks whether the client cancelled the request */
#define DIAL_TIMEOUT_MS 5000        /* a pass-through Triton that accepts no connection this long is unreachable */

/* What the transport's steps return besides 0: the connection ended (a kept-open one closed meanwhile: worth one
 * retry), failed or made no sense, or the client cancelled the request (its gRPC deadline passed, or it cancelled). */
enum { ENDED = -1, FAILED = -2, CANCELLED = -3 };

struct upstream {
  char host[256];
  char port[16];
  char* path; /* /v2/models/<model, percent-encoded>/infer */
  int fd;     /* the kept-open connection, -1 when none */
};

static TRITONSERVER_Error* fail_with(TRITONSERVER_Error_Code code, const char* fmt, const char* a, const char* b) {
  char msg[1024];
  snprintf(msg, sizeof(msg), fmt, a, b);
  return TRITONSERVER_ErrorNew(code, msg);
}

upstream* upstream_new(const char* address, const char* model, char* err, size_t errlen) {
  const char* colon = strrchr(address, ':');
  const char* host = address;
  size_t host_len = colon ? (size_t)(colon - address) : 0;
  if (host_len > 1 && host[0] == '[' && host[host_len - 1] == ']') host++, host_len -= 2;
  if (colon == NULL || host_len == 0 || host_len >= 256 || strlen(colon + 1) == 0 || strlen(colon + 1) >= 16) {
    snprintf(err, errlen, "poolpipe_front: %s must be HOST:PORT, got '%s'", UPSTREAM_PARAMETER, address);
    return NULL;
  }
  upstream* u = calloc(1, sizeof(upstream));
  memcpy(u->host, host, host_len);
  strcpy(u->port, colon + 1);
  u->fd = -1;
  writer_t p = {0};
  wr_bytes(&p, "/v2/models/", 11);
  for (const unsigned char* s = (const unsigned char*)model; *s; s++) {
    char esc[4];
    int plain = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
                strchr("-._~", *s) != NULL;
    snprintf(esc, sizeof(esc), plain ? "%c" : "%%%02X", *s);
    wr_bytes(&p, esc, strlen(esc));
  }
  wr_bytes(&p, "/infer", 7); /* with the NUL */
  u->path = p.data;
  return u;
}

static void hang_up(upstream* u) {
  if (u->fd >= 0) close(u->fd);
  u->fd = -1;
}

void upstream_free(upstream* u) {
  if (u == NULL) return;
  hang_up(u);
  free(u->path);
  free(u);
}

static int cancelled(TRITONBACKEND_Request* request) {
  bool c = false;
  drop(TRITONBACKEND_RequestIsCancelled(request, &c));
  return c;
}

/* Wait until ``fd`` is ready for ``events`` (at most ``limit_ms``; -1: no limit): 0, FAILED, or CANCELLED when the
 * client cancelled ``request`` meanwhile (so a hung pass-through Triton holds no instance past its client). */
static int wait_ready(int fd, short events, TRITONBACKEND_Request* request, int limit_ms) {
  struct pollfd p = {.fd = fd, .events = events};
  for (int waited = 0; limit_ms < 0 || waited < limit_ms; waited += WAIT_SLICE_MS) {
    int k = poll(&p, 1, WAIT_SLICE_MS);
    if (k > 0) return 0; /* ready, or hung up: the read or write says which */
    if (k < 0 && errno != EINTR) return FAILED;
    if (cancelled(request)) return CANCELLED;
  }
  return FAILED;
}

/* Connect (non-blocking, as every later step is) to the first of the host's addresses that answers: 0, FAILED,
 * or CANCELLED. */
static int dial(upstream* u, TRITONBACKEND_Request* request) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(u->host, u->port, &hints, &res) != 0) return FAILED;
  int fd = -1, rc = FAILED;
  for (struct addrinfo* a = res; a != NULL && fd < 0 && rc != CANCELLED; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      rc = 0;
    } else {
      rc = errno == EINPROGRESS ? wait_ready(fd, POLLOUT, request, DIAL_TIMEOUT_MS) : FAILED;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0)) rc = FAILED;
    if (rc != 0) close(fd), fd = -1;
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  u->fd = fd;
  return fd >= 0 ? 0 : rc;
}

static int send_all(int fd, struct iovec* iov, int n, TRITONBACKEND_Request* request) {
  while (n > 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_ready(fd, POLLOUT, request, -1);
      if (rc != 0) return rc;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return ENDED;
    while (n > 0 && (size_t)k >= iov->iov_len) k -= (ssize_t)iov->iov_len, iov++, n--;
    if (n > 0) iov->iov_base = (char*)iov->iov_base + k, iov->iov_len -= (size_t)k;
  }
  return 0;
}

/* Read into ``b`` until it holds ``want`` bytes: 0, ENDED (the connection ended or failed first), or CANCELLED. */
static int fill(int fd, writer_t* b, size_t want, TRITONBACKEND_Request* request) {
  if (want > b->cap) { /* room for more than asked: a head arrives with (part of) its body */
    size_t cap = want > 2 * b->cap ? (want > 65536 ? want : 65536) : 2 * b->cap;
    char* grown = realloc(b->data, cap);
    if (grown == NULL) return ENDED;
    b->data = grown, b->cap = cap;
  }
  while (b->len < want) {
    ssize_t k = recv(fd, b->data + b->len, b->cap - b->len, 0);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_ready(fd, POLLIN, request, -1);
      if (rc != 0) return rc == CANCELLED ? CANCELLED : ENDED;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return ENDED;
    b->len += (size_t)k;
  }
  return 0;
}

typedef struct {
  int status;
  size_t head_len, content_length, json_length; /* json_length: Inference-Header-Content-Length or the body */
  int has_length, chunked, close_after;
} http_head;

/* The value of header ``name`` (with its colon) on ``line``, else NULL. */
static const char* header_value(const char* line, const char* name) {
  size_t n = strlen(name);
  if (strncasecmp(line, name, n) != 0) return NULL;
  for (line += n; *line == ' ' || *line == '\t';) line++;
  return line;
}

static int parse_head(char* head, http_head* h) {
  if (sscanf(head, "HTTP/1.%*d %d", &h->status) != 1) return -1;
  h->json_length = (size_t)-1;
  for (char* line = strstr(head, "\r\n"); line != NULL; line = strstr(line, "\r\n")) {
    line += 2;
    const char* v;
    if ((v = header_value(line, "content-length:")) != NULL) {
      h->content_length = strtoull(v, NULL, 10), h->has_length = 1;
    } else if ((v = header_value(line, "inference-header-content-length:")) != NULL) {
      h->json_length = strtoull(v, NULL, 10);
    } else if ((v = header_value(line, "transfer-encoding:")) != NULL) {
      h->chunked = strncasecmp(v, "chunked", 7) == 0;
    } else if ((v = header_value(line, "connection:")) != NULL) {
      h->close_after = strncasecmp(v, "close", 5) == 0;
    }
  }
  if (h->json_length == (size_t)-1) h->json_length = h->content_length;
  return 0;
}

/* Read one response's head and body into ``b``: 0; ENDED before a byte (a kept-open connection the server closed
 * meanwhile: worth one retry); FAILED (it ended or made no sense after that); CANCELLED. */
static int read_response(int fd, writer_t* b, http_head* h, TRITONBACKEND_Request* request) {
  char* end = NULL;
  b->len = 0;
  while (end == NULL) {
    size_t had = b->len;
    int rc = b->len >= MAX_HEAD ? FAILED : fill(fd, b, b->len + 1, request);
    if (rc == CANCELLED) return CANCELLED;
    if (rc != 0) return had == 0 ? ENDED : FAILED;
    end = memmem(b->data + (had > 3 ? had - 3 : 0), b->len - (had > 3 ? had - 3 : 0), "\r\n\r\n", 4);
  }
  h->head_len = (size_t)(end - b->data) + 4;
  char saved = b->data[h->head_len - 1];
  b->data[h->head_len - 1] = 0;
  int bad = parse_head(b->data, h);
  b->data[h->head_len - 1] = saved;
  if (bad || h->chunked || !h->has_length) return FAILED;
  if (h->content_length > MAX_BODY || h->json_length > h->content_length) return FAILED;
  int rc = fill(fd, b, h->head_len + h->content_length, request);
  return rc == 0 || rc == CANCELLED ? rc : FAILED;
}

static TRITONSERVER_Error_Code code_of_status(int status) {
  switch (status) {
    case 400: return TRITONSERVER_ERROR_INVALID_ARG;
    case 404: return TRITONSERVER_ERROR_NOT_FOUND;
    case 409: return TRITONSERVER_ERROR_ALREADY_EXISTS;
    case 499: return TRITONSERVER_ERROR_CANCELLED;
    case 501: return TRITONSERVER_ERROR_UNSUPPORTED;
    case 502: case 503: case 504: return TRITONSERVER_ERROR_UNAVAILABLE;
    default: return TRITONSERVER_ERROR_INTERNAL;
  }
}

/* One output of the answer (``o``: its JSON entry; ``*data``: its bytes, advanced) into ``response``. */
static TRITONSERVER_Error* add_output(TRITONBACKEND_Response* response, const json_value* o, const char** data,
                                      const char* end) {
  const json_value* name = json_get(o, "name");
  const json_value* dtype = json_get(o, "datatype");
  const json_value* shape = json_get(o, "shape");
  const json_value* size = json_get(json_get(o, "parameters"), "binary_data_size");
  if (name == NULL || name->type != JSON_STRING || dtype == NULL || dtype->type != JSON_STRING || shape == NULL ||
      shape->type != JSON_ARRAY || shape->count > MAX_FRAME_DIMS || size == NULL || size->type != JSON_NUMBER ||
      size->number < 0 || size->number > (double)(end - *data)) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "poolpipe_front: the pass-through Triton's answer has "
                                                              "an output without binary data or its bytes");
  }
  int64_t dims[MAX_FRAME_DIMS];
  for (size_t d = 0; d < shape->count; d++) dims[d] = (int64_t)shape->items[d].number;
  size_t nbytes = (size_t)size->number;
  TRITONSERVER_Error* err = add_output_bytes(response, name->string, dtype->string, dims, (uint32_t)shape->count,
                                             *data, nbytes);
  *data += nbytes;
  return err;
}

/* The response ``request`` gets from the answer in ``b``: sent (NULL), or the error to answer with. */
static TRITONSERVER_Error* answer(TRITONBACKEND_Request* request, const writer_t* b, const http_head* h) {
  const char* body = b->data + h->head_len;
  json_value doc;
  char jerr[128];
  if (json_parse(body, h->json_length, &doc, jerr, sizeof(jerr)) != 0) {
    return fail_with(TRITONSERVER_ERROR_INTERNAL, "poolpipe_front: the pass-through Triton's answer is not %s: %s",
                     "KServe v2 JSON", jerr);
  }
  TRITONSERVER_Error* err = NULL;
  const json_value* outputs = json_get(&doc, "outputs");
  if (h->status != 200) {
    const json_value* msg = json_get(&doc, "error");
    err = fail_with(code_of_status(h->status), "%s%s", msg && msg->type == JSON_STRING ? msg->string : "",
                    msg && msg->type == JSON_STRING ? "" : "the pass-through Triton answered an HTTP error");
  } else if (outputs == NULL || outputs->type != JSON_ARRAY) {
    err = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "poolpipe_front: the pass-through Triton's answer "
                                                             "has no outputs");
  }
  TRITONBACKEND_Response* response = NULL;
  if (err == NULL) err = TRITONBACKEND_ResponseNew(&response, request);
  const char* data = body + h->json_length;
  for (size_t o = 0; err == NULL && o < outputs->count; o++) {
    err = add_output(response, &outputs->items[o], &data, body + h->content_length);
  }
  json_free(&doc);
  if (err != NULL) {
    if (response != NULL) drop(TRITONBACKEND_ResponseDelete(response));
    return err;
  }
  drop(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, NULL));
  return NULL;
}

/* Send the call and read its answer: 0, ENDED (a kept-open connection found closed: retry), FAILED, CANCELLED. */
static int exchange(upstream* u, struct iovec* iov, int n, writer_t* b, http_head* h, TRITONBACKEND_Request* request) {
  struct iovec copy[3];
  memcpy(copy, iov, sizeof(struct iovec) * (size_t)n);
  int rc = send_all(u->fd, copy, n, request);
  if (rc != 0) return rc;
  memset(h, 0, sizeof(*h));
  return read_response(u->fd, b, h, request);
}

/* The error of a call that failed: ``why``, naming the pass-through Triton. */
static TRITONSERVER_Error* failed(const upstream* u, TRITONSERVER_Error_Code code, const char* why) {
  char address[300];
  snprintf(address, sizeof(address), "%s:%s", u->host, u->port);
  return fail_with(code, "poolpipe_front: the pass-through Triton at %s %s", address, why);
}

/* Send the call (``n`` buffers) on the kept-open connection or a new one, and read the answer into ``b``: NULL, or
 * why it failed (the connection is hung up then: a late answer on it would be taken for the next request's). */
static TRITONSERVER_Error* call(upstream* u, struct iovec* iov, int n, writer_t* b, http_head* h,
                                TRITONBACKEND_Request* request) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int reused = u->fd >= 0;
    int rc = reused ? 0 : dial(u, request);
    if (rc == FAILED) return failed(u, TRITONSERVER_ERROR_UNAVAILABLE, "cannot be reached");
    if (rc == 0) rc = exchange(u, iov, n, b, h, request);
    if (rc == 0) return NULL;
    hang_up(u);
    if (rc == CANCELLED) {
      return failed(u, TRITONSERVER_ERROR_CANCELLED, "was still being waited for when the client cancelled the "
                                                     "request");
    }
    if (rc == FAILED) return failed(u, TRITONSERVER_ERROR_UNAVAILABLE, "answered no valid HTTP response");
    if (!reused) break; /* only a kept-open connection closed before answering is tried once more, on a new one */
  }
  return failed(u, TRITONSERVER_ERROR_UNAVAILABLE, "closed the connection");
}

TRITONSERVER_Error* upstream_forward(upstream* u, TRITONBACKEND_Request* request) {
  writer_t json = {0}, bin = {0}, b = {0};
  TRITONSERVER_Error* err = upstream_encode_call(&json, &bin, request);
  char head[512 + 256 + 16];
  http_head h = {0};
  if (err == NULL) {
    snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/octet-stream\r\n"
             "Inference-Header-Content-Length: %zu\r\nContent-Length: %zu\r\n\r\n", u->path, u->host, u->port,
             json.len, json.len + bin.len);
    struct iovec iov[3] = {{head, strlen(head)}, {json.data, json.len}, {bin.data, bin.len}};
    err = call(u, iov, bin.len ? 3 : 2, &b, &h, request);
  }
  if (err == NULL) {
    err = answer(request, &b, &h);
    if (h.close_after) hang_up(u);
  }
  free(json.data);
  free(bin.data);
  free(b.data);
  return err;
}
