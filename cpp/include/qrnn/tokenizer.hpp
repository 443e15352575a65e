// The training corpora's tokenizer (qrnn.train.data.Vocabulary and the corpus cache): UTF-8
// text in, token ids out, by the rules the Python versions defined.
//
// Word level: words are the runs between whitespace as Python's str.split() finds it (the
// characters str.isspace() accepts: ASCII \t \n \v \f \r, space and \x1c-\x1f, and U+0085,
// U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), and every "\n"
// is also the token "<eos>". Char level: every code point is a token.
//
// A Tokenizer without a vocabulary gives each token it has not met the next id (its order of
// first appearance: provisional ids) and counts the tokens of the text it is told is
// training text; vocabulary() then orders them as the corpus's vocabulary and maps each
// provisional id to its final one, so a corpus is tokenized in one pass over bounded blocks.
// A Tokenizer given a vocabulary returns final ids directly (0, "<unk>", for the rest).
//
// Text must be UTF-8 (lone surrogates encoded as three bytes are accepted: Python's
// "surrogatepass"); it is not validated here (the caller decoded it). Each tokenize() call
// is whole text: a block must end at a token boundary (the cache cuts at line ends).
// Not thread-safe: one caller at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qrnn/dtype.hpp"  // QRNN_API

namespace qrnn::text {

enum class TokenLevel : int { chars = 0, words = 1 };

inline constexpr std::string_view kUnknownToken = "<unk>";  // id 0: a token never seen in training
inline constexpr std::string_view kLineEndToken = "<eos>";  // a line end, word level

// The length in bytes of the whitespace character (str.isspace()) starting at `p`, with
// `left` bytes readable from it; 0 if that character is not whitespace.
QRNN_API size_t whitespace_length(const char* p, size_t left);

// The corpus's vocabulary from the counted (training) tokens, as Vocabulary.build orders it.
struct Vocabulary {
    // "<unk>", then: words by descending count, ties in bytewise (= code point) order, the
    // word "<unk>" itself left out; characters by code point.
    std::vector<std::string> tokens;
    // The final id of each provisional id: its place in `tokens`, 0 for a token never
    // counted (seen only outside training) and for the word "<unk>".
    std::vector<int32_t> final_ids;
};

class QRNN_API Tokenizer {
public:
    // Provisional ids: new tokens are added as they come.
    explicit Tokenizer(TokenLevel level);
    // Fixed ids: token i of `vocabulary` is id i (a repeated token: its last place); any
    // other token is 0. At char level only single characters are looked up.
    Tokenizer(TokenLevel level, const std::vector<std::string>& vocabulary);
    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    TokenLevel level() const;
    // Appends the ids of the tokens of `text` to `ids` (nullptr: none kept); with `count`,
    // counts them as training text (std::logic_error with a fixed vocabulary).
    void tokenize(std::string_view text, bool count, std::vector<int32_t>* ids);
    // Distinct tokens met so far (with a fixed vocabulary: its size).
    size_t size() const;
    // The vocabulary of the counted text (std::logic_error with a fixed vocabulary).
    Vocabulary vocabulary() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace qrnn::text
