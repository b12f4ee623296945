// Runs each fused kernel of kernels/src/cuda.rs on the inputs check.py wrote
// into a folder, and writes the outputs beside them. The block sizes follow
// rows_config in cuda.rs: the row's width rounded up to a power of two, at
// least a warp, at most 256 threads for the softmax and 1024 for the loss.
#include "shim.h"
#include "f32.cu"  // the module check.py took out of cuda.rs

#include <cstdio>
#include <string>

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
static void softmax(unsigned rows, int width, int queries, float scale) {
    size_t n = size_t(rows) * width;
    auto x = load<float>("x", n), dy = load<float>("dy", n);
    std::vector<unsigned char> mask = queries ? load<unsigned char>("mask", size_t(queries) * width) : std::vector<unsigned char>();
    std::vector<float> y(n), dx(n);
    const unsigned char* allowed = queries ? mask.data() : nullptr;
    launch(rows, threads_for(width, 256), [&] { softmax_rows_f32(x.data(), allowed, y.data(), width, queries ? queries : 1, scale); });
    launch(rows, threads_for(width, 256), [&] { softmax_backward_rows_f32(y.data(), dy.data(), dx.data(), width, scale); });
    save("y", y);
    save("dx", dx);
}

// cross_entropy <rows> <classes>: logits, targets, dloss -> loss, dlogits.
static void cross_entropy(unsigned rows, int classes) {
    size_t n = size_t(rows) * classes;
    auto logits = load<float>("logits", n);
    auto targets = load<unsigned>("targets", rows);
    auto dloss = load<float>("dloss", 1);
    std::vector<float> losses(rows), loss(1), dlogits(n);
    launch(rows, threads_for(classes, 1024), [&] { cross_entropy_rows_f32(logits.data(), targets.data(), losses.data(), classes); });
    launch(1, threads_for(rows, 1024), [&] { mean_f32(losses.data(), loss.data(), rows); });
    launch(rows, threads_for(classes, 1024),
           [&] { cross_entropy_backward_rows_f32(logits.data(), targets.data(), dloss.data(), dlogits.data(), classes); });
    save("loss", loss);
    save("dlogits", dlogits);
}

// silu <n> <blocks>: x -> y; x, dy -> dx, on fewer threads than elements (the grid-stride loop).
static void silu(unsigned n, unsigned blocks) {
    auto x = load<float>("x", n), dy = load<float>("dy", n);
    std::vector<float> y(n), dx(n);
    launch(blocks, 256, [&] { silu_forward(x.data(), y.data(), n); });
    launch(blocks, 256, [&] { silu_backward(x.data(), dy.data(), dx.data(), n); });
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
        adamw_update(decayed.data(), g.data(), m.data(), v.data(), p.data(), m_out.data(), v_out.data(), n, c[0], c[1],
                     c[2], c[3], c[4], c[5], c[6], c[7]);
    });
    save("p", p);
    save("m_out", m_out);
    save("v_out", v_out);
}

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: driver <folder> softmax <rows> <width> <queries> <scale> | cross_entropy <rows> <classes> | silu <n> <blocks> | adamw <n> <blocks> <b1> <1-b1> <b2> <1-b2> <inv_c1> <inv_c2> <eps> <lr>\n");
        return 2;
    }
    folder = argv[1];
    std::string kernel = argv[2];
    if (kernel == "softmax" && argc == 7) softmax(std::stoul(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), std::stof(argv[6]));
    else if (kernel == "cross_entropy" && argc == 5) cross_entropy(std::stoul(argv[3]), std::stoi(argv[4]));
    else if (kernel == "silu" && argc == 5) silu(std::stoul(argv[3]), std::stoul(argv[4]));
    else if (kernel == "adamw" && argc == 13) adamw(std::stoul(argv[3]), std::stoul(argv[4]), argv + 5);
    else return 2;
    return 0;
}
