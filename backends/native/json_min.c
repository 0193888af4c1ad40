/* A minimal JSON reader (see json_min.h): recursive descent, depth-limited, \uXXXX kept as UTF-8. */
#include "json_min.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
  const char* p;
  const char* end;
  char* err;
  size_t errlen;
} reader;

static int fail(reader* r, const char* what) {
  if (r->err != NULL && r->errlen > 0 && r->err[0] == '\0') {
    snprintf(r->err, r->errlen, "%s", what);
  }
  return -1;
}

static void skip_ws(reader* r) {
  while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int parse_value(reader* r, json_value* out, int depth);

static void put_utf8(char* buf, size_t* n, unsigned cp) {
  if (cp < 0x80) {
    buf[(*n)++] = (char)cp;
  } else if (cp < 0x800) {
    buf[(*n)++] = (char)(0xC0 | (cp >> 6));
    buf[(*n)++] = (char)(0x80 | (cp & 0x3F));
  } else {
    buf[(*n)++] = (char)(0xE0 | (cp >> 12));
    buf[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    buf[(*n)++] = (char)(0x80 | (cp & 0x3F));
  }
}

static int parse_string(reader* r, char** out) {
  r->p++; /* the opening quote */
  char* buf = malloc((size_t)(r->end - r->p) * 2 + 1);
  if (buf == NULL) return fail(r, "out of memory");
  size_t n = 0;
  while (r->p < r->end && *r->p != '"') {
    char c = *r->p++;
    if (c != '\\') {
      buf[n++] = c;
      continue;
    }
    if (r->p >= r->end) break;
    char e = *r->p++;
    switch (e) {
      case 'b': buf[n++] = '\b'; break;
      case 'f': buf[n++] = '\f'; break;
      case 'n': buf[n++] = '\n'; break;
      case 'r': buf[n++] = '\r'; break;
      case 't': buf[n++] = '\t'; break;
      case 'u': {
        unsigned cp = 0;
        if (r->end - r->p < 4 || sscanf(r->p, "%4x", &cp) != 1) {
          free(buf);
          return fail(r, "bad \\u escape in a JSON string");
        }
        r->p += 4;
        put_utf8(buf, &n, cp);
        break;
      }
      default: buf[n++] = e; /* \" \\ \/ */
    }
  }
  if (r->p >= r->end) {
    free(buf);
    return fail(r, "unterminated JSON string");
  }
  r->p++; /* the closing quote */
  buf[n] = '\0';
  *out = buf;
  return 0;
}

static int push(json_value* v, size_t* cap, char* key, reader* r) {
  if (v->count == *cap) {
    *cap = *cap ? *cap * 2 : 4;
    json_value* items = realloc(v->items, *cap * sizeof(json_value));
    if (items == NULL) return fail(r, "out of memory");
    v->items = items;
    if (v->type == JSON_OBJECT) {
      char** keys = realloc(v->keys, *cap * sizeof(char*));
      if (keys == NULL) return fail(r, "out of memory");
      v->keys = keys;
    }
  }
  memset(&v->items[v->count], 0, sizeof(json_value));
  if (v->type == JSON_OBJECT) v->keys[v->count] = key;
  v->count++;
  return 0;
}

static int parse_container(reader* r, json_value* out, int depth) {
  char close = *r->p == '[' ? ']' : '}';
  out->type = close == ']' ? JSON_ARRAY : JSON_OBJECT;
  r->p++;
  size_t cap = 0;
  skip_ws(r);
  if (r->p < r->end && *r->p == close) {
    r->p++;
    return 0;
  }
  for (;;) {
    char* key = NULL;
    skip_ws(r);
    if (out->type == JSON_OBJECT) {
      if (r->p >= r->end || *r->p != '"') return fail(r, "expected a JSON object key");
      if (parse_string(r, &key) != 0) return -1;
      skip_ws(r);
      if (r->p >= r->end || *r->p != ':') {
        free(key);
        return fail(r, "expected ':' in a JSON object");
      }
      r->p++;
    }
    if (push(out, &cap, key, r) != 0) {
      free(key);
      return -1;
    }
    if (parse_value(r, &out->items[out->count - 1], depth + 1) != 0) return -1;
    skip_ws(r);
    if (r->p < r->end && *r->p == ',') {
      r->p++;
      continue;
    }
    if (r->p < r->end && *r->p == close) {
      r->p++;
      return 0;
    }
    return fail(r, "expected ',' or the end of a JSON array/object");
  }
}

static int parse_value(reader* r, json_value* out, int depth) {
  if (depth > MAX_DEPTH) return fail(r, "JSON nested too deeply");
  skip_ws(r);
  if (r->p >= r->end) return fail(r, "unexpected end of JSON");
  char c = *r->p;
  if (c == '{' || c == '[') return parse_container(r, out, depth);
  if (c == '"') {
    out->type = JSON_STRING;
    return parse_string(r, &out->string);
  }
  static const struct { const char* word; json_type type; double value; } words[] = {
      {"true", JSON_BOOL, 1}, {"false", JSON_BOOL, 0}, {"null", JSON_NULL, 0}};
  for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
    size_t n = strlen(words[i].word);
    if ((size_t)(r->end - r->p) >= n && strncmp(r->p, words[i].word, n) == 0) {
      out->type = words[i].type;
      out->number = words[i].value;
      r->p += n;
      return 0;
    }
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    char tmp[64];
    size_t n = 0;
    while (r->p + n < r->end && n < sizeof(tmp) - 1 && strchr("+-.eE0123456789", r->p[n]) != NULL) n++;
    memcpy(tmp, r->p, n);
    tmp[n] = '\0';
    char* stop = NULL;
    out->type = JSON_NUMBER;
    out->number = strtod(tmp, &stop);
    if (stop != tmp + n) return fail(r, "bad JSON number");
    r->p += n;
    return 0;
  }
  return fail(r, "unexpected character in JSON");
}

int json_parse(const char* text, size_t len, json_value* out, char* err, size_t errlen) {
  reader r = {text, text + len, err, errlen};
  if (err != NULL && errlen > 0) err[0] = '\0';
  memset(out, 0, sizeof(*out));
  if (parse_value(&r, out, 0) != 0) {
    json_free(out);
    return -1;
  }
  skip_ws(&r);
  if (r.p != r.end) {
    json_free(out);
    return fail(&r, "trailing characters after JSON");
  }
  return 0;
}

const json_value* json_get(const json_value* obj, const char* key) {
  if (obj == NULL || obj->type != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->count; i++) {
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  }
  return NULL;
}

void json_free(json_value* v) {
  for (size_t i = 0; i < v->count; i++) {
    json_free(&v->items[i]);
    if (v->keys != NULL) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->string);
  memset(v, 0, sizeof(*v));
}
