/* Times the plugin's calls as NCCL makes them, at a set event rate (benchmarks/nccl_plugin.py builds and runs it).
 *
 * Usage: bench_events PLUGIN.so SECONDS EVENTS_PER_S OUT.json
 * Loads ncclProfiler_v6 with dlopen, inits one communicator (CCLD_NCCL_DIR must hold a live aggregator.pid),
 * then plays ring all-reduces (2 channels, 8 send and 8 receive steps each) until SECONDS have passed, pacing
 * the calls to EVENTS_PER_S, and times every call with CLOCK_MONOTONIC (the clock's own cost is measured and
 * subtracted). Writes per kind of call the count, median and p99 in nanoseconds.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ccld_nccl_abi.h"

enum { K_COLL_START, K_COLL_STOP, K_KCH_START, K_KCH_STOP, K_POP_START, K_POP_STOP, K_STEP_START, K_STEP_STATE,
       K_STEP_STOP, K_KINDS };
static const char* NAMES[K_KINDS] = {"coll_start", "coll_stop", "kernel_ch_start", "kernel_ch_stop", "proxy_op_start",
                                     "proxy_op_stop", "proxy_step_start", "proxy_step_state", "proxy_step_stop"};
#define MAX_SAMPLES 4000000
static uint32_t* samples[K_KINDS];
static size_t n_samples[K_KINDS];

static inline uint64_t mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t clock_cost;
#define TIMED(kind, call)                                                              \
  do {                                                                                 \
    uint64_t t0_ = mono();                                                             \
    call;                                                                              \
    uint64_t d_ = mono() - t0_;                                                        \
    d_ = d_ > clock_cost ? d_ - clock_cost : 0;                                        \
    if (n_samples[kind] < MAX_SAMPLES) samples[kind][n_samples[kind]++] = (uint32_t)d_; \
    events++;                                                                          \
  } while (0)

static int cmp(const void* a, const void* b) {
  uint32_t x = *(const uint32_t*)a, y = *(const uint32_t*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s PLUGIN.so SECONDS EVENTS_PER_S OUT.json\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  const ccld_profiler_v5_t* p = dlsym(lib, "ncclProfiler_v6");
  if (!p) {
    fprintf(stderr, "no ncclProfiler_v6\n");
    return 1;
  }
  double seconds = atof(argv[2]), rate = atof(argv[3]);
  for (int k = 0; k < K_KINDS; k++) samples[k] = malloc(sizeof(uint32_t) * MAX_SAMPLES);
  uint64_t c0 = mono();
  for (int i = 0; i < 100000; i++) (void)mono();
  clock_cost = (mono() - c0) / 100001;
  void* ctx = NULL;
  int mask = 0;
  if (p->init(&ctx, 0x5EEDull, &mask, "bench", 1, 2, 0, NULL) != 0) {
    fprintf(stderr, "init refused (is CCLD_NCCL_DIR set, with a live aggregator.pid?)\n");
    return 1;
  }
  const int channels = 2, steps = 8;
  uint64_t events = 0, ops = 0;
  uint64_t start = mono(), end = start + (uint64_t)(seconds * 1e9);
  double ns_per_event = 1e9 / rate;
  pid_t pid = getpid();
  while (mono() < end) {
    struct ccld_descr_v5 d;
    memset(&d, 0, sizeof d);
    d.type = CCLD_EV_COLL;
    d.body.coll.seq_number = ops;
    d.body.coll.func = "AllReduce";
    d.body.coll.count = 1 << 20;
    d.body.coll.datatype = "ncclFloat32";
    d.body.coll.n_channels = channels;
    void* op = NULL;
    TIMED(K_COLL_START, p->start_event(ctx, &op, &d));
    TIMED(K_COLL_STOP, p->stop_event(op));
    for (int c = 0; c < channels; c++) {
      void *kch = NULL, *ps = NULL, *pr = NULL;
      memset(&d, 0, sizeof d);
      d.type = CCLD_EV_KERNEL_CH;
      d.parent = op;
      d.body.kernel_ch.channel = (uint8_t)c;
      d.body.kernel_ch.gpu_time_ns = mono();
      TIMED(K_KCH_START, p->start_event(ctx, &kch, &d));
      for (int s = 0; s < 2; s++) {
        memset(&d, 0, sizeof d);
        d.type = CCLD_EV_PROXY_OP;
        d.parent = op;
        d.body.proxy_op.pid = pid;
        d.body.proxy_op.channel = (uint8_t)c;
        d.body.proxy_op.peer = 1;
        d.body.proxy_op.n_steps = steps;
        d.body.proxy_op.is_send = s == 0;
        TIMED(K_POP_START, p->start_event(ctx, s == 0 ? &ps : &pr, &d));
      }
      for (int i = 0; i < steps; i++) {
        for (int s = 0; s < 2; s++) {
          void* st = NULL;
          memset(&d, 0, sizeof d);
          d.type = CCLD_EV_PROXY_STEP;
          d.parent = s == 0 ? ps : pr;
          d.body.proxy_step.step = i;
          union ccld_state_args a = {.proxy_step = {.trans_size = 1 << 19}};
          TIMED(K_STEP_START, p->start_event(ctx, &st, &d));
          if (s == 0) {
            TIMED(K_STEP_STATE, p->record_event_state(st, CCLD_ST_STEP_SEND_GPU_WAIT, &a));
            TIMED(K_STEP_STATE, p->record_event_state(st, CCLD_ST_STEP_SEND_PEER_WAIT, &a));
            TIMED(K_STEP_STATE, p->record_event_state(st, CCLD_ST_STEP_SEND_WAIT, &a));
          } else {
            TIMED(K_STEP_STATE, p->record_event_state(st, CCLD_ST_STEP_RECV_WAIT, &a));
            TIMED(K_STEP_STATE, p->record_event_state(st, CCLD_ST_STEP_RECV_FLUSH_WAIT, &a));
            TIMED(K_STEP_STATE, p->record_event_state(st, CCLD_ST_STEP_RECV_GPU_WAIT, &a));
          }
          TIMED(K_STEP_STOP, p->stop_event(st));
        }
      }
      union ccld_state_args a = {.kernel_ch = {.gpu_time_ns = mono()}};
      TIMED(K_KCH_STOP, p->record_event_state(kch, CCLD_ST_KERNEL_CH_STOP, &a));
      TIMED(K_KCH_STOP, p->stop_event(kch));
      TIMED(K_POP_STOP, p->stop_event(ps));
      TIMED(K_POP_STOP, p->stop_event(pr));
    }
    ops++;
    /* pace: the next op starts when the events so far are due */
    uint64_t due = start + (uint64_t)(events * ns_per_event);
    while (mono() < due) {
      uint64_t left = due - mono();
      if (left > 200000) {
        struct timespec ts = {0, (long)(left - 100000)};
        nanosleep(&ts, NULL);
      }
    }
  }
  double elapsed = (mono() - start) / 1e9;
  p->finalize(ctx);
  FILE* f = fopen(argv[4], "w");
  if (!f) return 1;
  fprintf(f, "{\"events\": %llu, \"ops\": %llu, \"seconds\": %.3f, \"events_per_s\": %.0f, \"clock_cost_ns\": %llu, "
          "\"calls\": {", (unsigned long long)events, (unsigned long long)ops, elapsed, events / elapsed,
          (unsigned long long)clock_cost);
  size_t total = 0;
  for (int k = 0; k < K_KINDS; k++) total += n_samples[k];
  uint32_t* all = malloc(sizeof(uint32_t) * (total ? total : 1));
  size_t pos = 0;
  for (int k = 0; k < K_KINDS; k++) {
    size_t n = n_samples[k];
    memcpy(all + pos, samples[k], n * sizeof(uint32_t));
    pos += n;
    qsort(samples[k], n, sizeof(uint32_t), cmp);
    fprintf(f, "%s\"%s\": {\"n\": %zu, \"median_ns\": %u, \"p99_ns\": %u}", k ? ", " : "", NAMES[k], n,
            n ? samples[k][n / 2] : 0, n ? samples[k][(size_t)(n * 0.99)] : 0);
  }
  qsort(all, total, sizeof(uint32_t), cmp);
  double sum = 0;
  for (size_t i = 0; i < total; i++) sum += all[i];
  fprintf(f, "}, \"all\": {\"n\": %zu, \"median_ns\": %u, \"p99_ns\": %u, \"mean_ns\": %.1f, \"per_op_ns\": %.0f}}\n",
          total, total ? all[total / 2] : 0, total ? all[(size_t)(total * 0.99)] : 0, total ? sum / total : 0.0,
          ops ? sum / ops : 0.0);
  fclose(f);
  return 0;
}
