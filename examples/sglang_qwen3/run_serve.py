"""Start SGLang's HTTP server the way users do, send the four prompts as token ids, stop it cleanly.

    python3 run_serve.py MODEL_DIR OUT_JSON [--mode eager|graph] [--port 30011] [--profile-dir DIR]
                         [--graph-args "..."] [--startup-timeout 240] [--stop-timeout 60] [--log FILE]
                         [--reference REF.json [--top-k 20]] [--snapshot]

The server's scheduler runs in a child process (multiprocessing, spawned); under `mine capture`
every process that initializes CUDA gets its own `pid<N>/` folder and the scheduler's holds the
model's launches. The prompts (../vllm_qwen3/prompts.py, ids taken modulo the checkpoint's
vocabulary) go one at a time through POST /generate with token ids, greedy, a fixed number of new
tokens (EOS ignored), so batching is deterministic: the same command run twice launches the same
kernels in the same order. Overlap scheduling is off: with it the scheduler launches the next step
before it has processed the last one's results, so a step may run for a request that has just
finished; without it a request's forwards are exactly its prefill and its decode steps, which is
what the truth file says.

`--mode eager` adds --disable-cuda-graph; `graph` keeps SGLang's CUDA graphs (decode graphs per
batch size, breakable prefill graphs per token count) with `--graph-args` keeping them few.
`/health` answers 200 once the server's own warm-up is done; its generation probe is switched off
(SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false), so polling it adds no forward.

`--profile-dir DIR`: SGLang's torch profiler traces the prompts (POST /start_profile before them,
/stop_profile after; GPU activity only, no stacks or shapes); its chrome trace lands in DIR.
OUT_JSON's `window` (CLOCK_MONOTONIC ns, the capture's `t_ns` clock) runs from before the start
request to after the stop answer, around the profiled stretch (or around the prompts without
--profile-dir), so a capture of the same run can be cut to what the profiler saw; each request
also records when it was sent and answered.

`--reference REF.json`: every request also asks for its top-k log-probabilities, and the answers
are written as a `mine-reference/1` (compare/record_sglang.py): the run that was captured is the
reference `mine compare` judges the compiled manifest against. `--snapshot` (under `mine capture`
with MINE_CAPTURE_SNAPSHOT_SIGNAL=1): once the server is up, SIGUSR2 goes to every process of the
server that has a folder in the capture (MINE_CAPTURE_DIR/pid<N>: its library is loaded and
handles the signal), so the device snapshot that `mine compile --weights` binds weights by is
taken after the weights are loaded and before the first request.

Shutdown: SIGTERM to the server; its tokenizer manager drains and sends the scheduler a
ShutdownReq, the scheduler leaves its loop and exits normally, so a capture library in it writes
its exit records. Whatever of the server's process group is left after `--stop-timeout` seconds
is killed (and OUT_JSON says so). Exit code 0 when every prompt was answered.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vllm_qwen3"))
from prompts import MAX_NEW_TOKENS, prompts  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from compare import record_sglang, reference  # noqa: E402

SERVER_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
               "--skip-tokenizer-init", "--mem-fraction-static", "0.3", "--random-seed", "0",
               "--disable-overlap-schedule"]
GRAPH_ARGS = "--cuda-graph-max-bs-decode 4 --cuda-graph-max-bs-prefill 256"
SERVER_ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false", "SGLANG_PROFILE_WITH_STACK": "false",
              "SGLANG_PROFILE_RECORD_SHAPES": "false", "PYTHONUNBUFFERED": "1"}
PROFILE_ID = "mine"


def http(url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, object]:
    """(status, parsed JSON or text) of a GET (body None) or a JSON POST; status 0: no answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError as exc:
        return 0, str(exc)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")[:2000]


def server_command(model: str, port: int, mode: str, graph_args: str, module: str) -> list[str]:
    cmd = [sys.executable, "-m", module, "--model-path", model, *SERVER_ARGS,
           "--host", "127.0.0.1", "--port", str(port)]
    return cmd + (["--disable-cuda-graph"] if mode == "eager" else shlex.split(graph_args))


