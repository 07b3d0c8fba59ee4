/*
 * bf16.h - BF16 <-> FP32 conversions of docs/numerics.md (CPU, internal).
 *
 * Written with integer operations on the FP32 bits so that loops over them
 * vectorize; memcpy is the portable bit cast and compiles to nothing.
 */
#ifndef BEAMMOE_CPU_BF16_H
#define BEAMMOE_CPU_BF16_H

#include <stdint.h>
#include <string.h>

/* f(b): widen BF16 bits to FP32, exact. */
static inline float bm_f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* bf16(v): round to nearest-even; overflow becomes infinity by itself;
 * every NaN becomes 0x7FFF. */
static inline uint16_t bm_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

#endif
