// The corpora's tokenizer (qrnn/tokenizer.hpp): one scan over the UTF-8 bytes, a hash table
// of the words met, and the vocabulary's order computed once at the end.
#include "qrnn/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>

namespace qrnn::text {
namespace {

// What a byte can start: a word byte, ASCII whitespace, a line end, or the lead byte of a
// multi-byte character that may be whitespace (U+0085/U+00A0: C2; U+1680: E1; U+2000 to
// U+205F: E2; U+3000: E3). UTF-8 continuation bytes are word bytes: they never start a
// character, so a non-whitespace character with one of those leads is skipped byte by byte.
enum ByteClass : uint8_t { kWordByte = 0, kSpace = 1, kLineEnd = 2, kMaybeSpace = 3 };

constexpr std::array<uint8_t, 256> byte_classes() {
    std::array<uint8_t, 256> c{};
    for (int b = 0x09; b <= 0x0D; ++b) c[b] = kSpace;  // \t \n \v \f \r
    for (int b = 0x1C; b <= 0x1F; ++b) c[b] = kSpace;  // file, group, record, unit separators
    c[0x20] = kSpace;
    c['\n'] = kLineEnd;
    c[0xC2] = c[0xE1] = c[0xE2] = c[0xE3] = kMaybeSpace;
    return c;
}
constexpr std::array<uint8_t, 256> kByteClass = byte_classes();

constexpr uint32_t kCodePoints = 0x110000;

// The code point at `p` (moved past it); lenient, since the caller decoded the text already.
inline uint32_t next_code_point(const unsigned char*& p, const unsigned char* end) {
    uint32_t c = *p++;
    if (c < 0x80) return c;
    const int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    c &= 0x3Fu >> extra;
    for (int i = 0; i < extra && p < end; ++i) c = (c << 6) | (*p++ & 0x3Fu);
    return c < kCodePoints ? c : 0xFFFD;
}

// A word's hash, 8 bytes at a time (words are short: one or two multiplies each).
inline uint64_t hash_bytes(const unsigned char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    if (n) {
        uint64_t v = 0;
        std::memcpy(&v, p, n);
        h = (h ^ v) * 0x94D049BB133111EBull;
        h ^= h >> 29;
    }
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

}  // namespace

size_t whitespace_length(const char* text, size_t left) {
    if (left == 0) return 0;
    const auto* p = reinterpret_cast<const unsigned char*>(text);
    switch (kByteClass[p[0]]) {
        case kSpace:
        case kLineEnd: return 1;
        case kWordByte: return 0;
        default: break;
    }
    if (p[0] == 0xC2) return left >= 2 && (p[1] == 0x85 || p[1] == 0xA0) ? 2 : 0;
    if (left < 3) return 0;
    if (p[0] == 0xE1) return p[1] == 0x9A && p[2] == 0x80 ? 3 : 0;                   // U+1680
    if (p[0] == 0xE3) return p[1] == 0x80 && p[2] == 0x80 ? 3 : 0;                   // U+3000
    if (p[1] == 0x81) return p[2] == 0x9F ? 3 : 0;                                   // U+205F
    if (p[1] != 0x80) return 0;                                                      // U+2000 to U+202F:
    const unsigned c = p[2];                                                         // 2000-200A, 2028,
    return (c >= 0x80 && c <= 0x8A) || c == 0xA8 || c == 0xA9 || c == 0xAF ? 3 : 0;  // 2029, 202F
}

struct Tokenizer::Impl {
    TokenLevel level;
    bool fixed = false;  // a given vocabulary: ids are its places, nothing is added
    // Token id -> its bytes (views into `arena`, or into the given vocabulary's strings).
    std::vector<std::string_view> tokens;
    std::vector<int64_t> counts;  // per token id: occurrences in the counted text
    std::vector<std::string> fixed_tokens;

    // Words: open addressing, linear probing, at most half full. A slot holds the id and the
    // hash's high bits, so a probe compares bytes only on a likely match; no allocation per
    // word, unlike std::unordered_map's nodes.
    struct Slot {
        uint32_t tag;
        int32_t id;  // -1: empty
    };
    std::vector<Slot> slots;
    int32_t eos_id = -1;

    // Characters: the id of each code point (-1: not met; a fixed vocabulary: 0).
    std::vector<int32_t> code_ids;
    std::vector<uint32_t> codes;  // per token id, at char level

