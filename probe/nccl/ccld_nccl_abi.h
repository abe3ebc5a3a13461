/* The parts of NCCL's profiler plugin interface (versions 4, 5 and 6) that the CCL-D plugin reads.
 *
 * Written from NCCL's documented interface (plugins/profiler/README.md of NVIDIA/nccl) in our own
 * names: only the fields the plugin uses, at the offsets NCCL lays them out. NCCL's own headers are
 * not needed to build the plugin; tests/unit/probe/test_nccl_abi.py checks every offset and size
 * below against probe/nccl/nccl_abi_offsets.json, which `ccld nccl abi-offsets --nccl-src DIR`
 * measures by compiling against NCCL's headers (and which a machine with NCCL's source re-measures).
 *
 * Versions: NCCL looks for ncclProfiler_v6, then v5, v4, ... and uses the first it finds. The
 * descriptor's leading fields (type, parent, rank) and the union members read here have the same
 * offsets in v4, v5 and v6; v4's type is one byte (v5 made it 64-bit), and v4's init takes the
 * communicator hash after the name. v1-v3 (NCCL 2.23-2.25) have no per-communicator init and no
 * kernel-channel times: the plugin does not export them, and such an NCCL runs without it.
 */
#ifndef CCLD_NCCL_ABI_H
#define CCLD_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ncclResult_t is a C enum: int-sized; 0 is success (the only value this plugin returns: a failed init
 * would make NCCL unload the library under communicators it accepted before). */
typedef int ccld_nccl_result_t;
#define CCLD_NCCL_SUCCESS 0

typedef void (*ccld_nccl_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

/* event type bits (the descriptor's type; also the activation mask init returns) */
#define CCLD_EV_GROUP (1u << 0)
#define CCLD_EV_COLL (1u << 1)
#define CCLD_EV_P2P (1u << 2)
#define CCLD_EV_PROXY_OP (1u << 3)
#define CCLD_EV_PROXY_STEP (1u << 4)
#define CCLD_EV_PROXY_CTRL (1u << 5)
#define CCLD_EV_KERNEL_CH (1u << 6)
#define CCLD_EV_NET_PLUGIN (1u << 7)

/* the state transitions the plugin acts on (recordEventState) */
#define CCLD_ST_STEP_SEND_GPU_WAIT 8
#define CCLD_ST_STEP_SEND_WAIT 9
#define CCLD_ST_STEP_RECV_WAIT 10
#define CCLD_ST_STEP_RECV_FLUSH_WAIT 11
#define CCLD_ST_STEP_RECV_GPU_WAIT 12
#define CCLD_ST_STEP_SEND_PEER_WAIT 20
#define CCLD_ST_KERNEL_CH_STOP 22

/* the union members read, each at the head of the descriptor's union */
struct ccld_coll_view {
  uint64_t seq_number; /* per communicator and collective function, counted by NCCL */
  const char* func;    /* "AllReduce", "AllGather", ... */
  const void* send_buf;
  void* recv_buf;
  size_t count;
  int root;
  const char* datatype; /* "ncclFloat32", ... */
  uint8_t n_channels;
  uint8_t n_warps;
  const char* algo;
  const char* proto;
};

struct ccld_p2p_view {
  const char* func; /* "Send" or "Recv" */
  void* buf;
  const char* datatype;
  size_t count;
  int peer; /* the other rank, in the communicator */
  uint8_t n_channels;
};

struct ccld_proxy_op_view {
  pid_t pid; /* the process that posted the op: parent handles are valid only in that process */
  uint8_t channel;
  int peer;
  int n_steps;
  int chunk_size;
  int is_send;
};

struct ccld_proxy_step_view {
  int step;
};

struct ccld_kernel_ch_view {
  uint8_t channel;
  uint64_t gpu_time_ns; /* %globaltimer when the channel started */
};

union ccld_event_body {
  struct ccld_coll_view coll;
  struct ccld_p2p_view p2p;
  struct ccld_proxy_op_view proxy_op;
  struct ccld_proxy_step_view proxy_step;
  struct ccld_kernel_ch_view kernel_ch;
};

/* v4: a one-byte type */
struct ccld_descr_v4 {
  uint8_t type;
  void* parent;
  int rank;
  union ccld_event_body body;
};

/* v5 and v6: a 64-bit type; v6 only adds union members the plugin does not read */
struct ccld_descr_v5 {
  uint64_t type;
  void* parent;
  int rank;
  union ccld_event_body body;
};

union ccld_state_args {
  struct {
    size_t trans_size;
  } proxy_step;
  struct {
    int appended;
  } proxy_ctrl;
  struct {
    void* data;
  } net_plugin;
  struct {
    uint64_t gpu_time_ns; /* %globaltimer when the channel stopped */
  } kernel_ch;
};

typedef struct {
  const char* name;
  ccld_nccl_result_t (*init)(void** context, int* activation_mask, const char* comm_name, uint64_t comm_hash,
                             int n_nodes, int n_ranks, int rank, ccld_nccl_logger_t log);
  ccld_nccl_result_t (*start_event)(void* context, void** handle, struct ccld_descr_v4* descr);
  ccld_nccl_result_t (*stop_event)(void* handle);
  ccld_nccl_result_t (*record_event_state)(void* handle, int state, union ccld_state_args* args);
  ccld_nccl_result_t (*finalize)(void* context);
} ccld_profiler_v4_t;

typedef struct {
  const char* name;
  ccld_nccl_result_t (*init)(void** context, uint64_t comm_hash, int* activation_mask, const char* comm_name,
                             int n_nodes, int n_ranks, int rank, ccld_nccl_logger_t log);
  ccld_nccl_result_t (*start_event)(void* context, void** handle, struct ccld_descr_v5* descr);
  ccld_nccl_result_t (*stop_event)(void* handle);
  ccld_nccl_result_t (*record_event_state)(void* handle, int state, union ccld_state_args* args);
  ccld_nccl_result_t (*finalize)(void* context);
} ccld_profiler_v5_t; /* v6 has the same members (its descriptor only grows) */

#endif /* CCLD_NCCL_ABI_H */
