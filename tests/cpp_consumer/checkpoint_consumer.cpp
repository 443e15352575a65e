// Writes checkpoints from C++ with <qrnn/checkpoint.hpp> (no torch, no Python) that
// Python's plain torch.load reads. Usage: checkpoint_consumer <folder>.
// Prints "checkpoint consumer ok" and exits 0 when every save behaved as expected.
#include <qrnn/checkpoint.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ck = qrnn::checkpoint;

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <folder>\n", argv[0]);
        return 2;
    }
    const std::string folder = argv[1];
    ck::WriterOptions options;
    options.max_pending = 2;
    ck::CheckpointWriter writer(options);

    // weight[i] = i * 0.25 - 1, saved with a transposed view and a row view of it.
    std::vector<float> weight(6 * 4);
    for (size_t i = 0; i < weight.size(); ++i) weight[i] = float(i) * 0.25f - 1.0f;
    std::vector<int64_t> step = {42};
    std::vector<uint16_t> bf16 = {0x3F80, 0x4000, 0xBF80};  // 1, 2, -1 as bfloat16
    std::vector<uint8_t> mask = {1, 0, 1, 1};
    const uint64_t weight_bytes = weight.size() * sizeof(float);
    std::vector<ck::TensorRef> tensors = {
        {"weight", ck::ScalarType::Float32, {6, 4}, {}, weight.data(), 0, weight_bytes},
        {"weight_t", ck::ScalarType::Float32, {4, 6}, {1, 4}, weight.data(), 0, weight_bytes},
        {"row2", ck::ScalarType::Float32, {4}, {1}, weight.data(), 8, weight_bytes},
        {"step", ck::ScalarType::Int64, {}, {}, step.data()},
        {"bias_bf16", ck::ScalarType::BFloat16, {3}, {}, bf16.data()},
        {"mask", ck::ScalarType::Bool, {2, 2}, {}, mask.data()},
    };
    auto main_save = ck::write_tensors(writer, folder + "/from_cpp.pt", tensors);

    // Rotation: keep the two highest steps.
    std::vector<std::shared_ptr<ck::SaveStatus>> rotated;
    std::vector<std::vector<int64_t>> steps;
    for (int64_t s = 1; s <= 4; ++s) steps.push_back({s});
    for (int64_t s = 1; s <= 4; ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "/ckpt-%012lld.pt", static_cast<long long>(s));
        rotated.push_back(ck::write_tensors(writer, folder + name,
                                            {{"step", ck::ScalarType::Int64, {}, {}, steps[size_t(s - 1)].data()}},
                                            {2, "ckpt-", ".pt"}));
        rotated.back()->wait();  // in order, so each rotation sees the previous files
    }

    // A folder that does not exist: the error comes back through the status, nothing throws
    // (the writer opens the folder once, before creating anything in it).
    auto missing = ck::write_tensors(writer, folder + "/missing/x.pt", tensors);
    writer.wait_all();

    bool ok = main_save->ok();
    if (!ok) std::printf("main save failed: %s\n", main_save->error().message.c_str());
    for (auto& s : rotated) ok = ok && s->ok();
    const ck::SaveError e = missing->error();
    if (missing->ok() || e.error_number != ENOENT || e.operation != "open folder") {
        std::printf("missing folder was not reported as ENOENT: %s\n", e.message.c_str());
        ok = false;
    } else {
        std::printf("reported: %s\n", e.message.c_str());
    }
    if (ck::crc32("123456789", 9) != 0xCBF43926u) {  // the standard CRC-32 check value
        std::printf("crc32 check value wrong\n");
        ok = false;
    }
    writer.close();
    if (!ok) return 1;
    std::printf("checkpoint consumer ok\n");
    return 0;
}
