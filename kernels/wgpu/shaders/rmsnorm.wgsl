// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight, one workgroup per row. Rows sit `stride` floats
// apart from `offset` in x and out alike (q/k heads inside a fused qkv row norm in place this way).

struct Params {
    n: u32,
    rows_per_group: u32,  // a row of n_head heads is n_head rows of head_dim
    stride: u32,
    offset: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
// read_write although only read: x and out may be one buffer (q/k norms in place), and a buffer bound
// read-only and writable in one dispatch is a usage conflict
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let base = g.y * p.stride + p.offset + g.x * p.n;
    var ss = 0.0;
    for (var i = t; i < p.n; i += WG) {
        ss += x[base + i] * x[base + i];
    }
    partial[t] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            partial[t] += partial[t + s];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(partial[0] / f32(p.n) + p.eps);
    for (var i = t; i < p.n; i += WG) {
        out[base + i] = x[base + i] * scale * weight[i];
    }
}
