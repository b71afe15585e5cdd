// Rotary position embedding in place on the heads of n rows of x (row r at r * stride + offset, at position
// positions[r]; head h at h * head_dim within the row), by a cos/sin table [position, n_rot / 2] computed once on the host in double precision. neox pairs
// dim i with i + n_rot / 2; the normal style pairs 2i with 2i + 1. One thread per (row, head, pair).

struct Params {
    heads: u32,
    head_dim: u32,
    half_rot: u32,
    neox: u32,
    stride: u32,
    offset: u32,
    n: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;  // [position, half_rot, (cos, sin)]
@group(0) @binding(3) var<storage, read> positions: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x % p.half_rot;
    let h = (id.x / p.half_rot) % p.heads;
    let r = id.x / (p.half_rot * p.heads);
    if (r >= p.n) {
        return;
    }
    let t = 2u * (positions[r] * p.half_rot + i);
    let c = table[t];
    let s = table[t + 1u];
    let base = r * p.stride + p.offset + h * p.head_dim;
    let ia = base + select(2u * i, i, p.neox != 0u);
    let ib = base + select(2u * i + 1u, i + p.half_rot, p.neox != 0u);
    let a = x[ia];
    let b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = a * s + b * c;
}
