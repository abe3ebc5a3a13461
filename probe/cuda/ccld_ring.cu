// CCL-D reference instrumented collectives: ring all-reduce and all-gather (float32).
//
// R ranks run as R concurrent kernels (one stream each) on one GPU, or on several GPUs with peer
// access. Each kernel has C thread blocks, one per channel; channel c owns the contiguous range
// [n*c/C, n*(c+1)/C) of the buffer. Ranks exchange data through bounded FIFOs: rank r receives
// into nslots slots of slot_elems floats per channel, written by rank r-1. `tail` counts messages
// delivered into a FIFO (written by the sender), `head` counts messages consumed (written by the
// receiver); a sender waits while tail - head == nslots. Both are cumulative across operations,
// so a kernel learns where it stands from the flags alone. The schedule (rounds, chunks, steps)
// is mirrored in probe/ring_plan.py; the probe counts one send / one receive per message.
//
// Fault knobs (int64 array, -1 = off; indices below, mirrored by ring_plan.FAULT_FIELDS):
// delay rank r's sends, stop rank r before step s, slow the link r -> r+1 on one channel or all,
// and make rank r enter late. A stopped rank and its waiting peers spin until the host sets the
// abort flag (mapped host memory), then return without ending the probe kernel, like a hang.
#include "ccld_probe.cuh"

// BEGIN FAULTS (mirrored by ring_plan.FAULT_FIELDS; checked by tests/unit/probe)
#define CCLD_FAULT_DELAY_RANK 0
#define CCLD_FAULT_DELAY_NS 1
#define CCLD_FAULT_STOP_RANK 2
#define CCLD_FAULT_STOP_STEP 3
#define CCLD_FAULT_LINK_SRC 4
#define CCLD_FAULT_LINK_CHANNEL 5
#define CCLD_FAULT_LINK_NS 6
#define CCLD_FAULT_LATE_RANK 7
#define CCLD_FAULT_LATE_NS 8
#define CCLD_N_FAULTS 9
// END FAULTS

// u64 words per (rank, channel) flag record: tail at word 0, head at word 16 (own 128-byte lines).
#define CCLD_FLAG_STRIDE 32
#define CCLD_FLAG_HEAD 16

struct ccld_ring_ctx {
  float* my_slots;
  float* next_slots;
  volatile ccld_u64* my_tail;
  volatile ccld_u64* my_head;
  volatile ccld_u64* next_tail;
  volatile ccld_u64* next_head;
  volatile unsigned int* abort_flag;
  ccld_u64 sent;
  ccld_u64 rcvd;
  long long step;
  long long stop_step;
  long long send_delay_ns;
  int nslots;
  int slot_elems;
};

__device__ __forceinline__ int ccld_mod(int a, int m) { return ((a % m) + m) % m; }

__device__ __forceinline__ void ccld_spin_ns(long long ns) {
  if (ns <= 0) return;
  ccld_u64 t0 = ccld_globaltimer();
  while ((long long)(ccld_globaltimer() - t0) < ns) {
  }
}

// Thread 0 only: wait until *p >= v; false if the host raised the abort flag meanwhile.
__device__ __forceinline__ bool ccld_wait_geq(volatile ccld_u64* p, ccld_u64 v, volatile unsigned int* abort_flag) {
  unsigned int spins = 0;
  while (*p < v) {
    if ((++spins & 1023u) == 0u && *abort_flag != 0u) return false;
  }
  return true;
}

__device__ inline void ccld_ring_init(ccld_ring_ctx& x, float* slots, ccld_u64* flags, int rank, int nranks,
                                      int nslots, int slot_elems, const long long* faults,
                                      volatile unsigned int* abort_flag) {
  int c = blockIdx.x;
  int nch = gridDim.x;
  int next = (rank + 1) % nranks;
  size_t fifo = (size_t)nslots * (size_t)slot_elems;
  x.my_slots = slots + ((size_t)rank * nch + c) * fifo;
  x.next_slots = slots + ((size_t)next * nch + c) * fifo;
  ccld_u64* mine = flags + ((size_t)rank * nch + c) * CCLD_FLAG_STRIDE;
  ccld_u64* theirs = flags + ((size_t)next * nch + c) * CCLD_FLAG_STRIDE;
  x.my_tail = mine;
  x.my_head = mine + CCLD_FLAG_HEAD;
  x.next_tail = theirs;
  x.next_head = theirs + CCLD_FLAG_HEAD;
  x.abort_flag = abort_flag;
  // Only this rank writes next's tail and its own head, and its previous kernel is finished.
  x.sent = *x.next_tail;
  x.rcvd = *x.my_head;
  x.step = 0;
  x.nslots = nslots;
  x.slot_elems = slot_elems;
  x.stop_step = faults[CCLD_FAULT_STOP_RANK] == rank ? faults[CCLD_FAULT_STOP_STEP] : -1;
  x.send_delay_ns = 0;
  if (faults[CCLD_FAULT_DELAY_RANK] == rank) x.send_delay_ns += faults[CCLD_FAULT_DELAY_NS];
  if (faults[CCLD_FAULT_LINK_SRC] == rank &&
      (faults[CCLD_FAULT_LINK_CHANNEL] < 0 || faults[CCLD_FAULT_LINK_CHANNEL] == c))
    x.send_delay_ns += faults[CCLD_FAULT_LINK_NS];
}

