// Causal (optionally sliding-window) attention of query rows q_row0.. of q (at positions pos0..) over the KV
// cache, into the same rows of out (a cache file before this one defines key() and value()). Query head h reads
// kv head h / group; a query at position p sees keys j <= p with p - j < window when window > 0. One workgroup
// per (head, query row): scores go to a scratch row, then max, exp and sum are reduced in workgroup memory,
// then each thread sums its output dims.

struct Params {
    n_head: u32,
    group: u32,
    head_dim: u32,
    kv_heads: u32,
    pos0: u32,
    window: u32,
    q_row0: u32,
    scores_stride: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;

fn reduce(v: f32, t: u32, is_max: bool) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red[t] = select(red[t] + red[t + s], max(red[t], red[t + s]), is_max);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let h = g.x;
    let qi = g.y;
    let hi = p.pos0 + qi + 1u;
    var lo = 0u;
    if (p.window > 0u && hi > p.window) {
        lo = hi - p.window;
    }
    let kvh = h / p.group;
    let qo = ((p.q_row0 + qi) * p.n_head + h) * p.head_dim;
    let so = (qi * p.n_head + h) * p.scores_stride;

    var m = -3.4028235e38;
    for (var j = lo + t; j < hi; j += WG) {
        let ko = (j * p.kv_heads + kvh) * p.head_dim;
        var s = 0.0;
        for (var c = 0u; c < p.head_dim; c++) {
            s += q[qo + c] * key(ko + c);
        }
        s *= p.scale;
        scores[so + j - lo] = s;
        m = max(m, s);
    }
    let top = reduce(m, t, true);
    var total = 0.0;
    for (var j = lo + t; j < hi; j += WG) {
        let e = exp(scores[so + j - lo] - top);
        scores[so + j - lo] = e;
        total += e;
    }
    let inv = 1.0 / reduce(total, t, false);
    storageBarrier();
    for (var c = t; c < p.head_dim; c += WG) {
        var acc = 0.0;
        for (var j = lo; j < hi; j++) {
            acc += scores[so + j - lo] * value((j * p.kv_heads + kvh) * p.head_dim + c);
        }
        out[qo + c] = acc * inv;
    }
}
