/* A minimal JSON reader for the emulated backend: Triton hands a model its config as JSON, and the
 * emulated_* parameters are JSON themselves. Reads RFC 8259 text into a tree; no writer. */
#pragma once

#include <stddef.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
  json_type type;
  double number;            /* JSON_NUMBER, JSON_BOOL (0/1) */
  char* string;             /* JSON_STRING: NUL-terminated, escapes resolved */
  size_t count;             /* JSON_ARRAY / JSON_OBJECT: number of items */
  struct json_value* items; /* the items, in order */
  char** keys;              /* JSON_OBJECT: the key of each item */
} json_value;

/* Parse ``len`` bytes of ``text`` into ``out``; 0 on success, else -1 with a message in ``err``. */
int json_parse(const char* text, size_t len, json_value* out, char* err, size_t errlen);

/* The member ``key`` of an object (NULL if absent or not an object). */
const json_value* json_get(const json_value* obj, const char* key);

/* Free what json_parse allocated inside ``v`` (not ``v`` itself). */
void json_free(json_value* v);
