/* A small base64 library with libb64's C interface (libb64.so.0d), written for this project so that the
 * perf_analyzer binary of the tritonclient wheel links on machines without Debian's libb64-0d package.
 * Streaming encoder and decoder; the encoder writes no line breaks, the decoder skips characters outside the
 * alphabet (line breaks, padding), as libb64's does. The state structs match libb64's layout. */
#include <stddef.h>

typedef enum { step_A, step_B, step_C } base64_encodestep;
typedef struct { base64_encodestep step; char result; int stepcount; } base64_encodestate;
typedef enum { step_a, step_b, step_c, step_d } base64_decodestep;
typedef struct { base64_decodestep step; char plainchar; } base64_decodestate;

static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void base64_init_encodestate(base64_encodestate *s) { s->step = step_A; s->result = 0; s->stepcount = 0; }

char base64_encode_value(char value) { return ALPHABET[(unsigned char)value & 0x3f]; }

int base64_encode_block(const char *in, int length, char *out, base64_encodestate *s) {
    char *o = out;
    for (int i = 0; i < length; ++i) {
        unsigned char c = (unsigned char)in[i];
        switch (s->step) {
        case step_A: *o++ = base64_encode_value(c >> 2); s->result = (char)((c & 0x03) << 4); s->step = step_B; break;
        case step_B: *o++ = base64_encode_value((char)(s->result | (c >> 4))); s->result = (char)((c & 0x0f) << 2);
                     s->step = step_C; break;
        case step_C: *o++ = base64_encode_value((char)(s->result | (c >> 6))); *o++ = base64_encode_value(c & 0x3f);
                     s->step = step_A; s->stepcount++; break;
        }
    }
    return (int)(o - out);
}

int base64_encode_blockend(char *out, base64_encodestate *s) {
    char *o = out;
    if (s->step == step_B) { *o++ = base64_encode_value(s->result); *o++ = '='; *o++ = '='; }
    else if (s->step == step_C) { *o++ = base64_encode_value(s->result); *o++ = '='; }
    s->step = step_A;
    return (int)(o - out);
}

void base64_init_decodestate(base64_decodestate *s) { s->step = step_a; s->plainchar = 0; }

int base64_decode_value(char value) {
    unsigned char c = (unsigned char)value;
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int base64_decode_block(const char *in, const int length, char *out, base64_decodestate *s) {
    char *o = out;
    for (int i = 0; i < length; ++i) {
        int v = base64_decode_value(in[i]);
        if (v < 0) continue;
        switch (s->step) {
        case step_a: s->plainchar = (char)(v << 2); s->step = step_b; break;
        case step_b: *o++ = (char)(s->plainchar | (v >> 4)); s->plainchar = (char)((v & 0x0f) << 4); s->step = step_c;
                     break;
        case step_c: *o++ = (char)(s->plainchar | (v >> 2)); s->plainchar = (char)((v & 0x03) << 6); s->step = step_d;
                     break;
        case step_d: *o++ = (char)(s->plainchar | v); s->step = step_a; break;
        }
    }
    return (int)(o - out);
}
