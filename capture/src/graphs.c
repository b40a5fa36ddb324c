/* graphs.c: stream captures in flight and the graph lifecycle (graphs.jsonl).
 *
 * A stream capture is remembered from its begin to its end so that capture_end can name the
 * first and last launch recorded inside it (launch.c reports them through
 * mc_capture_note_launch). Replays (cuGraphLaunch) make no kernel-launch callbacks; analysis
 * attributes a replay to the launches captured into the graph its exec came from, through the
 * instantiate and launch events written here. */
#include "mc.h"

#include <pthread.h>
#include <stdlib.h>

#define NCAP 256
typedef struct { CUstream stream; uint64_t id; int64_t first, last; int active; } capture_t;
static capture_t caps[NCAP];
static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;

void mc_capture_note_launch(uint64_t id, int64_t seq) {
  MC_LOCK(&cap_lock);
  for (int i = 0; i < NCAP; i++)
    if (caps[i].active && caps[i].id == id) {
      if (caps[i].first < 0) caps[i].first = seq;
      caps[i].last = seq;
    }
  MC_UNLOCK(&cap_lock);
}

/* One graphs.jsonl event: `has` says which fields it carries (G_*), in this order. */
enum { G_STREAM = 1, G_GRAPH = 2, G_EXEC = 4, G_NODE = 8, G_CAPID = 16, G_SEQS = 32, G_NODES = 64, G_SEQ = 128,
       G_TYPES = 256 };
enum { T_KERNEL, T_MEMCPY, T_MEMSET, T_OTHER, T_COUNT };
static const char *const type_key[T_COUNT] = {"kernel", "memcpy", "memset", "other"};
typedef struct {
  const char *event, *api;   /* api: NULL for none */
  unsigned has;
  CUstream stream; CUgraph graph; CUgraphExec exec; CUgraphNode node;
  uint64_t capid;
  int64_t first, last;       /* G_SEQS: -1 is null */
  size_t nodes;
  size_t types[T_COUNT];     /* G_TYPES: the captured graph's nodes by type */
  int64_t seq;
} gline_t;

static void graph_line(const gline_t *g) {
  jb_t *b = jb_thread();
  if (!b) return;
  jb_lit(b, "\"event\":"); jb_str(b, g->event);
  jb_lit(b, ",\"t_ns\":"); jb_u64(b, mc_now_ns());
  jb_lit(b, ",\"tid\":"); jb_u64(b, (uint64_t)mc_tid());
  if (g->api) { jb_lit(b, ",\"api\":"); jb_str(b, g->api); }
  if (g->has & G_STREAM) { jb_lit(b, ",\"stream\":"); jb_ptr(b, (uintptr_t)g->stream); }
  if (g->has & G_GRAPH) { jb_lit(b, ",\"graph\":"); jb_ptr(b, (uintptr_t)g->graph); }
  if (g->has & G_EXEC) { jb_lit(b, ",\"exec\":"); jb_ptr(b, (uintptr_t)g->exec); }
  if (g->has & G_NODE) { jb_lit(b, ",\"node\":"); jb_ptr(b, (uintptr_t)g->node); }
  if (g->has & G_CAPID) { jb_lit(b, ",\"capture_id\":"); jb_u64(b, g->capid); }
  if (g->has & G_SEQS) {
    jb_lit(b, ",\"seq_first\":"); if (g->first >= 0) jb_i64(b, g->first); else jb_lit(b, "null");
    jb_lit(b, ",\"seq_last\":"); if (g->last >= 0) jb_i64(b, g->last); else jb_lit(b, "null");
  }
  if (g->has & G_NODES) { jb_lit(b, ",\"nodes\":"); jb_u64(b, g->nodes); }
  if (g->has & G_TYPES) {
    jb_lit(b, ",\"node_types\":{");
    for (int i = 0; i < T_COUNT; i++) {
      if (i) jb_lit(b, ",");
      jb_str(b, type_key[i]); jb_lit(b, ":"); jb_u64(b, g->types[i]);
    }
    jb_lit(b, "}");
  }
  if (g->has & G_SEQ) { jb_lit(b, ",\"seq\":"); jb_i64(b, g->seq); }
  mc_write_record(MC_F_GRAPHS, b, 0);
}

void mc_graph_line_kernel_node(const char *api, CUgraph graph, CUgraphExec exec, CUgraphNode node, int64_t seq) {
  graph_line(&(gline_t){.event = "kernel_node", .api = api, .graph = graph, .exec = exec, .node = node, .seq = seq,
                        .has = (graph ? G_GRAPH : 0) | (exec ? G_EXEC : 0) | G_NODE | G_SEQ});
}

static void capture_begin(const mc_cb_t *row, const CUpti_CallbackData *d) {
  if (mc_cb_result(d) != CUDA_SUCCESS) return;
  CUstream s = mc_cb_stream(row, *(CUstream const *)d->functionParams); /* hStream comes first */
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph g = NULL;
  if (MC_CU(cuStreamGetCaptureInfo, s, &st, &id, &g, NULL, NULL, NULL) != CUDA_SUCCESS) return;
  MC_LOCK(&cap_lock);
  for (int i = 0; i < NCAP; i++)
    if (!caps[i].active) {
      caps[i] = (capture_t){.stream = s, .id = id, .first = -1, .last = -1, .active = 1};
      break;
    }
  MC_UNLOCK(&cap_lock);
  atomic_fetch_add(&mc_capturing, 1);
  graph_line(&(gline_t){.event = "capture_begin", .has = G_STREAM | G_GRAPH | G_CAPID, .stream = s, .graph = g,
                        .capid = id});
}