    // The bytes of the words met, in chunks that never move (the table's views point there).
    std::vector<std::unique_ptr<char[]>> arena;
    size_t arena_left = 0;
    char* arena_next = nullptr;

    explicit Impl(TokenLevel l) : level(l) {
        if (level == TokenLevel::chars)
            code_ids.assign(kCodePoints, -1);
        else
            slots.assign(1 << 12, Slot{0, -1});
    }

    std::string_view keep(const unsigned char* p, size_t n) {
        if (n > arena_left) {
            const size_t chunk = std::max<size_t>(n, 1 << 20);
            arena.emplace_back(new char[chunk]);
            arena_next = arena.back().get();
            arena_left = chunk;
        }
        std::memcpy(arena_next, p, n);
        const std::string_view kept(arena_next, n);
        arena_next += n;
        arena_left -= n;
        return kept;
    }

    // The slot of the word, or the empty slot where it belongs.
    Slot& find(const unsigned char* p, size_t n, uint64_t h) {
        const size_t mask = slots.size() - 1;
        const auto tag = static_cast<uint32_t>(h >> 32);
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            Slot& s = slots[i];
            if (s.id < 0) return s;
            if (s.tag == tag) {
                const std::string_view t = tokens[size_t(s.id)];
                if (t.size() == n && std::memcmp(t.data(), p, n) == 0) return s;
            }
        }
    }

    void grow() {
        std::vector<Slot> old(slots.size() * 2, Slot{0, -1});
        old.swap(slots);
        const size_t mask = slots.size() - 1;
        for (const Slot& s : old) {
            if (s.id < 0) continue;
            const std::string_view t = tokens[size_t(s.id)];
            size_t i = hash_bytes(reinterpret_cast<const unsigned char*>(t.data()), t.size()) & mask;
            while (slots[i].id >= 0) i = (i + 1) & mask;
            slots[i] = s;
        }
    }

    // The id of a word: its fixed id (0 if absent), or its provisional id (added if new).
    int32_t word_id(const unsigned char* p, size_t n) {
        const uint64_t h = hash_bytes(p, n);
        Slot& s = find(p, n, h);
        if (s.id >= 0 || fixed) return s.id >= 0 ? s.id : 0;
        s = Slot{static_cast<uint32_t>(h >> 32), static_cast<int32_t>(tokens.size())};
        tokens.push_back(keep(p, n));
        counts.push_back(0);
        if (2 * tokens.size() > slots.size()) grow();
        return static_cast<int32_t>(tokens.size() - 1);
    }

    int32_t line_end_id() {
        if (eos_id < 0)  // looked up once: "<eos>" keeps its id
            eos_id = word_id(reinterpret_cast<const unsigned char*>(kLineEndToken.data()), kLineEndToken.size());
        return eos_id;
    }

    int32_t char_id(const unsigned char* p, const unsigned char* after, uint32_t code) {
        int32_t& id = code_ids[code];
        if (id < 0) {
            id = static_cast<int32_t>(tokens.size());
            tokens.push_back(keep(p, size_t(after - p)));
            codes.push_back(code);
            counts.push_back(0);
        }
        return id;
    }

    template <bool kCount, bool kKeep>
    void words(const unsigned char* p, const unsigned char* end, std::vector<int32_t>* ids) {
        auto emit = [&](int32_t id) {
            if (kCount) ++counts[size_t(id)];
            if (kKeep) ids->push_back(id);
        };
        while (p < end) {
            switch (kByteClass[*p]) {
                case kSpace: ++p; continue;
                case kLineEnd:
                    emit(line_end_id());
                    ++p;
                    continue;
                case kMaybeSpace:
                    if (const size_t n = whitespace_length(reinterpret_cast<const char*>(p), size_t(end - p))) {
                        p += n;
                        continue;
                    }
                    break;
                default: break;
            }
            const unsigned char* start = p++;
            while (p < end) {
                const uint8_t c = kByteClass[*p];
                if (c == kWordByte ||
                    (c == kMaybeSpace && whitespace_length(reinterpret_cast<const char*>(p), size_t(end - p)) == 0))
                    ++p;
                else
                    break;
            }
            emit(word_id(start, size_t(p - start)));
        }
    }

