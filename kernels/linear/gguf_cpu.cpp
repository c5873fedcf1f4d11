// Matrix products on GGUF blocks as they are stored (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K), for
// the CPU engine. Built and loaded by gguf_cpu.py (a plain C ABI called through ctypes; OpenMP
// threads from the libgomp that torch has already loaded). README.md in this folder has the math.
//
// Weights are read 64 at a time as unsigned codes (a "unit": two 32-blocks, or a quarter of a
// 256-super-block). Activations are quantised to int8 once per call, per 32 values for the
// 32-blocks and per 256 for the super-blocks (as llama.cpp's Q8_0 / Q8_K), so a unit's product
// is one unsigned x signed 8-bit dot product (vpdpbusd) giving 16 int32 lanes of 4 products:
// - 32-blocks: each lane times (weight scale x activation scale) into an fp32 accumulator; the
//   block offset (Q4_0's -8d, Q4_1's m, Q8_0's -128d) times the fp32 sum of the activations.
// - super-blocks: the lanes times the integer sub-block scales, summed in int32 over the whole
//   super-block, then one fp32 multiply-add by (d x activation scale); the sub-block minimums
//   (Q4_K, Q5_K) or the code offset 32 (Q6_K) against the int8 activation sums per 16 / 32.

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512DQ__) || !defined(__AVX512VNNI__)
#error "gguf_cpu.cpp needs AVX-512 (F, BW, DQ, VNNI); gguf_cpu.py builds it only where the CPU has them"
#endif

namespace {

enum QType { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

template <int T> constexpr bool kSuper = T == Q4_K || T == Q5_K || T == Q6_K;

template <int T> constexpr int block_bytes();
template <> constexpr int block_bytes<Q4_0>() { return 18; }
template <> constexpr int block_bytes<Q4_1>() { return 20; }
template <> constexpr int block_bytes<Q8_0>() { return 34; }
template <> constexpr int block_bytes<Q4_K>() { return 144; }
template <> constexpr int block_bytes<Q5_K>() { return 176; }
template <> constexpr int block_bytes<Q6_K>() { return 210; }

inline float half_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// Lanes 0-7 a, lanes 8-15 b.
inline __m512 two(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }

// ---- 32-blocks --------------------------------------------------------------------------------
// ggml's 4-bit blocks: element j is the low nibble of byte j, element j + 16 its high nibble.
inline __m256i nibbles16(const uint8_t* qs) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

// One 32-block's unsigned codes.
template <int T>
inline __m256i small_codes(const uint8_t* b) {
    if (T == Q4_0) return nibbles16(b + 2);
    if (T == Q4_1) return nibbles16(b + 4);
    // Q8_0: signed codes made unsigned by flipping the sign bit (q + 128)
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
}

// One 32-block: its codes, and (scale, offset) with weight = scale * code + offset.
template <int T>
inline __m256i small_block(const uint8_t* b, float& scale, float& offset) {
    const float d = half_at(b);
    scale = d;
    offset = T == Q4_0 ? -8.0f * d : T == Q4_1 ? half_at(b + 2) : -128.0f * d;
    return small_codes<T>(b);
}

// Unit u = blocks 2u and 2u + 1; `half` when only 2u exists (rows of an odd number of blocks):
// the missing half then has codes, scale and offset 0.
template <int T>
inline __m512i small_unit(const uint8_t* row, int64_t u, bool half, float s[2], float o[2]) {
    const __m256i c0 = small_block<T>(row + 2 * u * block_bytes<T>(), s[0], o[0]);
    if (half) {
        s[1] = o[1] = 0.0f;
        return join(c0, _mm256_setzero_si256());
    }
    return join(c0, small_block<T>(row + (2 * u + 1) * block_bytes<T>(), s[1], o[1]));
}

// ---- 256-super-blocks -------------------------------------------------------------------------
// Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32: bytes 0-3 hold
// scales 0-3 (bits 0-5) and the top bits of scales 4-7; bytes 4-7 mins 0-3 and the top bits of
// mins 4-7; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble).
// Returned as 16 bytes: scales 0-7, then mins 0-7.
inline __m128i scales_k4(const uint8_t* s) {
    uint32_t u[3];
    std::memcpy(u, s, 12);
    const uint32_t six = 0x3F3F3F3F, four = 0x0F0F0F0F, two_bits = 0x03030303;
    const uint32_t sc_lo = u[0] & six, mn_lo = u[1] & six;
    const uint32_t sc_hi = (u[2] & four) | (((u[0] >> 6) & two_bits) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & four) | (((u[1] >> 6) & two_bits) << 4);
    return _mm_set_epi32(static_cast<int>(mn_hi), static_cast<int>(mn_lo), static_cast<int>(sc_hi),
                         static_cast<int>(sc_lo));
}

// 16-bit shift counts: the first 32 bytes of a register by a, the last 32 by b.
inline __m512i counts(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(a)), _mm256_set1_epi16(static_cast<short>(b)), 1);
}

