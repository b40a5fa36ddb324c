"""The compact dump form (MINE_CAPTURE_COMPACT=1): capture side on CPU, and the loader.

Capture: record.c (launch and function record formatting, the function-id registry) is compiled
with writer.c into a C harness with fake layout entries and fake launches (the CUPTI dispatch
needs a GPU: not run here). Checked: a compact launch plus its function record is exactly the
default record; one id per distinct function under many threads (also when the same function comes
as different entry objects, as layout.c builds while a slot is being filled); every launch's id is
in functions.jsonl; a forked child numbers its own functions. `-s` prints bytes per record and
the cost per record of both writers, default vs compact (`test_record_sizes_and_cost`).

Loader: a small generator writes one truth as a default dump and as a compact dump; the frames
must be identical (launches and params, word/pointer rows included). A functions.jsonl cut short
warns and drops the launches whose function is missing.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pandas as pd
import pytest

import c_harness
from compact_form import expand
from mining.load import load_dump


HARNESS = c_harness.PRELUDE + r"""
#include <sys/wait.h>
void mc_note_error(int fn, int code, int fatal) { (void)fn; (void)code; if (fatal) mc_disable("fatal"); }
int mc_tid(void) { return 7; }
void mc_classify_words(jb_t *b, const unsigned char *p, size_t size) { (void)b; (void)p; (void)size; }
unsigned mc_host_sections(jb_t *b, const mc_entry_t *e, const unsigned char *p, size_t n) {
  (void)b; (void)e; (void)p; (void)n; return 0; }

/* profiles: symbol/name lengths and parameter sizes of a fake function */
typedef struct { int sym, name, np; const unsigned *sizes; } prof_t;
static const unsigned small_sizes[] = {8, 8, 8, 4, 4, 8};
static const unsigned vllm_sizes[] = {8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 8, 8, 4, 4, 4, 4, 8, 8, 4, 4, 64};
static const prof_t profs[2] = {{60, 40, 6, small_sizes}, {250, 300, 22, vllm_sizes}};

#define NF 64
static mc_entry_t ents[NF];
static unsigned char pbytes[64][64];
static void *kp[64];

static mc_entry_t make_entry(int k, const prof_t *P) {
  mc_entry_t e; memset(&e, 0, sizeof e);
  e.handle = (void *)(uintptr_t)(0x5000 + 16 * k); e.ctx = (CUcontext)0xc0; e.func = (CUfunction)e.handle;
  e.is_kernel = k % 2; e.record = 1; e.nparams = P->np; e.layout_src = k % 2 ? "kernel" : "function";
  e.off = calloc(P->np, 4); e.size = calloc(P->np, 4);
  unsigned off = 0;
  for (int i = 0; i < P->np; i++) {
    unsigned s = P->sizes[i]; off = (off + (s > 8 ? 8 : s) - 1) / (s > 8 ? 8 : s) * (s > 8 ? 8 : s);
    e.off[i] = off; e.size[i] = s; off += s;
  }
  e.symbol = malloc(P->sym + 1);
  snprintf(e.symbol, P->sym + 1, "_Z%dkernel_%d", k, k);
  for (size_t i = strlen(e.symbol); i < (size_t)P->sym; i++) e.symbol[i] = 'a' + (i * 7 + k) % 26;
  e.symbol[P->sym] = 0;
  char *name = malloc(P->name + 1);
  for (int i = 0; i < P->name; i++) name[i] = "void kernel<at::Half, 128>(float const*, \"q\")"[(i + k) % 46];
  name[P->name] = 0;
  jb_t b = {0};  /* as layout.c's build_frag */
  jb_lit(&b, ",\"handle\":"); jb_str(&b, e.is_kernel ? "kernel" : "function");
  jb_lit(&b, ",\"func\":"); jb_ptr(&b, (uintptr_t)e.func);
  jb_lit(&b, ",\"module\":"); if (k % 5) jb_u64(&b, 3 + k % 3); else jb_lit(&b, "null");
  jb_lit(&b, ",\"sha256\":"); if (k % 5) jb_str(&b, "4f0c8e8d2a6b1c3e5f7a9b0c2d4e6f8a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e"); else jb_lit(&b, "null");
  jb_lit(&b, ",\"symbol\":"); jb_str(&b, e.symbol);
  jb_lit(&b, ",\"name\":"); jb_str(&b, name);
  jb_lit(&b, ",\"attrs\":{\"regs\":"); jb_u64(&b, 32 + k);
  jb_lit(&b, ",\"static_smem\":0,\"local\":0,\"const\":0,\"max_threads\":1024,\"ptx\":90,\"binary\":90}");
  e.frag = b.p; e.frag_n = b.n;
  free(name);
  return e;
}