// One step of the ring: optionally receive a message from prev, optionally send one to next.
// value = recv (+ src if reduce) or src; written to dst (if any) and to next's slot (if send).
// Returns false when the kernel must stop (abort raised, or this rank is the stopped one).
__device__ inline bool ccld_ring_step(ccld_ring_ctx& x, ccld_probe_chan& pc, bool recv, bool send,
                                      const float* src, float* dst, long long len, bool reduce) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    bool good = true;
    if (x.step == x.stop_step) {
      // The stopped rank hangs here until the host releases every kernel.
      while (*x.abort_flag == 0u) {
      }
      good = false;
    }
    if (good && recv) good = ccld_wait_geq(x.my_tail, x.rcvd + 1ull, x.abort_flag);
    if (good && send) {
      ccld_spin_ns(x.send_delay_ns);
      // a free slot: next has consumed all but nslots - 1 of the messages sent so far
      if (x.sent + 1ull > (ccld_u64)x.nslots)
        good = ccld_wait_geq(x.next_head, x.sent + 1ull - (ccld_u64)x.nslots, x.abort_flag);
    }
    if (good) __threadfence();
    ok = good ? 1 : 0;
  }
  __syncthreads();
  if (!ok) return false;
  const float* in = x.my_slots + (size_t)(x.rcvd % (ccld_u64)x.nslots) * x.slot_elems;
  float* out = x.next_slots + (size_t)(x.sent % (ccld_u64)x.nslots) * x.slot_elems;
  for (long long i = threadIdx.x; i < len; i += blockDim.x) {
    float v;
    if (recv) {
      v = __ldcg(in + i);
      if (reduce) v += src[i];
    } else {
      v = src[i];
    }
    if (dst != nullptr) dst[i] = v;
    if (send) out[i] = v;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    if (send) {
      *x.next_tail = x.sent + 1ull;
      ccld_probe_count_send(pc);
    }
    if (recv) {
      *x.my_head = x.rcvd + 1ull;
      ccld_probe_count_recv(pc);
    }
  }
  if (send) x.sent += 1ull;
  if (recv) x.rcvd += 1ull;
  x.step += 1;
  return true;
}

__device__ __forceinline__ void ccld_channel_range(unsigned long long n, unsigned long long* begin,
                                                   unsigned long long* len) {
  unsigned long long c = blockIdx.x, nch = gridDim.x;
  unsigned long long b = n * c / nch, e = n * (c + 1ull) / nch;
  *begin = b;
  *len = e - b;
}

__device__ __forceinline__ void ccld_late_entry(const long long* faults, int rank) {
  if (threadIdx.x == 0 && faults[CCLD_FAULT_LATE_RANK] == rank) ccld_spin_ns(faults[CCLD_FAULT_LATE_NS]);
}

// Every ring kernel starts the same way: the late-entry fault, the probe's begin (thread 0 of
// each block), and the ring context whose starting counters all threads of the block share.
__device__ __forceinline__ ccld_probe_chan ccld_ring_prologue(ccld_ring_ctx& x, float* slots, ccld_u64* flags,
                                                              int rank, int nranks, int nslots, int slot_elems,
                                                              const long long* faults,
                                                              volatile unsigned int* abort_flag, ccld_frame* frame,
                                                              ccld_probe_dev* dev, ccld_u64 trace_lo,
                                                              ccld_u64 trace_hi) {
  ccld_late_entry(faults, rank);
  ccld_probe_chan pc = ccld_probe_resume(nullptr, nullptr, 0u, 0u);
  if (threadIdx.x == 0) {
    ccld_trace_id t;
    t.lo = trace_lo;
    t.hi = trace_hi;
    pc = ccld_probe_begin(frame, dev, t, gridDim.x, blockIdx.x);
  }
  ccld_ring_init(x, slots, flags, rank, nranks, nslots, slot_elems, faults, abort_flag);
  __shared__ ccld_u64 start_sent, start_rcvd;
  if (threadIdx.x == 0) {
    start_sent = x.sent;
    start_rcvd = x.rcvd;
  }
  __syncthreads();
  x.sent = start_sent;
  x.rcvd = start_rcvd;
  return pc;
}