inline __m512i bcast(const uint8_t* p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// Codes of unit q (0..3) of a super-block.
template <int T>
inline __m512i super_codes(const uint8_t* b, int q) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (T == Q6_K) {
        // ql[128], qh[64], scales[16] (int8, one per 16 weights), d. Half n holds 4 runs of 32:
        // runs 0/1 are the low nibbles of ql[64n..+63], runs 2/3 the high ones; run k takes bits
        // 2k..2k+1 of qh[32n + l] as bits 4..5. Unit q = runs 2p, 2p + 1 of half n. Shifting qh
        // in 16-bit lanes and keeping bits 4-5 of each byte moves run k's bits into place.
        const int n = q >> 1, p = q & 1;
        const __m512i ql = _mm512_loadu_si512(b + 64 * n);
        const __m512i qh = bcast(b + 128 + 32 * n);
        const __m512i low = _mm512_and_si512(p ? _mm512_srli_epi16(ql, 4) : ql, m4);
        const __m512i high = p ? _mm512_srlv_epi16(qh, counts(0, 2)) : _mm512_sllv_epi16(qh, counts(4, 2));
        return _mm512_or_si512(low, _mm512_and_si512(high, _mm512_set1_epi8(0x30)));
    }
    // Q4_K: d, dmin, scales[12], qs[128]; Q5_K: d, dmin, scales[12], qh[32], qs[128]. Bytes
    // qs[32q..32q+31] hold sub-block 2q in their low nibbles and 2q + 1 in their high ones;
    // Q5_K adds bit 2q (2q + 1) of qh[l] as bit 4.
    __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(bcast(b + (T == Q5_K ? 48 : 16) + 32 * q), counts(0, 4)), m4);
    if (T == Q5_K) {
        const __m512i bit = _mm512_and_si512(_mm512_srlv_epi16(bcast(b + 16), counts(2 * q, 2 * q + 1)), _mm512_set1_epi8(1));
        codes = _mm512_or_si512(codes, _mm512_slli_epi16(bit, 4));
    }
    return codes;
}

// The integer sub-block scales of a super-block as 16 int32 lanes (Q4_K/Q5_K: the 8 scales, one
// per 32 weights, then the 8 mins; Q6_K: 16 signed scales, one per 16), and d (and dmin).
template <int T>
inline __m512i super_scales(const uint8_t* b, float& d, float& dmin) {
    if (T == Q6_K) {
        d = half_at(b + 208), dmin = 0.0f;
        return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    }
    d = half_at(b), dmin = half_at(b + 2);
    return _mm512_cvtepu8_epi32(scales_k4(b + 4));
}

// Which scale each int32 lane of unit q uses: Q6_K one per 16 weights (4 lanes), else one per 32.
template <int T>
inline __m512i lane_index(int q) {
    if (T == Q6_K)
        return _mm512_add_epi32(_mm512_set1_epi32(4 * q),
                                _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
    return _mm512_add_epi32(_mm512_set1_epi32(2 * q), _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
}

// ---- activations ------------------------------------------------------------------------------
// M rows of x quantised once per call, in the format(s) the call's matrices need.
struct Act {
    int64_t M = 0, K = 0;
    // per 32 (32-blocks), rows padded to a multiple of 64 with zeros
    int64_t k64 = 0;
    int8_t* q32 = nullptr;
    float* d32 = nullptr;    // [M, k64 / 32] scale
    float* sum32 = nullptr;  // [M, k64 / 32] sum of the rounded x (scale times the int8 sum)
    // per 256 (super-blocks)
    int8_t* q256 = nullptr;
    float* d256 = nullptr;     // [M, K / 256]
    int32_t* neg16 = nullptr;   // [M, K / 256, 16] minus the sums of the int8 values per 16 (Q6_K)
    int32_t* sums32 = nullptr;  // [M, K / 256, 16] the same per 32 in lanes 8-15, 0 in 0-7 (Q4_K, Q5_K)
};

inline float amax_of(const float* x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
}

// n (multiple of 16) values times inv, rounded to nearest (even), saturated to int8.
inline void to_int8(const float* x, int n, float inv, int8_t* q) {
    const __m512 iv = _mm512_set1_ps(inv);
    for (int i = 0; i < n; i += 16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), iv))));
}

