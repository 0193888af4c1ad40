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

#define MAX_HEAD (64 * 1024)
#define MAX_BODY ((size_t)1 << 31) /* an answer with a larger Content-Length is refused */

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

static int dial(upstream* u) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(u->host, u->port, &hints, &res) != 0) return -1;
  int fd = -1;
  for (struct addrinfo* a = res; a != NULL && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  u->fd = fd;
  return fd;
}

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
  TRITONBACKEND_Input* input = NULL;
  const char* name = NULL;
  TRITONSERVER_DataType dt;
  const int64_t* shape = NULL;
  uint32_t n_dims = 0, n_buf = 0;
  uint64_t bytes = 0;
  char num[32];
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInputByIndex(request, i, &input);
  if (err == NULL) err = TRITONBACKEND_InputProperties(input, &name, &dt, &shape, &n_dims, &bytes, &n_buf);
  if (err != NULL) return err;
  wr_text(json, i ? ",{\"name\":" : "{\"name\":");
  wr_json_str(json, name);
  wr_text(json, ",\"datatype\":");
  wr_json_str(json, TRITONSERVER_DataTypeString(dt));
  wr_text(json, ",\"shape\":[");
  for (uint32_t d = 0; d < n_dims; d++) {
    snprintf(num, sizeof(num), d ? ",%lld" : "%lld", (long long)shape[d]);
    wr_text(json, num);
  }
  snprintf(num, sizeof(num), "%llu", (unsigned long long)bytes);
  wr_text(json, "],\"parameters\":{\"binary_data_size\":");
  wr_text(json, num);
  wr_text(json, "}}");
  return append_input_bytes(bin, input, n_buf);
}

/* The infer call's JSON header (the client's id, every input as binary, every requested output as binary). */
static TRITONSERVER_Error* encode_call(writer_t* json, writer_t* bin, TRITONBACKEND_Request* request) {
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

static int send_all(int fd, struct iovec* iov, int n) {
  while (n > 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    while (n > 0 && (size_t)k >= iov->iov_len) k -= (ssize_t)iov->iov_len, iov++, n--;
    if (n > 0) iov->iov_base = (char*)iov->iov_base + k, iov->iov_len -= (size_t)k;
  }
  return 0;
}

/* Read into ``b`` until it holds ``want`` bytes; 0, or -1 when the connection ended or failed first. */
static int fill(int fd, writer_t* b, size_t want) {
  if (want > b->cap) { /* room for more than asked: a head arrives with (part of) its body */
    size_t cap = want > 2 * b->cap ? (want > 65536 ? want : 65536) : 2 * b->cap;
    char* grown = realloc(b->data, cap);
    if (grown == NULL) return -1;
    b->data = grown, b->cap = cap;
  }
  while (b->len < want) {
    ssize_t k = recv(fd, b->data + b->len, b->cap - b->len, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
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

/* Read one response's head and body into ``b``: 0; -1 the connection ended before a byte (a kept-open connection the
 * server closed meanwhile: worth one retry); -2 it failed or made no sense after that. */
static int read_response(int fd, writer_t* b, http_head* h) {
  char* end = NULL;
  b->len = 0;
  while (end == NULL) {
    size_t had = b->len;
    if (b->len >= MAX_HEAD || fill(fd, b, b->len + 1) != 0) return had == 0 ? -1 : -2;
    end = memmem(b->data + (had > 3 ? had - 3 : 0), b->len - (had > 3 ? had - 3 : 0), "\r\n\r\n", 4);
  }
  h->head_len = (size_t)(end - b->data) + 4;
  char saved = b->data[h->head_len - 1];
  b->data[h->head_len - 1] = 0;
  int bad = parse_head(b->data, h);
  b->data[h->head_len - 1] = saved;
  if (bad || h->chunked || !h->has_length) return -2;
  if (h->content_length > MAX_BODY || h->json_length > h->content_length) return -2;
  return fill(fd, b, h->head_len + h->content_length) == 0 ? 0 : -2;
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

/* Send the call and read its answer: 0, -1 (a kept-open connection found closed: retry), -2 (failed). */
static int exchange(upstream* u, struct iovec* iov, int n, writer_t* b, http_head* h) {
  struct iovec copy[3];
  memcpy(copy, iov, sizeof(struct iovec) * (size_t)n);
  if (send_all(u->fd, copy, n) != 0) return -1;
  memset(h, 0, sizeof(*h));
  return read_response(u->fd, b, h);
}

TRITONSERVER_Error* upstream_forward(upstream* u, TRITONBACKEND_Request* request) {
  writer_t json = {0}, bin = {0}, b = {0};
  TRITONSERVER_Error* err = encode_call(&json, &bin, request);
  char head[512 + 256 + 16];
  http_head h = {0};
  if (err == NULL) {
    snprintf(head, sizeof(head), "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/octet-stream\r\n"
             "Inference-Header-Content-Length: %zu\r\nContent-Length: %zu\r\n\r\n", u->path, u->host, u->port,
             json.len, json.len + bin.len);
    struct iovec iov[3] = {{head, strlen(head)}, {json.data, json.len}, {bin.data, bin.len}};
    const char* why = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
      int reused = u->fd >= 0;
      if (!reused && dial(u) < 0) {
        why = "cannot be reached";
        break;
      }
      int rc = exchange(u, iov, bin.len ? 3 : 2, &b, &h);
      if (rc == 0) {
        why = NULL;
        break;
      }
      hang_up(u);
      why = rc == -1 ? "closed the connection" : "answered no valid HTTP response";
      if (rc == -2 || !reused) break; /* only a kept-open connection closed before answering is retried */
    }
    if (why != NULL) {
      char address[300];
      snprintf(address, sizeof(address), "%s:%s", u->host, u->port);
      err = fail_with(TRITONSERVER_ERROR_UNAVAILABLE, "poolpipe_front: the pass-through Triton at %s %s", address, why);
    }
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
