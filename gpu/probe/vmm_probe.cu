// VMM probe: the driver facts the VMM handle kind rests on, measured on the GPU machine.
// server: VMM arena (POSIX fd) + IPC event, sends fd (SCM_RIGHTS) + event handle on a socket.
// worker: imports, maps read-only, reads, tries writes, opens the event, waits on a flag.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorName(r_, &s_); \
  printf("{\"step\":\"%s\",\"error\":\"%s\"}\n", #x, s_); fflush(stdout); exit(3);} } while (0)
static const char* ename(CUresult r) { const char* s; cuGetErrorName(r, &s); return s; }

__global__ void fill(unsigned* p, size_t n, unsigned seed) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) p[i] = (unsigned)(i * 2654435761u) ^ seed; }
__global__ void sum(const unsigned* p, size_t n, unsigned long long* out) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) atomicAdd(out, (unsigned long long)p[i]); }
__global__ void scribble(unsigned* p) { p[threadIdx.x] = 0xdeadbeef; }

static const size_t LEN = 64 << 20;
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static unsigned long long checksum(CUdeviceptr p, size_t bytes, CUstream s) {
  unsigned long long* d; cudaMalloc(&d, 8); cudaMemsetAsync(d, 0, 8, s);
  size_t n = bytes / 4; sum<<<(n + 255) / 256, 256, 0, s>>>((const unsigned*)p, n, d);
  unsigned long long h = 0; cudaMemcpyAsync(&h, d, 8, cudaMemcpyDeviceToHost, s);
  cudaError_t e = cudaStreamSynchronize(s); if (e) { printf("{\"checksum_error\":\"%s\"}\n", cudaGetErrorName(e)); return 0; }
  cudaFree(d); return h;
}

static int sendfd(int sock, int fd, const void* data, size_t len) {
  struct msghdr m = {0}; struct iovec io = {(void*)data, len}; m.msg_iov = &io; m.msg_iovlen = 1;
  char buf[CMSG_SPACE(sizeof(int))]; memset(buf, 0, sizeof buf); m.msg_control = buf; m.msg_controllen = sizeof buf;
  struct cmsghdr* c = CMSG_FIRSTHDR(&m); c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int)); return sendmsg(sock, &m, 0) < 0 ? -1 : 0;
}
static int recvfd(int sock, void* data, size_t len) {
  struct msghdr m = {0}; struct iovec io = {data, len}; m.msg_iov = &io; m.msg_iovlen = 1;
  char buf[CMSG_SPACE(sizeof(int))]; m.msg_control = buf; m.msg_controllen = sizeof buf;
  size_t got = 0; ssize_t r = recvmsg(sock, &m, MSG_WAITALL); if (r <= 0) return -1; got = r; (void)got;
  struct cmsghdr* c = CMSG_FIRSTHDR(&m); if (!c) return -1; int fd; memcpy(&fd, CMSG_DATA(c), sizeof(int)); return fd;
}

struct Msg { CUipcEventHandle ev; size_t size; unsigned long long sum; };

CUmemAllocationProp prop_for(int dev) {
  CUmemAllocationProp p; memset(&p, 0, sizeof p); p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = dev; return p;
}