static int compact;
static uint64_t fake_ns;
static int64_t launch(const mc_entry_t *e, long t, long i) {
  for (int p = 0; p < e->nparams; p++) {
    uint64_t v = 0x7f0000000000ull + (uint64_t)(t * 1000003 + i * 97 + p) * 256;
    memcpy(pbytes[p], &v, 8); memset(pbytes[p] + 8, (int)(i + p), 56);
    kp[p] = pbytes[p];
  }
  mc_launch_t L = {.t_ns = ++fake_ns, .tid = 7, .ctx = (CUcontext)0xc0, .in_graph = (int)(i % 3 == 0),
                   .graph = (CUgraph)0x99, .capid = 5, .grid = {(unsigned)i % 64 + 1, 1, 1}, .block = {128, 1, 1},
                   .kp = kp};
  int64_t fn = compact ? mc_fn_id(e) : -1;
  jb_t *b = jb_thread();
  if (!b) return -1;
  mc_launch_json(b, &L, e, fn);
  return mc_write_record(MC_F_LAUNCHES, b, 1);
}

static void bench_one(long i) { launch(&ents[(i * 7) % 8], 0, i); }

static long per_thread, nthreads;
static void *worker(void *arg) {  /* ids only: launch() below is for one thread (shared kp) */
  long t = (long)arg;
  static __thread unsigned seed;
  seed = (unsigned)t * 2654435761u + 1;
  for (long i = 0; i < per_thread; i++) {
    int k = (int)(rand_r(&seed) % NF);
    const mc_entry_t *e = &ents[k];
    mc_entry_t *copy = NULL;
    if (i < 8 || rand_r(&seed) % 16 == 0) {  /* a per-launch entry of the same function (layout.c) */
      copy = malloc(sizeof *copy); memcpy(copy, e, sizeof *copy);
      atomic_store(&copy->fn_tag, 0);
      e = copy;
    }
    int64_t fn = mc_fn_id(e);
    jb_t *b = jb_thread();
    jb_lit(b, "\"t\":"); jb_u64(b, (uint64_t)t);
    jb_lit(b, ",\"k\":"); jb_u64(b, (uint64_t)k);
    jb_lit(b, ",\"fn\":"); jb_i64(b, fn);
    mc_write_record(MC_F_LAUNCHES, b, 1);
    /* copies are leaked on purpose, as layout.c's per-launch entries: the registry may keep them */
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argv[1];
  snprintf(mc_knobs.dir, sizeof mc_knobs.dir, "%s", argv[2]);
  compact = atoi(argv[3]);
  int prof = atoi(argv[4]);
  long n = atol(argv[5]);
  mc_knobs.compact = compact;
  const char *w = getenv("MINE_CAPTURE_WRITER");
  mc_knobs.writer_write = !(w && strcmp(w, "mmap") == 0);
  mc_knobs.no_classify = 1;
  mc_pid = getpid();
  for (int k = 0; k < NF; k++) ents[k] = make_entry(k, &profs[prof]);
  if (mc_files_open() != 0) { printf("{\"open\":\"failed\"}\n"); return 0; }
  if (strcmp(mode, "records") == 0) {
    for (long i = 0; i < n; i++) launch(&ents[(i * 7) % 8], 0, i);
  } else if (strcmp(mode, "bench") == 0) {   /* records 3 us apart, like launches; time in launch() only */
    bench_spaced(bench_one, n);
    return 0;
  } else if (strcmp(mode, "threads") == 0 || strcmp(mode, "fork") == 0) {
    nthreads = 8; per_thread = n;
    run_threads_of(worker, nthreads);
    if (strcmp(mode, "fork") == 0) {
      pid_t c = fork();
      if (c == 0) {
        mc_pid = getpid();
        mc_files_reset_after_fork();
        mc_fn_reset_after_fork();
        run_threads_of(worker, nthreads);
        mc_files_finalize();
        exit(0);
      }
      int st; waitpid(c, &st, 0);
      mc_files_finalize();
      printf("{\"pid\":%d,\"child\":%d,\"off\":%d}\n", mc_pid, (int)c, atomic_load(&mc_off));
      return 0;
    }
  }
  mc_files_finalize();
  printf("{\"pid\":%d,\"off\":%d,\"functions\":%llu}\n", mc_pid, atomic_load(&mc_off),
         (unsigned long long)mc_cnt.functions);
  return 0;
}
"""

PROFILES = {"small": 0, "vllm": 1}


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return c_harness.build(tmp_path_factory.mktemp("compact"), HARNESS, 'record.c', 'writer.c', 'room.c')


def _run(exe, mode, out, compact, prof, n, writer="write"):
    env = dict(os.environ, MINE_CAPTURE_WRITER=writer)
    r = subprocess.run([str(exe), mode, str(out), str(compact), str(PROFILES[prof]), str(n)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return json.loads(r.stdout)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


@pytest.mark.parametrize("writer", ["write", "mmap"])
@pytest.mark.parametrize("prof", ["small", "vllm"])
def test_compact_record_plus_function_is_the_default_record(harness, tmp_path, writer, prof):
    full = _run(harness, "records", tmp_path / "full", 0, prof, 500, writer)
    comp = _run(harness, "records", tmp_path / "comp", 1, prof, 500, writer)
    a = _lines(tmp_path / "full" / f"pid{full['pid']}" / "launches.jsonl")
    b = _lines(tmp_path / "comp" / f"pid{comp['pid']}" / "launches.jsonl")
    assert not (tmp_path / "full" / f"pid{full['pid']}" / "functions.jsonl").exists()  # default: no file
    fns = _lines(tmp_path / "comp" / f"pid{comp['pid']}" / "functions.jsonl")
    assert [f["fn"] for f in fns] == list(range(8)) == sorted({r["fn"] for r in b}) and comp["functions"] == 8
    assert all(f["ctx"] == "0xc0" for f in fns)
    by_id = {f["fn"]: f for f in fns}
    assert len(a) == len(b) == 500
    assert [expand(r, by_id) for r in b] == a
    assert all(set(p) == {"i", "hex"} for r in b for p in r["params"])


def test_one_id_per_function_under_threads(harness, tmp_path):
    res = _run(harness, "threads", tmp_path, 1, "small", 20000)
    pid_dir = tmp_path / f"pid{res['pid']}"
    fns = _lines(pid_dir / "functions.jsonl")
    launches = _lines(pid_dir / "launches.jsonl")
    assert res["off"] == 0 and len(launches) == 8 * 20000
    assert sorted(f["fn"] for f in fns) == list(range(64)) == list(range(res["functions"]))
    by_id = {f["fn"]: f for f in fns}
    assert len({f["symbol"] for f in fns}) == 64  # one record per function, none twice
    for r in launches:  # every launch names a written function, the right one
        assert by_id[r["fn"]]["func"] == hex(0x5000 + 16 * r["k"])


def test_forked_child_numbers_its_own_functions(harness, tmp_path):
    res = _run(harness, "fork", tmp_path, 1, "small", 2000)
    for pid in (res["pid"], res["child"]):
        pid_dir = tmp_path / f"pid{pid}"
        fns = {f["fn"]: f for f in _lines(pid_dir / "functions.jsonl")}
        launches = _lines(pid_dir / "launches.jsonl")
        assert sorted(fns) == list(range(64)) and len(launches) == 8 * 2000
        assert all(fns[r["fn"]]["func"] == hex(0x5000 + 16 * r["k"]) for r in launches)


def _sizes(harness, tmp_path) -> dict:
    out = {}
    for prof in PROFILES:
        for compact in (0, 1):
            res = _run(harness, "records", tmp_path / f"s{prof}{compact}", compact, prof, 1000)
            size = (tmp_path / f"s{prof}{compact}" / f"pid{res['pid']}" / "launches.jsonl").stat().st_size
            out[f"{prof}_{'compact' if compact else 'default'}_bytes"] = size / 1000
    return out


def test_record_sizes(harness, tmp_path):
    out = _sizes(harness, tmp_path)
    for prof in PROFILES:
        assert out[f"{prof}_compact_bytes"] < out[f"{prof}_default_bytes"]


@pytest.mark.slow
def test_record_sizes_and_cost(harness, tmp_path):
    """A measurement for docs/benchmarks.md (`pytest -s -m slow ... -k cost`), not a timing assertion."""
    out = _sizes(harness, tmp_path)
    for prof in PROFILES:
        for compact in (0, 1):
            for writer in ("write", "mmap"):
                runs = [_run(harness, "bench", tmp_path / f"b{prof}{compact}{writer}{i}", compact, prof, 100000,
                             writer)["ns_per_record"] for i in range(3)]
                out[f"{prof}_{'compact' if compact else 'default'}_{writer}_ns"] = min(runs)
    print("\nbytes per launch record and ns per record (formatted + written, one thread, 3 us apart):")
    for k, v in out.items():
        print(f"  {k}: {v:.1f}")
    for prof in PROFILES:
        assert out[f"{prof}_compact_bytes"] < out[f"{prof}_default_bytes"]


# ---------------------------------------------------------------- the loader
def make_truth(n: int, n_fn: int = 12, seed: int = 1) -> tuple[list[dict], list[dict]]:
    """Functions and launches (default-form fields), with pointer words inside wide parameters."""
    rng = random.Random(seed)
    fns = []
    for k in range(n_fn):
        sizes = [rng.choice([8, 8, 8, 4, 16, 32]) for _ in range(rng.randint(0, 7))]
        offs, o = [], 0
        for s in sizes:
            a = min(s, 8)
            o = (o + a - 1) // a * a
            offs.append(o)
            o += s
        fns.append({
            "handle": rng.choice(["kernel", "function"]), "func": hex(0x9000 + k),
            "module": None if k % 4 == 3 else 1 + k % 3,
            "sha256": None if k % 4 == 3 else f"{k % 3:064x}",
            "symbol": f"_Z{k}kern{'x' * k}", "name": f"void kern<{k}>(float*, \"q\\\\\")",
            "attrs": {"regs": 20 + k, "static_smem": 0, "max_threads": 1024},
            "layout": "none" if k == 5 else rng.choice(["kernel", "function"]),
            "params_layout": [] if k == 5 else [[i, offs[i], sizes[i]] for i in range(len(sizes))],
        })
    launches = []
    for seq in range(n):
        k = rng.randrange(n_fn)
        f = fns[k]
        params = []
        for i, off, size in f["params_layout"]:
            words = [rng.getrandbits(64) for _ in range(max(1, size // 8))]
            raw = b"".join(w.to_bytes(8, "little") for w in words)[:size]
            p = {"i": i, "off": off, "size": size, "hex": raw.hex()}
            ptrs = []
            for j, w in enumerate(words[: size // 8]):
                if rng.random() < 0.4:
                    base = w - rng.randrange(1 << 12)
                    ptrs.append({"at": 8 * j, "base": hex(base), "size": 1 << 20, "id": j + 1, "off": w - base})
            if ptrs:
                p["ptrs"] = ptrs
            params.append(p)
        launches.append({
            "seq": seq, "t_ns": 1000 + seq, "tid": 7, "dev": 0, "ctx": "0xc0", "stream": hex(rng.randrange(3)),
            "api": "cuLaunchKernel", "result": 0,
            "graph": {"graph": "0x5", "capture_id": 3} if seq % 5 == 0 else None,
            "fn": k, "grid": [rng.randint(1, 9), 1, 1], "block": [128, 1, 1], "smem": 0, "launch_attrs": {},
            "packing": "params", "params": params,
        })
    return fns, launches


def write_dump(folder: Path, fns: list[dict], launches: list[dict], compact: bool,
               fn_lines: int | None = None) -> Path:
    folder.mkdir(parents=True)
    keys = ("handle", "func", "module", "sha256", "symbol", "name", "attrs")
    with open(folder / "launches.jsonl", "w") as fh:
        for r in launches:
            f = fns[r["fn"]]
            if compact and r["seq"] % 97 != 5:  # some launches in the default form (mixed files are valid)
                rec = dict(r, params=[{k: v for k, v in p.items() if k not in ("off", "size")} for p in r["params"]])
            else:
                rec = {}
                for k, v in r.items():
                    if k == "fn":
                        rec.update({k2: f[k2] for k2 in keys})
                    elif k == "params":
                        rec["layout"] = f["layout"]
                        rec["params"] = v
                    else:
                        rec[k] = v
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    if compact:
        lines = [json.dumps(dict(fn=k, ctx="0xc0", **f), separators=(",", ":")) for k, f in enumerate(fns)]
        text = "\n".join(lines) + "\n"
        if fn_lines is not None:  # cut short: whole lines, then half a line
            text = "\n".join(lines[:fn_lines]) + "\n" + lines[fn_lines][: len(lines[fn_lines]) // 2]
        (folder / "functions.jsonl").write_text(text)
    (folder / "modules.jsonl").write_text("")
    return folder


@pytest.mark.parametrize("n", [3000, pytest.param(40000, marks=pytest.mark.slow)])   # 3000: ten chunks already
def test_compact_loads_to_the_same_frames(tmp_path, monkeypatch, n):
    import mining.load as load
    monkeypatch.setattr(load, "CHUNK", 256 << 10)  # many chunks: categories unified across them
    fns, launches = make_truth(n)
    a = load_dump(write_dump(tmp_path / "full", fns, launches, False), cache=False)
    b = load_dump(write_dump(tmp_path / "comp", fns, launches, True), cache=False)
    assert a.warnings == [] and b.warnings == []
    assert (a.params["word"]).any() and a.params["is_ptr"].any()
    pd.testing.assert_frame_equal(a.launches, b.launches)
    pd.testing.assert_frame_equal(a.params, b.params)
    c = load_dump(tmp_path / "comp")  # through the parquet cache, written then read
    c = load_dump(tmp_path / "comp")
    pd.testing.assert_frame_equal(a.launches, c.launches)
    pd.testing.assert_frame_equal(a.params, c.params)


def test_truncated_functions_file_warns_and_drops(tmp_path):
    fns, launches = make_truth(2000)
    d = load_dump(write_dump(tmp_path / "comp", fns, launches, True, fn_lines=8), cache=False)
    keep = [r for r in launches if r["fn"] < 8 or r["seq"] % 97 == 5]  # default-form ones stay
    assert d.launches["seq"].tolist() == [r["seq"] for r in keep]
    assert any("functions.jsonl" in w and "truncated" in w for w in d.warnings), d.warnings
    assert any(f"dropped {len(launches) - len(keep)} launch" in w for w in d.warnings), d.warnings
    full = load_dump(write_dump(tmp_path / "full", fns, keep, False), cache=False)
    pd.testing.assert_frame_equal(full.launches, d.launches)
    pd.testing.assert_frame_equal(full.params, d.params)


def test_compact_launches_without_functions_file(tmp_path):
    fns, launches = make_truth(500)
    folder = write_dump(tmp_path / "comp", fns, launches, True)
    (folder / "functions.jsonl").unlink()
    d = load_dump(folder, cache=False)  # only the launches written in the default form remain
    assert d.launches["seq"].tolist() == [r["seq"] for r in launches if r["seq"] % 97 == 5]
    assert any("functions.jsonl (the file is missing)" in w for w in d.warnings), d.warnings
    for r in launches:
        r["seq"] += 1000 * (r["seq"] % 97 == 5)  # now every launch is compact
    folder = write_dump(tmp_path / "comp2", fns, [r for r in launches if r["seq"] < 1000], True)
    (folder / "functions.jsonl").unlink()
    with pytest.raises(ValueError, match="functions.jsonl"):
        load_dump(folder, cache=False)
