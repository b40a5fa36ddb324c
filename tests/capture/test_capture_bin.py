"""The binary launch form (MINE_CAPTURE_FORMAT=bin): the capture side on CPU, against the decoder.

record.c (both record forms), writer.c and alloc.c (host pointees, learnt per function) are
compiled into a C harness with fake layout entries and fake launches: kernelParams and packed
`extra` launches, launch attributes, graph captures, a host-pointer word (cuBLASLt's alpha/beta
pointer mode) among device-looking words. The same launches are written once as compact JSON
(the JSON path classifies host pointees at every launch) and once as launches.bin; decoding the
binary file with `vocab.binfmt` must give exactly the JSON records. Also: many threads under
the mmap writer, and SIGKILL in the middle of them (every record the reader keeps is whole, seqs
increase). The CUPTI dispatch needs a GPU and is covered by tests/capture/test_capture_gpu.py.
`-s` prints bytes per record and ns per record of the JSON compact form and the binary form.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import c_harness
from vocab import binfmt
from paths import FIXTURES

HARNESS = c_harness.PRELUDE + r"""
mc_driver_t mc_drv;
atomic_uint mc_free_epoch, mc_alloc_epoch;
void mc_note_error(int fn, int code, int fatal) { (void)fn; (void)code; if (fatal) mc_disable("fatal"); }
int mc_tid(void) { return 7; }
int mc_ctx_device(CUcontext c) { (void)c; return 0; }
uint64_t mc_now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }
int64_t mc_tmap_find(const unsigned char *p) { (void)p; return -1; }

#define NF 8
static mc_entry_t ents[NF];
static double alpha_beta[2] = {1.5, -0.25};   /* a host pointee, as cuBLASLt's pointer mode */

/* function k: k params; sizes 8/4/16/24; function 3 has a host-pointer word at param 1,
 * function 6 is launched through a packed extra buffer, function 7 has no layout (extra only) */
static const unsigned sizes[NF][8] = {{8}, {8, 4}, {8, 8, 4}, {8, 8, 8, 4}, {16, 8, 4, 8}, {24, 8, 8, 4, 4},
                                      {8, 8, 8, 4, 4, 8}, {0}};
static const int nps[NF] = {1, 2, 3, 4, 4, 5, 6, -1};
static mc_entry_t make_entry(int k) {
  mc_entry_t e; memset(&e, 0, sizeof e);
  e.handle = (void *)(uintptr_t)(0x5000 + 16 * k); e.ctx = (CUcontext)0xc0; e.func = (CUfunction)e.handle;
  e.is_kernel = 1; e.record = 1; e.nparams = nps[k]; e.layout_src = nps[k] < 0 ? "none" : "kernel";
  if (nps[k] > 0) {
    e.off = calloc(nps[k], 4); e.size = calloc(nps[k], 4);
    unsigned off = 0;
    for (int i = 0; i < nps[k]; i++) {
      unsigned s = sizes[k][i], a = s >= 8 ? 8 : s;
      off = (off + a - 1) / a * a; e.off[i] = off; e.size[i] = s; off += s;
    }
  }
  char sym[64]; snprintf(sym, sizeof sym, "_Z%dkern", k);
  e.symbol = strdup(sym);
  jb_t b = {0};
  jb_lit(&b, ",\"handle\":\"kernel\",\"func\":"); jb_ptr(&b, (uintptr_t)e.func);
  jb_lit(&b, ",\"module\":1,\"sha256\":null,\"symbol\":"); jb_str(&b, e.symbol);
  jb_lit(&b, ",\"name\":\"kern\",\"attrs\":{\"regs\":32}");
  e.frag = b.p; e.frag_n = b.n;
  return e;
}

