#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for the tests of moecore's --tensorboard-dir.

It shares no code with moecore's writer: it parses the TFRecord framing itself (both CRCs checked with the CRC-32C
written below), compiles TensorBoard's published message definitions (written out below from tensorboard's
compat/proto/event.proto, summary.proto and histogram.proto: the subset moecore writes, same package, names and
field numbers) with protoc into a temporary directory and decodes the events with python3-protobuf. Then it checks
tags, steps and values against the metrics JSON lines of the same run.

  tensorboard_reader.py dump DIR
  tensorboard_reader.py check DIR METRICS.jsonl [--global-batch-size N] [--world-size N] [--per-layer L]
      [--tokens-per-layer N] [--timers] [--memory] [--ppl] [--last-iteration N] [--no-metrics-tokens]
"""
import argparse
import glob
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

PROTO = """
syntax = "proto3";
package tensorboard;
message HistogramProto {
  double min = 1; double max = 2; double num = 3; double sum = 4; double sum_squares = 5;
  repeated double bucket_limit = 6 [packed = true];
  repeated double bucket = 7 [packed = true];
}
message Summary {
  message Value {
    string node_name = 7;
    string tag = 1;
    oneof value { float simple_value = 2; bytes obsolete_old_style_histogram = 3; HistogramProto histo = 5; }
  }
  repeated Value value = 1;
}
message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what { string file_version = 3; bytes graph_def = 4; Summary summary = 5; }
}
"""


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if hcrc != masked(crc32c(header)):
            raise ValueError(f"{path}: bad length CRC at byte {pos}")
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or len(data) < pos + 16 + length:
            raise ValueError(f"{path}: truncated record at byte {pos}")
        (dcrc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if dcrc != masked(crc32c(body)):
            raise ValueError(f"{path}: bad data CRC at byte {pos}")
        yield body
        pos += 16 + length


def event_module():
    tmp = tempfile.mkdtemp(prefix="tb_reader_")
    with open(os.path.join(tmp, "tb_event.proto"), "w") as f:
        f.write(PROTO)
    subprocess.run(["protoc", f"--proto_path={tmp}", f"--python_out={tmp}", "tb_event.proto"], check=True)
    sys.path.insert(0, tmp)
    return importlib.import_module("tb_event_pb2")


def read_events(directory):
    """(scalars {tag: {step: value}}, histograms {tag: {step: HistogramProto}}, files)"""
    pb = event_module()
    files = sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))
    scalars, histos = {}, {}
    for path in files:
        first = True
        for body in records(path):
            ev = pb.Event()
            ev.ParseFromString(body)
            if first:
                if ev.file_version != "brain.Event:2":
                    raise ValueError(f"{path}: first record is not file_version brain.Event:2")
                first = False
                continue
            for v in ev.summary.value:
                kind = v.WhichOneof("value")
                if kind == "simple_value":
                    scalars.setdefault(v.tag, {})[ev.step] = v.simple_value
                elif kind == "histo":
                    histos.setdefault(v.tag, {})[ev.step] = v.histo
    return scalars, histos, files


class Checker:
    def __init__(self):
        self.failures = 0
        self.checks = 0

    def ok(self, cond, what):
        self.checks += 1
        if not cond:
            self.failures += 1
            print("FAIL:", what)

    def close(self, tag, step, got, want, scalars, rel=2e-6):
        self.checks += 1
        if tag not in scalars or step not in scalars[tag]:
            self.failures += 1
            print(f"FAIL: no '{tag}' at step {step}")
            return
        v = scalars[tag][step]
        # float32 rounding of the stored value
        if not math.isclose(v, want, rel_tol=rel, abs_tol=1e-30 if got is None else 1e-12):
            self.failures += 1
            print(f"FAIL: '{tag}' at step {step} is {v}, expected {want}")


def check(a):
    scalars, histos, files = read_events(a.dir)
    c = Checker()
    c.ok(len(files) == a.files, f"{len(files)} event files in {a.dir}, expected {a.files}")
    lines = [json.loads(s) for s in open(a.metrics) if s.strip()]
    train = [j for j in lines if "eval" not in j and "timers" not in j and "alarm" not in j]
    timer_records = [j for j in lines if "timers" in j]
    evals = [j for j in lines if j.get("eval") == "valid"]
    c.ok(len(train) > 0, "the metrics file has training lines")
    for j in train:
        it, samples = j["iteration"], j["consumed_samples"]
        for tag, key in (("lm loss", "lm_loss"), ("learning-rate", "lr"), ("grad-norm", "grad_norm")):
            c.close(tag, it, None, j[key], scalars)
            c.close(tag + " vs samples", samples, None, j[key], scalars)
        c.close("batch-size", it, None, a.global_batch_size, scalars)
        c.close("batch-size vs samples", samples, None, a.global_batch_size, scalars)
        c.close("loss-scale", it, None, 1.0, scalars)
        if a.world_size:
            c.close("world-size", it, None, a.world_size, scalars)
            c.close("world-size vs samples", samples, None, a.world_size, scalars)
        for name in ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss"):
            if name in j:
                c.close(name, it, None, j[name], scalars, rel=1e-5)
                if a.per_layer:
                    layers = [scalars.get(f"moe/{name}_layer_{i}", {}).get(it) for i in range(a.per_layer)]
                    c.ok(all(x is not None for x in layers), f"moe/{name}_layer_N at {it} for all {a.per_layer}")
                    moe = [x for x in layers if x]
                    if moe:
                        c.ok(math.isclose(sum(moe) / len(moe), j[name], rel_tol=1e-5),
                             f"mean of moe/{name}_layer_N at {it} is {sum(moe) / len(moe)}, expected {j[name]}")
        for layer, tpe in j.get("tokens_per_expert", {}).items():
            h = histos.get(f"moe/tokens_per_expert_{layer}", {}).get(it)
            c.ok(h is not None, f"histogram moe/tokens_per_expert_{layer} at step {it}")
            if h is None:
                continue
            if a.metrics_tokens:
                c.ok(list(h.bucket) == [float(x) for x in tpe], f"{layer} tokens {list(h.bucket)} != {tpe}")
            if a.tokens_per_layer:
                c.ok(h.num == a.tokens_per_layer, f"{layer} histogram num {h.num}, expected {a.tokens_per_layer}")
            c.ok(list(h.bucket_limit) == [e + 0.5 for e in range(len(tpe))], f"{layer} bucket limits")
            c.ok(h.num == sum(h.bucket), f"{layer} histogram num {h.num} != sum of buckets")
        if a.timers:  # --timing-log-level 1 or more: the step phases
            for tag in ("iteration-time", "forward-backward-time", "optimizer-time"):
                c.ok(scalars.get(tag, {}).get(it, 0) > 0, f"'{tag}' > 0 at step {it}")
        if a.memory:
            for tag in ("mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes"):
                c.ok(scalars.get(tag, {}).get(it, 0) > 0, f"'{tag}' > 0 at step {it}")
    if a.timers:  # every timer of the metrics file's timer records: "<name>-time", the max over ranks in seconds
        c.ok(len(timer_records) > 0, "the metrics file has timer records (--timing-log-level 1 or more)")
        for j in timer_records:
            for name, t in j["timers"].items():
                c.close(name + "-time", j["iteration"], None, t["max_ms"] / 1000.0, scalars, rel=1e-5)
    for j in evals:
        it = j["iteration"]
        c.close("lm loss validation", it, None, j["lm_loss"], scalars)
        if a.ppl:
            c.close("lm loss validation ppl", it, None, math.exp(min(20, j["lm_loss"])), scalars, rel=1e-5)
    c.ok(len(evals) == 0 or "lm loss validation vs samples" in scalars, "lm loss validation vs samples")
    steps = sorted(scalars.get("lm loss", {}))
    if a.last_iteration:
        c.ok(steps and steps[-1] == a.last_iteration, f"last 'lm loss' step {steps[-1:]}, expected {a.last_iteration}")
        c.ok(steps == list(range(1, a.last_iteration + 1)), f"'lm loss' steps {steps}")
    if not a.timers:
        c.ok("iteration-time" not in scalars, "no timers without --log-timers-to-tensorboard")
    if c.failures:
        print(f"tensorboard reader: {c.failures} of {c.checks} checks failed")
        sys.exit(1)
    print(f"tensorboard reader: all {c.checks} checks passed ({len(scalars)} scalar tags, {len(histos)} histograms)")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("dir")
    k = sub.add_parser("check")
    k.add_argument("dir")
    k.add_argument("metrics")
    k.add_argument("--files", type=int, default=1)
    k.add_argument("--global-batch-size", type=int, required=True)
    k.add_argument("--world-size", type=int, default=0)
    k.add_argument("--per-layer", type=int, default=0)
    k.add_argument("--tokens-per-layer", type=int, default=0)
    k.add_argument("--no-metrics-tokens", dest="metrics_tokens", action="store_false")
    k.add_argument("--timers", action="store_true")
    k.add_argument("--memory", action="store_true")
    k.add_argument("--ppl", action="store_true")
    k.add_argument("--last-iteration", type=int, default=0)
    a = p.parse_args()
    if a.cmd == "dump":
        scalars, histos, files = read_events(a.dir)
        print("files:", files)
        for tag in sorted(scalars):
            print(f"{tag}: {sorted(scalars[tag].items())}")
        for tag in sorted(histos):
            print(f"{tag} (histogram): {[(s, list(h.bucket)) for s, h in sorted(histos[tag].items())]}")
    else:
        check(a)


if __name__ == "__main__":
    main()
