// Runs each fused kernel of kernels/src/cuda.rs on the inputs check.py wrote
// into a folder, and writes the outputs beside them. The block sizes follow
// rows_config in cuda.rs: the row's width rounded up to a power of two, at
// least a warp, at most 256 threads for the softmax and 1024 for the loss.
#include "shim.h"
#include "cuda_bf16.h"  // this folder's stand-in for CUDA's

#include <cstdio>
#include <string>

// The modules check.py took out of cuda.rs, each in a namespace of its own:
// NVRTC compiles them apart, and they define the same helpers.
namespace f32_module {
#include "f32.cu"
}
namespace bf16_module {
#include "bf16.cu"  // its #include <cuda_bf16.h> is the one above
}

// The row kernels of one element type, by their names in cuda.rs.
template <class T>
struct RowKernels;
#define ROW_KERNELS_OF(T, module, suffix)                                         \
    template <>                                                                  \
    struct RowKernels<T> {                                                       \
        static constexpr auto softmax = module::softmax_rows_##suffix;           \
        static constexpr auto softmax_backward = module::softmax_backward_rows_##suffix; \
        static constexpr auto cross_entropy = module::cross_entropy_rows_##suffix; \
        static constexpr auto cross_entropy_backward = module::cross_entropy_backward_rows_##suffix; \
        static constexpr auto mean = module::mean_##suffix;                      \
    };
ROW_KERNELS_OF(float, f32_module, f32)
ROW_KERNELS_OF(__nv_bfloat16, bf16_module, bf16)

static std::string folder;

template <class T>
static std::vector<T> load(const std::string& name, size_t count) {
    std::vector<T> values(count);
    FILE* file = std::fopen((folder + "/" + name).c_str(), "rb");
    if (!file || std::fread(values.data(), sizeof(T), count, file) != count) {
        std::fprintf(stderr, "cannot read %zu values from %s\n", count, name.c_str());
        std::exit(1);
    }
    std::fclose(file);
    return values;
}

template <class T>
static void save(const std::string& name, const std::vector<T>& values) {
    FILE* file = std::fopen((folder + "/" + name).c_str(), "wb");
    std::fwrite(values.data(), sizeof(T), values.size(), file);
    std::fclose(file);
}

static unsigned threads_for(unsigned width, unsigned most) {
    unsigned threads = 32;
    while (threads < width && threads < most) threads <<= 1;
    return threads;
}

// softmax <rows> <width> <queries, 0 for no mask> <scale>: x, mask -> y; y, dy -> dx.
template <class T>
static void softmax(unsigned rows, int width, int queries, float scale) {
    size_t n = size_t(rows) * width;
    auto x = load<T>("x", n), dy = load<T>("dy", n);
    std::vector<unsigned char> mask = queries ? load<unsigned char>("mask", size_t(queries) * width) : std::vector<unsigned char>();
    std::vector<T> y(n), dx(n);
    const unsigned char* allowed = queries ? mask.data() : nullptr;
    launch(rows, threads_for(width, 256), [&] { RowKernels<T>::softmax(x.data(), allowed, y.data(), width, queries ? queries : 1, scale); });
    launch(rows, threads_for(width, 256), [&] { RowKernels<T>::softmax_backward(y.data(), dy.data(), dx.data(), width, scale); });
    save("y", y);
    save("dx", dx);
}

// cross_entropy <rows> <classes>: logits, targets, dloss -> loss, dlogits.
template <class T>
static void cross_entropy(unsigned rows, int classes) {
    size_t n = size_t(rows) * classes;
    auto logits = load<T>("logits", n);
    auto targets = load<unsigned>("targets", rows);
    auto dloss = load<T>("dloss", 1);
    std::vector<float> losses(rows);
    std::vector<T> loss(1), dlogits(n);
    launch(rows, threads_for(classes, 1024), [&] { RowKernels<T>::cross_entropy(logits.data(), targets.data(), losses.data(), classes); });
    launch(1, threads_for(rows, 1024), [&] { RowKernels<T>::mean(losses.data(), loss.data(), rows); });
    launch(rows, threads_for(classes, 1024),
           [&] { RowKernels<T>::cross_entropy_backward(logits.data(), targets.data(), dloss.data(), dlogits.data(), classes); });
    save("loss", loss);
    save("dlogits", dlogits);
}

