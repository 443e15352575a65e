// A tiny self-contained check library for the C++ tests: no framework to download.
// A failed CHECK prints file:line, the expression and the current context, and makes
// the test exit non-zero (see TEST_MAIN_RESULT). Checks keep going after a failure so
// one run shows every broken case; only the first few dozen are printed.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace qrnn_test {

inline int& failure_count() {
    static int n = 0;
    return n;
}
inline std::vector<std::string>& context_stack() {
    static std::vector<std::string> s;
    return s;
}

inline void report_failure(const char* file, int line, const std::string& what) {
    if (++failure_count() > 40) return;
    std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
    for (const auto& c : context_stack()) std::fprintf(stderr, "    in: %s\n", c.c_str());
}

// Names the case being checked in failure messages while in scope. Single-threaded use.
struct Context {
    explicit Context(std::string what) { context_stack().push_back(std::move(what)); }
    ~Context() { context_stack().pop_back(); }
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
};

inline int result(const char* test_name) {
    if (failure_count() == 0) {
        std::printf("%s: all checks passed\n", test_name);
        return 0;
    }
    std::fprintf(stderr, "%s: %d check(s) FAILED\n", test_name, failure_count());
    return 1;
}

}  // namespace qrnn_test

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) qrnn_test::report_failure(__FILE__, __LINE__, "CHECK(" #cond ")"); \
    } while (0)

#define CHECK_MSG(cond, msg)                                                          \
    do {                                                                              \
        if (!(cond)) qrnn_test::report_failure(__FILE__, __LINE__, std::string(msg)); \
    } while (0)

// `expr` must throw `type` whose what() contains `needle` (e.g. the argument's name).
#define CHECK_THROWS(expr, type, needle)                                                                          \
    do {                                                                                                          \
        bool qrnn_thrown_ = false;                                                                                \
        try {                                                                                                     \
            expr;                                                                                                 \
        } catch (const type& e) {                                                                                 \
            qrnn_thrown_ = true;                                                                                  \
            if (std::string(e.what()).find(needle) == std::string::npos)                                          \
                qrnn_test::report_failure(                                                                        \
                    __FILE__, __LINE__,                                                                           \
                    std::string(#expr " threw " #type " without \"") + needle + "\": " + e.what());               \
        } catch (const std::exception& e) {                                                                       \
            qrnn_thrown_ = true;                                                                                  \
            qrnn_test::report_failure(__FILE__, __LINE__,                                                         \
                                      std::string(#expr " threw another exception than " #type ": ") + e.what()); \
        }                                                                                                         \
        if (!qrnn_thrown_) qrnn_test::report_failure(__FILE__, __LINE__, #expr " did not throw " #type);          \
    } while (0)

// Parameters from `make()`, changed by the statements `...` (which name them `p`), must make
// `call(p)` throw std::invalid_argument whose what() contains `needle`.
#define CHECK_REJECTS(make, call, needle, ...)                \
    do {                                                      \
        auto p = make();                                      \
        __VA_ARGS__;                                          \
        CHECK_THROWS(call(p), std::invalid_argument, needle); \
    } while (0)

#define CHECK_NOTHROW(expr)                                                                          \
    do {                                                                                             \
        try {                                                                                        \
            expr;                                                                                    \
        } catch (const std::exception& e) {                                                          \
            qrnn_test::report_failure(__FILE__, __LINE__, std::string(#expr " threw: ") + e.what()); \
        }                                                                                            \
    } while (0)