    template <bool kCount, bool kKeep>
    void chars(const unsigned char* p, const unsigned char* end, std::vector<int32_t>* ids) {
        while (p < end) {
            const unsigned char* start = p;
            const uint32_t code = next_code_point(p, end);
            const int32_t id = fixed ? code_ids[code] : char_id(start, p, code);
            if (kCount) ++counts[size_t(id)];
            if (kKeep) ids->push_back(id);
        }
    }

    template <bool kCount, bool kKeep>
    void run(const unsigned char* p, const unsigned char* end, std::vector<int32_t>* ids) {
        if (level == TokenLevel::words)
            words<kCount, kKeep>(p, end, ids);
        else
            chars<kCount, kKeep>(p, end, ids);
    }
};

Tokenizer::Tokenizer(TokenLevel level) : impl_(new Impl(level)) {}

Tokenizer::Tokenizer(TokenLevel level, const std::vector<std::string>& vocabulary) : impl_(new Impl(level)) {
    Impl& m = *impl_;
    m.fixed = true;
    m.fixed_tokens = vocabulary;
    m.tokens.reserve(vocabulary.size());
    for (const std::string& t : m.fixed_tokens) m.tokens.emplace_back(t);
    if (level == TokenLevel::chars) {
        std::fill(m.code_ids.begin(), m.code_ids.end(), 0);
        for (size_t i = 0; i < vocabulary.size(); ++i) {
            const auto* p = reinterpret_cast<const unsigned char*>(vocabulary[i].data());
            const auto* end = p + vocabulary[i].size();
            if (p == end) continue;
            const uint32_t code = next_code_point(p, end);
            if (p == end) m.code_ids[code] = static_cast<int32_t>(i);  // one character
        }
        return;
    }
    while (2 * vocabulary.size() > m.slots.size()) m.slots.resize(m.slots.size() * 2, Impl::Slot{0, -1});
    for (size_t i = 0; i < vocabulary.size(); ++i) {
        const auto* p = reinterpret_cast<const unsigned char*>(vocabulary[i].data());
        const uint64_t h = hash_bytes(p, vocabulary[i].size());
        // A repeated token keeps its last place, as a dict built in order does.
        m.find(p, vocabulary[i].size(), h) = Impl::Slot{static_cast<uint32_t>(h >> 32), static_cast<int32_t>(i)};
    }
}

Tokenizer::~Tokenizer() = default;

TokenLevel Tokenizer::level() const { return impl_->level; }

size_t Tokenizer::size() const { return impl_->tokens.size(); }

void Tokenizer::tokenize(std::string_view text, bool count, std::vector<int32_t>* ids) {
    Impl& m = *impl_;
    if (count && m.fixed) throw std::logic_error("a tokenizer with a fixed vocabulary counts nothing");
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const auto* end = p + text.size();
    if (ids) ids->reserve(ids->size() + (m.level == TokenLevel::chars ? text.size() : text.size() / 4));
    // The loop is compiled per combination: no branch per token on what to do with it.
    if (count && ids)
        m.run<true, true>(p, end, ids);
    else if (count)
        m.run<true, false>(p, end, ids);
    else if (ids)
        m.run<false, true>(p, end, ids);
    else
        m.run<false, false>(p, end, ids);
}

Vocabulary Tokenizer::vocabulary() const {
    const Impl& m = *impl_;
    if (m.fixed) throw std::logic_error("a tokenizer with a fixed vocabulary has no counts");
    std::vector<int32_t> order;
    for (size_t id = 0; id < m.tokens.size(); ++id)
        if (m.counts[id] > 0 && (m.level == TokenLevel::chars || m.tokens[id] != kUnknownToken))
            order.push_back(static_cast<int32_t>(id));
    if (m.level == TokenLevel::chars) {
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return m.codes[a] < m.codes[b]; });
    } else {
        // std::string_view compares bytes as unsigned char: UTF-8's byte order is its code
        // point order, which is how Python orders str.
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return m.counts[a] != m.counts[b] ? m.counts[a] > m.counts[b] : m.tokens[a] < m.tokens[b];
        });
    }
    Vocabulary v;
    v.tokens.reserve(order.size() + 1);
    v.tokens.emplace_back(kUnknownToken);
    v.final_ids.assign(m.tokens.size(), 0);
    for (size_t i = 0; i < order.size(); ++i) {
        v.tokens.emplace_back(m.tokens[size_t(order[i])]);
        v.final_ids[size_t(order[i])] = static_cast<int32_t>(i + 1);
    }
    return v;
}

}  // namespace qrnn::text