int mc_stream_capture_ask(CUstream s, CUgraph *graph, uint64_t *capture_id) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph g = NULL;
  if (MC_CU_ANSWER(cuStreamGetCaptureInfo, s, &st, &id, &g, NULL, NULL, NULL) != CUDA_SUCCESS ||
      st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    return 0;
  *graph = g; *capture_id = (uint64_t)id;
  return 1;
}

/* The captured graph's nodes by type (G_TYPES). Why: a stream capture records a kernel node for
 * every launch the library sees, but a graph also holds copies and memsets made on the captured
 * stream; `mine compile` checks that every node of a graph it replays is one it knows (a kernel
 * launch or a copies.jsonl record), so a node nobody recorded is named, not silently missing. */
static void node_types(CUgraph g, gline_t *e) {
  size_t n = e->nodes;
  if (!n || !mc_drv.cuGraphNodeGetType || n > SIZE_MAX / sizeof(CUgraphNode)) return;
  CUgraphNode *v = mc_malloc(n * sizeof *v);
  if (!v) return;
  size_t got = n;
  if (MC_CU(cuGraphGetNodes, g, v, &got) == CUDA_SUCCESS && got == n) {
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
      CUgraphNodeType t;
      if (MC_CU(cuGraphNodeGetType, v[i], &t) != CUDA_SUCCESS) { ok = 0; break; }
      e->types[t == CU_GRAPH_NODE_TYPE_KERNEL ? T_KERNEL : t == CU_GRAPH_NODE_TYPE_MEMCPY ? T_MEMCPY
               : t == CU_GRAPH_NODE_TYPE_MEMSET ? T_MEMSET : T_OTHER]++;
    }
    if (ok) e->has |= G_TYPES;
  }
  free(v);
}

static void capture_end(const mc_cb_t *row, const CUpti_CallbackData *d) {
  const cuStreamEndCapture_params *p = d->functionParams;
  CUstream s = mc_cb_stream(row, p->hStream);
  CUgraph g = (mc_cb_result(d) == CUDA_SUCCESS && p->phGraph) ? *p->phGraph : NULL;
  capture_t c = {0};
  int found = 0;
  MC_LOCK(&cap_lock);
  for (int i = 0; i < NCAP && !found; i++)
    if (caps[i].active && caps[i].stream == s) { c = caps[i]; caps[i].active = 0; found = 1; }
  MC_UNLOCK(&cap_lock);
  if (!found) return;
  atomic_fetch_sub(&mc_capturing, 1);
  gline_t e = {.event = "capture_end", .has = G_STREAM | G_GRAPH | G_CAPID | G_SEQS, .stream = s, .graph = g,
               .capid = c.id, .first = c.first, .last = c.last};
  if (g && MC_CU(cuGraphGetNodes, g, NULL, &e.nodes) == CUDA_SUCCESS) {
    e.has |= G_NODES;
    node_types(g, &e);
  }
  graph_line(&e);
}

void mc_on_graph(const mc_cb_t *row, const CUpti_CallbackData *d) {
  if (!d->functionParams) return;
  switch (row->kind) {
  case MC_K_CAPTURE_BEGIN: capture_begin(row, d); return;
  case MC_K_CAPTURE_END: capture_end(row, d); return;
  case MC_K_INSTANTIATE: {
    if (mc_cb_result(d) != CUDA_SUCCESS) return;
    const cuGraphInstantiateWithFlags_params *p = d->functionParams; /* the kind's first two fields */
    graph_line(&(gline_t){.event = "instantiate", .has = G_GRAPH | G_EXEC, .graph = p->hGraph,
                          .exec = p->phGraphExec ? *p->phGraphExec : NULL});
    return;
  }
  case MC_K_GRAPH_LAUNCH: {
    const cuGraphLaunch_params *p = d->functionParams; /* hGraph: the exec */
    graph_line(&(gline_t){.event = "launch", .has = G_STREAM | G_EXEC, .stream = mc_cb_stream(row, p->hStream),
                          .exec = (CUgraphExec)p->hGraph});
    return;
  }
  case MC_K_EXEC_DESTROY:
    graph_line(&(gline_t){.event = "exec_destroy", .has = G_EXEC,
                          .exec = ((const cuGraphExecDestroy_params *)d->functionParams)->hGraphExec});
    return;
  case MC_K_GRAPH_DESTROY:
    graph_line(&(gline_t){.event = "graph_destroy", .has = G_GRAPH,
                          .graph = ((const cuGraphDestroy_params *)d->functionParams)->hGraph});
    return;
  }
}

void mc_graphs_reset_after_fork(void) {
  pthread_mutex_init(&cap_lock, NULL);
}
