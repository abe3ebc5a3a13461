// CCL-D stream-ordered marker kernels for collectives we cannot modify (NCCL under PyTorch).
//
// Launch ccld_marker_enter before and ccld_marker_exit after the collective on the same stream.
// The pair is one "kernel" to the probe: the enter begins it (Trace ID, GPU time), the exit ends
// it. On the host, "enqueued but kernel_index not advanced" means the GPU has not reached the
// collective (busy before it); "begun, not done" means inside; "done" means finished.
#include "ccld_probe.cuh"

extern "C" __global__ void ccld_marker_enter(ccld_frame* frame, ccld_probe_dev* dev, ccld_u64 trace_lo,
                                             ccld_u64 trace_hi) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  ccld_trace_id t;
  t.lo = trace_lo;
  t.hi = trace_hi;
  ccld_probe_begin(frame, dev, t, 0u, 0u);
}

extern "C" __global__ void ccld_marker_exit(ccld_frame* frame, ccld_probe_dev* dev) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  ccld_probe_chan c = ccld_probe_resume(frame, dev, 0u, 0u);
  ccld_probe_end(c, 1u);
}
