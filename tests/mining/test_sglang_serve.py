"""examples/sglang_qwen3/run_serve.py against a fake SGLang server (no GPU, no SGLang).

The fake speaks the endpoints the client uses the way SGLang 0.5.17 does (/health 503 while it
starts, /server_info, POST /generate with input_ids -> output_ids, /start_profile and
/stop_profile writing `<profile_id>-TP-0.trace.json.gz` into the asked folder) and exits on SIGTERM
after a delay, as SGLang's drain does; a stubborn variant ignores SIGTERM and must be killed, with
a child process of its own in its group. What is checked is the client: every prompt sent once,
in order, as token ids modulo the vocabulary; the window brackets the requests on the monotonic
clock; the trace is found; the shutdown is clean or, when it cannot be, forced and said so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from paths import ROOT

from compare import checkpoint, reference
from generators import safetensors

EXAMPLE = ROOT / "examples" / "sglang_qwen3"
sys.path.insert(0, str(ROOT / "examples" / "vllm_qwen3"))
from prompts import MAX_NEW_TOKENS, prompts  # noqa: E402

FAKE = r'''
import gzip, json, os, signal, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
stubborn = os.environ.get("FAKE_STUBBORN") == "1"
log = open(os.environ["FAKE_LOG"], "a")
polls = {"n": 0}
state = {"profile": None}

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, code, obj):
        data = json.dumps(obj).encode() if obj is not None else b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")
    def do_GET(self):
        if self.path == "/health":
            polls["n"] += 1
            return self.reply(503 if polls["n"] < 2 else 200, None)
        if self.path == "/server_info":
            return self.reply(200, {"version": "0.0-fake", "internal_states": [{"x": 1}],
                                    "cuda_graph_config": {"decode": {"backend": "full", "bs": [1, 2, 4]}}})
        self.reply(404, {"error": self.path})
    def do_POST(self):
        b = self.body()
        log.write(json.dumps({"path": self.path, "body": b, "t": time.monotonic_ns()}) + "\n"); log.flush()
        if self.path == "/generate":
            ids = b["input_ids"]
            n = b["sampling_params"]["max_new_tokens"]
            out = [(sum(ids) + k) % 97 for k in range(n)]
            meta = {}
            if b.get("return_logprob"):   # SGLang's shape: [logprob, token id, text] per entry, best first
                k = b["top_logprobs_num"]
                meta["output_token_logprobs"] = [[-0.5 - 0.01 * j, t, None] for j, t in enumerate(out)]
                meta["output_top_logprobs"] = [[[-0.5 - 0.01 * j - 0.1 * r, (t + r) % 97, None] for r in range(k)]
                                               for j, t in enumerate(out)]
            return self.reply(200, {"output_ids": out, "meta_info": meta})
        if self.path == "/start_profile":
            state["profile"] = b
            return self.reply(200, None)
        if self.path == "/stop_profile":
            p = state["profile"]
            ev = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1,
                   "args": {"grid": [1, 1, 1], "block": [32, 1, 1]}}]
            path = os.path.join(p["output_dir"], p["profile_id"] + "-TP-0.trace.json.gz")
            with open(path, "wb") as f:
                f.write(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
            return self.reply(200, None)
        self.reply(404, {"error": self.path})

srv = ThreadingHTTPServer(("127.0.0.1", port), H)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) if stubborn else None

def term(*_):
    if stubborn:
        return
    log.write(json.dumps({"path": "SIGTERM", "args": args}) + "\n"); log.flush()
    threading.Thread(target=lambda: (time.sleep(0.3), srv.shutdown())).start()

signal.signal(signal.SIGTERM, term)
time.sleep(0.2)
srv.serve_forever()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(tmp_path, *extra, stubborn=False, vocab=1000, env_extra=None):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": vocab, "model_type": "qwen3",
                                                   "num_hidden_layers": 1, "hidden_size": 8}))
    safetensors.write(model / "model.safetensors", {"w": ("BF16", [2, 4], bytes(range(16)))})
    (tmp_path / "fake_sglang.py").write_text(FAKE)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               FAKE_LOG=str(tmp_path / "fake.log"), FAKE_STUBBORN="1" if stubborn else "0", **(env_extra or {}))
    out = tmp_path / "run.json"
    t0 = time.monotonic_ns()
    p = subprocess.run([sys.executable, str(EXAMPLE / "run_serve.py"), str(model), str(out), "--server-module",
                        "fake_sglang", "--port", str(free_port()), "--startup-timeout", "20", "--settle", "0.05",
                        *extra], env=env, capture_output=True, text=True, timeout=60)
    rec = json.loads(out.read_text())
    log = [json.loads(x) for x in (tmp_path / "fake.log").read_text().splitlines()]
    return p, rec, log, t0


def test_prompts_answered_in_order_and_bracketed(tmp_path):
    p, rec, log, t0 = run(tmp_path, "--profile-dir", str(tmp_path / "prof"), vocab=1000)
    assert p.returncode == 0, p.stderr
    want = [[x % 1000 for x in q] for q in prompts()]
    gens = [x for x in log if x["path"] == "/generate"]
    assert [g["body"]["input_ids"] for g in gens] == want
    assert all(g["body"]["sampling_params"] == {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0,
                                                "ignore_eos": True} for g in gens)
    assert [r["prompt"] for r in rec["requests"]] == want
    assert all(len(r["output"]) == MAX_NEW_TOKENS for r in rec["requests"])
    # the window holds the profiled stretch, which holds every request, each within its own times
    w = rec["window"]
    start = next(x["t"] for x in log if x["path"] == "/start_profile")
    stop = next(x["t"] for x in log if x["path"] == "/stop_profile")
    assert t0 < w["start_ns"] < start < min(g["t"] for g in gens) <= max(g["t"] for g in gens) < stop < w["end_ns"]
    assert all(r["sent_ns"] < g["t"] < r["answered_ns"] for r, g in zip(rec["requests"], gens))
    assert rec["profile"]["file"].endswith("mine-TP-0.trace.json.gz")
    assert rec["profile"]["start"]["status"] == 200
    # the server got the documented flags, eager by default; server_info kept, internal_states dropped
    assert "--disable-cuda-graph" in rec["server_args"] and "--skip-tokenizer-init" in rec["server_args"]
    assert rec["server_info"]["cuda_graph_config"]["decode"]["bs"] == [1, 2, 4]
    assert "internal_states" not in rec["server_info"]
    assert rec["shutdown"]["forced"] is False and rec["shutdown"]["rc"] == 0
    assert any(x["path"] == "SIGTERM" for x in log)


def test_graph_mode_flags_and_no_profile(tmp_path):
    p, rec, log, _ = run(tmp_path, "--mode", "graph", "--graph-args", "--cuda-graph-max-bs 2")
    assert p.returncode == 0, p.stderr
    args = rec["server_args"]
    assert "--disable-cuda-graph" not in args and args[-2:] == ["--cuda-graph-max-bs", "2"]
    assert "profile" not in rec and not any(x["path"].endswith("_profile") for x in log)


def test_reference_from_the_answers(tmp_path):
    """--reference: every request asks for its top-k log-probabilities and the answers become a
    mine reference whose prompts, outputs and per-position top-k are what the server said, with
    the checkpoint's fingerprint; compare.reference reads it back."""
    p, rec, log, _ = run(tmp_path, "--reference", str(tmp_path / "ref.json"), "--top-k", "5", "--new", "6")
    assert p.returncode == 0, p.stderr
    gens = [x["body"] for x in log if x["path"] == "/generate"]
    assert all(g["return_logprob"] is True and g["top_logprobs_num"] == 5 for g in gens)
    ref = reference.read(tmp_path / "ref.json")
    assert ref.engine.startswith("sglang ") and ref.mode == "eager" and ref.top_k == 5
    assert ref.checkpoint == checkpoint.fingerprint(tmp_path / "model")
    assert [list(r.prompt) for r in ref.requests] == [r["prompt"] for r in rec["requests"]]
    for r, q in zip(ref.requests, rec["requests"]):
        assert list(r.output) == q["output"] and len(r.steps) == 6
        for j, (tok, st) in enumerate(zip(r.output, r.steps)):
            assert st.ids[0] == tok and st.ids == tuple((tok + k) % 97 for k in range(5))
            assert st.logprobs[0] == pytest.approx(-0.5 - 0.01 * j)


