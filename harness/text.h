/*
 * text.h - text taken from a file or a command line, made safe to print.
 *
 * A tensor name, a dtype or a metadata value of a safetensors file is the
 * file's, not the tool's: printed raw, an escape sequence in it sets the
 * terminal's title, clears the screen, or a newline forges a line of the
 * report ("beammoe audit: PASS"). Every message that can carry such text
 * goes through hu_escape.
 */
#ifndef BEAMMOE_HARNESS_TEXT_H
#define BEAMMOE_HARNESS_TEXT_H

#include <stddef.h>

/* s made printable into out (outn > 0 bytes, always NUL-terminated):
 *   backslash                          \\  (so an escape is never ambiguous)
 *   U+0000-U+001F, U+007F              \xNN
 *   U+0080-U+009F (C1 controls), U+200B-U+200F, U+2028, U+2029,
 *   U+202A-U+202E, U+2060-U+2069, U+FEFF (invisible, line-breaking or
 *   reordering characters)             \uNNNN
 *   a byte that is not valid UTF-8     \xNN
 *   anything else                      itself
 * (hexadecimal digits in lower case). At most max_chars characters of s
 * (0: all of it; a character is a UTF-8 sequence or a byte that is not
 * one); the output stops at a whole character when out is full. Returns
 * out. */
char *hu_escape(char *out, size_t outn, const char *s, size_t max_chars);

/* Room for a name escaped into a message. */
#define HU_ESC_NAME 400

#endif
