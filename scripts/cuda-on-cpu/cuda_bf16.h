// Just enough of CUDA's cuda_bf16.h for the bf16 kernels, on the CPU: the
// 16-bit type and its two conversions, with the hardware's rounding (to
// nearest, ties to even), so that the kernels' outputs round as on a GPU.
#pragma once

#include <cstring>

struct __nv_bfloat16 {
    unsigned short bits;
};

// Exact: a bf16 is the top half of an f32.
inline float __bfloat162float(__nv_bfloat16 h) {
    unsigned int bits = (unsigned int)h.bits << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Adding 0x7fff, plus 1 when the kept half is odd, carries into the kept
// half exactly when the dropped half is above the midpoint, or at it with
// an odd kept half; a carry out of the mantissa rounds up to the next
// exponent, or to infinity. A NaN stays a NaN: its dropped bits could
// otherwise carry it into infinity, or be all it had of a mantissa.
inline __nv_bfloat16 __float2bfloat16(float f) {
    unsigned int bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
    return {(unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16)};
}
