// The corpora's tokenizer through the public API (qrnn/tokenizer.hpp): Python's str.split()
// whitespace, "<eos>" per line end, the vocabulary's order, fixed vocabularies, and a text
// tokenized in blocks giving the ids of the whole. tests/train/test_tokenizer.py compares it
// with the Python algorithm on generated texts.
#include "qrnn/tokenizer.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "test_check.hpp"

using qrnn::text::TokenLevel;
using qrnn::text::Tokenizer;
using qrnn::text::whitespace_length;

namespace {

std::vector<int32_t> ids_of(Tokenizer& t, const std::string& text, bool count = true) {
    std::vector<int32_t> ids;
    t.tokenize(text, count, &ids);
    return ids;
}

void whitespace() {
    qrnn_test::Context c("whitespace_length");
    // Every character str.isspace() accepts, in UTF-8, and its length.
    const std::vector<std::string> spaces = {
        "\t",           "\n",           "\v",           "\f",           "\r",
        "\x1c",         "\x1d",         "\x1e",         "\x1f",         " ",
        "\xc2\x85",     "\xc2\xa0",     "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\x8a",
        "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
    for (const std::string& s : spaces) CHECK_MSG(whitespace_length(s.data(), s.size()) == s.size(), "a space: " + s);
    // Neighbours that are not whitespace: U+200B (zero width space), U+00A1, U+180E, U+3001,
    // a lone lead byte cut short, NUL, a letter.
    for (const std::string& s : std::vector<std::string>{"\xe2\x80\x8b", "\xc2\xa1", "\xe1\xa0\x8e", "\xe3\x80\x81",
                                                         "\xe2\x80", "\xc2", std::string(1, '\0'), std::string("a")})
        CHECK_MSG(whitespace_length(s.data(), s.size()) == 0, "not a space: " + s);
}

void words() {
    qrnn_test::Context c("words");
    Tokenizer t(TokenLevel::words);
    // "b" twice, "a" twice, "<eos>" twice, "<unk>" once, "c" once; U+3000 and U+00A0 split.
    const std::vector<int32_t> ids = ids_of(t,
                                            "b a\xe3\x80\x80"
                                            "b\n<unk>\xc2\xa0"
                                            "a c\n");
    CHECK((ids == std::vector<int32_t>{0, 1, 0, 2, 3, 1, 4, 2}));  // first-appearance ids
    CHECK(t.size() == 5);
    const qrnn::text::Vocabulary v = t.vocabulary();
    // Counts 2 (<eos>, a, b: bytewise order), then 1 (c); the word <unk> is id 0.
    CHECK((v.tokens == std::vector<std::string>{"<unk>", "<eos>", "a", "b", "c"}));
    CHECK((v.final_ids == std::vector<int32_t>{3, 2, 1, 0, 4}));
    // Uncounted text: new words get provisional ids, and final id 0.
    CHECK((ids_of(t, "d\nb", false) == std::vector<int32_t>{5, 2, 0}));
    CHECK(t.vocabulary().final_ids.back() == 0);
}

void chars() {
    qrnn_test::Context c("chars");
    Tokenizer t(TokenLevel::chars);
    CHECK((ids_of(t,
                  "b\xc3\xa9"
                  "a\nb") == std::vector<int32_t>{0, 1, 2, 3, 0}));
    const qrnn::text::Vocabulary v = t.vocabulary();
    CHECK((v.tokens == std::vector<std::string>{"<unk>", "\n", "a", "b", "\xc3\xa9"}));  // by code point
    CHECK((v.final_ids == std::vector<int32_t>{3, 4, 2, 1}));
}

void fixed_vocabulary() {
    qrnn_test::Context c("fixed vocabulary");
    Tokenizer w(TokenLevel::words, {"<unk>", "the", "<eos>", "cat", "the"});
    CHECK((ids_of(w, "the dog\ncat", false) == std::vector<int32_t>{4, 0, 2, 3}));  // a repeat: its last place
    CHECK_THROWS(ids_of(w, "the"), std::logic_error, "fixed");
    CHECK_THROWS(w.vocabulary(), std::logic_error, "fixed");
    Tokenizer ch(TokenLevel::chars, {"<unk>", "a", "\xc3\xa9"});
    CHECK((ids_of(ch, "a\xc3\xa9z<", false) == std::vector<int32_t>{1, 2, 0, 0}));
}

void blocks() {
    qrnn_test::Context c("blocks ending at line ends");
    const std::string text = "one two\nthree one\n\n two\xe2\x80\xa8three\n";
    Tokenizer whole(TokenLevel::words), parts(TokenLevel::words);
    const std::vector<int32_t> expected = ids_of(whole, text);
    std::vector<int32_t> got;
    for (size_t start = 0; start < text.size();) {
        const size_t end = text.find('\n', start) + 1;
        parts.tokenize(std::string_view(text).substr(start, end - start), true, &got);
        start = end;
    }
    CHECK(got == expected);
    CHECK(parts.vocabulary().tokens == whole.vocabulary().tokens);
}

void many_words() {
    qrnn_test::Context c("a table grown many times");
    Tokenizer t(TokenLevel::words);
    std::string text;
    std::vector<std::string> expected;
    for (int i = 0; i < 100000; ++i) {
        expected.push_back("w" + std::to_string(i % 50000));
        text += expected.back() + (i % 7 ? " " : "\n");
        if (i % 7 == 0) expected.emplace_back("<eos>");
    }
    const std::vector<int32_t> ids = ids_of(t, text);
    CHECK(t.size() == 50001);
    const qrnn::text::Vocabulary v = t.vocabulary();
    CHECK(v.tokens.size() == 50002);
    CHECK(v.tokens[1] == "<eos>");  // the most frequent
    bool same = ids.size() == expected.size();
    for (size_t i = 0; same && i < ids.size(); ++i) same = v.tokens[size_t(v.final_ids[size_t(ids[i])])] == expected[i];
    CHECK(same);
}

}  // namespace

int main() {
    whitespace();
    words();
    chars();
    fixed_vocabulary();
    blocks();
    many_words();
    return qrnn_test::result("test_tokenizer");
}
