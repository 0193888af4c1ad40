/* One poolpipe_front model instance's connection to the sidecar (poolpipe_front.c) and what its threads share: the
 * slots of the requests the sidecar holds, and the socket's writes. */
#pragma once

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "frames.h"
#include "passthrough.h"
#include "triton_c.h"

#define MAX_PENDING 65536 /* requests in flight per instance; beyond it a request is refused (UNAVAILABLE) */
/* A slot whose request was answered CANCELLED and withdrawn: it stays taken until the sidecar's one frame for it
 * (a value no request has; never dereferenced) */
#define WITHDRAWN ((TRITONBACKEND_Request*)(uintptr_t)1)

typedef struct {
  char* model;
  int fd;
  pthread_mutex_t lock; /* slots, free list, high, dead, closing */
  pthread_mutex_t wlock; /* writes to the socket (the executing thread's and the cancel watcher's) */
  pthread_cond_t wake;  /* the cancel watcher's: closing */
  TRITONBACKEND_Request** slots;
  uint32_t* free_ids;
  uint32_t n_free;
  uint32_t high; /* no slot at or above it was ever taken */
  int dead;
  pthread_t reader, watcher;
  int reader_started, watcher_started;
  volatile int closing; /* the instance is finalizing: the socket's end is ours, not the sidecar's */
  upstream* up;         /* a pass-through model (passthrough.c): no socket, no reader */
  TRITONBACKEND_ModelInstance* instance;
  uint64_t* started; /* per slot: when the request was handed over (its statistics) */
} conn;

/* The request in slot ``id``, taken out (NULL if none or withdrawn), and when it was handed over. */
static inline TRITONBACKEND_Request* take(conn* c, uint32_t id, uint64_t* started) {
  TRITONBACKEND_Request* r = NULL;
  pthread_mutex_lock(&c->lock);
  if (id < MAX_PENDING && c->slots[id] != NULL) {
    r = c->slots[id];
    *started = c->started[id];
    c->slots[id] = NULL;
    c->free_ids[c->n_free++] = id;
  }
  pthread_mutex_unlock(&c->lock);
  return r == WITHDRAWN ? NULL : r;
}

static inline int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* ``w``'s frames onto the socket, whole (the executing thread and the cancel watcher both write); 0 or -1. */
static inline int send_frames(conn* c, const writer_t* w) {
  pthread_mutex_lock(&c->wlock);
  int bad = write_all(c->fd, w->data, w->len);
  pthread_mutex_unlock(&c->wlock);
  return bad;
}