void quantize32(const float* x, Act& a) {
    const int64_t groups = a.k64 / 32;
    for (int64_t m = 0; m < a.M; ++m) {
        for (int64_t g = 0; g < groups; ++g) {
            int8_t* q = a.q32 + m * a.k64 + 32 * g;
            float& d = a.d32[m * groups + g];
            float& sum = a.sum32[m * groups + g];
            if (32 * g >= a.K) {
                std::memset(q, 0, 32);
                d = sum = 0.0f;
                continue;
            }
            const float* xg = x + m * a.K + 32 * g;
            const float amax = amax_of(xg, 32);
            d = amax / 127.0f;
            to_int8(xg, 32, amax > 0.0f ? 127.0f / amax : 0.0f, q);
            // The sum of the rounded values: the offsets of Q4_0 (-8d) and Q8_0 (-128d) only
            // re-centre the unsigned codes, and cancel exactly only against the same values.
            int32_t qs = 0;
            for (int l = 0; l < 32; ++l) qs += q[l];
            sum = d * static_cast<float>(qs);
        }
    }
}

void quantize256(const float* x, Act& a) {
    const int64_t blocks = a.K / 256;
    for (int64_t m = 0; m < a.M; ++m) {
        for (int64_t b = 0; b < blocks; ++b) {
            const float* xb = x + m * a.K + 256 * b;
            int8_t* q = a.q256 + m * a.K + 256 * b;
            const float amax = amax_of(xb, 256);
            a.d256[m * blocks + b] = amax / 127.0f;
            to_int8(xb, 256, amax > 0.0f ? 127.0f / amax : 0.0f, q);
            int32_t* neg16 = a.neg16 + (m * blocks + b) * 16;
            int32_t* s32 = a.sums32 + (m * blocks + b) * 16;
            for (int g = 0; g < 16; ++g) {
                int32_t s = 0;
                for (int l = 0; l < 16; ++l) s += q[16 * g + l];
                neg16[g] = -s;
            }
            for (int j = 0; j < 8; ++j) s32[j] = 0, s32[8 + j] = -(neg16[2 * j] + neg16[2 * j + 1]);
        }
    }
}

// ---- products ---------------------------------------------------------------------------------
constexpr int kTile = 4;  // activation rows per pass over a weight row

// MT activation rows (m0..m0 + MT - 1) against one weight row; MT is a constant so the
// accumulators stay in registers.
template <int T, int MT>
inline void small_tile(const uint8_t* row, const Act& a, int64_t m0, float* y, int64_t ldy, int64_t n) {
    const int64_t units = a.k64 / 64, groups = a.k64 / 32;
    const bool half_tail = (a.K % 64) != 0;
    __m512 acc[MT];
    float off[MT];
    for (int i = 0; i < MT; ++i) acc[i] = _mm512_setzero_ps(), off[i] = 0.0f;
    for (int64_t u = 0; u < units; ++u) {
        float s[2], o[2];
        const __m512i codes = small_unit<T>(row, u, half_tail && u == units - 1, s, o);
        for (int i = 0; i < MT; ++i) {
            const int64_t m = m0 + i;
            const float* xd = a.d32 + m * groups + 2 * u;
            const float* xs = a.sum32 + m * groups + 2 * u;
            const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes,
                                                    _mm512_loadu_si512(a.q32 + m * a.k64 + 64 * u));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), two(s[0] * xd[0], s[1] * xd[1]), acc[i]);
            off[i] += o[0] * xs[0] + o[1] * xs[1];
        }
    }
    for (int i = 0; i < MT; ++i) y[(m0 + i) * ldy + n] = _mm512_reduce_add_ps(acc[i]) + off[i];
}

// One activation row (decode) against one weight row: the scales and offsets of 16 blocks at a
// time, from one gather of their fp16 headers, as vectors (per unit, small_tile spends more
// instructions on its two blocks' scalar scales than on their dot product); the blocks past the
// last full 16 as small_tile does.
template <int T>
inline void small_row1(const uint8_t* row, const Act& a, int64_t m, float* y, int64_t ldy, int64_t n) {
    constexpr int bb = block_bytes<T>();
    const int64_t units = a.k64 / 64, groups = a.k64 / 32, full = a.K / 512;
    const bool half_tail = (a.K % 64) != 0;
    const float* xd = a.d32 + m * groups;
    const float* xs = a.sum32 + m * groups;
    const int8_t* xq = a.q32 + m * a.k64;
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(bb));
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), off = _mm512_setzero_ps();
    for (int64_t g = 0; g < full; ++g) {
        const uint8_t* base = row + g * 16 * bb;
        // Each block's first 4 bytes: d in the low half, Q4_1's m in the high one.
        const __m512i head = _mm512_i32gather_epi32(at, base, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        const __m512 o = T == Q4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)))
                                   : _mm512_mul_ps(d, _mm512_set1_ps(T == Q4_0 ? -8.0f : -128.0f));
        off = _mm512_fmadd_ps(o, _mm512_loadu_ps(xs + 16 * g), off);
        const __m512 sc = _mm512_mul_ps(d, _mm512_loadu_ps(xd + 16 * g));
        for (int u = 0; u < 8; u += 2) {
            const __m512i lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            const __m512i c0 = join(small_codes<T>(base + (2 * u) * bb), small_codes<T>(base + (2 * u + 1) * bb));
            const __m512i c1 = join(small_codes<T>(base + (2 * u + 2) * bb), small_codes<T>(base + (2 * u + 3) * bb));
            const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c0, _mm512_loadu_si512(xq + 512 * g + 64 * u));
            const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c1,
                                                   _mm512_loadu_si512(xq + 512 * g + 64 * u + 64));
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0),
                                   _mm512_permutexvar_ps(_mm512_add_epi32(lanes, _mm512_set1_epi32(2 * u)), sc), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1),
                                   _mm512_permutexvar_ps(_mm512_add_epi32(lanes, _mm512_set1_epi32(2 * u + 2)), sc), acc1);
        }
    }
    float rest = 0.0f;
    for (int64_t u = full * 8; u < units; ++u) {
        float s[2], o[2];
        const __m512i codes = small_unit<T>(row, u, half_tail && u == units - 1, s, o);
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(xq + 64 * u));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), two(s[0] * xd[2 * u], s[1] * xd[2 * u + 1]), acc0);
        rest += o[0] * xs[2 * u] + o[1] * xs[2 * u + 1];
    }
    y[m * ldy + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + _mm512_reduce_add_ps(off) + rest;
}

