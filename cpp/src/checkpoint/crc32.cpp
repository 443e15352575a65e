// CRC-32 of zip (reflected polynomial 0xEDB88320). It runs on every byte of a checkpoint,
// so it must be far faster than the disk: carry-less multiply folding with 512-bit
// VPCLMULQDQ or 128-bit PCLMULQDQ where the CPU has them, slicing-by-8 elsewhere.
//
// Folding constants for a fold distance of D bits are x^(D+32) mod P (low qword) and
// x^(D-32) mod P (high qword), bit-reflected over 32 bits and shifted left by one.
#include "qrnn/checkpoint.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QRNN_CRC_PCLMUL 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace qrnn::checkpoint {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
    Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
        for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    return t;
}

constexpr Tables kTables = make_tables();

inline uint32_t load_le32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// `state` is the running register (already inverted): no pre/post inversion here.
uint32_t update_slice8(uint32_t state, const uint8_t* p, size_t n) {
    const auto& t = kTables;
    while (n >= 8) {
        const uint32_t lo = load_le32(p) ^ state;
        const uint32_t hi = load_le32(p + 4);
        state = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][hi & 0xFF] ^
                t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) state = t[0][(state ^ *p++) & 0xFF] ^ (state >> 8);
    return state;
}

#ifdef QRNN_CRC_PCLMUL
constexpr uint64_t kFold16Lo = 0x11542778aull, kFold16Hi = 0x1322d1430ull;  // D = 2048 bits
constexpr uint64_t kFold4Lo = 0x154442bd4ull, kFold4Hi = 0x1c6e41596ull;    // D = 512 bits
constexpr uint64_t kFold1Lo = 0x1751997d0ull, kFold1Hi = 0x0ccaa009eull;    // D = 128 bits

__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

// Four consecutive 16-byte lanes (x0 first) and a tail -> the register.
__attribute__((target("pclmul,sse4.1"))) uint32_t finish_lanes(__m128i x0, __m128i x1, __m128i x2, __m128i x3,
                                                               const uint8_t* p, size_t n) {
    const __m128i k1 = _mm_set_epi64x(static_cast<long long>(kFold1Hi), static_cast<long long>(kFold1Lo));
    x0 = _mm_xor_si128(fold(x0, k1), x1);
    x0 = _mm_xor_si128(fold(x0, k1), x2);
    x0 = _mm_xor_si128(fold(x0, k1), x3);
    while (n >= 16) {
        x0 = _mm_xor_si128(fold(x0, k1), _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        p += 16;
        n -= 16;
    }
    alignas(16) uint8_t rest[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(rest), x0);
    return update_slice8(update_slice8(0, rest, 16), p, n);
}

// Needs n >= 64. Folds 64-byte blocks into one 128-bit value that has the same CRC
// remainder as everything consumed, then finishes that value and the tail with tables
// (no Barrett reduction needed: the remainder is only 16 bytes).
__attribute__((target("pclmul,sse4.1"))) uint32_t update_pclmul(uint32_t state, const uint8_t* p, size_t n) {
    auto load = [](const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
    __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(state)));
    __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
    p += 64;
    n -= 64;
    const __m128i k4 = _mm_set_epi64x(static_cast<long long>(kFold4Hi), static_cast<long long>(kFold4Lo));
    while (n >= 64) {
        x0 = _mm_xor_si128(fold(x0, k4), load(p));
        x1 = _mm_xor_si128(fold(x1, k4), load(p + 16));
        x2 = _mm_xor_si128(fold(x2, k4), load(p + 32));
        x3 = _mm_xor_si128(fold(x3, k4), load(p + 48));
        p += 64;
        n -= 64;
    }
    return finish_lanes(x0, x1, x2, x3, p, n);
}

#define QRNN_AVX512_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1")))

QRNN_AVX512_TARGET inline __m512i load(const uint8_t* q) { return _mm512_loadu_si512(q); }

// The same (low, high) constant pair in each 128-bit lane.
QRNN_AVX512_TARGET inline __m512i pair4(uint64_t hi, uint64_t lo) {
    const auto h = static_cast<long long>(hi), l = static_cast<long long>(lo);
    return _mm512_set_epi64(h, l, h, l, h, l, h, l);
}

QRNN_AVX512_TARGET inline __m512i fold512(__m512i z, __m512i k, __m512i data) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k, 0x00), _mm512_clmulepi64_epi128(z, k, 0x11), data,
                                     0x96);  // a ^ b ^ c
}

// Needs n >= 256: four 64-byte accumulators (256 bytes per step), then one, then 128-bit lanes.
QRNN_AVX512_TARGET uint32_t update_vpclmul(uint32_t state, const uint8_t* p, size_t n) {
    const __m512i crc = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, static_cast<int>(state));
    __m512i z0 = _mm512_xor_si512(load(p), crc), z1 = load(p + 64), z2 = load(p + 128), z3 = load(p + 192);
    p += 256;
    n -= 256;
    const __m512i k16 = pair4(kFold16Hi, kFold16Lo);
    while (n >= 256) {
        z0 = fold512(z0, k16, load(p));
        z1 = fold512(z1, k16, load(p + 64));
        z2 = fold512(z2, k16, load(p + 128));
        z3 = fold512(z3, k16, load(p + 192));
        p += 256;
        n -= 256;
    }
    const __m512i k4 = pair4(kFold4Hi, kFold4Lo);
    z0 = fold512(z0, k4, z1);
    z0 = fold512(z0, k4, z2);
    z0 = fold512(z0, k4, z3);
    while (n >= 64) {
        z0 = fold512(z0, k4, load(p));
        p += 64;
        n -= 64;
    }
    alignas(64) uint8_t lanes[64];
    _mm512_store_si512(lanes, z0);
    auto lane = [&](int i) { return _mm_load_si128(reinterpret_cast<const __m128i*>(lanes + 16 * i)); };
    return finish_lanes(lane(0), lane(1), lane(2), lane(3), p, n);
}

bool cpu_has_vpclmul512() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6) != 0xE6) return false;         // the OS saves XMM, YMM and all ZMM state
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & bit_AVX512F) && (c & (1u << 10));  // VPCLMULQDQ
}

bool cpu_has_pclmul() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & bit_PCLMUL) && (c & bit_SSE4_1);
}

const bool kHasPclmul = cpu_has_pclmul();
const bool kHasVpclmul512 = kHasPclmul && cpu_has_vpclmul512();
#endif

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t state = ~crc;
#ifdef QRNN_CRC_PCLMUL
    if (kHasVpclmul512 && size >= 1024) return ~update_vpclmul(state, p, size);
    if (kHasPclmul && size >= 256) return ~update_pclmul(state, p, size);
#endif
    return ~update_slice8(state, p, size);
}

}  // namespace qrnn::checkpoint
