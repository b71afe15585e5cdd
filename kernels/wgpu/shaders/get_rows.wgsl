// out[i, :] = W[ids[i], :] * scale as f32 (the embedding lookup), W in its GGUF format (see matmul.wgsl). W may
// be one chunk of a weight, rows [row0, row0 + rows): ids outside it are left to the other chunks' dispatches.

struct Params {
    cols: u32,
    row_bytes: u32,
    scale: f32,
    row0: u32,
    rows: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let id = ids[g.x];
    if (id < p.row0 || id >= p.row0 + p.rows) {
        return;
    }
    let base = (id - p.row0) * p.row_bytes;
    for (var u = t; u < p.cols / UNIT; u += WG) {
        var v = unit_values(base, u);
        for (var i = 0u; i < UNIT; i++) {
            out[g.x * p.cols + u * UNIT + i] = v[i] * p.scale;
        }
    }
}