def wait_healthy(server: subprocess.Popen, base: str, timeout: float) -> float:
    """Seconds until /health answers 200; raises RuntimeError when the server exits or is late."""
    t0 = time.time()
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode} before it was up")
        status, _ = http(f"{base}/health", timeout=2)
        if status == 200:
            return time.time() - t0
        if time.time() - t0 > timeout:
            raise RuntimeError(f"the server was not up within {timeout:.0f} s")
        time.sleep(0.5)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies waiting for a reaper do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def stop(server: subprocess.Popen, timeout: float) -> dict:
    """SIGTERM, wait for the server and what it started; kill the group's rest after `timeout`."""
    t0 = time.time()
    forced = False
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    while _group_alive(server.pid) and time.time() - t0 < timeout:
        time.sleep(0.2)                       # the scheduler may still be leaving its loop
    if _group_alive(server.pid) or server.poll() is None:
        forced = True
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
    return {"signal": "SIGTERM", "rc": server.returncode, "seconds": round(time.time() - t0, 1), "forced": forced}


def signal_snapshot(server: subprocess.Popen) -> list[int]:
    """SIGUSR2 to the server's processes that the capture library runs in (docstring: --snapshot)."""
    root = os.environ.get("MINE_CAPTURE_DIR")
    if not root or os.environ.get("MINE_CAPTURE_SNAPSHOT_SIGNAL") != "1":
        raise RuntimeError("--snapshot needs `mine capture` with MINE_CAPTURE_SNAPSHOT_SIGNAL=1")
    sent = []
    for d in sorted(Path(root).glob("pid[0-9]*")):
        pid = int(d.name[3:])
        try:
            if os.getpgid(pid) != server.pid:
                continue
            os.kill(pid, signal.SIGUSR2)
            sent.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return sent