// convert <n>: x (f32) -> bf16 (__float2bfloat16's bits), widened (__bfloat162float of them).
static void convert(unsigned n) {
    auto x = load<float>("x", n);
    std::vector<__nv_bfloat16> narrow(n);
    std::vector<float> widened(n);
    for (unsigned i = 0; i < n; i++) {
        narrow[i] = __float2bfloat16(x[i]);
        widened[i] = __bfloat162float(narrow[i]);
    }
    save("bf16", narrow);
    save("widened", widened);
}

// silu <n> <blocks>: x -> y; x, dy -> dx, on fewer threads than elements (the grid-stride loop).
static void silu(unsigned n, unsigned blocks) {
    auto x = load<float>("x", n), dy = load<float>("dy", n);
    std::vector<float> y(n), dx(n);
    launch(blocks, 256, [&] { f32_module::silu_forward(x.data(), y.data(), n); });
    launch(blocks, 256, [&] { f32_module::silu_backward(x.data(), dy.data(), dx.data(), n); });
    save("y", y);
    save("dx", dx);
}

// adamw <n> <blocks> <b1> <1-b1> <b2> <1-b2> <inv_c1> <inv_c2> <eps> <lr>, each constant as its f32's
// bits (so that it reaches the kernel exactly as the host rounded it): decayed, g, m, v -> p, m_out, v_out.
static void adamw(unsigned n, unsigned blocks, char** constants) {
    float c[8];
    for (int i = 0; i < 8; i++) {
        unsigned bits = std::stoul(constants[i]);
        std::memcpy(&c[i], &bits, sizeof bits);
    }
    auto decayed = load<float>("decayed", n), g = load<float>("g", n), m = load<float>("m", n), v = load<float>("v", n);
    std::vector<float> p(n), m_out(n), v_out(n);
    launch(blocks, 256, [&] {
        f32_module::adamw_update(decayed.data(), g.data(), m.data(), v.data(), p.data(), m_out.data(), v_out.data(), n,
                                 c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
    });
    save("p", p);
    save("m_out", m_out);
    save("v_out", v_out);
}

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: driver <folder> convert <n> | softmax <f32|bf16> <rows> <width> <queries> <scale> | cross_entropy <f32|bf16> <rows> <classes> | silu <n> <blocks> | adamw <n> <blocks> <b1> <1-b1> <b2> <1-b2> <inv_c1> <inv_c2> <eps> <lr>\n");
        return 2;
    }
    folder = argv[1];
    std::string kernel = argv[2];
    // The row kernels come in f32 and bf16: argv[3] says which.
    std::string element = argc > 3 ? argv[3] : "";
    bool bf16 = element == "bf16";
    if (kernel == "convert" && argc == 4) convert(std::stoul(argv[3]));
    else if (kernel == "silu" && argc == 5) silu(std::stoul(argv[3]), std::stoul(argv[4]));
    else if (kernel == "adamw" && argc == 13) adamw(std::stoul(argv[3]), std::stoul(argv[4]), argv + 5);
    else if (element != "f32" && element != "bf16") return 2;
    else if (kernel == "softmax" && argc == 8)
        (bf16 ? softmax<__nv_bfloat16> : softmax<float>)(std::stoul(argv[4]), std::stoi(argv[5]), std::stoi(argv[6]), std::stof(argv[7]));
    else if (kernel == "cross_entropy" && argc == 6)
        (bf16 ? cross_entropy<__nv_bfloat16> : cross_entropy<float>)(std::stoul(argv[4]), std::stoi(argv[5]));
    else return 2;
    return 0;
}