// MT activation rows (m0..m0 + MT - 1) against one weight row; MT is a constant so the
// accumulators stay in registers.
template <int T, int MT>
inline void super_tile(const uint8_t* row, const Act& a, int64_t m0, float* y, int64_t ldy, int64_t n) {
    const int64_t blocks = a.K / 256;
    const __m512i idx[4] = {lane_index<T>(0), lane_index<T>(1), lane_index<T>(2), lane_index<T>(3)};
    __m512 acc[MT], macc[MT];  // the scaled products, and the minimums' terms (two chains)
    for (int i = 0; i < MT; ++i) acc[i] = macc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* sb = row + b * block_bytes<T>();
        float d, dmin;
        // The scales in the low 16 bits of each lane (the high 16 zero), so that vpdpwssd adds
        // exactly lane x scale: each lane's int8 dot product (at most 4 x 63 x 127) fits 16 bits.
        const __m512i low16 = _mm512_set1_epi32(0xFFFF);
        const __m512i scales = _mm512_and_si512(super_scales<T>(sb, d, dmin), low16);
        // One int32 accumulator per unit, summed after: a chain of four dependent vpdpwssd per
        // super-block would bound the loop by their latency rather than by throughput.
        __m512i part[4][MT];
        for (int q = 0; q < 4; ++q) {
            const __m512i codes = super_codes<T>(sb, q);
            const __m512i sl = _mm512_permutexvar_epi32(idx[q], scales);
            for (int i = 0; i < MT; ++i) {
                const int8_t* xq = a.q256 + (m0 + i) * a.K + 256 * b + 64 * q;
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(xq));
                part[q][i] = _mm512_madd_epi16(dot, sl);
            }
        }
        __m512i iacc[MT];
        for (int i = 0; i < MT; ++i)
            iacc[i] = _mm512_add_epi32(_mm512_add_epi32(part[0][i], part[1][i]), _mm512_add_epi32(part[2][i], part[3][i]));
        // Q6_K: codes are q + 32, so 32 * scale * (sum of x per 16) comes off, in int32 (the
        // sums are stored negated). Q4_K/Q5_K: weight = d * sc * code - dmin * mn: the mins
        // (lanes 8-15 of `scales`) times the sums of x per 32 (lanes 8-15), scaled by dmin.
        const __m512i sc32 = _mm512_and_si512(_mm512_slli_epi32(scales, 5), low16);
        for (int i = 0; i < MT; ++i) {
            const int64_t m = m0 + i;
            const float dx = a.d256[m * blocks + b];
            const __m512i sx = _mm512_load_si512((T == Q6_K ? a.neg16 : a.sums32) + (m * blocks + b) * 16);
            if (T == Q6_K) {
                iacc[i] = _mm512_dpwssd_epi32(iacc[i], sx, sc32);
            } else {
                const __m512i mins = _mm512_madd_epi16(sx, scales);
                macc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_set1_ps(-dmin * dx), macc[i]);
            }
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i]), _mm512_set1_ps(d * dx), acc[i]);
        }
    }
    for (int i = 0; i < MT; ++i) y[(m0 + i) * ldy + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i], macc[i]));
}

template <int T, int MT>
inline void tile(const uint8_t* row, const Act& a, int64_t m0, float* y, int64_t ldy, int64_t n) {
    if constexpr (kSuper<T>)
        super_tile<T, MT>(row, a, m0, y, ldy, n);
    else if constexpr (MT == 1)
        small_row1<T>(row, a, m0, y, ldy, n);
    else
        small_tile<T, MT>(row, a, m0, y, ldy, n);
}

