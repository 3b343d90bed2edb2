/* utf8_check.h — the one rule for what counts as UTF-8 in text sluice
 * reads: the JSON-lines sources (io_parse.c) and the Nexmark event parser
 * (nexmark/json.c) both use it, so they refuse the same lines.
 * Internal: not part of the public API.
 *
 * NOTES
 *
 * 1. Well-formed UTF-8 is Unicode's table 3-7 (the Unicode Standard,
 *    chapter 3, D92), which is also what jansson checks:
 *        U+0000..U+007F     00..7F
 *        U+0080..U+07FF     C2..DF 80..BF
 *        U+0800..U+0FFF     E0     A0..BF 80..BF
 *        U+1000..U+CFFF     E1..EC 80..BF 80..BF
 *        U+D000..U+D7FF     ED     80..9F 80..BF
 *        U+E000..U+FFFF     EE..EF 80..BF 80..BF
 *        U+10000..U+3FFFF   F0     90..BF 80..BF 80..BF
 *        U+40000..U+FFFFF   F1..F3 80..BF 80..BF 80..BF
 *        U+100000..U+10FFFF F4     80..8F 80..BF 80..BF
 *    Everything else is refused: a stray continuation byte, C0, C1 and
 *    every other overlong form, the surrogates U+D800..U+DFFF (ED A0..BF),
 *    anything above U+10FFFF (F4 90.., F5..FF) and a sequence cut short.
 * 2. \u escapes are the JSON parser's business, under the same rule: a
 *    lone surrogate (a high one not followed by \u and a low one, or a low
 *    one alone) is refused (jansson: "invalid Unicode").
 * 3. The scan is byte by byte with an early exit; ASCII costs one compare
 *    per byte, and callers that see mostly ASCII call sl_utf8_sequence
 *    only for bytes of 0x80 and up.
 */
#ifndef SL_UTF8_CHECK_H
#define SL_UTF8_CHECK_H

#include <stddef.h>
#include <stdint.h>

/* The length (1..4) of the well-formed sequence at p, with `left` bytes
 * available there (> 0); 0 if it is not well-formed, with *why saying
 * how (note 1). */
static inline size_t sl_utf8_sequence(const unsigned char *p, size_t left,
                                      const char **why) {
  unsigned char c = p[0];
  if (c < 0x80)
    return 1;
  size_t length;
  unsigned char low = 0x80, high = 0xBF; /* range of the second byte */
  if (c < 0xC2) {
    *why = c < 0xC0 ? "a continuation byte without a lead byte"
                    : "an overlong encoding";
    return 0;
  } else if (c < 0xE0) {
    length = 2;
  } else if (c < 0xF0) {
    length = 3;
    if (c == 0xE0)
      low = 0xA0; /* below: overlong */
    else if (c == 0xED)
      high = 0x9F; /* above: a surrogate */
  } else if (c < 0xF5) {
    length = 4;
    if (c == 0xF0)
      low = 0x90; /* below: overlong */
    else if (c == 0xF4)
      high = 0x8F; /* above: beyond U+10FFFF */
  } else {
    *why = "a byte that never occurs in UTF-8 (beyond U+10FFFF)";
    return 0;
  }
  for (size_t i = 1; i < length; i++) {
    if (i >= left || p[i] < 0x80 || p[i] > 0xBF) {
      *why = "a truncated sequence";
      return 0;
    }
    if (i == 1 && (p[1] < low || p[1] > high)) {
      *why = c == 0xED   ? "a surrogate (U+D800..U+DFFF)"
             : c == 0xF4 ? "a code point beyond U+10FFFF"
                         : "an overlong encoding";
      return 0;
    }
  }
  return length;
}

/* The offset of the first byte of text[0..bytes) that is not part of
 * well-formed UTF-8 (*why says how), or bytes if it is all well-formed. */
static inline size_t sl_utf8_invalid_at(const char *text, size_t bytes,
                                        const char **why) {
  const unsigned char *p = (const unsigned char *)text;
  size_t at = 0;
  while (at < bytes) { /* each step moves at forward by 1..4 */
    if (p[at] < 0x80) {
      at++;
      continue;
    }
    size_t n = sl_utf8_sequence(p + at, bytes - at, why);
    if (n == 0)
      return at;
    at += n;
  }
  return bytes;
}

#endif