// In-place ring all-reduce (sum) of `n` floats of this rank's `buf`. Grid: one block per channel.
extern "C" __global__ void ccld_ring_allreduce_f32(float* buf, unsigned long long n, int rank, int nranks,
                                                   float* slots, ccld_u64* flags, int nslots, int slot_elems,
                                                   const long long* faults, volatile unsigned int* abort_flag,
                                                   ccld_frame* frame, ccld_probe_dev* dev, ccld_u64 trace_lo,
                                                   ccld_u64 trace_hi) {
  ccld_ring_ctx x;
  ccld_probe_chan pc = ccld_ring_prologue(x, slots, flags, rank, nranks, nslots, slot_elems, faults, abort_flag, frame,
                                          dev, trace_lo, trace_hi);

  unsigned long long seg, seg_len;
  ccld_channel_range(n, &seg, &seg_len);
  const unsigned long long R = (unsigned long long)nranks;
  const unsigned long long per_round = R * (unsigned long long)slot_elems;
  bool alive = true;
  for (unsigned long long base = 0; alive && base < seg_len; base += per_round) {
    unsigned long long lt = seg_len - base < per_round ? seg_len - base : per_round;
    unsigned long long cs = (lt + R - 1ull) / R;
    float* round = buf + seg + base;
#define CCLD_CHUNK_OFF(ci) ((unsigned long long)(ci) * cs)
#define CCLD_CHUNK_LEN(ci) \
  ((long long)(CCLD_CHUNK_OFF(ci) >= lt ? 0ull : (lt - CCLD_CHUNK_OFF(ci) < cs ? lt - CCLD_CHUNK_OFF(ci) : cs)))
    int ci = rank;
    alive = ccld_ring_step(x, pc, false, true, round + CCLD_CHUNK_OFF(ci), nullptr, CCLD_CHUNK_LEN(ci), false);
    for (int j = 1; alive && j <= nranks - 2; ++j) {
      ci = ccld_mod(rank - j, nranks);
      alive = ccld_ring_step(x, pc, true, true, round + CCLD_CHUNK_OFF(ci), nullptr, CCLD_CHUNK_LEN(ci), true);
    }
    if (alive) {
      ci = ccld_mod(rank + 1, nranks);
      float* p = round + CCLD_CHUNK_OFF(ci);
      alive = ccld_ring_step(x, pc, true, true, p, p, CCLD_CHUNK_LEN(ci), true);
    }
    for (int j = 1; alive && j <= nranks - 2; ++j) {
      ci = ccld_mod(rank + 1 - j, nranks);
      alive = ccld_ring_step(x, pc, true, true, nullptr, round + CCLD_CHUNK_OFF(ci), CCLD_CHUNK_LEN(ci), false);
    }
    if (alive) {
      ci = ccld_mod(rank + 2 - nranks, nranks);
      alive = ccld_ring_step(x, pc, true, false, nullptr, round + CCLD_CHUNK_OFF(ci), CCLD_CHUNK_LEN(ci), false);
    }
#undef CCLD_CHUNK_LEN
#undef CCLD_CHUNK_OFF
  }
  if (alive && threadIdx.x == 0) ccld_probe_end(pc, gridDim.x);
}

// Ring all-gather of `n` floats per rank: out[q*n + i] = in_q[i] for every rank q.
extern "C" __global__ void ccld_ring_allgather_f32(const float* in, float* out, unsigned long long n, int rank,
                                                   int nranks, float* slots, ccld_u64* flags, int nslots,
                                                   int slot_elems, const long long* faults,
                                                   volatile unsigned int* abort_flag, ccld_frame* frame,
                                                   ccld_probe_dev* dev, ccld_u64 trace_lo, ccld_u64 trace_hi) {
  ccld_ring_ctx x;
  ccld_probe_chan pc = ccld_ring_prologue(x, slots, flags, rank, nranks, nslots, slot_elems, faults, abort_flag, frame,
                                          dev, trace_lo, trace_hi);

  unsigned long long seg, seg_len;
  ccld_channel_range(n, &seg, &seg_len);
  const unsigned long long P = (unsigned long long)slot_elems;
  bool alive = true;
  for (unsigned long long base = 0; alive && base < seg_len; base += P) {
    long long len = (long long)(seg_len - base < P ? seg_len - base : P);
    unsigned long long off = seg + base;
    alive = ccld_ring_step(x, pc, false, true, in + off, out + (unsigned long long)rank * n + off, len, false);
    for (int j = 1; alive && j <= nranks - 2; ++j) {
      int origin = ccld_mod(rank - j, nranks);
      alive = ccld_ring_step(x, pc, true, true, nullptr, out + (unsigned long long)origin * n + off, len, false);
    }
    if (alive) {
      int origin = ccld_mod(rank + 1, nranks);
      alive = ccld_ring_step(x, pc, true, false, nullptr, out + (unsigned long long)origin * n + off, len, false);
    }
  }
  if (alive && threadIdx.x == 0) ccld_probe_end(pc, gridDim.x);
}