def test_snapshot_without_the_capture_is_one_sentence(tmp_path):
    """--snapshot outside `mine capture` (no MINE_CAPTURE_DIR): SIGUSR2 would end a process without
    the library's handler, so nothing is signalled and the run says why."""
    p, rec, _, _ = run(tmp_path, "--snapshot")
    assert p.returncode == 1
    assert "--snapshot needs `mine capture`" in rec["error"]


def test_snapshot_signals_only_the_server_processes_with_a_capture_folder(tmp_path):
    """The processes signalled are those of the server's group whose pid has a folder in the
    capture; a folder of another process (here this test's own pid) is left alone."""
    cap = tmp_path / "cap"
    cap.mkdir()
    (cap / f"pid{os.getpid()}").mkdir()
    p, rec, _, _ = run(tmp_path, "--snapshot", env_extra={"MINE_CAPTURE_DIR": str(cap),
                                                           "MINE_CAPTURE_SNAPSHOT_SIGNAL": "1"})
    assert p.returncode == 0, p.stderr
    assert rec["snapshot_signalled"] == []


def test_stubborn_server_is_killed_and_said_so(tmp_path):
    p, rec, log, _ = run(tmp_path, "--stop-timeout", "1.5", stubborn=True)
    assert p.returncode == 0, p.stderr        # every prompt was answered; the kill is reported
    sd = rec["shutdown"]
    assert sd["forced"] is True and sd["rc"] == -9 and sd["seconds"] < 10


