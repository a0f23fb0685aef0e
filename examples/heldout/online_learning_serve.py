"""Online-learning CTR ranker: one model object served by client threads and trained in place by a learner thread.

Written the way a team runs online learning in one process: there is one model, not a
serving copy and a training copy. A learner thread trains it, in place, on fresh labelled
batches while (or between the times that) client threads score requests with it. Nothing is
swapped or reloaded: the optimizer writes the same parameter tensors the handlers read.

The model (``WideDeep``, ``forward(ids, dense)`` returning the logit, one a row): for each of
6 fields an ``nn.Embedding(vocab, 32)`` (dense gradients: no ``EmbeddingBag``, no
``sparse=True``) over that field's id (``ids`` is ``[rows, 6]`` int64), the six embeddings
and the 13 dense features concatenated (6 * 32 + 13 = 205) into an MLP 205 -> ``--hidden``
-> ``--hidden`` -> 1 with a ReLU after each hidden layer (the deep logit); beside it a wide
part, one ``nn.Embedding(vocab * 6, 1)`` over field-offset ids (field ``f``'s id ``i`` is row
``f * vocab + i``; the offsets a non-persistent buffer), its 6 weights summed (the wide
logit), its table set to zero at start (``nn.init.zeros_``). The logit is deep + wide. Built
after ``torch.manual_seed(seed)`` in this order: the 6 field embeddings, the MLP's three
Linears, the wide table; then ``.to(dev).eval()``. It has no dropout and no batch norm, and
**it stays in ``eval()`` mode for its whole life: the learner trains it without ever calling
``train()``** (deliberate: an online learner with no mode-dependent layers often never toggles
it). The optimizer is ``torch.optim.Adagrad(model.parameters(), lr=0.01)``, made on the main
thread before the learner starts.

The learner is a ``threading.Thread`` subclass (``Learner``), started before the serving
clients exist. It takes jobs (a number of steps) from a ``queue.Queue`` and, after each job,
puts the count of steps done so far on a second ``queue.Queue`` (the signal to the main
thread). Step ``s`` (0, 1, 2, ... over the whole run, never restarted) trains on a batch of
``--train-batch`` rows made from ``np.random.default_rng([seed, 1_000_000 + s])``, in this
order: ids ``integers(0, vocab, (batch, 6))`` (int64), dense ``standard_normal((batch,
13))`` as float32, then labels ``(dense[:, 0] + standard_normal(batch) > 0)`` as float32
(a click when the first dense feature plus noise is positive). Each array is moved with
``torch.from_numpy(a).to(dev)``, then ``opt.zero_grad(set_to_none=True)``, ``loss =
F.binary_cross_entropy_with_logits(model(ids, dense), y)``, ``loss.backward()``,
``opt.step()``, ``losses.append(loss.detach())``: the loss stays on the device. Every
``--log-every`` steps (default 1000: never, in the default run) it logs ``loss.item()``
through ``logging`` (stderr). **At the end of a job it does not synchronize**: no ``.item()``,
no ``torch.cuda.synchronize()``; the signal is put on the queue as soon as the last
``opt.step()`` has been launched, so on the GPU that step's kernels may still be queued when
the first request of the next wave is launched (unhooked, all of it on one default stream,
which orders them).

Requests: request ``rid`` is made up-front from ``np.random.default_rng([seed, rid])``: ids
``integers(0, vocab, (rows, 6))`` (int64), then dense ``standard_normal((rows, 13))`` as
float32, ``--rows`` rows. The handler moves both with ``torch.from_numpy(a).to(dev)``
(pageable memory) and, under ``torch.no_grad()``, reads the scores with
``torch.sigmoid(model(ids, dense)).cpu().numpy()``. Clients: one
``ThreadPoolExecutor(--threads)`` for the whole run, ``submit`` per request.

``--mode alternate`` (the default): ``--waves`` waves. For wave ``w`` the main thread puts a
job of ``--train-steps`` steps on the learner's queue and waits for its signal (the learner
trains steps ``w * train_steps`` to ``(w + 1) * train_steps - 1``), then submits that wave's
requests, ``w * queries // waves`` to ``(w + 1) * queries // waves - 1`` in request-id order,
and waits for every one of their futures before giving the learner the next job. So the
requests of wave ``w`` are scored by the model after exactly ``(w + 1) * train_steps``
steps: every output is deterministic. ``--mode concurrent``: the learner gets one job of
``waves * train_steps`` steps and trains them straight through while the clients serve every
request at the same time (no waves); which step each request sees depends on timing.

    python online_learning_serve.py --threads 8 --queries 3000
    python online_learning_serve.py --threads 8 --queries 3000 --mode concurrent
    python online_learning_serve.py --device cpu --threads 3 --queries 48 --waves 4 --train-steps 3 --train-batch 64 --rows 16 --vocab 500

The last line is JSON: qps (the requests over the serving time: in alternate mode the sum of
the waves' serving windows only, from a wave's first submit to its last future done, the
training between them left out; in concurrent mode the whole serving window), p50_ms and
p99_ms (each request's handler time), threads, queries, mode, waves, train_steps (the steps
the learner did), served (the requests served) and checksum, in float64: in alternate mode
the sum over requests ``r`` of ``(r + 1)`` times the sum of that request's scores, plus the
training losses' sum (``torch.stack(losses).sum()``, float32, read once at the very end),
plus every parameter's sum at the end (each ``p.double().sum()``, in ``model.parameters()``
order); in concurrent mode only the losses' sum plus the parameters' sum (serving never
writes the model, so these do not depend on timing). Either way, the same for any thread
count.
"""

