"""`mine compare`: a manifest on kern, teacher-forced on a reference, judged step by step.

`prepare` does every check that needs no GPU, so bad input costs no device time and reads as one
sentence: the manifest verifies and can be served, the reference is of this model (vocabulary,
geometry, the very checkpoint by fingerprint), every tensor the manifest binds is in the
checkpoint with the element count it needs, and every request fits the manifest's context.
`compare` then runs, per request, the teacher-forced loop (prefill all prompt tokens but the
last in chunks, then decode the last prompt token and each reference token in turn, judging the
logits before each reference token) and the free-running loop (kern's own greedy tokens fed
back), and `report` turns both into the JSON the docs describe. `rejudge` judges a saved report
again, under other bounds, without a GPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

from compare import checkpoint, reference, serving, verdict
from compare.checkpoint import CheckpointError
from compare.reference import Reference, ReferenceError
from compare.serving import ManifestError, Serving

REPORT_FORMAT = "mine-compare/1"


@dataclass(frozen=True)
class Setup:
    manifest_path: Path
    kernels: Path
    m: dict
    serving: Serving
    weight_files: tuple[Path, ...]
    ref: Reference
    ref_path: Path


def manifest_file(path: Path) -> Path:
    """MANIFEST_DIR's one manifest JSON (a file holding `schema_version`), or the file given."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise ManifestError(f"manifest {path} does not exist")
    found = []
    for p in sorted(path.glob("*.json")):
        try:
            if b'"schema_version"' in p.read_bytes():
                found.append(p)
        except OSError:
            continue
    if len(found) != 1:
        raise ManifestError(f"{path} holds {len(found) or 'no'} manifest JSON files"
                            + (f" ({', '.join(p.name for p in found)}); name one" if found else ""))
    return found[0]