int server(const char* path) {
  CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  int fdsup = 0; CK(cuDeviceGetAttribute(&fdsup, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  int vmm = 0; CK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  int wv = 0; cuDeviceGetAttribute(&wv, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev);
  CUmemAllocationProp prop = prop_for(0); size_t gmin = 0, grec = 0;
  CK(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CK(cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  size_t size = (LEN + 4096 + gmin - 1) / gmin * gmin;
  CUmemGenericAllocationHandle h; double t0 = now(); CK(cuMemCreate(&h, size, &prop, 0)); double tc = now() - t0;
  CUdeviceptr p; CK(cuMemAddressReserve(&p, size, 0, 0, 0)); CK(cuMemMap(p, size, 0, h, 0));
  CUmemAccessDesc a; a.location = prop.location; a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CK(cuMemSetAccess(p, size, &a, 1));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  fill<<<(LEN / 4 + 255) / 256, 256, 0, s>>>((unsigned*)p, LEN / 4, 7); CK(cuMemsetD32Async(p + LEN, 0, 1, s));
  unsigned long long sm = checksum(p, LEN, s);
  int fd = -1; t0 = now(); CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); double te = now() - t0;
  CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)); CK(cuEventRecord(ev, s));
  struct Msg msg; CK(cuIpcGetEventHandle(&msg.ev, ev)); msg.size = size; msg.sum = sm;
  printf("{\"role\":\"server\",\"pid\":%d,\"posix_fd_supported\":%d,\"vmm\":%d,\"wait_value\":%d,\"gran_min\":%zu,\"gran_rec\":%zu,\"size\":%zu,\"create_ms\":%.3f,\"export_ms\":%.3f,\"sum\":%llu}\n",
         getpid(), fdsup, vmm, wv, gmin, grec, size, tc * 1e3, te * 1e3, sm); fflush(stdout);
  int ls = socket(AF_UNIX, SOCK_STREAM, 0); struct sockaddr_un ad = {0}; ad.sun_family = AF_UNIX; strcpy(ad.sun_path, path); unlink(path);
  if (bind(ls, (struct sockaddr*)&ad, sizeof ad) || listen(ls, 16)) { perror("bind"); return 2; }
  for (;;) {
    int c = accept(ls, 0, 0); if (c < 0) continue; char cmd = 0; if (read(c, &cmd, 1) != 1) { close(c); continue; }
    if (cmd == 'g') { sendfd(c, fd, &msg, sizeof msg); }
    else if (cmd == 'c') { unsigned long long v = checksum(p, LEN, s); write(c, &v, 8); }
    else if (cmd == 'f') { CK(cuMemsetD32Async(p + LEN, 1, 1, s)); CK(cuStreamSynchronize(s)); char ok = 1; write(c, &ok, 1); }
    else if (cmd == 'r') { double t = now(); CUmemGenericAllocationHandle h2; int fd2 = -1; CK(cuMemRetainAllocationHandle(&h2, (void*)p));
      CUresult r = cuMemExportToShareableHandle(&fd2, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0); printf("{\"reexport\":\"%s\",\"ms\":%.3f}\n", ename(r), (now()-t)*1e3); fflush(stdout); sendfd(c, fd2 >= 0 ? fd2 : fd, &msg, sizeof msg); }
    close(c);
  }
}

static int dial(const char* path, char cmd) {
  int c = socket(AF_UNIX, SOCK_STREAM, 0); struct sockaddr_un ad = {0}; ad.sun_family = AF_UNIX; strcpy(ad.sun_path, path);
  if (connect(c, (struct sockaddr*)&ad, sizeof ad)) { perror("connect"); exit(2); } write(c, &cmd, 1); return c;
}

int worker(const char* path, const char* mode) {
  CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  struct Msg msg; int c = dial(path, 'g'); double t0 = now(); int fd = recvfd(c, &msg, sizeof msg); close(c);
  if (fd < 0) { printf("{\"error\":\"no fd\"}\n"); return 2; }
  double t1 = now(); CUmemGenericAllocationHandle h; CK(cuMemImportFromShareableHandle(&h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUdeviceptr p; CK(cuMemAddressReserve(&p, msg.size, 0, 0, 0)); CK(cuMemMap(p, msg.size, 0, h, 0));
  CUmemAccessDesc a; a.location.type = CU_MEM_LOCATION_TYPE_DEVICE; a.location.id = 0; a.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  CK(cuMemSetAccess(p, msg.size, &a, 1)); double t2 = now();
  CUevent ev; CUresult evr = cuIpcOpenEventHandle(&ev, msg.ev);
  unsigned long long sm = checksum(p, LEN, s);
  printf("{\"role\":\"worker\",\"mode\":\"%s\",\"pid\":%d,\"recv_ms\":%.3f,\"import_map_ms\":%.3f,\"event_open\":\"%s\",\"sum_ok\":%d}\n",
         mode, getpid(), (t1 - t0) * 1e3, (t2 - t1) * 1e3, ename(evr), sm == msg.sum); fflush(stdout);
  if (!strcmp(mode, "memcpy-write")) { unsigned x = 1; CUresult r = cuMemcpyHtoD(p, &x, 4); printf("{\"memcpy_write\":\"%s\"}\n", ename(r));
    CUresult r2 = cuMemsetD32(p + 64, 5, 1); printf("{\"memset_write\":\"%s\"}\n", ename(r2)); }
  if (!strcmp(mode, "kernel-write")) { scribble<<<1, 32, 0, s>>>((unsigned*)p); CUresult r = cuStreamSynchronize(s); printf("{\"kernel_write\":\"%s\"}\n", ename(r)); }
  if (!strcmp(mode, "rw-remap")) { // a hostile importer asks for write access itself
    CUdeviceptr q; CK(cuMemAddressReserve(&q, msg.size, 0, 0, 0)); CK(cuMemMap(q, msg.size, 0, h, 0));
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CUresult r = cuMemSetAccess(q, msg.size, &a, 1); printf("{\"rw_set_access\":\"%s\"}\n", ename(r));
    if (r == CUDA_SUCCESS) { scribble<<<1, 32, 0, s>>>((unsigned*)q); CUresult r2 = cuStreamSynchronize(s); printf("{\"rw_kernel_write\":\"%s\"}\n", ename(r2));
      unsigned x = 0; cuMemcpyDtoH(&x, q, 4); printf("{\"after_rw_write_word0\":%u}\n", x);
      unsigned y = 0x11111111; CUresult r3 = cuMemcpyHtoD(q, &y, 4); printf("{\"rw_memcpy\":\"%s\"}\n", ename(r3));
      // restore the first 32 words so later checks compare
      fill<<<1, 32, 0, s>>>((unsigned*)q, 32, 7); cuStreamSynchronize(s);
    }
  }
  if (!strcmp(mode, "wait-flag")) { // a stream waits on a flag word in the read-only mapping, the server sets it later
    CUresult r = cuStreamWaitValue32(s, p + LEN, 1, CU_STREAM_WAIT_VALUE_GEQ); CUevent e2; cuEventCreate(&e2, 0); cuEventRecord(e2, s);
    usleep(300000); CUresult q1 = cuEventQuery(e2); int cc = dial(path, 'f'); char ok; read(cc, &ok, 1); close(cc);
    CUresult q2 = cuStreamSynchronize(s); printf("{\"wait_value\":\"%s\",\"before_flag\":\"%s\",\"after_flag\":\"%s\"}\n", ename(r), ename(q1), ename(q2)); }
  if (!strcmp(mode, "hold")) { // keep reading; survive the server's death
    for (int i = 0; i < 20; i++) { unsigned long long v = checksum(p, LEN, s); printf("{\"t\":%d,\"sum_ok\":%d}\n", i, v == msg.sum); fflush(stdout); sleep(1); } }
  if (!strcmp(mode, "reexport")) { CUmemGenericAllocationHandle h2; int fd2 = -1; CUresult r = cuMemExportToShareableHandle(&fd2, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    printf("{\"worker_reexport\":\"%s\"}\n", ename(r)); (void)h2; }
  if (!strcmp(mode, "attach-bench")) { double tt[200]; for (int i = 0; i < 200; i++) { double a0 = now(); int c2 = dial(path, 'g'); struct Msg m2; int f2 = recvfd(c2, &m2, sizeof m2); close(c2);
      CUmemGenericAllocationHandle h3; CK(cuMemImportFromShareableHandle(&h3, (void*)(uintptr_t)f2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); close(f2);
      CUdeviceptr q; CK(cuMemAddressReserve(&q, m2.size, 0, 0, 0)); CK(cuMemMap(q, m2.size, 0, h3, 0)); CK(cuMemSetAccess(q, m2.size, &a, 1));
      CUevent e3; CK(cuIpcOpenEventHandle(&e3, m2.ev)); tt[i] = (now() - a0) * 1e3;
      cuEventDestroy(e3); cuMemUnmap(q, m2.size); cuMemAddressFree(q, m2.size); cuMemRelease(h3); }
    double s2 = 0; for (int i = 0; i < 200; i++) s2 += tt[i]; printf("{\"attach_mean_ms\":%.3f,\"first\":%.3f,\"last\":%.3f}\n", s2 / 200, tt[0], tt[199]); }
  unsigned long long after = checksum(p, LEN, s);
  printf("{\"mode\":\"%s\",\"end_sum_ok\":%d}\n", mode, after == msg.sum); fflush(stdout);
  int cc = dial(path, 'c'); unsigned long long sv = 0; if (read(cc, &sv, 8) == 8) printf("{\"server_sum_ok\":%d}\n", sv == msg.sum); fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  CK(cuInit(0)); if (argc < 3) return 1;
  if (!strcmp(argv[1], "server")) return server(argv[2]);
  return worker(argv[2], argc > 3 ? argv[3] : "read");
}
