/* poolpipe_front's cancel watcher: a request Triton marks cancelled while the sidecar holds it (the client cancelled,
 * or its gRPC deadline passed) is answered CANCELLED and withdrawn from the sidecar, as Triton's own schedulers drop a
 * cancelled request, so it takes no place in a batch. */
#include "cancel_watch.h"

#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "front_common.h"

#define CANCEL_POLL_MS 50 /* how often pending requests are looked at for a cancellation */

/* The pending requests Triton marked cancelled, withdrawn from their slots (called with the lock held): up to
 * ``cap`` of them into ``out`` with their slots and hand-over times; how many. */
static uint32_t withdraw_cancelled(conn* c, TRITONBACKEND_Request** out, uint32_t* ids, uint64_t* started,
                                   uint32_t cap) {
  uint32_t n = 0;
  for (uint32_t id = 0; id < c->high && n < cap; id++) {
    TRITONBACKEND_Request* r = c->slots[id];
    bool cancelled = false;
    if (r == NULL || r == WITHDRAWN) continue;
    drop(TRITONBACKEND_RequestIsCancelled(r, &cancelled));
    if (!cancelled) continue;
    c->slots[id] = WITHDRAWN;
    out[n] = r, ids[n] = id, started[n] = c->started[id];
    n++;
  }
  return n;
}

/* The cancel watcher thread: every CANCEL_POLL_MS, each cancelled request is answered CANCELLED and a cancel frame
 * tells the sidecar to drop it (it answers that frame unless it had answered the request already). */
void* watch_cancels(void* arg) {
  enum { CAP = 256 };
  conn* c = arg;
  TRITONBACKEND_Request* requests[CAP];
  uint32_t ids[CAP];
  uint64_t started[CAP];
  pthread_mutex_lock(&c->lock);
  while (!c->closing) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += CANCEL_POLL_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L, until.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&c->wake, &c->lock, &until);
    uint32_t n = c->closing ? 0 : withdraw_cancelled(c, requests, ids, started, CAP);
    if (n == 0) continue;
    pthread_mutex_unlock(&c->lock);
    writer_t w = {0};
    for (uint32_t i = 0; i < n; i++) {
      count_request(c->instance, requests[i], 0, started[i]);
      answer_error(requests[i], TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_CANCELLED, "the request was cancelled"));
      size_t start = frame_begin(&w);
      wr_u32(&w, CANCEL_ID);
      wr_u32(&w, ids[i]);
      frame_end(&w, start);
    }
    if (send_frames(c, &w) != 0) shutdown(c->fd, SHUT_RDWR); /* the reader fails what is pending */
    free(w.data);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}