def _verified(path: Path) -> dict:
    from manifests import jsonload
    from manifests.verify import verify_file

    bad = verify_file(path)
    if bad:
        raise ManifestError(f"{path}: the manifest does not verify: {bad[0]}"
                            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
    return jsonload.load_path(path)


def _check_tensors(m: dict, s: Serving, have: dict, ckpt: Path) -> None:
    for buf, binds in sorted(s.binds.items()):
        if not binds:
            continue
        total = 0
        for b in binds:
            name = b.get("tensor") if isinstance(b, dict) else None
            if name is None:
                total = None
                continue
            if name not in have:
                raise CheckpointError(f"checkpoint {ckpt} has no tensor {name!r}, which the manifest binds to "
                                      f"weight {buf!r}", value=name)
            if total is not None:
                n = 1
                for d in have[name].shape:
                    n *= d
                total += n
            if set(b) != {"tensor"}:
                total = None  # a slice or offset bind: its size is kern's to check
        want = serving.elements(m, m["buffers"][buf])
        if total is not None and want is not None and total != want:
            raise CheckpointError(f"weight {buf!r} needs {want} elements but its tensors in {ckpt} hold {total}",
                                  value=total, limit=want)


def prepare(manifest: Path, weights: Path, ref_path: Path, logits: Optional[str] = None) -> Setup:
    mpath = manifest_file(manifest)
    m = _verified(mpath)
    s = serving.serving(m, logits)
    kernels = mpath.parent / "kernels"
    for name, mod in sorted(m.get("modules", {}).items()):
        src = str(mod.get("source", ""))
        if "://" not in src and not src.startswith("hf:") and not (kernels / src).is_file():
            raise ManifestError(f"module {name!r}'s cubin {src} is not in {kernels}")
    ref = reference.read(ref_path)
    if ref.vocab != s.vocab:
        raise ReferenceError(f"reference {ref_path} is of a model with a vocabulary of {ref.vocab} tokens; the "
                             f"manifest's is {s.vocab}", value=ref.vocab, limit=s.vocab)
    cfg = checkpoint.config(weights)
    diff = [k for k in reference.MODEL_KEYS if k in cfg and cfg[k] != ref.model[k]]
    if diff:
        k = diff[0]
        raise ReferenceError(f"reference {ref_path} was recorded on a model with {k} {ref.model[k]!r}; checkpoint "
                             f"{weights} has {cfg[k]!r}", value=ref.model[k], limit=cfg[k])
    ckpt_files = checkpoint.files(weights)
    fp = checkpoint.fingerprint(weights)
    if fp != ref.checkpoint:
        raise ReferenceError(f"reference {ref_path} was recorded on another checkpoint than {weights} (fingerprint "
                             f"{ref.checkpoint[:19]}... vs {fp[:19]}...)", value=fp, limit=ref.checkpoint)
    # the manifest's own tensors: beside it, or under weights/ (mine compile's extra.safetensors)
    own = sorted(mpath.parent.glob("*.safetensors")) + sorted(mpath.parent.glob("weights/*.safetensors"))
    files = tuple(ckpt_files) + tuple(own)
    _check_tensors(m, s, checkpoint.tensors(list(files)), weights)
    for n, r in enumerate(ref.requests):
        need = len(r.prompt) + len(r.output) - 1
        if need > s.max_len:
            raise ReferenceError(f"request {n} of {ref_path} needs a context of {need} positions; the manifest "
                                 f"serves at most {s.max_len}", value=need, limit=s.max_len)
    return Setup(mpath, kernels, m, s, files, ref, Path(ref_path))


def with_prefill_rows(setup: Setup, rows: int) -> Setup:
    """The setup with each prefill call taking at most `rows` rows; 0 feeds the prompt through the
    decode program one token a call. Why: a fault that shows only above some row count (a
    workspace too small for the largest prefill, a grid expression wrong past the rows the
    capture saw) is told from a decode fault by running the same requests both ways."""
    s = setup.serving
    if rows == 0:
        return replace(setup, serving=replace(s, prefill=None))
    if s.prefill is None:
        raise ManifestError(f"--prefill-rows {rows}: the manifest has no prefill program (only 0 is possible)")
    if rows > s.chunk:
        raise ManifestError(f"--prefill-rows {rows}: the prefill program {s.prefill!r} takes at most {s.chunk} rows")
    return replace(setup, serving=replace(s, chunk=rows))


def check_batch(setup: Setup, batch: int) -> None:
    """Refuse, before the GPU, a --batch the manifest's decode cannot run in one call, or a reference
    whose requests need more context than a sequence slot of the batched layout holds."""
    m, s = setup.m, setup.serving
    most = serving.groups(m, s.decode)
    if batch > most:
        raise ManifestError(f"--batch {batch}: the decode program {s.decode!r} runs at most {most} sequence(s) a call")
    if "blocks" in s.inputs:
        from compare.batch import Layout

        width = int(serving._dim(m, m["buffers"][s.inputs["blocks"]]["shape"][-1]))
        Layout.for_context(max(len(r.prompt) + len(r.output) for r in setup.ref.requests), s.block_size, width)


def teacher_forced(host, n: int, req, bounds: verdict.Bounds) -> list[tuple[verdict.StepResult, list[float]]]:
    import torch

    host.reset()
    host.prefill(list(req.prompt[:-1]))
    tok, pos, out = req.prompt[-1], len(req.prompt) - 1, []
    for j, (want, step) in enumerate(zip(req.output, req.steps)):
        z = host.decode(tok, pos)
        ids = torch.tensor(step.ids, device=z.device)
        z_ids = z[ids].tolist()
        got = int(torch.argmax(z).item())
        out.append((verdict.judge(n, j, pos, want, step.ids, step.logprobs, z_ids, got, bounds), z_ids))
        tok, pos = want, pos + 1
    return out


def teacher_forced_batched(host, first: int, reqs, bounds: verdict.Bounds) -> list[tuple[verdict.StepResult, list[float]]]:
    """The teacher-forced loop of several requests at once (a batched manifest, `compare.batch`):
    every prompt but its last token lands through packed prefill calls (several prompts, or parts
    of them, in one call), each in its own sequence slot, then every step
    decodes one token of each request that still has a reference token there, in one call, and
    each row's logits are judged against its own request's reference. Requests of different
    lengths leave the batch as they finish. `first`: the report number of reqs[0]."""
    import torch

    from compare.batch import Row

    if host.s.prefill is None:
        for i, req in enumerate(reqs):
            for p, t in enumerate(req.prompt[:-1]):
                host.decode_rows([Row(i, p, (t,))])
    else:
        host.prefill_packed([(i, list(req.prompt[:-1])) for i, req in enumerate(reqs)])
    out = []
    for j in range(max(len(r.output) for r in reqs)):
        live = [i for i, r in enumerate(reqs) if j < len(r.output)]
        toks = {i: (reqs[i].prompt[-1] if j == 0 else reqs[i].output[j - 1]) for i in live}
        pos = {i: len(reqs[i].prompt) - 1 + j for i in live}
        z = host.decode_rows([Row(i, pos[i], (toks[i],)) for i in live])
        for row, i in enumerate(live):
            step = reqs[i].steps[j]
            ids = torch.tensor(step.ids, device=z.device)
            z_ids = z[row][ids].tolist()
            got = int(torch.argmax(z[row]).item())
            out.append((verdict.judge(first + i, j, pos[i], reqs[i].output[j], step.ids, step.logprobs, z_ids, got,
                                      bounds), z_ids))
    return out


def free_running(host, req) -> list[int]:
    host.reset()
    host.prefill(list(req.prompt[:-1]))
    tok, pos, out = req.prompt[-1], len(req.prompt) - 1, []
    for _ in req.output:
        host.decode(tok, pos)
        tok = host.next_token() if host.next_v is not None else None
        if tok is None:
            break
        out.append(tok)
        pos += 1
    return out


def compare(setup: Setup, bounds: verdict.Bounds, gpu: int = 0, free: bool = True, on_request=None,
            batch: int = 1) -> dict:
    """Both loops on kern for every request of the reference; the report document. `batch` > 1:
    the teacher-forced loop runs the requests `batch` at a time through the batched manifest
    (`teacher_forced_batched`); free-running stays one sequence at a time."""
    from compare.host import KernHost

    t0 = time.time()
    if batch > 1:
        from compare.batch import BatchHost

        check_batch(setup, batch)
        need = max(len(r.prompt) + len(r.output) for r in setup.ref.requests)
        host = BatchHost(setup.manifest_path, setup.kernels, setup.m, setup.serving, setup.weight_files, gpu,
                         max_len=need)
    else:
        host = KernHost(setup.manifest_path, setup.kernels, setup.m, setup.serving, setup.weight_files, gpu)
    load_s = time.time() - t0
    steps, greedy = [], []
    reqs = setup.ref.requests
    if batch > 1:
        for a in range(0, len(reqs), batch):
            steps.extend(teacher_forced_batched(host, a, reqs[a:a + batch], bounds))
    for n, req in enumerate(reqs):
        if batch == 1:
            steps.extend(teacher_forced(host, n, req, bounds))
        greedy.append(free_running(host, req) if free and batch == 1 else None)
        if on_request is not None:
            on_request(n)
    steps.sort(key=lambda s: (s[0].request, s[0].step))
    doc = report(setup, bounds, steps, greedy)
    doc["batch"] = batch
    import torch

    doc["made"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(gpu), "kern": _version("kern-llm"), "torch": torch.__version__,
                   "load_s": round(load_s, 2), "run_s": round(time.time() - t0 - load_s, 2)}
    return doc


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def _request_rows(ref: Reference, results: list[verdict.StepResult], greedy) -> list[dict]:
    rows = []
    for n, req in enumerate(ref.requests):
        mine = [r for r in results if r.request == n]
        s = verdict.summarize(mine)
        g = greedy[n] if greedy else None
        rows.append({"request": n, "prompt_tokens": len(req.prompt), "new_tokens": len(req.output),
                     "counts": s.counts, "max_error": s.max_error, "max_bound": s.max_bound,
                     "max_flip_margin": s.max_flip_margin, "rel_rms_max": s.rel_rms_max, "passed": s.passed,
                     "first_failure": s.first_failure.as_dict() if s.first_failure else None,
                     "free_running": g, "agreement": verdict.agreement(req.output, g) if g is not None else None})
    return rows


def report(setup: Setup, bounds: verdict.Bounds, steps, greedy) -> dict:
    results = [r for r, _ in steps]
    s = verdict.summarize(results)
    return {
        "format": REPORT_FORMAT, "manifest": setup.manifest_path.name, "reference": setup.ref_path.name,
        "engine": setup.ref.engine, "mode": setup.ref.mode, "model": setup.ref.model, "top_k": setup.ref.top_k,
        "bounds": asdict(bounds), "passed": s.passed,
        "prefill": {"program": setup.serving.prefill, "rows": setup.serving.chunk if setup.serving.prefill else 0},
        "summary": {**{k: v for k, v in asdict(s).items() if k != "first_failure"},
                    "first_failure": s.first_failure.as_dict() if s.first_failure else None},
        "requests": _request_rows(setup.ref, results, greedy),
        "steps": [{**r.as_dict(), "ids": list(setup.ref.requests[r.request].steps[r.step].ids), "z": z}
                  for r, z in steps],
    }


def rejudge(doc: dict, ref: Reference, bounds: verdict.Bounds) -> list[verdict.StepResult]:
    """The verdicts of a saved report's steps under `bounds`, from the logits it kept (CPU)."""
    out = []
    for st in doc["steps"]:
        req = ref.requests[st["request"]]
        step = req.steps[st["step"]]
        if list(step.ids) != st["ids"]:
            raise ReferenceError(f"the report's step {st['request']}/{st['step']} was judged on other top-k ids "
                                 f"than this reference's")
        out.append(verdict.judge(st["request"], st["step"], st["position"], req.output[st["step"]], step.ids,
                                 step.logprobs, st["z"], st["got"], bounds))
    return out


def write_report(doc: dict, path: Path) -> None:
    Path(path).write_text(json.dumps(doc, allow_nan=False, indent=None) + "\n")