template <int T>
void rows_dot(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const Act& a, float* y, int64_t ldy) {
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        int64_t m0 = 0;
        for (; m0 + kTile <= a.M; m0 += kTile) tile<T, kTile>(row, a, m0, y, ldy, n);
        switch (a.M - m0) {
            case 3: tile<T, 3>(row, a, m0, y, ldy, n); break;
            case 2: tile<T, 2>(row, a, m0, y, ldy, n); break;
            case 1: tile<T, 1>(row, a, m0, y, ldy, n); break;
            default: break;
        }
    }
}

// ---- dequantisation ---------------------------------------------------------------------------
// Round to nearest even (the weights are finite).
inline __m256i to_bf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16));
}

// 64 codes with a scale and offset per int32 lane (4 weights) -> `parts` x 16 values at out.
inline void store_unit(__m512i codes, __m512 scale, __m512 offset, int parts, float* out_f, uint16_t* out_bf) {
    alignas(64) uint8_t c[64];
    _mm512_store_si512(c, codes);
    const __m512i four = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int i = 0; i < parts; ++i) {
        const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(4 * i), four);
        const __m512 v = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(c + 16 * i)))),
            _mm512_permutexvar_ps(idx, scale), _mm512_permutexvar_ps(idx, offset));
        if (out_f)
            _mm512_storeu_ps(out_f + 16 * i, v);
        else
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_bf + 16 * i), to_bf16(v));
    }
}

template <int T>
void rows_dequant(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t K, float* out_f,
                  uint16_t* out_bf) {
    const int64_t units = (K + 63) / 64;
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* row = w + n * row_bytes;
        float* of = out_f ? out_f + n * K : nullptr;
        uint16_t* ob = out_bf ? out_bf + n * K : nullptr;
        if constexpr (kSuper<T>) {
            for (int64_t b = 0; b < K / 256; ++b) {
                const uint8_t* sb = row + b * block_bytes<T>();
                float d, dmin;
                const __m512 raw = _mm512_cvtepi32_ps(super_scales<T>(sb, d, dmin));
                const __m512 sc = _mm512_mul_ps(raw, _mm512_set1_ps(d));
                // Q4_K/Q5_K: the mins sit in lanes 8-15; moved down so lane j's offset is -dmin * mn[j].
                const __m512 off = T == Q6_K ? _mm512_mul_ps(sc, _mm512_set1_ps(-32.0f))
                                             : _mm512_mul_ps(_mm512_shuffle_f32x4(raw, raw, 0xEE), _mm512_set1_ps(-dmin));
                for (int q = 0; q < 4; ++q) {
                    const __m512i idx = lane_index<T>(q);
                    const int64_t at = 256 * b + 64 * q;
                    store_unit(super_codes<T>(sb, q), _mm512_permutexvar_ps(idx, sc), _mm512_permutexvar_ps(idx, off), 4,
                               of ? of + at : nullptr, ob ? ob + at : nullptr);
                }
            }
        } else {
            const bool half_tail = (K % 64) != 0;
            for (int64_t u = 0; u < units; ++u) {
                const bool half = half_tail && u == units - 1;
                float s[2], o[2];
                const __m512i codes = small_unit<T>(row, u, half, s, o);
                store_unit(codes, two(s[0], s[1]), two(o[0], o[1]), half ? 2 : 4, of ? of + 64 * u : nullptr,
                           ob ? ob + 64 * u : nullptr);
            }
        }
    }
}

template <template <int> class F, typename... Args>
void dispatch(int qtype, Args... args) {
    switch (qtype) {
        case Q4_0: F<Q4_0>::run(args...); break;
        case Q4_1: F<Q4_1>::run(args...); break;
        case Q8_0: F<Q8_0>::run(args...); break;
        case Q4_K: F<Q4_K>::run(args...); break;
        case Q5_K: F<Q5_K>::run(args...); break;
        case Q6_K: F<Q6_K>::run(args...); break;
        default: break;
    }
}

template <int T> struct Dot {
    static void run(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, const Act* a, float* y, int64_t ldy) {
        rows_dot<T>(w, rb, n0, n1, *a, y, ldy);
    }
};
template <int T> struct Dequant {
    static void run(const uint8_t* w, int64_t rb, int64_t n0, int64_t n1, int64_t K, float* f, uint16_t* b) {
        rows_dequant<T>(w, rb, n0, n1, K, f, b);
    }
};

void rms_norm(const float* x, int64_t M, int64_t K, const float* w, float eps, float* out) {
    for (int64_t m = 0; m < M; ++m) {
        const float* r = x + m * K;
        double ss = 0.0;
        for (int64_t k = 0; k < K; ++k) ss += static_cast<double>(r[k]) * r[k];
        const float rstd = 1.0f / std::sqrt(static_cast<float>(ss / K) + eps);
        for (int64_t k = 0; k < K; ++k) out[m * K + k] = r[k] * rstd * w[k];
    }
}

constexpr int64_t kChunkRows = 16;  // rows a thread takes at a time (dynamic: the cores may be shared)

