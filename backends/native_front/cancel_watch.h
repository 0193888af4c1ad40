/* poolpipe_front's cancel watcher thread (cancel_watch.c). */
#pragma once

#include "front_conn.h"

/* Runs until ``arg`` (a conn*) is closing; signal its ``wake`` after setting ``closing``, then join. */
void* watch_cancels(void* arg);
