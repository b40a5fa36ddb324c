"""Teacher-forced check of a generated Qwen3 manifest on kern against vLLM's own run (GPU host).

    python3 kern_check.py MANIFEST_DIR CHECKPOINT_DIR TRUTH_JSON OUT_JSON

TRUTH_JSON is a truth-suite file (examples/vllm_qwen3/run_suite.py): every request's prompt, vLLM's
greedy output and, per generated position, vLLM's top-2 log-probs. kern is fed vLLM's tokens
(teacher forcing: prefill the prompt but its last token, then decode the last prompt token and
each of vLLM's outputs in turn), and at every position kern's choice is compared with vLLM's:

- equal: kern's argmax is vLLM's token;
- flip within margin: kern chose vLLM's second token and vLLM's own top-1/top-2 margin is no
  larger than kern's log-prob error on those two tokens (the two engines disagree only where
  the model itself cannot decide at bf16 precision);
- flip beyond margin: anything else (a wrong manifest).

Writes every position's numbers and the summary; exits 1 on any flip beyond the margin.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm_qwen3"))
from run_kern import KernQwen3  # noqa: E402


def main() -> None:
    mdir, ckpt, truth_p, out = (Path(a) for a in sys.argv[1:5])
    import torch

    truth = json.loads(truth_p.read_text())
    reqs = truth["requests"]
    engine = KernQwen3(mdir, ckpt, max(len(r["prompt"]) + len(r["output"]) for r in reqs) + 1)
    rows, beyond, within, equal = [], 0, 0, 0
    max_err = 0.0
    for k, r in enumerate(reqs):
        ids, outs = r["prompt"], r["output"]
        engine.prefill(ids)
        tok, pos = ids[-1], len(ids) - 1
        for i, want in enumerate(outs):
            got = engine.decode(tok, pos)
            lp = torch.log_softmax(engine.logits(), dim=-1)
            top = sorted(((int(t), float(v)) for t, v in r["logprobs"][i]), key=lambda x: -x[1])
            (t1, v1), (t2, v2) = top[0], top[1] if len(top) > 1 else (top[0][0], float("-inf"))
            e1 = abs(float(lp[t1]) - v1)
            e2 = abs(float(lp[t2]) - v2) if len(top) > 1 else 0.0
            max_err = max(max_err, e1)
            margin = v1 - v2
            if got == want:
                verdict = "equal"
                equal += 1
            elif got == t2 and margin <= e1 + e2:
                verdict = "flip_within_margin"
                within += 1
            else:
                verdict = "flip_beyond_margin"
                beyond += 1
            rows.append({"request": k, "step": i, "vllm": want, "kern": got, "margin": round(margin, 5),
                         "err_top1": round(e1, 5), "err_top2": round(e2, 5), "verdict": verdict})
            tok, pos = want, pos + 1
    report = {"geometry": truth.get("geometry"), "positions": len(rows), "equal": equal,
              "flip_within_margin": within, "flip_beyond_margin": beyond,
              "max_logprob_error_top1": round(max_err, 5), "steps": rows}
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "steps"}))
    sys.exit(1 if beyond else 0)


if __name__ == "__main__":
    main()
