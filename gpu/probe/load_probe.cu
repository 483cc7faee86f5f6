// Loader probe: how fast can bytes of a file reach device memory on this machine, by which path?
// Each mode copies FILE into one device buffer with THREADS threads taking CHUNK_MB chunks from a
// shared counter, each thread with its own stream, and prints one JSON line.
//
//   load_probe make FILE GIB                     write a GIB file of pseudo-random bytes
//   load_probe drop FILE                         posix_fadvise(DONTNEED): out of the page cache
//   load_probe h2d                               pinned host-to-device ceiling
//   load_probe MODE FILE THREADS CHUNK_MB [noh2d]
//     read      pread into pinned staging buffers (4 per thread), then H2D   (today's loader)
//     direct    O_DIRECT pread into pinned staging buffers, then H2D
//     mmapcopy  memcpy from a read-only mmap into pinned buffers, then H2D
//     register  mmap read-only, cudaHostRegister(ReadOnly) each chunk, H2D straight from it
//     mixed     the first $REG_THREADS threads as register, the others as mmapcopy
// $PREPOP=1 populates the mapping's page tables before the clock starts (diagnostic).
//
// Build: nvcc -O2 -std=c++17 -o load_probe load_probe.cu
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(2); } } while (0)

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static size_t file_size(const char* p) { struct stat st; if (stat(p, &st)) { perror(p); exit(2); } return st.st_size; }

static const int MAX_SLOTS = 16;
// $SLOTS staging buffers per thread (default 4); $PIECE > 0 copies in pieces of that many bytes
// (small pieces keep glibc on temporal stores, so the staged bytes stay in the last-level cache).

int main(int argc, char** argv) {
  if (argc < 2) { fprintf(stderr, "usage: see the source\n"); return 2; }
  std::string mode = argv[1];
  const int SLOTS = atoi(getenv("SLOTS") ?: "4");
  const size_t PIECE = atol(getenv("PIECE") ?: "0");
  if (mode == "make") {
    size_t gib = atol(argv[3]);
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<uint64_t> buf((64 << 20) / 8);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t done = 0; done < (gib << 30); done += buf.size() * 8) {
      for (auto& v : buf) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; v = x; }
      if (write(fd, buf.data(), buf.size() * 8) != (ssize_t)(buf.size() * 8)) { perror("write"); return 2; }
    }
    fsync(fd); close(fd);
    printf("{\"made\":\"%s\",\"gib\":%zu}\n", argv[2], gib);
    return 0;
  }
  if (mode == "drop") {
    int fd = open(argv[2], O_RDONLY);
    fdatasync(fd);
    int r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    printf("{\"drop\":%d}\n", r);
    return 0;
  }
  if (mode == "h2d") {
    size_t n = 256 << 20; void* h; void* d;
    CK(cudaHostAlloc(&h, n, 0)); CK(cudaMalloc(&d, n)); memset(h, 1, n);
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    double t = now(); for (int i = 0; i < 20; i++) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    printf("{\"mode\":\"h2d\",\"gbps\":%.2f}\n", 20.0 * n / (now() - t) / 1e9);
    return 0;
  }
  const char* path = argv[2];
  int threads = atoi(argv[3]);
  size_t chunk = (size_t)atol(argv[4]) << 20;
  bool h2d = !(argc > 5 && std::string(argv[5]) == "noh2d");
  size_t size = file_size(path);
  void* dev; CK(cudaMalloc(&dev, size));
  int fd = open(path, O_RDONLY);
  int dfd = open(path, O_RDONLY | O_DIRECT);
  const char* map = nullptr;
  int reg_threads = mode == "register" ? threads : mode == "mixed" ? atoi(getenv("REG_THREADS") ?: "2") : 0;
  if (mode == "mmapcopy" || mode == "register" || mode == "mixed") {
    map = (const char*)mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror("mmap"); return 2; }
    if (getenv("PREPOP") && madvise((void*)map, size, 22 /* MADV_POPULATE_READ */)) perror("populate");
  }
  size_t nchunks = (size + chunk - 1) / chunk;
  std::atomic<size_t> next{0};
  std::atomic<double> reg_s{0};
  std::vector<std::thread> ts;
  // Staging allocated before the clock starts (the loader pins its buffers at start too).
  std::vector<std::vector<char*>> staging(threads);
  for (int t = reg_threads; t < threads; t++)
      for (int s = 0; s < SLOTS; s++) { void* p; CK(cudaHostAlloc(&p, chunk, 0)); staging[t].push_back((char*)p); }
  double t0 = now();
  for (int t = 0; t < threads; t++) ts.emplace_back([&, t] {
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t ev[MAX_SLOTS]; bool busy[MAX_SLOTS] = {}; const void* regd[MAX_SLOTS] = {};
    for (int i = 0; i < SLOTS; i++) CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    double my_reg = 0;
    for (int k = 0;; k++) {
      size_t c = next.fetch_add(1);
      if (c >= nchunks) break;
      size_t off = c * chunk, len = std::min(chunk, size - off);
      int s = k % SLOTS;
      if (busy[s]) {
        CK(cudaEventSynchronize(ev[s]));
        if (regd[s]) { double r = now(); CK(cudaHostUnregister((void*)regd[s])); my_reg += now() - r; regd[s] = nullptr; }
        busy[s] = false;
      }
      const void* src;
      if (t < reg_threads) {
        double r = now();
        CK(cudaHostRegister((void*)(map + off), len, cudaHostRegisterReadOnly));
        my_reg += now() - r;
        regd[s] = map + off; src = map + off;
      } else {
        char* b = staging[t][s];
        if (mode == "read" || mode == "direct") {
          int f = mode == "read" ? fd : dfd;
          size_t want = mode == "direct" ? (len + 4095) / 4096 * 4096 : len;
          for (size_t got = 0; got < len;) {
            ssize_t r = pread(f, b + got, want - got, off + got);
            if (r <= 0) { perror("pread"); exit(2); }
            got += r;
          }
        } else {
          if (PIECE) for (size_t p = 0; p < len; p += PIECE) memcpy(b + p, map + off + p, std::min(PIECE, len - p));
          else memcpy(b, map + off, len);
        }
        src = b;
      }
      if (h2d) CK(cudaMemcpyAsync((char*)dev + off, src, len, cudaMemcpyHostToDevice, st));
      CK(cudaEventRecord(ev[s], st)); busy[s] = true;
    }
    for (int s = 0; s < SLOTS; s++) if (busy[s]) {
      CK(cudaEventSynchronize(ev[s]));
      if (regd[s]) { double r = now(); CK(cudaHostUnregister((void*)regd[s])); my_reg += now() - r; }
    }
    double prev = reg_s.load(); while (!reg_s.compare_exchange_weak(prev, prev + my_reg)) {}
  });
  for (auto& t : ts) t.join();
  CK(cudaDeviceSynchronize());
  double dt = now() - t0;
  printf("{\"mode\":\"%s\",\"reg_threads\":%d,\"prepop\":%d,\"threads\":%d,\"chunk_mb\":%zu,\"h2d\":%d,\"gib\":%.2f,\"seconds\":%.3f,\"gbps\":%.2f,"
         "\"register_thread_s\":%.3f,\"slots\":%d,\"piece\":%zu}\n", mode.c_str(), reg_threads, getenv("PREPOP") != nullptr, threads, chunk >> 20, h2d, size / 1073741824.0, dt,
         size / dt / 1e9, reg_s.load(), SLOTS, PIECE);
  return 0;
}
