// y[r, row] = sum_c W[row, c] * x[r, c] for up to MT input rows per workgroup, reading W in its GGUF format
// (a format file before this one defines UNIT and unit_values). A workgroup computes RPW weight rows for a tile
// of MT input rows, TPR threads a row: they split the row's units and sum through workgroup memory (few threads
// a row: a software Vulkan pays for every workgroup, and most rows have few units). Output row r is written at
// y[r * out_stride + out_offset + row0 + row], so a group of weights (or the row chunks of one weight too big
// for a single binding: this one's rows start at weight row row0) fills one fused output; has_bias adds the bias.

struct Params {
    rows: u32,
    cols: u32,
    m: u32,
    row_bytes: u32,
    out_stride: u32,
    out_offset: u32,
    row0: u32,
    row_groups: u32,  // workgroups along x per tile (they fold over x and z past 65535)
    has_bias: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// MT and TPR are declared by the host (kernels.wgpu.ops), which sizes the dispatch by them
const RPW: u32 = WG / TPR;
var<workgroup> partial: array<f32, MT * WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = (g.z * p.row_groups + g.x) * RPW + t / TPR;
    let lane = t % TPR;
    let r0 = g.y * MT;
    let nr = min(MT, p.m - r0);
    var acc: array<f32, MT>;
    if (row < p.rows) {
        let base = row * p.row_bytes;
        let units = p.cols / UNIT;
        for (var u = lane; u < units; u += TPR) {
            var v = unit_values(base, u);
            for (var r = 0u; r < nr; r++) {
                let xo = (r0 + r) * p.cols + u * UNIT;
                var s = 0.0;
                for (var i = 0u; i < UNIT; i++) {
                    s += v[i] * x[xo + i];
                }
                acc[r] += s;
            }
        }
    }
    for (var r = 0u; r < MT; r++) {
        partial[r * WG + t] = acc[r];
    }
    workgroupBarrier();
    if (row < p.rows) {
        // the row's threads share out its input rows
        let first = t - lane;
        var b = 0.0;
        if (p.has_bias != 0u) {
            b = bias[p.row0 + row];
        }
        for (var j = lane; j < nr; j += TPR) {
            var total = 0.0;
            for (var i = 0u; i < TPR; i++) {
                total += partial[j * WG + first + i];
            }
            y[(r0 + j) * p.out_stride + p.out_offset + p.row0 + row] = total + b;
        }
    }
}