bool supported(int qtype) {
    return qtype == Q4_0 || qtype == Q4_1 || qtype == Q8_0 || qtype == Q4_K || qtype == Q5_K || qtype == Q6_K;
}
bool is_super(int qtype) { return qtype == Q4_K || qtype == Q5_K || qtype == Q6_K; }

}  // namespace

extern "C" {

// y[M, sum(rows)] = x[M, K] @ [W_0; W_1; ...]^T, each W_i [rows[i], K] in GGUF blocks of type
// qtypes[i] (row_bytes[i] bytes a row); y's row stride is ldy. With norm_w, x is first RMS-
// normalised (x * rsqrt(mean(x^2) + eps) * norm_w, fp32); bias [sum(rows)] is added; with
// swiglu, the two halves of the
// output [G | U] become silu(G) * U in y's first sum(rows) / 2 columns. Returns 0, or -1 for
// bad input.
int gguf_mm(const float* x, int64_t M, int64_t K, int nmat, const uint8_t* const* w, const int64_t* rows,
            const int64_t* row_bytes, const int* qtypes, float* y, int64_t ldy, int nthreads,
            const float* norm_w, float eps, const float* bias, int swiglu) {
    if (nmat > 64) return -1;
    bool small = false, super = false;
    for (int i = 0; i < nmat; ++i) {
        if (!supported(qtypes[i]) || (is_super(qtypes[i]) && K % 256) || K % 32) return -1;
        (is_super(qtypes[i]) ? super : small) = true;
    }
    Act a;
    a.M = M, a.K = K, a.k64 = (K + 63) / 64 * 64;
    void* mem[8] = {nullptr};
    auto alloc = [&](int i, int64_t bytes) { return mem[i] = std::aligned_alloc(64, (bytes + 63) / 64 * 64); };
    if (norm_w) {
        float* normed = static_cast<float*>(alloc(7, M * K * 4));
        rms_norm(x, M, K, norm_w, eps, normed);
        x = normed;
    }
    if (small) {
        a.q32 = static_cast<int8_t*>(alloc(0, M * a.k64));
        a.d32 = static_cast<float*>(alloc(1, M * a.k64 / 32 * 4));
        a.sum32 = static_cast<float*>(alloc(2, M * a.k64 / 32 * 4));
        quantize32(x, a);
    }
    if (super) {
        a.q256 = static_cast<int8_t*>(alloc(3, M * K));
        a.d256 = static_cast<float*>(alloc(4, M * K / 256 * 4));
        a.neg16 = static_cast<int32_t*>(alloc(5, M * K / 16 * 4));
        a.sums32 = static_cast<int32_t*>(alloc(6, M * K / 16 * 4));
        quantize256(x, a);
    }
    int64_t total = 0, starts[64];
    for (int i = 0; i < nmat; ++i) starts[i] = total, total += rows[i];
    const int64_t chunks = (total + kChunkRows - 1) / kChunkRows;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t lo = c * kChunkRows;
        const int64_t hi = lo + kChunkRows < total ? lo + kChunkRows : total;
        for (int i = 0; i < nmat && lo < hi; ++i) {
            const int64_t end = starts[i] + rows[i];
            if (lo >= end) continue;
            const int64_t stop = hi < end ? hi : end;
            dispatch<Dot>(qtypes[i], w[i], row_bytes[i], lo - starts[i], stop - starts[i],
                          static_cast<const Act*>(&a), y + starts[i], ldy);
            lo = stop;
        }
    }
    for (void* p : mem) std::free(p);
    if (bias) {
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < total; ++n) y[m * ldy + n] += bias[n];
    }
    if (swiglu) {
        const int64_t half = total / 2;
        for (int64_t m = 0; m < M; ++m) {
            float* r = y + m * ldy;
            for (int64_t n = 0; n < half; ++n) r[n] = r[n] / (1.0f + std::exp(-r[n])) * r[n + half];
        }
    }
    return 0;
}

// Rows [n0, n1) of W dequantised into out ([n1 - n0, K], fp32, or bf16 when bf16 != 0).
int gguf_dequant(const uint8_t* w, int64_t row_bytes, int qtype, int64_t K, int64_t n0, int64_t n1, void* out,
                 int bf16, int nthreads) {
    if (!supported(qtype) || (is_super(qtype) && K % 256) || K % 32) return -1;
    const uint8_t* base = w + n0 * row_bytes;
    const int64_t n = n1 - n0, chunks = (n + kChunkRows - 1) / kChunkRows;
    float* f = bf16 ? nullptr : static_cast<float*>(out);
    uint16_t* b = bf16 ? static_cast<uint16_t*>(out) : nullptr;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t lo = c * kChunkRows, hi = lo + kChunkRows < n ? lo + kChunkRows : n;
        dispatch<Dequant>(qtype, base, row_bytes, lo, hi, K, f, b);
    }
    return 0;
}


