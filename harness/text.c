/*
 * text.c - text from a file or a command line, made safe to print (text.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "text.h"

/* Characters of U+0080 and above that are escaped: invisible, line-breaking
 * or reordering ones a terminal or a reader would be fooled by. */
static int escaped_cp(uint32_t cp)
{
    return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 ||
           cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x2069) ||
           cp == 0xFEFF;
}

/* Length of the valid UTF-8 sequence at s (non-ASCII first byte), its code
 * point in *cp; 0 when it is not one (overlong, surrogate, past U+10FFFF,
 * cut short). */
static size_t utf8_seq(const unsigned char *s, uint32_t *cp)
{
    size_t len, k;
    uint32_t v, min;
    if ((s[0] & 0xE0) == 0xC0)
        len = 2, v = s[0] & 0x1F, min = 0x80;
    else if ((s[0] & 0xF0) == 0xE0)
        len = 3, v = s[0] & 0x0F, min = 0x800;
    else if ((s[0] & 0xF8) == 0xF0)
        len = 4, v = s[0] & 0x07, min = 0x10000;
    else
        return 0;
    /* a NUL ends s: (0 & 0xC0) != 0x80 stops the loop there */
    for (k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

char *hu_escape(char *out, size_t outn, const char *s, size_t max_chars)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t used = 0, chars = 0;
    if (!outn) return out;
    while (*p && (!max_chars || chars < max_chars)) {
        char piece[16];
        size_t len = 1, plen;
        uint32_t cp = 0;
        if (*p == '\\') {
            memcpy(piece, "\\\\", 3);
        } else if (*p >= 0x20 && *p < 0x7F) {
            piece[0] = (char)*p;
            piece[1] = '\0';
        } else if (*p < 0x80) {
            snprintf(piece, sizeof piece, "\\x%02x", (unsigned)*p);
        } else if ((len = utf8_seq(p, &cp)) == 0) {
            len = 1;
            snprintf(piece, sizeof piece, "\\x%02x", (unsigned)*p);
        } else if (escaped_cp(cp)) {
            snprintf(piece, sizeof piece, "\\u%04x", (unsigned)cp);
        } else {
            memcpy(piece, p, len);
            piece[len] = '\0';
        }
        plen = strlen(piece);
        if (used + plen >= outn) break; /* a whole character or none */
        memcpy(out + used, piece, plen);
        used += plen;
        p += len;
        chars++;
    }
    out[used] = '\0';
    return out;
}
