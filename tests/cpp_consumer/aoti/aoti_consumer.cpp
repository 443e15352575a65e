// Runs qrnn.pt2 (tests/torch_library/test_aoti_cpp.py) through the README's run_qrnn on
// the saved inputs of each length and writes the outputs beside them:
//   aoti_consumer <folder> <batch> <input_size> <length>...
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>

#include "run_qrnn.inc"

namespace {

at::Tensor read_floats(const std::string& path, std::vector<int64_t> shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(t.data_ptr<float>()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
    if (!in) throw std::runtime_error("cannot read " + path);
    return t;
}

void write_floats(const std::string& path, const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
              static_cast<std::streamsize>(c.numel() * sizeof(float)));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 5) {
        std::cerr << "usage: aoti_consumer <folder> <batch> <input_size> <length>...\n";
        return 2;
    }
    const std::string folder = argv[1];
    const int64_t batch = std::atoll(argv[2]), input_size = std::atoll(argv[3]);
    for (int i = 4; i < argc; ++i) {
        const std::string length = argv[i];
        const at::Tensor input =
            read_floats(folder + "/input_" + length + ".bin", {std::atoll(argv[i]), batch, input_size});
        const std::vector<at::Tensor> outputs = run_qrnn(folder + "/qrnn.pt2", input);
        write_floats(folder + "/cpp_output_" + length + ".bin", outputs.at(0));
        write_floats(folder + "/cpp_h_n_" + length + ".bin", outputs.at(1));
        std::cout << "length " << length << ": output " << outputs.at(0).sizes() << ", h_n " << outputs.at(1).sizes()
                  << "\n";
    }
    std::cout << "aoti consumer ok\n";
    return 0;
}