def test_a_server_that_never_comes_up_is_one_sentence(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 10}))
    (tmp_path / "dead_sglang.py").write_text("import sys; sys.exit(3)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = tmp_path / "run.json"
    p = subprocess.run([sys.executable, str(EXAMPLE / "run_serve.py"), str(tmp_path / "model"), str(out),
                        "--server-module", "dead_sglang", "--port", str(free_port())],
                       env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "exited with code 3 before it was up" in p.stderr
    assert json.loads(out.read_text())["error"].startswith("the server exited with code 3")


@pytest.mark.parametrize("script", ["capture.sh", "device_run.sh"])
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(EXAMPLE / script)]).returncode == 0


def test_capture_sh_end_to_end_with_a_fake_kit(tmp_path):
    """capture.sh's plumbing on a machine without a GPU: a kit whose use.sh puts the fake server
    in place as `sglang.launch_server`, a checkpoint folder already there; the captured run (the
    capture library injected, nothing to record), the profile run, the truth file and the packed
    fixture all come out, and the truth is the prompts the fake answered."""
    kit = tmp_path / "kit"
    (kit / "site" / "sglang").mkdir(parents=True)
    (kit / "site" / "sglang" / "__init__.py").write_text("")
    (kit / "site" / "sglang" / "launch_server.py").write_text(FAKE)
    (kit / "use.sh").write_text(f'export PYTHONPATH={kit / "site"}${{PYTHONPATH:+:$PYTHONPATH}}\n'
                                f'export FAKE_LOG={tmp_path / "fake.log"}\n')
    work = tmp_path / "work"
    (work / "model").mkdir(parents=True)
    (work / "model" / "config.json").write_text(json.dumps({"vocab_size": 32000, "num_hidden_layers": 3}))
    env = dict(os.environ, KIT=str(kit), STARTUP_TIMEOUT="20", RUN_TIMEOUT="60")
    p = subprocess.run(["bash", str(EXAMPLE / "capture.sh"), str(work), "graph"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    truth = json.loads((work / "sglang_graph.truth.json").read_text())
    assert truth["mode"] == "graph" and truth["geometry"] == {"num_hidden_layers": 3, "vocab_size": 32000}
    assert [r["prompt"] for r in truth["requests"]] == [[x % 32000 for x in q] for q in prompts()]
    assert truth["cuda_graph_config"]["decode"]["bs"] == [1, 2, 4]
    assert truth["profile"]["source"] == "same_process" and truth["window"]["start_ns"] < truth["window"]["end_ns"]
    assert (work / "sglang_graph.profile.json.gz").is_file() and (work / "sglang_graph.tar.xz").is_file()
    served = [x for x in map(json.loads, (tmp_path / "fake.log").read_text().splitlines()) if x["path"] == "SIGTERM"]
    assert len(served) == 2 and all("--disable-cuda-graph" not in x["args"] for x in served)


def test_check_py_reports_a_fixture_against_its_truth(tmp_path):
    """check.py (what device_run.sh prints after each mode) on a real capture with a truth file of
    the same shape: the vLLM suite's q2e (eager, two requests, no profiler trace)."""
    from paths import FIXTURES

    out = tmp_path / "check.json"
    p = subprocess.run([sys.executable, str(EXAMPLE / "check.py"), str(FIXTURES / "suite" / "q2e"), "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["forwards_match"] and res["layers_every_serving_forward"] and res["layers_seen"] == [2]
    assert "serving forwards match the requests" in p.stdout and "completeness: no trace" in p.stdout
    assert res["structs"].startswith("struct parameters: ")
    bad = subprocess.run([sys.executable, str(EXAMPLE / "check.py"), str(tmp_path / "nothing")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("check.py: ") and "Traceback" not in bad.stderr


def test_truth_reads_each_requests_prefill_from_the_server_log():
    """truth.py's `prefills`: the log's last prefill lines, one per request (the server's own
    warm-up request first), with SGLang's eager-or-graph verdict; None when they do not add up."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sglang_truth", EXAMPLE / "truth.py")
    T = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(T)

    line = ("[t] Prefill batch, #new-seq: 1, #new-token: {n}, #cached-token: {c}, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: {g}, input throughput (token/s): 1.0\n")
    log = "".join(line.format(n=n, c=c, g=g) for n, c, g in ((3, 0, True), (1, 0, False), (30, 4, True)))
    reqs = [{"prompt": [7], "output": [1, 2]}, {"prompt": list(range(34)), "output": [1]}]
    assert T.prefills(log, reqs) == [{"new_tokens": 1, "cached_tokens": 0, "cuda_graph": False},
                                     {"new_tokens": 30, "cached_tokens": 4, "cuda_graph": True}]
    assert T.prefills(log, reqs[::-1]) is None                  # lengths do not match the prompts
    assert T.prefills(line.format(n=1, c=0, g=False), reqs) is None   # fewer lines than requests