// e^x for x <= 0 (softmax after its maximum is taken off): x = n ln2 + r with |r| <= ln2 / 2,
// e^r by its Taylor polynomial to degree 7 (relative error ~1e-7, float rounding's size), times
// 2^n; below -87 the result is 0.
inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 in two parts, exact first
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// A decode step's attention for one new position `pos` over a KV cache of fp16 keys and values:
// q [hq, d] and the new k, v [hkv, d] (fp32) are turned by RoPE (HF's rotate-half layout:
// x * cos + rotate_half(x) * sin, cos/sin [d] of position pos; none when cos is null), the new
// k and v stored as fp16 at row pos of kc, vc [hkv, ld, d], then
// out[h] = softmax(scale * q[h] . K[j]) V over rows 0..pos, query head h reading KV head
// h / (hq / hkv); out [hq, d] fp32. fp16 halves the bytes a step reads (the cache, not the
// arithmetic, bounds it) and the cache's memory; one call replaces a dozen small torch ops.
// d must be a multiple of 16 (32 with RoPE). Returns 0, or -1 for bad input.
int attend_f16(const float* q_in, int64_t hq, int64_t hkv, int64_t d, const float* k_new, const float* v_new,
               const float* cos, const float* sin, uint16_t* kc, uint16_t* vc, int64_t ld, int64_t pos, float scale,
               float* out, int nthreads) {
    if (d % 16 || d > 256 || (cos && d % 32) || hkv <= 0 || hq % hkv || pos < 0 || pos >= ld) return -1;
    const int64_t g = hq / hkv, n = pos + 1, half = d / 2;
    // x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1].
    auto rope = [&](const float* x, float* y) {
        for (int64_t c = 0; c < half; c += 16) {
            const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + half + c);
            _mm512_storeu_ps(y + c, _mm512_fnmadd_ps(b, _mm512_loadu_ps(sin + c), _mm512_mul_ps(a, _mm512_loadu_ps(cos + c))));
            _mm512_storeu_ps(y + half + c, _mm512_fmadd_ps(a, _mm512_loadu_ps(sin + half + c),
                                                           _mm512_mul_ps(b, _mm512_loadu_ps(cos + half + c))));
        }
    };
    auto store_f16 = [&](const float* x, uint16_t* y) {
        for (int64_t c = 0; c < d; c += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + c), _mm512_cvtps_ph(_mm512_loadu_ps(x + c), _MM_FROUND_TO_NEAREST_INT));
    };
#pragma omp parallel for schedule(static) num_threads(nthreads < hkv ? nthreads : hkv)
    for (int64_t h = 0; h < hkv; ++h) {
        uint16_t* kh = kc + h * ld * d;
        uint16_t* vh = vc + h * ld * d;
        alignas(64) float tmp[256];
        if (cos) {
            rope(k_new + h * d, tmp);
            store_f16(tmp, kh + pos * d);
        } else {
            store_f16(k_new + h * d, kh + pos * d);
        }
        store_f16(v_new + h * d, vh + pos * d);
        float* s = static_cast<float*>(std::aligned_alloc(64, ((g * n + g * d) * 4 + 63) / 64 * 64));
        float* q = s + g * n;  // the group's query rows, turned
        for (int64_t i = 0; i < g; ++i) {
            if (cos)
                rope(q_in + (h * g + i) * d, q + i * d);
            else
                std::memcpy(q + i * d, q_in + (h * g + i) * d, d * 4);
        }
        for (int64_t j = 0; j < n; ++j) {
            // The group's query rows against a key row read from memory once.
            const uint16_t* kr = kh + j * d;
            for (int64_t i = 0; i < g; ++i) {
                __m512 acc = _mm512_setzero_ps();
                const float* qi = q + i * d;
                for (int64_t c = 0; c < d; c += 16)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(qi + c),
                                          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kr + c))), acc);
                s[i * n + j] = _mm512_reduce_add_ps(acc) * scale;
            }
        }
        for (int64_t i = 0; i < g; ++i) {
            float* si = s + i * n;
            float mx = si[0];
            for (int64_t j = 1; j < n; ++j) mx = si[j] > mx ? si[j] : mx;
            __m512 sum = _mm512_setzero_ps();
            int64_t j = 0;
            for (; j + 16 <= n; j += 16) {
                const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(si + j), _mm512_set1_ps(mx)));
                _mm512_storeu_ps(si + j, e);
                sum = _mm512_add_ps(sum, e);
            }
            float total = _mm512_reduce_add_ps(sum);
            for (; j < n; ++j) si[j] = std::exp(si[j] - mx), total += si[j];
            const float inv = 1.0f / total;
            for (j = 0; j < n; ++j) si[j] *= inv;
        }
        __m512 acc[4][4];  // 4 query rows x 64 of d per pass: 16 accumulators stay in registers
        for (int64_t c0 = 0; c0 < d; c0 += 64) {
            const int64_t cw = d - c0 < 64 ? (d - c0) / 16 : 4;
            for (int64_t i0 = 0; i0 < g; i0 += 4) {
                const int64_t gi = g - i0 < 4 ? g - i0 : 4;
                for (int64_t i = 0; i < gi; ++i)
                    for (int64_t c = 0; c < cw; ++c) acc[i][c] = _mm512_setzero_ps();
                for (int64_t j = 0; j < n; ++j) {
                    const uint16_t* vr = vh + j * d + c0;
                    __m512 vv[4];
                    for (int64_t c = 0; c < cw; ++c)
                        vv[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + 16 * c)));
                    for (int64_t i = 0; i < gi; ++i) {
                        const __m512 p = _mm512_set1_ps(s[(i0 + i) * n + j]);
                        for (int64_t c = 0; c < cw; ++c) acc[i][c] = _mm512_fmadd_ps(p, vv[c], acc[i][c]);
                    }
                }
                for (int64_t i = 0; i < gi; ++i)
                    for (int64_t c = 0; c < cw; ++c) _mm512_storeu_ps(out + (h * g + i0 + i) * d + c0 + 16 * c, acc[i][c]);
            }
        }
        std::free(s);
    }
    return 0;
}