def find_trace(folder: Path) -> str | None:
    found = sorted(folder.glob(f"{PROFILE_ID}*.trace.json*"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return str(found[-1]) if found else None


def serve(args, rec: dict) -> None:
    base = f"http://127.0.0.1:{args.port}"
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    env = dict(os.environ, **SERVER_ENV)
    if args.profile_dir:
        Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
        env["SGLANG_TORCH_PROFILER_DIR"] = str(Path(args.profile_dir).resolve())
    cmd = server_command(args.model, args.port, args.mode, args.graph_args, args.server_module)
    rec["server_args"] = cmd[3:]
    log = open(args.log, "ab") if args.log else None
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
                              start_new_session=True)
    if args.pidfile:
        Path(args.pidfile).write_text(str(server.pid))
    try:
        rec["startup_s"] = round(wait_healthy(server, base, args.startup_timeout), 1)
        status, info = http(f"{base}/server_info", timeout=30)
        if isinstance(info, dict):
            info.pop("internal_states", None)
        rec["server_info"] = info if status == 200 else {"status": status, "answer": info}
        if args.snapshot:
            rec["snapshot_signalled"] = signal_snapshot(server)
        rec["window"] = {"clock": "CLOCK_MONOTONIC", "start_ns": time.monotonic_ns()}
        if args.profile_dir:
            status, ans = http(f"{base}/start_profile", {"output_dir": env["SGLANG_TORCH_PROFILER_DIR"],
                                                           "activities": ["GPU"], "with_stack": False,
                                                           "record_shapes": False, "profile_id": PROFILE_ID})
            rec["profile"] = {"start": {"status": status, "answer": ans}}
        answers = []
        for ids in [[x % vocab for x in p] for p in prompts()]:
            t, t_ns = time.time(), time.monotonic_ns()
            body = record_sglang.request_body(ids, args.new, args.top_k) if args.reference else {
                "input_ids": ids, "sampling_params": {"max_new_tokens": args.new, "temperature": 0, "ignore_eos": True}}
            status, ans = http(f"{base}/generate", body)
            out = ans.get("output_ids") if status == 200 and isinstance(ans, dict) else None
            answers.append(ans)
            rec["requests"].append({"prompt": ids, "output": out, "seconds": round(time.time() - t, 3),
                                    "sent_ns": t_ns, "answered_ns": time.monotonic_ns(),
                                    **({} if out is not None else {"status": status, "answer": str(ans)[:500]})})
        time.sleep(args.settle)                  # what the last request left running finishes
        if args.profile_dir:
            status, ans = http(f"{base}/stop_profile", {}, timeout=180)
            rec["profile"]["stop"] = {"status": status, "answer": ans}
            rec["profile"]["file"] = find_trace(Path(env["SGLANG_TORCH_PROFILER_DIR"]))
        rec["window"]["end_ns"] = time.monotonic_ns()
        if args.reference and all(r["output"] is not None for r in rec["requests"]):
            write_reference(args, [r["prompt"] for r in rec["requests"]], answers, rec)
    finally:
        rec["shutdown"] = stop(server, args.stop_timeout)
        if log:
            log.close()
        if args.pidfile:
            Path(args.pidfile).unlink(missing_ok=True)


def write_reference(args, prompts_sent: list, answers: list, rec: dict) -> None:
    """The run's answers as a mine reference (--reference); its checkpoint's fingerprint and engine."""
    from compare import checkpoint
    import importlib.metadata as md

    try:
        version = md.version("sglang")
    except md.PackageNotFoundError:
        version = "unknown"
    made = {"engine_start_s": rec.get("startup_s"), "server_args": rec.get("server_args"),
            "prompts": "examples/vllm_qwen3/prompts.py", "attention_backend": "triton"}
    ref = record_sglang.reference_from_answers(prompts_sent, answers, checkpoint.config(Path(args.model)),
                                               checkpoint.fingerprint(Path(args.model)), args.top_k,
                                               f"sglang {version}", args.mode, made)
    reference.write(ref, args.reference)
    rec["reference"] = str(args.reference)


def _terminated(signum, frame):
    raise RuntimeError(f"run_serve.py got signal {signum} (a timeout?): the server was stopped")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--mode", choices=("eager", "graph"), default="eager")
    ap.add_argument("--port", type=int, default=30011)
    ap.add_argument("--graph-args", default=GRAPH_ARGS, help=f"server flags in graph mode ({GRAPH_ARGS!r})")
    ap.add_argument("--profile-dir", help="trace the prompts with SGLang's torch profiler into this folder")
    ap.add_argument("--new", type=int, default=MAX_NEW_TOKENS, help="new tokens per prompt")
    ap.add_argument("--startup-timeout", type=float, default=240)
    ap.add_argument("--stop-timeout", type=float, default=60)
    ap.add_argument("--settle", type=float, default=0.5, help="seconds after the last answer the window lasts")
    ap.add_argument("--log", help="the server's stdout and stderr (default: this process's)")
    ap.add_argument("--pidfile", help="write the server's pid (its process group) here while it runs")
    ap.add_argument("--reference", type=Path, help="write the answers' log-probabilities as a mine reference here")
    ap.add_argument("--top-k", type=int, default=20, help="log-probabilities per position in --reference (20)")
    ap.add_argument("--snapshot", action="store_true", help="signal the capture's device snapshot once the server is up")
    ap.add_argument("--server-module", default="sglang.launch_server", help=argparse.SUPPRESS)  # tests
    args = ap.parse_args()
    rec: dict = {"engine": "sglang", "mode": args.mode, "requests": []}
    error = None
    signal.signal(signal.SIGTERM, _terminated)   # a timeout stops the server before this exits
    try:
        serve(args, rec)
    except (RuntimeError, OSError, reference.ReferenceError) as exc:
        error = str(exc)
    rec["error"] = error
    args.out.write_text(json.dumps(rec, indent=1))
    answered = [r["output"] for r in rec["requests"]]
    print(json.dumps({"outputs": answered, "startup_s": rec.get("startup_s"), "shutdown": rec.get("shutdown"),
                      "error": error}))
    if error or len(answered) != len(prompts()) or any(o is None for o in answered):
        sys.exit(f"run_serve: {error or 'not every prompt was answered'} (see {args.out})")


if __name__ == "__main__":
    main()