static int bin;
static __thread unsigned char pbytes[8][32], xbuf[256];
static __thread void *kp[8];
static int64_t launch(const mc_entry_t *e, int k, long t, long i) {
  void **use_kp = kp, **extra = NULL;
  size_t xsize = 0;
  void *xargs[5] = {CU_LAUNCH_PARAM_BUFFER_POINTER, xbuf, CU_LAUNCH_PARAM_BUFFER_SIZE, &xsize, CU_LAUNCH_PARAM_END};
  for (int p = 0; p < 8; p++) {
    uint64_t v = 0x600000000000ull + (uint64_t)(t * 1000003 + i * 97 + p) * 256;  /* unmapped here */
    memcpy(pbytes[p], &v, 8); memset(pbytes[p] + 8, (int)(i + p), 24);
    kp[p] = pbytes[p];
  }
  if (k == 3) { uint64_t h = (uintptr_t)alpha_beta; memcpy(pbytes[1], &h, 8); }
  if (k == 4) { uint64_t s = (uint64_t)i * 3; memcpy(pbytes[0] + 8, &s, 8); } /* a struct by value */
  if (k == 6 || k == 7) {
    use_kp = NULL; extra = xargs;
    xsize = k == 6 ? ((i / 8) % 2 ? 36 : 40) : 24;       /* 36: the last param lies outside */
    for (size_t b = 0; b < sizeof xbuf; b++) xbuf[b] = (unsigned char)(b * 3 + i);
  }
  CUlaunchAttribute at[3];
  memset(at, 0, sizeof at);
  at[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; at[0].value.clusterDim.x = 2; at[0].value.clusterDim.y = 1; at[0].value.clusterDim.z = 1;
  at[1].id = CU_LAUNCH_ATTRIBUTE_PRIORITY; at[1].value.priority = -1;
  at[2].id = (CUlaunchAttributeID)99; at[2].value.pad[0] = 7; at[2].value.pad[63] = 9;
  CUlaunchConfig cfg; memset(&cfg, 0, sizeof cfg);
  cfg.attrs = at; cfg.numAttrs = 3;
  mc_launch_t L = {.t_ns = 1000 + (uint64_t)i, .tid = 7, .ctx = (CUcontext)0xc0, .stream = (CUstream)0x1234,
                   .api = k == 5 ? 2 : 0, .result = (int)(i % 11 == 0), .in_graph = (int)(i % 3 == 0),
                   .graph = (CUgraph)0x99, .capid = 5, .grid = {(unsigned)i % 64 + 1, 2, 1}, .block = {128, 1, 1},
                   .smem = (unsigned)(i % 5) * 1024, .cfg = k == 5 ? &cfg : NULL, .kp = use_kp, .extra = extra};
  if (k == 2 && (i / 8) % 2) L.kp = NULL;                  /* no parameter bytes at all */
  int64_t fn = mc_fn_id(e);
  if (bin) return mc_record_bin(&L, e, (uint32_t)fn);
  jb_t *b = jb_thread();
  if (!b) return -1;
  mc_launch_json(b, &L, e, fn);
  return mc_write_record(MC_F_LAUNCHES, b, 1);
}

static long per_thread;
static int bench_k0 = 3;
static void bench_one(long i) { int k = bench_k0 + (int)(i % 3); launch(&ents[k], k, 0, i); }
static void *worker(void *arg) {
  long t = (long)arg;
  for (long i = 0; i < per_thread; i++) launch(&ents[(i + t) % NF], (int)((i + t) % NF), t, i);
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argv[1];
  snprintf(mc_knobs.dir, sizeof mc_knobs.dir, "%s", argv[2]);
  bin = atoi(argv[3]);
  long n = atol(argv[4]);
  const char *w = getenv("MINE_CAPTURE_WRITER");
  mc_knobs.writer_write = !(w && strcmp(w, "mmap") == 0);
  mc_knobs.compact = 1; mc_knobs.bin = bin; mc_knobs.host_bytes = 16;
  mc_knobs.no_classify = bin;   /* JSON: host pointees at every launch (device lookups fail here) */
  mc_pid = getpid();
  for (int k = 0; k < NF; k++) ents[k] = make_entry(k);
  if (mc_files_open() != 0) { printf("{\"open\":\"failed\"}\n"); return 0; }
  if (strcmp(mode, "records") == 0) {
    for (long i = 0; i < n; i++) launch(&ents[i % NF], (int)(i % NF), 0, i);
  } else if (strcmp(mode, "bench") == 0 || strcmp(mode, "bench_nohost") == 0) {   /* records 3 us apart */
    if (mode[5]) bench_k0 = 4;            /* functions 4-6: no host pointee */
    bench_spaced(bench_one, n);
    return 0;
  } else if (strcmp(mode, "threads") == 0 || strcmp(mode, "kill") == 0) {
    per_thread = n;
    if (strcmp(mode, "kill") == 0) { printf("{\"pid\":%d}\n", mc_pid); fflush(stdout); }
    run_threads_of(worker, 8);
  }
  mc_files_finalize();
  printf("{\"pid\":%d,\"off\":%d,\"functions\":%llu}\n", mc_pid, atomic_load(&mc_off),
         (unsigned long long)mc_cnt.functions);
  return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return c_harness.build(tmp_path_factory.mktemp("bin"), HARNESS, "record.c", "writer.c", "room.c", "alloc.c")


def _run(exe, mode, out, bin_, n, writer="write"):
    env = dict(os.environ, MINE_CAPTURE_WRITER=writer)
    r = subprocess.run([str(exe), mode, str(out), str(bin_), str(n)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return json.loads(r.stdout)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().splitlines()]


def _no_aslr(rec: dict) -> dict:
    """The two forms come from two processes: the host pointer differs by address randomisation.
    Its word must equal its `addr`; both are then replaced by a placeholder."""
    for p in rec["params"]:
        for h in p.get("host", []):
            word = bytes.fromhex(p["hex"])[h["at"]:h["at"] + 8]
            assert int.from_bytes(word, "little") == int(h["addr"], 16)
            p["hex"] = p["hex"][:2 * h["at"]] + "<host>" + p["hex"][2 * h["at"] + 16:]
            h["addr"] = "<host>"
    return rec


@pytest.mark.parametrize("writer", ["write", "mmap"])
def test_binary_records_decode_to_the_json_records(harness, tmp_path, writer):
    a = _run(harness, "records", tmp_path / "json", 0, 400, writer)
    b = _run(harness, "records", tmp_path / "bin", 1, 400, writer)
    jdir, bdir = tmp_path / "json" / f"pid{a['pid']}", tmp_path / "bin" / f"pid{b['pid']}"
    assert not (bdir / "launches.jsonl").exists() and (bdir / "launches.bin").is_file()
    want = _lines(jdir / "launches.jsonl")
    got = binfmt.decode_records(bdir)
    assert len(want) == len(got) == 400
    for w, g in zip(want, got):
        assert _no_aslr(g) == _no_aslr(w), (w, g)
    # what the fake launches were built to exercise is really there
    assert any(p.get("host") for r in want for p in r["params"])               # alpha/beta pointee
    assert any(r["packing"] == "extra" for r in want) and any("extra_hex" in r for r in want)
    assert any(p["hex"] == "" for r in want for p in r["params"])
    assert any(r["launch_attrs"].get("attr_99") for r in want) and any(r["graph"] for r in want)
    assert _lines(jdir / "functions.jsonl") == _lines(bdir / "functions.jsonl")


def test_host_words_are_learnt_per_function(harness, tmp_path):
    b = _run(harness, "records", tmp_path, 1, 200)
    recs = binfmt.decode_records(tmp_path / f"pid{b['pid']}")
    host = [r for r in recs if any(p.get("host") for p in r["params"])]
    assert len(host) == 25 and all(r["fn"] == 3 for r in host)   # every launch of function 3, no other
    p = host[-1]["params"][1]["host"][0]
    assert p["at"] == 0 and bytes.fromhex(p["hex"]) == bytes.fromhex("000000000000f83f000000000000d0bf")


@pytest.mark.parametrize("writer", ["write", "mmap"])
def test_threads_give_every_record_in_seq_order(harness, tmp_path, writer):
    r = _run(harness, "threads", tmp_path, 1, 5000, writer)
    scan = binfmt.scan(tmp_path / f"pid{r['pid']}" / "launches.bin")
    assert r["off"] == 0 and scan.damaged == 0
    assert scan.seq.tolist() == list(range(8 * 5000))


def test_sigkill_leaves_whole_records(harness, tmp_path):
    env = dict(os.environ, MINE_CAPTURE_WRITER="mmap")
    p = subprocess.Popen([str(harness), "kill", str(tmp_path), "1", "100000000"], env=env, stdout=subprocess.PIPE,
                         text=True)
    pid = json.loads(p.stdout.readline())["pid"]
    f = tmp_path / f"pid{pid}" / "launches.bin"
    deadline = time.time() + 30
    while (not f.exists() or f.stat().st_size < 4 << 20) and time.time() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    p.wait()
    scan = binfmt.scan(f)
    seq = scan.seq.tolist()
    assert len(seq) > 1000 and seq == sorted(set(seq))
    assert scan.damaged <= 8                            # at most one record in flight per thread
    assert len(seq) + scan.damaged >= seq[-1] + 1 - 8   # nothing else lost before the last record
    recs = binfmt.decode_records(f.parent)
    assert len(recs) == len(seq) and all(r["params"] is not None for r in recs)


def _sizes(harness, tmp_path) -> dict:
    out = {}
    for bin_ in (0, 1):
        name = "bin" if bin_ else "json_compact"
        r = _run(harness, "records", tmp_path / f"s{bin_}", bin_, 1200)
        f = tmp_path / f"s{bin_}" / f"pid{r['pid']}" / ("launches.bin" if bin_ else "launches.jsonl")
        out[f"{name}_bytes"] = f.stat().st_size / 1200
    return out


def test_record_sizes(harness, tmp_path):
    out = _sizes(harness, tmp_path)
    assert out["bin_bytes"] < out["json_compact_bytes"]


@pytest.mark.slow
def test_record_sizes_and_cost(harness, tmp_path):
    """A measurement for docs/benchmarks.md (`pytest -s -m slow ... -k cost`), not a timing assertion."""
    out = _sizes(harness, tmp_path)
    for bin_ in (0, 1):
        name = "bin" if bin_ else "json_compact"
        for writer in ("write", "mmap"):
            for mode in ("bench", "bench_nohost"):
                out[f"{name}_{writer}_{mode[6:] or 'host'}_ns"] = min(
                    _run(harness, mode, tmp_path / f"b{bin_}{writer}{mode}{i}", bin_, 50000, writer)["ns_per_record"]
                    for i in range(3))
    print("\nbytes per record and ns per record (built + written, one thread, records 3 us apart;"
          "\n_host: functions 3-5, one in three reads a host pointee; _nohost: functions 4-6):")
    for k, v in out.items():
        print(f"  {k}: {v:.1f}")
    assert out["bin_bytes"] < out["json_compact_bytes"]


# ------------------------------------------------------------------ the real probe, binary form
def test_real_probe_capture_matches_what_was_launched(tmp_path):
    """The H200 capture of examples/capture_probe in the binary form (tests/gpu_results/run_gpu_bin.sh):
    every launch the probe made (its own truth file) is one recorded launch, byte for byte, and
    every pointer word the probe knows is classified offline at its allocation's base + offset."""
    import tarfile

    from mining.load import load_dump

    fix = FIXTURES / "capture"
    with tarfile.open(fix / "probe_bin.tar.xz") as t:
        t.extractall(tmp_path)
    with tarfile.open(fix / "truth_bin.tar.xz") as t:
        truth = json.load(t.extractfile("probe_bin_truth.json"))
        child = json.load(t.extractfile("probe_bin_truth.json.child.json"))
    for who in (truth, child):
        d = tmp_path / f"pid{who['pid']}"
        fns = {f["fn"]: f for f in _lines(d / "functions.jsonl")}
        recs = binfmt.decode_records(d)
        params = load_dump(d, cache=False).params
        ptr = params[params["is_ptr"]]
        words = {(int(s), int(i), int(a)): (int(b), int(o))
                 for s, i, a, b, o in zip(ptr["seq"], ptr["i"], ptr["at"], ptr["alloc_base"], ptr["ptr_off"])}
        pool = [(fns[r["fn"]]["symbol"], [p["hex"] for p in r["params"]], r) for r in recs]
        for t in who["launches"]:
            hexes = [p["hex"] for p in t["params"]]
            hit = next((x for x in pool if x[0] == t["symbol"] and x[1] == hexes), None)
            assert hit is not None, (t["tag"], t["symbol"])
            pool.remove(hit)
            r = hit[2]
            assert r["packing"] == t["packing"] and (r["graph"] is not None) == t["graph"], t["tag"]
            for i, tp in enumerate(t["params"]):
                for w in tp.get("ptrs", []):
                    assert words[(r["seq"], i, w["at"])] == (int(w["base"], 16), w["off"]), (t["tag"], w)
                for h in tp.get("host", []):
                    got = {x["at"]: x for x in r["params"][i].get("host", [])}
                    assert got[h["at"]]["hex"] == h["hex"], t["tag"]
        assert pool == [], [x[0] for x in pool]
    # the graph built by hand: its kernel node is the record a graphs.jsonl kernel_node event names
    d = tmp_path / f"pid{truth['pid']}"
    node = [g for g in _lines(d / "graphs.jsonl") if g["event"] == "kernel_node"]
    rec = {r["seq"]: r for r in binfmt.decode_records(d)}[node[0]["seq"]]
    assert len(node) == 1 and rec["api"] == node[0]["api"] == "cuGraphAddKernelNode_v2"
    assert rec["graph"] == {"graph": node[0]["graph"], "capture_id": 0}
