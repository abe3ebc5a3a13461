/* Prints the offsets and sizes of the profiler interface fields the plugin reads, as JSON.
 *
 * Built twice: with -DCCLD_SIDE against probe/nccl/ccld_nccl_abi.h (what the plugin assumes), and
 * with -DNCCL_SIDE against NCCL's own profiler headers (what NCCL lays out; -I <nccl>/plugins/
 * profiler/example/nccl). The two outputs must be equal: tests/unit/probe/test_nccl_abi.py compares
 * the first with probe/nccl/nccl_abi_offsets.json, the second's output as measured from NCCL's source.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#if defined(NCCL_SIDE)
#include <stdint.h>
#include <stdlib.h>
typedef int ncclResult_t;
#include "profiler.h"
#define D4 ncclProfilerEventDescr_v4_t
#define D5 ncclProfilerEventDescr_v5_t
#define D6 ncclProfilerEventDescr_v6_t
#define A5 ncclProfilerEventStateArgs_v5_t
#define P4 ncclProfiler_v4_t
#define P5 ncclProfiler_v5_t
#define P6 ncclProfiler_v6_t
#define F_COLL coll
#define F_P2P p2p
#define F_POP proxyOp
#define F_PSTEP proxyStep
#define F_KCH kernelCh
#define F(v, side_nccl, side_ccld) side_nccl
#else
#include "ccld_nccl_abi.h"
#define D4 struct ccld_descr_v4
#define D5 struct ccld_descr_v5
#define D6 struct ccld_descr_v5
#define A5 union ccld_state_args
#define P4 ccld_profiler_v4_t
#define P5 ccld_profiler_v5_t
#define P6 ccld_profiler_v5_t
#define F(v, side_nccl, side_ccld) side_ccld
#endif

static int first = 1;
static void out(const char* key, size_t value) {
  printf("%s\n  \"%s\": %zu", first ? "{" : ",", key, value);
  first = 0;
}

#define OFF(name, type, nccl_member, ccld_member) out(name, offsetof(type, F(0, nccl_member, ccld_member)))

#define DESCR(tag, T)                                                                                   \
  OFF(tag ".type", T, type, type);                                                                     \
  OFF(tag ".parent", T, parentObj, parent);                                                            \
  OFF(tag ".rank", T, rank, rank);                                                                     \
  OFF(tag ".coll.seq_number", T, coll.seqNumber, body.coll.seq_number);                                \
  OFF(tag ".coll.func", T, coll.func, body.coll.func);                                                 \
  OFF(tag ".coll.count", T, coll.count, body.coll.count);                                              \
  OFF(tag ".coll.root", T, coll.root, body.coll.root);                                                 \
  OFF(tag ".coll.datatype", T, coll.datatype, body.coll.datatype);                                     \
  OFF(tag ".coll.n_channels", T, coll.nChannels, body.coll.n_channels);                                \
  OFF(tag ".p2p.func", T, p2p.func, body.p2p.func);                                                    \
  OFF(tag ".p2p.datatype", T, p2p.datatype, body.p2p.datatype);                                        \
  OFF(tag ".p2p.count", T, p2p.count, body.p2p.count);                                                 \
  OFF(tag ".p2p.peer", T, p2p.peer, body.p2p.peer);                                                    \
  OFF(tag ".p2p.n_channels", T, p2p.nChannels, body.p2p.n_channels);                                   \
  OFF(tag ".proxy_op.pid", T, proxyOp.pid, body.proxy_op.pid);                                         \
  OFF(tag ".proxy_op.channel", T, proxyOp.channelId, body.proxy_op.channel);                           \
  OFF(tag ".proxy_op.peer", T, proxyOp.peer, body.proxy_op.peer);                                      \
  OFF(tag ".proxy_op.n_steps", T, proxyOp.nSteps, body.proxy_op.n_steps);                              \
  OFF(tag ".proxy_op.is_send", T, proxyOp.isSend, body.proxy_op.is_send);                              \
  OFF(tag ".proxy_step.step", T, proxyStep.step, body.proxy_step.step);                                \
  OFF(tag ".kernel_ch.channel", T, kernelCh.channelId, body.kernel_ch.channel);                        \
  OFF(tag ".kernel_ch.gpu_time_ns", T, kernelCh.pTimer, body.kernel_ch.gpu_time_ns);                   \
  out(tag ".sizeof_type", sizeof(((T*)0)->type))

#define PLUGIN(tag, T)                                                                                  \
  OFF(tag ".name", T, name, name);                                                                     \
  OFF(tag ".init", T, init, init);                                                                     \
  OFF(tag ".start_event", T, startEvent, start_event);                                                 \
  OFF(tag ".stop_event", T, stopEvent, stop_event);                                                    \
  OFF(tag ".record_event_state", T, recordEventState, record_event_state);                             \
  OFF(tag ".finalize", T, finalize, finalize);                                                         \
  out(tag ".sizeof", sizeof(T))

int main(void) {
  DESCR("descr_v4", D4);
  DESCR("descr_v5", D5);
  DESCR("descr_v6", D6);
  OFF("state_args.kernel_ch.gpu_time_ns", A5, kernelCh.pTimer, kernel_ch.gpu_time_ns);
  OFF("state_args.proxy_step.trans_size", A5, proxyStep.transSize, proxy_step.trans_size);
  out("state_args.sizeof", sizeof(A5));
  PLUGIN("profiler_v4", P4);
  PLUGIN("profiler_v5", P5);
  PLUGIN("profiler_v6", P6);
  printf("\n}\n");
  return 0;
}