import argparse
import json
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_FIELDS, N_DENSE, DIM = 6, 13, 32
TRAIN_SEED_BASE = 1_000_000

log = logging.getLogger("online_learner")


class WideDeep(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(vocab, DIM) for _ in range(N_FIELDS))
        self.mlp = nn.Sequential(nn.Linear(N_FIELDS * DIM + N_DENSE, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.wide = nn.Embedding(vocab * N_FIELDS, 1)
        nn.init.zeros_(self.wide.weight)
        self.register_buffer("field_offsets", torch.arange(N_FIELDS) * vocab, persistent=False)

    def forward(self, ids, dense):
        x = torch.cat([emb(ids[:, f]) for f, emb in enumerate(self.embs)] + [dense], dim=1)
        deep = self.mlp(x).squeeze(1)
        wide = self.wide(ids + self.field_offsets).sum(dim=(1, 2))
        return deep + wide


def make_request(seed, rid, rows, vocab):
    rng = np.random.default_rng([seed, rid])
    ids = rng.integers(0, vocab, (rows, N_FIELDS))
    dense = rng.standard_normal((rows, N_DENSE)).astype(np.float32)
    return ids, dense


def make_batch(seed, step, batch, vocab):
    rng = np.random.default_rng([seed, TRAIN_SEED_BASE + step])
    ids = rng.integers(0, vocab, (batch, N_FIELDS))
    dense = rng.standard_normal((batch, N_DENSE)).astype(np.float32)
    labels = (dense[:, 0] + rng.standard_normal(batch) > 0).astype(np.float32)
    return ids, dense, labels


class Learner(threading.Thread):
    """Trains the served model in place: a job is a number of steps; after each job the count
    of steps done so far goes on ``done`` (no synchronization first)."""

    def __init__(self, model, opt, args, dev):
        super().__init__(name="online-learner", daemon=True)
        self.model, self.opt, self.args, self.dev = model, opt, args, dev
        self.jobs, self.done = queue.Queue(), queue.Queue()
        self.losses, self.step = [], 0

    def learn(self, steps):
        a = self.args
        for _ in range(steps):
            ids, dense, labels = (torch.from_numpy(x).to(self.dev)
                                  for x in make_batch(a.seed, self.step, a.train_batch, a.vocab))
            self.opt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(self.model(ids, dense), labels)
            loss.backward()
            self.opt.step()
            self.losses.append(loss.detach())
            self.step += 1
            if self.step % a.log_every == 0:
                log.info("step %d loss %.5f", self.step, loss.item())

    def run(self):
        try:
            for steps in iter(self.jobs.get, None):
                self.learn(steps)
                self.done.put(self.step)
        finally:
            self.done.put(None)  # the main thread stops waiting if training failed


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--mode", choices=("alternate", "concurrent"), default="alternate")
    ap.add_argument("--waves", type=int, default=10)
    ap.add_argument("--train-steps", type=int, default=20, help="training steps a wave")
    ap.add_argument("--train-batch", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--log-every", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(threadName)s %(message)s")
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = WideDeep(args.vocab, args.hidden).to(dev).eval()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    requests = [make_request(args.seed, rid, args.rows, args.vocab) for rid in range(args.queries)]

    def handle(rid):
        ids, dense = requests[rid]
        t0 = time.perf_counter()
        with torch.no_grad():
            scores = torch.sigmoid(model(torch.from_numpy(ids).to(dev), torch.from_numpy(dense).to(dev)))
            scores = scores.cpu().numpy()
        return rid, scores, (time.perf_counter() - t0) * 1e3

    learner = Learner(model, opt, args, dev)
    learner.start()
    results, latencies, serving = {}, [], 0.0
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        if args.mode == "alternate":
            for w in range(args.waves):
                learner.jobs.put(args.train_steps)
                if learner.done.get() is None:
                    raise RuntimeError("the learner thread stopped")
                t0 = time.perf_counter()
                futures = [pool.submit(handle, rid)
                           for rid in range(w * args.queries // args.waves, (w + 1) * args.queries // args.waves)]
                wait(futures)
                serving += time.perf_counter() - t0
                for f in futures:
                    rid, scores, ms = f.result()
                    results[rid] = scores
                    latencies.append(ms)
        else:
            learner.jobs.put(args.waves * args.train_steps)
            t0 = time.perf_counter()
            futures = [pool.submit(handle, rid) for rid in range(args.queries)]
            wait(futures)
            serving = time.perf_counter() - t0
            for f in futures:
                rid, scores, ms = f.result()
                results[rid] = scores
                latencies.append(ms)
            if learner.done.get() is None:
                raise RuntimeError("the learner thread stopped")
    learner.jobs.put(None)
    learner.join()

    loss_sum = float(torch.stack(learner.losses).sum().cpu()) if learner.losses else 0.0
    param_sum = sum(float(p.detach().double().sum().cpu()) for p in model.parameters())
    checksum = loss_sum + param_sum
    if args.mode == "alternate":
        checksum += sum((rid + 1) * float(results[rid].astype(np.float64).sum()) for rid in range(args.queries))
    p50, p99 = np.percentile(latencies, [50, 99])
    print(json.dumps({"script": "online_learning_serve", "mode": args.mode, "threads": args.threads,
                      "queries": args.queries, "qps": round(len(latencies) / serving, 1),
                      "p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "waves": args.waves,
                      "train_steps": learner.step, "served": len(results), "checksum": checksum}), flush=True)


if __name__ == "__main__":
    main()
