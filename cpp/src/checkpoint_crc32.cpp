// CRC-32 of zip (reflected polynomial 0xEDB88320). It runs on every byte of a checkpoint,
// so it must be far faster than the disk: carry-less multiply folding (PCLMULQDQ, about
// 10+ GB/s per core) where the CPU has it, slicing-by-8 (about 1-2 GB/s) elsewhere.
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
        state = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
                t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) state = t[0][(state ^ *p++) & 0xFF] ^ (state >> 8);
    return state;
}

#ifdef QRNN_CRC_PCLMUL
// Folding constants for the reflected polynomial: x^(D+32) and x^(D-32) mod P, bit-reflected
// and shifted left by one, for fold distances D = 512 bits (4 lanes) and D = 128 bits.
constexpr uint64_t kFold4Lo = 0x154442bd4ull, kFold4Hi = 0x1c6e41596ull;
constexpr uint64_t kFold1Lo = 0x1751997d0ull, kFold1Hi = 0x0ccaa009eull;

__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
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
    const __m128i k1 = _mm_set_epi64x(static_cast<long long>(kFold1Hi), static_cast<long long>(kFold1Lo));
    x0 = _mm_xor_si128(fold(x0, k1), x1);
    x0 = _mm_xor_si128(fold(x0, k1), x2);
    x0 = _mm_xor_si128(fold(x0, k1), x3);
    while (n >= 16) {
        x0 = _mm_xor_si128(fold(x0, k1), load(p));
        p += 16;
        n -= 16;
    }
    alignas(16) uint8_t rest[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(rest), x0);
    return update_slice8(update_slice8(0, rest, 16), p, n);
}

bool cpu_has_pclmul() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & bit_PCLMUL) && (c & bit_SSE4_1);
}

const bool kHasPclmul = cpu_has_pclmul();
#endif

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t state = ~crc;
#ifdef QRNN_CRC_PCLMUL
    if (kHasPclmul && size >= 256) return ~update_pclmul(state, p, size);
#endif
    return ~update_slice8(state, p, size);
}

}  // namespace qrnn::checkpoint