// One Llama block's matrices and norms for gguf_decode (prepared once at load, engine/gguf_weights.py):
// products 0 = [q; k; v] (with the input norm folded, bias optional), 1 = o, 2 = [gate; up]
// (post-attention norm folded, SwiGLU), 3 = down; each product 1-3 matrices of K columns.
struct DecodeLayer {
    const uint8_t* w[7];
    int64_t rows[7], row_bytes[7];
    int qtypes[7];
    int nmat[4];  // matrices per product, in the order of w
    const float* norm_in;
    const float* norm_post;
    const float* qkv_bias;
    float eps;
};

// A decode step through n_layers Llama blocks, in place on x [hidden] (fp32): per layer
// x += o(attention(rope(qkv(norm(x))))), x += down(swiglu(gate_up(norm(x)))), the new k and v
// written as fp16 at row pos of the layer's cache (kc, vc: [n_layers, hkv, ld, d]). One call
// per step instead of about ten torch ops and four product calls per layer from Python.
int gguf_decode(const DecodeLayer* layers, int n_layers, float* x, int64_t hidden, int64_t hq, int64_t hkv,
                int64_t d, int64_t inter, uint16_t* kc, uint16_t* vc, int64_t ld, int64_t pos, const float* cos,
                const float* sin, int nthreads) {
    const int64_t nq = hq * d, nkv = hkv * d, wide = nq + 2 * nkv > 2 * inter ? nq + 2 * nkv : 2 * inter;
    float* buf = static_cast<float*>(std::aligned_alloc(64, ((wide + nq + hidden) * 4 + 63) / 64 * 64));
    float* big = buf;               // qkv, then gate/up
    float* att = buf + wide;        // attention output [hq * d]
    float* delta = att + nq;        // o or down output [hidden]
    int rc = 0;
    for (int l = 0; l < n_layers && rc == 0; ++l) {
        const DecodeLayer& L = layers[l];
        const uint8_t* const* w = L.w;
        const int64_t* rows = L.rows;
        const int64_t* rb = L.row_bytes;
        const int* qt = L.qtypes;
        rc |= gguf_mm(x, 1, hidden, L.nmat[0], w, rows, rb, qt, big, nq + 2 * nkv, nthreads, L.norm_in, L.eps,
                      L.qkv_bias, 0);
        const int64_t at1 = L.nmat[0], at2 = at1 + L.nmat[1], at3 = at2 + L.nmat[2];
        const int64_t cache = static_cast<int64_t>(l) * hkv * ld * d;
        rc |= attend_f16(big, hq, hkv, d, big + nq, big + nq + nkv, cos, sin, kc + cache, vc + cache, ld, pos,
                         1.0f / std::sqrt(static_cast<float>(d)), att, nthreads);
        rc |= gguf_mm(att, 1, nq, L.nmat[1], w + at1, rows + at1, rb + at1, qt + at1, delta, hidden, nthreads,
                      nullptr, 0.0f, nullptr, 0);
        for (int64_t i = 0; i < hidden; ++i) x[i] += delta[i];
        rc |= gguf_mm(x, 1, hidden, L.nmat[2], w + at2, rows + at2, rb + at2, qt + at2, big, 2 * inter, nthreads,
                      L.norm_post, L.eps, nullptr, 1);
        rc |= gguf_mm(big, 1, inter, L.nmat[3], w + at3, rows + at3, rb + at3, qt + at3, delta, hidden, nthreads,
                      nullptr, 0.0f, nullptr, 0);
        for (int64_t i = 0; i < hidden; ++i) x[i] += delta[i];
    }
    std::free(buf);
    return rc;
}

}  // extern "C"
