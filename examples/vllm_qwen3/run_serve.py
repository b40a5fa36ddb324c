"""Start vLLM's OpenAI server the way users do, send the four prompts as token ids, stop it.

The engine runs in a child process (`VLLM::EngineCore`); under `mine capture` each process gets
its own `pid<N>/` folder and the engine's holds the GPU launches.

    python3 run_serve.py MODEL_DIR OUT_JSON [--port 8011] [--default-mode]

`--default-mode` starts the server with vLLM's defaults (torch.compile + CUDA graphs) instead of
`--enforce-eager`. Prompt ids are taken modulo the checkpoint's vocabulary (a no-op for the
reference geometry), so smaller vocabularies of the truth suite stay in range.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import MAX_NEW_TOKENS, prompts  # noqa: E402


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 8011
    env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    eager = [] if "--default-mode" in sys.argv else ["--enforce-eager"]
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
           "--skip-tokenizer-init", *eager, "--attention-backend", "TRITON_ATTN",
           "--gpu-memory-utilization", "0.30", "--max-model-len", "4096", "--seed", "0",
           "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.time() + 300
        while True:
            if server.poll() is not None:
                sys.exit(f"the vLLM server exited early with code {server.returncode}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("the vLLM server did not come up within 300 s")
                time.sleep(1)
        results = []
        for ids in [[x % vocab for x in p] for p in prompts()]:
            r = post(f"http://127.0.0.1:{port}/v1/completions",
                     {"model": model, "prompt": ids, "max_tokens": MAX_NEW_TOKENS, "temperature": 0,
                      "detokenize": False, "return_token_ids": True})
            results.append({"prompt": ids, "output": r["choices"][0].get("token_ids")})
            time.sleep(0.05)
        out.write_text(json.dumps({"requests": results}, indent=1))
        print(json.dumps([r["output"] for r in results]))
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
