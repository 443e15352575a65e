// qrnn._C's tokenizer (qrnn.train.data.Tokenizer): a thin wrapper over <qrnn/tokenizer.hpp>.
// Text arrives as str (its UTF-8, without a copy for ASCII) or bytes; ids leave as a
// TokenIds buffer that numpy reads without a copy. The GIL is released while it works.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "qrnn/tokenizer.hpp"

namespace qrnn::bindings {
namespace {

namespace text = qrnn::text;

// Token ids (int32) owned by C++, exposed through the buffer protocol.
struct TokenIds { std::vector<int32_t> ids; };

// The tokenizer and a lock: the GIL is released while it works, so two Python threads
// could otherwise reach the same (not thread-safe) tokenizer at once.
struct PyTokenizer {
    text::Tokenizer tokenizer;
    std::mutex lock;
    template <typename... A>
    explicit PyTokenizer(A&&... a) : tokenizer(std::forward<A>(a)...) {}
};

text::TokenLevel parse_level(const std::string& level) {
    if (level == "char") return text::TokenLevel::chars;
    if (level == "word") return text::TokenLevel::words;
    throw std::invalid_argument("level must be 'char' or 'word', got '" + level + "'");
}

// The UTF-8 bytes of `text` (str or bytes-like) and the object that owns them. A str that is
// all ASCII is its own UTF-8; any other is encoded, lone surrogates as three bytes
// ("surrogatepass", as Python orders and compares them), without caching the UTF-8 in the str.
std::pair<std::string_view, py::object> utf8_of(const py::handle& text) {
    if (PyUnicode_Check(text.ptr())) {
        if (PyUnicode_IS_ASCII(text.ptr())) {
            Py_ssize_t size = 0;
            const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
            if (!data) throw py::error_already_set();
            return {std::string_view(data, size_t(size)), py::reinterpret_borrow<py::object>(text)};
        }
        PyObject* encoded = PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogatepass");
        if (!encoded) throw py::error_already_set();
        auto owner = py::reinterpret_steal<py::object>(encoded);
        return {std::string_view(PyBytes_AS_STRING(encoded), size_t(PyBytes_GET_SIZE(encoded))), owner};
    }
    const py::buffer buffer = py::reinterpret_borrow<py::buffer>(text);
    const py::buffer_info info = buffer.request();
    if (info.ndim != 1 || info.itemsize != 1) throw std::invalid_argument("text must be str or a buffer of bytes");
    return {std::string_view(static_cast<const char*>(info.ptr), size_t(info.size)),
            py::reinterpret_borrow<py::object>(text)};
}

py::str decode_token(std::string_view token) {
    PyObject* s = PyUnicode_DecodeUTF8(token.data(), Py_ssize_t(token.size()), "surrogatepass");
    if (!s) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(s);
}

}  // namespace

void bind_text(py::module_& m) {
    py::class_<TokenIds>(m, "TokenIds", py::buffer_protocol(), "Token ids (int32); numpy.frombuffer reads them")
        .def_buffer([](TokenIds& t) {
            return py::buffer_info(t.ids.data(), sizeof(int32_t), py::format_descriptor<int32_t>::format(), 1,
                                   {py::ssize_t(t.ids.size())}, {py::ssize_t(sizeof(int32_t))});
        })
        .def("__len__", [](const TokenIds& t) { return t.ids.size(); });

    py::class_<PyTokenizer>(m, "Tokenizer",
                            "The corpora's tokenizer (qrnn/tokenizer.hpp): level 'char' or 'word'; with a "
                            "vocabulary (a list of tokens), fixed ids, else provisional ids and counts")
        .def(py::init([](const std::string& level, const py::object& vocabulary) {
                 if (vocabulary.is_none()) return new PyTokenizer(parse_level(level));
                 std::vector<std::string> tokens;
                 for (const py::handle token : vocabulary) tokens.emplace_back(utf8_of(token).first);
                 return new PyTokenizer(parse_level(level), tokens);
             }),
             py::arg("level"), py::arg("vocabulary") = py::none())
        .def(
            "tokenize",
            [](PyTokenizer& self, const py::object& text, bool count, bool ids) {
                const auto [utf8, owner] = utf8_of(text);
                TokenIds out;
                {
                    py::gil_scoped_release release;
                    const std::lock_guard<std::mutex> hold(self.lock);
                    self.tokenizer.tokenize(utf8, count, ids ? &out.ids : nullptr);
                }
                return out;
            },
            py::arg("text"), py::arg("count") = false, py::arg("ids") = true,
            "The ids of text's tokens (a TokenIds buffer; empty with ids=False); count: training text")
        .def("__len__", [](PyTokenizer& self) { return self.tokenizer.size(); })
        .def(
            "vocabulary",
            [](PyTokenizer& self) {
                text::Vocabulary v;
                {
                    py::gil_scoped_release release;
                    const std::lock_guard<std::mutex> hold(self.lock);
                    v = self.tokenizer.vocabulary();
                }
                py::list tokens;
                for (const std::string& t : v.tokens) tokens.append(decode_token(t));
                TokenIds final_ids{std::move(v.final_ids)};
                return py::make_tuple(tokens, std::move(final_ids));
            },
            "(tokens, the final id of each provisional id as TokenIds) of the counted text");
}

}  // namespace qrnn::bindings
